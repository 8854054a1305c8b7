"""Validated policy-file models -> the router's frozen dataclasses.

``defaults`` merge under every task here (task values win, block by block and key by key), and
the example requirement is checked: a question kind that the task's engine cannot answer well
without examples must have them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import fields, replace
from typing import Any, TypeVar

from pydantic import BaseModel

from fastslow.router import (
    Calibration,
    CheckAction,
    CheckTask,
    Choice,
    ClassifyTask,
    ConfidenceMap,
    Egress,
    Examples,
    Isotonic,
    Learn,
    Noul,
    OnFailure,
    OpenEnded,
    Platt,
    PolicySet,
    Question,
    ReadOptions,
    Route,
    RouteTask,
    Rule,
    Score,
    Sticky,
    Task,
    TaskCommon,
    Thresholds,
)

from ._questions import NoulRuleModel
from ._schema import (
    ENGINE_NAMES,
    NONE_DESCRIPTION,
    CalibrationModel,
    CheckModel,
    ChoiceQuestionModel,
    ClassifyModel,
    CommonModel,
    EngineOptionsModel,
    FittedModel,
    LearnModel,
    NoulQuestionModel,
    PolicyFile,
    QuestionCalibrationModel,
    RouteTaskModel,
    ScoreQuestionModel,
    TaskEgressModel,
    ThresholdsModel,
)

__all__ = ["NeedsExamples", "PolicyProblem", "to_policy_set"]

NeedsExamples = Callable[[str | None], frozenset[str]]
"""Engine name -> the question kinds (``noul``, ``choice``, ``score``) it needs examples for."""

Loc = tuple[str | int, ...]
_M = TypeVar("_M", bound=BaseModel)
# The router's own wording of the routing question, used when the file gives none.
_ROUTE_INSTRUCTIONS = RouteTask(name="").instructions
_KIND_WORDS = {"noul": "yes/no", "choice": "choice", "score": "score"}


class PolicyProblem(Exception):
    """A problem found after schema validation, located by its key path in the file."""

    def __init__(self, loc: Loc, message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message


def _block(task_value: _M | None, default_value: _M | None, empty: type[_M]) -> _M:
    """Merge one nested block: the keys the task sets win over the defaults' block."""
    if task_value is None:
        return default_value if default_value is not None else empty()
    if default_value is None:
        return task_value
    return default_value.model_copy(update={k: getattr(task_value, k) for k in task_value.model_fields_set})


def _common(name: str, task: CommonModel, defaults: CommonModel, on_failure: OnFailure) -> TaskCommon:
    options = _block(task.engine_options, defaults.engine_options, EngineOptionsModel)
    thresholds = _block(task.thresholds, defaults.thresholds, ThresholdsModel)
    calibration = _calibration_block(task.calibration, defaults.calibration)
    egress = _block(task.egress, defaults.egress, TaskEgressModel)
    store_state = task.store_state if task.store_state is not None else defaults.store_state
    debug_thoughts = task.debug_thoughts if task.debug_thoughts is not None else defaults.debug_thoughts
    return TaskCommon(
        name=name,
        engine=task.engine or defaults.engine,
        read=ReadOptions(
            samples=options.samples,
            steps=options.steps,
            think=options.think,
            seed=options.seed,
            timeout_s=options.timeout_s,
        ),
        escalate_to=task.escalate_to or defaults.escalate_to,
        thresholds=Thresholds(
            min_confidence=thresholds.min_confidence,
            min_margin=thresholds.min_margin,
            min_label_mass=thresholds.min_label_mass,
            require_argmax_is_label=thresholds.require_argmax_is_label,
            min_agreement=thresholds.min_agreement,
        ),
        calibration=Calibration(
            temperature=calibration.temperature,
            confidence_map=_confidence_map(calibration),
            questions={
                q: Calibration(temperature=c.temperature, confidence_map=_confidence_map(c))
                for q, c in calibration.questions.items()
            },
        ),
        on_failure=task.on_failure or defaults.on_failure or on_failure,
        egress=Egress(local_only=egress.local_only),
        store_state=bool(store_state),
        debug_thoughts=bool(debug_thoughts),
        fitted=_fitted(getattr(task, "fitted", None)),
        audit_rate=_first(task.audit_rate, defaults.audit_rate, 0.0),
        mode=task.mode or defaults.mode or "live",
    )


def _calibration_block(task: CalibrationModel | None, defaults: CalibrationModel | None) -> CalibrationModel:
    """``_block``, except that a map the task sets (platt or isotonic, or null) replaces the defaults' map."""
    merged = _block(task, defaults, CalibrationModel)
    if task is not None and {"platt", "isotonic"} & task.model_fields_set:
        merged = merged.model_copy(update={"platt": task.platt, "isotonic": task.isotonic})
    return merged


def _confidence_map(model: CalibrationModel | QuestionCalibrationModel) -> ConfidenceMap | None:
    if model.platt is not None:
        return Platt(a=model.platt.a, b=model.platt.b)
    if model.isotonic is not None:
        return Isotonic(x=tuple(x for x, _ in model.isotonic), y=tuple(y for _, y in model.isotonic))
    return None


def _first(*values: float | None) -> float:
    return next(v for v in values if v is not None)


def _fitted(model: FittedModel | None) -> dict[str, Mapping[str, Any]]:
    if model is None:
        return {}
    return {
        kind: record.model_dump() for kind in ("thresholds", "calibration", "bands") if (record := getattr(model, kind))
    }


def _check_calibrated(name: str, common: TaskCommon, questions: Iterable[str]) -> None:
    """A temperature for a question the task does not have is a mistake the file must not hide."""
    known = set(questions)
    for q in common.calibration.questions:
        if q not in known:
            raise PolicyProblem(
                ("tasks", name, "calibration", "questions", q),
                f"calibration for {q!r}, which task {name!r} does not have (it has {', '.join(sorted(known))})",
            )


def _common_fields(common: TaskCommon) -> dict[str, Any]:
    # Copies a typed TaskCommon into a kind's constructor, so each kind need not repeat nine keywords.
    return {f.name: getattr(common, f.name) for f in fields(TaskCommon)}


def _examples(raw: Mapping[Any, Sequence[str]], rename: Mapping[str, str] | None = None) -> Examples:
    out: dict[str, tuple[str, ...]] = {}
    for option, texts in raw.items():
        if texts:
            key = (rename or {}).get(option, option)
            out[key] = out.get(key, ()) + tuple(texts)
    return out


def _question(model: NoulQuestionModel | ChoiceQuestionModel | ScoreQuestionModel) -> tuple[Question, Examples]:
    if isinstance(model, NoulQuestionModel):
        return Noul(instructions=model.instructions, yes=model.yes, no=model.no), _examples(model.examples)
    if isinstance(model, ChoiceQuestionModel):
        return Choice(criteria=dict(model.criteria), instructions=model.instructions), _examples(model.examples)
    # Score examples may name a level by its text; the answer is keyed by level index.
    by_text = {level: str(i) for i, level in enumerate(model.levels)}
    return Score(levels=tuple(model.levels), instructions=model.instructions), _examples(model.examples, by_text)


class _ExampleRule:
    """Refuses questions an engine cannot answer well without examples."""

    def __init__(self, needs: NeedsExamples | None, default_engine: str) -> None:
        self._needs = needs
        self.default_engine = default_engine

    def trains_on_examples(self, engine: str | None) -> bool:
        """Whether ``engine`` learns from examples: the engines that need them for some kind are those."""
        return self._needs is None or bool(self._needs(engine or self.default_engine))

    def check(
        self,
        loc: Loc,
        what: str,
        engine: str | None,
        question: Question,
        examples: Examples,
        skip: frozenset[str] = frozenset(),
    ) -> None:
        if self._needs is None:
            return
        name = engine or self.default_engine
        kind = question.kind
        if kind not in self._needs(name):
            return
        missing = [o for o in question.options if o not in skip and not examples.get(o)]
        if not missing:
            return
        words = _KIND_WORDS[kind]
        lacking = (
            "without examples"
            if len(missing) == len(question.options) - len(skip)
            else ("without examples for " + ", ".join(repr(o) for o in missing))
        )
        shape = "{yes: [...], no: [...]}" if kind == "noul" else "for every option"
        other = next((e for e in ("jev", *ENGINE_NAMES) if kind not in self._needs(e)), None)
        alternative = f" or choose an engine such as {other}" if other else ""
        raise PolicyProblem(
            loc,
            f"{what} is a {words} question {lacking}, and the {name} engine is near chance on {words} questions "
            f"without examples; add examples: {shape}{alternative}",
        )


def _route_task(name: str, model: RouteTaskModel, common: TaskCommon, rule: _ExampleRule) -> RouteTask:
    routes = {
        route: Route(name=route, description=r.description, examples=tuple(r.examples))
        for route, r in model.routes.items()
    }
    if model.none_of_these is not None and model.none_of_these not in routes:
        routes[model.none_of_these] = Route(name=model.none_of_these, description=NONE_DESCRIPTION)
    open_ended: OpenEnded | None = None
    if model.open_ended is not None:
        oe = model.open_ended
        if oe.instructions is not None:
            open_ended = OpenEnded(
                question=Noul(instructions=oe.instructions), threshold=oe.threshold, examples=_examples(oe.examples)
            )
        else:
            open_ended = OpenEnded(threshold=oe.threshold, examples=_examples(oe.examples))
        rule.check(
            ("tasks", name, "open_ended"),
            f"open_ended of task {name!r}",
            common.engine,
            open_ended.question,
            open_ended.examples,
        )
    common = replace(common, learn=_learn(name, model.learn, common, rule))
    task = RouteTask(
        **_common_fields(common),
        instructions=model.instructions or _ROUTE_INSTRUCTIONS,
        routes=routes,
        none_option=model.none_of_these,
        open_ended=open_ended,
        context_turns=model.context_turns,
        system1_context=model.system1_context,
        sticky=Sticky(enabled=model.sticky.enabled, min_change_confidence=model.sticky.min_change_confidence),
    )
    skip = frozenset({model.none_of_these}) if model.none_of_these else frozenset()
    rule.check(("tasks", name, "routes"), f"routing task {name!r}", common.engine, task.question, task.examples, skip)
    return task


def _learn(name: str, model: LearnModel | None, common: TaskCommon, rule: _ExampleRule) -> Learn | None:
    if model is None:
        return None
    loc: Loc = ("tasks", name, "learn")
    if not common.store_state:
        # Learning keeps the decided text as an example; a task that keeps only a hash cannot.
        raise PolicyProblem(
            loc, f"task {name!r} learns from escalations, which keeps decided texts: set store_state: true in it"
        )
    if not rule.trains_on_examples(common.engine):
        engine = common.engine or rule.default_engine
        raise PolicyProblem(
            loc, f"task {name!r} learns from escalations, but engine {engine!r} does not train on examples"
        )
    return Learn(
        sources=frozenset(model.sources),
        max_examples=model.max_examples,
        max_text_chars=model.max_text_chars,
        retrain_after=model.retrain_after,
        tenants=frozenset(model.tenants) if model.tenants is not None else None,
    )


def _classify_task(name: str, model: ClassifyModel, common: TaskCommon, rule: _ExampleRule) -> ClassifyTask:
    questions: dict[str, Question] = {}
    examples: dict[str, Examples] = {}
    for qname, qmodel in model.questions.items():
        question, qexamples = _question(qmodel)
        rule.check(
            ("tasks", name, "questions", qname),
            f"question {qname!r} of task {name!r}",
            common.engine,
            question,
            qexamples,
        )
        questions[qname] = question
        if qexamples:
            examples[qname] = qexamples
    common = replace(common, learn=_learn(name, model.learn, common, rule))
    return ClassifyTask(**_common_fields(common), questions=questions, examples=examples)


def _check_task(name: str, model: CheckModel, common: TaskCommon, rule: _ExampleRule) -> CheckTask:
    rules: dict[str, Rule] = {}
    for rname, rmodel in model.rules.items():
        question, rexamples = _question(rmodel)
        assert isinstance(question, (Noul, Choice))  # rule models are noul or choice questions
        rule.check(
            ("tasks", name, "rules", rname), f"rule {rname!r} of task {name!r}", common.engine, question, rexamples
        )
        action = CheckAction(deny_at=rmodel.deny_at, allow_at=rmodel.allow_at, violation=rmodel.violation)
        background = rmodel.background if isinstance(rmodel, NoulRuleModel) else False
        rules[rname] = Rule(name=rname, question=question, action=action, examples=rexamples, background=background)
    return CheckTask(
        **_common_fields(common), rules=rules, on_oversize=model.on_oversize, system1_context=model.system1_context
    )


def to_policy_set(
    doc: PolicyFile,
    *,
    version: str,
    source: str = "",
    needs_examples: NeedsExamples | None = None,
    default_engine: str = "embedded",
) -> PolicySet:
    """Build the router's ``PolicySet`` from a validated file.

    Raises:
        PolicyProblem: a task asks its engine for something it cannot do well (questions without examples).
    """
    rule = _ExampleRule(needs_examples, default_engine)
    tasks: dict[str, Task] = {}
    for name, model in doc.tasks.items():
        if isinstance(model, RouteTaskModel):
            common = _common(name, model, doc.defaults, "escalate")
            _check_calibrated(name, common, [name])
            tasks[name] = _route_task(name, model, common, rule)
        elif isinstance(model, ClassifyModel):
            common = _common(name, model, doc.defaults, "escalate")
            _check_calibrated(name, common, model.questions)
            tasks[name] = _classify_task(name, model, common, rule)
        else:
            # A policy check that cannot be answered denies unless the file says otherwise.
            common = _common(name, model, doc.defaults, "fail_closed")
            _check_calibrated(name, common, model.rules)
            tasks[name] = _check_task(name, model, common, rule)
    return PolicySet(
        tasks=tasks,
        version=version,
        source=source,
        egress_allow=tuple(doc.egress.allowed_base_urls),
        default_escalate_to=doc.defaults.escalate_to,
    )
