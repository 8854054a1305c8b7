"""fastslow for ``langchain.agents.create_agent``: the policy gate and the model router as middleware.

Needs the ``langchain`` extra (``pip install 'fastslow[langchain]'``); ``fastslow.graphs`` itself
never imports this package::

    from langchain.agents import create_agent
    from fastslow import build_runtime, get_settings
    from fastslow.graphs.middleware import ModelRouterMiddleware, PolicyGateMiddleware

    runtime = build_runtime(get_settings())
    agent = create_agent(
        frontier_model,
        tools=[...],
        middleware=[
            ModelRouterMiddleware(runtime.router, "support", models={...}, frontier=frontier_model),
            PolicyGateMiddleware(runtime.router, "tool_safety"),
        ],
        checkpointer=saver,
    )
"""

from ._gate import GATE_KEY, PolicyGateMiddleware, PolicyGateState
from ._model_router import FRONTIER, ROUTE_KEY, ModelRouterMiddleware, ModelRouterState
from ._thoughts import without_thoughts

__all__ = [
    "FRONTIER",
    "GATE_KEY",
    "ROUTE_KEY",
    "ModelRouterMiddleware",
    "ModelRouterState",
    "PolicyGateMiddleware",
    "PolicyGateState",
    "without_thoughts",
]
