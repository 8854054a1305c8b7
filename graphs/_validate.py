"""A small, deterministic JSON Schema check for drafted answers.

It covers the subset structured output uses (``type``, ``enum``, ``const``, ``properties``,
``required``, ``additionalProperties``, ``items``, ``anyOf``, length, size and range bounds) and
ignores other keywords, so fastslow needs no ``jsonschema`` dependency for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["schema_errors"]

_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
}


def _is(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False  # JSON's true is not 1
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES.get(kind, object))


def _bounds(value: Any, schema: Mapping[str, Any], at: str) -> list[str]:
    errors: list[str] = []
    checks: list[tuple[str, Any, str]] = []
    if isinstance(value, str):
        checks = [("minLength", len(value), ">="), ("maxLength", len(value), "<=")]
    elif isinstance(value, list):
        checks = [("minItems", len(value), ">="), ("maxItems", len(value), "<=")]
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            return [f"{at}: {value} is not a finite number"]
        checks = [("minimum", value, ">="), ("maximum", value, "<="), ("exclusiveMinimum", value, ">")]
        checks.append(("exclusiveMaximum", value, "<"))
    for keyword, actual, op in checks:
        limit = schema.get(keyword)
        if limit is None:
            continue
        ok = {">=": actual >= limit, "<=": actual <= limit, ">": actual > limit, "<": actual < limit}[op]
        if not ok:
            errors.append(f"{at}: {keyword} is {limit}, got {actual}")
    return errors


def _object(value: dict[str, Any], schema: Mapping[str, Any], at: str) -> list[str]:
    errors = [f"{at}: missing required {name!r}" for name in schema.get("required", ()) if name not in value]
    properties: Mapping[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in properties:
            errors.extend(schema_errors(item, properties[name], f"{at}.{name}"))
        elif extra is False:
            errors.append(f"{at}: unexpected property {name!r}")
        elif isinstance(extra, Mapping):
            errors.extend(schema_errors(item, extra, f"{at}.{name}"))
    return errors


def schema_errors(value: Any, schema: Mapping[str, Any], at: str = "$") -> list[str]:
    """Every way ``value`` breaks ``schema``, each as ``path: problem``; empty when it conforms."""
    if "anyOf" in schema:
        options = [schema_errors(value, option, at) for option in schema["anyOf"]]
        if all(options):
            closest = min(options, key=lambda errors: len(errors))
            return [f"{at}: matches none of anyOf ({'; '.join(closest)})"]
    kinds = schema.get("type")
    if kinds is not None:
        allowed = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_is(value, kind) for kind in allowed):
            return [f"{at}: expected {' or '.join(allowed)}, got {type(value).__name__}"]
    if "const" in schema and value != schema["const"]:
        return [f"{at}: must be {schema['const']!r}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{at}: {value!r} is not one of {list(schema['enum'])!r}"]
    errors = _bounds(value, schema, at)
    if isinstance(value, dict):
        errors.extend(_object(value, schema, at))
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            errors.extend(schema_errors(item, schema["items"], f"{at}[{i}]"))
    return errors
