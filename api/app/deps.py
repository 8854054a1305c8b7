"""Dependencies of the API's routes, as ``Annotated`` aliases.

``CallerDep`` authenticates the bearer key (401 missing or unknown, 403 revoked), then counts the
request against the key's rate limit (429); ``TenantRouterDep`` is the router recording into the
caller's tenant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.exc import SQLAlchemyError

from fastslow.router import Router

from ._errors import ApiError, StoreUnavailable
from ._services import Services

__all__ = ["Caller", "CallerDep", "ServicesDep", "TenantRouterDep", "get_caller", "get_services"]

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


def get_services(request: Request) -> Services:
    """The app's services, from the lifespan state."""
    services: Services = request.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


async def get_caller(
    services: ServicesDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> Caller:
    """Authenticate the request and count it against its key's rate limit."""
    if credentials is None:
        raise ApiError(401, "missing API key: send `Authorization: Bearer <key>`", headers=_CHALLENGE)
    key = credentials.credentials
    try:
        record = await services.decisions.authenticate(key)
    except (SQLAlchemyError, OSError) as exc:
        raise StoreUnavailable("the key store is unavailable") from exc
    if record is None:
        if await services.key_revoked(key):
            raise ApiError(403, "this API key was revoked; ask for a new one")
        raise ApiError(401, "unknown API key", headers=_CHALLENGE)
    wait = await services.limiter.hit(record.id)
    if wait is not None:
        services.metrics.rate_limited.inc()
        limit = services.limiter.limit
        raise ApiError(
            429,
            f"rate limit exceeded: {limit.requests} requests per {limit.window_s} s for this key",
            headers={"Retry-After": str(int(wait))},
        )
    return Caller(tenant=record.tenant, key_id=record.id)


CallerDep = Annotated[Caller, Depends(get_caller)]


def get_tenant_router(services: ServicesDep, caller: CallerDep) -> Router:
    """The router whose decisions go to the caller's tenant in the decision log."""
    return services.router_for(caller.tenant)


TenantRouterDep = Annotated[Router, Depends(get_tenant_router)]
