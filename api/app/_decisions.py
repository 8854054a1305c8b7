"""``GET /v1/decisions/{id}`` and ``POST /v1/decisions/{id}/outcome``: the caller's tenant's decision log.

A decision of another tenant is answered exactly like one that does not exist (404), so a key
learns nothing about other tenants. An outcome sent with an ``Idempotency-Key`` is recorded once:
a retry gets the first response (``_idempotency``).
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from sqlalchemy.exc import SQLAlchemyError

from fastslow.api.store import IdempotentRequest, StoredDecision, StoredOutcome, possible_id

from ._errors import ERROR_RESPONSES, ApiError, ErrorBody, StoreUnavailable
from ._idempotency import IdempotencyKey, idempotent, replayed_responses
from ._json import StrictJsonRoute, model_response
from ._schemas import OutcomeOut, OutcomeRequest, StoredDecisionOut
from ._services import Services
from .deps import Caller, ReaderDep, ReporterDep, ServicesDep

__all__ = ["router"]

log = logging.getLogger("fastslow.api")

router = APIRouter(prefix="/v1/decisions", tags=["decisions"], route_class=StrictJsonRoute)

DecisionId = Annotated[str, Path(min_length=1, max_length=64, description="The decision's id.")]
_RESPONSES = {**ERROR_RESPONSES, 404: {"model": ErrorBody, "description": "No decision with this id for this key."}}
_VERDICTS = frozenset({"allow", "review", "deny"})


def _not_found(decision_id: str) -> ApiError:
    return ApiError(404, f"no decision {decision_id!r} for this API key's tenant", field="decision_id")


def _check_label(decision: StoredDecision, label: str) -> None:
    # A label names one of the decision's options (or, for a policy check, a verdict); a decision
    # System 1 gave no distribution for has no known options, so any label is taken.
    options = set(decision.answers) | ({decision.outcome} if decision.outcome else set())
    if decision.verdict is not None:
        options |= _VERDICTS
    if options and label not in options:
        raise ApiError(422, f"label must be one of {', '.join(sorted(options))}", field="label")


@router.get("/{decision_id}", response_model=StoredDecisionOut, responses=_RESPONSES)
async def get_decision(decision_id: DecisionId, services: ServicesDep, caller: ReaderDep) -> StoredDecisionOut:
    """A decision with its calibrated answers."""
    if not possible_id(decision_id):
        raise _not_found(decision_id)
    try:
        decision = await services.decisions.get(decision_id, tenant=caller.tenant)
    except (SQLAlchemyError, OSError) as exc:
        raise StoreUnavailable() from exc
    if decision is None:
        raise _not_found(decision_id)
    return StoredDecisionOut.of(decision)


@router.post(
    "/{decision_id}/outcome",
    status_code=201,
    response_model=OutcomeOut,
    responses={**_RESPONSES, **replayed_responses(201)},
)
async def record_outcome(
    http_request: Request,
    decision_id: DecisionId,
    body: OutcomeRequest,
    services: ServicesDep,
    caller: ReporterDep,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Record what turned out to be right: the true label, whether System 2 was right, or both."""
    if not possible_id(decision_id):
        raise _not_found(decision_id)
    if body.label is None and body.system2_correct is None:
        raise ApiError(422, "give label, system2_correct, or both", field="label")

    async def work(request: IdempotentRequest | None) -> Response:
        return await _record_outcome(decision_id, body, services, caller, request)

    return await idempotent(
        services, caller, "outcome", idempotency_key, http_request, work, path={"decision_id": decision_id}
    )


def _respond(outcome: StoredOutcome) -> tuple[int, bytes]:
    return 201, OutcomeOut.of(outcome).model_dump_json().encode()


async def _record_outcome(
    decision_id: str, body: OutcomeRequest, services: Services, caller: Caller, request: IdempotentRequest | None
) -> Response:
    try:
        decision = await services.decisions.get(decision_id, tenant=caller.tenant)
        if decision is None:
            raise _not_found(decision_id)
        if body.label is not None:
            _check_label(decision, body.label)
        if body.system2_correct is not None and decision.system != 2:
            raise ApiError(422, "System 2 did not answer this decision", field="system2_correct")
        outcome = await services.decisions.record_outcome(
            decision_id,
            tenant=caller.tenant,
            label=body.label,
            system2_correct=body.system2_correct,
            note=body.note,
            idempotent=request,
            respond=None if request is None else _respond,
        )
    except (SQLAlchemyError, OSError) as exc:
        raise StoreUnavailable() from exc
    if outcome is None:
        raise _not_found(decision_id)
    try:
        await services.learner.on_outcome(decision, outcome)
    except (SQLAlchemyError, OSError):
        # The outcome is committed, and what it teaches can be learned again by a refit; a failure
        # here must not tell the client it was lost.
        log.exception("learning from the outcome of decision %s failed", decision_id)
    return model_response(OutcomeOut.of(outcome), status_code=201)
