"""Building blocks of the policy schema: the strict base model, names, probabilities and examples."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

__all__ = [
    "ChoiceExamples",
    "ExampleList",
    "NoulExamples",
    "Prob",
    "Strict",
    "Text",
    "check_name",
    "check_names",
    "known_options",
    "suggest",
]

# Noul example keys: YAML authors write yes/no, the Jev wire says true/false; both mean the same.
_NOUL_KEYS = {"yes": "yes", "no": "no", "true": "yes", "false": "no", True: "yes", False: "no"}


def suggest(word: str, choices: Any) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices``, or ``""`` when nothing is close."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_name(value: Any, what: str, *, key: bool = False) -> str:
    if not isinstance(value, str) or not value.strip() or ":" in value or "\n" in value:
        # Names end up in metrics labels, decision logs and ``task:question`` keys.
        ctx = {"what": what, "name": repr(value)} | ({"at": (str(value),)} if key else {})
        raise PydanticCustomError("bad_name", "{what} name {name} must be non-empty, without ':' or newlines", ctx)
    return value


def _text(value: Any) -> Any:
    # An example such as ``- 404`` reaches us as an int; it is still a text to learn from.
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


Prob = Annotated[float, Field(ge=0.0, le=1.0)]
Text = Annotated[str, Field(min_length=1)]
ExampleList = list[Annotated[Text, BeforeValidator(_text)]]


class Strict(BaseModel):
    """Base: frozen, unknown keys refused with the closest allowed key suggested."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    _key_hints: ClassVar[dict[str, str]] = {}
    """Unknown key -> a better hint than the closest spelling (a key that belongs to another type)."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            allowed = list(cls.model_fields)
            for key in data:
                if key not in allowed:
                    hint = cls._key_hints.get(str(key)) or suggest(key, allowed)
                    # ``at`` in ctx lets the loader point at the offending line, not the parent's.
                    raise PydanticCustomError(
                        "unknown_key",
                        "unknown key {key_repr}{hint}",
                        {"at": (str(key),), "key_repr": repr(str(key)), "hint": hint},
                    )
        return data


def _noul_examples(value: Any) -> Any:
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for key, texts in value.items():
            option = _NOUL_KEYS.get(key, key) if isinstance(key, (str, bool)) else key
            if option in out:
                raise PydanticCustomError("duplicate_option", "examples give {option} twice", {"option": repr(option)})
            out[option] = texts
        return out
    return value


NoulExamples = Annotated[dict[Literal["yes", "no"], ExampleList], BeforeValidator(_noul_examples)]
ChoiceExamples = dict[str, ExampleList]


def known_options(examples: Mapping[str, Any], options: list[str]) -> None:
    for option in examples:
        if option not in options:
            raise PydanticCustomError(
                "unknown_option",
                "examples name {option}, which is not an option ({options}){hint}",
                {
                    "option": repr(option),
                    "options": ", ".join(options),
                    "hint": suggest(option, options),
                    "at": ("examples", option),
                },
            )


def check_names(names: Any, what: str) -> None:
    for name in names:
        check_name(name, what, key=True)
