"""The console's pages: overview, decisions, one decision, calibration, reviews, and signing in and out.

Server-rendered with Jinja2 (autoescape on: every value from the log is text), one route per page,
all outside the OpenAPI document. Every page needs a session (``_auth``): a GET without one is sent
to the sign-in page (303), a POST is refused (403). Only the session's tenant is read; another
tenant's decision or review is a 404, as one that does not exist. The forms that change something
(an outcome, a settlement) are shown to and accepted from ``review`` keys only, and every POST
carries the session's CSRF token. Lists are cut by the store's indexes (a keyset for decisions,
the review queue's index), and the overview reads the hourly rollups, never the log itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal, get_args
from urllib.parse import urlencode

from fastapi import APIRouter, FastAPI, Request
from fastapi.staticfiles import StaticFiles
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError
from starlette.datastructures import FormData, QueryParams
from starlette.responses import RedirectResponse, Response

from fastslow.api.app import _reviews
from fastslow.api.app._decisions import _record_outcome
from fastslow.api.app._errors import ApiError, StoreUnavailable
from fastslow.api.app._schemas import OutcomeRequest
from fastslow.api.app._throttle import client_address
from fastslow.api.app.deps import Caller
from fastslow.api.store import DecisionFilter, Review, Settled, StoredDecision, possible_id
from fastslow.router import Reason, Settings

from ._auth import (
    CONSOLE_SCOPES,
    CONSOLE_URL,
    CSRF_FIELD,
    HEADERS,
    PACKAGE_DIR,
    Console,
    ConsoleExit,
    Session,
    console_of,
    next_target,
    same_token,
    services_of,
)
from ._figures import calibration_page, decision_page, overview_page, review_subject

__all__ = ["CONSOLE_URL", "STATIC_URL", "Console", "ConsoleExit", "install_console"]

STATIC_URL = f"{CONSOLE_URL}/static"
RANGES: dict[str, tuple[timedelta, int]] = {
    "24h": (timedelta(hours=24), 1),
    "7d": (timedelta(days=7), 3),
    "30d": (timedelta(days=30), 12),
}
"""The overview's ranges, each with the hours one column of its charts covers."""
PAGE_SIZE, MAX_PAGE_SIZE, REVIEWS_SHOWN, SETTLED_SHOWN = 50, 200, 50, 20
REASONS: tuple[str, ...] = get_args(Reason)
_NOTICES = {"ended": "Your session ended: sign in again.", "signed-out": "Signed out."}


router = APIRouter(prefix=CONSOLE_URL, include_in_schema=False)


# -- signing in and out ------------------------------------------------------------------------------


def _sign_in_form(request: Request, status: int, *, target: str, notice: str = "", error: str = "") -> Response:
    console = console_of(request)
    view = console.view(request, None, "sign-in")
    nonce, fresh = console.auth.nonce(request)
    response = console.render(view, "signin.html", status=status, next=target, notice=notice, error=error, nonce=nonce)
    if fresh:
        console.auth.keep_nonce(response, nonce, path=view.base)
    return response


@router.get("/sign-in")
async def sign_in_page(request: Request) -> Response:
    base = console_of(request).base(request)
    notice = _NOTICES.get(request.query_params.get("notice", ""), "")
    target = next_target(base, request.query_params.get("next"))
    return _sign_in_form(request, 200, target=target, notice=notice)


@router.post("/sign-in")
async def sign_in(request: Request) -> Response:
    console, services = console_of(request), services_of(request)
    base = console.base(request)
    form = await request.form()
    target = next_target(base, form.get("next"))
    nonce, fresh = console.auth.nonce(request)
    if fresh or not same_token(nonce, form.get(CSRF_FIELD)):  # fresh: the browser sent no nonce cookie
        return _sign_in_form(request, 403, target=target, error="The sign-in form expired: sign in again.")
    key = form.get("key")
    if not isinstance(key, str) or not key.strip():
        return _sign_in_form(request, 401, target=target, error="Enter an API key.")
    key = key.strip()
    try:
        record = await services.decisions.authenticate(key)
    except (SQLAlchemyError, OSError) as exc:
        raise StoreUnavailable("the key store is unavailable") from exc
    if record is None:
        # The throttle's contract (as the API's): asked only about a key that failed, so a valid key
        # always signs in; a client that keeps failing waits, and that failure is not counted.
        address = client_address(request, console.settings)
        wait = await services.throttle.blocked(address, key)
        if wait is not None:
            seconds = max(1, math.ceil(wait))
            response = _sign_in_form(request, 429, target=target, error=f"Too many failed sign-ins: wait {seconds} s.")
            response.headers["Retry-After"] = str(seconds)
            return response
        services.throttle.failed(address, key)
        return _sign_in_form(request, 401, target=target, error="Unknown or revoked API key.")
    if not record.scopes & CONSOLE_SCOPES:
        message = (
            "This API key may only make checks. The console takes a key with the read or review scope "
            "(fastslow keys create --tenant NAME --scope read)."
        )
        return _sign_in_form(request, 403, target=target, error=message)
    response = RedirectResponse(target, status_code=303, headers=HEADERS)
    console.auth.sign_in(response, record, path=base)
    return response


@router.post("/sign-out")
async def sign_out(request: Request) -> Response:
    console = console_of(request)
    await console.require(request)
    base = console.base(request)
    response = RedirectResponse(f"{base}/sign-in?notice=signed-out", status_code=303, headers=HEADERS)
    console.auth.sign_out(response, path=base)
    return response


# -- the task and range a page shows ----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Scope:
    """The task (``""``: every task) and time range the overview and the calibration page show."""

    task: str
    tasks: list[str]
    range: str
    since: datetime
    until: datetime
    hours: int


async def _scope(request: Request, tenant: str, *, every_task: bool) -> Scope:
    services = services_of(request)
    policy = services.runtime.store.current
    logged = await services.decisions.summary_tasks(tenant=tenant)
    tasks = sorted(set(logged) | set(policy.tasks))
    task = request.query_params.get("task", "")
    if task not in tasks:
        task = "" if every_task else (logged[0] if logged else next(iter(policy.tasks), ""))
    span = request.query_params.get("range", "24h")
    span = span if span in RANGES else "24h"
    length, hours = RANGES[span]
    until = datetime.now(UTC)
    # From the start of a whole bucket (3-hour buckets start at 00:00, 03:00, ... UTC): every column
    # of the overview's charts then covers its hours exactly.
    since = (until - length).replace(minute=0, second=0, microsecond=0)
    since -= timedelta(hours=since.hour % hours)
    return Scope(task=task, tasks=tasks, range=span, since=since, until=until, hours=hours)


# -- overview --------------------------------------------------------------------------------------------


@router.get("")
async def overview(request: Request) -> Response:
    console = console_of(request)
    session = await console.require(request)
    services = services_of(request)
    scope = await _scope(request, session.tenant, every_task=True)
    summary = await services.decisions.summary(
        tenant=session.tenant, task=scope.task or None, since=scope.since, until=scope.until
    )
    o = overview_page(summary, services.runtime.store.version, hours=scope.hours)
    return console.render(console.view(request, session, "overview"), "overview.html", scope=scope, o=o)


# -- decisions -------------------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class DecisionQuery:
    """The decisions list's filters and page, read from the query string (what is wrong is listed, not fatal)."""

    params: dict[str, str]
    where: DecisionFilter
    after: str | None
    limit: int
    problems: list[str] = field(default_factory=list)

    def page(self, after: str | None = None) -> dict[str, str]:
        """The query string of the same filters at the page after ``after`` (the first page without it)."""
        params = {k: v for k, v in self.params.items() if v}
        if self.limit != PAGE_SIZE:
            params["limit"] = str(self.limit)
        if after:
            params["after"] = after
        return params

    @classmethod
    def parse(cls, query: QueryParams) -> DecisionQuery:
        problems: list[str] = []
        names = ("task", "system", "reason", "verdict", "since", "until", "has_outcome", "audit")
        params = {name: query.get(name, "").strip() for name in names}

        def moment(name: str) -> datetime | None:
            if not params[name]:
                return None
            try:
                value = datetime.fromisoformat(params[name])
            except ValueError:
                problems.append(f"{name}: not a date and time (YYYY-MM-DDTHH:MM, UTC); ignored")
                return None
            return value.replace(tzinfo=UTC) if value.tzinfo is None else value

        def flag(name: str) -> bool | None:
            return {"yes": True, "no": False}.get(params[name])

        where = DecisionFilter(
            task=params["task"] or None,
            system=int(params["system"]) if params["system"] in ("1", "2") else None,
            reason=params["reason"] if params["reason"] in REASONS else None,
            verdict=params["verdict"] if params["verdict"] in ("allow", "review", "deny") else None,
            since=moment("since"),
            until=moment("until"),
            has_outcome=flag("has_outcome"),
            audit=flag("audit"),
        )
        raw_limit = query.get("limit", "")
        limit = int(raw_limit) if raw_limit.isdigit() else PAGE_SIZE
        after = query.get("after") or None
        return cls(params=params, where=where, after=after, limit=min(max(limit, 1), MAX_PAGE_SIZE), problems=problems)


@router.get("/decisions")
async def decisions(request: Request) -> Response:
    console = console_of(request)
    session = await console.require(request)
    services = services_of(request)
    q = DecisionQuery.parse(request.query_params)
    try:
        page = await services.decisions.decision_page(
            tenant=session.tenant, where=q.where, after=q.after, limit=q.limit
        )
    except ValueError:
        q.problems.append("The page cursor is not one this console made: showing the first page.")
        q.after = None
        page = await services.decisions.decision_page(tenant=session.tenant, where=q.where, limit=q.limit)
    logged = await services.decisions.summary_tasks(tenant=session.tenant)
    tasks = sorted(set(logged) | set(services.runtime.store.current.tasks))
    view = console.view(request, session, "decisions")
    return console.render(view, "decisions.html", q=q, page=page, tasks=tasks, reasons=REASONS)


async def _decision_or_404(request: Request, console: Console, session: Session, decision_id: str) -> StoredDecision:
    found = None
    if possible_id(decision_id):
        found = await services_of(request).decisions.get(decision_id, tenant=session.tenant)
    if found is None:
        message = "This tenant has no decision with that id."
        raise ConsoleExit(console.refuse(request, session, 404, "No such decision", message))
    return found


@router.get("/decisions/{decision_id}")
async def decision(request: Request, decision_id: str) -> Response:
    console = console_of(request)
    session = await console.require(request)
    found = await _decision_or_404(request, console, session, decision_id)
    page = decision_page(found, services_of(request).runtime.store.current)
    recorded = request.query_params.get("recorded") == "1"
    view = console.view(request, session, "decisions")
    return console.render(view, "decision.html", p=page, recorded=recorded, error="")


def _text(form: FormData, name: str) -> str | None:
    value = form.get(name)
    return value.strip() or None if isinstance(value, str) else None


@router.post("/decisions/{decision_id}/outcome")
async def record_outcome(request: Request, decision_id: str) -> Response:
    console = console_of(request)
    session = await console.require(request, review=True)
    found = await _decision_or_404(request, console, session, decision_id)
    services = services_of(request)
    form = await request.form()
    correct = {"yes": True, "no": False}.get(_text(form, "system2_correct") or "")
    caller = Caller(tenant=session.tenant, key_id=session.key_id, scopes=session.scopes)
    try:
        try:
            body = OutcomeRequest(label=_text(form, "label"), system2_correct=correct, note=_text(form, "note"))
        except ValidationError as exc:
            raise ApiError(422, "; ".join(str(e["msg"]) for e in exc.errors())) from None
        if body.label is None and body.system2_correct is None:
            raise ApiError(422, "choose the right label, or whether System 2 was right")
        # The API's own path: the label checked against the decision's options, learning told.
        await _record_outcome(decision_id, body, services, caller, None)
    except ApiError as exc:
        page = decision_page(found, services.runtime.store.current)
        view = console.view(request, session, "decisions")
        return console.render(view, "decision.html", status=exc.status, p=page, recorded=False, error=exc.message)
    target = console.base(request) + f"/decisions/{decision_id}?recorded=1"
    return RedirectResponse(target, status_code=303, headers=HEADERS)


# -- calibration -------------------------------------------------------------------------------------


@router.get("/calibration")
async def calibration(request: Request) -> Response:
    console = console_of(request)
    session = await console.require(request)
    scope = await _scope(request, session.tenant, every_task=False)
    services = services_of(request)
    task = services.runtime.store.current.tasks.get(scope.task)
    c = await calibration_page(services, task, tenant=session.tenant, since=scope.since)
    return console.render(console.view(request, session, "calibration"), "calibration.html", scope=scope, c=c)


# -- reviews -----------------------------------------------------------------------------------------


@router.get("/reviews")
async def reviews(request: Request) -> Response:
    console = console_of(request)
    session = await console.require(request)
    store = services_of(request).decisions
    raw = request.query_params.get("offset", "0")
    offset = int(raw) if raw.isdigit() else 0
    pending = await store.reviews(tenant=session.tenant, status="pending", limit=REVIEWS_SHOWN + 1, offset=offset)
    statuses: tuple[Literal["allowed", "denied", "expired"], ...] = ("allowed", "denied", "expired")
    settled = [r for s in statuses for r in await store.reviews(tenant=session.tenant, status=s, limit=SETTLED_SHOWN)]
    settled.sort(key=lambda r: r.settled_at or r.created_at, reverse=True)
    shown = pending[:REVIEWS_SHOWN]
    view = console.view(request, session, "reviews")
    return console.render(
        view,
        "reviews.html",
        pending=[(r, review_subject(r)) for r in shown],
        more=offset + REVIEWS_SHOWN if len(pending) > REVIEWS_SHOWN else None,
        offset=offset,
        settled=settled[:SETTLED_SHOWN],
        just_settled=request.query_params.get("settled", ""),
    )


async def _review_or_404(request: Request, console: Console, session: Session, review_id: str) -> Review:
    found = None
    if possible_id(review_id):
        found = await services_of(request).decisions.get_review(review_id, tenant=session.tenant)
    if found is None:
        message = "This tenant has no review with that id."
        raise ConsoleExit(console.refuse(request, session, 404, "No such review", message))
    return found


@router.get("/reviews/{review_id}")
async def review(request: Request, review_id: str) -> Response:
    console = console_of(request)
    session = await console.require(request)
    found = await _review_or_404(request, console, session, review_id)
    view = console.view(request, session, "reviews")
    return console.render(view, "review.html", review=found, subject=review_subject(found), conflict=False)


@router.post("/reviews/{review_id}")
async def settle_review(request: Request, review_id: str) -> Response:
    console = console_of(request)
    session = await console.require(request, review=True)
    await _review_or_404(request, console, session, review_id)
    form = await request.form()
    verdict, label = form.get("verdict"), _text(form, "label")
    if verdict not in ("allow", "deny") or label not in (None, "allow", "deny"):
        message = "Settle with allow or deny, and label the rule or not."
        return console.refuse(request, session, 422, "Not settled", message)
    try:
        settled: Settled = await _reviews.settle(
            services_of(request),
            tenant=session.tenant,
            key_id=session.key_id,
            review_id=review_id,
            verdict="allow" if verdict == "allow" else "deny",
            note=_text(form, "note"),
            label=None if label is None else ("allow" if label == "allow" else "deny"),
        )
    except ApiError as exc:
        return console.refuse(request, session, exc.status, "Not settled", exc.message)
    if not settled.now_settled:
        view = console.view(request, session, "reviews")
        first = settled.review
        return console.render(
            view, "review.html", status=409, review=first, subject=review_subject(first), conflict=True
        )
    target = console.base(request) + "/reviews?" + urlencode({"settled": review_id})
    return RedirectResponse(target, status_code=303, headers=HEADERS)


def install_console(app: FastAPI, settings: Settings) -> Console:
    """Serve the console at ``/console``, and its stylesheet at ``/console/static``, on ``app``.

    Returns:
        The console, also kept in ``app.state.fastslow_console`` for its routes.
    """
    console = Console(settings)
    app.state.fastslow_console = console

    async def exit_with(_request: Request, exc: Exception) -> Response:
        return exc.response if isinstance(exc, ConsoleExit) else Response(status_code=500)

    app.add_exception_handler(ConsoleExit, exit_with)
    app.include_router(router)
    app.mount(STATIC_URL, StaticFiles(directory=PACKAGE_DIR / "static"), name="console-static")
    return console
