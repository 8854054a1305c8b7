"""fastslow's kernel: typed questions and answers, decisions, the ``Router`` and its LangGraph nodes.

This is the surface for policy and graph authors: question, answer and decision types, tasks and
thresholds, the ``Router`` and its nodes, the errors, and ``Settings`` / ``get_settings``. The
other audiences have doors of their own:

- engine authors: ``fastslow.router.engine_api`` (the ``DecisionEngine`` and ``ChatEngine``
  protocols, request splitting, deadlines, and every kernel type an engine takes or gives);
- operators' settings: ``fastslow.router.settings`` (every settings block, ``JevSettings``,
  ``LimitsSettings``, ...);
- graph integrations beyond the ready nodes: ``fastslow.router.graph_api``.

A name that moved to one of them from here is still given here for one release, with a
``DeprecationWarning`` naming its new home.

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

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING

from ._answers import Answer, NoAnswer
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
from ._plugins import installed_engines
from ._poll import polling
from ._questions import Choice, Image, Noul, Question, QuestionKind, Score, State
from ._reviews import PendingReview, ReviewRecorder, ReviewState, resume_value
from ._router import ChatSource, CheckResult, DecisionSink, EngineSource, Incumbent, Router
from ._settings import EngineName, Settings, get_settings
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
from ._work import Overloaded, request_scope

__all__ = [
    "Answer",
    "Calibration",
    "ChatSource",
    "CheckAction",
    "CheckResult",
    "CheckTask",
    "Choice",
    "ClassifyTask",
    "ConfidenceMap",
    "ConfigError",
    "Decision",
    "DecisionSink",
    "Egress",
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
    "Learn",
    "NoAnswer",
    "Noul",
    "OnFailure",
    "OpenEnded",
    "Overloaded",
    "PendingReview",
    "Platt",
    "PolicySet",
    "Question",
    "QuestionKind",
    "QuestionRole",
    "ReadOptions",
    "Reason",
    "ReviewRecorder",
    "ReviewState",
    "Route",
    "RouteTask",
    "Router",
    "RouterState",
    "Rule",
    "Score",
    "Settings",
    "State",
    "Sticky",
    "System",
    "Task",
    "TaskCommon",
    "Thresholds",
    "ToolCall",
    "Verdict",
    "audited",
    "calibrate",
    "classify_node",
    "decide_answer",
    "decide_check",
    "escalated_by_system2",
    "failure_summary",
    "get_settings",
    "installed_engines",
    "policy_gate_node",
    "polling",
    "request_scope",
    "resume_value",
    "route_edge",
    "router_node",
]

# Moved to the door of their audience; given here until the release after 0.1, with a warning.
_MOVED = {
    **dict.fromkeys(
        (
            "BreakerSettings",
            "CoalesceSettings",
            "EmbeddedSettings",
            "JevProfileName",
            "JevSettings",
            "LearningSettings",
            "LimitsSettings",
            "LogprobSettings",
            "ModelPrice",
            "OpenAIDecisionsSettings",
            "ServerSettings",
            "StoreSettings",
            "System2Settings",
        ),
        "fastslow.router.settings",
    ),
    **dict.fromkeys(("Signals", "budget_s", "current_deadline", "current_tenant"), "fastslow.router.engine_api"),
}


if TYPE_CHECKING:
    from ._nodes import RouterState, classify_node, policy_gate_node, route_edge, router_node

# The LangGraph nodes load on first use: they import LangGraph (and LangSmith's tracers), about half
# a second, which the decision log, the engines and the command line's quick commands never need.
_LAZY = {name: "._nodes" for name in ("RouterState", "classify_node", "policy_gate_node", "route_edge", "router_node")}


def __getattr__(name: str) -> object:
    # PEP 562: only names missing from the module come here, so the current names cost nothing.
    lazy = _LAZY.get(name)
    if lazy is not None:
        value = getattr(importlib.import_module(lazy, __name__), name)
        globals()[name] = value  # found directly from now on
        return value
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module 'fastslow.router' has no attribute {name!r}")
    warnings.warn(
        f"fastslow.router.{name} is deprecated and will be removed in the next release: import it from {home}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(home), name)
