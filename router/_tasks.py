"""The runtime form of a policy file: tasks the router can run, with their thresholds.

``policies`` parses YAML into these values; the router reads nothing else. Three task kinds:
a routing task (routes with descriptions and examples), a classification task (typed questions) and
a policy check (rules phrased as questions, each with an action band).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from ._decisions import Calibration, CheckAction, OnFailure, Thresholds
from ._engine import ReadOptions
from ._questions import Choice, Noul, Question

__all__ = [
    "CheckTask",
    "ClassifyTask",
    "Egress",
    "Examples",
    "Learn",
    "OpenEnded",
    "PolicySet",
    "QuestionRole",
    "Route",
    "RouteTask",
    "Rule",
    "Sticky",
    "Task",
    "TaskCommon",
]

Examples: TypeAlias = Mapping[str, tuple[str, ...]]
"""Option name -> labelled example texts."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Egress:
    """Where a task's data may go when escalated."""

    local_only: bool = False
    """Escalate only to allow-listed self-hosted base URLs; otherwise fail closed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Learn:
    """Learning from escalations (``learn:`` in a task): what System 2 answered, or an outcome
    recorded, becomes a labelled example for the task's example-trained engine (docs/learning.md)."""

    sources: frozenset[Literal["system2", "outcomes"]] = frozenset({"system2", "outcomes"})
    """``system2``: System 2's answers to escalated questions; ``outcomes``: labels recorded for decisions."""
    max_examples: int = 1000
    """At most this many learned examples per question; the oldest System-2 ones go first."""
    max_text_chars: int = 2000
    """Longer texts are not learned (cut, they would be another text)."""
    retrain_after: int = 20
    """New examples that make a retrain due; a withdrawn one makes it due at once."""
    tenants: frozenset[str] | None = None
    """Only these tenants' decisions teach the task (every tenant's when ``None``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskCommon:
    """Settings every task kind has."""

    name: str
    engine: str | None = None
    """The System-1 engine (a shipped ``EngineName`` or an installed plugin's); the settings' default when ``None``."""
    read: ReadOptions = field(default_factory=ReadOptions)
    escalate_to: str | None = None
    """System-2 model reference such as ``openai:gpt-5.5``; ``None`` for the default one."""
    thresholds: Thresholds = field(default_factory=Thresholds)
    calibration: Calibration = field(default_factory=Calibration)
    on_failure: OnFailure = "escalate"
    egress: Egress = field(default_factory=Egress)
    store_state: bool = False
    """Whether the decision log may keep the state text (a hash otherwise)."""
    debug_thoughts: bool = False
    """Keep System-2 thoughts of this task in the settings' ``thought_sink`` (debugging; off by default)."""
    mode: Literal["live", "shadow"] = "live"
    """``shadow``: System 1 answers and is logged, but the incumbent (System 2, or a callback) decides."""
    audit_rate: float = 0.0
    """Share of the decisions System 1 keeps drawn into the audit sample (``Decision.audit``)."""
    fitted: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """What ``fastslow calibrate`` / ``tune`` recorded of their fits (``thresholds``, ``calibration``, ``bands``)."""
    learn: Learn | None = None
    """Learning from escalations, where the task opts in (route and classification tasks)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    name: str
    description: str | None = None
    examples: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenEnded:
    """Send requests that need free-form work straight to System 2."""

    question: Noul = field(
        default_factory=lambda: Noul(
            instructions=(
                "Does this request need open-ended, free-form work (writing, reasoning, planning) "
                "rather than being handled by one of the listed routes?"
            )
        )
    )
    threshold: float = 0.5
    """Escalate when P(open-ended) is at or above this."""
    examples: Examples = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Sticky:
    """Multi-turn stickiness: a follow-up keeps the previous route."""

    enabled: bool = True
    min_change_confidence: float = 0.85
    """A follow-up changes route only when System 1 is at least this sure of the new one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteTask(TaskCommon):
    kind: Literal["route"] = "route"
    instructions: str = "Which route should handle the user's latest message?"
    routes: Mapping[str, Route] = field(default_factory=dict)
    none_option: str | None = None
    """A route name that means "none of these": choosing it escalates."""
    open_ended: OpenEnded | None = None
    context_turns: int = 2
    """Earlier turns shown with the latest user turn to System 2 (and to System 1 with ``system1_context``)."""
    system1_context: bool = False
    """Whether System 1 reads the earlier turns too. Off by default: an example-trained engine learns
    from single messages, and earlier turns pull its read toward the earlier topic (a new open-ended
    request after a billing turn was routed to billing at 0.90); follow-ups keep their route through
    ``sticky`` instead. Turn it on for an engine that reads conversations, measured first."""
    sticky: Sticky = field(default_factory=Sticky)
    _question: Choice | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def question(self) -> Choice:
        # Asked on every routing call: built on first use, then the same object, which also lets
        # engines keep what they derive from it (the Jev client's wire form).
        if self._question is None:
            made = Choice(
                criteria={r.name: r.description for r in self.routes.values()}, instructions=self.instructions
            )
            object.__setattr__(self, "_question", made)
            return made
        return self._question

    @property
    def examples(self) -> Examples:
        return {r.name: r.examples for r in self.routes.values() if r.examples}


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassifyTask(TaskCommon):
    kind: Literal["classify"] = "classify"
    questions: Mapping[str, Question] = field(default_factory=dict)
    examples: Mapping[str, Examples] = field(default_factory=dict)
    """Question name -> option -> examples."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    name: str
    question: Noul | Choice
    action: CheckAction = field(default_factory=CheckAction)
    examples: Examples = field(default_factory=dict)
    background: bool = True
    """Whether an example-trained engine also learns this rule against ordinary background text."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckTask(TaskCommon):
    kind: Literal["check"] = "check"
    rules: Mapping[str, Rule] = field(default_factory=dict)
    on_oversize: Literal["review", "deny"] = "review"
    """The verdict, unless a rule denies, for a state longer than the engine reads (``EngineLimits.max_read_chars``)."""
    system1_context: bool = False
    """Whether System 1 also reads the item with the caller's last turns, in a second read. The item
    is always judged alone; with this on, each rule keeps the more suspicious of the two reads, so
    context can raise a violation's probability but never lower it (read with the item, a benign
    turn diluted ``rm -rf`` from a deny at 0.86 to a review at 0.43). System 2 always gets the context."""


Task: TypeAlias = RouteTask | ClassifyTask | CheckTask


@dataclass(frozen=True, slots=True, kw_only=True)
class QuestionRole:
    """What a question is for, beyond its examples: how an example-trained engine learns it."""

    none_option: str | None = None
    """The route meaning "none of these"."""
    violation: str | None = None
    """Set for a policy-check rule: the option meaning "violated"."""
    background: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicySet:
    """A whole, validated policy file."""

    tasks: Mapping[str, Task]
    version: str
    """Content hash of the file it came from; recorded with every decision."""
    source: str = ""
    egress_allow: tuple[str, ...] = ()
    """Self-hosted base URLs that ``local_only`` tasks may escalate to."""
    default_escalate_to: str | None = None

    def question_roles(self) -> dict[str, QuestionRole]:
        """How an example-trained engine should learn each question of ``question_examples``."""
        out: dict[str, QuestionRole] = {}
        for task in self.tasks.values():
            if isinstance(task, RouteTask):
                out[task.name] = QuestionRole(none_option=task.none_option)
            elif isinstance(task, CheckTask):
                for r in task.rules.values():
                    out[f"{task.name}.{r.name}"] = QuestionRole(violation=r.action.violation, background=r.background)
        return out

    def question_examples(self) -> dict[str, Examples]:
        """Labelled examples keyed by the question names the router asks engines.

        A route task's question is named after the task, its open-ended check ``<task>.open_ended``,
        a classification question ``<task>.<question>`` and a policy rule ``<task>.<rule>``.
        """
        out: dict[str, Examples] = {}
        for task in self.tasks.values():
            if isinstance(task, RouteTask):
                if task.examples:
                    out[task.name] = task.examples
                if task.open_ended is not None and task.open_ended.examples:
                    out[f"{task.name}.open_ended"] = task.open_ended.examples
            elif isinstance(task, ClassifyTask):
                out.update({f"{task.name}.{q}": ex for q, ex in task.examples.items() if ex})
            else:
                out.update({f"{task.name}.{r.name}": r.examples for r in task.rules.values() if r.examples})
        return out
