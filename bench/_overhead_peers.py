"""The shared stub and the peers for ``bench/overhead.py``: each router wired the way its README shows.

The stub is one function behind ``httpx2.MockTransport``: a Jev ``/v1/systemone`` reply picking
every choice question's first option at 0.9, the same seam for fastslow's ``JevEngine`` and for
the ``typesafe-sdk`` clients both peers are built on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypedDict

import httpx2
from _jev_stub import stub_answers
from langchain_core.messages import AnyMessage
from langgraph.graph import START, add_messages
from langgraph_jev import JevClient, JevNode, choice, route_by_decision
from langgraph_jev_router import TypeSafeBackend, jev_first
from typesafe_sdk import AsyncTypeSafeClient, TypeSafeClient

from fastslow.router import Decision, PolicySet, State
from fastslow.router.engine_api import DecisionEngine

__all__ = [
    "PEERS",
    "BenchState",
    "LazySink",
    "StubChats",
    "StubEngines",
    "jev_router_edge",
    "langgraph_jev_graph",
    "stub_async_client",
    "stub_sync_client",
]

PEERS = ("langgraph-jev-router", "langgraph-jev")
STUB_URL = "http://jev.stub"
_KEY = "sk-bench"


class BenchState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    request: str
    """The user's text as a plain field, for ``JevNode(state_key=...)`` (it sends that field only)."""
    route: str | None
    decision: Any
    handled: bool


def _reply(request: httpx2.Request) -> httpx2.Response:
    answers = stub_answers(json.loads(request.content)["questions"])
    body = {"model": "jev-1.13.0", "answers": answers, "usage": {"input_tokens": 40, "output_tokens": 1}}
    return httpx2.Response(200, json=body, headers={"x-request-id": "bench"})


def stub_async_client() -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=httpx2.MockTransport(_reply))


def stub_sync_client() -> httpx2.Client:
    return httpx2.Client(transport=httpx2.MockTransport(_reply))


class StubEngines:
    """fastslow's engine source: the one stubbed ``JevEngine``."""

    def __init__(self, engine: DecisionEngine) -> None:
        self.engine = engine

    def engine_for(self, name: str | None, policy: PolicySet) -> DecisionEngine:
        del name, policy
        return self.engine


class StubChats:
    """No System 2: every decision here is one System 1 keeps."""

    def chat_for(self, ref: str | None) -> None:
        del ref


class LazySink:
    """The decision log (``DecisionStore`` on SQLite), opened on the event loop that first records.

    Under ``invoke`` the router runs on fastslow's own loop thread, under ``ainvoke`` on the
    caller's loop; the store's connections (and its writer task) belong to the loop that opened
    them, so ``close`` runs ``aclose`` there.
    """

    def __init__(self, url: str, *, write_behind: bool = False) -> None:
        self.url = url
        self.write_behind = write_behind
        self._store: Any = None
        self._sink: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def record(self, decision: Decision, *, state: State) -> None:
        if self._sink is None:
            from fastslow.api.store import DecisionStore

            self._store = await DecisionStore.open(self.url)
            self._sink = self._store.sink("bench", write_behind=self.write_behind)
            self._loop = asyncio.get_running_loop()
        await self._sink.record(decision, state=state)

    def record_from_thread(self, decisions: Any, *, state: State) -> bool:
        """The store's own sync path (queue and return), once the store is open."""
        return self._sink is not None and bool(self._sink.record_from_thread(decisions, state=state))

    def close(self) -> None:
        """Flush and close the store on its own loop (a queued decision is committed, none lost)."""
        if self._store is None or self._loop is None:
            return
        closing = self._store.aclose()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            raise RuntimeError("use `await sink.aclose()` on the store's own loop")
        asyncio.run_coroutine_threadsafe(closing, self._loop).result()
        self._store = self._sink = None

    async def aclose(self) -> None:
        if self._store is not None:
            await self._store.aclose()
            self._store = self._sink = None


class _StubBackend(TypeSafeBackend):
    """jev-router's own backend with its own settings, sending through the stub transport."""

    def _sync_client(self) -> Any:
        if self._client is None:
            # The peer's backend sets ``self._client = None`` without an annotation, so mypy reads it as None.
            self._client = TypeSafeClient(**self._client_kwargs(), http_client=stub_sync_client())  # type: ignore[assignment]
        return self._client

    def _async_client(self) -> Any:
        loop = asyncio.get_running_loop()
        client = self._async_clients.get(loop)
        if client is None:
            client = AsyncTypeSafeClient(**self._client_kwargs(), http_client=stub_async_client())
            self._async_clients[loop] = client
        return client


def jev_router_edge(routes: list[str], *, asynchronous: bool) -> Callable[[Any], None]:
    """``@jev_first`` on a conditional-edge function; the function (the fallback) is never reached."""
    backend = _StubBackend(api_key=_KEY, base_url=STUB_URL)

    def fallback(state: BenchState) -> Literal["billing", "technical", "account"]:
        del state
        raise AssertionError("the stub is confident: jev-router should never fall back")

    async def afallback(state: BenchState) -> Literal["billing", "technical", "account"]:
        del state
        raise AssertionError("the stub is confident: jev-router should never fall back")

    edge = jev_first(afallback if asynchronous else fallback, backend=backend, routes=routes)
    return lambda graph: graph.add_conditional_edges(START, edge, routes)


def langgraph_jev_graph(routes: list[str], *, asynchronous: bool) -> Callable[[Any], None]:
    """A ``JevNode`` then ``route_by_decision`` on its conditional edge (async ones under ``ainvoke``)."""
    client = JevClient(
        sync_client=TypeSafeClient(api_key=_KEY, base_url=STUB_URL, http_client=stub_sync_client()),
        async_client=AsyncTypeSafeClient(api_key=_KEY, base_url=STUB_URL, http_client=stub_async_client()),
    )
    node = JevNode(
        questions={"route": choice(routes)},
        client=client,
        state_key="request",
        thresholds={"route": 0.7},
        low_confidence="human_review",
    )

    def after(state: BenchState) -> str:
        return route_by_decision(state["decision"], field="route", routes={r: r for r in routes}, fallback=routes[-1])

    async def aafter(state: BenchState) -> str:
        return after(state)

    def add(graph: Any) -> None:
        graph.add_node("jev", node.ainvoke if asynchronous else node)
        graph.add_edge(START, "jev")
        graph.add_conditional_edges("jev", aafter if asynchronous else after, routes)

    return add
