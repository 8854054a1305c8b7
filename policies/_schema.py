"""The policy file's schema: pydantic models at the trust boundary, nothing else.

These models only check shape, types and ranges; ``_convert`` turns a validated file into the
router's frozen dataclasses. Every model forbids unknown keys and names the closest allowed one.
Task kinds and question types are discriminated unions on ``kind`` and ``type``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, Self, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from fastslow.router import EngineName, OnFailure, installed_engines

from ._base import ExampleList, NoulExamples, Prob, Strict, Text, check_name, check_names, suggest
from ._questions import (
    ChoiceQuestionModel,
    ChoiceRuleModel,
    NoulQuestionModel,
    NoulRuleModel,
    QuestionModel,
    RuleModel,
    ScoreQuestionModel,
    bare_question,
)

__all__ = [
    "ENGINE_NAMES",
    "NONE_DESCRIPTION",
    "CalibrationModel",
    "CheckModel",
    "ChoiceQuestionModel",
    "ChoiceRuleModel",
    "ClassifyModel",
    "CommonModel",
    "EgressModel",
    "EngineOptionsModel",
    "FitRecordModel",
    "FittedModel",
    "LearnModel",
    "NoulQuestionModel",
    "NoulRuleModel",
    "OpenEndedModel",
    "PlattModel",
    "PolicyFile",
    "QuestionCalibrationModel",
    "QuestionModel",
    "RouteModel",
    "RouteTaskModel",
    "RuleModel",
    "ScoreQuestionModel",
    "StickyModel",
    "TaskEgressModel",
    "TaskModel",
    "ThresholdsModel",
    "suggest",
]

ENGINE_NAMES: tuple[str, ...] = get_args(EngineName)
"""The shipped engines; a policy may also name an installed plugin's (``installed_engines()``)."""
NONE_DESCRIPTION = "None of the other routes fits"


class EngineOptionsModel(Strict):
    """Per-call settings for the System-1 engine (``fastslow.router.ReadOptions``)."""

    samples: int | Literal["auto"] | None = None
    steps: int | None = Field(default=None, ge=1, le=8)
    think: int = Field(default=0, ge=0)
    seed: int | None = None
    timeout_s: float | None = Field(default=None, gt=0.0)

    @field_validator("samples", mode="before")
    @classmethod
    def _samples(cls, value: Any) -> Any:
        # Checked before the union so one clear message replaces one error per union member.
        if (
            value is None
            or value == "auto"
            or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 32)
        ):
            return value
        raise PydanticCustomError(
            "samples", "samples must be an integer from 1 to 32 or 'auto', not {value}", {"value": repr(value)}
        )


class ThresholdsModel(Strict):
    min_confidence: Prob = 0.0
    min_margin: Prob = 0.0
    min_label_mass: Prob | None = None
    require_argmax_is_label: bool = False
    min_agreement: Prob | None = None


class PlattModel(Strict):
    """``platt: {a, b}``: the top probability ``c`` becomes ``sigmoid(a * logit(c) + b)``."""

    a: float = Field(gt=0.0, allow_inf_nan=False)
    b: float = Field(default=0.0, allow_inf_nan=False)


_ISOTONIC_SHAPE = "a list of [confidence, calibrated] pairs, such as [[0.3, 0.2], [0.9, 0.95]]"


def _isotonic(value: Any) -> Any:
    """``isotonic:`` points, checked here so that each mistake names its point (and so its line)."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) < 2:
        what = f"{len(value)} point" if isinstance(value, list) else repr(value)
        ctx = {"shape": _ISOTONIC_SHAPE, "what": what}
        raise PydanticCustomError("isotonic", "isotonic is {shape} (at least 2), not {what}", ctx)
    points: list[tuple[float, float]] = []
    for i, point in enumerate(value):
        at = {"at": (i,), "i": i, "point": repr(point)}
        numbers = isinstance(point, list) and len(point) == 2
        if not numbers or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in point):
            raise PydanticCustomError(
                "isotonic", "isotonic point {i} must be a pair [confidence, calibrated], not {point}", at
            )
        x, y = float(point[0]), float(point[1])
        if not (0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
            raise PydanticCustomError("isotonic", "isotonic point {i} {point} must lie in [0, 1]", at)
        if points and x <= points[-1][0]:
            raise PydanticCustomError(
                "isotonic",
                "isotonic confidences must increase: point {i} {point} does not come after {prev}",
                {**at, "prev": points[-1][0]},
            )
        if points and y < points[-1][1]:
            raise PydanticCustomError(
                "isotonic",
                "isotonic values must not decrease: point {i} {point} maps below {prev}",
                {**at, "prev": points[-1][1]},
            )
        points.append((x, y))
    return points


class _ConfidenceMapFields(Strict):
    platt: PlattModel | None = None
    isotonic: Annotated[list[tuple[float, float]] | None, BeforeValidator(_isotonic)] = None
    """Confidence -> calibrated points: confidences increasing, values non-decreasing, all in [0, 1]."""

    @model_validator(mode="after")
    def _one_map(self) -> Self:
        if self.platt is not None and self.isotonic is not None:
            raise PydanticCustomError(
                "two_maps", "give platt or isotonic, not both: one map of the confidence", {"at": ("isotonic",)}
            )
        return self


class QuestionCalibrationModel(_ConfidenceMapFields):
    """A question's own calibration: it replaces the task's (temperature and map) for that question."""

    temperature: float = Field(gt=0.0)


class CalibrationModel(_ConfidenceMapFields):
    temperature: float = Field(default=1.0, gt=0.0)
    questions: dict[str, QuestionCalibrationModel] = Field(default_factory=dict)
    """A question's (or rule's) own temperature and map, where ``fastslow calibrate`` fitted one."""


class FitRecordModel(BaseModel):
    """What ``fastslow calibrate`` or ``fastslow tune`` fitted, on what, for which engine (``docs/tuning.md``).

    Written by the tools: its figures are free-form; what the loader compares is checked.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    by: str
    date: str
    engine: str | None = None
    model: str | None = None


class FittedModel(Strict):
    thresholds: FitRecordModel | None = None
    calibration: FitRecordModel | None = None
    bands: FitRecordModel | None = None


def _learn(value: Any) -> Any:
    if value is True:
        return {}
    return None if value is False else value


LearnSource = Literal["system2", "outcomes"]


def _all_sources() -> list[LearnSource]:
    return ["system2", "outcomes"]


class LearnModel(Strict):
    """``learn:`` in a route or classification task: System 2's answers and recorded outcomes become examples."""

    sources: list[LearnSource] = Field(default_factory=_all_sources, min_length=1)
    max_examples: int = Field(default=1000, ge=1, le=20_000)
    max_text_chars: int = Field(default=2000, ge=16, le=20_000)
    retrain_after: int = Field(default=20, ge=1, le=10_000)
    tenants: list[str] | None = Field(default=None, min_length=1)


class TaskEgressModel(Strict):
    _key_hints: ClassVar[dict[str, str]] = {
        "allowed_base_urls": "; the allow-list is the file's top-level egress.allowed_base_urls"
    }

    local_only: bool = False


class CommonModel(Strict):
    """Fields every task has; also the shape of the file's ``defaults``. ``None`` means "not set"."""

    _key_hints: ClassVar[dict[str, str]] = {"learn": "; learn is set per route or classification task"}

    engine: str | None = Field(default=None, examples=[*ENGINE_NAMES])
    """A shipped engine or an installed plugin's (``fastslow.router.installed_engines``)."""
    engine_options: EngineOptionsModel | None = None
    escalate_to: str | None = None
    thresholds: ThresholdsModel | None = None
    calibration: CalibrationModel | None = None
    on_failure: OnFailure | None = None
    egress: TaskEgressModel | None = None
    store_state: bool | None = None
    debug_thoughts: bool | None = None
    mode: Literal["live", "shadow"] | None = None
    """``shadow``: System 1 is logged beside the incumbent, which decides (docs/tuning.md)."""
    audit_rate: Prob | None = None
    """Share of System 1's kept decisions marked for labelling (the audit sample, docs/tuning.md)."""

    @field_validator("engine", mode="before")
    @classmethod
    def _engine(cls, value: object) -> object:
        # Plugins' names come from the installed distributions' metadata; none of their code is loaded.
        if isinstance(value, str) and value not in ENGINE_NAMES and value not in (installed := installed_engines()):
            raise PydanticCustomError(
                "engine",
                "unknown engine {value}; expected one of the installed engines: {names}{hint}",
                {"value": repr(value), "names": ", ".join(installed), "hint": suggest(value, installed)},
            )
        return value

    @field_validator("escalate_to")
    @classmethod
    def _model_ref(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z][\w.-]*:\S+", value):
            raise PydanticCustomError(
                "model_ref",
                "escalate_to must be 'provider:model', such as 'openai:gpt-5.5' or 'anthropic:claude-sonnet-4-6'; "
                "not {value}",
                {"value": repr(value)},
            )
        return value


class RouteModel(Strict):
    description: Text | None = None
    examples: ExampleList = Field(default_factory=list)


def _route(value: Any) -> Any:
    if isinstance(value, str):
        return {"description": value}
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PydanticCustomError(
            "route",
            "a route is a description or a mapping with description and examples, not {value}",
            {"value": repr(value)},
        )
    return value


def _open_ended(value: Any) -> Any:
    if value is True:
        return {}
    return None if value is False else value


def _sticky(value: Any) -> Any:
    return {"enabled": value} if isinstance(value, bool) else value


class OpenEndedModel(Strict):
    threshold: Prob = 0.5
    instructions: Text | None = None
    examples: NoulExamples = Field(default_factory=dict)


class StickyModel(Strict):
    enabled: bool = True
    min_change_confidence: Prob = 0.85


class RouteTaskModel(CommonModel):
    kind: Literal["route"]
    fitted: FittedModel | None = None
    learn: Annotated[LearnModel | None, BeforeValidator(_learn)] = None
    instructions: Text | None = None
    routes: dict[str, Annotated[RouteModel, BeforeValidator(_route)]] = Field(min_length=1)
    none_of_these: str | None = None
    open_ended: Annotated[OpenEndedModel | None, BeforeValidator(_open_ended)] = None
    context_turns: int = Field(default=2, ge=0)
    system1_context: bool = False
    sticky: Annotated[StickyModel, BeforeValidator(_sticky)] = Field(default_factory=StickyModel)

    @field_validator("routes")
    @classmethod
    def _route_names(cls, value: dict[str, RouteModel]) -> dict[str, RouteModel]:
        check_names(value, "route")
        return value

    @field_validator("none_of_these")
    @classmethod
    def _none_name(cls, value: str | None) -> str | None:
        return None if value is None else check_name(value, "route")

    @model_validator(mode="after")
    def _enough_routes(self) -> Self:
        names = set(self.routes) | ({self.none_of_these} if self.none_of_these else set())
        if len(names) < 2:
            raise PydanticCustomError(
                "few_routes", "a route task needs at least 2 routes (none_of_these counts)", {"at": ("routes",)}
            )
        return self


class ClassifyModel(CommonModel):
    kind: Literal["classify"]
    fitted: FittedModel | None = None
    learn: Annotated[LearnModel | None, BeforeValidator(_learn)] = None
    questions: dict[str, Annotated[QuestionModel, BeforeValidator(bare_question)]] = Field(min_length=1)

    @field_validator("questions")
    @classmethod
    def _question_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_names(value, "question")
        return value


class CheckModel(CommonModel):
    _key_hints: ClassVar[dict[str, str]] = {
        "learn": (
            "; policy checks do not learn from escalations (an allow learned from one wrong answer would"
            " let such calls through unescalated): add examples to the rule instead"
        )
    }

    kind: Literal["check"]
    fitted: FittedModel | None = None
    rules: dict[str, Annotated[RuleModel, BeforeValidator(bare_question)]] = Field(min_length=1)
    on_oversize: Literal["review", "deny"] = "review"
    """What a state longer than the engine reads of it gets, when no rule denies it."""
    system1_context: bool = False

    @field_validator("rules")
    @classmethod
    def _rule_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_names(value, "rule")
        return value


TaskModel = Annotated[RouteTaskModel | ClassifyModel | CheckModel, Field(discriminator="kind")]


class EgressModel(Strict):
    _key_hints: ClassVar[dict[str, str]] = {"local_only": "; local_only is set per task (or in defaults) under egress:"}

    allowed_base_urls: list[str] = Field(default_factory=list)
    """Self-hosted base URLs that ``local_only`` tasks may escalate to."""

    @field_validator("allowed_base_urls")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not re.fullmatch(r"https?://[^/\s:]+(:\d+)?(/\S*)?", url):
                raise PydanticCustomError("base_url", "{url} is not an http(s) base URL", {"url": repr(url)})
        return [url.rstrip("/") for url in value]


class PolicyFile(Strict):
    """A whole policy file. ``PolicyFile.model_json_schema()`` gives a JSON Schema for editors."""

    version: Literal[1] = 1
    defaults: CommonModel = Field(default_factory=CommonModel)
    egress: EgressModel = Field(default_factory=EgressModel)
    tasks: dict[str, TaskModel] = Field(min_length=1)

    @field_validator("tasks")
    @classmethod
    def _task_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_names(value, "task")
        return value
