"""KV-cache decoding and FlashAttention tiles run on a fixture, checked against its own trace,
and the grader of someone's own decode loop or flash kernel.

``run_decode`` and ``run_flash`` take a fixture through the ordinary pipeline (for Q, K, V and
the reference output), then through core/decode.py or core/flash.py, and compare the two: a
decode step's output with the full trace's row at its position, flash's O and L with the
trace's ``output`` and ``lse``, and exp(x − L) with ``softmax``. The grader reads a decode or
flash dump and names a classic mistake only when core's recomputation of that mistake
reproduces the dump's numbers (``decode_mistakes``, ``flash_mistakes``).

Axis names as in core/decode.py: B batch, H query heads, Hkv key/value heads, T tokens, D d_k,
Dv d_v, C cache slots.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli.check.compare import (
    Comparison,
    Diagnosis,
    StageResult,
    Tolerance,
    cell_errors,
    compare_stage,
    conform,
)
from attn_cli.check.grade import Dump
from attn_cli.core.decode import DecodeResult, KVCacheBytes, Rotate, decode, kv_cache_bytes
from attn_cli.core.decode import self_check as decode_self_check
from attn_cli.core.flash import LOG2E, FlashResult, Tile, flash_forward
from attn_cli.errors import ComputeError, InputError, UsageError
from attn_cli.io.trace_json import decode_array

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.core.pipeline import Dtype, Trace

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
AnyArray = np.ndarray[Any, Any]  # float64 or float32, as core returns them

F64_TOLERANCE = 1e-12  # float64: the order of summation moves the last bits only
ULPS = 64  # flash: up to 64 ulps of the scores' size (times the values') is rounding
MAX_TILES = 64  # tiles shown (and kept) by default
BLOCK_CAP = 64  # the largest default block
BIG_SCORES = 1 << 22  # above this many score cells, flash's check keeps no (T, S) stage


# ---------------------------------------------------------------------------------------------
# Loading the trace a decode or flash run reads


def load_trace(
    fixture: str | os.PathLike[str] | None,
    keep: Callable[[Inputs], set[str]],
    *,
    refuse: Callable[[Inputs], None],
    dtype: Dtype = "float64",
    max_elements: int | None = None,
    max_memory: int | None = None,
    extra_bytes: Callable[[Inputs], int] = lambda inputs: 0,
) -> tuple[Trace, float | None]:
    """The fixture traced, keeping only ``keep(inputs)``, and the finite ``mask_value`` that was
    replaced (None: none);
    refused (``refuse``, the memory budget with ``extra_bytes``) before anything is computed.

    A finite ``mask_value`` becomes −∞: a KV cache and FlashAttention mask with −∞, and the
    trace they are checked against must do the same.
    """
    from attn_cli.api import load
    from attn_cli.core.limits import DEFAULT_MAX_ELEMENTS
    from attn_cli.core.memory import check_memory, default_max_memory, format_bytes, memory_needed
    from attn_cli.core.pipeline import run
    from attn_cli.core.stages import applicable_stages

    inputs = load(fixture, max_elements=max_elements or DEFAULT_MAX_ELEMENTS)
    refuse(inputs)
    sentinel = None
    if inputs.mask_value != -np.inf:
        sentinel = inputs.mask_value
        inputs = replace(inputs, mask_value=-np.inf)
    kept = keep(inputs) & set(applicable_stages(inputs, opt_in=("lse",)))
    itemsize = 4 if dtype == "float32" else 8
    check_memory(inputs, max_memory, kept, itemsize)
    budget = default_max_memory() if max_memory is None else max_memory
    need = memory_needed(inputs, kept, itemsize) + extra_bytes(inputs)
    if need > budget:
        raise InputError(
            inputs.source, "", f"this would need about {format_bytes(need)} of memory",
            f"at most {format_bytes(budget)}", option="max-memory",
        )  # fmt: skip
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        return run(inputs, keep=kept, dtype=dtype), sentinel


def internal(trace: Trace, name: str) -> FloatArray:
    """A stage with its batch axis, (B, ...), whether or not the fixture has one."""
    data: FloatArray = trace[name].data
    return data if trace.inputs.has_batch else data[None]


def query_key(inputs: Inputs, name: str) -> str:
    """The stage the scores read for Q or K: rotated, else normalised, else plain."""
    if inputs.rope is not None:
        return f"{name}_rot"
    return f"{name}_norm" if inputs.qk_norm is not None else name


# ---------------------------------------------------------------------------------------------
# KV-cache decoding


@dataclass(frozen=True, eq=False)
class DecodeArgs:
    """What core.decode reads, taken from a trace: q, k, v (B, H|Hkv, T, D) and the options."""

    q: FloatArray
    k: FloatArray
    v: FloatArray
    scale: float
    positions: np.ndarray[Any, np.dtype[np.int64]]
    rotate: Rotate | None
    window: int | None
    sinks: FloatArray | None
    bias: FloatArray | None  # broadcasts to (B, H, T, T); -inf where mask or lengths forbid
    softcap: float | None

    def kwargs(self) -> dict[str, Any]:
        return {"scale": self.scale, "positions": self.positions, "rotate": self.rotate,
                "window": self.window, "sinks": self.sinks, "bias": self.bias,
                "softcap": self.softcap}  # fmt: skip


@dataclass(frozen=True, eq=False)
class DecodeRun:
    """A fixture decoded: the trace it is checked against, the steps, the checks, the cost."""

    trace: Trace
    result: DecodeResult
    diffs: tuple[float, ...]  # per step: max |step output − the trace's output row|
    prefill_diff: float  # the same over the prefill rows
    cost: KVCacheBytes
    sentinel: float | None = None  # the fixture's finite mask_value, replaced by −∞
    tolerance: float = F64_TOLERANCE

    @property
    def worst(self) -> float:
        return max((self.prefill_diff, *self.diffs))

    @property
    def ok(self) -> bool:
        return self.worst <= self.tolerance

    def label(self, index: int) -> str:
        """A token's label: its text, or its index."""
        return self.trace.query_labels[index]


def refuse_decode(inputs: Inputs) -> None:
    """Decoding needs causal self-attention over increasing positions."""
    src = inputs.source
    if inputs.causal is None:
        raise UsageError(
            src, "causal", "decoding needs a causal fixture (each token sees only the ones "
            "before it)", "causal: true (or upper-left, lower-right)",
        )  # fmt: skip
    if inputs.X_kv is not None or inputs.seq_q != inputs.seq_k:
        raise UsageError(
            src, "", f"cross-attention (seq_q {inputs.seq_q}, seq_k {inputs.seq_k}) has no "
            "cache of its own tokens", "self-attention, seq_q == seq_k",
        )  # fmt: skip
    pos_q, pos_k = inputs.token_positions()
    if not np.array_equal(pos_q, pos_k) or np.any(np.diff(pos_q) <= 0):
        raise UsageError(
            src, "positions", "tokens must arrive in order to be decoded one by one",
            "the same increasing positions for queries and keys",
        )  # fmt: skip


def decode_keep(inputs: Inputs) -> set[str]:
    """The stages a decode run reads: Q and K as the scores take them before RoPE, V, output."""
    norm = inputs.qk_norm is not None
    return {"Q_norm" if norm else "Q", "K_norm" if norm else "K", "V", "output"}


def decode_bytes(inputs: Inputs, prefill: int = 1) -> int:
    """What the steps hold: each keeps the cache as it saw it, and its score rows."""
    B, H, Hkv, T = inputs.batch, inputs.heads, inputs.kv_heads, inputs.seq_q
    from attn_cli.core.steps import window_reach

    pos = inputs.token_positions()[0]
    W = None if inputs.window is None else window_reach(inputs.window, pos, pos)  # the ring
    slots = sum(i + 1 if W is None else W for i in range(prefill, T))
    return 8 * B * slots * (Hkv * (inputs.d_k + inputs.d_v) + 5 * H)


def decode_args(trace: Trace) -> DecodeArgs:
    """core.decode's arguments from the trace of a fixture ``refuse_decode`` let through."""
    inp = trace.inputs
    norm = inp.qk_norm is not None
    pos = inp.token_positions()[0]
    rotate: Rotate | None = None
    if inp.rope is not None:
        from attn_cli.core.variants import apply_rope

        rope = inp.rope
        rotate = functools.partial(apply_rope, base=rope.base, layout=rope.layout, dims=rope.dims)
    return DecodeArgs(
        q=internal(trace, "Q_norm" if norm else "Q"),  # (B, H, T, D)
        k=internal(trace, "K_norm" if norm else "K"),  # (B, Hkv, T, D)
        v=internal(trace, "V"),  # (B, Hkv, T, Dv)
        scale=trace.scale,
        positions=pos,
        rotate=rotate,
        window=inp.window,
        sinks=inp.sinks,
        bias=decode_bias(inp, pos),
        softcap=inp.softcap,
    )


def decode_bias(inp: Inputs, pos: np.ndarray[Any, np.dtype[np.int64]]) -> FloatArray | None:
    """bias + ALiBi, and −∞ where the mask or the lengths forbid a key: (B|1, H|1, T, T)."""
    parts: list[FloatArray] = []
    if inp.bias is not None:
        parts.append(inp.bias)
    if inp.alibi is not None:
        from attn_cli.core.variants import alibi_bias

        parts.append(alibi_bias(inp.alibi, pos, pos))  # (H, T, T)
    if inp.mask is not None:
        parts.append(np.where(inp.mask, 0.0, -np.inf))
    if inp.lengths is not None:
        valid = np.arange(inp.seq_k)[None, :] < inp.lengths[:, None]  # (B, S)
        parts.append(np.where(valid, 0.0, -np.inf)[:, None, None, :])  # (B, 1, 1, S)
    if not parts:
        return None
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def run_decode(
    fixture: str | os.PathLike[str] | None,
    prefill: int = 1,
    *,
    max_elements: int | None = None,
    max_memory: int | None = None,
) -> DecodeRun:
    """Decode the fixture after a prefill of ``prefill`` tokens and check every step."""

    def refuse(inputs: Inputs) -> None:
        refuse_decode(inputs)
        if not 1 <= prefill <= inputs.seq_q:
            raise UsageError(
                inputs.source, "prefill", f"is {prefill}",
                f"1 to {inputs.seq_q} (the fixture's tokens)", option="prefill",
            )  # fmt: skip

    trace, sentinel = load_trace(
        fixture, decode_keep, refuse=refuse, max_elements=max_elements, max_memory=max_memory,
        extra_bytes=lambda inputs: decode_bytes(inputs, prefill),
    )  # fmt: skip
    return check_decode(trace, prefill, sentinel)


def check_decode(trace: Trace, prefill: int, sentinel: float | None = None) -> DecodeRun:
    """Run core.decode on the trace's Q, K, V and compare every step with the trace's output."""
    args = decode_args(trace)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        result = decode(args.q, args.k, args.v, prefill=prefill, **args.kwargs())
    full = internal(trace, "output")  # (B, H, T, Dv)
    diffs = tuple(decode_self_check(result, full))
    prefill_diff = max_abs_diff(result.prefill_output, full[:, :, :prefill])
    inp = trace.inputs
    cost = kv_cache_bytes(inp.kv_heads, inp.heads, inp.d_k, inp.d_v, 8, inp.seq_q)
    return DecodeRun(trace, result, diffs, prefill_diff, cost, sentinel)


def decode_failure(run: DecodeRun) -> ComputeError | None:
    """The error to raise when a step's output left the full trace's (None: all within)."""
    if run.ok:
        return None
    inp = run.trace.inputs
    if run.prefill_diff > run.tolerance:
        where, diff = f"prefill (tokens 0..{run.result.prefill - 1})", run.prefill_diff
    else:
        step = next(s for s, d in zip(run.result.steps, run.diffs, strict=True)
                    if not d <= run.tolerance)  # fmt: skip
        diff = max(run.diffs)
        where = f"step at position {step.position} ({run.label(step.index)!r})"
    return ComputeError(
        inp.source, where, f"the decoded output differs from the full trace's by {diff:.3e}",
        f"at most {run.tolerance:g}",
    )  # fmt: skip


def max_abs_diff(actual: AnyArray, expected: AnyArray) -> float:
    """max |actual − expected|; equal non-finite values differ by 0, unequal ones by inf."""
    if actual.size == 0:
        return 0.0
    finite = np.isfinite(actual) & np.isfinite(expected)
    same = (actual == expected) | (np.isnan(actual) & np.isnan(expected))
    diff = np.where(finite, np.abs(np.where(finite, actual, 0.0) - np.where(finite, expected, 0.0)),
                    np.where(same, 0.0, np.inf))  # fmt: skip
    return float(diff.max())


def max_ulps(actual: AnyArray, expected: AnyArray) -> float:
    """The largest difference in units in the last place of the expected value (its dtype)."""
    if actual.size == 0:
        return 0.0
    finite = np.isfinite(actual) & np.isfinite(expected)
    ref = np.where(finite, expected, 0.0)
    spacing = np.spacing(np.abs(ref).astype(expected.dtype))
    diff = np.abs(np.where(finite, actual, 0.0) - ref)
    ulps = np.where(finite, diff / spacing, np.where(actual == expected, 0.0, np.inf))
    return float(ulps.max())


# ---------------------------------------------------------------------------------------------
# FlashAttention tiles


@dataclass(frozen=True)
class SelfCheck:
    """One comparison of flash with the trace: the largest difference, and in ulps (float32)."""

    name: str  # "output", "lse", "softmax"
    max_abs: float
    ulps: float | None  # float32 only
    tolerance: float
    ok: bool


@dataclass(frozen=True, eq=False)
class FlashRun:
    """A fixture through the FlashAttention-2 forward: O, L, the tiles shown and the checks."""

    trace: Trace
    output: FloatArray  # (B, H, T, Dv)
    lse: FloatArray  # (B, H, T), base 2 when base2
    tiles: tuple[Tile, ...]  # the first ``max_tiles`` tiles, in the order visited
    tiles_total: int
    block_q: int
    block_k: int
    base2: bool
    causal_offset: int | None  # None: no tile is skipped
    checks: tuple[SelfCheck, ...]
    max_tiles: int
    sentinel: float | None = None  # the fixture's finite mask_value, replaced by −∞

    @property
    def cut(self) -> bool:
        return self.tiles_total > len(self.tiles)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def default_block(n: int) -> int:
    """A teaching block size: about a third of the axis, at least 2, so a short example has
    several tiles (3 × 3 per head for 5 or 6 tokens); at most 64, as real kernels use."""
    return min(BLOCK_CAP, max(2, -(-n // 3)))


def flash_keep(inputs: Inputs) -> set[str]:
    """The stages a flash run reads: what the scores take, V, output and lse; and the score
    stages for the weights check, when small."""
    from attn_cli.core.stages import softmax_input

    keep = {query_key(inputs, "Q"), query_key(inputs, "K"), "V", "output", "lse"}
    if inputs.batch * inputs.heads * inputs.seq_q * inputs.seq_k <= BIG_SCORES:
        keep |= {softmax_input(inputs), "softmax"}
    return keep


def causal_offset(inputs: Inputs) -> int | None:
    """Key j is allowed for query i when j <= i + offset; None when tiles cannot be skipped
    (not causal, or positions given that need not follow the indices)."""
    if inputs.causal is None or inputs.positions is not None or inputs.key_positions is not None:
        return None
    return inputs.seq_k - inputs.seq_q if inputs.causal == "lower-right" else 0


def run_flash(
    fixture: str | os.PathLike[str] | None,
    *,
    block_q: int | None = None,
    block_k: int | None = None,
    base2: bool = False,
    dtype: Dtype = "float64",
    max_tiles: int = MAX_TILES,
    max_elements: int | None = None,
    max_memory: int | None = None,
) -> FlashRun:
    """The FlashAttention-2 forward of the fixture, tile by tile, checked against its trace."""

    def refuse(inputs: Inputs) -> None:
        for name, value in (("block-q", block_q), ("block-k", block_k), ("max-tiles", max_tiles)):
            if value is not None and value < (0 if name == "max-tiles" else 1):
                raise UsageError("", name, f"is {value}", "a whole number >= 1", option=name)

    trace, sentinel = load_trace(fixture, flash_keep, refuse=refuse, dtype=dtype,
                              max_elements=max_elements, max_memory=max_memory)  # fmt: skip
    inp = trace.inputs
    bq = block_q or default_block(inp.seq_q)
    bk = block_k or default_block(inp.seq_k)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        return check_flash(trace, bq, bk, base2, max_tiles, sentinel)


def check_flash(
    trace: Trace, bq: int, bk: int, base2: bool, max_tiles: int, sentinel: float | None = None
) -> FlashRun:
    """Flash's loop one (batch, head, query block) at a time; then O, L and weights checked."""
    inp = trace.inputs
    q, k = internal(trace, query_key(inp, "Q")), internal(trace, query_key(inp, "K"))
    v = internal(trace, "V")
    B, H, T, _ = q.shape
    output = np.zeros((B, H, T, v.shape[3]), q.dtype)
    L = np.empty((B, H, T), q.dtype)
    tiles: list[Tile] = []
    total = 0
    for (b, h, t0, t1), forward in _query_blocks(trace, q, k, v, bq, bk, base2):
        r = forward(record_tiles=len(tiles) < max_tiles)
        output[b, h, t0:t1], L[b, h, t0:t1] = r.output[0, 0], r.lse[0, 0]
        total += -(-inp.seq_k // bk)
        room = max_tiles - len(tiles)
        tiles.extend(replace(t, batch=b, head=h, q_block=(t0, t1)) for t in r.tiles[:room])
    checks = flash_checks(trace, output, L, base2)
    return FlashRun(trace, output, L, tuple(tiles), total, bq, bk, base2, causal_offset(inp),
                    checks, max_tiles, sentinel)  # fmt: skip


def _query_blocks(
    trace: Trace, q: FloatArray, k: FloatArray, v: FloatArray, bq: int, bk: int, base2: bool
) -> Iterator[tuple[tuple[int, int, int, int], Callable[..., FlashResult]]]:
    """Per (batch, head, query block): where it is, and flash_forward on that block alone
    (``record_tiles`` left to the caller); its tiles are those of the whole loop, bit for bit."""
    from attn_cli.core.steps import alibi_rows, allowed_positions

    inp = trace.inputs
    B, H, T, _ = q.shape
    groups = H // k.shape[1]  # query head h reads key/value head h // groups
    offset = causal_offset(inp)
    bias = None if inp.bias is None else np.broadcast_to(inp.bias, (B, H, T, inp.seq_k))
    for b in range(B):
        for h in range(H):
            g = h // groups
            for t0 in range(0, T, bq):
                t1 = min(T, t0 + bq)
                allowed = allowed_positions(inp, (b, h, t0, t1))  # (R, S) or None
                rows = None if bias is None else bias[b, h, t0:t1]  # (R, S)
                if inp.alibi is not None:
                    alibi = alibi_rows(inp, h, t0, t1)  # (R, S)
                    rows = alibi if rows is None else rows + alibi
                kv = (k[b : b + 1, g : g + 1], v[b : b + 1, g : g + 1])  # (1, 1, S, D|Dv)
                call = functools.partial(
                    flash_forward, q[b : b + 1, h : h + 1, t0:t1], *kv,
                    scale=trace.scale, allowed=allowed, bias=rows, block_q=t1 - t0, block_k=bk,
                    causal_offset=None if offset is None else offset + t0, base2=base2,
                    sinks=None if inp.sinks is None else inp.sinks[h : h + 1],
                    softcap=inp.softcap,
                )  # fmt: skip
                yield (b, h, t0, t1), call


def flash_checks(
    trace: Trace, output: FloatArray, L: FloatArray, base2: bool
) -> tuple[SelfCheck, ...]:
    """O against ``output``, L against ``lse``, exp(x − L) against ``softmax`` (when kept)."""
    from attn_cli.core.stages import softmax_input

    f32 = trace.dtype == "float32"
    L_e = L / np.asarray(LOG2E, L.dtype) if base2 else L  # base 2 back to base e
    pairs = [("output", output, internal(trace, "output"))]
    if "lse" in trace:
        pairs.append(("lse", L_e, internal(trace, "lse")))
    x_name = softmax_input(trace.inputs)
    if "softmax" in trace and x_name in trace:
        x = internal(trace, x_name)  # (B, H, T, S)
        Ls = np.where(np.isneginf(L), 0.0, L)[..., None].astype(L.dtype)
        # Triton's form in base 2: exp2(x·log2 e − L₂); else exp(x − L)
        rebuilt = np.exp2(x * np.asarray(LOG2E, x.dtype) - Ls) if base2 else np.exp(x - Ls)
        pairs.append(("softmax", rebuilt.astype(x.dtype), internal(trace, "softmax")))
    checks = []
    for name, mine, ref in pairs:
        diff = max_abs_diff(mine, ref)
        # the rounding of exp(x − m) grows with the scores' size: up to about |x| ulps
        eps = float(np.finfo(mine.dtype).eps)
        scores = _finite_max(internal(trace, "lse")) + math.log(trace.inputs.seq_k)
        tol = ULPS * eps * (1 + scores) * (1 + _finite_max(ref))
        tol = tol if f32 else max(F64_TOLERANCE, tol)
        ulps = max_ulps(mine, ref) if f32 else None
        checks.append(SelfCheck(name, diff, ulps, tol, diff <= tol))
    return tuple(checks)


def _finite_max(x: AnyArray) -> float:
    """The largest finite |x| (0 when there is none)."""
    return float(np.abs(x[np.isfinite(x)]).max(initial=0.0))


def flash_failure(run: FlashRun) -> ComputeError | None:
    """The error to raise when flash's O, L or weights left the trace's (None: all within)."""
    bad = next((c for c in run.checks if not c.ok), None)
    if bad is None:
        return None
    return ComputeError(
        run.trace.inputs.source, bad.name,
        f"FlashAttention's {bad.name} differs from the trace's by {bad.max_abs:.3e}",
        f"at most {bad.tolerance:.3g}",
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Grading someone's decode loop or flash kernel: reading the dump

DECODE_FORMAT = "attn-decode"
FLASH_FORMAT = "attn-flash"
DECODE_KEYS = ("decode_output", "step_outputs")  # (steps, [batch,] heads, d_v) in any layout
LSE_KEYS = ("lse", "L", "logsumexp")
OUTPUT_KEYS = ("output", "O", "out")
FLASH_EXTRA = ("block_q", "block_k", "base2", "tiles")
DECODE_EXTRA = ("prefill", "K_cache", "V_cache")


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


@dataclass(frozen=True, eq=False)
class FlashDump(Dump):
    """A flash kernel's O and L (base 2 when ``base2``), optionally its blocks and tiles."""

    output: FloatArray
    lse: FloatArray
    block_q: int | None
    block_k: int | None
    base2: bool
    tiles: tuple[DumpTile, ...]


def dump_kind(names: Collection[str]) -> str | None:
    """ "decode", "flash" or None (an ordinary stage dump) from the names a dump holds."""
    have = set(names)
    if have & set(DECODE_KEYS):
        return "decode"
    flash = set(LSE_KEYS) | set(OUTPUT_KEYS) | set(FLASH_EXTRA)
    if have & set(LSE_KEYS) and have & set(OUTPUT_KEYS) and have <= flash:
        return "flash"
    return None


def is_special(obj: Any) -> bool:
    """Whether a parsed JSON dump is a decode or flash dump (not a trace or a stage mapping)."""
    if not isinstance(obj, dict):
        return False
    if "format" in obj:
        return obj["format"] in (DECODE_FORMAT, FLASH_FORMAT)
    return dump_kind(obj) is not None


def special_dump(obj: dict[str, Any], source: str) -> Dump:
    """A decode or flash dump from parsed JSON: attn's own formats, or plain names."""
    fmt = obj.get("format")
    if fmt == DECODE_FORMAT:
        steps = _field(obj, "steps", list, source)
        if not steps:
            raise InputError(source, "steps", "is empty", "one entry per decoded token")
        stages = [_field(s, "stages", dict, source, f"steps[{i}]") for i, s in enumerate(steps)]
        outputs = [_stage_data(st, "output", source, f"steps[{i}]") for i, st in enumerate(stages)]
        last = stages[-1]
        caches = [_stage_data(last, n, source, "steps[-1]") if n in last else None
                  for n in ("K_cache", "V_cache")]  # fmt: skip
        return _decode_dump(source, _stack(outputs, source), obj.get("prefill"), *caches)
    if fmt == FLASH_FORMAT:
        stages = _field(obj, "stages", dict, source)
        output, lse = (_stage_data(stages, n, source, "stages") for n in ("output", "lse"))
        return _flash_dump(source, output, lse, obj, obj.get("tiles") or [])
    if dump_kind(obj) == "decode":
        key = next(k for k in DECODE_KEYS if k in obj)
        caches = [None if obj.get(n) is None else decode_array(obj[n], source, n)
                  for n in ("K_cache", "V_cache")]  # fmt: skip
        return _decode_dump(source, decode_array(obj[key], source, key), obj.get("prefill"),
                            *caches)  # fmt: skip
    output = next(decode_array(obj[k], source, k) for k in OUTPUT_KEYS if k in obj)
    lse = next(decode_array(obj[k], source, k) for k in LSE_KEYS if k in obj)
    return _flash_dump(source, output, lse, obj, obj.get("tiles") or [])


def special_npz(path: Path) -> Dump | None:
    """A decode or flash dump from a .npz (arrays by name, blocks and prefill as 0-d arrays);
    None when the archive is an ordinary stage dump."""
    from attn_cli.core.limits import DEFAULT_MAX_BYTES, DEFAULT_MAX_ELEMENTS
    from attn_cli.io import gate

    source = str(path)
    reader = gate.ArrayReader(DEFAULT_MAX_ELEMENTS, DEFAULT_MAX_BYTES)
    doc = "a .npz dump"
    with (
        gate.open_regular(path, source, doc, max_bytes=DEFAULT_MAX_BYTES) as f,
        reader.archive(f, source) as archive,
    ):
        names = {m.removesuffix(".npy"): m for m in archive.namelist()}
        if dump_kind(names) is None:
            return None
        raw = {
            name: reader.read_member(archive, member, name, source).astype(np.float64)
            for name, member in names.items()
            if name in (*DECODE_KEYS, *LSE_KEYS, *OUTPUT_KEYS, *FLASH_EXTRA, *DECODE_EXTRA)
        }  # fmt: skip
    plain: dict[str, Any] = {k: (float(v) if v.ndim == 0 else v) for k, v in raw.items()}
    if dump_kind(names) == "decode":
        key = next(k for k in DECODE_KEYS if k in plain)
        return _decode_dump(source, raw[key], plain.get("prefill"), raw.get("K_cache"),
                            raw.get("V_cache"))  # fmt: skip
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
        raise InputError(source, field, f"is {_shown(value)}", f"a whole number from {least} "
                         "to 2^63 − 1")  # fmt: skip
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


def _decode_dump(
    source: str, outputs: FloatArray, prefill: Any, K: FloatArray | None, V: FloatArray | None
) -> DecodeDump:
    if outputs.ndim < 2:
        raise InputError(source, "decode_output", f"has shape {list(outputs.shape)}",
                         "(steps, [batch,] heads, d_v): one output per decoded token")  # fmt: skip
    arrays = {"output": outputs}
    return DecodeDump(source, arrays, {}, (), outputs, _whole(prefill, source, "prefill"), K, V)


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
        source, {"output": output, "lse": lse}, {}, (), output, lse,
        _whole(obj.get("block_q"), source, "block_q"), _whole(obj.get("block_k"), source,
        "block_k"), _flag(base2, source, "base2"), tuple(parsed),
    )  # fmt: skip


def _tile_place(tile: dict[str, Any], source: str, where: str) -> tuple[int, ...]:
    """A dumped tile's batch, head, q_block and k_block: whole numbers >= 0."""
    try:
        (q0, q1), (s0, s1) = tile["q_block"], tile["k_block"]
    except (KeyError, TypeError, ValueError):
        raise InputError(
            source, where, "has no usable q_block, k_block or head",
            '"head": h, "q_block": [t0, t1], "k_block": [s0, s1]',
        ) from None  # fmt: skip
    values = {"batch": tile.get("batch", 0), "head": tile.get("head", 0), "q_block[0]": q0,
              "q_block[1]": q1, "k_block[0]": s0, "k_block[1]": s1}  # fmt: skip
    return tuple(_whole(v, source, f"{where}.{k}", least=0) or 0 for k, v in values.items())


# ---------------------------------------------------------------------------------------------
# Grading


def grade_special(trace: Trace, dump: Dump, tolerance: Tolerance, worst: int = 5) -> Comparison:
    """Grade a decode or flash dump against the fixture's trace (see ``grade``)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        if isinstance(dump, DecodeDump):
            return grade_decode(trace, dump, tolerance, worst)
        assert isinstance(dump, FlashDump)
        return grade_flash(trace, dump, tolerance, worst)


def _public(trace: Trace, arr: AnyArray, batch_axis: int = 0) -> FloatArray:
    """Drop the batch axis (at ``batch_axis``) when the fixture has none."""
    out: FloatArray = arr if trace.inputs.has_batch else np.take(arr, 0, axis=batch_axis)
    return out


def _axes(trace: Trace, *axes: str) -> tuple[str, ...]:
    return tuple(a for a in axes if a != "batch" or trace.inputs.has_batch)


def _fit(given: FloatArray, shape: tuple[int, ...], axes: tuple[str, ...]) -> FloatArray | None:
    """The dump's array in ``shape``: as conform allows, or reshaped when only size-1 axes or
    merged leading axes (batch·heads, as CS336 and Triton lay them out) differ."""
    fitted = conform(given, shape, axes)
    if fitted is not None:
        return fitted
    if given.size == math.prod(shape) and given.shape[-1:] == shape[-1:]:
        return given.reshape(shape)
    return None


def _stage(
    name: str, axes: tuple[str, ...], ref: FloatArray, given: FloatArray | None,
    tolerance: Tolerance, worst: int,
) -> StageResult:  # fmt: skip
    if given is None:
        return StageResult(name, "missing_expected", axes, None, tuple(ref.shape))
    fitted = _fit(given, tuple(ref.shape), axes)
    if fitted is None:
        return StageResult(name, "shape", axes, tuple(ref.shape), tuple(given.shape))
    return compare_stage(name, axes, ref, fitted, tolerance, worst)


def grade_decode(trace: Trace, dump: DecodeDump, tolerance: Tolerance, worst: int) -> Comparison:
    """Each step's output (and the final cache) against core.decode's; then the mistakes."""
    inp = trace.inputs
    refuse_decode(inp)
    T = inp.seq_q
    steps = dump.outputs.shape[0]
    prefill = dump.prefill if dump.prefill is not None else T - steps
    if not 1 <= prefill <= T or prefill + steps != T:
        raise InputError(
            dump.source, "decode_output", f"{steps} steps after a prefill of {prefill}",
            f"one output per token after the prefill: {T} tokens in all",
        )  # fmt: skip
    args = decode_args(trace)
    right = decode(args.q, args.k, args.v, prefill=prefill, **args.kwargs())
    out_axes = _axes(trace, "step", "batch", "head", "d_v")
    cache_axes = _axes(trace, "batch", "kv_head", "slot", "d")
    ref = _decode_stages(trace, right)
    given = {"decode output": dump.outputs, "K_cache": dump.K_cache, "V_cache": dump.V_cache}
    results = [_stage("decode output", out_axes, ref["decode output"], dump.outputs,
                      tolerance, worst)]  # fmt: skip
    results += [_stage(n, cache_axes, ref[n], given[n], tolerance, worst)
                for n in ("K_cache", "V_cache") if given[n] is not None]  # fmt: skip
    comparison = Comparison(trace, "dump", dump.source, tolerance, tuple(results))
    first = comparison.first_difference
    notes = (f"decode: prefill {prefill}, then {steps} steps; step s is token {prefill} + s",)
    found: tuple[Diagnosis, ...] = ()
    tried: tuple[str, ...] = ()
    if first is not None:
        found, tried = _decode_diagnoses(trace, args, prefill, given, first.name, tolerance)
    return replace(comparison, notes=notes, diagnoses=found, tried=tried)


def _decode_stages(trace: Trace, result: DecodeResult) -> dict[str, FloatArray]:
    """The compared arrays of a decode: outputs (steps, B?, H, Dv), the final caches."""
    outputs = np.stack([s.output[:, :, 0] for s in result.steps])  # (n, B, H, Dv)
    last = result.steps[-1] if result.steps else None
    out = {"decode output": _public(trace, outputs, 1)}
    if last is not None:
        out["K_cache"] = _public(trace, last.K_cache)
        out["V_cache"] = _public(trace, last.V_cache)
    return out


def _decode_diagnoses(
    trace: Trace,
    args: DecodeArgs,
    prefill: int,
    given: dict[str, FloatArray | None],
    stage: str,
    tolerance: Tolerance,
) -> tuple[tuple[Diagnosis, ...], tuple[str, ...]]:
    """The named decode mistakes whose recomputation reproduces the dump."""
    from attn_cli.core.decode import decode_mistakes

    found: list[Diagnosis] = []
    tried: list[str] = []
    right = _decode_stages(trace, decode(args.q, args.k, args.v, prefill=prefill, **args.kwargs()))
    candidates = [(m.name, m.description, _decode_stages(trace, m.result))
                  for m in decode_mistakes(args.q, args.k, args.v, prefill=prefill,
                                           **args.kwargs())]  # fmt: skip
    groups = trace.inputs.heads // trace.inputs.kv_heads
    if groups > 1 and "K_cache" in right:
        head_axis = 1 if trace.inputs.has_batch else 0
        by_heads = {n: np.repeat(right[n], groups, axis=head_axis) for n in ("K_cache", "V_cache")}
        candidates.append(
            (
                "cache_sized_by_heads",
                "cache sized by query heads (keys and values repeated before caching, not after)",
                {**right, **by_heads},
            )
        )
    for name, title, stages in candidates:
        tried.append(title)
        if stage not in stages or given.get(stage) is None:
            continue
        value = stages[stage]
        if value.shape == right.get(stage, value).shape and _close(value, right[stage], tolerance):
            continue  # the mistake changes nothing here
        if not _same(given[stage], value, tolerance):
            continue
        others = [n for n in ("decode output", "K_cache", "V_cache")
                  if n != stage and given.get(n) is not None and n in stages]  # fmt: skip
        explains = tuple(n for n in others if _same(given[n], stages[n], tolerance))
        found.append(Diagnosis(
            name=name, title=title,
            detail=f"Recomputing the decode loop with this mistake reproduces every cell of "
            f"your {stage} ({tolerance}).",
            stage=stage, explains=explains,
            unexplained=tuple(n for n in others if n not in explains
                              and not _same(given[n], right[n], tolerance)),
        ))  # fmt: skip
    return tuple(found), tuple(tried) if not found else ()


def _close(a: FloatArray, b: FloatArray, tol: Tolerance) -> bool:
    return bool(a.shape == b.shape and not cell_errors(a, b, tol)[0].any())


def _same(given: FloatArray | None, value: FloatArray, tol: Tolerance) -> bool:
    """Whether the dump's array, fitted to ``value``'s shape, matches it."""
    if given is None:
        return False
    fitted = given if given.shape == value.shape else _fit(given, tuple(value.shape), ())
    return fitted is not None and _close(fitted, value, tol)


def flash_args(trace: Trace) -> dict[str, Any]:
    """core.flash's arguments for the whole fixture: q, k, v and the masks (B, H, T, S)."""
    from attn_cli.core.steps import allowed_positions
    from attn_cli.core.variants import alibi_bias

    inp = trace.inputs
    bias = inp.bias
    if inp.alibi is not None:
        pos_q, pos_k = inp.token_positions()
        alibi = alibi_bias(inp.alibi, pos_q, pos_k)  # (H, T, S)
        bias = alibi if bias is None else bias + alibi
    return {
        "q": internal(trace, query_key(inp, "Q")),
        "k": internal(trace, query_key(inp, "K")),
        "v": internal(trace, "V"),
        "scale": trace.scale,
        "allowed": allowed_positions(inp),
        "bias": bias,
        "causal_offset": causal_offset(inp),
        "sinks": inp.sinks,
        "softcap": inp.softcap,
    }


def grade_flash(trace: Trace, dump: FlashDump, tolerance: Tolerance, worst: int) -> Comparison:
    """O and L (and the tiles' m and l) against core.flash's; then the mistakes."""
    from attn_cli.core.flash import flash_mistakes

    args = flash_args(trace)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    inp = trace.inputs
    bq = dump.block_q or default_block(inp.seq_q)
    bk = dump.block_k or default_block(inp.seq_k)
    right = flash_forward(q, k, v, block_q=bq, block_k=bk, base2=dump.base2, **args)
    axes_o = _axes(trace, "batch", "head", "query", "d_v")
    axes_l = _axes(trace, "batch", "head", "query")
    ref = {"output": _public(trace, right.output), "lse": _public(trace, right.lse)}
    results = [_stage("output", axes_o, ref["output"], dump.output, tolerance, worst),
               _stage("lse", axes_l, ref["lse"], dump.lse, tolerance, worst)]  # fmt: skip
    if dump.tiles:
        results += _tile_results(right.tiles, dump.tiles, tolerance, worst)
    notes = [f"flash: blocks {bq} × {bk}" + ("" if dump.block_q and dump.block_k else
             " (block_q, block_k not in the dump: attn's defaults)")
             + (", L in base 2 (as the dump says)" if dump.base2 else ", L in base e")]  # fmt: skip
    comparison = Comparison(trace, "dump", dump.source, tolerance, tuple(results),
                            notes=tuple(notes))  # fmt: skip
    first = comparison.first_difference
    if first is None or first.name not in ("output", "lse") or dump.base2:
        return comparison
    found: list[Diagnosis] = []
    tried: list[str] = []
    given = {"output": dump.output, "lse": dump.lse}
    sizes = [(bq, bk)] if dump.block_q and dump.block_k else _block_guesses(inp, bq, bk)
    for name, title in _FLASH_TITLES:
        tried.append(title)
        for sq, sk in sizes:
            mistake = next((m for m in flash_mistakes(q, k, v, block_q=sq, block_k=sk, **args)
                            if m.name == name), None)  # fmt: skip
            if mistake is None:
                break
            stages = {"output": _public(trace, mistake.result.output),
                      "lse": _public(trace, mistake.result.lse)}  # fmt: skip
            if _close(stages[first.name], ref[first.name], tolerance):
                continue
            if not _same(given[first.name], stages[first.name], tolerance):
                continue
            other = "lse" if first.name == "output" else "output"
            explains = (other,) if _same(given[other], stages[other], tolerance) else ()
            unexplained = () if explains or _same(given[other], ref[other], tolerance) \
                else (other,)  # fmt: skip
            found.append(Diagnosis(
                name=name, title=title,
                detail=f"Recomputing the FlashAttention loop (blocks {sq} × {sk}) with this "
                f"mistake reproduces every cell of your {first.name} ({tolerance}).",
                stage=first.name, explains=explains, unexplained=unexplained,
            ))  # fmt: skip
            break
    return replace(comparison, diagnoses=tuple(found), tried=() if found else tuple(tried))


_FLASH_TITLES = (
    ("acc_not_rescaled", "accumulator not rescaled by alpha"),
    ("sum_not_rescaled", "running sum l not rescaled by alpha"),
    ("lse_without_max", "L = log(l): the running max m left out"),
    ("lse_base2", "L in base 2 (Triton's exp2) where base e is expected"),
    ("causal_extra_skip", "causal tiles skipped wrongly (the diagonal tile too)"),
)


def _block_guesses(inputs: Inputs, bq: int, bk: int) -> list[tuple[int, int]]:
    """Block sizes to try when the dump names none: attn's defaults, then powers of two."""
    longest = max(inputs.seq_q, inputs.seq_k)
    powers = [1 << n for n in range(8) if 1 << n < longest]
    return list(dict.fromkeys([(bq, bk), *((p, p) for p in powers)]))


def _tile_results(
    tiles: tuple[Tile, ...], given: tuple[DumpTile, ...], tolerance: Tolerance, worst: int
) -> list[StageResult]:
    """The dump's per-tile m and l against attn's tiles at the same place."""
    ours = {(t.batch, t.head, t.q_block, t.k_block): t for t in tiles}
    refs: dict[str, list[FloatArray]] = {"m": [], "l": []}
    mine: dict[str, list[FloatArray]] = {"m": [], "l": []}
    for tile in given:
        match = ours.get((tile.batch, tile.head, tile.q_block, tile.k_block))
        if match is None:
            return [StageResult("tile m", "shape", ("tile", "row"), (len(tiles),), (len(given),))]
        for name in ("m", "l"):
            refs[name].append(getattr(match, name))
            mine[name].append(getattr(tile, name))
    out = []
    for name in ("m", "l"):
        ref = np.concatenate(refs[name])
        got = np.concatenate(mine[name])
        given_arr = got if got.shape == ref.shape else None
        out.append(_stage(f"tile {name}", ("row",), ref, given_arr, tolerance, worst))
    return out
