"""The review queue over HTTP: ``GET /v1/reviews``, ``GET /v1/reviews/{id}``, ``POST /v1/reviews/{id}``.

Every ``review`` verdict waits in its tenant's queue, most uncertain first: those of
``POST /v1/policy-check`` (its response's ``review_id``) and those of in-process graphs paused at a
policy gate whose router records into the same decision log. Reading takes a key with the ``read``
or ``review`` scope, settling one with ``review``. Another tenant's review is a 404, as one that
does not exist.

Settling is idempotent: the same verdict again answers 200 with the review as it stands; a
different one is a 409 whose body carries the first settlement (``review``). A settled review of a
paused graph carries ``resume``, the exact value that graph's gate takes (docs/reviews.md).

``settle`` is the one path the API and the console's form share.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import SQLAlchemyError

from fastslow.api.store import Review, ReviewStatus, Settled, possible_id
from fastslow.router import resume_value

from ._errors import ERROR_RESPONSES, ApiError, ErrorBody, ErrorDetail, StoreUnavailable
from ._json import StrictJsonRoute, model_response
from ._services import Services
from .deps import Caller, ServicesDep, requires

__all__ = ["ReviewConflict", "ReviewList", "ReviewOut", "SettleRequest", "router", "settle"]

log = logging.getLogger("fastslow.api")

router = APIRouter(prefix="/v1/reviews", tags=["reviews"], route_class=StrictJsonRoute)

MAX_NOTE_CHARS = 4_000
MAX_PAGE = 200
MAX_OFFSET = 1_000_000


class ReviewOut(BaseModel):
    """A review: waiting for a person, or settled by one (or by its expiry)."""

    id: str
    status: ReviewStatus = Field(description="pending, allowed, denied or expired.")
    verdict: Literal["allow", "deny"] | None = Field(
        description="The settled verdict (an expired review's is the configured one); null while pending."
    )
    task: str = Field(description="The check task (policy) that asked for review.")
    rule: str = Field(description="The rule that asked for review.")
    probability: float = Field(description="The rule's probability of a violation.")
    probabilities: dict[str, float] = Field(description="Each rule's probability of a violation.")
    subject: dict[str, Any] = Field(
        description='What was checked: {"text": ...} or {"tool_call": {"name": ..., "args": ...}}.'
    )
    policy_version: str
    decision_id: str = Field(description="The rule's decision (GET /v1/decisions/{id}).")
    source: Literal["api", "graph", "agent"] = Field(
        description="api: POST /v1/policy-check; graph: policy_gate_node; agent: the create_agent gate middleware."
    )
    thread_id: str | None = Field(description="The LangGraph thread paused at the gate (graph and agent reviews).")
    tool_call_id: str | None
    created_at: datetime
    expires_at: datetime = Field(description="When a pending review expires with the configured verdict.")
    settled_by: str | None = Field(description="The id of the API key that settled it; `expiry` when it expired.")
    settled_at: datetime | None
    note: str | None = Field(description="The reviewer's note.")
    resume: str | dict[str, Any] | None = Field(
        description=(
            "The exact value to resume the paused graph with: `allow`/`deny` for a graph's policy gate, "
            'one human-in-the-loop decision ({"type": "approve"} or {"type": "reject", "message": ...}) for '
            "the gate middleware; null for an API review and while pending."
        )
    )

    @classmethod
    def of(cls, review: Review) -> ReviewOut:
        fields = {name: getattr(review, name) for name in cls.model_fields if name != "resume"}
        fields["subject"] = dict(review.subject)
        fields["probabilities"] = dict(review.probabilities)
        return cls.model_validate({**fields, "resume": resume_value(review)})


class ReviewList(BaseModel):
    """One page of a tenant's reviews."""

    reviews: list[ReviewOut] = Field(description="Pending ones most uncertain first; the others newest first.")
    next_offset: int | None = Field(description="The `offset` of the next page; null on the last.")


class SettleRequest(BaseModel):
    """A reviewer's answer."""

    model_config = ConfigDict(extra="forbid")

    verdict: Literal["allow", "deny"] = Field(description="What happens to the reviewed call or text.")
    note: str | None = Field(default=None, min_length=1, max_length=MAX_NOTE_CHARS, description="Free text.")
    label: Literal["allow", "deny"] | None = Field(
        default=None,
        description=(
            "Only when you mean to: the verdict the rule should have given, recorded as its decision's outcome. "
            "Allowing a call the user asked for does not by itself make the rule's answer wrong."
        ),
    )


class ReviewConflict(ErrorBody):
    """A different settlement came first: the error, and the review as it was settled."""

    review: ReviewOut


ReviewId = Annotated[str, Path(min_length=1, max_length=64, description="The review's id.")]


ReviewReaderDep = Annotated[Caller, Depends(requires("read", "review"))]
"""A caller whose key may read the queue: a reader of the log, or a reviewer."""
ReviewerDep = Annotated[Caller, Depends(requires("review"))]
"""A caller whose key may settle reviews."""

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No review with this id for this key's tenant."}
}
_FORBIDDEN: dict[int | str, dict[str, Any]] = {
    403: {"model": ErrorBody, "description": "The API key was revoked, or lacks the scope."}
}
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ReviewConflict, "description": "Settled differently before; `review` is that settlement."}
}


def _not_found(review_id: str) -> ApiError:
    return ApiError(404, f"no review {review_id!r} for this API key's tenant", field="review_id")


@router.get("", response_model=ReviewList, responses={**ERROR_RESPONSES, **_FORBIDDEN})
async def list_reviews(
    services: ServicesDep,
    caller: ReviewReaderDep,
    status: Annotated[ReviewStatus | None, Query(description="Only reviews in this state.")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Response:
    """The caller's tenant's reviews: pending ones most uncertain first, the others newest first."""
    try:
        found = await services.decisions.reviews(tenant=caller.tenant, status=status, limit=limit, offset=offset)
    except (SQLAlchemyError, OSError) as exc:
        raise StoreUnavailable() from exc
    more = offset + limit if len(found) == limit else None
    return model_response(ReviewList(reviews=[ReviewOut.of(r) for r in found], next_offset=more))


@router.get("/{review_id}", response_model=ReviewOut, responses={**ERROR_RESPONSES, **_FORBIDDEN, **_NOT_FOUND})
async def get_review(review_id: ReviewId, services: ServicesDep, caller: ReviewReaderDep) -> Response:
    """A review's state: pending, allowed, denied or expired, who settled it and when."""
    if not possible_id(review_id):  # no such id can exist: no query
        raise _not_found(review_id)
    try:
        review = await services.decisions.get_review(review_id, tenant=caller.tenant)
    except (SQLAlchemyError, OSError) as exc:
        raise StoreUnavailable() from exc
    if review is None:
        raise _not_found(review_id)
    return model_response(ReviewOut.of(review))


@router.post(
    "/{review_id}", response_model=ReviewOut, responses={**ERROR_RESPONSES, **_FORBIDDEN, **_NOT_FOUND, **_CONFLICT}
)
async def settle_review(
    review_id: ReviewId, body: SettleRequest, services: ServicesDep, caller: ReviewerDep
) -> Response:
    """Allow or deny a pending review (the key needs the `review` scope).

    Idempotent: the same verdict again is a 200 with the review as it stands (the first note and
    label stay); a different verdict is a 409 carrying the first settlement. ``label`` is recorded
    as the rule's outcome only by the request that settles the review.
    """
    if not possible_id(review_id):
        raise _not_found(review_id)
    settled = await settle(
        services,
        tenant=caller.tenant,
        key_id=caller.key_id,
        review_id=review_id,
        verdict=body.verdict,
        note=body.note,
        label=body.label,
    )
    review = settled.review
    if settled.now_settled or review.verdict == body.verdict:
        return model_response(ReviewOut.of(review))
    when = review.settled_at.isoformat() if review.settled_at is not None else "an earlier request"
    message = (
        f"review {review_id!r} was settled ({review.status}, {review.verdict!r}) at {when}; "
        f"it cannot be settled as {body.verdict!r}"
    )
    error = ErrorDetail(type="conflict", message=message, field="verdict").model_dump(exclude_none=True)
    conflict = {"error": error, "review": ReviewOut.of(review).model_dump(mode="json")}
    return JSONResponse(conflict, status_code=409)


async def settle(
    services: Services,
    *,
    tenant: str,
    key_id: str,
    review_id: str,
    verdict: Literal["allow", "deny"],
    note: str | None = None,
    label: Literal["allow", "deny"] | None = None,
) -> Settled:
    """Settle ``tenant``'s review ``review_id`` as ``verdict`` for the key ``key_id``.

    ``label``, only when the reviewer gives one, is the verdict the rule should have given; it is
    recorded as the outcome of the rule's decision (as ``POST /v1/decisions/{id}/outcome`` records
    one), and only when this call is the one that settled the review. A person allowing a call does
    not by itself say the rule was wrong, so no label is inferred from ``verdict``.

    Returns:
        The settlement; ``now_settled`` is false when the review was settled (or expired) before,
        and then ``review`` is that first settlement: the caller answers 200 when it is the same
        verdict and 409 when it differs.

    Raises:
        ApiError: 404 when ``tenant`` has no such review.
        StoreUnavailable: the database did not answer.
    """
    try:
        settled = await services.decisions.settle_review(
            review_id, tenant=tenant, verdict=verdict, by=key_id, note=note
        )
    except (SQLAlchemyError, OSError) as exc:
        raise StoreUnavailable() from exc
    if settled is None:
        raise ApiError(404, f"no review {review_id!r} for this API key's tenant", field="review_id")
    if label is not None and settled.now_settled:
        decision_id = settled.review.decision_id
        try:
            outcome = await services.decisions.record_outcome(
                decision_id, tenant=tenant, label=label, note=f"review {review_id}" + (f": {note}" if note else "")
            )
            decision = await services.decisions.get(decision_id, tenant=tenant)
            if outcome is not None and decision is not None:
                await services.learner.on_outcome(decision, outcome)
            elif outcome is None:
                # A graph's decision may still be queued in its process's write-behind sink.
                log.warning(
                    "review %s is settled, but its decision %s is not in the log yet: its label was not recorded; "
                    "record it on the decision's page once it is",
                    review_id,
                    decision_id,
                )
        except (SQLAlchemyError, OSError):
            # The settlement is committed; the label can be recorded again on the decision's page.
            log.exception("recording the label of review %s on decision %s failed", review_id, decision_id)
    return settled
