"""Request and response bodies of the JSON endpoints (the Jev gateway's live in ``_jev_schemas``).

Pydantic sits here, at the trust boundary; the router works on its own dataclasses. Requests
forbid unknown fields, so a misspelt field is a 422 naming it rather than silently ignored.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fastslow.api.store import StoredDecision, StoredOutcome
from fastslow.router import Decision

__all__ = [
    "DecisionOut",
    "Message",
    "OutcomeOut",
    "OutcomeRequest",
    "PolicyCheckBatchRequest",
    "PolicyCheckBatchResponse",
    "PolicyCheckRequest",
    "PolicyCheckResponse",
    "RouteRequest",
    "RouteResponse",
    "RuleResult",
    "StoredDecisionOut",
    "ToolCallIn",
]

Verdict = Literal["allow", "review", "deny"]
Name = Annotated[str, Field(min_length=1, max_length=200)]
MAX_BATCH = 100


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Message(_Request):
    """One conversation turn."""

    role: Literal["user", "assistant", "system"] = Field(description="Who spoke.")
    content: str = Field(max_length=100_000, description="What was said.")


class ToolCallIn(_Request):
    """A tool call an agent proposes to make."""

    name: str = Field(min_length=1, max_length=200, description="The tool's name.")
    arguments: dict[str, Any] = Field(
        default_factory=dict,
        description="The call's arguments: at most `limits.max_argument_chars` as compact JSON (docs/limits.md).",
    )


class PolicyCheckRequest(_Request):
    """One item to check: a text or a proposed tool call (exactly one), with optional conversation context."""

    policies: list[Name] = Field(
        min_length=1, max_length=16, description="The policy file's check tasks to apply, such as `tool_safety`."
    )
    text: str | None = Field(default=None, max_length=100_000, description="A text to check.")
    tool_call: ToolCallIn | None = Field(default=None, description="A proposed tool call to check.")
    context: list[Message] = Field(
        default_factory=list,
        max_length=50,
        description=(
            "Earlier conversation turns. System 1 judges the item alone (a task with `system1_context` also "
            "reads it with the last 4 turns and keeps the more suspicious answer); System 2 reads the last 8."
        ),
    )


class RuleResult(BaseModel):
    """How one rule of one policy judged the item."""

    policy: str = Field(description="The check task.")
    rule: str = Field(description="The rule's name.")
    verdict: Verdict
    probability: float | None = Field(
        description="Calibrated probability that the item violates the rule (System 1); null when it could not answer."
    )
    system: Literal[1, 2] = Field(description="1 when System 1 settled the rule, 2 when System 2 did.")
    reason: str = Field(description="Why it was settled so: confident, low_confidence, engine_error, ...")
    threshold: float = Field(description="The band edge the probability was compared with.")
    decision_id: str = Field(description="The rule's decision in the decision log.")
    audit: bool = Field(
        default=False, description="Drawn into the policy's audit sample: please record this rule's outcome."
    )


class PolicyCheckResponse(BaseModel):
    """The combined verdict: deny beats review beats allow."""

    verdict: Verdict
    policy: str = Field(description="The check task whose rule decided.")
    rule: str = Field(description="The rule that decided the verdict.")
    decision_id: str = Field(description="The deciding rule's decision id (GET /v1/decisions/{id}).")
    system2: bool = Field(description="Whether System 2 was consulted for any rule.")
    policy_version: str = Field(description="sha256 of the policy file in force.")
    rules: list[RuleResult] = Field(description="Every rule of every policy applied.")
    review_id: str | None = Field(
        default=None,
        description="When the verdict is review: the review opened for a person (GET /v1/reviews/{id}); else null.",
    )


class PolicyCheckBatchRequest(_Request):
    """Many items, checked independently in one call."""

    items: list[PolicyCheckRequest] = Field(min_length=1, max_length=MAX_BATCH)


class PolicyCheckBatchResponse(BaseModel):
    """One result per item, in order."""

    results: list[PolicyCheckResponse]


class RouteRequest(_Request):
    """A conversation to route, as the LangGraph router node does."""

    task: str = Field(min_length=1, max_length=200, description="A route task of the policy file, such as `support`.")
    messages: list[Message] = Field(
        min_length=1, max_length=200, description="The conversation; the latest user turn is routed."
    )
    previous: str | None = Field(
        default=None, max_length=200, description="The route the conversation is on, for stickiness."
    )


class DecisionOut(BaseModel):
    """One typed decision."""

    id: str
    task: str
    question: str
    outcome: str | None = Field(description="The chosen option or verdict; null while unresolved.")
    system: Literal[1, 2]
    reason: str
    escalate: bool = Field(description="True when System 2 was needed and none settled it.")
    confidence: float
    threshold: float
    probabilities: dict[str, float] = Field(description="System 1's calibrated distribution, when it gave one.")
    verdict: Verdict | None
    policy_version: str
    engine: str
    model: str
    latency_ms: float
    detail: str
    cost_usd: float | None
    audit: bool = Field(
        default=False, description="Drawn into the task's audit sample: System 1 kept it; please record its outcome."
    )
    examples_version: str = Field(
        default="",
        description="The learned examples System 1 was trained with for this task (count-hash); empty when none.",
    )

    @classmethod
    def of(cls, decision: Decision | StoredDecision) -> DecisionOut:
        fields = {name: getattr(decision, name) for name in cls.model_fields}
        fields["probabilities"] = dict(decision.probabilities)
        return cls.model_validate(fields)


class RouteResponse(BaseModel):
    """Where the message goes."""

    route: str | None = Field(description="The route; null when nobody could settle it (send it to a frontier agent).")
    system2: bool = Field(description="Whether System 2 chose the route.")
    decision: DecisionOut


class StoredDecisionOut(DecisionOut):
    """A decision as the log keeps it."""

    created_at: datetime
    state_digest: str = Field(description="sha256 of the canonical JSON of the state.")
    state_text: str | None = Field(description="That JSON, only when the task's policy keeps state.")
    answers: dict[str, float] = Field(description="The calibrated distribution, option -> probability.")

    @classmethod
    def of(cls, decision: Decision | StoredDecision) -> StoredDecisionOut:
        fields = {name: getattr(decision, name) for name in cls.model_fields}
        fields["probabilities"] = dict(decision.probabilities)
        return cls.model_validate(fields)


class OutcomeRequest(_Request):
    """What turned out to be right; give a label, a System-2 judgement, or both."""

    label: str | None = Field(
        default=None, min_length=1, max_length=200, description="The correct option (a route, a label, yes/no)."
    )
    system2_correct: bool | None = Field(default=None, description="Whether System 2's answer was right.")
    note: str | None = Field(default=None, max_length=10_000, description="Free text for people.")


class OutcomeOut(BaseModel):
    """A recorded outcome."""

    id: str
    decision_id: str
    label: str | None
    system2_correct: bool | None
    note: str | None
    created_at: datetime

    @classmethod
    def of(cls, outcome: StoredOutcome) -> OutcomeOut:
        return cls.model_validate({name: getattr(outcome, name) for name in cls.model_fields})
