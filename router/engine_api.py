"""The surface for engine authors: what a System-1 or System-2 engine implements and the helpers it uses.

A System-1 engine implements ``DecisionEngine`` (one async ``decide(state, questions)`` plus
``aclose()``) and answers with an ``EngineReply`` of ``fastslow.router.Answer`` /
``fastslow.router.NoAnswer`` values; a request beyond its ``EngineLimits`` is cut to size by
``split_and_ask``, and ``Deadline`` carries one time budget across retries. An engine that can also
answer from sync code in the caller's thread implements ``SyncDecisionEngine`` (``decide_sync``,
with ``ask_whole_sync`` for requests within its limits). ``CoalescingEngine``
sends concurrent calls about one state to an engine as one call. ``CircuitBreaker`` fails calls
fast after repeated engine failures: ``BreakerEngine`` and ``BreakerChatEngine`` put one in front
of an engine (refusing with ``CircuitOpen``; ``counts_as_failure`` says what it counts, ``may_retry``
tells a retry loop to stop once it opened), and ``FallbackEngine`` / ``FallbackChatEngine`` ask a
chain of engines in order within one deadline. Blocking work runs
through ``run_blocking`` in bounded steps that check a ``StopToken``; ``FairLock`` shares a model
between tenants step by step. A System-2 engine
implements ``ChatEngine``. The kernel's types an engine takes or gives (questions, answers,
``ReadOptions``, ``Signals``, tasks, errors) and the request's deadline and tenant
(``budget_s``, ``current_deadline``, ``current_tenant``) are here too; settings blocks are in
``fastslow.router.settings``.

Tracing: ``TracedEngine`` / ``TracedChatEngine`` give an engine a GenAI span per call (the pool and
the frontier registry wrap shipped engines in them), ``inject_trace_headers`` sends W3C trace
context on an engine's own HTTP client, ``trace_event`` marks retries and the like on the current
span, and ``TraceAttr`` / ``TraceEvent`` / ``GenAI`` name what spans carry (``TRACE_SEMCONV_VERSION``).

User text reaches an engine only after ``neutralise``; model thoughts never leave an engine
(``strip_thoughts``).

An engine shipped outside fastslow is an ``EnginePlugin`` registered in the ``fastslow.engines``
entry-point group (``ENGINE_GROUP``), written for one ``ENGINE_API_VERSION`` (docs/architecture.md,
"Writing an engine plugin").
"""

from ._answers import Answer, EngineReply, NoAnswer, Signals, Usage, normalise_distribution
from ._breaker import (
    BreakerChatEngine,
    BreakerEngine,
    BreakerSnapshot,
    BreakerState,
    CircuitBreaker,
    CircuitOpen,
    counts_as_failure,
    failure_log_level,
    may_retry,
)
from ._chat import THOUGHT_TASK, ChatEngine, ChatResult, ToolCall, ToolOutcome, ToolRunner, ToolSpec, ToolStep
from ._checks import check_state
from ._coalesce import CoalescingEngine
from ._engine import DecisionEngine, EngineLimits, ReadOptions, SyncDecisionEngine
from ._errors import (
    ConfigError,
    EngineError,
    EngineHTTPError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
    FastslowError,
    InvalidRequest,
    failure_summary,
)
from ._fair import FairGate, FairLock
from ._fallback import FallbackChatEngine, FallbackEngine
from ._plugins import ENGINE_GROUP, EngineContext, EnginePlugin, installed_engines, plugin_engines, settings_key
from ._questions import (
    MAX_STATE_CHARS,
    NOUL_OPTIONS,
    Choice,
    Image,
    Noul,
    Question,
    QuestionKind,
    Score,
    State,
    question_from_wire,
    question_to_wire,
    questions_from_wire,
    validate_state,
)
from ._sanitize import CONTROL_STRINGS, neutralise, neutralise_text, strip_thoughts
from ._split import AskFn, SyncAskFn, ask_whole_sync, split_and_ask
from ._tasks import ClassifyTask, Examples, PolicySet, RouteTask, TaskCommon
from ._timing import Deadline
from ._traced import CallRecord, TracedChatEngine, TracedEngine, observe_calls
from ._tracing import SEMCONV_VERSION as TRACE_SEMCONV_VERSION
from ._tracing import Attr as TraceAttr
from ._tracing import Event as TraceEvent
from ._tracing import GenAI, current_span_context, inject_trace_headers, link_current, trace_headers
from ._tracing import add_event as trace_event
from ._wire import SystemOneRequest, parse_systemone_request, render_systemone_reply
from ._work import (
    Abandoned,
    Overloaded,
    StopToken,
    budget_s,
    current_deadline,
    current_tenant,
    gather_all,
    request_scope,
    run_blocking,
)

ENGINE_API_VERSION = 1
"""The version of this surface an ``EnginePlugin`` declares (``api_version``); fastslow refuses a plugin
written for another one. It changes when a change here would break an engine written for the last."""

__all__ = [
    "CONTROL_STRINGS",
    "ENGINE_API_VERSION",
    "ENGINE_GROUP",
    "MAX_STATE_CHARS",
    "NOUL_OPTIONS",
    "THOUGHT_TASK",
    "TRACE_SEMCONV_VERSION",
    "Abandoned",
    "Answer",
    "AskFn",
    "BreakerChatEngine",
    "BreakerEngine",
    "BreakerSnapshot",
    "BreakerState",
    "CallRecord",
    "ChatEngine",
    "ChatResult",
    "Choice",
    "CircuitBreaker",
    "CircuitOpen",
    "ClassifyTask",
    "CoalescingEngine",
    "ConfigError",
    "Deadline",
    "DecisionEngine",
    "EngineContext",
    "EngineError",
    "EngineHTTPError",
    "EngineLimits",
    "EnginePlugin",
    "EngineProtocolError",
    "EngineReply",
    "EngineTimeout",
    "EngineUnavailable",
    "Examples",
    "FairGate",
    "FairLock",
    "FallbackChatEngine",
    "FallbackEngine",
    "FastslowError",
    "GenAI",
    "Image",
    "InvalidRequest",
    "NoAnswer",
    "Noul",
    "Overloaded",
    "PolicySet",
    "Question",
    "QuestionKind",
    "ReadOptions",
    "RouteTask",
    "Score",
    "Signals",
    "State",
    "StopToken",
    "SyncAskFn",
    "SyncDecisionEngine",
    "SystemOneRequest",
    "TaskCommon",
    "ToolCall",
    "ToolOutcome",
    "ToolRunner",
    "ToolSpec",
    "ToolStep",
    "TraceAttr",
    "TraceEvent",
    "TracedChatEngine",
    "TracedEngine",
    "Usage",
    "ask_whole_sync",
    "budget_s",
    "check_state",
    "counts_as_failure",
    "current_deadline",
    "current_span_context",
    "current_tenant",
    "failure_log_level",
    "failure_summary",
    "gather_all",
    "inject_trace_headers",
    "installed_engines",
    "link_current",
    "may_retry",
    "neutralise",
    "neutralise_text",
    "normalise_distribution",
    "observe_calls",
    "parse_systemone_request",
    "plugin_engines",
    "question_from_wire",
    "question_to_wire",
    "questions_from_wire",
    "render_systemone_reply",
    "request_scope",
    "run_blocking",
    "settings_key",
    "split_and_ask",
    "strip_thoughts",
    "trace_event",
    "trace_headers",
    "validate_state",
]
