"""fastslow: a System-1 / System-2 router for agent graphs. This door is for graph authors.

What building an agent graph needs is here; each subpackage has its own documented surface:

- ``fastslow.router``: the kernel (questions, answers, decisions, the ``Router``, the LangGraph
  nodes, errors), for policy and graph authors; ``fastslow.router.engine_api`` is for engine
  authors, ``fastslow.router.settings`` holds every setting, ``fastslow.router.graph_api`` is for
  graph integrations beyond the ready nodes.
- ``fastslow.engines``: System-1 engines (embedded CPU engine, Jev wire client, ...) and System 2.
- ``fastslow.policies``: policy files (YAML tasks and thresholds) with hot reload.
- ``fastslow.graphs``: ready agent graphs.
- ``fastslow.api``: the wiring (``build_runtime``), the HTTP service and the command line.

A typical graph::

    from fastslow import RouterState, build_runtime, get_settings, router_node

    runtime = build_runtime(get_settings())
    graph = StateGraph(RouterState)  # the node writes the route and the decision there
    graph.add_node("route", router_node(runtime.router, "support"), destinations=("billing", "technical"))

The names below are loaded on first use, so ``import fastslow.router`` loads no sibling package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    __version__: str

    from .api import Runtime, build_runtime
    from .router import (
        Answer,
        CheckResult,
        Choice,
        ConfigError,
        Decision,
        FastslowError,
        Noul,
        Router,
        RouterState,
        Score,
        Settings,
        classify_node,
        get_settings,
        policy_gate_node,
        route_edge,
        router_node,
    )

__all__ = [
    "Answer",
    "CheckResult",
    "Choice",
    "ConfigError",
    "Decision",
    "FastslowError",
    "Noul",
    "Router",
    "RouterState",
    "Runtime",
    "Score",
    "Settings",
    "build_runtime",
    "classify_node",
    "get_settings",
    "policy_gate_node",
    "route_edge",
    "router_node",
]

_HOMES = {name: "fastslow.router" for name in __all__} | {"Runtime": "fastslow.api", "build_runtime": "fastslow.api"}


def __getattr__(name: str) -> object:
    # PEP 562: the subpackage is imported on first use of one of its names, then cached here.
    home = _HOMES.get(name)
    if home is None:
        if name == "__version__":
            from importlib.metadata import version

            return version("fastslow")
        raise AttributeError(f"module 'fastslow' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
