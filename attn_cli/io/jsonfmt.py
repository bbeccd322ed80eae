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


def parse_json(
    text: str,
    source: str,
    expected: str = "valid JSON",
    *,
    too_deep: str = SHALLOW,
    kept: bool = True,
) -> Any:
    """Standard JSON, strict: the one reader of fixtures, JSON traces and dumps.

    A key given twice and an integer of more than ``MAX_INT_DIGITS`` digits are refused: they
    have no one meaning. With ``kept`` (fixtures), NaN and Infinity literals and numbers beyond
    float64 (``1e400``) are kept as :class:`JSONLiteral` and :class:`JSONOverflow`, so that
    validation names their field; without it (traces, dumps) the literals are read as floats
    (Python's ``json.dump`` writes them) and a number beyond float64 is refused here. Not JSON
    is a :class:`JSONSyntaxError` naming the spot, expected ``expected``; nesting past the
    parser's recursion limit an InputError, expected ``too_deep``.
    """

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

    def parse_float(s: str) -> float | JSONOverflow:
        x = float(s)
        if math.isfinite(x):
            return x
        if kept:
            return JSONOverflow(s)
        what = f"the number {_field(s)} is beyond float64"
        raise InputError(source, "", what, "numbers of at most about 1.8e308")

    import json  # only JSON fixtures need it: start-up stays light for YAML ones

    try:
        return json.loads(
            text,
            object_pairs_hook=pairs,
            parse_constant=JSONLiteral if kept else float,
            parse_int=parse_int,
            parse_float=parse_float,
        )
    except json.JSONDecodeError as e:
        where = f"line {e.lineno} column {e.colno}"
        raise JSONSyntaxError(source, where, f"invalid JSON ({json_error(e)})", expected) from None
    except RecursionError:
        raise InputError(source, "", "nesting is too deep", too_deep) from None


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
