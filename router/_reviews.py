"""The review queue as the kernel sees it: a sink that can open reviews, and the value to resume with.

A policy gate (``policy_gate_node``, the ``create_agent`` gate middleware) that reaches a ``review``
verdict pauses its graph with ``interrupt()``. When the router's sink is also a ``ReviewRecorder``
(the decision log's sink, ``DecisionStore.sink``), the gate first opens a review there, so the
paused call waits in the same queue as the API's reviews; its id travels in the interrupt. Once a
person settled it, ``resume_value`` gives the exact value that gate accepts on resume.

The kernel defines the shapes only; the decision log implements them (``fastslow.api.store``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

__all__ = ["PendingReview", "ResumeValue", "ReviewRecorder", "ReviewState", "resume_value"]

EXPIRED_MESSAGE = "The review expired before anyone answered it."
"""What the model reads when an agent's call was rejected because its review expired."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingReview:
    """A gate's ``review`` verdict to be put before a person."""

    decision_id: str
    """The deciding rule's decision (it may still be queued in a write-behind sink)."""
    task: str
    rule: str
    """The rule that asked for review."""
    subject: Mapping[str, Any]
    """What was checked: ``{"tool_call": {"name": ..., "args": ...}}`` (or ``{"text": ...}``)."""
    probabilities: Mapping[str, float]
    """Each rule's probability of a violation, for the rules System 1 answered."""
    probability: float
    """The deciding rule's probability; 0.5 when System 1 gave none (as uncertain as can be)."""
    policy_version: str
    source: Literal["graph", "agent"]
    """``graph``: ``policy_gate_node`` (resumed with ``"allow"``/``"deny"``); ``agent``: the gate
    middleware (resumed with LangChain's human-in-the-loop decisions)."""
    thread_id: str | None = None
    """The LangGraph thread paused at the gate."""
    tool_call_id: str | None = None


@runtime_checkable
class ReviewRecorder(Protocol):
    """A decision sink that can also open reviews (the decision log's sink is one).

    The gate opens a review inside its checkpointed check, so a resumed run never opens it twice.
    Sync graphs open theirs on fastslow's private event loop thread, as a sync router's durable
    commit does.
    """

    async def open_review(self, pending: PendingReview) -> str:
        """Open a review for ``pending``; its id, once it is committed."""
        ...


class ReviewState(Protocol):
    """What ``resume_value`` reads of a review (``fastslow.api.store.Review`` is one)."""

    @property
    def source(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def verdict(self) -> str | None: ...

    @property
    def note(self) -> str | None: ...


ResumeValue: TypeAlias = str | dict[str, Any] | None
"""``"allow"``/``"deny"`` (the policy gate), one human-in-the-loop decision (the middleware), or ``None``."""


def resume_value(review: ReviewState) -> ResumeValue:
    """The value the paused gate accepts for a settled review; ``None`` while it is pending or for an API review.

    * ``source == "graph"`` (``policy_gate_node``): ``"allow"`` or ``"deny"``, resumed as
      ``Command(resume={interrupt_id: value})``;
    * ``source == "agent"`` (the gate middleware): one of LangChain's human-in-the-loop decisions,
      ``{"type": "approve"}`` or ``{"type": "reject", "message": ...}`` (the reviewer's note, or
      that the review expired, when there is one), put in action order into
      ``{"decisions": [...]}`` for the interrupt;
    * ``source == "api"``: ``None``; the client that asked ``POST /v1/policy-check`` reads the
      verdict and acts on it itself.

    An expired review resumes with the verdict it expired with, as a settled one does.
    """
    if review.status == "pending" or review.verdict not in ("allow", "deny"):
        return None
    if review.source == "graph":
        return review.verdict
    if review.source != "agent":
        return None
    if review.verdict == "allow":
        return {"type": "approve"}
    message = review.note or (EXPIRED_MESSAGE if review.status == "expired" else None)
    return {"type": "reject"} if message is None else {"type": "reject", "message": message}
