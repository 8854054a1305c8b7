"""OpenTelemetry spans: the tree of a route and of a check with System 2, breaker refusals, fallbacks,
coalesced calls (one span, linked), retries, and W3C trace context sent to System 1."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from langchain_core.messages import HumanMessage
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import SecretStr

from fastslow.engines.chat import Frontier
from fastslow.engines.embedded._batching import BatchingEmbedder
from fastslow.engines.jev import JevEngine
from fastslow.router import CheckTask, EngineHTTPError, PolicySet, Question, Router, State, ToolCall
from fastslow.router._tracing import enabled, tracer
from fastslow.router.engine_api import (
    TRACE_SEMCONV_VERSION,
    BreakerEngine,
    ChatResult,
    CircuitBreaker,
    CoalescingEngine,
    EngineUnavailable,
    FallbackEngine,
    GenAI,
    TraceAttr,
    TracedChatEngine,
    TracedEngine,
    TraceEvent,
    Usage,
)
from fastslow.router.settings import CoalesceSettings, JevSettings, System2Settings

from fakes.anthropic_server import anthropic_server
from fakes.anthropic_server import text as anthropic_text
from fakes.jev_server import Reply, running_jev_server
from fakes.openai_server import openai_server, text
from fakes.otel import by_name, children, recorded_spans
from fakes.policies import three_task_policy
from fakes.scripted import Chats, OneEngine, ScriptedChat, ScriptedEngine

SECRET = "customer 4711 wants their card number 4111-1111-1111-1111 back"


def _route(dist: Mapping[str, float]) -> Any:
    def script(state: State, name: str, question: Question) -> Any:
        del state, question
        return {"yes": 0.05, "no": 0.95} if name.endswith(".open_ended") else dist

    return script


def _check(p_yes: float) -> Any:
    def script(state: State, name: str, question: Question) -> Any:
        del state, name, question
        return {"yes": p_yes, "no": 1.0 - p_yes}

    return script


def _router(engine: Any, chat: Any = None, policy: PolicySet | None = None, **kw: Any) -> Router:
    the_policy = policy or three_task_policy()
    return Router(lambda: the_policy, OneEngine(engine), Chats(chat), **kw)


def _one(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], prefix: str) -> ReadableSpan:
    found = by_name(spans, prefix)
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _every_value(spans: Any) -> str:
    """Every attribute and event value of ``spans``, as one text to search."""
    parts: list[str] = []
    for span in spans:
        parts.append(span.name)
        parts.extend(str(v) for v in (span.attributes or {}).values())
        for event in span.events:
            parts.extend(str(v) for v in (event.attributes or {}).values())
    return "\n".join(parts)


def test_attribute_names_are_the_pinned_genai_conventions() -> None:
    assert TRACE_SEMCONV_VERSION == "1.37.0"
    assert GenAI.OPERATION_NAME == gen_ai_attributes.GEN_AI_OPERATION_NAME
    assert GenAI.PROVIDER_NAME == gen_ai_attributes.GEN_AI_PROVIDER_NAME
    assert GenAI.REQUEST_MODEL == gen_ai_attributes.GEN_AI_REQUEST_MODEL
    assert GenAI.RESPONSE_MODEL == gen_ai_attributes.GEN_AI_RESPONSE_MODEL
    assert GenAI.USAGE_INPUT_TOKENS == gen_ai_attributes.GEN_AI_USAGE_INPUT_TOKENS
    assert GenAI.USAGE_OUTPUT_TOKENS == gen_ai_attributes.GEN_AI_USAGE_OUTPUT_TOKENS


async def test_a_route_is_one_span_with_the_engine_call_beneath_it() -> None:
    engine = CoalescingEngine(TracedEngine(ScriptedEngine(_route({"billing": 0.9, "technical": 0.05, "other": 0.05}))))
    router = _router(engine)
    with recorded_spans() as exporter:
        decision = await router.route("support", SECRET)
    spans = exporter.get_finished_spans()
    route = _one(spans, "fastslow.route support")
    call = _one(spans, "chat scripted")
    assert route.parent is None
    assert children(spans, route) == [call]
    assert call.kind is SpanKind.CLIENT
    attrs = _attrs(route)
    assert attrs[TraceAttr.DECISION_ID] == decision.id
    assert (attrs[TraceAttr.SYSTEM], attrs[TraceAttr.REASON], attrs[TraceAttr.OUTCOME]) == (1, "confident", "billing")
    assert attrs[TraceAttr.CONFIDENCE] == pytest.approx(decision.confidence, abs=1e-6)
    assert attrs[TraceAttr.POLICY_VERSION] == "sha256:test"
    assert attrs[TraceAttr.TASK] == "support" and attrs[TraceAttr.OPERATION] == "route"
    assert _attrs(call)[GenAI.OPERATION_NAME] == "chat"
    assert _attrs(call)[GenAI.PROVIDER_NAME] == "scripted"
    # No state text unless the settings opt in.
    assert "4111" not in _every_value(spans)


async def test_the_sync_route_makes_the_same_tree() -> None:
    engine = TracedEngine(ScriptedEngine(_route({"billing": 0.9, "technical": 0.05, "other": 0.05})))
    router = _router(engine)
    with recorded_spans() as exporter:
        await asyncio.to_thread(router.route_sync, "support", "I was charged twice")
    spans = exporter.get_finished_spans()
    route = _one(spans, "fastslow.route support")
    assert [s.name for s in children(spans, route)] == ["chat scripted"]


async def test_state_text_is_on_the_span_only_when_opted_in() -> None:
    engine = TracedEngine(ScriptedEngine(_route({"billing": 0.9, "technical": 0.05, "other": 0.05})))
    with recorded_spans() as exporter:
        await _router(engine, trace_state_text=True).route("support", SECRET)
    route = _one(exporter.get_finished_spans(), "fastslow.route support")
    assert _attrs(route)[TraceAttr.STATE_TEXT] == SECRET


async def test_a_check_escalated_to_system2_has_decision_and_model_spans() -> None:
    # System 1 fails and the task escalates failures: System 2 judges each rule.
    engine = TracedEngine(ScriptedEngine(lambda *_: EngineHTTPError(502, "bad gateway")))
    base = three_task_policy()
    tools = base.tasks["tools"]
    assert isinstance(tools, CheckTask)
    policy = PolicySet(tasks={**base.tasks, "tools": replace(tools, on_failure="escalate")}, version="v2")
    reply = ChatResult(
        content="",
        model="frontier-1-2026",
        structured={"answer": "no"},
        usage=Usage(input_tokens=120, output_tokens=7),
        cost_usd=0.0042,
    )
    chat = TracedChatEngine(ScriptedChat(replies=[reply, reply]), provider="openai")
    router = _router(engine, chat, policy)
    with recorded_spans() as exporter:
        result = await router.check("tools", ToolCall(id="call-1", name="sql", args={"query": SECRET}))
    assert result.system2 and result.verdict == "allow"
    spans = exporter.get_finished_spans()
    check = _one(spans, "fastslow.check tools")
    assert _attrs(check)[TraceAttr.VERDICT] == "allow"
    assert list(_attrs(check)[TraceAttr.DECISION_ID]) == [d.id for d in result.decisions.values()]
    beneath = children(spans, check)
    assert sorted(s.name for s in beneath) == [
        "chat frontier-1",
        "chat frontier-1",
        "chat scripted",
        "fastslow.decision tools.destructive",
        "fastslow.decision tools.exfiltration",
    ]
    model = by_name(beneath, "chat frontier-1")[0]
    attrs = _attrs(model)
    assert attrs[GenAI.PROVIDER_NAME] == "openai"
    assert attrs[GenAI.REQUEST_MODEL] == "frontier-1"
    assert attrs[GenAI.RESPONSE_MODEL] == "frontier-1-2026"
    assert (attrs[GenAI.USAGE_INPUT_TOKENS], attrs[GenAI.USAGE_OUTPUT_TOKENS]) == (120, 7)
    assert attrs[TraceAttr.COST_USD] == pytest.approx(0.0042)
    rule = _one(beneath, "fastslow.decision tools.destructive")
    decided = result.decisions["destructive"]
    assert _attrs(rule)[TraceAttr.DECISION_ID] == decided.id
    assert (_attrs(rule)[TraceAttr.SYSTEM], _attrs(rule)[TraceAttr.VERDICT]) == (2, "allow")
    assert _attrs(_one(beneath, "chat scripted"))[GenAI.ERROR_TYPE] == "EngineHTTPError"
    assert "4111" not in _every_value(spans)


def _open_breaker(name: str) -> CircuitBreaker:
    breaker = CircuitBreaker(name, failures=1, open_s=60.0)
    breaker.settle(breaker.admit(), EngineUnavailable("down"))
    return breaker


async def test_a_breaker_refusal_is_an_event_and_no_call_span() -> None:
    engine = BreakerEngine(TracedEngine(ScriptedEngine(_check(0.1))), _open_breaker("scripted"))
    with recorded_spans() as exporter:
        result = await _router(engine).check("tools", "rm -rf /")
    assert result.verdict == "deny"  # fail closed
    spans = exporter.get_finished_spans()
    check = _one(spans, "fastslow.check tools")
    assert not by_name(spans, "chat")
    refused = [e for e in check.events if e.name == TraceEvent.BREAKER_REFUSED]
    assert len(refused) == 1 and (refused[0].attributes or {})[TraceAttr.ENGINE] == "scripted"
    rule = _one(spans, "fastslow.decision tools.destructive")
    assert _attrs(rule)[TraceAttr.REASON] == "engine_error"


async def test_a_fallback_is_an_event_between_two_call_spans() -> None:
    failing = ScriptedEngine(lambda *_: EngineUnavailable("primary down"), name="primary")
    healthy = ScriptedEngine(_route({"billing": 0.9, "technical": 0.05, "other": 0.05}), name="secondary")
    engine = FallbackEngine(TracedEngine(failing), TracedEngine(healthy))
    with recorded_spans() as exporter:
        decision = await _router(engine).route("support", "I was charged twice")
    assert decision.outcome == "billing"
    spans = exporter.get_finished_spans()
    route = _one(spans, "fastslow.route support")
    first, second = _one(spans, "chat primary"), _one(spans, "chat secondary")
    assert children(spans, route) == [first, second]
    assert first.status.status_code is StatusCode.ERROR
    assert _attrs(first)[GenAI.ERROR_TYPE] == "EngineUnavailable"
    assert second.status.status_code is StatusCode.UNSET
    fell = [e for e in route.events if e.name == TraceEvent.FALLBACK]
    assert [(e.attributes or {})[TraceAttr.ENGINE] for e in fell] == ["primary"]


class _Slow(ScriptedEngine):
    async def decide(self, state: State, questions: Any, **kw: Any) -> Any:
        await asyncio.sleep(0.05)
        return await super().decide(state, questions, **kw)


async def test_a_shared_call_is_one_span_in_the_first_trace_and_the_others_link_to_it() -> None:
    inner = _Slow(_check(0.05))
    engine = CoalescingEngine(TracedEngine(inner), CoalesceSettings(window_s=0.01))
    router = _router(engine)
    with recorded_spans() as exporter:
        first = asyncio.create_task(router.check("tools", "ls -la"))
        await asyncio.sleep(0.01)  # the first call is in flight: the same question joins it
        second = asyncio.create_task(router.check("tools", "ls -la"))
        await asyncio.gather(first, second)
    spans = exporter.get_finished_spans()
    assert len(inner.calls) == 1
    checks = by_name(spans, "fastslow.check tools")
    call = _one(spans, "chat scripted")
    opener = next(c for c in checks if call.parent is not None and call.parent.span_id == c.context.span_id)
    joiner = next(c for c in checks if c is not opener)
    assert call.context.trace_id == opener.context.trace_id != joiner.context.trace_id
    assert [link.context.span_id for link in joiner.links] == [call.context.span_id]
    assert any(e.name == TraceEvent.COALESCED for e in joiner.events)


async def test_jev_calls_carry_the_call_span_as_traceparent_and_retries_as_events() -> None:
    async with running_jev_server("structured") as server:
        server.script(Reply(status=503, body={"error": {"message": "busy"}}, headers={"retry-after-ms": "10"}))
        engine = TracedEngine(JevEngine(JevSettings(base_url=server.url, profile="structured", max_retries=2)))
        try:
            with recorded_spans() as exporter:
                await _router(engine).check("tools", "git status")
        finally:
            await engine.aclose()
    spans = exporter.get_finished_spans()
    call = _one(spans, "chat ")
    attrs = _attrs(call)
    assert attrs[GenAI.PROVIDER_NAME] == "vllm"
    assert len(server.requests) == 2
    for request in server.requests:
        version, trace_id, span_id, flags = request.headers["traceparent"].split("-")
        assert version == "00" and int(flags, 16) & 1  # sampled
        assert int(trace_id, 16) == call.context.trace_id
        assert int(span_id, 16) == call.context.span_id
    retries = [e for e in call.events if e.name == TraceEvent.RETRY]
    assert len(retries) == 1 and (retries[0].attributes or {})[GenAI.ERROR_TYPE] == "503"


async def test_with_tracing_off_no_span_is_made_and_no_trace_context_is_sent() -> None:
    # Outside recorded_spans() this process's provider (if another test installed it) says it is
    # not recording: fastslow then behaves as with no provider at all.
    assert not enabled()
    async with running_jev_server("structured") as server:
        engine = TracedEngine(JevEngine(JevSettings(base_url=server.url, profile="structured")))
        try:
            await _router(engine).check("tools", "git status")
        finally:
            await engine.aclose()
    assert server.requests and all("traceparent" not in r.headers for r in server.requests)
    with recorded_spans():
        assert enabled()


def _sent_traceparent(headers: dict[str, str], span: ReadableSpan) -> None:
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert version == "00" and int(flags, 16) & 1
    assert (int(trace_id, 16), int(span_id, 16)) == (span.context.trace_id, span.context.span_id)


async def test_system2_sdk_calls_carry_their_span_as_traceparent() -> None:
    # The frontier registry wraps every System-2 engine in its span; the SDKs send that span's context.
    with openai_server(text("hello")) as (base_url, server):
        frontier = Frontier(System2Settings(local_base_url=base_url, max_retries=0, timeout_s=5.0))
        engine = frontier.chat_for("local:qwen3")
        assert engine is not None
        try:
            with recorded_spans() as exporter:
                assert (await engine.complete([HumanMessage(SECRET)])).content == "hello"
        finally:
            await frontier.aclose()
    call = _one(exporter.get_finished_spans(), "chat qwen3")
    assert _attrs(call)[GenAI.PROVIDER_NAME] == "local"
    assert (_attrs(call)[GenAI.USAGE_INPUT_TOKENS], _attrs(call)[GenAI.USAGE_OUTPUT_TOKENS]) == (11, 7)
    _sent_traceparent(server.headers[-1], call)
    assert "4111" not in _every_value([call])
    with anthropic_server(anthropic_text("hello")) as (base_url, served):
        settings = System2Settings(anthropic_base_url=base_url, anthropic_api_key=SecretStr("sk-ant"), max_retries=0)
        frontier = Frontier(settings)
        engine = frontier.chat_for("anthropic:claude-sonnet-4-6")
        assert engine is not None
        try:
            with recorded_spans() as exporter:
                await engine.complete([HumanMessage("hi")])
        finally:
            await frontier.aclose()
    spans = exporter.get_finished_spans()
    call = _one(spans, "chat claude-sonnet-4-6")
    assert _attrs(call)[GenAI.PROVIDER_NAME] == "anthropic"
    # The anthropic SDK makes a span of its own under ours (metadata only), and sends that one's context.
    (sdk,) = children(spans, call)
    assert sdk.instrumentation_scope is not None and sdk.instrumentation_scope.name == "com.anthropic.sdk.python"
    _sent_traceparent(served.headers[-1], sdk)


class _SlowEmbedder:
    name = "slow"
    model_id = "slow-0"
    dim = 2
    texts_embedded = 0
    tokens_embedded = 0

    def __init__(self) -> None:
        self.calls: list[int] = []

    def count_tokens(self, text: str) -> int:
        return len(text) + 2

    def embed(self, texts: Sequence[str], *, stop: object = None) -> np.ndarray:
        del stop
        self.calls.append(len(texts))
        time.sleep(0.2)
        return np.ones((len(texts), 2), dtype=np.float32) / np.sqrt(2)


async def test_readers_embedded_in_another_readers_batch_link_to_its_span() -> None:
    inner = _SlowEmbedder()
    batching = BatchingEmbedder(inner)

    def read(name: str) -> None:
        with tracer().start_as_current_span(name):
            batching.embed([name])

    with recorded_spans() as exporter:
        first = threading.Thread(target=read, args=("first",))
        first.start()
        await asyncio.sleep(0.05)  # the model is busy with the first read: the next two wait, then go together
        later = [threading.Thread(target=read, args=(name,)) for name in ("second", "third")]
        for thread in later:
            thread.start()
            await asyncio.sleep(0.02)
        for thread in (first, *later):
            await asyncio.to_thread(thread.join)
    assert inner.calls == [1, 2]
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert not spans["first"].links and not spans["second"].links  # each led its own model call
    assert [link.context.span_id for link in spans["third"].links] == [spans["second"].context.span_id]
