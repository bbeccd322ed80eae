"""Fixture JSON: standard JSON, with literals and overflows kept so validation names them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from attn_cli.core.limits import MAX_INT_DIGITS, SHALLOW
from attn_cli.errors import InputError
from attn_cli.errors import field_name as _field

if TYPE_CHECKING:
    import json


MAX_DEPTH = 64  # lists and mappings nested deeper than this are refused, in JSON as in YAML
TOO_DEEP = f"nesting is too deep (more than {MAX_DEPTH} levels)"


class JSONSyntaxError(InputError):
    """The text is not JSON at all (so detection may still try YAML)."""


class JSONLiteral:
    """A NaN, Infinity or -Infinity literal, kept so that validation can name its field."""

    def __init__(self, name: str) -> None:
        self.name = name


class JSONOverflow:
    """A JSON number beyond float64 (``1e400``), kept so that validation can name its field."""

    def __init__(self, text: str) -> None:
        self.text = text


def _json_float(text: str) -> float | JSONOverflow:
    x = float(text)
    return x if math.isfinite(x) else JSONOverflow(text)


def parse_json(text: str, source: str) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise InputError(source, _field(key), "duplicate key", "each key once")
            out[key] = value
        return out

    def parse_int(s: str) -> int:
        if len(s.lstrip("-")) > MAX_INT_DIGITS:
            raise InputError(
                source, "", f"an integer with {len(s)} digits", f"at most {MAX_INT_DIGITS} digits"
            )
        return int(s)

    import json  # only JSON fixtures need it: start-up stays light for YAML ones

    try:
        return json.loads(
            text,
            object_pairs_hook=pairs,
            parse_constant=JSONLiteral,
            parse_int=parse_int,
            parse_float=_json_float,
        )
    except json.JSONDecodeError as e:
        raise JSONSyntaxError(
            source,
            f"line {e.lineno} column {e.colno}",
            f"invalid JSON ({json_error(e)})",
            "valid JSON",
        ) from None
    except RecursionError:
        raise InputError(source, "", "nesting is too deep", SHALLOW) from None


def json_error(e: json.JSONDecodeError) -> str:
    """The parser's message as a whole phrase: Python's ends in "at" (the position follows)."""
    import re

    return re.sub(r"\s+(?:starting\s+)?at$", "", e.msg)


def load_plain_json(raw: bytes, source: str, expected: str, field: str = "") -> Any:
    """Plain JSON from a file's bytes (a config, an index, a header), nested at most MAX_DEPTH.

    Not JSON (or not UTF-8) is a :class:`JSONSyntaxError`; deeper nesting an InputError, found
    by the parser's recursion limit or, below it, by a walk that uses no recursion.
    """
    import json

    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise JSONSyntaxError(source, field, f"is not valid JSON ({e})", expected) from None
    except RecursionError:
        raise InputError(source, field, TOO_DEEP, expected) from None
    if _deeper_than(value, MAX_DEPTH):
        raise InputError(source, field, TOO_DEEP, expected)
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether lists and mappings nest more than ``limit`` levels (the value itself is level 1)."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        items = node.values() if isinstance(node, dict) else node
        stack.extend((v, depth + 1) for v in items if isinstance(v, (dict, list)))
    return False
