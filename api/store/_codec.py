"""Turning decisions, states and keys into rows, and rows back into values."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, cast

from fastslow.router import Decision, Reason, State, System, Verdict
from fastslow.router.engine_api import strip_thoughts

from ._models import ApiKeyRow, DecisionRow, OutcomeRow
from ._values import DEFAULT_SCOPES, SCOPES, ApiKey, Scope, StoredDecision, StoredOutcome

__all__ = [
    "KEY_PREFIX",
    "answer_rows",
    "api_key",
    "canonical_state",
    "clean",
    "decision_row",
    "format_scopes",
    "hash_key",
    "new_key",
    "parse_scopes",
    "stored_decision",
    "stored_outcome",
]

KEY_PREFIX = "fs_"
_KEY_BYTES = 32
"""256 random bits: ``fs_`` plus 43 URL-safe characters."""
_DISPLAY_CHARS = len(KEY_PREFIX) + 8


def clean(text: str) -> str:
    """Text both databases accept: PostgreSQL refuses NUL, and neither driver encodes lone surrogates."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


class _Literal(str):
    """Text already encoded, on the stack of ``_canonical_iteratively``."""


def _key(key: Any) -> str:
    # As json.dumps turns keys into strings (it refuses other types, and so does this).
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (bool, int, float)):
        return json.dumps(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def _canonical_iteratively(state: Any) -> str:
    """What ``canonical_state``'s ``json.dumps`` writes, on an explicit stack: for any depth."""
    out: list[str] = []
    stack: list[Any] = [state]
    while stack:
        node = stack.pop()
        if isinstance(node, _Literal):
            out.append(node)
            continue
        parts: list[Any]
        if isinstance(node, dict):
            parts = [_Literal("{")]
            for i, (key, value) in enumerate(sorted(node.items(), key=lambda item: item[0])):
                encoded = json.dumps(_key(key), ensure_ascii=False)
                parts += [_Literal(("," if i else "") + encoded + ":"), value]
            parts.append(_Literal("}"))
        elif isinstance(node, (list, tuple)):
            parts = [_Literal("[")]
            for i, value in enumerate(node):
                parts += [_Literal(",")] if i else []
                parts.append(value)
            parts.append(_Literal("]"))
        else:
            out.append(json.dumps(node, ensure_ascii=False, default=str))
            continue
        stack.extend(reversed(parts))
    return "".join(out)


def canonical_state(state: State) -> tuple[str, str]:
    """The state's canonical JSON (sorted keys, no spaces) and the sha256 hex of its UTF-8 bytes.

    The same state always hashes the same, so the log can say "these decisions were about the same
    state" without keeping it. ``default=str`` because a state that reached the log was already
    validated as JSON; recording must not fail after the decision was made.
    """
    try:
        text = json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    except RecursionError:
        # The API's depth limit keeps states far from this; a library caller's may not be.
        text = _canonical_iteratively(state)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return text, digest


def decision_row(
    decision: Decision, *, tenant: str, digest: str, state_text: str | None, created_at: datetime
) -> dict[str, Any]:
    """The ``decisions`` row of one decision. Thoughts never reach it: ``detail`` is stripped of them."""
    row: dict[str, Any] = {
        "id": decision.id,
        "tenant": tenant,
        "task": decision.task,
        "question": decision.question,
        "outcome": decision.outcome,
        "system": int(decision.system),
        "reason": decision.reason,
        "escalate": bool(decision.escalate),
        "confidence": float(decision.confidence),
        "threshold": float(decision.threshold),
        "verdict": decision.verdict,
        "policy_version": decision.policy_version,
        "engine": decision.engine,
        "model": decision.model,
        "latency_ms": float(decision.latency_ms),
        "cost_usd": None if decision.cost_usd is None else float(decision.cost_usd),
        # Defence in depth: engines already keep thoughts out of ``detail``, but System 2's text
        # may carry a thought block, and the log must never hold one.
        "detail": strip_thoughts(decision.detail),
        "state_digest": digest,
        "state_text": state_text,
        "created_at": created_at,
        "audit": bool(decision.audit),
        "audit_rate": float(decision.audit_rate) if decision.audit_rate else None,
        "examples_version": decision.examples_version or None,
    }
    return {k: clean(v) if isinstance(v, str) else v for k, v in row.items()}


def answer_rows(decision: Decision) -> list[dict[str, Any]]:
    """The ``answers`` rows of one decision: its calibrated distribution, one row per option."""
    return [
        {"decision_id": decision.id, "option": clean(option), "probability": float(p)}
        for option, p in decision.probabilities.items()
    ]


def stored_decision(row: DecisionRow, answers: Mapping[str, float]) -> StoredDecision:
    distribution = dict(answers)
    return StoredDecision(
        id=row.id,
        tenant=row.tenant,
        task=row.task,
        question=row.question,
        outcome=row.outcome,
        system=cast(System, row.system),
        reason=cast(Reason, row.reason),
        escalate=row.escalate,
        confidence=row.confidence,
        threshold=row.threshold,
        probabilities=distribution,
        verdict=cast(Verdict | None, row.verdict),
        policy_version=row.policy_version,
        engine=row.engine,
        model=row.model,
        latency_ms=row.latency_ms,
        detail=row.detail,
        cost_usd=row.cost_usd,
        created_at=row.created_at,
        state_digest=row.state_digest,
        state_text=row.state_text,
        answers=distribution,
        audit=bool(row.audit),
        audit_rate=row.audit_rate or 0.0,
        examples_version=row.examples_version or "",
    )


def stored_outcome(row: OutcomeRow) -> StoredOutcome:
    return StoredOutcome(
        id=row.id,
        decision_id=row.decision_id,
        label=row.label,
        system2_correct=row.system2_correct,
        note=row.note,
        created_at=row.created_at,
    )


def api_key(row: ApiKeyRow) -> ApiKey:
    return ApiKey(
        id=row.id,
        tenant=row.tenant,
        name=row.name,
        prefix=row.prefix,
        created_at=row.created_at,
        revoked_at=row.revoked_at,
        scopes=parse_scopes(row.scopes),
    )


def parse_scopes(text: str | None) -> frozenset[Scope]:
    """A key's scopes as stored (comma-separated); unknown names are dropped, never granted."""
    if text is None:
        return DEFAULT_SCOPES
    return frozenset(s for s in SCOPES if s in {part.strip() for part in text.split(",")})


def format_scopes(scopes: Iterable[str]) -> str:
    """Scopes as stored: known names, comma-separated, in ``SCOPES`` order.

    Raises:
        ValueError: an unknown scope, or none.
    """
    given = set(scopes)
    unknown = sorted(given - set(SCOPES))
    if unknown:
        raise ValueError(f"unknown scope {unknown[0]!r}: scopes are {', '.join(SCOPES)}")
    if not given:
        raise ValueError(f"a key needs at least one scope of {', '.join(SCOPES)}")
    return ",".join(s for s in SCOPES if s in given)


def new_key() -> tuple[str, str, str]:
    """A fresh API key: the plaintext (shown once), its display prefix and its hash (what is kept)."""
    key = KEY_PREFIX + secrets.token_urlsafe(_KEY_BYTES)
    return key, key[:_DISPLAY_CHARS], hash_key(key)


def hash_key(key: str) -> str:
    """sha256 hex of a key.

    A fast hash is right here, unlike for passwords: the keys are 256 random bits, so there is no
    dictionary to try and a slow hash (bcrypt, argon2) would only cost every request time.
    """
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
