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

from fastslow.router import EngineName, OnFailure

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
    "NoulQuestionModel",
    "NoulRuleModel",
    "OpenEndedModel",
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


class QuestionCalibrationModel(Strict):
    temperature: float = Field(gt=0.0)


class CalibrationModel(Strict):
    temperature: float = Field(default=1.0, gt=0.0)
    questions: dict[str, QuestionCalibrationModel] = Field(default_factory=dict)
    """A question's (or rule's) own temperature, where ``fastslow calibrate`` fitted one."""


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


class TaskEgressModel(Strict):
    _key_hints: ClassVar[dict[str, str]] = {
        "allowed_base_urls": "; the allow-list is the file's top-level egress.allowed_base_urls"
    }

    local_only: bool = False


class CommonModel(Strict):
    """Fields every task has; also the shape of the file's ``defaults``. ``None`` means "not set"."""

    engine: EngineName | None = None
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
        # Before the type check, so that a misspelt name gets a did-you-mean, not a list of literals.
        if isinstance(value, str) and value not in ENGINE_NAMES:
            raise PydanticCustomError(
                "engine",
                "unknown engine {value}; expected one of {names}{hint}",
                {"value": repr(value), "names": ", ".join(ENGINE_NAMES), "hint": suggest(value, ENGINE_NAMES)},
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
    instructions: Text | None = None
    routes: dict[str, Annotated[RouteModel, BeforeValidator(_route)]] = Field(min_length=1)
    none_of_these: str | None = None
    open_ended: Annotated[OpenEndedModel | None, BeforeValidator(_open_ended)] = None
    context_turns: int = Field(default=2, ge=0)
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
    questions: dict[str, Annotated[QuestionModel, BeforeValidator(bare_question)]] = Field(min_length=1)

    @field_validator("questions")
    @classmethod
    def _question_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_names(value, "question")
        return value


class CheckModel(CommonModel):
    kind: Literal["check"]
    fitted: FittedModel | None = None
    rules: dict[str, Annotated[RuleModel, BeforeValidator(bare_question)]] = Field(min_length=1)
    on_oversize: Literal["review", "deny"] = "review"
    """What a state longer than the engine reads of it gets, when no rule denies it."""

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
