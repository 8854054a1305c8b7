"""A real OpenAI-compatible server on loopback, answering ``POST /v1/chat/completions`` from a script.

Reply bodies are built from the SDK's own types (``ChatCompletion(...).model_dump()``), so what the
engine reads is what the SDK would read from OpenAI or vLLM; vLLM's extra ``reasoning`` /
``reasoning_content`` message fields ride along as extra fields. Every request body is recorded.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionMessage, ChatCompletionMessageFunctionToolCall
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message_function_tool_call import Function
from openai.types.completion_usage import CompletionUsage

from fakes.sdk_server import SdkServer

__all__ = ["Reply", "ScriptedServer", "error", "error_payload", "openai_server", "structured", "text", "tool_calls"]


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

    @property
    def http_status(self) -> int:
        return self.status


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


def error_payload(message: str, kind: str) -> dict[str, Any]:
    """An OpenAI-shaped error body (Chat Completions and Responses alike)."""
    return {"error": {"message": message, "type": kind}}


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


class ScriptedServer(SdkServer[Reply]):
    """The server: replies come from ``script`` in order, or from ``respond(request_body)``."""

    route = "/v1/chat/completions"
    base_path = "/v1"
    thread_name = "fake-openai"

    def exhausted(self) -> Reply:
        return error(500, "the fake server's script is exhausted")

    def error_body(self, status: int, message: str, *, scripted: bool) -> Any:
        return error_payload(message, "scripted" if scripted else "not_found")

    def body(self, reply: Reply, number: int) -> Any:
        return _completion(reply, number)


@contextmanager
def openai_server(
    *replies: Reply, respond: Callable[[dict[str, Any]], Reply] | None = None
) -> Iterator[tuple[str, ScriptedServer]]:
    """Run the server on 127.0.0.1 in a thread; yields (base URL ending in ``/v1``, the server)."""
    with ScriptedServer(list(replies), respond).running() as served:
        yield served
