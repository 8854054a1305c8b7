"""A real OpenAI-compatible server on loopback, answering ``POST /v1/chat/completions`` from a script.

Reply bodies are built from the SDK's own types (``ChatCompletion(...).model_dump()``), so what the
engine reads is what the SDK would read from OpenAI or vLLM; vLLM's extra ``reasoning`` /
``reasoning_content`` message fields ride along as extra fields. Every request body is recorded.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionMessage, ChatCompletionMessageFunctionToolCall
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message_function_tool_call import Function
from openai.types.completion_usage import CompletionUsage

__all__ = ["Reply", "ScriptedServer", "error", "openai_server", "structured", "text", "tool_calls"]


@dataclass(frozen=True, kw_only=True)
class Reply:
    """One scripted answer: a completion, or an error status with a message."""

    content: str | None = None
    calls: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    """(tool name, arguments) pairs the model asks for."""
    raw_arguments: str | None = None
    """Send this verbatim as the first call's arguments (to test unreadable JSON)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Extra message fields, such as vLLM's ``reasoning``."""
    refusal: str | None = None
    status: int = 200
    message: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    model: str = "served-model"
    usage: CompletionUsage | None = None
    """Token counts to report; 11 prompt and 7 completion tokens when ``None``."""


def text(content: str, **extra: Any) -> Reply:
    """A plain answer; ``extra`` adds message fields such as ``reasoning="..."``."""
    return Reply(content=content, extra=extra)


def structured(value: Any, **extra: Any) -> Reply:
    """A JSON answer, as a server constrained by ``response_format`` writes it."""
    return Reply(content=json.dumps(value), extra=extra)


def tool_calls(*calls: tuple[str, Mapping[str, Any]], content: str | None = None) -> Reply:
    """An answer asking for tool calls."""
    return Reply(content=content, calls=tuple(calls))


def error(status: int, message: str = "scripted failure", **headers: str) -> Reply:
    """An error status with an OpenAI-shaped body."""
    return Reply(status=status, message=message, headers=headers)


def _completion(reply: Reply, number: int) -> dict[str, Any]:
    calls = [
        ChatCompletionMessageFunctionToolCall(
            id=f"call_{number}_{i}",
            type="function",
            function=Function(
                name=name,
                arguments=reply.raw_arguments if reply.raw_arguments is not None and i == 0 else json.dumps(args),
            ),
        )
        for i, (name, args) in enumerate(reply.calls)
    ]
    message = ChatCompletionMessage(
        role="assistant", content=reply.content, refusal=reply.refusal, tool_calls=calls or None, **reply.extra
    )
    completion = ChatCompletion(
        id=f"chatcmpl-{number}",
        object="chat.completion",
        created=1_700_000_000,
        model=reply.model,
        choices=[Choice(index=0, finish_reason="tool_calls" if calls else "stop", message=message)],
        usage=reply.usage or CompletionUsage(prompt_tokens=11, completion_tokens=7, total_tokens=18),
    )
    return completion.model_dump(mode="json", exclude_none=True)


class ScriptedServer(ThreadingHTTPServer):
    """The server: replies come from ``script`` in order, or from ``respond(request_body)``."""

    daemon_threads = True

    def __init__(self, script: list[Reply], respond: Callable[[dict[str, Any]], Reply] | None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = script
        self.respond = respond
        self.requests: list[dict[str, Any]] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    def next_reply(self, body: dict[str, Any]) -> tuple[Reply, int]:
        with self._lock:
            self.requests.append(body)
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
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            return
        reply, number = self.server.next_reply(body)
        if reply.delay_s and self.server.stopping.wait(reply.delay_s):
            return  # the test is over; nobody waits for this reply
        if reply.status != 200:
            self._send(reply.status, {"error": {"message": reply.message, "type": "scripted"}}, reply.headers)
            return
        self._send(200, _completion(reply, number))

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
def openai_server(
    *replies: Reply, respond: Callable[[dict[str, Any]], Reply] | None = None
) -> Iterator[tuple[str, ScriptedServer]]:
    """Run the server on 127.0.0.1 in a thread; yields (base URL ending in ``/v1``, the server)."""
    server = ScriptedServer(list(replies), respond)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), name="fake-openai", daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield f"http://{host!s}:{port}/v1", server
    finally:
        server.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join()
