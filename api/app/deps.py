"""Dependencies of the API's routes, as ``Annotated`` aliases, and the authentication behind them.

``authenticate`` checks the bearer key (401 missing or unknown, 403 revoked; 429 instead when the
client keeps failing: ``_throttle``), then counts the request against the key's rate limit (429).
The request guard (``_body``) runs it for every path under ``/v1/`` before the body is read and
leaves the ``Caller`` in the request state; ``CallerDep`` hands that caller to a route and declares
the bearer scheme in OpenAPI. ``TenantRouterDep`` is the router recording into the caller's tenant.

What a key may do is its scopes (docs/store.md), each route naming the ones it takes:

* ``check`` (``CheckerDep``): ``/v1/policy-check``, its batch, ``/v1/route``, ``/v1/systemone``;
* ``read`` (``ReaderDep``): ``GET /v1/decisions/{id}``, ``GET /v1/tasks``;
* ``check`` or ``read`` (``ReporterDep``): ``POST /v1/decisions/{id}/outcome``;
* ``review`` (``caller.require("review")``): settling a review.

An outcome takes either: the agent that decided reports what turned out to be right (its
``check`` key), and so may a person or tool reading the log (a ``read`` key); both could before
scopes existed. A ``review``-only key can do none of these: it settles reviews and signs in.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy.exc import SQLAlchemyError

from fastslow.api.store import DEFAULT_SCOPES, SCOPES, Scope
from fastslow.router import Router

from ._errors import ApiError, StoreUnavailable
from ._services import Services
from ._throttle import client_address

__all__ = [
    "CALLER_STATE",
    "Caller",
    "CallerDep",
    "CheckerDep",
    "ReaderDep",
    "ReporterDep",
    "ServicesDep",
    "TenantRouterDep",
    "authenticate",
    "get_caller",
    "get_services",
    "rate_limited",
    "requires",
]

CALLER_STATE = "caller"
"""The key of the authenticated ``Caller`` in the request state (``scope["state"]``)."""

_CHALLENGE = {"WWW-Authenticate": "Bearer"}

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="An API key from `fastslow keys create --tenant NAME`, sent as `Authorization: Bearer <key>`.",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Caller:
    """Who is calling: the API key's tenant, id and scopes."""

    tenant: str
    key_id: str
    scopes: frozenset[Scope] = DEFAULT_SCOPES

    def require(self, scope: Scope) -> None:
        """Refuse the request unless the key has ``scope``.

        Raises:
            ApiError: 403 naming the scope the key lacks.
        """
        if scope not in self.scopes:
            have = ", ".join(s for s in SCOPES if s in self.scopes) or "none"
            raise ApiError(
                403,
                f"this API key lacks the {scope!r} scope (it has: {have}); "
                f"make one with `fastslow keys create --tenant NAME --scope {scope}`",
            )


async def get_services(request: Request) -> Services:
    """The app's services, from the lifespan state.

    ``async`` although it awaits nothing, as are the other dependencies here: FastAPI runs a plain
    ``def`` dependency in its thread pool, a thread hop on every request for a dictionary lookup.
    """
    services: Services = request.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


async def authenticate(
    services: Services, authorization: str | None, http_scope: Mapping[str, Any] | None = None
) -> Caller:
    """The caller sending ``Authorization: <authorization>``, counted against its key's rate limit.

    ``http_scope`` (the request's ASGI scope) names the client whose failed keys are throttled;
    without it they count as an unknown address's.

    Raises:
        ApiError: 401 missing or unknown key (with ``WWW-Authenticate: Bearer``), 403 revoked key,
            429 over the key's rate limit, or for a failed key from a client that failed too often
            (both with ``Retry-After``).
        StoreUnavailable: the key store or the rate limiter's database did not answer (503).
    """
    # Parsed as FastAPI's HTTPBearer parses it, so the check and the OpenAPI scheme agree.
    scheme, key = get_authorization_scheme_param(authorization)
    if not (scheme and key) or scheme.lower() != "bearer":
        raise ApiError(401, "missing API key: send `Authorization: Bearer <key>`", headers=_CHALLENGE)
    record = services.keys.get(key)
    if record is None:
        seen = services.keys.generation()
        try:
            record = await services.decisions.authenticate(key)
        except (SQLAlchemyError, OSError) as exc:
            raise StoreUnavailable("the key store is unavailable") from exc
        if record is not None:
            services.keys.put(key, record, seen=seen)
    if record is None:
        raise await _failed(services, key, http_scope)
    caller = Caller(tenant=record.tenant, key_id=record.id, scopes=record.scopes)
    await rate_limited(services, caller)
    return caller


async def _failed(services: Services, key: str, http_scope: Mapping[str, Any] | None) -> ApiError:
    """The refusal of a key that is not live: 401 or 403, or 429 once its client failed too often.

    Only ever asked after the lookup, so a live key is served whatever the throttle holds. A missing
    key never gets here: it guesses nothing and costs no lookup.
    """
    address = client_address(http_scope or {}, services.settings)
    wait = await services.throttle.blocked(address, key)
    if wait is not None:
        retry = max(1, math.ceil(wait))
        return ApiError(
            429,
            "this API key is unknown or revoked, and too many failed API keys came from this address "
            f"or with this key's prefix: retry in {retry} s",
            headers={"Retry-After": str(retry)},
        )
    services.throttle.failed(address, key)
    if await services.key_revoked(key):
        return ApiError(403, "this API key was revoked; ask for a new one")
    return ApiError(401, "unknown API key", headers=_CHALLENGE)


async def rate_limited(services: Services, caller: Caller, *, n: int = 1) -> None:
    """Count ``n`` requests (a batch's items) against the caller's key.

    Raises:
        ApiError: 429 over the key's rate limit (with ``Retry-After``).
        StoreUnavailable: the rate limiter's database did not answer (503).
    """
    wait = await services.limiter.hit(caller.key_id, n=n)
    if wait is not None:
        services.metrics.rate_limited.inc()
        limit = services.limiter.limit
        raise ApiError(
            429,
            f"rate limit exceeded: {limit.requests} requests per {limit.window_s} s for this key",
            headers={"Retry-After": str(int(wait))},
        )


async def get_caller(
    request: Request,
    services: ServicesDep,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Caller:
    """The caller the request guard authenticated and counted before the body was read.

    ``_credentials`` is unused: it declares the bearer scheme in OpenAPI on every route that needs a key.
    """
    caller = request.scope.get("state", {}).get(CALLER_STATE)
    if isinstance(caller, Caller):
        return caller
    # Only a route outside /v1/, or an app without the guard, gets here: authenticating after the
    # body is late, but never skipped.
    return await authenticate(services, request.headers.get("authorization"), request.scope)


CallerDep = Annotated[Caller, Depends(get_caller)]


def requires(*scopes: Scope) -> Callable[[Caller], Awaitable[Caller]]:
    """A dependency: the caller, when its key has one of ``scopes`` (else 403 naming them)."""
    if not scopes:
        raise ValueError("requires() needs at least one scope")

    async def scoped(caller: CallerDep) -> Caller:
        if len(scopes) == 1:
            caller.require(scopes[0])
        elif caller.scopes.isdisjoint(scopes):
            have = ", ".join(s for s in SCOPES if s in caller.scopes) or "none"
            wanted = " or ".join(repr(s) for s in scopes)
            raise ApiError(403, f"this API key needs the {wanted} scope (it has: {have})")
        return caller

    scoped.__name__ = f"requires_{'_or_'.join(scopes)}"
    return scoped


CheckerDep = Annotated[Caller, Depends(requires("check"))]
"""A caller whose key may decide: policy checks, routes, the Jev gateway."""
ReaderDep = Annotated[Caller, Depends(requires("read"))]
"""A caller whose key may read its tenant's decision log and the policy's tasks."""
ReporterDep = Annotated[Caller, Depends(requires("check", "read"))]
"""A caller whose key may record an outcome: the agent that decided, or whoever reads the log."""


async def get_tenant_router(services: ServicesDep, caller: CallerDep) -> Router:
    """The router whose decisions go to the caller's tenant in the decision log."""
    return services.router_for(caller.tenant)


TenantRouterDep = Annotated[Router, Depends(get_tenant_router)]
