"""The Jev ``/v1/systemone`` answers the benchmarks' stubs give: instant, the same for every router measured."""

from __future__ import annotations

from typing import Any

__all__ = ["stub_answers"]


def stub_answers(questions: dict[str, Any]) -> dict[str, Any]:
    """Every choice question's first option at 0.9 (the rest share 0.1), every noul "no" at 0.97."""
    answers: dict[str, Any] = {}
    for name, question in questions.items():
        if question.get("type") == "choice":
            options = list(question["criteria"])
            rest = 0.1 / max(len(options) - 1, 1)
            probabilities = {o: 0.9 if i == 0 else rest for i, o in enumerate(options)}
            answers[name] = {"type": "choice", "choice": options[0], "confidence": 0.9, "probabilities": probabilities}
        else:
            answers[name] = {"type": "noul", "noul": 0.03}
    return answers
