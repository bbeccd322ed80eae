"""The JSON trace: standard JSON, fixed key order, full float64 precision, byte-stable.

Layout: ``{"format": "attn-trace", "version": 1, "name", "config", "tokens", "key_tokens",
"stages": {NAME: {"shape", "axes", "formula", "data"}}}``. Non-finite values are the strings
``"-inf"``, ``"inf"`` and ``"nan"``; each innermost row sits on one line so diffs stay readable.
``loads`` and ``load_trace_json`` read a JSON trace back as stage name -> float64 array.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, TextIO, cast

import numpy as np

from attn_cli._version import __version__
from attn_cli.core.chain import REGISTRY  # with the variants attn ships registered
from attn_cli.core.inputs import FloatArray
from attn_cli.core.limits import DEFAULT_MAX_BYTES
from attn_cli.core.pipeline import Streamed, Trace
from attn_cli.core.stages import STAGE_NAMES
from attn_cli.errors import InputError
from attn_cli.io import gate
from attn_cli.io.jsonfmt import parse_json
from attn_cli.io.text import decode_text

FORMAT_NAME = "attn-trace"
FORMAT_VERSION = 1


def json_text(value: Any) -> str:
    r"""``value`` as JSON text that is safe to print: the one JSON escaper of every writer.

    Readable text stays as it is (``"猫"``), but every character that is not printable, C0 and
    C1 controls (U+009B), bidi overrides (U+202E, U+2066), zero-width characters (U+200B,
    U+FEFF), line separators and lone surrogates, is written as a ``\uXXXX`` escape, which
    any JSON reader turns back into the same character.
    """
    text = json.dumps(value, ensure_ascii=False)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _u_escape(c) for c in text)


def _u_escape(c: str) -> str:
    r"""``\uXXXX`` for one character; a pair of them beyond the Basic Multilingual Plane."""
    n = ord(c)
    if n < 0x10000:
        return f"\\u{n:04x}"
    n -= 0x10000
    return f"\\u{0xD800 + (n >> 10):04x}\\u{0xDC00 + (n & 0x3FF):04x}"


def trace_config(trace: Trace) -> dict[str, Any]:
    """The configuration that produced the trace, as plain JSON values."""
    inp = trace.inputs
    config = {
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
    return {**config, **variant_config(trace, written=tuple(config))}


def variant_config(trace: Trace, written: tuple[str, ...] = ()) -> dict[str, Any]:
    """The variants in force, each only when set (a plain fixture's config is unchanged), in
    their ``key_order``, as each writes itself (``config``); ``written``: keys already there."""
    inp = trace.inputs
    out: dict[str, Any] = {}
    if inp.X_kv is not None:
        out["d_model_kv"] = inp.d_model_kv
    listed = sorted(REGISTRY.values(), key=lambda v: v.key_order)
    on = [(v, x) for v in listed if v.name not in written and (x := v.value(inp)) is not None]
    # causal alone needs no list of positions
    if (
        inp.positions is not None
        or inp.key_positions is not None
        or any(v.reads_positions for v, _ in on)
    ):
        pos_q, pos_k = inp.token_positions()
        out["positions"] = [int(p) for p in pos_q]
        out["key_positions"] = [int(p) for p in pos_k]
    out.update((v.name, v.config(x, inp)) for v, x in on)
    if trace.upstream is not None:  # the backward pass ran
        out["backward"] = {"upstream": trace.upstream, "loss": trace.loss}
    return out


def dumps(trace: Trace | Streamed, stages: tuple[str, ...] | None = None) -> str:
    """The JSON trace as text (``stages`` limits which stages are written), for small traces;
    :func:`write_trace_json` writes the same bytes to a file without holding them."""
    return "".join(_pieces(trace, stages))


def write_trace_json(
    trace: Trace | Streamed, stream: IO[bytes] | TextIO, stages: tuple[str, ...] | None = None
) -> None:
    """The JSON trace written to ``stream`` as it is formatted, a row at a time.

    A text stream gets the text of :func:`dumps`, a binary one its UTF-8 bytes. Memory stays
    at one block of rows (of a :class:`Streamed` trace's deferred stages, one block of the
    engine's) and :data:`CHUNK_CHARS` of text, whatever the size of the file.
    """
    text = isinstance(stream, io.TextIOBase)
    pending: list[str] = []
    size = 0
    for piece in _pieces(trace, stages):
        pending.append(piece)
        size += len(piece)
        if size >= CHUNK_CHARS:
            _write(stream, "".join(pending), text)
            pending.clear()
            size = 0
    _write(stream, "".join(pending), text)


CHUNK_CHARS = 1 << 20  # text formatted before it is written


def _write(stream: IO[bytes] | TextIO, chunk: str, text: bool) -> None:
    if text:
        cast("TextIO", stream).write(chunk)
    else:  # as files.write_atomic encodes
        cast("IO[bytes]", stream).write(chunk.encode("utf-8", errors="backslashreplace"))


def _pieces(trace: Trace | Streamed, stages: tuple[str, ...] | None) -> Iterator[str]:
    """The JSON trace's text in order: the header, then each stage a row at a time."""
    held = trace.trace if isinstance(trace, Streamed) else trace
    head = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "generator": f"attn {__version__}",
        "name": held.inputs.name,
        "config": trace_config(held),
        "tokens": list(held.query_labels),
        "key_tokens": list(held.key_labels),
    }
    yield "{\n"
    for key, value in head.items():
        yield f"  {json_text(key)}: {json_text(value)},\n"
    yield '  "stages": {\n'
    selected = [s for s in trace if stages is None or s.name in stages]
    for n, stage in enumerate(selected):
        meta = {"shape": list(stage.shape), "axes": list(stage.axes), "formula": stage.formula}
        yield f"    {json_text(stage.name)}: {{\n"
        for key, value in meta.items():
            yield f"      {json_text(key)}: {json_text(value)},\n"
        yield '      "data": '
        rows = (text for block in stage.row_blocks() for text in _rows(block))
        yield from _nested(stage.shape, rows, 6)
        yield "\n    }" + (",\n" if n < len(selected) - 1 else "\n")
    yield "  }\n}\n"


def _rows(block: FloatArray) -> Iterator[str]:
    """Each row of an (R, n) block as ``[x, y, ...]``: the C encoder's text where all are
    finite (the same ``repr`` as :func:`number_text`), else number by number."""
    finite = cast("list[bool]", np.isfinite(block).all(axis=-1).tolist())  # (R,)
    for row, ok in zip(block, finite, strict=True):
        numbers = row.tolist()
        yield json.dumps(numbers) if ok else "[" + ", ".join(number_text(x) for x in numbers) + "]"


def _nested(shape: tuple[int, ...], rows: Iterator[str], indent: int) -> Iterator[str]:
    """The layout of :func:`array_text` for an array of ``shape`` whose rows come from ``rows``."""
    if len(shape) <= 1:
        yield next(rows)
        return
    if shape[0] == 0:
        yield "[]"
        return
    pad = " " * (indent + 2)
    yield f"[\n{pad}"
    for i in range(shape[0]):
        if i:
            yield f",\n{pad}"
        yield from _nested(shape[1:], rows, indent + 2)
    yield f"\n{' ' * indent}]"


def array_text(value: Any, indent: int) -> str:
    """Nested lists with the innermost rows on one line each."""
    if not value or not isinstance(value[0], list):
        return "[" + ", ".join(number_text(x) for x in value) + "]"
    pad = " " * (indent + 2)
    inner = f",\n{pad}".join(array_text(v, indent + 2) for v in value)
    return f"[\n{pad}{inner}\n{' ' * indent}]"


def number_text(x: float) -> str:
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
    return stages_from_json(
        parse_json(text, source, _TRACE_DOC, too_deep=_TRACE_DOC, kept=False), source
    )


def read_text(path: Path, expected: str, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """A UTF-8 text file read through the input gate; every failure an InputError."""
    source = str(path)
    return decode_text(gate.read_bytes(path, source, expected, max_bytes=max_bytes), source)


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
                source,
                f"{field}.shape",
                f"is {shape} but the data has shape {list(arr.shape)}",
                "the shape of the data",
            )
        out[name] = arr
    return out


MAX_AXES = 32  # nesting of a stage's data; numpy allows 64, a stage has at most 4 axes


def decode_array(value: Any, source: str, field: str) -> FloatArray:
    """Nested lists of numbers (or the strings "-inf", "inf", "nan") as a float64 array."""
    if not isinstance(value, list):
        raise InputError(source, field, f"got {type(value).__name__}", "nested lists of numbers")
    try:
        arr = np.array(_decode(value, source, field, 1), dtype=np.float64)
    except ValueError:
        raise InputError(
            source, field, "rows of different lengths", "a rectangular array"
        ) from None
    except OverflowError:
        raise InputError(source, field, "a number is too large for float64", "numbers") from None
    return arr


def _decode(value: Any, source: str, field: str, depth: int) -> Any:
    if isinstance(value, list):
        if depth > MAX_AXES:
            what = f"nesting is deeper than {MAX_AXES} lists"
            raise InputError(source, field, what, "an array of at most 4 axes")
        return [_decode(v, source, field, depth + 1) for v in value]
    if isinstance(value, str) and value in _SPECIALS:
        return _SPECIALS[value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    shown = repr(value) if len(repr(value)) <= 20 else repr(value)[:17] + "..."
    raise InputError(source, field, f"holds {shown}", 'numbers or "-inf", "inf", "nan"')
