"""The bookkeeping behind ``CoalescingEngine``: what makes two calls alike, and one call's callers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.trace import SpanContext

from ._answer_cache import AnswerCache
from ._answers import EngineReply
from ._engine import DecisionEngine, ReadOptions
from ._questions import Image, Question, State, question_to_wire
from ._settings import CoalesceSettings
from ._work import current_tenant

__all__ = ["NO_OPTIONS", "Call", "Gone", "Group", "Shared", "group_key", "question_key"]

Group = tuple[Hashable, ...]
NO_OPTIONS = ReadOptions()


def group_key(state: State, images: Sequence[Image], options: ReadOptions | None) -> Group | None:
    """What makes two calls about "the same state"; ``None`` for a state that has no JSON form."""
    if isinstance(state, str):
        text = state
    else:
        try:
            text = json.dumps(state, ensure_ascii=False, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError):
            return None
    opts = options or NO_OPTIONS
    shown = tuple((i.format, i.placeholder, i.data) for i in images)
    return (isinstance(state, str), text, shown, opts.samples, opts.steps, opts.think, opts.seed)


def question_key(question: Question, violation: str | None) -> tuple[str, str | None]:
    return (json.dumps(question_to_wire(question), ensure_ascii=False, sort_keys=False), violation)


class Gone(Exception):
    """The call a caller shared was cancelled by its only other caller leaving; ask again."""


class Call:
    """One engine call and the callers waiting for it."""

    __slots__ = (
        "engine",
        "ends",
        "future",
        "group",
        "handle",
        "identity",
        "images",
        "inline",
        "options",
        "otel",
        "prefix",
        "qkeys",
        "questions",
        "span",
        "state",
        "task",
        "tenant",
        "violations",
        "members",
    )

    def __init__(
        self,
        engine: DecisionEngine,
        state: State,
        questions: Mapping[str, Question],
        images: Sequence[Image],
        options: ReadOptions | None,
        prefix: tuple[str, str, str],
    ) -> None:
        self.engine = engine
        self.state = state
        self.questions = questions
        self.images = images
        self.options = options
        self.prefix = prefix
        self.group: Group | None = None
        self.qkeys: dict[str, tuple[str, str | None]] = {}
        self.violations: dict[str, str] = {}
        self.identity: tuple[Group, frozenset[tuple[str, tuple[str, str | None]]]] | None = None
        self.ends: list[float | None] = []
        """Each caller's deadline on the monotonic clock (``None``: none of its own)."""
        self.tenant = current_tenant()
        self.otel = otel_context.get_current()
        """The trace context of the caller that opened the call: its span is in that caller's trace."""
        self.span: SpanContext | None = None
        """The engine call's span (``TracedEngine``), which the other callers' spans link to."""
        self.inline = False
        """Sent in the opening caller's own task (``CoalescingEngine``), not a task of its own."""
        self.members = 0
        self.handle: asyncio.Handle | None = None
        self.task: asyncio.Task[EngineReply] | None = None
        self.future: asyncio.Future[EngineReply] | None = None

    def took_span(self, span: SpanContext) -> None:
        """The engine call's span, from ``TracedEngine`` (the first one: a fallback chain may make more)."""
        if self.span is None:
            self.span = span

    @property
    def end(self) -> float | None:
        return None if any(e is None for e in self.ends) else max(e for e in self.ends if e is not None)


class Shared:
    """What every view of one engine shares: the calls in flight and waiting, and the cache."""

    def __init__(self, settings: CoalesceSettings) -> None:
        self.settings = settings
        self.running = 0
        self.calls_sent = 0
        self.pending: dict[Group, Call] = {}
        self.identical: dict[object, Call] = {}
        self.unkeyed: set[Call] = set()
        self.cache = (
            AnswerCache(ttl_s=settings.cache_ttl_s, entries=settings.cache_entries)
            if settings.cache_ttl_s > 0
            else None
        )
        self.views: dict[str, Any] = {}
        """Policy version -> the ``CoalescingEngine`` view whose cached answers belong to it."""
