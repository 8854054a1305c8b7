"""A real Anthropic-shaped server on loopback, answering ``POST /v1/messages`` from a script.

Reply bodies are built from the SDK's own types (``Message(...).model_dump()`` with ``ThinkingBlock``,
``RedactedThinkingBlock``, ``TextBlock``, ``ToolUseBlock`` and ``Usage``), so what the engine reads
is what the SDK would read from Anthropic. Every request body and its headers are recorded.

With ``canary=...`` every reply carries thinking: each thinking text, signature and redacted-thinking
payload contains the canary, so a test can assert that it appears nowhere it must not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
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

from fakes.sdk_server import SdkServer

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

    @property
    def http_status(self) -> int:
        return self.status


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


class ScriptedServer(SdkServer[Reply]):
    """The server: replies come from ``script`` in order, or from ``respond(request_body)``."""

    route = "/v1/messages"
    thread_name = "fake-anthropic"

    def __init__(
        self, script: list[Reply], respond: Callable[[dict[str, Any]], Reply] | None, canary: str | None
    ) -> None:
        super().__init__(script, respond)
        self.canary = canary

    def exhausted(self) -> Reply:
        return error(500, "the fake server's script is exhausted")

    def error_body(self, status: int, message: str, *, scripted: bool) -> Any:
        return {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": message}}

    def body(self, reply: Reply, number: int) -> Any:
        return _message(reply, number, self.canary)


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
    with ScriptedServer(list(replies), respond, canary).running() as served:
        yield served
