"""What each server speaking Jev's ``/v1/systemone`` accepts: path, model, extensions, limits, images.

Sources are in ``wire-formats.md``: §1 (TypeSafe Jev), §2.5 (the DiffusionGemma structured server on
vLLM), §3 (laya-serve, jev-compatible-server, llm2jev) and §5 (OpenRouter's alpha decisions endpoint).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fastslow.router.engine_api import EngineLimits
from fastslow.router.settings import JevProfileName

__all__ = ["EXTENSIONS", "PROFILES", "Extension", "ImageMode", "JevProfile"]

Extension = Literal["samples", "steps", "think", "seed"]
EXTENSIONS: tuple[Extension, ...] = ("samples", "steps", "think", "seed")

ImageMode = Literal["assets", "images", "none"]
"""``assets``: Jev's ``assets`` map with placeholders (JSON or multipart); ``images``: the structured
server's list of data URLs; ``none``: the server takes no images."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JevProfile:
    """One kind of Jev-shaped server."""

    name: JevProfileName
    path: str = "/v1/systemone"
    """Appended to the settings' ``base_url``."""
    default_model: str | None
    """Sent when the settings name no model; ``None`` leaves ``model`` off the body."""
    extensions: frozenset[Extension] = frozenset()
    """Top-level body extensions the server understands; nothing else is ever sent."""
    always_think: bool = False
    """Send ``think`` even when it is 0, so the server never opens a thought channel on its own."""
    limits: EngineLimits
    needs_instructions: bool = False
    """Every question must carry ``instructions`` (a generic one is supplied)."""
    noul_needs_both_criteria: bool = False
    """A noul's ``criteria`` must describe both ``true`` and ``false`` (defaults are supplied)."""
    model_aliases: frozenset[str] = frozenset()
    """Model names the server is known to accept (informational; a serving id may also work)."""
    images: ImageMode = "none"


_JEV_LIMITS = EngineLimits(max_questions=None, min_options=2, max_options=255, max_score_levels=10)

PROFILES: dict[JevProfileName, JevProfile] = {
    # vLLM PR #57250's example server (mmastrac/djev): ≤64 questions, 2–26 options or levels.
    "structured": JevProfile(
        name="structured",
        default_model="dgemma",
        extensions=frozenset(EXTENSIONS),
        always_think=True,
        limits=EngineLimits(max_questions=64, min_options=2, max_options=26, max_score_levels=26, accepts_images=True),
        images="images",
    ),
    # Hosted TypeSafe Jev: choice 2–255, score 2–10; no documented question cap.
    "jev": JevProfile(
        name="jev",
        default_model="jev-latest",
        limits=EngineLimits(
            max_questions=None, min_options=2, max_options=255, max_score_levels=10, accepts_images=True
        ),
        model_aliases=frozenset({"jev-latest", "jev-preview"}),
        images="assets",
    ),
    # OpenRouter alpha: POST https://openrouter.ai/api/alpha/decisions with Jev's body.
    "openrouter": JevProfile(
        name="openrouter",
        path="/decisions",
        default_model="~typesafe/jev-latest",
        limits=_JEV_LIMITS,
        model_aliases=frozenset({"typesafe/jev-1.13", "~typesafe/jev-latest"}),
    ),
    # laya-serve 0.2.1: extra="forbid", model must be a known alias, instructions required.
    "laya-serve": JevProfile(
        name="laya-serve",
        default_model="jev-latest",
        limits=EngineLimits(max_questions=None, min_options=1, max_options=255, max_score_levels=10),
        needs_instructions=True,
        model_aliases=frozenset({"jev-latest", "jev-preview", "jev-1.13.0", "jev-1.13", "laya", "laya-latest"}),
    ),
    # jev-compatible-server 0.1.1: model optional, instructions and both noul criteria required.
    "jev-compatible-server": JevProfile(
        name="jev-compatible-server",
        default_model=None,
        limits=EngineLimits(max_questions=None, min_options=2, max_options=255, max_score_levels=255),
        needs_instructions=True,
        noul_needs_both_criteria=True,
    ),
    # llm2jev 0.6.1: 1–64 questions, choice/score 2–255, model optional (echoed back).
    "llm2jev": JevProfile(
        name="llm2jev",
        default_model=None,
        limits=EngineLimits(max_questions=64, min_options=2, max_options=255, max_score_levels=255),
    ),
}
