"""A loopback server standing in for LangSmith's API, and a switch that turns LangChain tracing on at it.

The ``langsmith`` client batches runs from a background thread to ``POST /runs/multipart`` (one
form part per run operation: ``post.<id>`` / ``patch.<id>`` holding the run, ``post.<id>.inputs``,
``.outputs``, ``.extra``, ``.events``, ... its large fields), zstd-compressed when ``GET /info``
advertises ``zstd_compression_enabled`` (this stand-in does not), and falls back to ``POST
/runs/batch`` (``{"post": [...], "patch": [...]}``). The stand-in decodes both, keeps every body
as it arrived (for scans such as the thought canary's), and merges each run's operations as
LangSmith does, a patch's fields over the post's::

    with langsmith_standin() as standin, langsmith_tracing(standin):
        graph.invoke(...)
        flush_tracing()
        run = standin.run_named("route")
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import zstandard
from langchain_core.tracers.langchain import wait_for_all_tracers
from langsmith import run_trees, utils

__all__ = ["LangSmithStandIn", "Received", "flush_tracing", "langsmith_standin", "langsmith_tracing"]

# Every variable the client or LangChain reads to decide whether and where to trace: cleared around a test.
_ENV = (
    "LANGSMITH_TRACING",
    "LANGSMITH_TRACING_V2",
    "LANGCHAIN_TRACING_V2",
    "LANGCHAIN_TRACING",
    "LANGSMITH_ENDPOINT",
    "LANGCHAIN_ENDPOINT",
    "LANGSMITH_API_KEY",
    "LANGCHAIN_API_KEY",
    "LANGSMITH_PROJECT",
    "LANGCHAIN_PROJECT",
    "LANGSMITH_RUNS_ENDPOINTS",
)


@dataclass(frozen=True, slots=True)
class Received:
    """One request the stand-in got: its method, path and body (decompressed)."""

    method: str
    path: str
    body: bytes


class LangSmithStandIn:
    """LangSmith's ingestion API on 127.0.0.1: records every request and the run operations in it."""

    def __init__(self, *, compressed: bool = True) -> None:
        self.compressed = compressed
        self._lock = threading.Lock()
        self.requests: list[Received] = []
        self.operations: list[tuple[str, dict[str, Any]]] = []
        """``("post" | "patch", run)`` in arrival order."""
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, payload: Any, status: int = 200) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _body(self) -> bytes:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding", "").lower() == "zstd":
                    raw = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
                return raw

            def do_GET(self) -> None:
                standin._record(Received("GET", self.path, b""))
                self._answer(standin._info() if self.path.startswith("/info") else {})

            def do_POST(self) -> None:
                body = self._body()
                standin._record(Received("POST", self.path, body))
                if self.path.startswith("/runs/multipart"):
                    standin._ingest_multipart(self.headers.get("Content-Type", ""), body)
                elif self.path.startswith("/runs/batch"):
                    batch = json.loads(body)
                    standin._ingest(("post", run) for run in batch.get("post", []))
                    standin._ingest(("patch", run) for run in batch.get("patch", []))
                elif self.path.rstrip("/") == "/runs":
                    standin._ingest([("post", json.loads(body))])
                self._answer({}, 202 if self.path.startswith("/runs") else 200)

            def do_PATCH(self) -> None:
                body = self._body()
                standin._record(Received("PATCH", self.path, body))
                if self.path.startswith("/runs/"):
                    run = json.loads(body)
                    run.setdefault("id", self.path.rsplit("/", 1)[-1])
                    standin._ingest([("patch", run)])
                self._answer({})

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
                del format, args

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def _info(self) -> dict[str, Any]:
        # As LangSmith's own: with the flag the client sends zstd-compressed multipart, without it plain.
        return {"version": "0.0-standin", "instance_flags": {"zstd_compression_enabled": self.compressed}}

    def _record(self, received: Received) -> None:
        with self._lock:
            self.requests.append(received)

    def _ingest(self, operations: Any) -> None:
        with self._lock:
            self.operations.extend(operations)

    def _ingest_multipart(self, content_type: str, body: bytes) -> None:
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            f"Content-Type: {content_type}\r\n\r\n".encode() + body
        )
        runs: dict[tuple[str, str], dict[str, Any]] = {}
        for part in message.iter_parts():
            name = str(part.get_param("name", header="content-disposition"))
            kind, run_id, *field = name.split(".")
            if kind not in ("post", "patch"):
                continue  # attachments and feedback: not runs
            payload = part.get_payload(decode=True)
            value = json.loads(payload) if isinstance(payload, bytes) and payload else None
            run = runs.setdefault((kind, run_id), {"id": run_id})
            if field:
                run[field[0]] = value
            elif isinstance(value, dict):
                run.update(value)
        self._ingest([(kind, run) for (kind, _), run in runs.items()])

    # -- what arrived ---------------------------------------------------------------------------

    def runs(self) -> dict[str, dict[str, Any]]:
        """Every run as LangSmith would show it: its post, with each patch's fields laid over it."""
        merged: dict[str, dict[str, Any]] = {}
        with self._lock:
            operations = list(self.operations)
        for _, run in operations:
            merged.setdefault(str(run["id"]), {}).update({k: v for k, v in run.items() if v is not None})
        return merged

    def run_named(self, name: str) -> dict[str, Any]:
        """The one run called ``name`` (fails when there is none or more than one)."""
        found = [run for run in self.runs().values() if run.get("name") == name]
        assert len(found) == 1, (
            f"{len(found)} runs named {name!r}: {sorted(r.get('name', '') for r in self.runs().values())}"
        )
        return found[0]

    def children(self, parent: dict[str, Any]) -> list[dict[str, Any]]:
        """The runs whose parent is ``parent``, in start order."""
        found = [run for run in self.runs().values() if str(run.get("parent_run_id")) == str(parent["id"])]
        return sorted(found, key=lambda run: str(run.get("start_time", "")))

    def received_bytes(self) -> bytes:
        """Every request body as it arrived (decompressed), for scans."""
        with self._lock:
            return b"\n".join(r.path.encode() + b" " + r.body for r in self.requests)

    @contextmanager
    def running(self) -> Iterator[LangSmithStandIn]:
        thread = threading.Thread(target=self._server.serve_forever, name="fake-langsmith", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(timeout=5)


@contextmanager
def langsmith_standin() -> Iterator[LangSmithStandIn]:
    """A running stand-in on 127.0.0.1."""
    with LangSmithStandIn().running() as standin:
        yield standin


def _clear_caches() -> None:
    # The client reads its environment through lru-cached helpers: without this, a variable set
    # (or removed) here would be ignored, and tracing would stay on for later tests.
    utils.get_env_var.cache_clear()
    utils.get_tracer_project.cache_clear()


@contextmanager
def langsmith_tracing(standin: LangSmithStandIn | None, *, enabled: bool = True) -> Iterator[None]:
    """LangChain tracing switched on (or, ``enabled=False``, explicitly off) towards ``standin``, by environment.

    Sets the variables a user would (``LANGSMITH_TRACING``, ``LANGSMITH_ENDPOINT``,
    ``LANGSMITH_API_KEY``, ``LANGSMITH_PROJECT``) and gives LangChain a fresh cached client made
    from them; on the way out flushes it, and puts the environment, the caches and the previous
    client back, so no later test traces.
    """
    saved = {name: os.environ.get(name) for name in _ENV}
    previous = run_trees._CLIENT
    for name in _ENV:
        os.environ.pop(name, None)
    os.environ["LANGSMITH_TRACING"] = "true" if enabled else "false"
    if standin is not None:
        os.environ["LANGSMITH_ENDPOINT"] = standin.url
    os.environ["LANGSMITH_API_KEY"] = "lsv2-standin-key"
    os.environ["LANGSMITH_PROJECT"] = "fastslow-tests"
    _clear_caches()
    run_trees._CLIENT = None
    try:
        yield
    finally:
        flush_tracing()
        run_trees._CLIENT = previous
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _clear_caches()


def flush_tracing() -> None:
    """Send whatever the client still holds (the tracer batches from a background thread)."""
    wait_for_all_tracers()
