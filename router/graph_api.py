"""For authors of graph integrations beyond the ready nodes: what the router's own nodes are made of.

``router_node``, ``classify_node``, ``policy_gate_node`` and ``route_edge`` (in ``fastslow.router``)
cover most graphs. Code that puts the router into a graph some other way, as the ``create_agent``
middleware in ``fastslow.graphs.middleware`` does, uses these so that it records and gates as the
nodes do:

- ``decision_record(decision)``: the plain-data record of a ``Decision`` a node writes into graph
  state (checkpointable).
- ``GateChecks(router, task)``: a policy gate's checks of proposed tool calls, each a LangGraph
  task inside a graph run, so a run resumed after a review gets back the verdict a person saw;
  ``Checked`` is what it keeps of one check.
- ``refusal(call, checked, why)``: the error ``ToolMessage`` answering a refused tool call.
- LangSmith, when LangChain tracing is on: ``current_node_run()`` is the run of the node, hook or
  task running now (``None`` with tracing off); ``posting_calls(run)`` posts the engine and model
  calls made in its block as child runs; ``annotate_run(run, *decision_annotations("route",
  decision))`` (or ``check_annotations``) puts the decision on the run before it ends.
"""

from ._gate_checks import Checked, GateChecks, refusal
from ._langsmith import (
    TAG as TRACE_TAG,
)
from ._langsmith import (
    annotate_run,
    check_annotations,
    current_node_run,
    decision_annotations,
    decisions_annotations,
    node_run,
    posting_calls,
)
from ._nodes import decision_record

__all__ = [
    "TRACE_TAG",
    "Checked",
    "GateChecks",
    "annotate_run",
    "check_annotations",
    "current_node_run",
    "decision_annotations",
    "decision_record",
    "decisions_annotations",
    "node_run",
    "posting_calls",
    "refusal",
]
