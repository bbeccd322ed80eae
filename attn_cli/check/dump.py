"""A user's dump as the grader reads it: stage values by name (a ``.json`` mapping, a JSON
trace, or a ``.npz`` of arrays named after stages or their aliases), or a decode loop's or a
flash kernel's outputs (attn's own formats, or plain names: decode_output, O and L).

Every way a dump can be unreadable is an InputError. grade.py, grade_backward.py and
grade_decode.py all read the types declared here.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attn_cli.core.inputs import FloatArray
from attn_cli.core.limits import DEFAULT_MAX_BYTES, DEFAULT_MAX_ELEMENTS
from attn_cli.core.stages import GRADIENT_STAGE_NAMES, STAGE_NAMES
from attn_cli.errors import InputError
from attn_cli.io import gate
from attn_cli.io.decode_json import BATCH_FORMAT, DECODE_FORMAT, FLASH_FORMAT
from attn_cli.io.jsonfmt import parse_json
from attn_cli.io.trace_json import decode_array, read_text, stages_from_json

DUMP_DOC = (
    "a .json mapping stage name -> nested list (or a JSON trace), or a .npz of arrays "
    "named after stages"
)


@dataclass(frozen=True, eq=False)
class Dump:
    """A user's stage values, keyed by stage name, with the aliases used and names ignored."""

    source: str
    arrays: Mapping[str, FloatArray]
    aliases: Mapping[str, str]  # name in the file -> stage
    ignored: tuple[str, ...]


@dataclass(frozen=True)
class DumpTile:
    """One tile's running max and sum as a kernel reported them (``batch`` 0 without one)."""

    batch: int
    head: int
    q_block: tuple[int, int]
    k_block: tuple[int, int]
    m: FloatArray  # (bq,)
    l: FloatArray  # noqa: E741 (the paper's name)


@dataclass(frozen=True, eq=False)
class DecodeDump(Dump):
    """A decode loop's outputs: one per generated token, and optionally its final cache."""

    outputs: FloatArray  # (steps, ...) the step axis first
    prefill: int | None
    K_cache: FloatArray | None
    V_cache: FloatArray | None
    block_size: int | None = None  # a paged cache's tokens a page (its K_cache: the gather's)


@dataclass(frozen=True, eq=False)
class BatchDump(Dump):
    """A continuous batch's outputs: per sequence its fixture, its step of arrival and every
    token's output (heads, tokens, d_v); the prefill and chunk the batch ran with."""

    sequences: tuple[tuple[str, int, FloatArray], ...]  # (fixture, arrive, output)
    prefill: int
    chunk: int | None
    block_size: int | None = None  # a paged batch: tokens a page
    share_prefix: bool = False  # its prompt pages shared


@dataclass(frozen=True, eq=False)
class FlashDump(Dump):
    """A flash kernel's O and L (base 2 when ``base2``), optionally its blocks and tiles."""

    output: FloatArray
    lse: FloatArray
    block_q: int | None
    block_k: int | None
    base2: bool
    tiles: tuple[DumpTile, ...]
    split_kv: int | None = None  # the keys in this many chunks, merged (attn flash --split-kv)


# ---------------------------------------------------------------------------------------------
# The names a dump's arrays go by

# What people's code calls a gradient, besides d_<stage> (compared in lower case): dQ, grad_q,
# q.grad, q_grad, dL_dQ for every stage and input, and the paper's letters P, S, O.
_SHORT = {
    "p": "softmax",
    "s": "d_masked",
    "o": "output",
    "attn": "softmax",
    "weights": "softmax",
    "attn_weights": "softmax",
    "p_attn": "softmax",
    "attention_weights": "softmax",
    "out": "output",
    "logits": "scores",
}
DS_ALIAS = "d_masked"  # "dS": the gradient the softmax's input receives (retargeted per trace)


def _forms(name: str) -> tuple[str, ...]:
    """The spellings of d(name): dq, d_q, grad_q, q.grad, q_grad, dl_dq, and dwq for d(w_q)."""
    low = name.lower()
    forms = [f"d{low}", f"d_{low}", f"grad_{low}", f"{low}.grad", f"{low}_grad", f"dl_d{low}"]
    if "_" in low:  # w_q -> wq
        forms += list(_forms(low.replace("_", "")))
    return tuple(forms)


def _gradient_aliases() -> dict[str, str]:
    """Lower-case names -> gradient stage, for ALIASES."""
    out: dict[str, str] = {}
    for stage in GRADIENT_STAGE_NAMES:
        if stage.startswith("d_"):
            for form in _forms(stage.removeprefix("d_")):
                out.setdefault(form, stage)
    for short, stage in _SHORT.items():
        target = stage if stage.startswith("d_") else f"d_{stage}"
        for form in _forms(short):
            out.setdefault(form, target)
    out.pop("d_out", None)  # an axis name (d_out), and ambiguous: d(output) or d_out columns?
    return out


# Names that people's code commonly gives a stage (compared in lower case).
ALIASES = {
    "weights": "softmax",
    "attn": "softmax",
    "p_attn": "softmax",
    "attention": "softmax",
    "attn_weights": "softmax",
    "attention_weights": "softmax",
    "out": "output",
    "context": "output",
    "logits": "scores",
}
ALIASES.update(_gradient_aliases())  # dQ, grad_q, q.grad, dS, dP, ...


# ---------------------------------------------------------------------------------------------
# Reading a stage dump


def stage_for(name: str) -> str | None:
    """The stage a dump's array name stands for: itself, an alias, or a stage in other case."""
    if name in STAGE_NAMES:
        return name
    low = name.lower()
    if low in ALIASES:
        return ALIASES[low]
    return next((s for s in STAGE_NAMES if s.lower() == low), None)


def load_dump(path: Path) -> Dump:
    """Read a ``.json`` or ``.npz`` dump; every way it can be unreadable is an InputError."""
    source = str(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        obj = parse_json(read_text(path, DUMP_DOC), source, DUMP_DOC, too_deep=DUMP_DOC, kept=False)
        if _is_special(obj):
            return _special_dump(obj, source)
        if isinstance(obj, dict) and "format" in obj:
            raw: dict[str, Any] = dict(stages_from_json(obj, source))  # a JSON trace
        elif isinstance(obj, dict):
            raw = {k: decode_array(v, source, k) if stage_for(k) else v for k, v in obj.items()}
        else:
            raise InputError(source, "", f"top level is {type(obj).__name__}", DUMP_DOC)
    elif suffix == ".npz":
        special = _special_npz(path)
        if special is not None:
            return special
        raw = _read_npz(path)
    else:
        raise InputError(source, "", f"unknown dump type {suffix or '(no suffix)'!r}", DUMP_DOC)
    arrays: dict[str, FloatArray] = {}
    named: dict[str, str] = {}
    aliases: dict[str, str] = {}
    ignored: list[str] = []
    for name, value in raw.items():
        stage = stage_for(name)
        if stage is None:
            ignored.append(name)
            continue
        if stage in named:
            raise InputError(
                source,
                name,
                f"names the same stage ({stage}) as {named[stage]!r}",
                "one array per stage",
            )
        named[stage] = name
        if name != stage:
            aliases[name] = stage
        arrays[stage] = value
    if not arrays:
        shown = ", ".join(ignored[:5]) or "nothing"
        raise InputError(
            source,
            "",
            f"no stage found (it holds {shown})",
            "arrays named after stages: " + ", ".join(STAGE_NAMES) + " (or aliases such as "
            "weights, attn, out)",
        )
    ordered = {s: arrays[s] for s in STAGE_NAMES if s in arrays}
    return Dump(source, ordered, aliases, tuple(ignored))


def _read_npz(path: Path) -> dict[str, Any]:
    """The stage arrays of a dump ``.npz``, read through the input gate under its budgets."""
    source = str(path)
    reader = gate.ArrayReader(DEFAULT_MAX_ELEMENTS, DEFAULT_MAX_BYTES)
    out: dict[str, Any] = {}
    with (
        gate.open_regular(path, source, DUMP_DOC, max_bytes=DEFAULT_MAX_BYTES) as f,
        reader.archive(f, source) as archive,
    ):
        for member in archive.namelist():
            name = member.removesuffix(".npy")
            if stage_for(name) is None:
                out[name] = None
                continue
            arr = reader.read_member(archive, member, name, source)  # numbers only
            out[name] = arr.astype(np.float64)
    return out


# ---------------------------------------------------------------------------------------------
# Decode and flash dumps

DECODE_KEYS = ("decode_output", "step_outputs")  # (steps, [batch,] heads, d_v) in any layout
LSE_KEYS = ("lse", "L", "logsumexp")
OUTPUT_KEYS = ("output", "O", "out")
FLASH_EXTRA = ("block_q", "block_k", "base2", "tiles", "split_kv")
DECODE_EXTRA = ("prefill", "K_cache", "V_cache", "block_size")


def _dump_kind(names: Collection[str]) -> str | None:
    """ "decode", "flash" or None (an ordinary stage dump) from the names a dump holds."""
    have = set(names)
    if have & set(DECODE_KEYS):
        return "decode"
    flash = set(LSE_KEYS) | set(OUTPUT_KEYS) | set(FLASH_EXTRA)
    if have & set(LSE_KEYS) and have & set(OUTPUT_KEYS) and have <= flash:
        return "flash"
    return None


def _is_special(obj: Any) -> bool:
    """Whether a parsed JSON dump is a decode or flash dump (not a trace or a stage mapping)."""
    if not isinstance(obj, dict):
        return False
    if "format" in obj:
        return obj["format"] in (DECODE_FORMAT, FLASH_FORMAT, BATCH_FORMAT)
    return _dump_kind(obj) is not None


def _special_dump(obj: dict[str, Any], source: str) -> Dump:
    """A decode or flash dump from parsed JSON: attn's own formats, or plain names."""
    fmt = obj.get("format")
    if fmt == BATCH_FORMAT:
        return _batch_dump(obj, source)
    if fmt == DECODE_FORMAT:
        steps = _field(obj, "steps", list, source)
        if not steps:
            raise InputError(source, "steps", "is empty", "one entry per decoded token")
        stages = [_field(s, "stages", dict, source, f"steps[{i}]") for i, s in enumerate(steps)]
        outputs = [_stage_data(st, "output", source, f"steps[{i}]") for i, st in enumerate(stages)]
        last = stages[-1]
        caches = [
            _stage_data(last, n, source, "steps[-1]") if n in last else None
            for n in ("K_cache", "V_cache")
        ]
        paged = obj.get("paged")
        size = paged.get("block_size") if isinstance(paged, dict) else None
        return _decode_dump(
            source,
            _stack(outputs, source),
            obj.get("prefill"),
            caches[0],
            caches[1],
            block_size=size,
        )
    if fmt == FLASH_FORMAT:
        stages = _field(obj, "stages", dict, source)
        output, lse = (_stage_data(stages, n, source, "stages") for n in ("output", "lse"))
        return _flash_dump(source, output, lse, obj, obj.get("tiles") or [])
    if _dump_kind(obj) == "decode":
        key = next(k for k in DECODE_KEYS if k in obj)
        caches = [
            None if obj.get(n) is None else decode_array(obj[n], source, n)
            for n in ("K_cache", "V_cache")
        ]
        return _decode_dump(
            source,
            decode_array(obj[key], source, key),
            obj.get("prefill"),
            caches[0],
            caches[1],
            block_size=obj.get("block_size"),
        )
    output = next(decode_array(obj[k], source, k) for k in OUTPUT_KEYS if k in obj)
    lse = next(decode_array(obj[k], source, k) for k in LSE_KEYS if k in obj)
    return _flash_dump(source, output, lse, obj, obj.get("tiles") or [])


def _special_npz(path: Path) -> Dump | None:
    """A decode or flash dump from a .npz (arrays by name, blocks and prefill as 0-d arrays);
    None when the archive is an ordinary stage dump."""
    source = str(path)
    reader = gate.ArrayReader(DEFAULT_MAX_ELEMENTS, DEFAULT_MAX_BYTES)
    doc = "a .npz dump"
    with (
        gate.open_regular(path, source, doc, max_bytes=DEFAULT_MAX_BYTES) as f,
        reader.archive(f, source) as archive,
    ):
        names = {m.removesuffix(".npy"): m for m in archive.namelist()}
        if _dump_kind(names) is None:
            return None
        raw = {
            name: reader.read_member(archive, member, name, source).astype(np.float64)
            for name, member in names.items()
            if name in (*DECODE_KEYS, *LSE_KEYS, *OUTPUT_KEYS, *FLASH_EXTRA, *DECODE_EXTRA)
        }
    plain: dict[str, Any] = {k: (float(v) if v.ndim == 0 else v) for k, v in raw.items()}
    if _dump_kind(names) == "decode":
        key = next(k for k in DECODE_KEYS if k in plain)
        return _decode_dump(
            source,
            raw[key],
            plain.get("prefill"),
            raw.get("K_cache"),
            raw.get("V_cache"),
            block_size=plain.get("block_size"),
        )
    output = next(raw[k] for k in OUTPUT_KEYS if k in raw)
    lse = next(raw[k] for k in LSE_KEYS if k in raw)
    return _flash_dump(source, output, lse, plain, [])


def _field(obj: Any, key: str, kind: type, source: str, where: str = "") -> Any:
    field = f"{where}.{key}" if where else key
    value = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(value, kind):
        raise InputError(source, field, "is missing or of the wrong type", f"a {kind.__name__}")
    return value


def _stage_data(stages: dict[str, Any], name: str, source: str, where: str) -> FloatArray:
    stage = stages.get(name)
    field = f"{where}.{name}"
    if not isinstance(stage, dict) or "data" not in stage:
        raise InputError(source, field, "is missing", 'a mapping with "shape" and "data"')
    return decode_array(stage["data"], source, f"{field}.data")


def _stack(arrays: list[FloatArray], source: str) -> FloatArray:
    if len({a.shape for a in arrays}) > 1:
        raise InputError(source, "steps", "outputs of different shapes", "one shape per step")
    return np.stack(arrays)


_MOST = 2**63 - 1  # the largest whole number a kernel's int64 holds


def _whole(value: Any, source: str, field: str, least: int = 1) -> int | None:
    """An optional whole number from ``least`` to 2^63 − 1 (a JSON number or a 0-d array)."""
    if value is None:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value != int(value) or not least <= value <= _MOST:
        raise InputError(
            source, field, f"is {_shown(value)}", f"a whole number from {least} to 2^63 − 1"
        )
    return int(value)


def _flag(value: Any, source: str, field: str) -> bool:
    """An optional true or false (1 or 0 as a 0-d array); absent is false."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    raise InputError(source, field, f"is {_shown(value)}", "true or false (1 or 0)")


def _shown(value: Any) -> str:
    """A dump's value for a one-line message: short, and a huge int without all its digits."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int) and value.bit_length() > 64:
        return f"about {'-' if value < 0 else ''}2^{value.bit_length() - 1}"
    text = repr(value)
    return text if len(text) <= 20 else text[:17] + "..."


def _batch_dump(obj: dict[str, Any], source: str) -> BatchDump:
    """``{"format": "attn-decode-batch", "prefill", "chunk", "sequences": {NAME: {"fixture",
    "arrive", "output"}}}``, as attn decode --batch -f json writes it."""
    seqs = _field(obj, "sequences", dict, source)
    if not seqs:
        raise InputError(source, "sequences", "is empty", "one entry per sequence of the batch")
    out = []
    for name, seq in seqs.items():
        where = f"sequences.{name}"
        fixture = _field(seq, "fixture", str, source, where)
        arrive = _whole(seq.get("arrive"), source, f"{where}.arrive", 0)
        output = decode_array(_field(seq, "output", list, source, where), source, where)
        out.append((fixture, arrive or 0, output))
    prefill = _whole(obj.get("prefill"), source, "prefill") or 1
    chunk = _whole(obj.get("chunk"), source, "chunk")
    paged = obj.get("paged")
    if paged is not None and not isinstance(paged, dict):
        raise InputError(source, "paged", "is not an object", '{"block_size", "share_prefix"}')
    size = None if paged is None else _whole(paged.get("block_size"), source, "paged.block_size")
    share = paged is not None and _flag(paged.get("share_prefix"), source, "paged.share_prefix")
    return BatchDump(source, {}, {}, (), tuple(out), prefill, chunk, size, share)


def _decode_dump(
    source: str,
    outputs: FloatArray,
    prefill: Any,
    K: FloatArray | None,
    V: FloatArray | None,
    block_size: Any = None,
) -> DecodeDump:
    if outputs.ndim < 2:
        raise InputError(
            source,
            "decode_output",
            f"has shape {list(outputs.shape)}",
            "(steps, [batch,] heads, d_v): one output per decoded token",
        )
    arrays = {"output": outputs}
    return DecodeDump(
        source,
        arrays,
        {},
        (),
        outputs,
        _whole(prefill, source, "prefill"),
        K,
        V,
        _whole(block_size, source, "block_size"),
    )


def _flash_dump(
    source: str, output: FloatArray, lse: FloatArray, obj: dict[str, Any], tiles: Any
) -> FlashDump:
    if not isinstance(tiles, list):
        raise InputError(source, "tiles", "is not a list", "a list of tiles with m and l")
    parsed = []
    for n, tile in enumerate(tiles):
        if not isinstance(tile, dict) or tile.get("m") is None or tile.get("l") is None:
            continue  # a skipped tile, or one without its running values
        where = f"tiles[{n}]"
        batch, head, q0, q1, s0, s1 = _tile_place(tile, source, where)
        m = decode_array(tile["m"], source, f"{where}.m").reshape(-1)
        l = decode_array(tile["l"], source, f"{where}.l").reshape(-1)  # noqa: E741
        parsed.append(DumpTile(batch, head, (q0, q1), (s0, s1), m, l))
    base2 = obj.get("base2", False)
    return FlashDump(
        source,
        {"output": output, "lse": lse},
        {},
        (),
        output,
        lse,
        _whole(obj.get("block_q"), source, "block_q"),
        _whole(obj.get("block_k"), source, "block_k"),
        _flag(base2, source, "base2"),
        tuple(parsed),
        _whole(obj.get("split_kv"), source, "split_kv"),
    )


def _tile_place(tile: dict[str, Any], source: str, where: str) -> tuple[int, ...]:
    """A dumped tile's batch, head, q_block and k_block: whole numbers >= 0."""
    try:
        (q0, q1), (s0, s1) = tile["q_block"], tile["k_block"]
    except (KeyError, TypeError, ValueError):
        raise InputError(
            source,
            where,
            "has no usable q_block, k_block or head",
            '"head": h, "q_block": [t0, t1], "k_block": [s0, s1]',
        ) from None
    values = {
        "batch": tile.get("batch", 0),
        "head": tile.get("head", 0),
        "q_block[0]": q0,
        "q_block[1]": q1,
        "k_block[0]": s0,
        "k_block[1]": s1,
    }
    return tuple(_whole(v, source, f"{where}.{k}", least=0) or 0 for k, v in values.items())
