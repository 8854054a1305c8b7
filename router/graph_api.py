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
"""

from ._gate_checks import Checked, GateChecks, refusal
from ._nodes import decision_record

__all__ = ["Checked", "GateChecks", "decision_record", "refusal"]
