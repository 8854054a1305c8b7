"""The tool loop an engine runs inside one ``complete`` call when it is given a ``tool_runner``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from fastslow.router import EngineError
from fastslow.router.engine_api import ChatResult, Deadline, ToolRunner, ToolStep, Usage

from ._cost import total_cost

__all__ = ["MAX_TOOL_ROUNDS", "Round", "tool_loop"]

MAX_TOOL_ROUNDS = 8
"""Model turns one call may take before it must have answered without tools."""

Round = Callable[[Sequence[BaseMessage], float], Awaitable[ChatResult]]
"""One model turn: (history, seconds left of the budget) -> its result, thoughts already removed."""


async def tool_loop(
    once: Round, messages: Sequence[BaseMessage], tool_runner: ToolRunner, *, budget_s: float, engine: str
) -> ChatResult:
    """Run model turns and ``tool_runner`` until the model answers without tools, within one budget.

    The history grows with LangChain ``AIMessage``/``ToolMessage`` values holding final content
    only, so nothing the model thought is sent back. Usage and cost add up over every turn.

    Raises:
        EngineError: no final answer after ``MAX_TOOL_ROUNDS`` turns (or whatever ``once`` raises).
    """
    deadline = Deadline(budget_s)
    history = list(messages)
    steps: list[ToolStep] = []
    usage = Usage()
    costs: list[float | None] = []
    for _ in range(MAX_TOOL_ROUNDS):
        result = await once(history, deadline.remaining)
        usage += result.usage
        costs.append(result.cost_usd)
        if not result.tool_calls:
            return replace(result, steps=tuple(steps), usage=usage, cost_usd=total_cost(costs))
        history.append(
            AIMessage(
                content=result.content,
                tool_calls=[{"id": c.id, "name": c.name, "args": dict(c.args)} for c in result.tool_calls],
            )
        )
        for call in result.tool_calls:
            outcome = await tool_runner(call)
            steps.append(ToolStep(call=call, outcome=outcome))
            history.append(
                ToolMessage(
                    content=outcome.content,
                    tool_call_id=call.id,
                    name=call.name,
                    status="error" if outcome.is_error else "success",
                )
            )
    raise EngineError(f"no final answer after {MAX_TOOL_ROUNDS} tool rounds", engine=engine)
