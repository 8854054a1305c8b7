"""The real API on a loopback port (uvicorn in a thread), clients that keep every response body, and keys.

``running_api(settings)`` starts ``create_app(settings)`` under uvicorn on 127.0.0.1 with a free
port, exactly as ``fastslow serve`` runs it (``server_config``: lifespan, migrations, policy
watching, the connection limits of ``settings.server``), and stops it on exit. Clients made by
``api_client`` / ``sdk_http_client`` add every response they see to ``SEEN_RESPONSES``, the list
the canary scan reads: nothing a test saw over HTTP escapes it.
"""

from __future__ import annotations

import asyncio
import atexit
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import uvicorn
import yaml

from fastslow.api._server import server_config
from fastslow.api.app import RateLimit, create_app
from fastslow.api.store import DEFAULT_SCOPES, DecisionStore, database_url_for, upgrade
from fastslow.router import Settings

from fakes.embedded import first_build
from fakes.tls import TLS

__all__ = [
    "REPO",
    "SEEN_RESPONSES",
    "RunningApi",
    "SeenResponse",
    "api_client",
    "create_key",
    "new_key",
    "running_api",
    "sdk_http_client",
    "test_policy",
    "test_settings",
]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_POLICY = REPO / "examples" / "policy.yaml"
STARTUP_TIMEOUT_S = 300.0
"""Room for a cold start: the first server of a run trains the example heads, beside another worker."""


@dataclass(frozen=True, slots=True)
class SeenResponse:
    """One HTTP response a test received."""

    method: str
    url: str
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class ResponseLog:
    """Every response body the API tests saw, in order (thread-safe)."""

    responses: list[SeenResponse] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, response: httpx2.Response) -> None:
        """Keep an ``httpx2`` response (read it first)."""
        request = response.request
        self.add_raw(request.method, str(request.url), response.status_code, dict(response.headers), response.content)

    def add_raw(self, method: str, url: str, status: int, headers: dict[str, str], body: bytes) -> None:
        """Keep a response another client (schemathesis' ``requests``) received."""
        seen = SeenResponse(method=method, url=url, status=status, headers=headers, body=body)
        with self._lock:
            self.responses.append(seen)

    def bodies(self) -> list[bytes]:
        with self._lock:
            return [r.body for r in self.responses]


SEEN_RESPONSES = ResponseLog()
"""Process-wide: the canary scan checks each of these bodies (and headers) for leaked secrets and thoughts."""


async def _keep(response: httpx2.Response) -> None:
    await response.aread()
    SEEN_RESPONSES.add(response)


def api_client(base_url: str, key: str | None = None, **kw: Any) -> httpx2.AsyncClient:
    """An async client for the API that records every response in ``SEEN_RESPONSES``."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    headers.update(kw.pop("headers", {}))
    return httpx2.AsyncClient(
        base_url=base_url,
        headers=headers,
        timeout=kw.pop("timeout", 60.0),
        event_hooks={"response": [_keep]},
        verify=kw.pop("verify", TLS),
        **kw,
    )


def sdk_http_client(**kw: Any) -> httpx2.AsyncClient:
    """An ``httpx2`` client to hand the typesafe SDK (``http_client=``), recording responses the same way."""
    return httpx2.AsyncClient(
        timeout=kw.pop("timeout", 60.0), event_hooks={"response": [_keep]}, verify=kw.pop("verify", TLS), **kw
    )


TEST_ENGINE_TIMEOUT_S = 30.0
"""System 1's budget in test policies: the shipped 2 s is for a production box, not a shared CI runner."""


def test_policy(directory: Path, *, split_checks: bool = True, timeout_s: float = TEST_ENGINE_TIMEOUT_S) -> Path:
    """The shipped policy, with System 1's time budget ``timeout_s`` (raised for test machines).

    With ``split_checks``, also one check task per ``tool_safety`` rule, each rule copied verbatim,
    so a test can drive one rule through all three verdicts without the other rule's band in the way.
    """
    doc = yaml.safe_load(EXAMPLE_POLICY.read_text(encoding="utf-8"))
    doc["defaults"].setdefault("engine_options", {})["timeout_s"] = timeout_s
    if split_checks:
        safety = doc["tasks"]["tool_safety"]
        for rule, body in safety["rules"].items():
            doc["tasks"][rule] = {**safety, "rules": {rule: body}}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "policy.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


test_policy.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


_TEMPLATE: Path | None = None
_TEMPLATE_LOCK = threading.Lock()


def _migrated_template() -> Path:
    """An empty decision log at the newest migration, built once per test process."""
    global _TEMPLATE
    with _TEMPLATE_LOCK:
        if _TEMPLATE is None:
            folder = Path(tempfile.mkdtemp(prefix="fastslow-log-template-"))
            atexit.register(shutil.rmtree, folder, True)
            upgrade(f"sqlite+aiosqlite:///{folder / 'fastslow.sqlite3'}")
            _TEMPLATE = folder / "fastslow.sqlite3"
        return _TEMPLATE


def test_settings(tmp_path: Path, **updates: Any) -> Settings:
    """Settings for one test server: data under ``tmp_path``, ``test_policy`` unless told otherwise.

    The server's SQLite log starts as a copy of an already migrated empty one, so that its start
    (and ``new_key``) finds nothing to migrate instead of running every migration again.
    """
    base: dict[str, Any] = {"data_dir": tmp_path / "data"}
    if "policy_file" not in updates:
        base["policy_file"] = test_policy(tmp_path)
    base.update(updates)
    settings = Settings(**base)
    if not settings.database_url:  # the file database_url_for(settings) names
        log = settings.resolved_data_dir().expanduser().resolve() / "fastslow.sqlite3"
        if not log.exists():
            log.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(_migrated_template(), log)
    return settings


test_settings.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


async def new_key(settings: Settings, tenant: str, *, scopes: Iterable[str] = DEFAULT_SCOPES) -> str:
    """A new API key for ``tenant`` with ``scopes`` in the settings' decision log (migrating it first)."""
    store = await DecisionStore.open(database_url_for(settings))
    try:
        key, _record = await store.create_key(tenant, scopes=scopes)
    finally:
        await store.aclose()
    return key


def create_key(settings: Settings, tenant: str, *, scopes: Iterable[str] = DEFAULT_SCOPES) -> str:
    """``new_key`` for synchronous fixtures."""
    return asyncio.run(new_key(settings, tenant, scopes=scopes))


@dataclass(frozen=True, slots=True)
class RunningApi:
    """A started API server."""

    url: str
    settings: Settings
    server: uvicorn.Server

    async def key(self, tenant: str, *, scopes: Iterable[str] = DEFAULT_SCOPES) -> str:
        """A new API key for ``tenant`` (``check`` and ``read`` unless ``scopes`` says otherwise)."""
        return await new_key(self.settings, tenant, scopes=scopes)


@contextmanager
def running_api(settings: Settings, *, rate_limit: RateLimit | None = None) -> Iterator[RunningApi]:
    """``create_app(settings)`` served by uvicorn on a free loopback port until the block ends."""
    app = create_app(settings, rate_limit=rate_limit)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # The configuration `fastslow serve` runs under (ws="none" among it: no websocket library is
    # imported, whose deprecation warnings are errors here); host and port come from the socket.
    server = uvicorn.Server(server_config(app, settings, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="api-server", daemon=True)
    # The first start of a worker may train the heads; another worker starting then waits and loads them.
    with first_build(settings.embedded.cache_dir):
        thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                thread.join(timeout=60)
                sock.close()
                raise RuntimeError("the API server did not start; see the log above")
            time.sleep(0.02)
    try:
        yield RunningApi(url=f"http://127.0.0.1:{port}", settings=settings, server=server)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
