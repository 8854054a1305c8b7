"""Questions and rules as a policy file writes them: ``noul`` (the default), ``choice`` and ``score``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import Discriminator, Field, Tag, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ._base import ChoiceExamples, NoulExamples, Prob, Strict, Text, check_names, known_options, suggest

__all__ = [
    "ChoiceQuestionModel",
    "ChoiceRuleModel",
    "NoulQuestionModel",
    "NoulRuleModel",
    "QuestionModel",
    "RuleModel",
    "ScoreQuestionModel",
    "bare_question",
]

_YES_NO_HINT = "; yes:/no: describe a yes/no question (type: noul)"


class NoulQuestionModel(Strict):
    """A yes/no question; ``yes``/``no`` optionally describe what each answer means."""

    _key_hints: ClassVar[dict[str, str]] = {
        "criteria": "; a yes/no question describes its outcomes with yes: and no:, or set type: choice",
        "levels": "; levels belong to type: score",
    }

    type: Literal["noul"] = "noul"
    instructions: Text | None = None
    yes: Text | None = None
    no: Text | None = None
    examples: NoulExamples = Field(default_factory=dict)

    @model_validator(mode="after")
    def _has_text(self) -> Self:
        if self.instructions is None and self.yes is None and self.no is None:
            raise PydanticCustomError("noul_text", "a yes/no question needs instructions (or yes/no descriptions)")
        return self


class ChoiceQuestionModel(Strict):
    """Pick one of named options; ``criteria`` maps option name -> description (``~`` for none)."""

    _key_hints: ClassVar[dict[str, str]] = {
        "levels": "; levels belong to type: score",
        "yes": _YES_NO_HINT,
        "no": _YES_NO_HINT,
    }

    type: Literal["choice"]
    instructions: Text | None = None
    criteria: dict[str, Text | None] = Field(min_length=2)
    examples: ChoiceExamples = Field(default_factory=dict)

    @field_validator("criteria")
    @classmethod
    def _option_names(cls, value: dict[str, str | None]) -> dict[str, str | None]:
        check_names(value, "option")
        return value

    @model_validator(mode="after")
    def _example_options(self) -> Self:
        known_options(self.examples, list(self.criteria))
        return self


class ScoreQuestionModel(Strict):
    """Rate on ordered levels, lowest first; examples are keyed by level index or level text."""

    _key_hints: ClassVar[dict[str, str]] = {"criteria": "; a score lists its levels under levels:, lowest first"}

    type: Literal["score"]
    instructions: Text | None = None
    levels: list[Text] = Field(min_length=2)
    examples: ChoiceExamples = Field(default_factory=dict)

    @model_validator(mode="after")
    def _example_levels(self) -> Self:
        known_options(self.examples, [str(i) for i in range(len(self.levels))] + list(self.levels))
        return self


def bare_question(value: Any) -> Any:
    # ``name: Is this ...?`` is shorthand for a yes/no question with those instructions.
    return {"instructions": value} if isinstance(value, str) else value


def _question_type(value: Any) -> str:
    # A question or rule without ``type`` is yes/no; an explicit one picks the member.
    raw = value.get("type", "noul") if isinstance(value, Mapping) else getattr(value, "type", "noul")
    return str(raw)


QuestionModel = Annotated[
    Annotated[NoulQuestionModel, Tag("noul")]
    | Annotated[ChoiceQuestionModel, Tag("choice")]
    | Annotated[ScoreQuestionModel, Tag("score")],
    Discriminator(_question_type),
]


def _check_band(rule: NoulRuleModel | ChoiceRuleModel, options: list[str]) -> None:
    if rule.allow_at > rule.deny_at:
        raise PydanticCustomError(
            "band",
            "allow_at ({allow_at}) is above deny_at ({deny_at}); need allow_at <= deny_at",
            {"allow_at": rule.allow_at, "deny_at": rule.deny_at, "at": ("allow_at",)},
        )
    if rule.violation not in options:
        raise PydanticCustomError(
            "violation",
            "violation {violation} is not an option ({options}){hint}",
            {
                "violation": repr(rule.violation),
                "options": ", ".join(options),
                "hint": suggest(rule.violation, options),
                "at": ("violation",),
            },
        )


class NoulRuleModel(NoulQuestionModel):
    """A yes/no policy rule: P(``violation``) >= ``deny_at`` denies, <= ``allow_at`` allows, else review."""

    violation: Literal["yes", "no"] = "yes"
    deny_at: Prob = 0.8
    allow_at: Prob = 0.2
    background: bool = True
    """Learn against the shipped background of ordinary text as well as the rule's own "no"
    examples; turn off for a rule that ordinary text can break (such as "is this in French?")."""

    @model_validator(mode="after")
    def _band(self) -> Self:
        _check_band(self, ["yes", "no"])
        return self


class ChoiceRuleModel(ChoiceQuestionModel):
    """A policy rule over named options; ``violation`` names the option that breaks the rule."""

    violation: Text = "yes"
    deny_at: Prob = 0.8
    allow_at: Prob = 0.2

    @model_validator(mode="after")
    def _band(self) -> Self:
        _check_band(self, list(self.criteria))
        return self


RuleModel = Annotated[
    Annotated[NoulRuleModel, Tag("noul")] | Annotated[ChoiceRuleModel, Tag("choice")],
    Discriminator(_question_type),
]
