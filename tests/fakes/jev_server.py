"""A real HTTP server on loopback that speaks Jev's ``/v1/systemone`` like each server profile.

Two modes, in one server:

* scripted: ``server.script(Reply(...), ...)`` queues verbatim replies (status, headers, body),
  served in order to whatever arrives;
* computing: with the queue empty and a ``profile`` set, any valid request is answered with
  deterministic pseudo-probabilities (a hash of state, question and option), and the profile's
  limits are enforced with a 422 in that server's error shape, so splitting is proven end to end.

Every request is recorded (headers, raw body, decoded JSON, multipart parts, client port).

A fault, switched at run time with ``server.fault(kind)`` and ended with ``server.clear_fault()``,
overrides both modes for every request that arrives meanwhile (``FAULTS`` lists the kinds): a
misbehaving System 1 for the fault-injection suite. Requests are recorded under a fault too.
"""

from __future__ import annotations

import email
import email.policy
import hashlib
import json
import math
import socket
import threading
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, TypeAlias, get_args

from fastslow.engines.jev import PROFILES, JevEngine, JevProfile
from fastslow.router.settings import JevProfileName, JevSettings

__all__ = [
    "FAULTS",
    "LONG_NOUL",
    "Fault",
    "JevFakeServer",
    "Recorded",
    "Reply",
    "running_jev_engine",
    "running_jev_server",
]

LAYA_SERVING_ID = "laya-1"
MODEL_ECHO: dict[str, str] = {
    "structured": "dgemma",
    "jev": "jev-1.13.0",
    "openrouter": "typesafe/jev-1.13",
    "laya-serve": LAYA_SERVING_ID,
    "jev-compatible-server": "bosun-v3.1-0.6b",
    "llm2jev": "Qwen/Qwen3.5-2B",
}


Fault: TypeAlias = Literal["http_500", "http_529", "garbage", "wrong_options", "http_401", "hang", "slow", "close"]
"""What a faulty server does with each request:

* ``http_500``: a 500 with an error body;
* ``http_529``: a 529 (overloaded) with ``Retry-After: fault_retry_after``;
* ``garbage``: a 200 whose body is not JSON;
* ``wrong_options``: a 200 in the wire format whose answers are over options that were not asked
  (a noul's over ``maybe``/``perhaps`` with ``LONG_NOUL`` for its number, a choice's and a
  score's over renamed labels);
* ``http_401``: a 401, as for a wrong key;
* ``hang``: no reply at all until ``clear_fault()`` (or ``stop()``);
* ``slow``: the computed reply, sent after ``fault_delay_s``;
* ``close``: part of a reply's headers and body, then the connection is closed.
"""
FAULTS: tuple[Fault, ...] = get_args(Fault)
LONG_NOUL = "maybe, " * 200
"""What a ``wrong_options`` fault sends as a noul's number: a long text that no reason may quote whole."""


@dataclass(frozen=True)
class Reply:
    """One scripted reply; a dict or list body is sent as JSON, str/bytes verbatim."""

    status: int = 200
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    action: Literal["reply", "hang", "close"] = "reply"
    """``hang``: send nothing until the fault is cleared; ``close``: cut the connection mid-reply."""


@dataclass(frozen=True)
class Recorded:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    """Lower-cased names."""
    body: bytes
    json: Any
    """The decoded JSON body (the ``request`` part of a multipart body)."""
    parts: dict[str, tuple[str, bytes]]
    """Multipart parts other than ``request``: name -> (content type, bytes)."""
    client_port: int


class _Invalid(Exception):
    def __init__(self, message: str, loc: tuple[str, ...] = (), status: int = 422) -> None:
        super().__init__(message)
        self.message = message
        self.loc = loc
        self.status = status


def _error_body(profile: JevProfileName | None, status: int, message: str, loc: tuple[str, ...] = ()) -> Any:
    """The error body each server sends (wire-formats §1.4, §2.5, §3)."""
    if profile == "jev":
        return {"detail": [{"loc": ["body", *loc], "msg": message, "type": "value_error"}]}
    if profile == "jev-compatible-server":
        return {"detail": message}
    if profile == "llm2jev":
        return {"error": message}
    if profile == "laya-serve":
        return {"error": {"message": message, "field": ".".join(("body", *loc)) if loc else None}}
    if profile == "openrouter":
        return {"error": {"message": message, "code": status}}
    kind = {401: "authentication_error", 422: "validation_error", 404: None}.get(status, "server_error")
    return {"error": {"message": message, **({"type": kind} if kind else {})}}


def _unit(*parts: Any) -> float:
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, ensure_ascii=False).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _distribution(state: Any, instructions: Any, options: list[str]) -> list[float]:
    weights = [math.exp(4.0 * _unit(state, instructions, option)) for option in options]
    total = math.fsum(weights)
    return [w / total for w in weights]


def _unasked_options(reply: dict[str, Any]) -> dict[str, Any]:
    """``reply`` with every answer moved onto options nobody asked about (the ``wrong_options`` fault)."""
    answers: dict[str, Any] = {}
    for name, answer in reply.get("answers", {}).items():
        if answer["type"] == "noul":
            answers[name] = {"type": "noul", "noul": LONG_NOUL, "probabilities": {"maybe": 0.6, "perhaps": 0.4}}
            continue
        probs = {f"unasked {label}": p for label, p in answer["probabilities"].items()}
        answers[name] = {**answer, "probabilities": probs, "legend": {}}
        if answer["type"] == "choice":
            answers[name]["choice"] = f"unasked {answer['choice']}"
    return {**reply, "answers": answers}


def _entropy(probs: list[float]) -> float:
    return -math.fsum(p * math.log(p) for p in probs if p > 0)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as two writes; don't wait on delayed ACKs
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        del format, args

    def do_GET(self) -> None:
        self._send(200, {"status": "ok"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        content_type = self.headers.get("Content-Type", "")
        decoded: Any = None
        parts: dict[str, tuple[str, bytes]] = {}
        try:
            if content_type.startswith("multipart/form-data"):
                head = f"Content-Type: {content_type}\r\n\r\n".encode()
                message = email.message_from_bytes(head + raw, policy=email.policy.HTTP)
                for part in message.iter_parts():
                    name = part.get_param("name", header="content-disposition")
                    payload = part.get_payload(decode=True)
                    assert isinstance(payload, bytes)
                    if name == "request":
                        decoded = json.loads(payload)
                    else:
                        parts[str(name)] = (part.get_content_type(), payload)
            else:
                decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = None
        fake = self.server.fake
        record = Recorded(
            method="POST",
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=raw,
            json=decoded,
            parts=parts,
            client_port=self.client_address[1],
        )
        reply = fake._next(record)
        if reply.action == "close":
            self._cut()
            return
        if reply.action == "hang":
            fake._hang()
            reply = fake._computed(record)
        if reply.delay_s:
            fake._stop.wait(reply.delay_s)
        self._send(reply.status, reply.body, reply.headers)

    def _cut(self) -> None:
        """Promise a body, send a piece of it, and close the connection (a server dying mid-reply)."""
        self.close_connection = True
        try:
            self.wfile.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n{"ans')
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the client left first

    def _send(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        if isinstance(body, bytes):
            data, kind = body, "application/octet-stream"
        elif isinstance(body, str):
            data, kind = body.encode(), "text/plain; charset=utf-8"
        else:
            data, kind = json.dumps(body).encode(), "application/json"
        try:
            self.send_response(status)
            if not any(name.lower() == "content-type" for name in headers or {}):
                self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up at its deadline (a timeout test); nobody reads this reply


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # the stdlib's backlog of 5 drops SYNs under a burst: 1 s stalls
    daemon_threads = True
    block_on_close = False
    fake: JevFakeServer


class JevFakeServer:
    """The loopback server; use ``running_jev_server`` (or ``start``/``stop``)."""

    def __init__(self, profile: JevProfileName | None = "structured", *, api_key: str | None = None) -> None:
        self.profile_name = profile
        self.profile: JevProfile | None = PROFILES[profile] if profile else None
        self.api_key = api_key
        self.compute_delay_s = 0.0
        """How long a computed reply waits before it is sent (scripted replies have their own delay)."""
        self.fault_delay_s = 2.0
        """How long a ``slow`` fault waits before it answers."""
        self.fault_retry_after = "7"
        """The ``Retry-After`` an ``http_529`` fault sends."""
        self.requests: list[Recorded] = []
        self._fault: Fault | None = None
        self._released = threading.Event()
        self._script: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def script(self, *replies: Reply) -> None:
        """Queue replies, served in order before computing mode resumes."""
        with self._lock:
            self._script.extend(replies)

    def fault(self, kind: Fault) -> None:
        """Misbehave as ``kind`` (see ``Fault``) for every request from now on, scripted ones included."""
        with self._lock:
            if self._fault == "hang" and kind != "hang":
                self._released.set()
            if kind == "hang" and self._fault != "hang":
                self._released = threading.Event()
            self._fault = kind

    def clear_fault(self) -> None:
        """Behave again (scripted, then computing); requests left hanging get their computed reply."""
        with self._lock:
            self._fault = None
            self._released.set()

    @property
    def current_fault(self) -> Fault | None:
        """The fault in force, if any."""
        return self._fault

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # --- answering ---------------------------------------------------------------------------

    def _next(self, record: Recorded) -> Reply:
        with self._lock:
            self.requests.append(record)
            fault = self._fault
            if fault is None and self._script:
                return self._script.popleft()
        if fault is not None:
            return self._faulty(fault, record)
        if self.profile is None:
            return Reply(500, {"error": "no scripted reply left"})
        try:
            return Reply(200, self._compute(record), delay_s=self.compute_delay_s)
        except _Invalid as exc:
            return Reply(exc.status, _error_body(self.profile_name, exc.status, exc.message, exc.loc))

    def _faulty(self, fault: Fault, record: Recorded) -> Reply:
        if fault == "http_500":
            return Reply(500, _error_body(self.profile_name, 500, "internal error"))
        if fault == "http_529":
            return Reply(529, {"error": "overloaded"}, headers={"Retry-After": self.fault_retry_after})
        if fault == "garbage":
            return Reply(200, '{"answers": {"oops"', headers={"Content-Type": "application/json"})
        if fault == "http_401":
            return Reply(401, _error_body(self.profile_name, 401, "Missing or invalid API key."))
        if fault in ("hang", "close"):
            return Reply(200, action=fault)
        computed = self._computed(record)
        if fault == "slow":
            return Reply(computed.status, computed.body, delay_s=self.fault_delay_s)
        return Reply(computed.status, _unasked_options(computed.body) if computed.status == 200 else computed.body)

    def _computed(self, record: Recorded) -> Reply:
        if self.profile is None:
            return Reply(500, {"error": "no scripted reply left"})
        try:
            return Reply(200, self._compute(record))
        except _Invalid as exc:
            return Reply(exc.status, _error_body(self.profile_name, exc.status, exc.message, exc.loc))

    def _hang(self) -> None:
        released = self._released
        while not released.wait(0.05) and not self._stop.is_set():
            pass

    def _validate(self, record: Recorded, profile: JevProfile) -> dict[str, Any]:
        paths = {profile.path, "/systemone"} if profile.name == "jev-compatible-server" else {profile.path}
        if record.path not in paths:
            raise _Invalid("unknown route", status=404)
        if self.api_key is not None and record.headers.get("authorization") != f"Bearer {self.api_key}":
            raise _Invalid("Missing or invalid API key.", status=401)
        body = record.json
        if not isinstance(body, dict) or "state" not in body:
            raise _Invalid("body must be an object with state and questions")
        allowed = {"model", "state", "questions"} | set(profile.extensions)
        allowed |= {"assets"} if profile.images == "assets" else {"images"} if profile.images == "images" else set()
        extra = sorted(set(body) - allowed)
        if extra:
            raise _Invalid(f"extra fields not permitted: {extra}", (extra[0],))
        if profile.name == "laya-serve" and body.get("model") not in profile.model_aliases | {LAYA_SERVING_ID}:
            raise _Invalid(f"unknown model {body.get('model')!r}", ("model",))
        questions = body.get("questions")
        if not isinstance(questions, dict) or not questions:
            raise _Invalid("questions must be a non-empty object", ("questions",))
        limits = profile.limits
        if limits.max_questions is not None and len(questions) > limits.max_questions:
            raise _Invalid(f"1..{limits.max_questions} questions, got {len(questions)}", ("questions",))
        for name, q in questions.items():
            self._validate_question(profile, name, q)
        if "assets" in body:
            text = json.dumps([body["state"], questions], ensure_ascii=False)
            for placeholder, asset in body["assets"].items():
                has_data = "data_base64" in asset or asset.get("part") in record.parts
                if asset.get("type") != "image" or not has_data or placeholder not in text:
                    raise _Invalid(f"bad asset {placeholder!r}", ("assets", placeholder))
        return body

    def _validate_question(self, profile: JevProfile, name: str, q: Any) -> None:
        loc = ("questions", name)
        if profile.name == "structured" and (not name or ":" in name or "\n" in name):
            raise _Invalid("question ids must be non-empty, without ':' or newlines", loc)
        if not isinstance(q, dict) or q.get("type") not in ("noul", "choice", "score"):
            raise _Invalid("unknown question type", loc)
        if profile.needs_instructions and not q.get("instructions"):
            raise _Invalid("Field required", (*loc, "instructions"))
        criteria = q.get("criteria")
        limits = profile.limits
        if q["type"] == "noul":
            if profile.noul_needs_both_criteria and criteria is not None:
                if not isinstance(criteria, dict) or criteria.get("true") is None or criteria.get("false") is None:
                    raise _Invalid("noul criteria need both true and false", (*loc, "criteria"))
            return
        top = limits.max_score_levels if q["type"] == "score" else limits.max_options
        low = 2 if q["type"] == "score" else limits.min_options
        if q["type"] == "choice" and not isinstance(criteria, dict):
            raise _Invalid("a choice needs criteria {label: description}", (*loc, "criteria"))
        if q["type"] == "score" and not isinstance(criteria, list):
            raise _Invalid("a score needs criteria [levels]", (*loc, "criteria"))
        assert isinstance(criteria, (dict, list))
        if not low <= len(criteria) <= (top or 10**9):
            raise _Invalid(f"{low}..{top} options, got {len(criteria)}", (*loc, "criteria"))

    def _compute(self, record: Recorded) -> dict[str, Any]:
        assert self.profile is not None
        profile = self.profile
        body = self._validate(record, profile)
        state = body["state"]
        answers: dict[str, Any] = {}
        per_question: dict[str, Any] = {}
        tops: dict[str, Any] = {}
        for name, q in body["questions"].items():
            instructions = q.get("instructions")
            if q["type"] == "noul":
                p = _distribution(state, instructions, ["yes", "no"])
                answers[name] = {"type": "noul", "noul": p[0]}
                probs, label = p, "yes" if p[0] >= p[1] else "no"
            elif q["type"] == "choice":
                labels = list(q["criteria"])
                probs = _distribution(state, instructions, labels)
                best = max(range(len(labels)), key=lambda i: probs[i])
                answers[name] = {
                    "type": "choice",
                    "choice": labels[best],
                    "confidence": probs[best],
                    "probabilities": dict(zip(labels, probs, strict=True)),
                }
                label = chr(ord("A") + best)
            else:
                levels = [str(level) for level in q["criteria"]]
                probs = _distribution(state, instructions, levels)
                best = max(range(len(levels)), key=lambda i: probs[i])
                legend: Any = levels if profile.name == "jev-compatible-server" else dict(enumerate(levels))
                answers[name] = {
                    "type": "score",
                    "score": math.fsum(i * p for i, p in enumerate(probs)),
                    "confidence": probs[best],
                    "legend": {str(k): v for k, v in legend.items()} if isinstance(legend, dict) else legend,
                    "probabilities": {str(i): p for i, p in enumerate(probs)},
                }
                label = str(best + 1) if len(levels) <= 9 else chr(ord("A") + best)
            per_question[name] = {"pos": 0, "entropy": [_entropy(probs)], "label_mass": 0.97, "argmax_is_label": True}
            tops[name] = [label, max(probs), _entropy(probs)]
        model = body.get("model") or MODEL_ECHO[profile.name]
        if profile.name in ("structured", "jev", "openrouter"):
            model = MODEL_ECHO[profile.name]
        reply: dict[str, Any] = {"model": model, "answers": answers, "usage": {"input_tokens": 100, "output_tokens": 1}}
        if profile.name == "llm2jev":
            reply = {"id": "jev-0123456789abcdef", **reply}
        if profile.name == "structured":
            reply["diagnostics"] = {
                "steps": 1,
                "thought": None,
                "samples": {"n": 1, "tops": [tops], "policy": {"mode": "fixed", "n": 1}},
                "timing": {"total_ms": 1.0, "reads": 1},
                "questions": per_question,
                "engine": "fake",
            }
        return reply


@asynccontextmanager
async def running_jev_server(
    profile: JevProfileName | None = "structured", *, api_key: str | None = None
) -> AsyncIterator[JevFakeServer]:
    """A started ``JevFakeServer`` on 127.0.0.1, stopped on exit."""
    server = JevFakeServer(profile, api_key=api_key)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@asynccontextmanager
async def running_jev_engine(profile: JevProfileName = "structured", **kw: Any) -> AsyncIterator[JevEngine]:
    """A ``JevEngine`` bound to a computing fake of ``profile``; ``kw`` are ``JevSettings`` fields.

    When ``api_key`` is given, the fake requires that bearer key.
    """
    api_key = kw.get("api_key")
    async with running_jev_server(profile, api_key=api_key) as server:
        engine = JevEngine(JevSettings(base_url=server.url, profile=profile, **kw))
        try:
            yield engine
        finally:
            await engine.aclose()
