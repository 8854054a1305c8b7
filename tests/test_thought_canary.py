"""End to end: no model thought survives a graph run, anywhere.

Every provider fake (``fakes.canary``) puts one canary string in every thought field it
serves. The three ready graphs run through the production path (policy YAML, the engine pool's
``JevEngine``, ``Frontier`` and the official SDKs reaching loopback servers through ``base_url``),
with a SQLite checkpointer, a tool loop behind the policy gate and System-2 escalations, and
LangChain tracing on towards a LangSmith stand-in, and OpenTelemetry spans recorded. Afterwards the
final states, every message, the checkpoints (read back and as raw database bytes), every request
sent to a provider, what reached LangSmith, the spans exported, captured logs and output, and every
file written must hold no canary.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from pydantic import SecretStr

from fastslow.engines import EnginePool
from fastslow.engines.chat import Frontier, keep_thoughts
from fastslow.graphs import run_graph
from fastslow.policies import parse_policy
from fastslow.router import Router, Settings
from fastslow.router.settings import JevSettings, ModelPrice, System2Settings

from fakes.anthropic_server import ScriptedServer as AnthropicServer
from fakes.anthropic_server import anthropic_server
from fakes.canary import (
    CANARY,
    GOOD_TICKET,
    INLINE_FORMS,
    ThinkingChat,
    ThinkingJevServer,
    thinking_anthropic,
    thinking_responses,
)
from fakes.langsmith import langsmith_standin, langsmith_tracing
from fakes.openai_server import ScriptedServer, openai_server
from fakes.otel import recorded_spans
from fakes.otlp import span_texts
from fakes.responses_server import ResponsesServer, responses_server

POLICY = """
version: 1
defaults:
  engine: jev
  thresholds: {min_confidence: 0.9}
tasks:
  support:
    kind: route
    routes:
      billing: Charges, invoices and refunds.
      technical: Errors and crashes.
      account: Sign-in and passwords.
    none_of_these: other
    open_ended: {threshold: 0.9}
  tool_safety:
    kind: check
    on_failure: escalate
    rules:
      destructive:
        instructions: Would this tool call delete or overwrite data?
        deny_at: 0.8
        allow_at: 0.3
"""

CLAUDE = "anthropic:claude-sonnet-4-6"
PROVIDERS = ["openai-responses", "openai-chat", "openai-env", "anthropic"]
"""The System-2 provider the graphs' agents and the router's escalations use (the local draft
worker always speaks Chat Completions)."""


@dataclass
class Servers:
    jev: ThinkingJevServer
    chat: ScriptedServer
    chat_thoughts: ThinkingChat
    responses: ResponsesServer
    anthropic: AnthropicServer


@contextmanager
def _http_servers() -> Iterator[tuple[Servers, dict[str, str]]]:
    """Every provider server (the structured one not yet started) and the base URLs of the HTTP ones."""
    chat_thoughts = ThinkingChat()
    with ExitStack() as stack:
        chat_url, chat = stack.enter_context(openai_server(respond=chat_thoughts))
        responses_url, responses = stack.enter_context(responses_server(respond=thinking_responses))
        anthropic_url, anthropic = stack.enter_context(anthropic_server(respond=thinking_anthropic, canary=CANARY))
        servers = Servers(ThinkingJevServer(), chat, chat_thoughts, responses, anthropic)
        yield servers, {"chat": chat_url, "responses": responses_url, "anthropic": anthropic_url}


@asynccontextmanager
async def _world(
    provider: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Servers, Router, Frontier]]:
    """The servers, and a router and chat source wired the way ``fastslow.api.build_runtime`` wires them."""
    async with AsyncExitStack() as stack:
        servers, urls = stack.enter_context(_http_servers())
        servers.jev.start()
        stack.callback(servers.jev.stop)
        key = SecretStr("sk-canary")
        # A sink is configured, but no task opts in: it must stay empty.
        common: dict[str, Any] = {
            "local_base_url": urls["chat"],
            "max_retries": 0,
            "thought_sink": tmp_path / "thoughts.jsonl",
            "prices": {ref: ModelPrice(input=1.0, output=4.0) for ref in ("openai:gpt-5.5", CLAUDE)},
        }
        if provider == "openai-responses":
            settings = System2Settings(openai_base_url=urls["responses"], openai_api_key=key, **common)
            frontier = Frontier(settings, openai_api="responses")
        elif provider == "openai-chat":
            frontier = Frontier(System2Settings(openai_base_url=urls["chat"], openai_api_key=key, **common))
        elif provider == "openai-env":  # the SDK's own environment variables
            monkeypatch.setenv("OPENAI_BASE_URL", urls["chat"])
            monkeypatch.setenv("OPENAI_API_KEY", "sk-canary-env")
            frontier = Frontier(System2Settings(**common))
        else:
            monkeypatch.setenv("ANTHROPIC_BASE_URL", urls["anthropic"])
            frontier = Frontier(System2Settings(default=CLAUDE, **common))
        stack.push_async_callback(frontier.aclose)
        pool = EnginePool(Settings(engine="jev", jev=JevSettings(base_url=servers.jev.url, max_retries=0)))
        stack.push_async_callback(pool.aclose)
        policy = parse_policy(POLICY)
        yield servers, Router(lambda: policy, pool, frontier), frontier


async def _run_all(router: Router, frontier: Frontier, saver: AsyncSqliteSaver, sandbox: Path) -> list[dict[str, Any]]:
    kw: dict[str, Any] = {"router": router, "chats": frontier, "checkpointer": saver, "sandbox": sandbox}
    support = await run_graph("support-triage", "I need help with my order", thread_id="support", **kw)
    follow_up = await run_graph("support-triage", "and the invoice too", thread_id="support", **kw)
    tools = await run_graph("guarded-tools", "what's in a.txt?", thread_id="tools", **kw)
    draft = await run_graph("draft-validate", "I was charged twice in May", draft_model="local:qwen", **kw)
    return [support, follow_up, tools, draft]


def _where(needle: str, places: dict[str, str | bytes]) -> list[str]:
    return [name for name, blob in places.items() if (needle.encode() if isinstance(blob, bytes) else needle) in blob]


async def _checkpoints(saver: AsyncSqliteSaver) -> str:
    return "\n".join([repr(t.checkpoint) + repr(t.metadata) async for t in saver.alist(None)])


def _files(root: Path) -> dict[str, bytes]:
    return {f"file {p.relative_to(root)}": p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    root = tmp_path / "sandbox"
    root.mkdir()
    (root / "a.txt").write_text("hello from a")
    return root


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_no_thought_survives_full_graph_runs(
    provider: str,
    tmp_path: Path,
    sandbox: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    db = tmp_path / "checkpoints.sqlite"
    # LangChain tracing on, towards a LangSmith stand-in, and OpenTelemetry spans recorded: both are scanned too.
    with langsmith_standin() as langsmith, langsmith_tracing(langsmith), recorded_spans() as exporter:
        async with _world(provider, tmp_path, monkeypatch) as (servers, router, frontier):
            async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
                outs = await _run_all(router, frontier, saver, sandbox)
                checkpoints = await _checkpoints(saver)

    support, follow_up, tools, draft = outs
    # The runs did what they should: escalations, a tool loop through the gate, a rejected draft.
    assert support["decision"]["system"] == 2 and support["route"] == "billing"
    assert support["decision"]["cost_usd"] > 0 and support["steps"][0]["cost_usd"] > 0  # priced from usage
    last = support["messages"][-1]
    assert (last["type"], last["content"], last["name"]) == ("ai", "Here is what I found.", "billing")
    assert [m["type"] for m in follow_up["messages"]] == ["human", "ai", "human", "ai"]
    assert [g["verdict"] for g in tools["gate"]] == ["allow"] and tools["outcome"] == "answered"
    assert any(m["type"] == "tool" and m["content"] == "hello from a" for m in tools["messages"])
    assert (draft["produced_by"], draft["answer"]) == ("frontier", GOOD_TICKET)

    # The canary really was served, in every form.
    assert servers.jev.thoughts_served >= 3
    if provider in ("openai-chat", "openai-env"):
        assert set(servers.chat_thoughts.served) >= {"reasoning", "reasoning_content", *INLINE_FORMS}
    else:  # the chat server then only serves the local draft worker
        assert {"reasoning", "reasoning_content"} <= set(servers.chat_thoughts.served)
    if provider == "openai-responses":
        assert servers.responses.thoughts_sent and all(CANARY in t for t in servers.responses.thoughts_sent)
    if provider == "anthropic":
        assert len(servers.anthropic.requests) >= 6  # each reply had a thinking and a redacted block
    # LangSmith got the nodes' decisions and their System-2 calls as child runs.
    traced = langsmith.runs().values()
    assert any((r.get("extra") or {}).get("metadata", {}).get("fastslow.decision.system") == 2 for r in traced)
    assert any(r.get("name", "").startswith("system2 ") for r in traced)
    # Spans of the decisions and of both systems' calls were exported; by default none holds state text.
    spans = span_texts(exporter.get_finished_spans())
    assert "fastslow.route support" in spans and "fastslow.decision.system=2" in spans
    assert "gen_ai.provider.name" in spans
    user_text = ("I need help with my order", "and the invoice too", "what's in a.txt?", "I was charged twice in May")
    assert [text for text in user_text if text in spans] == []

    captured = capsys.readouterr()
    places: dict[str, str | bytes] = {
        "final states": json.dumps(outs),
        "messages": json.dumps([m for out in outs for m in out["messages"]]),
        "checkpoints": checkpoints,
        "requests to the chat server": json.dumps(servers.chat.requests),
        "requests to the responses server": json.dumps(servers.responses.requests),
        "requests to the anthropic server": json.dumps(servers.anthropic.requests),
        "requests to the structured server": b"".join(r.body for r in servers.jev.requests),
        "what reached LangSmith": langsmith.received_bytes(),
        "spans exported": spans,
        "logs": caplog.text,
        "output": captured.out + captured.err,
        **_files(tmp_path),
    }
    assert f"file {db.name}" in places and caplog.records  # the scan covers the database and real logs
    assert _where(CANARY, places) == []
    assert not (tmp_path / "thoughts.jsonl").exists()  # configured, but no task opted in


async def test_an_opted_in_task_keeps_its_thoughts_in_the_sink_and_nowhere_else(
    tmp_path: Path, sandbox: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    db = tmp_path / "checkpoints.sqlite"
    async with _world("openai-responses", tmp_path, monkeypatch) as (servers, router, frontier):
        async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
            with keep_thoughts("support"):
                out = await run_graph(
                    "support-triage", "I need help", router=router, chats=frontier, checkpointer=saver, sandbox=sandbox
                )
            checkpoints = await _checkpoints(saver)

    sink = tmp_path / "thoughts.jsonl"
    records = [json.loads(line) for line in sink.read_text().splitlines()]
    assert records and {r["task"] for r in records} == {"support"}
    assert {r["model"] for r in records} == {"openai:gpt-5.5"}
    assert all(set(r) == {"time", "task", "model", "thought"} for r in records)
    assert any(CANARY in r["thought"] for r in records)
    assert not any("gAAA" in r["thought"] for r in records)  # encrypted reasoning is never kept
    places: dict[str, str | bytes] = {
        "final state": json.dumps(out),
        "checkpoints": checkpoints,
        "requests": json.dumps(servers.responses.requests),
        "logs": caplog.text,
        **_files(tmp_path),
    }
    assert _where(CANARY, places) == [f"file {sink.name}"]
