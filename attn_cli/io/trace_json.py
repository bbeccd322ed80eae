"""The JSON trace: standard JSON, fixed key order, full float64 precision, byte-stable.

Layout: ``{"format": "attn-trace", "version": 1, "name", "config", "tokens", "key_tokens",
"stages": {NAME: {"shape", "axes", "formula", "data"}}}``. Non-finite values are the strings
``"-inf"``, ``"inf"`` and ``"nan"``; each innermost row sits on one line so diffs stay readable.
``loads`` and ``load_trace_json`` read a JSON trace back as stage name -> float64 array.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from attn_cli import __version__
from attn_cli.core.inputs import FloatArray
from attn_cli.core.limits import DEFAULT_MAX_BYTES
from attn_cli.core.pipeline import Trace
from attn_cli.core.stages import STAGE_NAMES
from attn_cli.errors import InputError
from attn_cli.io import gate

FORMAT_NAME = "attn-trace"
FORMAT_VERSION = 1


def trace_config(trace: Trace) -> dict[str, Any]:
    """The configuration that produced the trace, as plain JSON values."""
    inp = trace.inputs
    return {
        "mode": inp.mode,
        "batch": inp.batch if inp.has_batch else None,
        "seq_q": inp.seq_q,
        "seq_k": inp.seq_k,
        "d_model": inp.d_model,
        "heads": inp.heads,
        "kv_heads": inp.kv_heads,
        "d_k": inp.d_k,
        "d_v": inp.d_v,
        "d_out": inp.d_out,
        "scale": trace.scale,
        "scale_source": trace.scale_source,
        "causal": inp.causal,
        "mask": inp.mask is not None,
        "bias": inp.bias is not None,
        "lengths": None if inp.lengths is None else [int(n) for n in inp.lengths],
        "dtype": trace.dtype,
    }


def dumps(trace: Trace, stages: tuple[str, ...] | None = None) -> str:
    """The JSON trace as text (``stages`` limits which stages are written)."""
    head = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "generator": f"attn {__version__}",
        "name": trace.inputs.name,
        "config": trace_config(trace),
        "tokens": list(trace.query_labels),
        "key_tokens": list(trace.key_labels),
    }
    lines = ["{"]
    for key, value in head.items():
        lines.append(f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)},")
    lines.append('  "stages": {')
    selected = [s for s in trace if stages is None or s.name in stages]
    for n, stage in enumerate(selected):
        meta = {"shape": list(stage.shape), "axes": list(stage.axes), "formula": stage.formula}
        lines.append(f"    {json.dumps(stage.name)}: {{")
        for key, value in meta.items():
            lines.append(f"      {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)},")
        lines.append(f'      "data": {_array(stage.data.tolist(), 6)}')
        lines.append("    }" + ("," if n < len(selected) - 1 else ""))
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _array(value: Any, indent: int) -> str:
    """Nested lists with the innermost rows on one line each."""
    if not value or not isinstance(value[0], list):
        return "[" + ", ".join(_number(x) for x in value) + "]"
    pad = " " * (indent + 2)
    inner = f",\n{pad}".join(_array(v, indent + 2) for v in value)
    return f"[\n{pad}{inner}\n{' ' * indent}]"


def _number(x: float) -> str:
    if math.isfinite(x):
        return repr(x)  # shortest repr that round-trips: full float64 precision
    return '"nan"' if math.isnan(x) else ('"inf"' if x > 0 else '"-inf"')


# ---------------------------------------------------------------------------------------------
# Reading a JSON trace back (golden files, dumps in the trace format)

_SPECIALS = {"-inf": -math.inf, "inf": math.inf, "nan": math.nan}
_TRACE_DOC = "a JSON trace (attn trace FIXTURE --format json)"


def load_trace_json(path: str | os.PathLike[str]) -> dict[str, FloatArray]:
    """The stages of the JSON trace in the file at ``path``."""
    source = os.fspath(path)
    return loads(read_text(Path(source), _TRACE_DOC), source)


def loads(text: str, source: str) -> dict[str, FloatArray]:
    """The stages of a JSON trace: stage name -> float64 array, "-inf"/"inf"/"nan" decoded."""
    return stages_from_json(parse_json(text, source, _TRACE_DOC), source)


def read_text(path: Path, expected: str, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """A UTF-8 text file read through the input gate; every failure an InputError."""
    source = str(path)
    data = gate.read_bytes(path, source, expected, max_bytes=max_bytes)
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise InputError(
            source, "", f"byte 0x{data[e.start]:02x} at offset {e.start} is not UTF-8", expected
        ) from None


def parse_json(text: str, source: str, expected: str) -> Any:
    """Standard JSON (NaN and Infinity literals allowed), or an InputError naming the spot."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        where = f"line {e.lineno} column {e.colno}"
        raise InputError(source, where, f"invalid JSON ({e.msg})", expected) from None
    except RecursionError:
        raise InputError(source, "", "nesting is too deep", expected) from None


def stages_from_json(obj: Any, source: str) -> dict[str, FloatArray]:
    """The ``stages`` of a parsed JSON trace, each checked against its declared shape."""
    if not isinstance(obj, dict) or obj.get("format") != FORMAT_NAME:
        raise InputError(source, "format", "not a JSON trace", f'"format": "{FORMAT_NAME}"')
    if obj.get("version") != FORMAT_VERSION:
        raise InputError(
            source, "version", f"is {obj.get('version')!r}", f"{FORMAT_VERSION} (this attn)"
        )
    stages = obj.get("stages")
    if not isinstance(stages, dict):
        raise InputError(source, "stages", "missing or not a mapping", "stage name -> stage")
    out: dict[str, FloatArray] = {}
    for name, stage in stages.items():
        field = f"stages.{name}"
        if name not in STAGE_NAMES:
            raise InputError(source, field, "unknown stage", "one of " + ", ".join(STAGE_NAMES))
        if not isinstance(stage, dict) or "data" not in stage:
            raise InputError(source, field, "has no data", 'a mapping with "shape" and "data"')
        arr = decode_array(stage["data"], source, f"{field}.data")
        shape = stage.get("shape")
        if shape is not None and shape != list(arr.shape):
            raise InputError(
                source, f"{field}.shape", f"is {shape} but the data has shape {list(arr.shape)}",
                "the shape of the data",
            )  # fmt: skip
        out[name] = arr
    return out


def decode_array(value: Any, source: str, field: str) -> FloatArray:
    """Nested lists of numbers (or the strings "-inf", "inf", "nan") as a float64 array."""
    if not isinstance(value, list):
        raise InputError(source, field, f"got {type(value).__name__}", "nested lists of numbers")
    try:
        arr = np.array(_decode(value, source, field), dtype=np.float64)
    except ValueError:
        raise InputError(
            source, field, "rows of different lengths", "a rectangular array"
        ) from None
    except OverflowError:
        raise InputError(source, field, "a number is too large for float64", "numbers") from None
    except RecursionError:
        raise InputError(source, field, "nesting is too deep", "at most 4 axes") from None
    return arr


def _decode(value: Any, source: str, field: str) -> Any:
    if isinstance(value, list):
        return [_decode(v, source, field) for v in value]
    if isinstance(value, str) and value in _SPECIALS:
        return _SPECIALS[value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    shown = repr(value) if len(repr(value)) <= 20 else repr(value)[:17] + "..."
    raise InputError(source, field, f"holds {shown}", 'numbers or "-inf", "inf", "nan"')
