"""OpenAPI description of the Jev gateway (``POST /v1/systemone``), in Jev's own shapes.

The gateway reads its body itself (JSON, zstd-compressed JSON, or multipart with image parts), so
these models document the wire rather than parse it; ``fastslow.router.engine_api.parse_systemone_request`` is the
parser, with the same rules and clearer errors.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SYSTEMONE_REQUEST_BODY", "SystemOneRequestDoc", "SystemOneResponse", "jev_components"]

Text = str | dict[str, Any] | list[Any]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class NoulQuestion(_Wire):
    """A yes/no question; the answer is P(yes)."""

    type: Literal["noul"]
    instructions: Text | None = None
    criteria: dict[str, str | None] | None = Field(default=None, description='{"true": ..., "false": ...}')


class ChoiceQuestion(_Wire):
    """Pick one of named options."""

    type: Literal["choice"]
    instructions: Text | None = None
    criteria: dict[str, Text | None] = Field(min_length=2, description="Option -> description (or null).")


class ScoreQuestion(_Wire):
    """Rate on ordered levels, lowest first."""

    type: Literal["score"]
    instructions: Text | None = None
    criteria: list[Text] = Field(min_length=2, description="Level descriptions; a level's position is its score.")


Question = Annotated[NoulQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")]


class ImageAsset(BaseModel):
    """An image, base64 in the JSON body or a named part of a multipart body."""

    type: Literal["image"]
    format: Literal["png", "jpg", "jpeg"] | None = None
    data_base64: str | None = None
    part: str | None = Field(default=None, description="The multipart part holding the image, such as asset-0.")


class SystemOneRequestDoc(_Wire):
    """Jev's ``SystemOneRequest``: named questions about one state."""

    model: str | None = Field(default=None, description="Accepted for compatibility; the configured engine answers.")
    state: Text = Field(description="What every question is about.")
    questions: dict[str, Question] = Field(min_length=1)
    assets: dict[str, ImageAsset] | None = Field(
        default=None, description="Images, keyed by the placeholder text they replace."
    )


class NoulAnswer(BaseModel):
    type: Literal["noul"]
    noul: float = Field(description="P(yes).")


class ChoiceAnswer(BaseModel):
    type: Literal["choice"]
    choice: str
    confidence: float
    probabilities: dict[str, float]


class ScoreAnswer(BaseModel):
    type: Literal["score"]
    score: float = Field(description="Expected level, sum of i * p_i.")
    confidence: float
    legend: dict[str, str]
    probabilities: dict[str, float]


class NoAnswer(BaseModel):
    """The engine could not answer this question (the SDK skips unknown answer types)."""

    type: Literal["no_answer"]
    reason: str


Answer = Annotated[NoulAnswer | ChoiceAnswer | ScoreAnswer | NoAnswer, Field(discriminator="type")]


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int


class SystemOneResponse(BaseModel):
    """Jev's ``SystemOneResponse``, byte for byte what the official SDK parses."""

    model: str
    answers: dict[str, Answer]
    usage: Usage


_REF = "#/components/schemas/{model}"


def jev_components() -> dict[str, Any]:
    """The request's component schemas, to merge into the app's OpenAPI document."""
    schema = SystemOneRequestDoc.model_json_schema(ref_template=_REF)
    defs = schema.pop("$defs", {})
    return {**defs, "SystemOneRequest": schema}


SYSTEMONE_REQUEST_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "JSON, optionally with `Content-Encoding: zstd`; or multipart/form-data with the JSON as "
        "part `request` and images as parts `asset-0`, `asset-1`, ...",
        "content": {
            "application/json": {"schema": {"$ref": _REF.format(model="SystemOneRequest")}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["request"],
                    "properties": {"request": {"type": "string", "description": "The JSON request."}},
                    "additionalProperties": {"type": "string", "format": "binary"},
                }
            },
        },
    }
}
"""``openapi_extra`` for the gateway's operation."""
