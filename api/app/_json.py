"""Strict JSON request bodies: input that is what it claims, parsed once per request.

``json.loads`` is forgiving where an API must not be: it sniffs UTF-16 and UTF-32, lets a later
duplicate key silently replace an earlier one (two ``tool_call`` keys: the second is checked, the
first may be what a lenient proxy forwards), accepts ``NaN`` and ``Infinity``, keeps lone
surrogates from ``\\ud800`` escapes (which crash the first UTF-8 encoder they reach) and recurses
in C, so a body of a million ``[`` is a ``RecursionError``. ``parse_json_body`` refuses all of
these with an ``InvalidRequest`` naming where, which the app answers with a 422.

``StrictJsonRoute`` makes every route of an ``APIRouter`` parse its JSON body through it before
FastAPI's own handler runs, and caches the value where Starlette's ``request.json()`` looks, so
FastAPI validates that value and nobody parses the body a second time. Its routes that take a body
model refuse a body without ``Content-Type: application/json`` with a 415 naming the header.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Callable, Coroutine
from typing import Any, TypeAlias

from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel

from fastslow.router import InvalidRequest
from fastslow.router.settings import LimitsSettings

from ._errors import ApiError

__all__ = ["StrictJsonRoute", "json_depth", "model_response", "parse_json_body", "strict_json"]

_BOMS = (
    # UTF-32 first: its little-endian mark starts with UTF-16's.
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF8, "UTF-8"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")
"""Lone surrogates can only come from escapes (strict UTF-8 decoding refuses encoded ones)."""
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
"""Strings (skipped whole, so brackets inside them do not count) and brackets."""
_NOT_BRACKETS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[^\[\]{}"]+', re.DOTALL)
"""Strings and every character but brackets: what ``_deeper_than`` deletes first."""
_INNERMOST = re.compile(r"\[\]|\{\}")
"""Objects and arrays with nothing (left) inside: one level of nesting."""
_DEFAULT_DEPTH = LimitsSettings().max_depth
_JSON_HEADER = "Content-Type: application/json"

_Path: TypeAlias = "tuple[_Path, str | int] | None"
"""A field path as a linked list from the leaf up, so pushing a child costs no copy."""


class _Bad:
    """What a parse hook returns for a value that is not JSON; the walk reports it with its path."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _Duplicated(dict[str, Any]):
    """An object that had ``key`` twice."""

    def __init__(self, pairs: list[tuple[str, Any]], key: str) -> None:
        super().__init__(pairs)
        self.key = key


class _Pairs(list[tuple[str, Any]]):
    """An object kept as its pairs, in order (for finding the path to an over-deep point)."""


def _segment(part: str | int) -> str:
    # A path is sent back in an error body: a lone surrogate in a key must not crash its encoding.
    return part.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(part, str) else str(part)


def _dotted(path: _Path, root: str) -> str:
    parts: list[str] = []
    while path is not None:
        path, part = path
        parts.append(_segment(part))
    return ".".join(reversed(parts)) or root


def _too_deep(max_depth: int) -> str:
    return f"nested deeper than limits.max_depth ({max_depth} levels of objects and arrays)"


def json_depth(value: Any, *, max_depth: int) -> tuple[int, list[str | int] | None]:
    """How deep ``value`` nests objects and arrays (a scalar is 0), without recursion.

    Stops at the first container deeper than ``max_depth`` and returns ``max_depth + 1`` with that
    container's path (keys and indexes from ``value``); otherwise the depth and ``None``.
    """
    deepest = 0
    stack: list[tuple[Any, _Path, int]] = [(value, None, 1)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.items()
        elif isinstance(node, (list, tuple)):
            children = enumerate(node)
        else:
            continue
        if depth > max_depth:
            parts: list[str | int] = []
            while path is not None:
                path, part = path
                parts.append(part)
            return depth, parts[::-1]
        deepest = max(deepest, depth)
        stack.extend((child, (path, key), depth + 1) for key, child in children)
    return deepest, None


def _walk(value: Any, *, max_depth: int, root: str, text: bool) -> None:
    """Refuse what the parse hooks marked, over-deep nesting and (with ``text``) lone surrogates.

    Iterative, in document order, so the first problem is the one reported; it looks only at what
    may be wrong: containers, marked values, and strings and keys when ``text``.
    """
    stack: list[tuple[Any, _Path, int]] = [(value, None, 1)]
    while stack:
        node, path, depth = stack.pop()
        if text and path is not None and isinstance(key := path[1], str) and _has_lone_surrogate(key):
            raise InvalidRequest(_dotted(path, root), "a key holds a lone surrogate (\\ud800-\\udfff), not Unicode")
        if isinstance(node, str):
            if _has_lone_surrogate(node):
                raise InvalidRequest(_dotted(path, root), "a lone surrogate (\\ud800-\\udfff) is not Unicode text")
        elif isinstance(node, _Bad):
            raise InvalidRequest(_dotted(path, root), node.reason)
        elif isinstance(node, (dict, list)):
            if depth > max_depth:
                raise InvalidRequest(_dotted(path, root), _too_deep(max_depth))
            if isinstance(node, _Duplicated):
                raise InvalidRequest(_dotted((path, node.key), root), f"duplicate key {_segment(node.key)!r}")
            children: Any = node.items() if isinstance(node, dict) else enumerate(node)
            wanted = (dict, list, _Bad, str) if text else (dict, list, _Bad)
            # Reversed onto the stack, so the first child is looked at first.
            stack.extend(
                reversed(
                    [
                        (child, (path, key), depth + 1)
                        for key, child in children
                        if isinstance(child, wanted) or (text and isinstance(key, str))
                    ]
                )
            )


def _has_lone_surrogate(text: str) -> bool:
    return not text.isascii() and _LONE_SURROGATE.search(text) is not None


def _deeper_than(text: str, max_depth: int) -> bool:
    """Whether a text that parsed as JSON nests deeper than ``max_depth``, at C speed.

    With strings and everything but brackets removed, each pass deletes the innermost ``[]`` and
    ``{}`` pairs, one level of nesting; the text nests deeper than the passes it survives.
    """
    brackets = _NOT_BRACKETS.sub("", text)
    for _ in range(max_depth):
        if not brackets:
            return False
        brackets = _INNERMOST.sub("", brackets)
    return bool(brackets)


def _deep_point(text: str, max_depth: int, root: str) -> str | None:
    """The path of the first container deeper than ``max_depth``, for a text too deep to parse whole.

    Scans brackets outside strings without recursion. At the first one past the limit, the text
    before it is closed off (a ``0`` in its place, then the open brackets' closers): a document no
    deeper than the limit, whose last value at each level leads to the point. ``None`` when the
    scan finds no such point or the text before it is not JSON.
    """
    open_brackets: list[str] = []
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            if len(open_brackets) == max_depth:
                closers = "".join("]" if b == "[" else "}" for b in reversed(open_brackets))
                try:
                    node: Any = json.loads(text[: match.start()] + "0" + closers, object_pairs_hook=_Pairs)
                except (ValueError, RecursionError):
                    return None
                path: _Path = None
                try:
                    for _ in range(max_depth):
                        key, node = node[-1] if isinstance(node, _Pairs) else (len(node) - 1, node[-1])
                        path = (path, key)
                except (IndexError, TypeError):
                    return None
                return _dotted(path, root)
            open_brackets.append(token)
        elif token in "]}":
            if open_brackets:
                open_brackets.pop()
    return None


def parse_json_body(raw: bytes | str, *, max_depth: int, root: str = "body") -> Any:
    """Parse a request body (or one multipart part) as strict JSON.

    Args:
        raw: the body's bytes (or a multipart field's text).
        max_depth: the deepest nesting of objects and arrays accepted (``limits.max_depth``).
        root: the field named for errors of the whole document (its encoding, its syntax).

    Raises:
        InvalidRequest: for a byte order mark, bytes that are not UTF-8, invalid JSON, a duplicate
            key, ``NaN`` or ``Infinity``, a number too large for a float, a lone surrogate, or
            nesting deeper than ``max_depth``; ``field`` is the path where it is.
    """
    if isinstance(raw, bytes):
        for bom, encoding in _BOMS:
            if raw.startswith(bom):
                raise InvalidRequest(root, f"the body starts with a {encoding} byte order mark; send UTF-8 without one")
        if b"\x00" in raw:
            # A NUL byte is never valid JSON; in the first bytes it is how UTF-16 and UTF-32 look.
            raise InvalidRequest(root, "the body holds NUL bytes: not UTF-8 JSON (UTF-16 or UTF-32?); send UTF-8")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequest(root, f"the body is not UTF-8: invalid byte at offset {exc.start}") from None
    else:
        text = raw
        if text.startswith("\ufeff"):
            raise InvalidRequest(root, "the body starts with a byte order mark; send UTF-8 without one")
    marked = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal marked
        found = dict(items)
        if len(found) == len(items):
            return found
        marked = True
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                return _Duplicated(items, key)
            seen.add(key)
        return found  # not reached: the lengths differ only when a key repeats

    def constant(name: str) -> _Bad:
        nonlocal marked
        marked = True
        return _Bad(f"{name} is not JSON: numbers must be finite")

    def number(literal: str) -> float | _Bad:
        nonlocal marked
        value = float(literal)
        if math.isfinite(value):
            return value
        marked = True
        return _Bad(f"the number {literal[:40]} is too large for a 64-bit float")

    try:
        value = json.loads(text, object_pairs_hook=pairs, parse_constant=constant, parse_float=number)
    except RecursionError:
        # Deeper than the interpreter's recursion limit, so far past any allowed depth.
        raise InvalidRequest(_deep_point(text, max_depth, root) or root, _too_deep(max_depth)) from None
    except json.JSONDecodeError as exc:
        raise InvalidRequest(root, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise InvalidRequest(root, f"invalid JSON: {exc}") from None
    # The walk costs a Python step per value: only take it when something may be wrong.
    surrogates = _SURROGATE_ESCAPE.search(text) is not None or (isinstance(raw, str) and _has_lone_surrogate(text))
    if marked or surrogates or (text.count("[") + text.count("{") > max_depth and _deeper_than(text, max_depth)):
        _walk(value, max_depth=max_depth, root=root, text=surrogates)
    return value


def _max_depth(request: Request) -> int:
    services = getattr(request.state, "services", None)
    return services.settings.limits.max_depth if services is not None else _DEFAULT_DEPTH


async def strict_json(request: Request, *, root: str = "body") -> Any:
    """The request's body parsed by ``parse_json_body``, once per request.

    The value is kept in ``request._json``, where Starlette's ``Request.json()`` (and so FastAPI's
    body handling) finds it instead of parsing the body again, leniently.
    """
    if not hasattr(request, "_json"):
        request._json = parse_json_body(await request.body(), max_depth=_max_depth(request), root=root)
    return request._json


def _json_media(content_type: str) -> bool:
    # As FastAPI decides to parse a body as JSON: application/json or application/*+json.
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _is_json(content_type: str | None) -> bool:
    # A JSON type, or no Content-Type at all, which the Jev gateway reads as JSON (as Jev does).
    return not content_type or _json_media(content_type)


def _not_json(content_type: str | None) -> ApiError:
    """The 415 for a body sent to a JSON endpoint without a JSON ``Content-Type``, naming the header."""
    if not content_type or not content_type.strip():
        return ApiError(415, f"send the JSON body with the header {_JSON_HEADER} (no Content-Type was given)")
    media = content_type.split(";")[0].strip()
    return ApiError(415, f"unsupported Content-Type {media!r}; send the JSON body with the header {_JSON_HEADER}")


class StrictJsonRoute(APIRoute):
    """An ``APIRoute`` whose JSON request bodies are parsed strictly (``parse_json_body``) first.

    Use as ``APIRouter(route_class=StrictJsonRoute)``. Errors are raised inside the route's
    handler, so the app's exception handlers answer them (422 naming the field). A route that
    takes a body model answers a body without a JSON ``Content-Type`` (none, or another type) with
    a 415 naming the header, where FastAPI would validate the raw bytes and say the body is "not a
    valid dictionary"; a route that reads its own body (the Jev gateway) decides for itself.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        takes_model = self.body_field is not None

        async def strict_handler(request: Request) -> Response:
            content_type = request.headers.get("content-type")
            if takes_model and not (content_type and _json_media(content_type)) and await request.body():
                raise _not_json(content_type)
            if _is_json(content_type) and await request.body():
                await strict_json(request)
            return await handler(request)

        return strict_handler


def model_response(model: BaseModel, *, status_code: int = 200) -> Response:
    """``model`` as a JSON response, serialised once.

    A route that returns the model itself has FastAPI validate it again against its
    ``response_model`` and then encode it twice (to plain data, then to JSON). The model was
    validated when it was built, so a route on the hot path returns this instead and keeps
    ``response_model`` for the OpenAPI schema only.
    """
    return Response(model.model_dump_json().encode(), status_code=status_code, media_type="application/json")
