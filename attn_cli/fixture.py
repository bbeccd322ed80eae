"""Fixture loader: a JSON or YAML file in, validated :class:`Inputs` out.

Everything a user can get wrong is caught here and raised as :class:`InputError` naming the
file, the field and what was expected. Past this module there are no loose dicts, only arrays
of known shape. Array layouts after loading (``B`` is 1 when the fixture has no batch axis):

- projection mode: ``X`` (B, seq, d_model), ``W_Q`` (d_model, heads*d_k), ``W_K`` (d_model,
  kv_heads*d_k), ``W_V`` (d_model, kv_heads*d_v), biases as vectors;
- direct mode: ``Q`` (B, heads, seq_q, d_k), ``K`` (B, kv_heads, seq_k, d_k), ``V`` (B, kv_heads,
  seq_k, d_v), whatever layout the file used.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from attn_cli.errors import InputError

STAGE_NAMES = (
    "X", "Q", "K", "V", "scores", "scaled", "masked", "softmax", "output", "concat", "projected",
)  # fmt: skip

KNOWN_KEYS = (
    "name", "description", "tokens", "key_tokens",
    "X", "W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V",
    "Q", "K", "V",
    "heads", "kv_heads", "W_O", "b_O",
    "scale", "causal", "mask", "bias", "lengths",
    "expected",
)  # fmt: skip

CAUSAL_VALUES = ("upper-left", "lower-right")

DEFAULT_MAX_ELEMENTS = 50_000_000
DEFAULT_MAX_BYTES = 512 * 1024 * 1024
MAX_INT_DIGITS = 300  # a longer integer literal is no weight anyone meant to write
MAX_NESTING = 16  # lists nested deeper than this are refused before they are walked

Causal = Literal["upper-left", "lower-right"]
FloatArray = np.ndarray[Any, np.dtype[np.float64]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]


@dataclass(frozen=True, eq=False)
class Inputs:
    """A validated fixture: every array float64 and in the layout of the module docstring."""

    source: str
    mode: Literal["projection", "direct"]
    has_batch: bool
    batch: int
    seq_q: int
    seq_k: int
    heads: int
    kv_heads: int
    d_k: int
    d_v: int
    name: str = ""
    description: str = ""
    tokens: tuple[str, ...] | None = None
    key_tokens: tuple[str, ...] | None = None
    X: FloatArray | None = None
    W_Q: FloatArray | None = None
    W_K: FloatArray | None = None
    W_V: FloatArray | None = None
    b_Q: FloatArray | None = None
    b_K: FloatArray | None = None
    b_V: FloatArray | None = None
    Q: FloatArray | None = None
    K: FloatArray | None = None
    V: FloatArray | None = None
    W_O: FloatArray | None = None
    b_O: FloatArray | None = None
    scale: float | None = None
    causal: Causal | None = None
    mask: BoolArray | None = None
    bias: FloatArray | None = None
    lengths: IntArray | None = None
    expected: Mapping[str, FloatArray] = field(default_factory=dict)

    @property
    def d_model(self) -> int | None:
        return None if self.X is None else int(self.X.shape[-1])

    @property
    def d_out(self) -> int | None:
        return None if self.W_O is None else int(self.W_O.shape[1])


# ---------------------------------------------------------------------------------------------
# Reading and parsing


def load_fixture(
    path: str | os.PathLike[str],
    *,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Inputs:
    """Read, parse and validate the fixture file at ``path`` (``-`` reads standard input)."""
    source = os.fspath(path)
    if source == "-":
        data = _read_stdin(max_bytes)
        return parse_fixture(data, "<stdin>", fmt=None, max_elements=max_elements)
    data = _read_file(Path(source), source, max_bytes)
    return parse_fixture(data, source, fmt=_format_from_suffix(source), max_elements=max_elements)


def parse_fixture(
    data: bytes | str,
    source: str,
    *,
    fmt: Literal["json", "yaml"] | None = None,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> Inputs:
    """Parse fixture text (``fmt`` None: detect JSON or YAML) and validate it."""
    text = _decode(data, source) if isinstance(data, bytes) else data.removeprefix("\ufeff")
    if not text.strip():
        raise InputError(source, "", "the file is empty", "a JSON or YAML mapping of fixture keys")
    if fmt == "json":
        obj = _parse_json(text, source)
    elif fmt == "yaml" or not text.lstrip().startswith("{"):
        obj = _parse_yaml(text, source, max_elements)
    else:  # detect: JSON, unless it is YAML in flow style ({X: [[1]]} starts with "{" too)
        try:
            obj = _parse_json(text, source)
        except _JSONSyntaxError as json_error:
            try:
                obj = _parse_yaml(text, source, max_elements)
            except InputError:
                raise json_error from None
    return validate(obj, source, max_elements=max_elements)


def _format_from_suffix(source: str) -> Literal["json", "yaml"] | None:
    suffix = Path(source).suffix.lower()
    if suffix == ".json":
        return "json"
    if suffix in (".yaml", ".yml"):
        return "yaml"
    return None


def _read_file(path: Path, source: str, max_bytes: int) -> bytes:
    try:
        if path.is_dir():
            raise InputError(source, "", "is a directory", "a .json, .yaml or .yml fixture file")
        size = path.stat().st_size
        if size > max_bytes:
            raise InputError(source, "", f"file is {size:,} bytes", f"at most {max_bytes:,} bytes")
        with path.open("rb") as f:
            return f.read(max_bytes + 1)
    except FileNotFoundError:
        raise InputError(source, "", "no such file", "a path to a fixture file") from None
    except PermissionError:
        raise InputError(source, "", "permission denied", "a readable fixture file") from None
    except OSError as e:
        raise InputError(
            source, "", f"cannot read file ({e.strerror})", "a readable file"
        ) from None


def _read_stdin(max_bytes: int) -> bytes:
    data = sys.stdin.buffer.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InputError("<stdin>", "", "input is too large", f"at most {max_bytes:,} bytes")
    return data


def _decode(data: bytes, source: str) -> str:
    if data[:2] in (b"\xff\xfe", b"\xfe\xff") or data[:4] in (b"\xff\xfe\x00\x00",):
        raise InputError(source, "", "the file is UTF-16 encoded", "UTF-8 text")
    if b"\x00" in data[:4096]:
        raise InputError(source, "", "the file is binary (it holds NUL bytes)", "UTF-8 text")
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark is harmless: drop it
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            source, "", f"byte 0x{data[e.start]:02x} at offset {e.start} is not UTF-8", "UTF-8 text"
        ) from None


class _JSONSyntaxError(InputError):
    """The text is not JSON at all (so detection may still try YAML)."""


class _JSONLiteral:
    """A NaN, Infinity or -Infinity literal, kept so that validation can name its field."""

    def __init__(self, name: str) -> None:
        self.name = name


def _parse_json(text: str, source: str) -> Any:
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

    try:
        return json.loads(
            text, object_pairs_hook=pairs, parse_constant=_JSONLiteral, parse_int=parse_int
        )
    except json.JSONDecodeError as e:
        raise _JSONSyntaxError(
            source, f"line {e.lineno} column {e.colno}", f"invalid JSON ({e.msg})", "valid JSON"
        ) from None
    except RecursionError:
        raise InputError(source, "", "nesting is too deep", "at most 4 levels of lists") from None


def _yaml_loader(source: str, max_elements: int) -> Any:
    import yaml

    base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:
                    duplicate = False
                if duplicate:
                    line = key_node.start_mark.line + 1
                    raise InputError(
                        source, _field(key), f"duplicate key (line {line})", "each key once"
                    )
                with contextlib.suppress(TypeError):  # unhashable keys are reported later
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

        def construct_yaml_int(self, node: Any) -> Any:
            digits = len(node.value.lstrip("+-").replace("_", ""))
            if digits > MAX_INT_DIGITS:
                raise InputError(
                    source, f"line {node.start_mark.line + 1}", f"an integer with {digits} digits",
                    f"at most {MAX_INT_DIGITS} digits",
                )  # fmt: skip
            return super().construct_yaml_int(node)

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    # YAML 1.1 reads 1e-3 (no dot, or no exponent sign) as a string; read it as YAML 1.2 does.
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_EXPONENT, list("-+.0123456789"))
    return Loader


_YAML12_EXPONENT = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")


def _expanded_size(node: Any, memo: dict[int, int], limit: int, depth: int = 0) -> int:
    """Count scalars in a YAML node graph as if aliases were expanded, without expanding them."""
    key = id(node)
    if key in memo:
        return memo[key]
    if depth > 64:
        raise RecursionError
    value = node.value
    if isinstance(value, list):
        total = 0
        for item in value:
            parts = item if isinstance(item, tuple) else (item,)
            for part in parts:
                total += _expanded_size(part, memo, limit, depth + 1)
                if total > limit:
                    break
    else:
        total = 1
    memo[key] = total
    return total


def _parse_yaml(text: str, source: str, max_elements: int) -> Any:
    import yaml

    loader = _yaml_loader(source, max_elements)(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise InputError(source, "", "the file is empty", "a YAML mapping of fixture keys")
        # Aliases are legal but may expand exponentially ("billion laughs"): size the graph first.
        size = _expanded_size(node, {}, max_elements * 2)
        if size > max_elements * 2:
            raise InputError(
                source, "", "the document expands to too many values",
                f"at most {max_elements:,} numbers (see --max-elements)",
            )  # fmt: skip
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = ", ".join(" ".join(p.split()) for p in (e.context, e.problem) if p)
        raise InputError(source, where, f"invalid YAML ({problem})", "plain YAML data") from None
    except yaml.YAMLError as e:
        problem = " ".join(str(e).split())
        raise InputError(source, "", f"invalid YAML ({problem})", "plain YAML data") from None
    except RecursionError:
        raise InputError(source, "", "nesting is too deep", "at most 4 levels of lists") from None
    finally:
        loader.dispose()


# ---------------------------------------------------------------------------------------------
# Validation


class _Checker:
    """Turns the parsed mapping into arrays, counting numbers against the size limit."""

    def __init__(self, source: str, max_elements: int) -> None:
        self.source = source
        self.max_elements = max_elements
        self.count = 0

    def error(self, field: str, what: str, expected: str) -> InputError:
        return InputError(self.source, field, what, expected)

    def shape_of(
        self, value: Any, name: str, leaf_ok: Any, leaf_doc: str = "a number", depth: int = 0
    ) -> tuple[int, ...]:
        """Shape of a nested list, checking it is rectangular and its leaves pass ``leaf_ok``."""
        if not isinstance(value, list):
            if not leaf_ok(value):
                raise self.error(name, f"got {_describe(value)}", leaf_doc)
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
                    name, "the fixture holds too many numbers",
                    f"at most {self.max_elements:,} (see --max-elements)",
                )  # fmt: skip
            for i, x in enumerate(value):
                if isinstance(x, list):
                    raise self.error(f"{name}[{i}]", "got a list", f"{leaf_doc} like {name}[0]")
                if not leaf_ok(x):
                    raise self.error(f"{name}[{i}]", f"got {_describe(x)}", leaf_doc)
            return (len(value),)
        for i in range(1, len(value)):
            row = value[i]
            if not isinstance(row, list):
                raise self.error(f"{name}[{i}]", f"got {_describe(row)}", f"a list like {name}[0]")
            if len(row) != first[0]:
                raise self.error(
                    f"{name}[{i}]", f"row has {len(row)} entries",
                    f"{first[0]} like {name}[0] (rows must all be the same length)",
                )  # fmt: skip
            sub = self.shape_of(row, f"{name}[{i}]", leaf_ok, leaf_doc, depth + 1)
            if sub != first:
                raise self.error(
                    f"{name}[{i}]", f"has shape {list(sub)}", f"{list(first)} like {name}[0]"
                )
        return (len(value), *first)

    def floats(
        self, obj: Mapping[str, Any], key: str, ndims: Sequence[int], shape_doc: str,
        *, allow: Sequence[str] = (), name: str | None = None,
    ) -> FloatArray:  # fmt: skip
        """A float array with one of ``ndims`` axes; finite unless ``allow`` names specials."""
        value = obj[key]
        key = name or key
        if not isinstance(value, list) and 0 not in ndims:
            raise self.error(key, f"got {_describe(value)}", shape_doc)
        *most, last = ["a number", *(f'"{a}"' for a in allow)]
        leaf_doc = f"{', '.join(most)} or {last}" if most else last
        shape = self.shape_of(value, key, _number_or(allow), leaf_doc)
        if len(shape) not in ndims:
            raise self.error(key, f"has {len(shape)} axes (shape {list(shape)})", shape_doc)
        if allow:
            value = _replace_specials(value)
        try:
            arr = np.array(value, dtype=np.float64)
        except OverflowError:
            raise self.error(key, "a number is too large for float64", "finite numbers") from None
        if not allow:
            self.require_finite(key, arr)
        return arr

    def require_finite(self, key: str, arr: FloatArray) -> None:
        bad = ~np.isfinite(arr)
        if bad.any():
            pos = tuple(int(i) for i in np.argwhere(bad)[0])
            where = "".join(f"[{i}]" for i in pos)
            raise self.error(f"{key}{where}", f"is {arr[pos]} (overflow?)", "a finite number")


def _number(x: Any) -> bool:
    return type(x) is float or type(x) is int


def _number_or(specials: Sequence[str]) -> Any:
    if not specials:
        return _number
    return lambda x: _number(x) or (isinstance(x, str) and x in specials)


def _replace_specials(value: Any) -> Any:
    if isinstance(value, list):
        return [_replace_specials(v) for v in value]
    return float(value) if isinstance(value, str) else value


def _describe(x: Any) -> str:
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
    if isinstance(x, _JSONLiteral):
        return f"the JSON literal {x.name}"
    if _number(x):
        shown = repr(x) if len(repr(x)) <= 20 else repr(x)[:17] + "..."
        return f"the number {shown}"
    return type(x).__name__


def _plain(value: Any) -> Any:
    """A NumPy array or scalar from a Python caller, as the lists and numbers a parser gives."""
    return value.tolist() if isinstance(value, np.ndarray | np.generic) else value


def _field(key: Any) -> str:
    """A key as it may appear in a one-line message."""
    shown = str(key) if len(str(key)) <= 40 else str(key)[:37] + "..."
    return shown if shown.isprintable() and shown.strip() == shown != "" else repr(shown)


def _suggest(key: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, choices, n=1, cutoff=0.6)
    if not close:
        close = [c for c in choices if c.lower() == key.lower()]
    return f" (did you mean {close[0]!r}?)" if close else ""


def validate(obj: Any, source: str, *, max_elements: int = DEFAULT_MAX_ELEMENTS) -> Inputs:
    """Validate a parsed fixture mapping (values may be NumPy arrays) and build :class:`Inputs`."""
    if not isinstance(obj, Mapping):
        raise InputError(source, "", f"top level is {_describe(obj)}", "a mapping of fixture keys")
    for key in obj:
        if not isinstance(key, str):
            raise InputError(source, _field(key), f"key is {_describe(key)}", "a string key")
        if key not in KNOWN_KEYS:
            raise InputError(
                source, _field(key), f"unknown key{_suggest(key, KNOWN_KEYS)}",
                "one of " + ", ".join(KNOWN_KEYS),
            )  # fmt: skip
    # `key: null` means the key is omitted.
    obj = {k: _plain(v) for k, v in obj.items() if v is not None}
    c = _Checker(source, max_elements)

    name = _string(c, obj, "name")
    description = _string(c, obj, "description")
    heads = _positive_int(c, obj, "heads")
    kv_heads = _positive_int(c, obj, "kv_heads")

    projection = [k for k in ("X", "W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V") if k in obj]
    direct = [k for k in ("Q", "K", "V") if k in obj]
    if projection and direct:
        raise c.error(
            direct[0], f"both modes at once ({', '.join(projection)} and {', '.join(direct)})",
            "either X with W_Q, W_K, W_V (projection mode) or Q, K, V (direct mode)",
        )  # fmt: skip
    if not projection and not direct:
        raise c.error(
            "", "no inputs", "X with W_Q, W_K, W_V (projection mode) or Q, K, V (direct mode)"
        )

    if projection:
        arrays = _projection(c, obj, heads, kv_heads)
    else:
        arrays = _direct(c, obj, heads, kv_heads)
    batch, seq_q, seq_k = arrays["batch"], arrays["seq_q"], arrays["seq_k"]
    heads, kv_heads = arrays["heads"], arrays["kv_heads"]

    W_O = b_O = None
    if "W_O" in obj:
        W_O = c.floats(
            obj, "W_O", (2,), f"shape [heads*d_v, d_out] = [{heads * arrays['d_v']}, d_out]"
        )
        if W_O.shape[0] != heads * arrays["d_v"]:
            raise c.error(
                "W_O", f"has {W_O.shape[0]} rows",
                f"heads*d_v = {heads}*{arrays['d_v']} = {heads * arrays['d_v']} rows",
            )  # fmt: skip
        if "b_O" in obj:
            b_O = _vector(c, obj, "b_O", W_O.shape[1], "d_out (columns of W_O)")
    elif "b_O" in obj:
        raise c.error("b_O", "given without W_O", "W_O [heads*d_v, d_out] alongside b_O")

    scale = None
    if "scale" in obj:
        s = obj["scale"]
        if not _number(s):
            raise c.error("scale", f"got {_describe(s)}", "a number > 0")
        try:
            finite = math.isfinite(float(s))
        except OverflowError:  # an int beyond float64
            finite = False
        if not finite or s <= 0:
            raise c.error("scale", f"is {s}", "a finite number > 0 (omit it for 1/sqrt(d_k))")
        scale = float(s)

    causal = _causal(c, obj)
    target = (batch, heads, seq_q, seq_k)
    mask = _mask(c, obj, target, arrays["has_batch"])
    bias = None
    if "bias" in obj:
        bias = c.floats(
            obj, "bias", (0, 1, 2, 3, 4),
            "at most 4 axes, broadcastable to [batch, heads, seq_q, seq_k]",
            allow=("-inf",),
        )  # fmt: skip
        bad = np.isnan(bias) | (bias == np.inf)
        if bad.any():
            pos = tuple(int(i) for i in np.argwhere(bad)[0])
            where = "".join(f"[{i}]" for i in pos)
            raise c.error(f"bias{where}", f"is {bias[pos]}", "a finite number or -inf")
        _check_broadcast(c, "bias", bias.shape, target, arrays["has_batch"])
    lengths = _lengths(c, obj, batch, seq_k, arrays["has_batch"])

    tokens = _tokens(c, obj, "tokens", seq_q, "seq_q (one per query position)")
    key_tokens = _tokens(c, obj, "key_tokens", seq_k, "seq_k (one per key position)")
    if key_tokens is None and tokens is not None and seq_q == seq_k:
        key_tokens = tokens

    expected = _expected(c, obj)

    return Inputs(
        source=source,
        mode="projection" if projection else "direct",
        has_batch=arrays["has_batch"],
        batch=batch,
        seq_q=seq_q,
        seq_k=seq_k,
        heads=heads,
        kv_heads=kv_heads,
        d_k=arrays["d_k"],
        d_v=arrays["d_v"],
        name=name,
        description=description,
        tokens=tokens,
        key_tokens=key_tokens,
        X=arrays.get("X"),
        W_Q=arrays.get("W_Q"),
        W_K=arrays.get("W_K"),
        W_V=arrays.get("W_V"),
        b_Q=arrays.get("b_Q"),
        b_K=arrays.get("b_K"),
        b_V=arrays.get("b_V"),
        Q=arrays.get("Q"),
        K=arrays.get("K"),
        V=arrays.get("V"),
        W_O=W_O,
        b_O=b_O,
        scale=scale,
        causal=causal,
        mask=mask,
        bias=bias,
        lengths=lengths,
        expected=expected,
    )


def _string(c: _Checker, obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key, "")
    if not isinstance(value, str):
        raise c.error(key, f"got {_describe(value)}", "a string")
    return value


def _positive_int(c: _Checker, obj: Mapping[str, Any], key: str) -> int | None:
    if key not in obj:
        return None
    value = obj[key]
    if type(value) is not int:
        raise c.error(key, f"got {_describe(value)}", "a whole number >= 1")
    if value < 1:
        raise c.error(key, f"is {value}", "a whole number >= 1")
    return value


def _vector(c: _Checker, obj: Mapping[str, Any], key: str, size: int, what: str) -> FloatArray:
    arr = c.floats(obj, key, (1,), f"a vector of length {what} = {size}")
    if arr.shape[0] != size:
        raise c.error(key, f"has length {arr.shape[0]}", f"{what} = {size}")
    return arr


def _split(c: _Checker, key: str, width: int, n: int, n_name: str) -> int:
    if width % n:
        raise c.error(
            key, f"has {width} columns, not divisible by {n_name} = {n}",
            f"a multiple of {n_name} (each head owns a contiguous block of columns)",
        )  # fmt: skip
    return width // n


def _projection(
    c: _Checker, obj: Mapping[str, Any], heads: int | None, kv_heads: int | None
) -> dict[str, Any]:
    for key in ("X", "W_Q", "W_K", "W_V"):
        if key not in obj:
            raise c.error(key, "missing", "X, W_Q, W_K and W_V together (projection mode)")
    X = c.floats(obj, "X", (2, 3), "shape [seq, d_model] or [batch, seq, d_model]")
    has_batch = X.ndim == 3
    X = X if has_batch else X[None]  # (batch, seq, d_model)
    d_model = X.shape[2]
    H = heads or 1
    Hkv = kv_heads or H
    _check_groups(c, H, Hkv)
    W = {}
    for key, n_name in (("W_Q", "heads"), ("W_K", "kv_heads"), ("W_V", "kv_heads")):
        w = c.floats(obj, key, (2,), f"shape [d_model, {n_name}*d] = [{d_model}, {n_name}*d]")
        if w.shape[0] != d_model:
            raise c.error(key, f"has {w.shape[0]} rows", f"d_model = {d_model} rows (columns of X)")
        W[key] = w
    d_k = _split(c, "W_Q", W["W_Q"].shape[1], H, "heads")
    d_k_kv = _split(c, "W_K", W["W_K"].shape[1], Hkv, "kv_heads")
    if d_k_kv != d_k:
        raise c.error(
            "W_K", f"has {W['W_K'].shape[1]} columns (d_k = {d_k_kv} per head)",
            f"kv_heads*d_k = {Hkv}*{d_k} = {Hkv * d_k} columns, matching W_Q",
        )  # fmt: skip
    d_v = _split(c, "W_V", W["W_V"].shape[1], Hkv, "kv_heads")
    out: dict[str, Any] = {"X": X, **W}
    for key, w_key in (("b_Q", "W_Q"), ("b_K", "W_K"), ("b_V", "W_V")):
        if key in obj:
            out[key] = _vector(c, obj, key, W[w_key].shape[1], f"columns of {w_key}")
    seq = X.shape[1]
    out.update(
        has_batch=has_batch, batch=X.shape[0], seq_q=seq, seq_k=seq,
        heads=H, kv_heads=Hkv, d_k=d_k, d_v=d_v,
    )  # fmt: skip
    return out


def _check_groups(c: _Checker, heads: int, kv_heads: int) -> None:
    if heads % kv_heads:
        raise c.error(
            "kv_heads", f"is {kv_heads}, which does not divide heads = {heads}",
            "a divisor of heads (grouped-query attention)",
        )  # fmt: skip


def _direct(
    c: _Checker, obj: Mapping[str, Any], heads: int | None, kv_heads: int | None
) -> dict[str, Any]:
    for key in ("Q", "K", "V"):
        if key not in obj:
            raise c.error(key, "missing", "Q, K and V together (direct mode)")
    layouts = "shape [seq, heads*d], [batch, seq, heads*d] or [batch, heads, seq, d]"
    Q = c.floats(obj, "Q", (2, 3, 4), layouts)
    K = c.floats(obj, "K", (2, 3, 4), layouts)
    V = c.floats(obj, "V", (2, 3, 4), layouts)
    for key, arr in (("K", K), ("V", V)):
        if arr.ndim != Q.ndim:
            raise c.error(key, f"has {arr.ndim} axes but Q has {Q.ndim}", "the same layout as Q")
    has_batch = Q.ndim >= 3
    if Q.ndim == 4:
        H, Hkv = Q.shape[1], K.shape[1]
        for key, given, actual in (("heads", heads, H), ("kv_heads", kv_heads, Hkv)):
            if given is not None and given != actual:
                raise c.error(
                    key, f"is {given} but the arrays have {actual} on their head axis",
                    f"{actual}, or omit it (4-axis arrays carry their heads)",
                )  # fmt: skip
        if V.shape[1] != Hkv:
            raise c.error("V", f"has {V.shape[1]} heads", f"as many as K ({Hkv})")
        _check_groups(c, H, Hkv)
        q, k, v = Q, K, V
    else:
        H = heads or 1
        Hkv = kv_heads or H
        _check_groups(c, H, Hkv)
        if Q.ndim == 2:
            Q, K, V = Q[None], K[None], V[None]  # (1, seq, heads*d)
        d_q = _split(c, "Q", Q.shape[2], H, "heads")
        d_kk = _split(c, "K", K.shape[2], Hkv, "kv_heads")
        d_vv = _split(c, "V", V.shape[2], Hkv, "kv_heads")
        # (batch, seq, heads*d) -> (batch, heads, seq, d): head h owns columns h*d:(h+1)*d
        q = Q.reshape(Q.shape[0], Q.shape[1], H, d_q).transpose(0, 2, 1, 3)
        k = K.reshape(K.shape[0], K.shape[1], Hkv, d_kk).transpose(0, 2, 1, 3)
        v = V.reshape(V.shape[0], V.shape[1], Hkv, d_vv).transpose(0, 2, 1, 3)
    if k.shape[3] != q.shape[3]:
        raise c.error("K", f"has d_k = {k.shape[3]} per head", f"d_k = {q.shape[3]} as in Q")
    for key, arr in (("K", k), ("V", v)):
        if arr.shape[0] != q.shape[0]:
            raise c.error(key, f"has batch {arr.shape[0]}", f"batch {q.shape[0]} as in Q")
    if v.shape[2] != k.shape[2]:
        raise c.error("V", f"has {v.shape[2]} positions", f"seq_k = {k.shape[2]} as in K")
    return {
        "Q": np.ascontiguousarray(q), "K": np.ascontiguousarray(k), "V": np.ascontiguousarray(v),
        "has_batch": has_batch, "batch": q.shape[0], "seq_q": q.shape[2], "seq_k": k.shape[2],
        "heads": q.shape[1], "kv_heads": k.shape[1], "d_k": q.shape[3], "d_v": v.shape[3],
    }  # fmt: skip


def _causal(c: _Checker, obj: Mapping[str, Any], key: str = "causal") -> Causal | None:
    value = obj.get(key, False)
    if value is False:
        return None
    if value is True:
        return "upper-left"
    if value in CAUSAL_VALUES:
        return value  # type: ignore[no-any-return]
    raise c.error(key, f"got {_describe(value)}", 'false, true, "upper-left" or "lower-right"')


def _check_broadcast(
    c: _Checker, key: str, shape: tuple[int, ...], target: tuple[int, ...], has_batch: bool
) -> None:
    names = ("batch", "heads", "seq_q", "seq_k")
    if len(shape) > 4 or any(
        s not in (1, t) for s, t in zip(reversed(shape), reversed(target), strict=False)
    ):
        tgt = ", ".join(f"{n}={t}" for n, t in zip(names, target, strict=True))
        raise c.error(
            key, f"has shape {list(shape)}, which does not broadcast",
            f"a shape broadcastable (right-aligned, as torch) to [{tgt}]",
        )  # fmt: skip


def _mask(
    c: _Checker, obj: Mapping[str, Any], target: tuple[int, ...], has_batch: bool
) -> BoolArray | None:
    if "mask" not in obj:
        return None

    def ok(x: Any) -> bool:
        return isinstance(x, bool) or (type(x) is int and x in (0, 1))

    shape = c.shape_of(obj["mask"], "mask", ok, "true/false or 1/0")
    if len(shape) > 4:
        raise c.error("mask", f"has {len(shape)} axes", "at most 4 [batch, heads, seq_q, seq_k]")
    _check_broadcast(c, "mask", shape, target, has_batch)
    return np.array(obj["mask"], dtype=bool)


def _lengths(
    c: _Checker, obj: Mapping[str, Any], batch: int, seq_k: int, has_batch: bool
) -> IntArray | None:
    if "lengths" not in obj:
        return None
    value = obj["lengths"]
    items = value if isinstance(value, list) else [value]
    for i, n in enumerate(items):
        name = f"lengths[{i}]" if isinstance(value, list) else "lengths"
        if type(n) is not int:
            raise c.error(name, f"got {_describe(n)}", f"a whole number of valid keys, 0..{seq_k}")
        if not 0 <= n <= seq_k:
            raise c.error(name, f"is {n}", f"a number of valid keys between 0 and seq_k = {seq_k}")
    if len(items) != batch:
        raise c.error("lengths", f"has {len(items)} entries", f"one per batch item ({batch})")
    return np.array(items, dtype=np.int64)


def _tokens(
    c: _Checker, obj: Mapping[str, Any], key: str, n: int, what: str
) -> tuple[str, ...] | None:
    if key not in obj:
        return None
    value = obj[key]
    if not isinstance(value, list):
        raise c.error(key, f"got {_describe(value)}", "a list of strings")
    for i, t in enumerate(value):
        if not isinstance(t, str):
            raise c.error(f"{key}[{i}]", f"got {_describe(t)}", "a string (quote it in YAML)")
    if len(value) != n:
        raise c.error(key, f"has {len(value)} tokens", f"{n} = {what}")
    return tuple(value)


def _expected(c: _Checker, obj: Mapping[str, Any]) -> dict[str, FloatArray]:
    if "expected" not in obj:
        return {}
    value = obj["expected"]
    if not isinstance(value, Mapping):
        raise c.error("expected", f"got {_describe(value)}", "a mapping of stage name to array")
    value = {stage: _plain(arr) for stage, arr in value.items()}
    out: dict[str, FloatArray] = {}
    for stage, arr in value.items():
        if stage not in STAGE_NAMES:
            raise c.error(
                f"expected.{_field(stage)}", f"unknown stage{_suggest(str(stage), STAGE_NAMES)}",
                "one of " + ", ".join(STAGE_NAMES),
            )  # fmt: skip
        if arr is None:
            continue
        out[stage] = c.floats(
            value, stage, (1, 2, 3, 4), "an array of 1 to 4 axes in the JSON trace layout",
            allow=("-inf", "inf", "nan"), name=f"expected.{stage}",
        )  # fmt: skip
    return out
