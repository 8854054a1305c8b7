"""fastslow's ready graphs served by LangGraph's own server (``langgraph dev``, LangGraph Server).

The repository's ``langgraph.json`` names the factories below in module form
(``fastslow.api.langgraph_server:support_triage``), and ``app`` as the server's custom app
(``http.app``). The server calls a factory for every run, and for schema and drawing reads; each
returns its graph compiled without a checkpointer (the server brings its own persistence), over the
process's one ``Runtime``.

That runtime is built once per server process, by ``app``'s lifespan before the server takes
requests (the server merges it with its own), which also watches the policy file for hot reload, as
``fastslow serve`` does, and closes the engines and System-2 clients at shutdown. It is built in a
worker thread: loading the policy and training the embedded engines is blocking work, which
``langgraph dev``'s blockbuster would refuse on the event loop. LangGraph's server calls factories
with no arguments and offers them nothing of the app's state, so the runtime lives in this module
(``_process``), the one place fastslow keeps process state: a factory called before the lifespan
ran (under a server without ``http.app``) builds it itself, once, and nothing then watches the policy.

A served run cannot hand the graphs Python objects, and the server builds each run's context from
JSON (its ``context``, or its ``configurable`` keys). So the served graphs take a ``ServerContext``:
a ``GraphContext`` whose chat source, draft worker and sandbox come from the process's runtime and
settings, and whose JSON schema offers only what a caller may choose (the agent and frontier models).

The lifespan also opens fastslow's decision log (``database_url``, SQLite under the data directory
by default, as ``fastslow serve`` does), and the served graphs record every decision there for the
tenant ``FASTSLOW_LANGGRAPH_TENANT`` (``langgraph`` unless set; set it empty to record nothing),
write-behind as in-process graphs do (a System-2 answer is committed before its run goes on), with
each task's ``store_state`` policy. So ``fastslow calibrate --from-log``, ``report drift`` and
outcome reports through ``fastslow serve`` (with a key of that tenant) see these runs too. A
gate's checks run as LangGraph tasks, so a run resumed after a review records nothing twice. A
graph got before the lifespan ran (a server without ``http.app``) records nothing.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from langgraph.graph.state import CompiledStateGraph
from pydantic.json_schema import SkipJsonSchema
from starlette.applications import Starlette

from fastslow.graphs import GRAPHS, GraphContext, GraphName
from fastslow.router import ChatSource, ConfigError, Router, get_settings

from ._compose import Runtime, build_runtime, keeps_state
from .store import DecisionStore, database_url_for

__all__ = [
    "DEFAULT_TENANT",
    "POLICY_WATCH_INTERVAL_S",
    "SANDBOX_ENV",
    "TENANT_ENV",
    "ServerContext",
    "app",
    "create_agent_example",
    "draft_validate",
    "graph_for",
    "guarded_tools",
    "lifespan",
    "server_runtime",
    "support_triage",
]

log = logging.getLogger("fastslow.langgraph")

SANDBOX_ENV = "FASTSLOW_LANGGRAPH_SANDBOX"
"""The directory the ``guarded-tools`` demo tools work in; without it they refuse to run."""

TENANT_ENV = "FASTSLOW_LANGGRAPH_TENANT"
"""The decision log's tenant for the served graphs' decisions; set empty, nothing is recorded."""

DEFAULT_TENANT = "langgraph"

POLICY_WATCH_INTERVAL_S = 1.0
"""How often the policy file is polled for changes: ``fastslow serve``'s interval (not imported from
``fastslow.api.app``, which would load FastAPI into LangGraph's server)."""


class _Process:
    """The server process's runtime and example agent, each made once however many runs ask."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runtime: Runtime | None = None
        self.builds = 0
        self.example: Any = None
        self.recording: Router | None = None
        """The runtime's router recording into the decision log, once the lifespan opened it."""

    def build(self) -> Runtime:
        # On a worker thread; the lock makes concurrent first calls wait for one build.
        with self.lock:
            if self.runtime is None:
                runtime = build_runtime(get_settings())
                self.runtime = runtime
                self.builds += 1
                log.info(
                    "fastslow runtime built (pid %d, build %d): policy %s",
                    os.getpid(),
                    self.builds,
                    runtime.policy_source.describe(),
                )
            return self.runtime

    def router(self, runtime: Runtime) -> Router:
        """The router the served graphs decide with: the recording one where the log is open."""
        return self.recording or runtime.router

    def built(self) -> Runtime:
        runtime = self.runtime
        if runtime is None:
            # The server calls a graph's factory before it builds the run's context.
            raise RuntimeError("fastslow's runtime is not built yet: get the graph from its factory first")
        return runtime


_process = _Process()


async def server_runtime() -> Runtime:
    """The process's runtime, built on first use in a worker thread (once, however many runs ask)."""
    runtime = _process.runtime
    if runtime is not None:
        return runtime
    return await asyncio.to_thread(_process.build)


async def _open_log(runtime: Runtime, stack: AsyncExitStack) -> None:
    tenant = os.environ.get(TENANT_ENV, DEFAULT_TENANT).strip()
    if not tenant:
        log.info("%s is empty: the served graphs' decisions are not recorded", TENANT_ENV)
        return
    settings = runtime.settings
    # database_url_for may create the data directory: blocking work, off the loop.
    url = await asyncio.to_thread(database_url_for, settings)
    decisions = await DecisionStore.open(url, queue=settings.store.queue, batch=settings.store.batch)
    # Closed after the runs it serves: its writer commits what they queued.
    stack.push_async_callback(decisions.aclose)
    # Reviews stay in LangGraph's interrupts here (the server's own API resumes them), not the queue.
    sink = decisions.sink(tenant, store_state=keeps_state(runtime.router), write_behind=True, review_ttl_s=None)
    _process.recording = runtime.router.with_sink(sink)
    log.info("the served graphs' decisions go to the decision log as tenant %r", tenant)


@asynccontextmanager
async def lifespan(_app: Starlette) -> AsyncIterator[None]:
    """Build the runtime and open the decision log before the server takes requests, watch the
    policy file, and close both at shutdown (the log last, so it commits what the runs queued)."""
    runtime = await server_runtime()
    try:
        async with AsyncExitStack() as stack:
            await _open_log(runtime, stack)
            async with runtime.store.watching(interval_s=POLICY_WATCH_INTERVAL_S):
                yield
    finally:
        _process.runtime = _process.example = _process.recording = None
        await runtime.aclose()


# An app with no routes of its own, for its lifespan: creating it opens nothing.
app = Starlette(lifespan=lifespan)
"""LangGraph's server's custom app (``http.app`` in ``langgraph.json``); the server merges its lifespan."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerContext(GraphContext):
    """A run's ``GraphContext`` built by the server from JSON: ``agent_model`` and ``frontier_model``
    may come from the run's ``context``; the rest comes from the process, never from a caller."""

    # Not init fields, so no caller can set them; typed Any here because pydantic, which the server
    # uses for the context's JSON schema, cannot describe the ``ChatSource`` protocol.
    chats: Any = field(init=False, repr=False)
    draft_model: SkipJsonSchema[str | None] = field(init=False, default=None)
    sandbox: SkipJsonSchema[Path | None] = field(init=False, default=None)

    def __post_init__(self) -> None:
        runtime = _process.built()
        chats: ChatSource = runtime.chats
        sandbox = os.environ.get(SANDBOX_ENV)
        object.__setattr__(self, "chats", chats)
        object.__setattr__(self, "draft_model", runtime.settings.system2.draft)
        object.__setattr__(self, "sandbox", Path(sandbox) if sandbox else None)


async def graph_for(name: GraphName) -> CompiledStateGraph[Any, Any, Any, Any]:
    """Graph ``name`` over the process's runtime, compiled without a checkpointer, taking a ``ServerContext``.

    Built anew for each call (compiling is cheap), so a policy reload that changes the support
    routes reaches the next run.

    Raises:
        ConfigError: the policy lacks a task the graph needs, or fastslow's configuration is invalid.
    """
    runtime = await server_runtime()
    spec = GRAPHS[name]
    policy = runtime.router.policy
    for task, kind in spec.tasks.items():
        found = policy.tasks.get(task)
        if found is None or found.kind != kind:
            raise ConfigError(f"graph {name!r} needs a {kind} task {task!r} in the policy", key=f"tasks.{task}")
    builder = spec.factory(_process.router(runtime))
    # The server coerces each run's JSON context into the compiled graph's context schema.
    builder.context_schema = ServerContext
    return builder.compile(name=name)


def _example_agent(runtime: Runtime) -> Any:
    # The example lives beside the package, not in it (a wheel ships only examples/policy.yaml), so
    # it loads by path from the source tree that the editable install serves. Built once per process,
    # like the runtime: its middleware reads the policy through the router on every turn, so a
    # reload reaches it all the same (a route added by a reload goes to its frontier model).
    with _process.lock:
        if _process.example is None:
            path = Path(__file__).resolve().parents[1] / "examples" / "create_agent.py"
            spec = importlib.util.spec_from_file_location("fastslow_example_create_agent", path)
            if spec is None or spec.loader is None or not path.is_file():
                raise ConfigError(f"no example agent at {path}: it ships with fastslow's source tree", key="graphs")
            module = importlib.util.module_from_spec(spec)
            # Registered first: pydantic resolves the example model's annotations through sys.modules.
            sys.modules[spec.name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[spec.name]
                raise
            _process.example = module.make_agent(replace(runtime, router=_process.router(runtime)))
        return _process.example


async def create_agent_example() -> CompiledStateGraph[Any, Any, Any, Any]:
    """``create-agent``: the example ``create_agent`` agent (examples/create_agent.py), routed and gated by fastslow.

    Its models are scripted stand-ins; it needs ``pip install 'fastslow[langchain]'`` and a source tree.
    """
    runtime = await server_runtime()
    agent: CompiledStateGraph[Any, Any, Any, Any] = await asyncio.to_thread(_example_agent, runtime)
    return agent


async def support_triage() -> CompiledStateGraph[Any, Any, Any, Any]:
    """``support-triage``: System 1 routes a support request to a specialist; the rest go to the frontier."""
    return await graph_for("support-triage")


async def guarded_tools() -> CompiledStateGraph[Any, Any, Any, Any]:
    """``guarded-tools``: a file agent (in ``FASTSLOW_LANGGRAPH_SANDBOX``) whose tool calls pass the policy gate."""
    return await graph_for("guarded-tools")


async def draft_validate() -> CompiledStateGraph[Any, Any, Any, Any]:
    """``draft-validate``: a local worker drafts a JSON answer; drafts that fail the schema go to the frontier."""
    return await graph_for("draft-validate")
