# ruff: noqa: E501 - the bodies below are quoted verbatim from wire-formats.md
"""Verbatim Jev-shaped bodies from ``wire-formats.md`` and the traps compatible servers set.

``VALID`` replies parse with the official ``typesafe-sdk``; ``SDK_REJECTS`` ones do not (we accept
them all). Each entry pairs a reply with the questions it answers.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from fastslow.router import Choice, Noul, Question, Score

__all__ = [
    "ERROR_BODIES",
    "JEV_QUESTIONS",
    "JEV_REPLY",
    "JEV_REQUEST",
    "SDK_REJECTS",
    "STRUCTURED_QUESTIONS",
    "STRUCTURED_REPLY",
    "VALID",
]

# §1.2, verbatim.
JEV_REQUEST: dict[str, Any] = json.loads("""
{
  "model": "jev-latest",
  "state": {"document": "I was charged twice. Please fix this ASAP."},
  "questions": {
    "category": {"type": "choice",
                 "instructions": "What is this ticket about?",
                 "criteria": {"billing": null, "technical": "Bugs, outages", "other": null}},
    "refund":   {"type": "noul", "instructions": "Does the customer ask for a refund?"},
    "refund_described": {"type": "noul",
                 "criteria": {"true": "Asks for money back", "false": "Anything else"}},
    "urgency":  {"type": "score", "instructions": "How urgent is this?",
                 "criteria": ["Can wait", "This week", "Today"]}
  }
}
""")

JEV_QUESTIONS: dict[str, Question] = {
    "category": Choice(
        instructions="What is this ticket about?",
        criteria={"billing": None, "technical": "Bugs, outages", "other": None},
    ),
    "refund": Noul(instructions="Does the customer ask for a refund?"),
    "refund_described": Noul(yes="Asks for money back", no="Anything else"),
    "urgency": Score(instructions="How urgent is this?", levels=["Can wait", "This week", "Today"]),
}

# §1.3, verbatim (it answers three of the four questions of §1.2).
JEV_REPLY: dict[str, Any] = json.loads("""
{
  "model": "jev-1.13.0",
  "answers": {
    "refund":   {"type": "noul", "noul": 0.97},
    "category": {"type": "choice", "choice": "billing", "confidence": 0.9,
                 "probabilities": {"billing": 0.93, "technical": 0.04, "other": 0.03}},
    "urgency":  {"type": "score", "score": 1.7, "confidence": 0.8,
                 "legend": {"0": "Can wait", "1": "This week", "2": "Today"},
                 "probabilities": {"0": 0.1, "1": 0.1, "2": 0.8}}
  },
  "usage": {"input_tokens": 120, "output_tokens": 3}
}
""")

STRUCTURED_QUESTIONS: dict[str, Question] = {
    "urgent": Noul(instructions="Does the customer need a reply within the hour?"),
    "team": Choice(instructions="Which team?", criteria={"billing": "Payments", "technical": None}),
    "anger": Score(instructions="How angry?", levels=["calm", "annoyed", "furious"]),
}

# §2.5, verbatim.
STRUCTURED_REPLY: dict[str, Any] = json.loads("""
{
  "model": "dgemma",
  "answers": {
    "urgent": {"type": "noul", "noul": 0.91},
    "team":   {"type": "choice", "choice": "technical", "probabilities": {"billing": 0.06, "technical": 0.94}, "confidence": 0.94},
    "anger":  {"type": "score", "score": 1.2, "legend": {"0": "calm", "1": "annoyed", "2": "furious"},
               "probabilities": {"0": 0.2, "1": 0.4, "2": 0.4}, "confidence": 0.4}
  },
  "usage": {"input_tokens": 143, "output_tokens": 32},
  "diagnostics": {
    "steps": 1, "stages": [["urgent","team"],["anger"]], "skipped": {}, "chunks": [["urgent","team"],["anger"]],
    "chunk_prompt": "full", "sequential": false, "conditioning": "prefill",
    "thought": null,
    "samples": {"n": [1, 1], "tops": [[{"urgent": ["yes", 0.91, 0.42], "team": ["B", 0.94, 0.3]}], [{"anger": ["2", 0.4, 1.1]}]],
                "policy": [{"mode": "fixed", "n": 1, "extended": null, "first_read_entropy": null}, {"mode": "fixed", "n": 1, "extended": null, "first_read_entropy": null}]},
    "timing": {"total_ms": 58.3, "reads": 2},
    "prompt_tokens": 143,
    "questions": {"urgent": {"pos": 9, "entropy": [0.42], "label_mass": 0.97, "argmax_is_label": true}},
    "engine": "vllm"
  }
}
""")


def _with(base: dict[str, Any], **answers: Any) -> dict[str, Any]:
    reply = copy.deepcopy(base)
    reply["answers"].update(answers)
    return reply


# §3 laya-serve: output_tokens 0, entropy-based confidence.
LAYA_REPLY = {
    "model": "jev-latest",
    "answers": {"refund": {"type": "noul", "noul": 0.2}},
    "usage": {"input_tokens": 50, "output_tokens": 0},
}
# §3 llm2jev: an extra top-level id.
LLM2JEV_REPLY = {"id": "jev-0123456789abcdef", **LAYA_REPLY, "usage": {"input_tokens": 50, "output_tokens": 1}}
# §2.1 the Google fork: noul answers add probabilities {true, false} and confidence.
GOOGLE_FORK_REPLY = {
    "model": "dgemma",
    "answers": {
        "refund": {"type": "noul", "noul": 0.7, "probabilities": {"true": 0.7, "false": 0.3}, "confidence": 0.7}
    },
    "usage": {"input_tokens": 50, "output_tokens": 1},
}
# §3 jev-compatible-server: a question it cannot serve (the SDK drops it with a log line).
UNSUPPORTED_REPLY = _with(
    JEV_REPLY,
    urgency={
        "type": "unsupported",
        "question_type": "score",
        "reason": "question_type_not_supported",
        "supported_types": ["choice", "noul"],
    },
)

VALID: dict[str, tuple[dict[str, Any], dict[str, Question]]] = {
    "jev §1.3": (JEV_REPLY, JEV_QUESTIONS),
    "structured §2.5": (STRUCTURED_REPLY, STRUCTURED_QUESTIONS),
    "laya-serve §3": (LAYA_REPLY, {"refund": JEV_QUESTIONS["refund"]}),
    "llm2jev id §3": (LLM2JEV_REPLY, {"refund": JEV_QUESTIONS["refund"]}),
    "google fork noul §2.1": (GOOGLE_FORK_REPLY, {"refund": JEV_QUESTIONS["refund"]}),
    "unsupported §3": (UNSUPPORTED_REPLY, JEV_QUESTIONS),
}

SDK_REJECTS: dict[str, tuple[dict[str, Any], dict[str, Question]]] = {
    # §2.5: questions skipped by ask_if come back as null.
    "null answer": (_with(STRUCTURED_REPLY, anger=None), STRUCTURED_QUESTIONS),
    # §3: jev-compatible-server's score legend is a list.
    "list legend": (
        _with(
            JEV_REPLY,
            urgency={
                "type": "score",
                "score": 1.7,
                "confidence": 0.8,
                "probabilities": {"0": 0.1, "1": 0.1, "2": 0.8},
                "legend": ["Can wait", "This week", "Today"],
            },
        ),
        JEV_QUESTIONS,
    ),
}

# §1.4, §2.5, §3: every error body shape, with the message a reader should see.
ERROR_BODIES: dict[str, tuple[int, Any, str]] = {
    "fastapi validation list": (
        422,
        {
            "detail": [
                {
                    "loc": ["body", "questions", "urgency", "score", "criteria"],
                    "msg": "Field required",
                    "type": "missing",
                    "input": {},
                    "ctx": {},
                }
            ]
        },
        "questions.urgency.score.criteria: Field required",
    ),
    "fastapi detail string": (422, {"detail": "question names must be 1-128 characters"}, "1-128 characters"),
    "laya error field": (
        422,
        {"error": {"message": "Field required", "field": "body.questions.q.instructions"}},
        "Field required (field body.questions.q.instructions)",
    ),
    "structured error type": (
        502,
        {"error": {"message": "upstream said 400", "type": "server_error"}},
        "upstream said 400",
    ),
    "llm2jev error string": (422, {"error": "1..64 questions, got 65"}, "1..64 questions, got 65"),
    "message": (500, {"message": "internal failure"}, "internal failure"),
    "overload 529": (529, {"error": {"message": "backend overloaded", "field": None}}, "backend overloaded"),
    "plain text": (503, "Service Unavailable: try later", "Service Unavailable"),
}
