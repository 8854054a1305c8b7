"""LangSmith: each fastslow node's decision on its own LangChain run, its engine calls as child runs.

LangGraph hands a node the config of the node's run: ``config["callbacks"]`` is a callback manager
whose ``parent_run_id`` is that run, and when LangChain tracing is on (``LANGSMITH_TRACING=true``)
one of its handlers is a ``LangChainTracer`` holding the run, a langsmith ``RunTree``, in its
``run_map`` until the run ends. The tracer posts the run when it starts and patches it, whole,
when it ends: the end patch carries the run's ``extra.metadata`` and ``tags`` as they are then.
So a node writes its decision onto that ``RunTree`` before it returns, and LangSmith receives it
with the run's end (or its one combined post, when both go in one batch). Each System-1 and
System-2 call made meanwhile (``observe_calls``, fed by the traced engine wrappers) is posted as
a finished ``llm`` child run of it, with its own start and end time.

With tracing off there is no tracer among the handlers: ``node_run`` returns ``None`` after a
few dictionary lookups, and nothing else is done (no observer, no metadata built, nothing sent).

What a run carries follows the spans' rule (``fastslow.router._tracing``), with the same names:
the decision's id, system, reason, confidence, outcome or verdict, the task and policy version;
never a thought, and the state text only where the router opts in (``trace_state_text``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Final, TypeAlias

from langchain_core.callbacks import BaseCallbackManager
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import var_child_runnable_config
from langchain_core.tracers.langchain import LangChainTracer
from langsmith.run_trees import RunTree

from ._decisions import Decision
from ._traced import CallRecord, observe_calls
from ._tracing import STATE_TEXT_CHARS, Attr, GenAI

__all__ = [
    "CHECKS_KEY",
    "DECISIONS_KEY",
    "TAG",
    "Annotations",
    "annotate_run",
    "check_annotations",
    "current_node_run",
    "decision_annotations",
    "decisions_annotations",
    "node_run",
    "posting_calls",
]

TAG: Final = "fastslow"
"""Every run a fastslow node annotates carries this tag (and ``fastslow:<operation>``, ...)."""

DECISIONS_KEY: Final = "fastslow.decisions"
"""Metadata: one entry per question of a classification (question -> its decision's fields)."""

CHECKS_KEY: Final = "fastslow.checks"
"""Metadata: one entry per checked tool call of a policy gate (its verdict, rule and decision ids)."""


Annotations: TypeAlias = tuple[dict[str, Any], list[str]]
"""Metadata and tags for one run."""


def node_run(config: RunnableConfig | None) -> RunTree | None:
    """The LangSmith run of the runnable ``config`` was handed to; ``None`` when LangChain tracing is off."""
    callbacks = config.get("callbacks") if config else None
    if not isinstance(callbacks, BaseCallbackManager) or callbacks.parent_run_id is None:
        return None
    for handler in callbacks.handlers:
        if isinstance(handler, LangChainTracer):
            run = handler.run_map.get(str(callbacks.parent_run_id))
            # A run the tracer won't send (``tracing_context(enabled=False)``) is left alone.
            if isinstance(run, RunTree) and not run.extra.get("__disabled"):
                return run
    return None


def current_node_run() -> RunTree | None:
    """``node_run`` of the config LangGraph runs the current node, hook or task under; ``None`` outside one."""
    # What ``langgraph.config.get_config`` reads, without the exception it raises outside a run.
    return node_run(var_child_runnable_config.get())


def annotate_run(run: RunTree, metadata: Mapping[str, Any], tags: Iterable[str]) -> None:
    """Add ``metadata`` and ``tags`` to ``run`` before it ends, so its end patch sends them."""
    # New containers, never updated in place: the tracer's metadata dict may be the callback
    # manager's own, shared with every run the node's config starts after this one.
    run.extra["metadata"] = {**(run.extra.get("metadata") or {}), **metadata}
    old = list(run.tags or [])
    run.tags = old + [tag for tag in dict.fromkeys(tags) if tag not in old]


@contextmanager
def posting_calls(run: RunTree | None, *, state_text: str | None = None) -> Iterator[None]:
    """Within the block, post every traced engine and model call as a finished child run of ``run``.

    ``state_text`` (only where the router opts in) becomes a System-1 child's input; without it a
    child's inputs name the call, never what it read. Nothing happens when ``run`` is ``None``.
    """
    if run is None:
        yield
        return

    def post(record: CallRecord) -> None:
        try:
            _child(run, record, state_text).post()
        except Exception:  # tracing must never fail a decision; the client logs its own failures
            return

    with observe_calls(post):
        yield


def _when(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC)


def _child(parent: RunTree, record: CallRecord, state_text: str | None) -> RunTree:
    model = record.response_model or record.request_model
    # Named as the spans are, by what was asked for: a System-1 engine, a System-2 model.
    asked = record.request_model or model if record.system == 2 else ""
    name = f"system{record.system} {asked or record.engine}"
    inputs: dict[str, Any] = {"engine": record.engine, "operation": record.operation}
    if record.request_model:
        inputs["model"] = record.request_model
    if state_text is not None and record.system == 1:
        inputs["state"] = state_text[:STATE_TEXT_CHARS]
    metadata: dict[str, Any] = {
        "ls_provider": record.provider,
        "ls_model_name": model or record.engine,
        "fastslow.system": record.system,
        Attr.ENGINE: record.engine,
        GenAI.OPERATION_NAME: record.operation,
        GenAI.PROVIDER_NAME: record.provider,
    }
    if record.request_model:
        metadata[GenAI.REQUEST_MODEL] = record.request_model
    if record.response_model:
        metadata[GenAI.RESPONSE_MODEL] = record.response_model
    usage: dict[str, Any] = {}
    if record.usage.input_tokens or record.usage.output_tokens:
        usage = {
            "input_tokens": record.usage.input_tokens,
            "output_tokens": record.usage.output_tokens,
            "total_tokens": record.usage.input_tokens + record.usage.output_tokens,
        }
    if record.cost_usd is not None:
        usage["total_cost"] = record.cost_usd
        metadata[Attr.COST_USD] = record.cost_usd
    if usage:
        metadata["usage_metadata"] = usage
    outputs: dict[str, Any] = {"model": record.response_model} if record.response_model else {}
    if usage:
        outputs["usage_metadata"] = usage
    # The child inherits the parent's metadata as it is now (LangGraph's keys): posted while the
    # node decides, it never carries the decision, which goes onto the node's run afterwards.
    return parent.create_child(
        name,
        "llm",
        inputs=inputs,
        outputs=outputs,
        error=record.error or None,
        start_time=_when(record.started_ns),
        end_time=_when(record.ended_ns),
        tags=[TAG, f"{TAG}:system{record.system}"],
        extra={"metadata": metadata},
    )


# -- what a decision puts on its run ----------------------------------------------------------------


def _fields(decision: Decision) -> dict[str, Any]:
    fields: dict[str, Any] = {
        Attr.DECISION_ID: decision.id,
        Attr.SYSTEM: decision.system,
        Attr.REASON: decision.reason,
        Attr.CONFIDENCE: round(decision.confidence, 6),
        Attr.ESCALATED: decision.escalate,
    }
    if decision.outcome is not None:
        fields[Attr.OUTCOME] = decision.outcome
    if decision.verdict is not None:
        fields[Attr.VERDICT] = decision.verdict
    if decision.engine:
        fields[Attr.ENGINE] = decision.engine
    if decision.cost_usd is not None:
        fields[Attr.COST_USD] = decision.cost_usd
    return fields


def _tags(operation: str, task: str, decisions: Iterable[Decision]) -> list[str]:
    tags = [TAG, f"{TAG}:{operation}", f"{TAG}:task:{task}"]
    for decision in decisions:
        tags += [f"{TAG}:system{decision.system}", f"{TAG}:reason:{decision.reason}"]
        if decision.verdict is not None:
            tags.append(f"{TAG}:verdict:{decision.verdict}")
        elif decision.outcome is not None:
            tags.append(f"{TAG}:{'route' if operation == 'route' else 'outcome'}:{decision.outcome}")
        if decision.escalate:
            tags.append(f"{TAG}:escalated")
    return list(dict.fromkeys(tags))


def decision_annotations(operation: str, decision: Decision) -> Annotations:
    """A route decision (or any single one) as run metadata and tags."""
    metadata = {
        Attr.OPERATION: operation,
        Attr.TASK: decision.task,
        Attr.QUESTION: decision.question,
        Attr.POLICY_VERSION: decision.policy_version,
        **_fields(decision),
    }
    if decision.examples_version:
        metadata[Attr.EXAMPLES_VERSION] = decision.examples_version
    return metadata, _tags(operation, decision.task, [decision])


def decisions_annotations(operation: str, task: str, decisions: Mapping[str, Decision]) -> Annotations:
    """A classification's decisions (question -> decision) as run metadata and tags."""
    first = next(iter(decisions.values()), None)
    metadata: dict[str, Any] = {
        Attr.OPERATION: operation,
        Attr.TASK: task,
        Attr.POLICY_VERSION: first.policy_version if first is not None else "",
        DECISIONS_KEY: {name: _fields(decision) for name, decision in decisions.items()},
    }
    return metadata, _tags(operation, task, decisions.values())


def check_annotations(task: str, checks: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> Annotations:
    """A policy gate's checks, ``(tool call, Checked)`` pairs, as run metadata and tags.

    Each entry names the tool (never its arguments), the verdict, the rule that decided it, that
    rule's decision (id, system, reason, confidence) and every rule's decision id. With one call,
    its fields are also the run's own (``fastslow.decision.verdict``, ...), as a route's are.
    """
    entries = [_check_entry(call, checked) for call, checked in checks]
    metadata: dict[str, Any] = {Attr.OPERATION: "check", Attr.TASK: task, CHECKS_KEY: entries}
    if checks:
        metadata[Attr.POLICY_VERSION] = checks[0][1].get("policy_version", "")
    if len(entries) == 1:
        metadata.update({k: v for k, v in entries[0].items() if k.startswith("fastslow.")})
    tags = [TAG, f"{TAG}:check", f"{TAG}:task:{task}"]
    for entry in entries:
        tags.append(f"{TAG}:verdict:{entry[Attr.VERDICT]}")
        if Attr.SYSTEM in entry:
            tags += [f"{TAG}:system{entry[Attr.SYSTEM]}", f"{TAG}:reason:{entry[Attr.REASON]}"]
    return metadata, list(dict.fromkeys(tags))


def _check_entry(call: Mapping[str, Any], checked: Mapping[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "tool_call_id": call.get("id"),
        "tool": call.get("name"),
        Attr.VERDICT: checked["verdict"],
        Attr.RULE: checked["rule"],
        Attr.CONFIDENCE: round(float(checked["confidence"]), 6),
    }
    # Checks checkpointed before these keys existed have only the fields above.
    for key, name in (("decision_id", Attr.DECISION_ID), ("system", Attr.SYSTEM), ("reason", Attr.REASON)):
        if checked.get(key) is not None:
            entry[name] = checked[key]
    if checked.get("decision_ids"):
        entry["fastslow.check.decision_ids"] = dict(checked["decision_ids"])
    return entry
