"""Checking a parsed fixture's values: nested lists into arrays, every number counted against
the size limit, and any value described as an error line names it."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from attn_cli.core.inputs import FloatArray
from attn_cli.core.limits import MAX_NESTING
from attn_cli.errors import InputError
from attn_cli.io.jsonfmt import JSONLiteral, JSONOverflow


class Checker:
    """Turns the parsed mapping into arrays, counting numbers against the size limit."""

    def __init__(self, source: str, max_elements: int) -> None:
        self.source = source
        self.max_elements = max_elements
        self.count = 0

    def error(self, field: str, what: str, expected: str, option: str | None = None) -> InputError:
        return InputError(self.source, field, what, expected, option=option)

    def shape_of(
        self, value: Any, name: str, leaf_ok: Any, leaf_doc: str = "a number", depth: int = 0
    ) -> tuple[int, ...]:
        """Shape of a nested list, checking it is rectangular and its leaves pass ``leaf_ok``."""
        if not isinstance(value, list):
            if not leaf_ok(value):
                raise self.error(name, f"got {describe(value)}", leaf_doc)
            return ()
        if not value:
            raise self.error(name, "empty list", "a non-empty list")
        if depth >= MAX_NESTING:
            raise self.error(
                name.split("[")[0], f"lists nested more than {MAX_NESTING} deep", "at most 4 axes"
            )
        first = self.shape_of(value[0], f"{name}[0]", leaf_ok, leaf_doc, depth + 1)
        if not first:
            self.count += len(value)
            if self.count > self.max_elements:
                raise self.error(
                    name,
                    "the fixture holds too many numbers",
                    f"at most {self.max_elements:,}",
                    "max-elements",
                )
            for i, x in enumerate(value):
                if isinstance(x, list):
                    raise self.error(f"{name}[{i}]", "got a list", f"{leaf_doc} like {name}[0]")
                if not leaf_ok(x):
                    raise self.error(f"{name}[{i}]", f"got {describe(x)}", leaf_doc)
            return (len(value),)
        for i in range(1, len(value)):
            row = value[i]
            if not isinstance(row, list):
                raise self.error(f"{name}[{i}]", f"got {describe(row)}", f"a list like {name}[0]")
            if len(row) != first[0]:
                raise self.error(
                    f"{name}[{i}]",
                    f"row has {len(row)} entries",
                    f"{first[0]} like {name}[0] (rows must all be the same length)",
                )
            sub = self.shape_of(row, f"{name}[{i}]", leaf_ok, leaf_doc, depth + 1)
            if sub != first:
                raise self.error(
                    f"{name}[{i}]", f"has shape {list(sub)}", f"{list(first)} like {name}[0]"
                )
        return (len(value), *first)

    def floats(
        self,
        obj: Mapping[str, Any],
        key: str,
        ndims: Sequence[int],
        shape_doc: str,
        *,
        allow: Sequence[str] = (),
        name: str | None = None,
    ) -> FloatArray:
        """A float array with one of ``ndims`` axes; finite unless ``allow`` names specials."""
        value = obj[key]
        key = name or key
        if numeric_array(value):
            return self.array(value, key, ndims, shape_doc, finite=not allow)
        if not isinstance(value, list) and 0 not in ndims:
            raise self.error(key, f"got {describe(value)}", shape_doc)
        *most, last = ["a number", *(f'"{a}"' for a in allow)]
        leaf_doc = f"{', '.join(most)} or {last}" if most else last
        shape = self.shape_of(value, key, _number_or(allow), leaf_doc)
        if len(shape) not in ndims:
            raise self.error(key, f"has {len(shape)} axes (shape {list(shape)})", shape_doc)
        if allow:
            value = _replace_specials(value)
        try:
            arr = np.array(value, dtype=np.float64)
        except OverflowError:  # an integer beyond float64, such as 0x followed by 290 f's
            raise self.error(
                f"{key}{_first_overflow(value) or ''}",
                "is an integer beyond the range of float64",
                "a finite number (at most about 1.8e308)",
            ) from None
        if not allow:
            self.require_finite(key, arr)
        return arr

    def array(
        self, value: Any, key: str, ndims: Sequence[int], shape_doc: str, *, finite: bool
    ) -> FloatArray:
        """A NumPy array of numbers: the rules of nested lists, checked on its shape."""
        empty = next((axis for axis, n in enumerate(value.shape) if n == 0), None)
        if empty is not None:
            raise self.error(key + "[0]" * empty, "empty list", "a non-empty list")
        self.count += value.size
        if self.count > self.max_elements:
            raise self.error(
                key,
                "the fixture holds too many numbers",
                f"at most {self.max_elements:,}",
                "max-elements",
            )
        if value.ndim not in ndims:
            raise self.error(key, f"has {value.ndim} axes (shape {list(value.shape)})", shape_doc)
        arr: FloatArray = np.asarray(value, dtype=np.float64).view()  # no copy if float64
        arr.flags.writeable = False  # the caller's numbers are read, never written
        if finite:
            self.require_finite(key, arr)
        return arr

    def require_finite(self, key: str, arr: FloatArray) -> None:
        bad = ~np.isfinite(arr)
        if bad.any():
            pos = tuple(int(i) for i in np.argwhere(bad)[0])
            where = "".join(f"[{i}]" for i in pos)
            why = "not a number" if np.isnan(arr[pos]) else "infinite, or beyond float64"
            raise self.error(f"{key}{where}", f"is {arr[pos]} ({why})", "a finite number")


def _first_overflow(value: Any) -> str | None:
    """The index, as ``[i][j]``, of the first number in nested lists that float64 cannot hold."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            where = _first_overflow(item)
            if where is not None:
                return f"[{i}]{where}"
        return None
    try:
        float(value)
    except OverflowError:
        return ""
    return None


def number(x: Any) -> bool:
    """A JSON or YAML number: an int or a float (not a boolean)."""
    return type(x) is float or type(x) is int


def _number_or(specials: Sequence[str]) -> Any:
    if not specials:
        return number
    return lambda x: number(x) or (isinstance(x, str) and x in specials)


def _replace_specials(value: Any) -> Any:
    if isinstance(value, list):
        return [_replace_specials(v) for v in value]
    return float(value) if isinstance(value, str) else value


def describe(x: Any) -> str:
    """A parsed value as an error line names it: ``the string 'abc'``, ``a mapping``, ..."""
    if x is None:
        return "null"
    if isinstance(x, bool):
        return f"the boolean {str(x).lower()}"
    if isinstance(x, str):
        shown = x if len(x) <= 20 else x[:17] + "..."
        return f"the string {shown!r}"
    if isinstance(x, Mapping):
        return "a mapping"
    if isinstance(x, list):
        return "a list"
    if isinstance(x, JSONLiteral):
        return f"the JSON literal {x.name}"
    if isinstance(x, JSONOverflow):
        shown = x.text if len(x.text) <= 20 else x.text[:17] + "..."
        return f"the number {shown}, beyond the range of float64 (±1.8e308)"
    if number(x):
        shown = repr(x) if len(repr(x)) <= 20 else repr(x)[:17] + "..."
        return f"the number {shown}"
    # what else safe YAML makes: dates, timestamps, !!binary, !!set
    if isinstance(x, datetime.datetime):
        return f"the timestamp {x.isoformat()} (YAML reads unquoted timestamps as times)"
    if isinstance(x, datetime.date):
        return f"the date {x.isoformat()} (YAML reads unquoted dates as dates)"
    if isinstance(x, bytes):
        return f"{len(x)} bytes of binary data (!!binary)"
    if isinstance(x, set | frozenset):
        return "a set (!!set)"
    return type(x).__name__


def plain(value: Any) -> Any:
    """A NumPy array or scalar from a Python caller, as the lists and numbers a parser gives."""
    return value.tolist() if isinstance(value, np.ndarray | np.generic) else value


def numeric_array(value: Any) -> bool:
    """An array of real numbers with at least one axis (not booleans, strings or objects)."""
    return isinstance(value, np.ndarray) and value.ndim > 0 and value.dtype.kind in "iuf"
