"""fastslow's kernel: typed questions and answers, decisions, the ``Router`` and its LangGraph nodes.

This is the surface for agent and policy authors. What only engine authors need (the
``DecisionEngine`` protocol, request splitting, deadlines, the Jev wire helpers, the System-2
``ChatEngine`` protocol) is in ``fastslow.router.engine_api``.

``fastslow.router`` imports none of its sibling packages; ``fastslow.engines`` and
``fastslow.policies`` build on it.

Errors::

    FastslowError
    ├── ConfigError          a developer mistake: a bad policy file, setting or task name
    ├── InvalidRequest       bad input, naming the field
    └── EngineError          an engine could not answer
        ├── EngineTimeout
        ├── EngineUnavailable
        ├── EngineHTTPError  (status, body, retry_after)
        └── EngineProtocolError
    └── Overloaded           an engine's queue is full: nothing was decided, retry later

``failure_summary(exc)`` says what kind of failure an engine error was, without its text (an
upstream's body, an internal URL): decisions and API responses carry that; the text is logged.

``request_scope`` gives a request one deadline (and a tenant) that every stage honours.
"""

from ._answers import Answer, NoAnswer, Signals
from ._calibration import Calibration, ConfidenceMap, Isotonic, Platt, calibrate
from ._chat import ToolCall
from ._decisions import (
    CheckAction,
    Decision,
    EngineFailure,
    OnFailure,
    Reason,
    System,
    Thresholds,
    Verdict,
    audited,
    decide_answer,
    decide_check,
    escalated_by_system2,
)
from ._engine import ReadOptions
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
from ._nodes import classify_node, policy_gate_node, route_edge, router_node
from ._plugins import installed_engines
from ._poll import polling
from ._questions import Choice, Image, Noul, Question, QuestionKind, Score, State
from ._router import ChatSource, CheckResult, DecisionSink, EngineSource, Incumbent, Router
from ._settings import (
    BreakerSettings,
    CoalesceSettings,
    EmbeddedSettings,
    EngineName,
    JevProfileName,
    JevSettings,
    LearningSettings,
    LimitsSettings,
    LogprobSettings,
    ModelPrice,
    OpenAIDecisionsSettings,
    ServerSettings,
    Settings,
    StoreSettings,
    System2Settings,
    get_settings,
)
from ._tasks import (
    CheckTask,
    ClassifyTask,
    Egress,
    Examples,
    Learn,
    OpenEnded,
    PolicySet,
    QuestionRole,
    Route,
    RouteTask,
    Rule,
    Sticky,
    Task,
    TaskCommon,
)
from ._work import Overloaded, budget_s, current_deadline, current_tenant, request_scope

__all__ = [
    "Answer",
    "BreakerSettings",
    "Calibration",
    "ChatSource",
    "CheckAction",
    "CheckResult",
    "CheckTask",
    "Choice",
    "ClassifyTask",
    "CoalesceSettings",
    "ConfidenceMap",
    "ConfigError",
    "Decision",
    "DecisionSink",
    "Egress",
    "EmbeddedSettings",
    "EngineError",
    "EngineFailure",
    "EngineHTTPError",
    "EngineName",
    "EngineProtocolError",
    "EngineSource",
    "EngineTimeout",
    "EngineUnavailable",
    "Examples",
    "FastslowError",
    "Image",
    "Incumbent",
    "InvalidRequest",
    "Isotonic",
    "JevProfileName",
    "JevSettings",
    "Learn",
    "LearningSettings",
    "LimitsSettings",
    "LogprobSettings",
    "ModelPrice",
    "NoAnswer",
    "Noul",
    "OnFailure",
    "OpenAIDecisionsSettings",
    "OpenEnded",
    "Overloaded",
    "Platt",
    "PolicySet",
    "Question",
    "QuestionKind",
    "QuestionRole",
    "ReadOptions",
    "Reason",
    "Route",
    "RouteTask",
    "Router",
    "Rule",
    "Score",
    "ServerSettings",
    "Settings",
    "Signals",
    "State",
    "Sticky",
    "StoreSettings",
    "System",
    "System2Settings",
    "Task",
    "TaskCommon",
    "Thresholds",
    "ToolCall",
    "Verdict",
    "audited",
    "budget_s",
    "calibrate",
    "classify_node",
    "current_deadline",
    "current_tenant",
    "decide_answer",
    "decide_check",
    "escalated_by_system2",
    "failure_summary",
    "get_settings",
    "installed_engines",
    "policy_gate_node",
    "polling",
    "request_scope",
    "route_edge",
    "router_node",
]
