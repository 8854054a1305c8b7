"""``POST /v1/policy-check`` (and its batch form): allow / review / deny for a text or a tool call.

Each named policy is a check task of the policy file; its rules are answered by System 1 in one
call, escalated or failed closed per the policy, and recorded in the caller's decision log before
the response is sent: every decision of the request (all its policies, all a batch's items) in
one commit, so a failed commit stores none of them. Across policies, deny beats review beats allow.
A ``review`` verdict opens a review in the tenant's queue (``review_id``), committed with them.
With an ``Idempotency-Key`` a retry gets the first response and records nothing (``_idempotency``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import APIRouter, Request, Response
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from sqlalchemy import Table

from fastslow.api.store import IdempotentRequest, ReviewDraft
from fastslow.router import CheckResult, PolicySet, Router, ToolCall
from fastslow.router.engine_api import observe_calls
from fastslow.router.settings import LimitsSettings

from ._errors import ERROR_RESPONSES, ApiError
from ._idempotency import IdempotencyKey, Unit, idempotent, replayed_responses
from ._json import StrictJsonRoute, json_depth, model_response
from ._schemas import (
    Message,
    PolicyCheckBatchRequest,
    PolicyCheckBatchResponse,
    PolicyCheckRequest,
    PolicyCheckResponse,
    RuleResult,
)
from ._services import Services
from .deps import Caller, CheckerDep, ServicesDep, TenantRouterDep, rate_limited

__all__ = ["router", "to_messages"]

router = APIRouter(prefix="/v1", tags=["policy checks"], route_class=StrictJsonRoute)
log = logging.getLogger("fastslow.api")

BATCH_CONCURRENCY = 8
_RANK = {"allow": 0, "review": 1, "deny": 2}
_ROLES: dict[str, type[BaseMessage]] = {"user": HumanMessage, "assistant": AIMessage, "system": SystemMessage}


def to_messages(messages: Sequence[Message]) -> list[BaseMessage]:
    """API conversation turns as LangChain messages."""
    return [_ROLES[m.role](content=m.content) for m in messages]


def _policies(policy: PolicySet, names: Sequence[str], where: str) -> list[str]:
    checks = sorted(name for name, task in policy.tasks.items() if task.kind == "check")
    for i, name in enumerate(names):
        task = policy.tasks.get(name)
        if task is None or task.kind != "check":
            what = "no check task" if task is None else f"{task.kind} task, not a check:"
            raise ApiError(422, f"{what} {name!r}; check tasks: {', '.join(checks)}", field=f"{where}policies.{i}")
    return list(dict.fromkeys(names))


def _check_arguments(arguments: dict[str, object], where: str, limits: LimitsSettings) -> None:
    # The schema cannot see the settings, so the limits are checked here, before any engine runs:
    # every byte of the arguments is embedded (and recorded), so their size bounds the work.
    field = f"{where}tool_call.arguments"
    _depth, deep = json_depth(arguments, max_depth=limits.max_depth)
    if deep is not None:
        path = ".".join(str(part) for part in [field, *deep])
        raise ApiError(
            422, f"nested deeper than limits.max_depth ({limits.max_depth} levels of objects and arrays)", field=path
        )
    # Safe to encode now: the depth is bounded well below the interpreter's recursion limit.
    size = len(json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), default=str))
    if size > limits.max_argument_chars:
        raise ApiError(
            422,
            f"the arguments are {size} characters as compact JSON; "
            f"the limit is limits.max_argument_chars ({limits.max_argument_chars})",
            field=field,
        )


def _item(body: PolicyCheckRequest, where: str, limits: LimitsSettings) -> str | ToolCall:
    if body.text is not None and body.tool_call is None:
        return body.text
    if body.tool_call is not None and body.text is None:
        _check_arguments(body.tool_call.arguments, where, limits)
        return ToolCall(id="", name=body.tool_call.name, args=body.tool_call.arguments)
    raise ApiError(422, "give exactly one of text and tool_call", field=f"{where}text")


def _combine(results: Sequence[CheckResult]) -> CheckResult:
    # As the router does across rules: the worst verdict, and among equals the most certain violator.
    return max(results, key=lambda r: (_RANK[r.verdict], r.decisions[r.rule].confidence))


Extra = list[tuple[Table, Mapping[str, Any]]]
"""Rows committed with a request's decisions: the reviews it opened."""


def _subject(body: PolicyCheckRequest) -> dict[str, Any]:
    if body.tool_call is not None:
        return {"tool_call": {"name": body.tool_call.name, "args": body.tool_call.arguments}}
    return {"text": body.text}


def _open_review(services: Services, tenant: str, body: PolicyCheckRequest, worst: CheckResult, extra: Extra) -> str:
    """Open the review of a ``review`` verdict: its rows go into ``extra``, to commit with the decisions."""
    decision = worst.decisions[worst.rule]
    draft = ReviewDraft(
        tenant=tenant,
        decision_id=decision.id,
        source="api",
        task=worst.task,
        rule=worst.rule,
        subject=_subject(body),
        probabilities={name: d.confidence for name, d in worst.decisions.items() if d.probabilities},
        # A rule System 1 could not answer (on_failure: review) has no probability: as uncertain as can be.
        probability=decision.confidence if decision.probabilities else 0.5,
        policy_version=worst.policy_version,
    )
    review, rows = services.decisions.review_rows(draft, ttl_s=services.settings.reviews.ttl_s)
    extra.extend(rows)
    return review.id


def _response(results: Sequence[CheckResult]) -> PolicyCheckResponse:
    worst = _combine(results)
    rules = [
        RuleResult(
            policy=result.task,
            rule=name,
            verdict=decision.verdict or "deny",
            probability=decision.confidence if decision.probabilities else None,
            system=decision.system,
            reason=decision.reason,
            threshold=decision.threshold,
            decision_id=decision.id,
            audit=decision.audit,
        )
        for result in results
        for name, decision in result.decisions.items()
    ]
    return PolicyCheckResponse(
        verdict=worst.verdict,
        policy=worst.task,
        rule=worst.rule,
        decision_id=worst.decisions[worst.rule].id,
        system2=any(r.system2 for r in results),
        policy_version=worst.policy_version,
        rules=rules,
    )


async def _check(
    tenant_router: Router,
    services: Services,
    body: PolicyCheckRequest,
    tenant: str,
    extra: Extra,
    where: str = "",
) -> PolicyCheckResponse:
    names = _policies(tenant_router.policy, body.policies, where)
    item = _item(body, where, services.settings.limits)
    context = to_messages(body.context)

    async def timed(name: str) -> tuple[CheckResult, float]:
        # Each task's own time (fastslow_decision_latency_seconds), also when several run at once;
        # each engine call it makes is counted as it is made (fastslow_engine_*).
        started = time.perf_counter()
        with observe_calls(services.metrics.observe_call):
            result = await tenant_router.check(name, item, context=context)
        return result, time.perf_counter() - started

    if len(names) == 1:  # the common call: no tasks to gather
        timings = [await timed(names[0])]
    else:
        timings = list(await asyncio.gather(*(timed(n) for n in names)))
    results = [result for result, _ in timings]
    for result, elapsed in timings:
        services.metrics.observe_decisions(list(result.decisions.values()), elapsed_s=elapsed)
    response = _response(results)
    if response.verdict == "review":
        response.review_id = _open_review(services, tenant, body, _combine(results), extra)
    return response


def _log_checked(what: str, answers: Sequence[PolicyCheckResponse]) -> None:
    """One line per request, with its decision ids (``decision_ids``: JSON logs join the decision log with them)."""
    if not log.isEnabledFor(logging.INFO):
        return
    verdicts = ", ".join(f"{a.verdict} by {a.policy}.{a.rule}{' (System 2)' if a.system2 else ''}" for a in answers)
    ids = [rule.decision_id for answer in answers for rule in answer.rules]
    log.info("%s: %s", what, verdicts, extra={"decision_ids": ids})


_RESPONSES = {**ERROR_RESPONSES, **replayed_responses(200)}


@router.post("/policy-check", response_model=PolicyCheckResponse, responses=_RESPONSES)
async def policy_check(
    http_request: Request,
    body: PolicyCheckRequest,
    tenant_router: TenantRouterDep,
    services: ServicesDep,
    caller: CheckerDep,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Check one text or tool call against the named policies: allow, review or deny, with each rule's probability."""

    async def work(request: IdempotentRequest | None) -> Response:
        unit = Unit(tenant_router)
        extra: Extra = []
        answer = await _check(unit.router, services, body, caller.tenant, extra)
        response = await unit.commit(services, caller.tenant, model_response(answer), request, extra=extra)
        _log_checked("policy check", [answer])  # once recorded: the ids it names are in the log
        return response

    return await idempotent(services, caller, "policy-check", idempotency_key, http_request, work)


@router.post("/policy-check/batch", response_model=PolicyCheckBatchResponse, responses=_RESPONSES)
async def policy_check_batch(
    http_request: Request,
    body: PolicyCheckBatchRequest,
    tenant_router: TenantRouterDep,
    services: ServicesDep,
    caller: CheckerDep,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Check many items in one call; results come back in the order of ``items``.

    Each item counts against the key's rate limit: the request was counted once before its body
    was read, its other items are counted here, before any decision is made (a replay with an
    ``Idempotency-Key`` counts once: it decides nothing).
    """
    return await idempotent(
        services,
        caller,
        "policy-check/batch",
        idempotency_key,
        http_request,
        lambda request: _batch(body, tenant_router, services, caller, request),
    )


async def _batch(
    body: PolicyCheckBatchRequest,
    tenant_router: Router,
    services: Services,
    caller: Caller,
    request: IdempotentRequest | None,
) -> Response:
    for i, item in enumerate(body.items):  # refuse a bad item before any decision is made
        _policies(tenant_router.policy, item.policies, f"items.{i}.")
        _item(item, f"items.{i}.", services.settings.limits)
    if len(body.items) > 1:
        await rate_limited(services, caller, n=len(body.items) - 1)
    # Bounded, so one batch cannot take every worker thread of the embedded engine from other callers.
    slots = asyncio.Semaphore(BATCH_CONCURRENCY)
    unit = Unit(tenant_router)
    extra: Extra = []

    async def one(item: PolicyCheckRequest) -> PolicyCheckResponse:
        async with slots:
            return await _check(unit.router, services, item, caller.tenant, extra)

    results = await asyncio.gather(*(one(item) for item in body.items))
    response = model_response(PolicyCheckBatchResponse(results=list(results)))
    committed = await unit.commit(services, caller.tenant, response, request, extra=extra)
    _log_checked("policy check batch", results)
    return committed
