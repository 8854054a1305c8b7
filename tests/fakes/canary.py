"""Providers that think out loud: every thought field they serve carries one unique canary string.

Used by the end-to-end thought-hygiene test. Each fake answers whatever a graph asks (structured
answers within the schema's options, a tool call when tools are offered, text otherwise) and puts
``CANARY`` in every place a model's thoughts can travel:

* OpenAI Responses: reasoning items (summary, reasoning text, ``encrypted_content``) and inline
  markup in ``output_text``;
* OpenAI-compatible Chat Completions (vLLM): ``message.reasoning`` and ``reasoning_content``, and the
  content's ``<think>…</think>``, ``<|channel>thought\\n…<channel|>``, an unclosed
  ``<|channel>thought …`` and a template-opened ``…</think>``;
* Anthropic: ``ThinkingBlock`` text and signature and ``RedactedThinkingBlock`` data (the
  ``fakes.anthropic_server`` fake with ``canary=CANARY``), and inline markup in text blocks;
* the DiffusionGemma structured server: ``diagnostics.thought.text``.

Each records what it served, so a test can prove the canary was really sent.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fakes import anthropic_server
from fakes.jev_server import JevFakeServer, Recorded
from fakes.openai_server import Reply
from fakes.responses_server import RReply

__all__ = [
    "BAD_TICKET",
    "CANARY",
    "GOOD_TICKET",
    "INLINE_FORMS",
    "ThinkingChat",
    "ThinkingJevServer",
    "thinking_anthropic",
    "thinking_responses",
]

CANARY = f"CANARY-{uuid.uuid4().hex}-THOUGHT"
"""Unique per test session, so no other text can match it by chance."""

GOOD_TICKET = {"category": "billing", "priority": 2, "summary": "Double charge on the May invoice"}
BAD_TICKET = {"category": "billing", "priority": 9, "summary": "Double charge", "mood": "angry"}

INLINE_FORMS: dict[str, Callable[[str], str]] = {
    "think tags": lambda body: f"<think>{CANARY}</think>{body}",
    "thought channel": lambda body: f"<|channel>thought\n{CANARY}<channel|>{body}",
    "unclosed channel": lambda body: f"{body}<|channel>thought {CANARY}",
    "template-opened think": lambda body: f"{CANARY}\n</think>\n\n{body}",
}
"""The ways a thought can sit inside content, each wrapping the final content ``body``."""


def _structured(schema: Mapping[str, Any], *, draft: bool) -> Any:
    """An answer within ``schema``: a router question's option, or a ticket (invalid from the draft worker)."""
    answer = schema.get("properties", {}).get("answer")
    if isinstance(answer, Mapping):
        options = list(answer["enum"])
        return {"answer": next((o for o in ("billing", "no") if o in options), options[0])}
    return BAD_TICKET if draft else GOOD_TICKET


@dataclass
class ThinkingChat:
    """``respond`` for ``fakes.openai_server``: a vLLM-style server with a reasoning parser."""

    served: list[str] = field(default_factory=list)
    """Which thought carriers went out (``reasoning`` fields and the names of ``INLINE_FORMS``)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            form_name = list(INLINE_FORMS)[len(self.served) % len(INLINE_FORMS)]
            self.served.extend(["reasoning", "reasoning_content", form_name])
        wrap = INLINE_FORMS[form_name]
        thoughts = {"reasoning": CANARY, "reasoning_content": CANARY}
        messages = body.get("messages", [])
        fmt = body.get("response_format")
        if fmt is not None:
            value = _structured(fmt["json_schema"]["schema"], draft=body.get("model") == "qwen")
            return Reply(content=wrap(json.dumps(value)), extra=thoughts)
        if body.get("tools") and messages and messages[-1].get("role") != "tool":
            return Reply(content=wrap("Let me look."), calls=(("read_file", {"path": "a.txt"}),), extra=thoughts)
        return Reply(content=wrap("Here is what I found."), extra=thoughts)


def thinking_responses(body: dict[str, Any]) -> RReply:
    """``respond`` for ``fakes.responses_server``: a reasoning model that also leaks inline markup."""
    reasoning = (f"I should consider {CANARY} first.",)
    items = body.get("input", [])
    fmt = body.get("text", {}).get("format")
    if fmt is not None:
        return RReply(
            text=INLINE_FORMS["think tags"](json.dumps(_structured(fmt["schema"], draft=False))), reasoning=reasoning
        )
    if body.get("tools") and items and items[-1].get("type") != "function_call_output":
        return RReply(
            text=INLINE_FORMS["unclosed channel"]("Let me look."),
            calls=(("read_file", {"path": "a.txt"}),),
            reasoning=reasoning,
        )
    return RReply(text=INLINE_FORMS["thought channel"]("Here is what I found."), reasoning=reasoning)


def thinking_anthropic(body: dict[str, Any]) -> anthropic_server.Reply:
    """``respond`` for ``fakes.anthropic_server`` (run it with ``canary=CANARY`` for the thinking blocks)."""
    tools = {tool["name"]: tool for tool in body.get("tools", [])}
    last = body["messages"][-1]["content"]
    after_tools = isinstance(last, list) and any(block.get("type") == "tool_result" for block in last)
    if "answer" in tools:
        return anthropic_server.answer(_structured(tools["answer"]["input_schema"], draft=False))
    if tools and not after_tools:
        return anthropic_server.tool_use(
            ("read_file", {"path": "a.txt"}), text=INLINE_FORMS["unclosed channel"]("Let me look.")
        )
    return anthropic_server.text(INLINE_FORMS["think tags"]("Here is what I found."))


class ThinkingJevServer(JevFakeServer):
    """The structured server, unsure of everything (so the router escalates) and thinking out loud.

    Choice and yes/no answers are uniform; questions of the ``tool_safety`` task come back ``null``
    (skipped), which makes the router ask System 2 under ``on_failure: escalate``. Every reply
    carries ``diagnostics.thought`` with the canary.
    """

    def __init__(self) -> None:
        super().__init__("structured")
        self.thoughts_served = 0

    def _compute(self, record: Recorded) -> dict[str, Any]:
        answers: dict[str, Any] = {}
        for name, q in record.json["questions"].items():
            if name.startswith("tool_safety."):
                answers[name] = None
            elif q["type"] == "noul":
                answers[name] = {"type": "noul", "noul": 0.5}
            else:
                labels = [str(c) for c in q["criteria"]]
                probs = {label: 1 / len(labels) for label in labels}
                answers[name] = {
                    "type": "choice",
                    "choice": labels[0],
                    "probabilities": probs,
                    "confidence": probs[labels[0]],
                }
        self.thoughts_served += 1
        return {
            "model": "dgemma",
            "answers": answers,
            "usage": {"input_tokens": 100, "output_tokens": 9},
            "diagnostics": {
                "steps": 1,
                "thought": {"tokens": 9, "closed": False, "ms": 1.0, "text": CANARY},
                "timing": {"total_ms": 1.0, "reads": 1},
                "engine": "fake",
            },
        }
