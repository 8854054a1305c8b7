"""Console sessions: sign-in with an API key, a signed session cookie, CSRF tokens, the check on every request.

Signing in takes an API key with the ``read`` or ``review`` scope; the key itself is never kept.
The session cookie carries the key's id, its tenant, a CSRF token and when it was issued, signed
with ``itsdangerous`` (``URLSafeTimedSerializer``, as Starlette's sessions sign theirs) under
``settings.console.secret``: every replica given the same secret accepts every session, and
nothing is stored server-side. Unset, a random secret is drawn per process (with a warning):
sessions then end at a restart and work on one replica only.

Every request reads the key back by id (``DecisionStore.get_key``, a primary-key lookup, never a
cache), so ``fastslow keys revoke`` ends the key's sessions at their next request on any replica,
and a scope taken away takes effect at once. The cookie is ``HttpOnly`` and ``SameSite=Strict``,
``Secure`` when ``console.secure_cookie`` is set, and scoped to the console's path. Every form
carries the session's CSRF token (the sign-in form, before any session, a nonce that must match a
cookie of its own: a double submit), compared in constant time.

Failed sign-ins go to the API's auth throttle (``services.throttle``), as failed API keys do: a
valid key always signs in, and a client address or key prefix that keeps failing is answered 429.

``Console`` is the gate every page passes (``require``: a session, its CSRF token on a POST, the
``review`` scope for the forms that change something) and what renders the pages, with the
security headers every page carries.
"""

from __future__ import annotations

import hmac
import logging
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from itsdangerous import BadSignature, URLSafeTimedSerializer
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from sqlalchemy.exc import SQLAlchemyError
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from fastslow.api.app._errors import StoreUnavailable
from fastslow.api.app._services import Services
from fastslow.api.store import ApiKey, Scope
from fastslow.router import Settings
from fastslow.router.settings import ConsoleSettings

__all__ = [
    "CONSOLE_SCOPES",
    "CONSOLE_URL",
    "CSRF_FIELD",
    "FILTERS",
    "HEADERS",
    "PACKAGE_DIR",
    "SESSION_COOKIE",
    "SIGNIN_COOKIE",
    "Console",
    "ConsoleAuth",
    "ConsoleExit",
    "Session",
    "View",
    "console_of",
    "next_target",
    "same_token",
    "services_of",
    "when",
]

log = logging.getLogger("fastslow.api.console")

CONSOLE_URL = "/console"
PACKAGE_DIR = Path(__file__).resolve().parent
"""The package's folder (through the link an editable install makes): the templates and static files."""
SESSION_COOKIE = "fastslow_console"
SIGNIN_COOKIE = "fastslow_console_signin"
"""The sign-in form's CSRF nonce, before there is a session to hold one."""
CSRF_FIELD = "csrf"
"""The hidden field every console form sends its token in."""
CONSOLE_SCOPES: frozenset[Scope] = frozenset({"read", "review"})
"""A key with either may sign in; only ``review`` sees and posts the forms that change something."""
_SALT = "fastslow.console.session"
_SIGNIN_TTL_S = 3600


@dataclass(frozen=True, slots=True, kw_only=True)
class Session:
    """A signed-in console user: the key's id, tenant and live scopes, and the session's CSRF token."""

    key_id: str
    tenant: str
    csrf: str
    issued_at: int
    scopes: frozenset[Scope]
    key_prefix: str
    key_name: str | None

    @property
    def may_review(self) -> bool:
        """Settle reviews and record outcomes (the ``review`` scope)."""
        return "review" in self.scopes


def same_token(expected: str, given: object) -> bool:
    """Whether a form's token is ``expected``, compared in constant time (an empty one never is)."""
    return bool(expected) and isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode())


class ConsoleAuth:
    """Issues and checks console sessions under the console's settings.

    Args:
        settings: ``settings.console``: the secret, whether the cookie is ``Secure``, the session's lifetime.
    """

    def __init__(self, settings: ConsoleSettings) -> None:
        secret = settings.secret.get_secret_value() if settings.secret is not None else ""
        if not secret:
            secret = secrets.token_urlsafe(32)
            log.warning(
                "console.secret is not set: console sessions are signed with a random per-process secret, so they "
                "end when this process restarts and no other replica accepts them (set FASTSLOW_CONSOLE__SECRET)"
            )
        self._serializer = URLSafeTimedSerializer(secret, salt=_SALT)
        self.ttl_s = settings.session_ttl_s
        self.secure = settings.secure_cookie

    # -- cookies ---------------------------------------------------------------------------------

    def _cookie(self, response: Response, name: str, value: str, *, path: str, max_age: int) -> None:
        response.set_cookie(
            name, value, max_age=max_age, path=path, secure=self.secure, httponly=True, samesite="strict"
        )

    def sign_in(self, response: Response, key: ApiKey, *, path: str) -> None:
        """Start a session for ``key`` on ``response`` (a fresh CSRF token; the sign-in nonce dropped)."""
        payload = {"k": key.id, "t": key.tenant, "c": secrets.token_urlsafe(24), "i": int(time.time())}
        self._cookie(response, SESSION_COOKIE, self._serializer.dumps(payload), path=path, max_age=int(self.ttl_s))
        self.forget_nonce(response, path=path)

    def sign_out(self, response: Response, *, path: str) -> None:
        """End the session on ``response`` (the browser drops the cookie)."""
        response.delete_cookie(SESSION_COOKIE, path=path, secure=self.secure, httponly=True, samesite="strict")

    @staticmethod
    def nonce(request: Request) -> tuple[str, bool]:
        """The sign-in form's CSRF nonce: the browser's own, or a new one (``True``: set it with ``keep_nonce``)."""
        current = request.cookies.get(SIGNIN_COOKIE, "")
        if 16 <= len(current) <= 64:
            return current, False
        return secrets.token_urlsafe(24), True

    def keep_nonce(self, response: Response, nonce: str, *, path: str) -> None:
        self._cookie(response, SIGNIN_COOKIE, nonce, path=path, max_age=_SIGNIN_TTL_S)

    def forget_nonce(self, response: Response, *, path: str) -> None:
        response.delete_cookie(SIGNIN_COOKIE, path=path, secure=self.secure, httponly=True, samesite="strict")

    # -- checking --------------------------------------------------------------------------------

    def _payload(self, request: Request) -> dict[str, Any] | None:
        raw = request.cookies.get(SESSION_COOKIE)
        if not raw:
            return None
        try:
            data = self._serializer.loads(raw, max_age=int(self.ttl_s))
        except BadSignature:  # SignatureExpired included: past session_ttl_s
            return None
        fields = ("k", "t", "c", "i")
        if not isinstance(data, dict) or not all(isinstance(data.get(f), str | int) for f in fields):
            return None
        return data

    async def session(self, request: Request, services: Services) -> Session | None:
        """The request's session, checked against the key as it is now; ``None``: not signed in (any more).

        ``None`` when there is no cookie, its signature is wrong or older than ``session_ttl_s``, or
        its key is gone, revoked, moved to another tenant, or no longer has a console scope.
        """
        data = self._payload(request)
        if data is None:
            return None
        key: ApiKey | None = await services.decisions.get_key(str(data["k"]))
        if key is None or key.revoked or key.tenant != data["t"]:
            return None
        scopes = frozenset(key.scopes & CONSOLE_SCOPES)
        if not scopes:
            return None
        return Session(
            key_id=key.id,
            tenant=key.tenant,
            csrf=str(data["c"]),
            issued_at=int(data["i"]),
            scopes=frozenset(key.scopes),
            key_prefix=key.prefix,
            key_name=key.name,
        )

    def had_session(self, request: Request) -> bool:
        """Whether the request carried a session cookie at all (to say why it must sign in again)."""
        return bool(request.cookies.get(SESSION_COOKIE))


HEADERS = {
    # The pages load the console's own stylesheet and nothing else; nothing runs, nothing frames
    # them, and a link followed out of the console does not carry a decision's address along.
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def when(moment: datetime | None) -> str:
    """A moment as the console shows it: to the minute, in UTC, saying so."""
    return "" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _pct(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{100 * value:.1f}%"


def _usd(value: float | None) -> str:
    # Cents once it is a dollar or more; below, the fractions of a cent that one System-2 call costs.
    return "-" if value is None else f"${value:,.2f}" if value >= 1 else f"${value:,.4f}"


FILTERS: dict[str, Callable[..., str]] = {
    "when": when,
    "pct": _pct,
    "usd": _usd,
    "num": lambda v: f"{v:,}",
    "prob": lambda v: "-" if v is None else f"{v:.3f}",
    "short": lambda v: (v or "").rpartition(":")[2][:12],
    "ms": lambda v: f"{v:,.0f} ms" if v >= 10 else f"{v:.1f} ms",
}


class ConsoleExit(Exception):
    """Ends a console request early with ``response`` (a redirect to sign in, a refusal page)."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


@dataclass(slots=True, kw_only=True)
class View:
    """What every template is given: where the console lives, who is signed in, which page this is."""

    session: Session | None
    page: str
    base: str

    @property
    def static(self) -> str:
        return f"{self.base}/static"

    def url(self, path: str = "", **params: object) -> str:
        """A console address with the query ``params`` that have a value."""
        query = urlencode({k: str(v) for k, v in params.items() if v is not None and v != ""})
        return f"{self.base}{path}" + (f"?{query}" if query else "")


class Console:
    """The console of one app: its settings, session signer and templates."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.auth = ConsoleAuth(settings.console)
        self.templates = Environment(
            loader=FileSystemLoader(PACKAGE_DIR / "templates"),
            autoescape=True,
            undefined=StrictUndefined,
            auto_reload=False,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters.update(FILTERS)

    @staticmethod
    def base(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/") + CONSOLE_URL

    def view(self, request: Request, session: Session | None, page: str) -> View:
        return View(session=session, page=page, base=self.base(request))

    def render(self, view: View, template: str, *, status: int = 200, **context: Any) -> HTMLResponse:
        html = self.templates.get_template(template).render(view=view, **context)
        return HTMLResponse(html, status_code=status, headers=HEADERS)

    def refuse(self, request: Request, session: Session | None, status: int, title: str, message: str) -> HTMLResponse:
        view = self.view(request, session, "error")
        return self.render(view, "error.html", status=status, title=title, message=message)

    async def require(self, request: Request, *, review: bool = False) -> Session:
        """The request's session; without one a GET goes to sign in (303) and a POST is refused (403).

        A POST must carry the session's CSRF token and, with ``review``, come from a ``review`` key.

        Raises:
            ConsoleExit: with the response that ends the request.
        """
        try:
            session = await self.auth.session(request, services_of(request))
        except (SQLAlchemyError, OSError) as exc:
            raise StoreUnavailable("the key store is unavailable") from exc
        if session is None:
            raise ConsoleExit(self._signed_out(request))
        if request.method == "POST":
            form = await request.form()
            if not same_token(session.csrf, form.get(CSRF_FIELD)):
                message = "The form's security token is missing or wrong. Nothing was changed: reload and try again."
                raise ConsoleExit(self.refuse(request, session, 403, "Form refused", message))
            if review and not session.may_review:
                message = (
                    "This API key may read the console but not change anything: settling reviews and recording "
                    "outcomes take a key with the review scope (fastslow keys create --scope review)."
                )
                raise ConsoleExit(self.refuse(request, session, 403, "Not allowed", message))
        return session

    def _signed_out(self, request: Request) -> Response:
        base = self.base(request)
        had = self.auth.had_session(request)
        response: Response
        if request.method in ("GET", "HEAD"):
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            query = urlencode({"next": target, **({"notice": "ended"} if had else {})})
            response = RedirectResponse(f"{base}/sign-in?{query}", status_code=303, headers=HEADERS)
        else:
            response = self.refuse(request, None, 403, "Not signed in", "Sign in to the console; nothing was changed.")
        if had:
            self.auth.sign_out(response, path=base)
        return response


def next_target(base: str, value: object) -> str:
    """Where to go after signing in: a console address, never another host or path."""
    if not isinstance(value, str) or not value.startswith(base) or any(c in value for c in "\\\r\n"):
        return base
    rest = value[len(base) :]
    return base if (rest and rest[0] not in "/?") or "//" in value else value


def console_of(request: Request) -> Console:
    console: Console = request.app.state.fastslow_console
    return console


def services_of(request: Request) -> Services:
    services: Services = request.state.services
    return services
