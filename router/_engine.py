"""The System-1 engine protocol, its per-call options and the limits servers impose."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeAlias, runtime_checkable

from ._answers import EngineReply
from ._questions import Image, Question, State

__all__ = ["DecisionEngine", "EngineLimits", "ReadOptions", "SyncDecide", "SyncDecisionEngine"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadOptions:
    """Per-call settings. Engines ignore what they do not support."""

    samples: int | Literal["auto"] | None = None
    """Noise draws per read on the DiffusionGemma structured server (1..32 or ``"auto"``)."""
    steps: int | None = None
    """Denoise steps per read on the structured server (1..8)."""
    think: int = 0
    """Thought budget in tokens on the structured server; 0 never opens a thought channel."""
    seed: int | None = None
    timeout_s: float | None = None
    """Time budget for the whole call, retries included; ``None`` uses the engine's default."""
    violations: Mapping[str, str] | None = None
    """Set by policy checks: question name -> the option meaning "violated". An engine that reads
    a long state in parts answers such a question from its most violated part."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineLimits:
    """What one engine or server accepts in a single request.

    The splitter in ``router`` uses these to cut larger requests into ones the server takes.
    """

    max_questions: int | None = None
    min_options: int = 2
    max_options: int | None = None
    """Most options in a choice (and levels in a score unless ``max_score_levels`` says)."""
    max_score_levels: int | None = None
    accepts_images: bool = False
    max_read_chars: int | None = None
    """The most of a state's text the engine reads for a policy check (``None``: all of it); a
    check on a longer state gets its task's ``on_oversize`` verdict unless a rule denies."""
    max_read_tokens: int | None = None
    """The most model work one reading of a state costs, in the engine's own tokens (``None``: not
    bounded in tokens). An answer that read less than the whole state says so
    (``Signals.read_all``), and a check then gets ``on_oversize`` as above."""


@runtime_checkable
class DecisionEngine(Protocol):
    """A System-1 engine: one call answers many named questions about one state."""

    name: str
    limits: EngineLimits

    async def decide(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply:
        """Answer every question about ``state``.

        Returns one ``Answer`` (or ``NoAnswer``) per question. Questions beyond the engine's
        limits are split transparently. Raises ``EngineError`` when the engine cannot answer at
        all and ``InvalidRequest`` for input no engine could answer.
        """
        ...

    async def aclose(self) -> None:
        """Release connections and models."""
        ...


@runtime_checkable
class SyncDecisionEngine(Protocol):
    """An engine that can also answer from sync code, in the calling thread (``Router.route_sync``)."""

    def decide_sync(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply | None:
        """``decide``, blocking the calling thread, bounded by ``options.timeout_s`` (else the engine's own).

        Returns ``None`` when this call needs the event loop (a request to split, images, no sync
        client): the caller then awaits ``decide``. Raises what ``decide`` raises.
        """
        ...


SyncDecide: TypeAlias = Callable[..., EngineReply | None]
"""A ``SyncDecisionEngine.decide_sync`` method."""
