"""fastslow's HTTP API: ``create_app(settings)`` builds it; ``fastslow serve`` runs it.

Endpoints: ``POST /v1/policy-check`` (and ``/batch``), ``POST /v1/route``, ``POST /v1/systemone``
(Jev-compatible), ``GET /v1/decisions/{id}``, ``POST /v1/decisions/{id}/outcome``, ``GET /v1/tasks``,
``GET /v1/reviews`` and ``GET``/``POST /v1/reviews/{id}`` (the review queue), ``/healthz``,
``/readyz``, ``/metrics``; the operator's console at ``/console`` (``fastslow.api.console``);
OpenAPI at ``/openapi.json``, docs at ``/docs`` and ``/redoc`` (their scripts served by the API
itself: no network needed).
"""

from ._app import create_app
from ._errors import ApiError, ErrorBody, ErrorDetail
from ._metrics import ApiMetrics
from ._ratelimit import RateLimit

__all__ = ["ApiError", "ApiMetrics", "ErrorBody", "ErrorDetail", "RateLimit", "create_app"]
