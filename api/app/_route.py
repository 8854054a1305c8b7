"""``POST /v1/route``: route a message among a task's routes, with escalation, as the LangGraph node does.

The decision is committed before the response is sent; with an ``Idempotency-Key`` a retry gets
the first response and records nothing (``_idempotency``).
"""

from __future__ import annotations

import logging
import time

from fastapi import APIRouter, Request, Response

from fastslow.api.store import IdempotentRequest
from fastslow.router.engine_api import observe_calls

from ._errors import ERROR_RESPONSES, ApiError
from ._idempotency import IdempotencyKey, Unit, idempotent, replayed_responses
from ._json import StrictJsonRoute, model_response
from ._policy_check import to_messages
from ._schemas import DecisionOut, RouteRequest, RouteResponse
from .deps import CheckerDep, ServicesDep, TenantRouterDep

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["routing"], route_class=StrictJsonRoute)
log = logging.getLogger("fastslow.api")


@router.post("/route", response_model=RouteResponse, responses={**ERROR_RESPONSES, **replayed_responses(200)})
async def route(
    http_request: Request,
    body: RouteRequest,
    tenant_router: TenantRouterDep,
    services: ServicesDep,
    caller: CheckerDep,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Pick a route for the latest user turn; a null route means nobody settled it (hand it to a frontier agent)."""
    tasks = tenant_router.policy.tasks
    task = tasks.get(body.task)
    if task is None or task.kind != "route":
        names = ", ".join(sorted(n for n, t in tasks.items() if t.kind == "route"))
        raise ApiError(422, f"no route task {body.task!r}; route tasks: {names}", field="task")
    if not any(m.role == "user" for m in body.messages):
        raise ApiError(422, "the conversation needs at least one user turn to route", field="messages")

    async def work(request: IdempotentRequest | None) -> Response:
        unit = Unit(tenant_router)
        started = time.perf_counter()
        with observe_calls(services.metrics.observe_call):  # each engine call counted as it is made
            decision = await unit.router.route(body.task, to_messages(body.messages), previous=body.previous)
        elapsed = time.perf_counter() - started
        services.metrics.observe_decisions([decision], elapsed_s=elapsed)
        answer = RouteResponse(route=decision.outcome, system2=decision.system == 2, decision=DecisionOut.of(decision))
        response = await unit.commit(services, caller.tenant, model_response(answer), request)
        # Once recorded; decision_id: JSON logs join the decision log and the trace with it.
        log.info(
            "route %s: %s by System %d (%s)",
            body.task,
            decision.outcome or "no route",
            decision.system,
            decision.reason,
            extra={"decision_id": decision.id},
        )
        return response

    return await idempotent(services, caller, "route", idempotency_key, http_request, work)
