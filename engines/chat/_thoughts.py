"""Thought hygiene at the engine boundary, and the opt-in debugging sink.

A model's thoughts (OpenAI reasoning items, vLLM's ``reasoning`` / ``reasoning_content`` fields,
inline ``<think>…</think>`` or DiffusionGemma ``<|channel>thought…<channel|>`` text) never leave an
engine in a ``ChatResult``. The one exception is for debugging: when ``System2Settings.thought_sink``
names a file **and** the running task opted in (``debug_thoughts: true``, entered with
``keep_thoughts``), the engine hands the thought to its ``on_thought`` callback, which appends
it to that JSONL file. Nothing reads the file back:
no prompt, graph state, checkpoint, log line or decision record ever contains what it holds.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from fastslow.router import TaskCommon
from fastslow.router.engine_api import THOUGHT_TASK, strip_thoughts
from fastslow.router.settings import System2Settings

__all__ = ["ThoughtSink", "final_content", "inline_thoughts", "keep_thoughts"]

logger = logging.getLogger(__name__)

# The task whose System-2 calls may keep their thoughts; ``None`` (the default) keeps nothing.
# A context variable, so that concurrent tasks in one process never see each other's opt-in.
_TASK = THOUGHT_TASK  # set by the router around a task's System-2 call when the task opted in

# A chat template that opens the thought inside the prompt (Qwen3, DeepSeek-R1 without a reasoning
# parser) makes the server return only the closing marker: everything before it is thought.
_CLOSING = re.compile(r"</think>|<channel\|>", re.IGNORECASE)
_BLOCKS = (
    re.compile(r"<\|channel>thought(.*?)(?:<channel\|>|\Z)", re.DOTALL),
    re.compile(r"<think>(.*?)(?:</think>|\Z)", re.DOTALL | re.IGNORECASE),
)


def final_content(text: str) -> str:
    """``text`` without thought markup: closed or unclosed blocks, and a template-opened thought."""
    return _CLOSING.split(strip_thoughts(text))[-1].strip()


def inline_thoughts(text: str) -> list[str]:
    """The thoughts ``final_content`` cuts from ``text``, for the sink only."""
    thoughts: list[str] = []
    for pattern in _BLOCKS:
        thoughts.extend(match.group(1) for match in pattern.finditer(text))
        text = pattern.sub("", text)
    *opened, _ = _CLOSING.split(text)
    thoughts.extend(opened)
    return [t.strip() for t in thoughts if t.strip()]


@contextmanager
def keep_thoughts(task: TaskCommon | str | None) -> Iterator[None]:
    """Let System-2 calls made inside the block keep their thoughts in the sink, under ``task``'s name.

    A ``TaskCommon`` counts only when it opted in (``debug_thoughts``); a string names the task
    outright; ``None`` turns keeping off for the block. Without a configured ``thought_sink`` this
    does nothing at all.
    """
    name = task.name if isinstance(task, TaskCommon) and task.debug_thoughts else task
    token = _TASK.set(name if isinstance(name, str) else None)
    try:
        yield
    finally:
        _TASK.reset(token)


class ThoughtSink:
    """Append-only JSONL file of thoughts, one ``{time, task, model, thought}`` record a line.

    Write-only by design: it has no method that reads the file.

    Args:
        path: the file (``System2Settings.thought_sink``); created with owner-only permissions.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: System2Settings) -> ThoughtSink | None:
        """The sink the settings name, or ``None`` when ``thought_sink`` is unset (the default)."""
        return cls(settings.thought_sink) if settings.thought_sink is not None else None

    def for_model(self, model: str) -> Callable[[str], None]:
        """The ``on_thought`` callback an engine serving ``model`` is built with."""
        return partial(self.keep, model=model)

    def keep(self, thought: str, *, model: str) -> None:
        """Append one thought of the running task; nothing when the task did not opt in.

        A failing write is logged (without the thought) and never fails the model call.
        """
        task = _TASK.get()
        thought = thought.strip()
        if task is None or not thought:
            return
        record = {"time": datetime.now(UTC).isoformat(), "task": task, "model": model, "thought": thought}
        line = json.dumps(record, ensure_ascii=False) + "\n"
        try:
            # Small synchronous appends: this is a debugging aid, not a hot path.
            with self._lock:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                with os.fdopen(fd, "a", encoding="utf-8") as file:
                    file.write(line)
        except OSError as exc:
            logger.warning("cannot write the thought sink %s: %s", self.path, exc.strerror or exc)
