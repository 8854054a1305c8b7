"""A real server on loopback answering OpenAI's ``POST /v1/responses`` from a script.

Reply bodies are built from the SDK's own types (``Response``, ``ResponseReasoningItem``,
``ResponseOutputMessage``, ``ResponseFunctionToolCall``, ``ResponseUsage``), so what the engine reads
is what the SDK would read from OpenAI. Every request body is recorded, and so is every thought the
server sent (``server.thoughts_sent``), so a test can prove a canary was really served.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from openai.types.responses import (
    Response,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseUsage,
)
from openai.types.responses.response import IncompleteDetails
from openai.types.responses.response_reasoning_item import Content, Summary
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from fakes.openai_server import error_payload
from fakes.sdk_server import SdkServer

__all__ = ["RReply", "ResponsesServer", "answer", "error", "function_calls", "responses_server"]


@dataclass(frozen=True, kw_only=True)
class RReply:
    """One scripted response, or an error status with a message."""

    text: str | None = None
    calls: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    """(function name, arguments) pairs the model asks for."""
    raw_arguments: str | None = None
    """Send this verbatim as the first call's arguments."""
    reasoning: tuple[str, ...] = ()
    """Reasoning summary texts; each makes one reasoning item (with reasoning text and encrypted content too)."""
    refusal: str | None = None
    status: Literal["completed", "incomplete"] = "completed"
    incomplete_reason: Literal["max_output_tokens", "content_filter"] | None = None
    usage: ResponseUsage = field(
        default_factory=lambda: ResponseUsage(
            input_tokens=1000,
            input_tokens_details=InputTokensDetails(cached_tokens=400, cache_write_tokens=0),
            output_tokens=300,
            output_tokens_details=OutputTokensDetails(reasoning_tokens=200),
            total_tokens=1300,
        )
    )
    http_status: int = 200
    message: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    model: str = "gpt-5.5-2026-01-01"


def answer(text: str, *reasoning: str) -> RReply:
    """A message answer, after reasoning items carrying ``reasoning``."""
    return RReply(text=text, reasoning=reasoning)


def function_calls(*calls: tuple[str, Mapping[str, Any]], reasoning: tuple[str, ...] = ()) -> RReply:
    """A response asking for function calls."""
    return RReply(calls=tuple(calls), reasoning=reasoning)


def error(status: int, message: str = "scripted failure", **headers: str) -> RReply:
    """An error status with an OpenAI-shaped body."""
    return RReply(http_status=status, message=message, headers=headers)


def _response(reply: RReply, number: int) -> tuple[dict[str, Any], list[str]]:
    output: list[Any] = []
    sent: list[str] = []
    for i, thought in enumerate(reply.reasoning):
        output.append(
            ResponseReasoningItem(
                id=f"rs_{number}_{i}",
                type="reasoning",
                summary=[Summary(type="summary_text", text=thought)],
                content=[Content(type="reasoning_text", text=thought)],
                encrypted_content=f"gAAA-{thought}",
                status="completed",
            )
        )
        sent.append(thought)
    if reply.text is not None or reply.refusal is not None:
        parts: list[Any] = []
        if reply.text is not None:
            parts.append(ResponseOutputText(type="output_text", text=reply.text, annotations=[]))
        if reply.refusal is not None:
            parts.append(ResponseOutputRefusal(type="refusal", refusal=reply.refusal))
        output.append(
            ResponseOutputMessage(
                id=f"msg_{number}", type="message", role="assistant", status="completed", content=parts
            )
        )
    for i, (name, args) in enumerate(reply.calls):
        arguments = reply.raw_arguments if reply.raw_arguments is not None and i == 0 else json.dumps(args)
        output.append(
            ResponseFunctionToolCall(
                id=f"fc_{number}_{i}",
                call_id=f"call_{number}_{i}",
                type="function_call",
                name=name,
                arguments=arguments,
            )
        )
    response = Response(
        id=f"resp_{number}",
        object="response",
        created_at=1_700_000_000,
        model=reply.model,
        output=output,
        parallel_tool_calls=True,
        tool_choice="auto",
        tools=[],
        status=reply.status,
        incomplete_details=IncompleteDetails(reason=reply.incomplete_reason) if reply.incomplete_reason else None,
        usage=reply.usage,
    )
    return response.model_dump(mode="json", exclude_none=True), sent


class ResponsesServer(SdkServer[RReply]):
    """The server: replies come from ``script`` in order, or from ``respond(request_body)``."""

    route = "/v1/responses"
    base_path = "/v1"
    thread_name = "fake-responses"

    def __init__(self, script: list[RReply], respond: Callable[[dict[str, Any]], RReply] | None) -> None:
        super().__init__(script, respond)
        self.thoughts_sent: list[str] = []
        """Every reasoning text served, in order."""

    def exhausted(self) -> RReply:
        return error(500, "the fake server's script is exhausted")

    def error_body(self, status: int, message: str, *, scripted: bool) -> Any:
        return error_payload(message, "scripted" if scripted else "not_found")

    def body(self, reply: RReply, number: int) -> Any:
        payload, sent = _response(reply, number)
        with self._lock:
            self.thoughts_sent.extend(sent)
        return payload


@contextmanager
def responses_server(
    *replies: RReply, respond: Callable[[dict[str, Any]], RReply] | None = None
) -> Iterator[tuple[str, ResponsesServer]]:
    """Run the server on 127.0.0.1 in a thread; yields (base URL ending in ``/v1``, the server)."""
    with ResponsesServer(list(replies), respond).running() as served:
        yield served
