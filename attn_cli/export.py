"""The JSON trace: standard JSON, fixed key order, full float64 precision, byte-stable.

Layout: ``{"format": "attn-trace", "version": 1, "name", "config", "tokens", "key_tokens",
"stages": {NAME: {"shape", "axes", "formula", "data"}}}``. Non-finite values are the strings
``"-inf"``, ``"inf"`` and ``"nan"``; each innermost row sits on one line so diffs stay readable.
"""

from __future__ import annotations

import json
import math
from typing import Any

from attn_cli import __version__
from attn_cli.pipeline import Trace

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
        "dtype": "float64",
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
