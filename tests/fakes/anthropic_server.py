"""A real Anthropic-shaped server on loopback, answering ``POST /v1/messages`` from a script.

Reply bodies are built from the SDK's own types (``Message(...).model_dump()`` with ``ThinkingBlock``,
``RedactedThinkingBlock``, ``TextBlock``, ``ToolUseBlock`` and ``Usage``), so what the engine reads
is what the SDK would read from Anthropic. Every request body and its headers are recorded.

With ``canary=...`` every reply carries thinking: each thinking text, signature and redacted-thinking
payload contains the canary, so a test can assert that it appears nowhere it must not.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from anthropic.types import (
    CacheCreation,
    ContentBlock,
    Message,
    RedactedThinkingBlock,
    StopReason,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
)

__all__ = ["Reply", "ScriptedServer", "answer", "anthropic_server", "error", "refusal", "text", "tool_use"]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}


@dataclass(frozen=True, kw_only=True)
class Reply:
    """One scripted answer: a message, or an error status with a message."""

    text: str | None = None
    thinking: tuple[str, ...] = ()
    """Texts of signed thinking blocks, sent before everything else."""
    redacted: tuple[str, ...] = ()
    """Payloads of redacted thinking blocks, sent after the thinking ones."""
    calls: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    """(tool name, input) pairs the model asks for."""
    stop_reason: StopReason | None = None
    """``tool_use`` when there are calls, else ``end_turn``, unless given."""
    input_tokens: int = 11
    output_tokens: int = 7
    cache_read: int = 0
    cache_write: int = 0
    cache_write_1h: int = 0
    """Of ``cache_write``, how many tokens went to the 1-hour cache."""
    status: int = 200
    message: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    model: str = "claude-sonnet-4-6"


def text(content: str, *, thinking: tuple[str, ...] = (), redacted: tuple[str, ...] = (), **usage: int) -> Reply:
    """A final answer, optionally after thinking; ``usage`` sets token counts such as ``cache_read=100``."""
    return Reply(text=content, thinking=thinking, redacted=redacted, **usage)


def tool_use(
    *calls: tuple[str, Mapping[str, Any]],
    text: str | None = None,
    thinking: tuple[str, ...] = (),
    redacted: tuple[str, ...] = (),
) -> Reply:
    """An answer asking for tool calls."""
    return Reply(text=text, calls=tuple(calls), thinking=thinking, redacted=redacted)


def answer(value: Mapping[str, Any]) -> Reply:
    """A structured answer: a call of the forced ``answer`` tool."""
    return Reply(calls=(("answer", value),))


def refusal(content: str = "") -> Reply:
    """A message the model stopped with ``stop_reason: refusal``."""
    return Reply(text=content, stop_reason="refusal")


def error(status: int, message: str = "scripted failure", **headers: str) -> Reply:
    """An error status with Anthropic's body shape; ``headers`` such as ``retry_after="3"``."""
    return Reply(status=status, message=message, headers=headers)


def _content(reply: Reply, number: int, canary: str | None) -> list[ContentBlock]:
    thoughts = reply.thinking or (("thinking",) if canary else ())
    redacted = reply.redacted or (("redacted",) if canary else ())
    mark = f" {canary}" if canary else ""
    blocks: list[ContentBlock] = [
        ThinkingBlock(type="thinking", thinking=f"{t}{mark}", signature=f"sig-{number}-{i}{mark}")
        for i, t in enumerate(thoughts)
    ]
    blocks += [RedactedThinkingBlock(type="redacted_thinking", data=f"{d}{mark}") for d in redacted]
    if reply.text is not None:
        blocks.append(TextBlock(type="text", text=reply.text))
    blocks += [
        ToolUseBlock(type="tool_use", id=f"toolu_{number}_{i}", name=name, input=dict(args))
        for i, (name, args) in enumerate(reply.calls)
    ]
    return blocks


def _message(reply: Reply, number: int, canary: str | None) -> dict[str, Any]:
    message = Message(
        id=f"msg_{number}",
        type="message",
        role="assistant",
        model=reply.model,
        content=_content(reply, number, canary),
        stop_reason=reply.stop_reason or ("tool_use" if reply.calls else "end_turn"),
        stop_sequence=None,
        usage=Usage(
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
            cache_read_input_tokens=reply.cache_read,
            cache_creation_input_tokens=reply.cache_write,
            cache_creation=CacheCreation(
                ephemeral_5m_input_tokens=reply.cache_write - reply.cache_write_1h,
                ephemeral_1h_input_tokens=reply.cache_write_1h,
            ),
        ),
    )
    return message.model_dump(mode="json", exclude_none=True)


class ScriptedServer(ThreadingHTTPServer):
    """The server: replies come from ``script`` in order, or from ``respond(request_body)``."""

    daemon_threads = True

    def __init__(
        self, script: list[Reply], respond: Callable[[dict[str, Any]], Reply] | None, canary: str | None
    ) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = script
        self.respond = respond
        self.canary = canary
        self.requests: list[dict[str, Any]] = []
        """Every request body, in order."""
        self.headers: list[dict[str, str]] = []
        """The headers of each request (lower-case names), in order."""
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    def next_reply(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[Reply, int]:
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            number = len(self.requests)
            if self.respond is not None:
                return self.respond(body), number
            if not self.script:
                return error(500, "the fake server's script is exhausted"), number
            return self.script.pop(0), number


class _Handler(BaseHTTPRequestHandler):
    server: ScriptedServer

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path.split("?")[0].rstrip("/") != "/v1/messages":
            self._send(404, {"type": "error", "error": {"type": "not_found_error", "message": f"no route {self.path}"}})
            return
        headers = {name.lower(): value for name, value in self.headers.items()}
        reply, number = self.server.next_reply(body, headers)
        if reply.delay_s and self.server.stopping.wait(reply.delay_s):
            return  # the test is over; nobody waits for this reply
        if reply.status != 200:
            kind = _ERROR_TYPES.get(reply.status, "api_error")
            payload = {"type": "error", "error": {"type": kind, "message": reply.message}}
            self._send(reply.status, payload, reply.headers)
            return
        self._send(200, _message(reply, number, self.server.canary))

    def _send(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name.replace("_", "-"), value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)

    def log_message(self, format: str, *args: Any) -> None:
        del format, args  # keep test output quiet


@contextmanager
def anthropic_server(
    *replies: Reply, respond: Callable[[dict[str, Any]], Reply] | None = None, canary: str | None = None
) -> Iterator[tuple[str, ScriptedServer]]:
    """Run the server on 127.0.0.1 in a thread; yields (base URL, without ``/v1`` as the SDK wants it, the server).

    Args:
        replies: the script, one reply per request; a 500 once it runs out.
        respond: instead of a script, build each reply from the request body.
        canary: put this string in every thinking text, signature and redacted payload, and give
            every successful reply one thinking and one redacted block when it scripts none.
    """
    server = ScriptedServer(list(replies), respond, canary)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), name="fake-anthropic", daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield f"http://{host!s}:{port}", server
    finally:
        server.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join()
