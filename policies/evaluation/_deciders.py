"""What an evaluation run asks its rows of, as protocols: the composition root supplies the engines.

``fastslow.policies`` imports only the kernel, so the run is written against these: a
``TaskRouter`` (``fastslow.router.Router`` is one) decides task rows as production would, a
``RowEngine`` (any ``DecisionEngine``) answers explicit rows, and ``Deciders`` builds both once the
run knows which rows it has (``fastslow.api`` implements it over the engine pool and the runtime).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from langchain_core.messages import BaseMessage

from fastslow.router import CheckResult, Decision, PolicySet, Question, State, ToolCall
from fastslow.router.engine_api import EngineReply

__all__ = ["Deciders", "RowEngine", "TaskRouter", "TrainingTexts"]

TrainingTexts = Mapping[str, Sequence[str]]
"""Question name (as the engine learns it) -> the example texts it learned that question from."""


class TaskRouter(Protocol):
    """Decides a policy task's rows: asks System 1, keeps or escalates, as ``Router`` does."""

    async def route(self, task_name: str, messages: Sequence[BaseMessage]) -> Decision: ...

    async def classify(self, task_name: str, state: State) -> Mapping[str, Decision]: ...

    async def check(self, task_name: str, item: str | ToolCall | Mapping[str, Any]) -> CheckResult: ...


class RowEngine(Protocol):
    """Answers an explicit row's questions (a System-1 ``DecisionEngine``)."""

    async def decide(self, state: State, questions: Mapping[str, Question]) -> EngineReply: ...


class Deciders(Protocol):
    """The engines of one evaluation run, as the composition root builds them from its settings.

    The run reads and plans its rows first (``load_policy``, ``learns``, ``training_texts``), then
    opens only what they need: ``router`` for task rows, ``engine`` for explicit rows, before the
    first row so no row waits for training. ``aclose`` closes what was opened.
    """

    def load_policy(self, path: Path) -> PolicySet:
        """The policy file as the router will load it, so rows are read against the tasks that run them."""
        ...

    def learns(self, engine: str) -> bool:
        """Whether ``engine`` is trained on examples (its training rows are then never scored)."""
        ...

    def training_texts(self, policy: PolicySet | None) -> TrainingTexts:
        """The examples the engines learn from under ``policy`` (``None``: explicit rows' engine's)."""
        ...

    async def router(self, policy_path: Path, policy: PolicySet, *, system2: bool) -> TaskRouter:
        """The router of ``policy`` (``system2`` off: escalated decisions stay escalated)."""
        ...

    async def engine(self) -> RowEngine:
        """The engine explicit rows are asked of, trained on the settings' examples alone."""
        ...

    async def aclose(self) -> None: ...
