"""Resuming a thread paused at a policy gate once the reviews it waits on are settled in the review queue.

A gate whose router records into the decision log (``store.sink(tenant, ...)``) opens a review for
each ``review`` verdict and pauses with its id in the interrupt: ``review_id`` in
``policy_gate_node``'s payload, ``fastslow.review_id`` in each action request of the ``create_agent``
middleware's. A person settles it (``POST /v1/reviews/{id}``, or the console), and the client that
runs the graph resumes the thread::

    out = await app.ainvoke({"messages": [HumanMessage(text)]}, config)
    while "__interrupt__" in out:
        await asyncio.sleep(5)  # or wake on the review webhook
        resumed = await resume_reviewed(app, config, store, tenant="acme")
        if resumed is not None:  # None: a review is still pending
            out = resumed

Graphs served by LangGraph's own server keep their reviews in its interrupts instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from langchain_core.runnables import RunnableConfig
from langgraph.pregel import Pregel
from langgraph.types import Command, Interrupt

from fastslow.router import ReviewState, resume_value

__all__ = ["ReviewLookup", "ReviewSource", "WaitingReview", "resume_reviewed", "waiting_reviews"]

ReviewLookup: TypeAlias = Callable[[str], Awaitable[ReviewState | None]]
"""A review's state by its id (``None``: there is none), for the caller's tenant."""


@runtime_checkable
class ReviewSource(Protocol):
    """Where reviews are read by id for a tenant: ``fastslow.api.store.DecisionStore`` is one."""

    async def get_review(self, review_id: str, *, tenant: str) -> ReviewState | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitingReview:
    """One interrupt of a paused thread, and the reviews in the queue it waits on."""

    interrupt_id: str
    gate: Literal["graph", "agent"]
    """``graph``: ``policy_gate_node`` (one review); ``agent``: the gate middleware (one per action, in order)."""
    review_ids: tuple[str, ...]


def _review_id(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(
            "the gate paused without a review in the queue: its router does not record into the decision log, "
            "or the review could not be opened (see the log); resume it with Command(resume=...) directly"
        )
    return value


def waiting_reviews(interrupts: Sequence[Interrupt]) -> list[WaitingReview]:
    """The fastslow gates among a paused thread's interrupts (``StateSnapshot.interrupts``), with their review ids.

    Raises:
        ValueError: an interrupt is not a fastslow gate's, or a gate's carries no review id.
    """
    waiting: list[WaitingReview] = []
    for interrupt in interrupts:
        value = interrupt.value
        if isinstance(value, Mapping) and isinstance(value.get("action_requests"), list):
            ids = tuple(
                _review_id((action.get("fastslow") or {}).get("review_id")) for action in value["action_requests"]
            )
            waiting.append(WaitingReview(interrupt_id=interrupt.id, gate="agent", review_ids=ids))
        elif isinstance(value, Mapping) and "resume_with" in value and "tool_call" in value:
            ids = (_review_id(value.get("review_id")),)
            waiting.append(WaitingReview(interrupt_id=interrupt.id, gate="graph", review_ids=ids))
        else:
            raise ValueError(f"interrupt {interrupt.id} is not a fastslow policy gate's: resume it yourself")
    return waiting


async def resume_reviewed(
    graph: Pregel[Any, Any, Any, Any],
    config: RunnableConfig,
    reviews: ReviewLookup | ReviewSource,
    *,
    tenant: str | None = None,
    context: Any = None,
) -> Any:
    """Resume the thread of ``config`` with its settled reviews' values, once every one is settled.

    Reads the thread's pending interrupts (``graph.aget_state(config)``), looks up the reviews they
    wait on, and, when none is pending any more, resumes with ``Command(resume={interrupt_id:
    value})``: ``"allow"``/``"deny"`` for ``policy_gate_node``, ``{"decisions": [...]}`` in action
    order for the gate middleware (``fastslow.router.resume_value``). An expired review resumes
    with the verdict it expired with.

    Args:
        graph: the compiled graph, with the checkpointer the thread was paused in.
        config: the thread's config (``{"configurable": {"thread_id": ...}}``).
        reviews: ``review_id -> review`` (say, over ``GET /v1/reviews/{id}``), or the decision log
            (``DecisionStore``) read for ``tenant``.
        tenant: whose reviews, when ``reviews`` is a decision log.
        context: the run's context (``context_schema``), when the graph takes one.

    Returns:
        What ``graph.ainvoke`` returned (it holds ``"__interrupt__"`` when the run paused again);
        ``None`` when a review is still pending, having resumed nothing.

    Raises:
        ValueError: the thread is not paused, or paused elsewhere than at a fastslow gate whose review
            is in the queue; or ``tenant`` is missing.
        LookupError: the queue has no review with an id the thread waits on.
    """
    lookup = _lookup(reviews, tenant)
    state = await graph.aget_state(config)
    if not state.interrupts:
        raise ValueError("the thread is not paused: nothing to resume")
    resume: dict[str, Any] = {}
    for waiting in waiting_reviews(state.interrupts):
        values = []
        for review_id in waiting.review_ids:
            review = await lookup(review_id)
            if review is None:
                raise LookupError(f"no review {review_id!r} in the queue")
            value = resume_value(review)
            if value is None:
                if review.status == "pending":
                    return None
                raise ValueError(f"review {review_id!r} is a {review.source} review, not a graph's")
            values.append(value)
        resume[waiting.interrupt_id] = values[0] if waiting.gate == "graph" else {"decisions": values}
    return await graph.ainvoke(Command(resume=resume), config, context=context)


def _lookup(reviews: ReviewLookup | ReviewSource, tenant: str | None) -> ReviewLookup:
    if not isinstance(reviews, ReviewSource):
        return reviews
    if tenant is None:
        raise ValueError("give the tenant whose reviews these are")
    source, of = reviews, tenant

    async def lookup(review_id: str) -> ReviewState | None:
        return await source.get_review(review_id, tenant=of)

    return lookup
