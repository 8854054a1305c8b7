"""Dependencies of the API's routes, as ``Annotated`` aliases, and the authentication behind them.

``authenticate`` checks the bearer key (401 missing or unknown, 403 revoked), then counts the
request against the key's rate limit (429). The request guard (``_body``) runs it for every path
under ``/v1/`` before the body is read and leaves the ``Caller`` in the request state;
``CallerDep`` hands that caller to a route and declares the bearer scheme in OpenAPI.
``TenantRouterDep`` is the router recording into the caller's tenant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy.exc import SQLAlchemyError

from fastslow.router import Router

from ._errors import ApiError, StoreUnavailable
from ._services import Services

__all__ = [
    "CALLER_STATE",
    "Caller",
    "CallerDep",
    "ServicesDep",
    "TenantRouterDep",
    "authenticate",
    "get_caller",
    "get_services",
    "rate_limited",
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
    """Who is calling: the API key's tenant and id."""

    tenant: str
    key_id: str


async def get_services(request: Request) -> Services:
    """The app's services, from the lifespan state.

    ``async`` although it awaits nothing, as are the other dependencies here: FastAPI runs a plain
    ``def`` dependency in its thread pool, a thread hop on every request for a dictionary lookup.
    """
    services: Services = request.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


async def authenticate(services: Services, authorization: str | None) -> Caller:
    """The caller sending ``Authorization: <authorization>``, counted against its key's rate limit.

    Raises:
        ApiError: 401 missing or unknown key (with ``WWW-Authenticate: Bearer``), 403 revoked key,
            429 over the key's rate limit (with ``Retry-After``).
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
        if await services.key_revoked(key):
            raise ApiError(403, "this API key was revoked; ask for a new one")
        raise ApiError(401, "unknown API key", headers=_CHALLENGE)
    caller = Caller(tenant=record.tenant, key_id=record.id)
    await rate_limited(services, caller)
    return caller


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
    return await authenticate(services, request.headers.get("authorization"))


CallerDep = Annotated[Caller, Depends(get_caller)]


async def get_tenant_router(services: ServicesDep, caller: CallerDep) -> Router:
    """The router whose decisions go to the caller's tenant in the decision log."""
    return services.router_for(caller.tenant)


TenantRouterDep = Annotated[Router, Depends(get_tenant_router)]
