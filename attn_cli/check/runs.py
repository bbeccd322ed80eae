"""KV-cache decoding and FlashAttention tiles run on a fixture, checked against its own trace.

``run_decode`` and ``run_flash`` take a fixture through the ordinary pipeline (for Q, K, V and
the reference output), then through core/decode.py or core/flash.py, and compare the two: a
decode step's output with the full trace's row at its position, flash's O and L with the
trace's ``output`` and ``lse``, and exp(x − L) with ``softmax``. ``decode_args`` and
``flash_args`` are core's arguments taken from a trace; the grader (grade_decode.py) reuses them.

Axis names as in core/decode.py: B batch, H query heads, Hkv key/value heads, T tokens, D d_k,
Dv d_v, C cache slots.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli.blas import blas_limit
from attn_cli.check.references import (
    F64_TOLERANCE,
    SelfCheck,
    check_failure,
    finite_max,
    max_abs_diff,
    reference_rows,
    scaled_tolerance,
    self_check,
    trace_chain,
)
from attn_cli.core.chain import Chain
from attn_cli.core.decode import (
    After,
    DecodeResult,
    KVCacheBytes,
    Rotate,
    decode,
    kv_cache_bytes,
    step_out,
)
from attn_cli.core.decode import self_check as decode_self_check
from attn_cli.core.pipeline import refuse as refuse_variants
from attn_cli.core.variant import DecodeForm, FlashMaps, QKAt, Traced
from attn_cli.errors import ComputeError, InputError, UsageError

if TYPE_CHECKING:
    from attn_cli.check.paged_runs import PagedCheck
    from attn_cli.core.flash import FlashResult, Tile
    from attn_cli.core.inputs import Inputs
    from attn_cli.core.paged import Paging
    from attn_cli.core.pipeline import Dtype, Trace

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
AnyArray = np.ndarray[Any, Any]  # float64 or float32, as core returns them

MAX_TILES = 64  # tiles shown (and kept) by default
BLOCK_CAP = 64  # the largest default block
# How a decode or flash run shows itself in a notebook: present/html_steps.py adds its pages
# ("decode", "flash") when imported, so check/ names nothing above it (as core's HTML_VIEWS).
RUN_HTML_VIEWS: dict[str, Callable[[Any], str]] = {}
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
            inputs.source,
            "",
            f"this would need about {format_bytes(need)} of memory",
            f"at most {format_bytes(budget)}",
            option="max-memory",
        )
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        return run(inputs, keep=kept, dtype=dtype), sentinel


def quiet() -> np.errstate:
    """NumPy's warnings off where a check names what is not finite (require_finite)."""
    return np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore")


def internal(trace: Trace, name: str) -> FloatArray:
    """A stage with its batch axis, (B, ...), whether or not the fixture has one."""
    data: FloatArray = trace[name].data
    return data if trace.inputs.has_batch else data[None]


def query_key(inputs: Inputs, name: str) -> str:
    """The stage the scores read for Q or K: the last Q/K transform's (``Q_rot``), else Q or K."""
    return Chain(inputs).query_key(name)


# ---------------------------------------------------------------------------------------------
# KV-cache decoding


@dataclass(frozen=True, eq=False)
class DecodeArgs:
    """What core.decode reads, taken from a trace: q, k, v (B, H|Hkv, T, D), the chain of the
    fixture's variants and the options."""

    q: FloatArray
    k: FloatArray
    v: FloatArray
    chain: Chain
    scale: float
    positions: np.ndarray[Any, np.dtype[np.int64]]
    rotate: Rotate | None
    form: DecodeForm | None = None  # a cache of other numbers than K and V (MLA's latent)
    after: After | None = None  # the head-output transforms (a gate) of a step's output
    rotate_q: Rotate | None = None  # the queries' (a norm with Q's weight after RoPE)

    def kwargs(self) -> dict[str, Any]:
        finish = None if self.form is None else self.form.finish
        return {
            "chain": self.chain,
            "scale": self.scale,
            "positions": self.positions,
            "rotate": self.rotate,
            "rotate_q": self.rotate_q,
            "finish": finish,
            "after": self.after,
        }


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
    cache_parts: str | None = None  # what a cache of other numbers than K and V holds (MLA's)
    checked: str = "output"  # the stage each step is checked by: output, or gated with a gate
    reference: FloatArray | None = None  # (B, H, steps, Dv): each step's full attention row
    paged: PagedCheck | None = None  # a paged cache: the pool and the contiguous comparison

    def _repr_html_(self) -> str | None:
        """The interactive decode page in a notebook cell, once present/html_steps.py is
        imported (RUN_HTML_VIEWS); None (plain text) before."""
        view = RUN_HTML_VIEWS.get("decode")
        return None if view is None else view(self)

    @property
    def worst(self) -> float:
        paged = () if self.paged is None else (self.paged.worst,)
        return float(max((self.prefill_diff, *self.diffs, *paged)))

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
            src,
            "causal",
            "decoding needs a causal fixture (each token sees only the ones before it)",
            "causal: true (or upper-left, lower-right)",
        )
    if inputs.X_kv is not None or inputs.seq_q != inputs.seq_k:
        raise UsageError(
            src,
            "",
            f"cross-attention (seq_q {inputs.seq_q}, seq_k {inputs.seq_k}) has no "
            "cache of its own tokens",
            "self-attention, seq_q == seq_k",
        )
    pos_q, pos_k = inputs.token_positions()
    if not np.array_equal(pos_q, pos_k) or np.any(np.diff(pos_q) <= 0):
        raise UsageError(
            src,
            "positions",
            "tokens must arrive in order to be decoded one by one",
            "the same increasing positions for queries and keys",
        )
    refuse_variants(inputs, "decoding")


def decode_keep(inputs: Inputs) -> set[str]:
    """The stages a decode run reads: Q and K before the transforms that read positions
    (RoPE), V, a cache form's (MLA's) and X for a head-output transform; no (T, S) stage and no
    output (each step is checked against rows streamed beside it: ``decode_reference``)."""
    chain = Chain(inputs)
    own = {stage for v, _ in chain.on for stage in v.decode_stages}
    outs = {"X"} if chain.out_stages else set()  # a gate: made from each token's X
    return {chain.before_positional("Q"), chain.before_positional("K"), "V", *own, *outs}


def decode_bytes(inputs: Inputs, prefill: int = 1) -> int:
    """What a decode holds beside its trace: every token's key and value once, each step's
    output and rotated query (and, with a ring buffer, which token each slot held), the
    prefill's score rows and one step's (core/decode.py keeps no other step's)."""
    B, H, Hkv, T = inputs.batch, inputs.heads, inputs.kv_heads, inputs.seq_q
    D, Dv = inputs.d_k, inputs.d_v
    W = Chain(inputs).cache_slots()  # a ring of W slots, None: the cache grows
    steps = T - prefill
    held = 0 if W is None else steps * W  # int64 slot tables
    rows = 5 * B * H * max(prefill * prefill, W or T)  # scores to softmax, prefill or a step
    return 8 * (B * Hkv * T * (D + Dv) + B * H * steps * (D + Dv) + held + rows)


def decode_args(trace: Trace) -> DecodeArgs:
    """core.decode's arguments from the trace of a fixture ``refuse_decode`` let through."""
    chain = trace_chain(trace)
    chain.refuse_own_loop(
        "the KV-cache loop of one softmax map does not run it (attn decode runs its own "
        "loop, check.state_runs)",
        "a fixture of softmax attention",
    )
    pos = trace.inputs.token_positions()[0]
    dtype = np.dtype(trace.dtype)
    for v, value in chain.on:
        arrays = {name: internal(trace, name) for name in v.decode_stages}
        form = v.decode_form(value, Traced(chain.inputs, arrays, caster(dtype)))
        if form is not None:  # nothing to rotate: its q and k are at their positions
            return DecodeArgs(form.q, form.k, form.v, chain, trace.scale, pos, None, form)
    # Q and K before the first transform that reads positions: the rest, at each token's
    q, k = (internal(trace, chain.before_positional(which)) for which in "QK")
    return DecodeArgs(
        q=q,  # (B, H, T, D)
        k=k,  # (B, Hkv, T, D)
        v=internal(trace, "V"),  # (B, Hkv, T, Dv)
        chain=chain,
        scale=trace.scale,
        positions=pos,
        rotate=_rotation(chain, np.dtype(trace.dtype)),
        rotate_q=_rotation(chain, np.dtype(trace.dtype), "Q"),
        after=head_output_after(trace, chain),
    )


def head_output_after(trace: Trace, chain: Chain) -> After | None:
    """The chain's head-output transforms (a gate) of some tokens' output, from their rows of X,
    by the code the trace runs; None when there are none."""
    if not chain.out_stages:
        return None
    X = internal(trace, "X")  # (B, T, d_model)
    cast = caster(np.dtype(trace.dtype))

    def after(tokens: slice, output: AnyArray) -> dict[str, AnyArray]:
        made: dict[str, AnyArray] = {}
        chain.transform_out(output, X[:, tokens], cast, made.__setitem__)
        return made

    return after


def _rotation(chain: Chain, dtype: np.dtype[Any], which: str = "K") -> Rotate | None:
    """What a decode loop applies to a key (or ``which``) as it arrives, at its position (a key
    once, as it enters the cache): its transforms from the first that reads positions on (RoPE,
    a norm after it, a query's temperature), in chain order; None when there are none."""
    stages = chain.qk_stages(which)
    first = stages.index(chain.before_positional(which))
    rotations = chain.transforms_of(which)[first:]
    if not rotations:
        return None

    def rotate(x: Any, positions: Any) -> Any:
        at = QKAt(chain.inputs, which, positions, caster(dtype))  # with Q's or K's weights
        for v, value in rotations:
            x = v.transform(value, at, x)
        return x

    return rotate


def caster(dtype: np.dtype[Any]) -> Callable[[str, FloatArray], FloatArray]:
    """A transform's own arrays in the trace's computing dtype."""
    return lambda name, array: array.astype(dtype, copy=False)


def refuse_prefill(inputs: Inputs, prefill: int) -> None:
    """What decoding refuses (refuse_decode), and a prefill that is not 1 to the fixture's
    tokens, in one line."""
    refuse_decode(inputs)
    if not 1 <= prefill <= inputs.seq_q:
        raise UsageError(
            inputs.source,
            "prefill",
            f"is {prefill}",
            f"1 to {inputs.seq_q} (the fixture's tokens)",
            option="prefill",
        )


def refuse_blocks(sizes: dict[str, int | None]) -> None:
    """A block size that is not a whole number >= 1 (``max-tiles``: >= 0), by its option."""
    for name, value in sizes.items():
        if value is not None and value < (0 if name == "max-tiles" else 1):
            raise UsageError("", name, f"is {value}", "a whole number >= 1", option=name)


def run_decode(
    fixture: str | os.PathLike[str] | None,
    prefill: int = 1,
    *,
    max_elements: int | None = None,
    max_memory: int | None = None,
) -> DecodeRun:
    """Decode the fixture after a prefill of ``prefill`` tokens and check every step."""

    trace, sentinel = load_trace(
        fixture,
        decode_keep,
        refuse=lambda inputs: refuse_prefill(inputs, prefill),
        max_elements=max_elements,
        max_memory=max_memory,
        extra_bytes=lambda inputs: decode_bytes(inputs, prefill),
    )
    return check_decode(trace, prefill, sentinel)


def check_decode(
    trace: Trace, prefill: int, sentinel: float | None = None, paging: Paging | None = None
) -> DecodeRun:
    """Run core.decode on the trace's Q, K, V and compare every step with the full attention's
    row of its token (``decode_reference``); ``paging``: with the cache in pages of a pool,
    each step compared with the contiguous cache's too."""
    args = decode_args(trace)
    final = args.chain.joined  # the output, or the last head-output transform's (gated)
    with quiet(), blas_limit(trace.inputs.seq_k):  # one product a step: busy cores make it crawl
        full = decode_reference(trace, args)  # (B, H, T, Dv), a block of rows at a time
        require_finite(trace, final, full)  # before a step: overflow is one line
        result = decode(args.q, args.k, args.v, prefill=prefill, paging=paging, **args.kwargs())
        contiguous = None
        if paging is not None:
            contiguous = decode(args.q, args.k, args.v, prefill=prefill, **args.kwargs())
    step_overflow(trace, result)
    diffs = tuple(decode_self_check(result, full, final))
    prefill_out = result.prefill_outs.get(final, result.prefill_output)
    prefill_diff = max_abs_diff(prefill_out, full[:, :, :prefill])
    inp = trace.inputs
    form = args.form
    cost = kv_cache_bytes(
        inp.kv_heads,
        inp.heads,
        inp.d_k,
        inp.d_v,
        8,
        inp.seq_q,
        latent=None if form is None else form.cached,
    )
    parts = None if form is None else form.parts
    paged = None
    if paging is not None and contiguous is not None:
        from attn_cli.check.paged_runs import PagedCheck, pool_cost

        same = tuple(
            max_abs_diff(step_out(a, final), step_out(b, final))
            for a, b in zip(result.steps, contiguous.steps, strict=True)
        )
        before = max_abs_diff(
            prefill_out, contiguous.prefill_outs.get(final, contiguous.prefill_output)
        )
        paged = PagedCheck(paging, pool_cost(inp, paging, cost.per_token), same, before)
    return DecodeRun(
        trace,
        result,
        diffs,
        prefill_diff,
        cost,
        sentinel,
        cache_parts=parts,
        checked=final,
        reference=full[:, :, prefill:],
        paged=paged,
        tolerance=scaled_tolerance(full),
    )


def require_finite(trace: Trace, stage: str, arr: AnyArray) -> None:
    """The pipeline's overflow check (core/engine.py ``FiniteCheck``: the stage and position of
    the first value that is not finite, one ComputeError) on what a loop computed beside the
    trace: a decode's reference rows, so that decoding refuses what attn trace refuses."""
    from attn_cli.core.engine import FiniteCheck
    from attn_cli.core.stages import SPECS

    axes = SPECS[stage].axes if stage in SPECS else SPECS["output"].axes
    if len(axes) != arr.ndim:
        axes = SPECS["output"].axes
    with quiet():
        FiniteCheck(trace.inputs, trace.dtype)(stage, arr, axes)


def step_overflow(trace: Trace, result: DecodeResult) -> None:
    """A decode step's stage that is not finite (core/decode.py ``DecodeResult.overflow``) as
    the one ComputeError FiniteCheck gives, naming the stage and the step's token."""
    if result.overflow is None:
        return
    stage, i = result.overflow
    inp = trace.inputs
    token = f" {inp.tokens[i]!r}" if inp.tokens and i < len(inp.tokens) else ""
    raise ComputeError(
        inp.source,
        f"{stage}[{'prefill' if i < result.prefill else 'step'} at token {i}{token}]",
        f"is not finite ({trace.dtype} overflow)",
        "finite values; scale the inputs down",
    )


def decode_reference(trace: Trace, args: DecodeArgs) -> AnyArray:
    """What each step is checked against, (B, H, T, Dv): every token's row of plain softmax
    attention over the keys up to it, streamed a few rows at a time (``reference_rows``: the
    chain over each row's allowed keys, two-pass softmax, no cache, no ring buffer, O(T)
    memory), from the same Q, K, V rotated whole at their positions; then what the cache's
    form makes of it (MLA's W_UV) and the head-output transforms (a gate)."""
    q: AnyArray = args.q
    k: AnyArray = args.k
    if args.rotate_q is not None:
        q = args.rotate_q(q, args.positions)  # (B, H, T, D)
    if args.rotate is not None:
        k = args.rotate(k, args.positions)  # (B, Hkv, T, D)
    out, _ = reference_rows(trace, q, k, args.v)
    if args.form is not None:
        out = args.form.finish(out)
    if args.after is not None:
        out = args.after(slice(0, out.shape[2]), out).get(args.chain.joined, out)
    return out


def decode_failure(run: DecodeRun) -> ComputeError | None:
    """The error to raise when a step's output left the full trace's (None: all within)."""
    if run.ok:
        return None
    inp = run.trace.inputs
    paged = run.paged
    if paged is not None and paged.worst > run.tolerance:
        return ComputeError(
            inp.source,
            "paged cache",
            f"the paged decode differs from the contiguous cache's by {paged.worst:.3e}",
            f"at most {run.tolerance:g}",
        )
    if run.prefill_diff > run.tolerance:
        where, diff = f"prefill (tokens 0..{run.result.prefill - 1})", run.prefill_diff
    else:
        step = next(
            s for s, d in zip(run.result.steps, run.diffs, strict=True) if not d <= run.tolerance
        )
        diff = max(run.diffs)
        where = f"step at position {step.position} ({run.label(step.index)!r})"
    return ComputeError(
        inp.source,
        where,
        f"the decoded output differs from the full attention's rows by {diff:.3e}",
        f"at most {run.tolerance:g}",
    )


# ---------------------------------------------------------------------------------------------
# FlashAttention tiles


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

    def _repr_html_(self) -> str | None:
        """The interactive flash page in a notebook cell, once present/html_steps.py is
        imported (RUN_HTML_VIEWS); None (plain text) before."""
        view = RUN_HTML_VIEWS.get("flash")
        return None if view is None else view(self)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def default_block(n: int) -> int:
    """A teaching block size: about a third of the axis, at least 2, so a short example has
    several tiles (3 × 3 per head for 5 or 6 tokens); at most 64, as real kernels use."""
    return min(BLOCK_CAP, max(2, -(-n // 3)))


def flash_keep(inputs: Inputs) -> set[str]:
    """The stages a flash run reads: what the scores take and V; and the score stages for the
    weights check, when small (O and L are checked against :func:`reference_rows`)."""
    from attn_cli.core.stages import softmax_input

    keep = {query_key(inputs, "Q"), query_key(inputs, "K"), "V"}
    maps = (v for v, _ in Chain(inputs).on if isinstance(v, FlashMaps))
    keep |= {s for v in maps for s in v.flash_reads}  # a second map's (diff)
    if inputs.batch * inputs.heads * inputs.seq_q * inputs.seq_k <= BIG_SCORES:
        keep |= {softmax_input(inputs), "softmax"}
    return keep


def causal_offset(inputs: Inputs) -> int | None:
    """Key j is allowed for query i when j <= i + offset; None when tiles cannot be skipped
    (not causal, or positions given that need not follow the indices)."""
    if inputs.causal is None or inputs.positions is not None or inputs.key_positions is not None:
        return None
    return inputs.seq_k - inputs.seq_q if inputs.causal == "lower-right" else 0


def flash_args(trace: Trace) -> dict[str, Any]:
    """core.flash's arguments for the whole fixture: q, k, v, the chain and the options."""
    inp = trace.inputs
    return {
        "q": internal(trace, query_key(inp, "Q")),
        "k": internal(trace, query_key(inp, "K")),
        "v": internal(trace, "V"),
        "chain": trace_chain(trace),
        "scale": trace.scale,
        "causal_offset": causal_offset(inp),
    }


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
        refuse_variants(inputs, "FlashAttention")
        refuse_blocks({"block-q": block_q, "block-k": block_k, "max-tiles": max_tiles})

    trace, sentinel = load_trace(
        fixture,
        flash_keep,
        refuse=refuse,
        dtype=dtype,
        max_elements=max_elements,
        max_memory=max_memory,
    )
    inp = trace.inputs
    bq = block_q or default_block(inp.seq_q)
    bk = block_k or default_block(inp.seq_k)
    with quiet(), blas_limit(inp.seq_k):  # the tiles' small products, as the engine's rule says
        return check_flash(trace, bq, bk, base2, max_tiles, sentinel)


def check_flash(
    trace: Trace, bq: int, bk: int, base2: bool, max_tiles: int, sentinel: float | None = None
) -> FlashRun:
    """Flash's loop over every block (the heads of a batch item at once), then again one
    (batch, head, query block) at a time for the tiles shown, which overwrite their blocks;
    then O, L and weights checked."""
    from attn_cli.core.flash import flash_forward  # flash's own: not on decode's path

    inp = trace.inputs
    args = flash_args(trace)
    q, k, v = args["q"], args["k"], args["v"]
    B, H, T, _ = q.shape
    whole = flash_forward(
        block_q=bq, block_k=bk, base2=base2, record_tiles=False, origin=(0, 0, 0), **args
    )
    output: AnyArray = whole.output
    L: AnyArray = whole.lse
    tiles: list[Tile] = []
    for (b, h, t0, t1), forward in _query_blocks(trace, q, k, v, bq, bk, base2):
        if len(tiles) >= max_tiles:
            break
        r = forward(record_tiles=True)
        output[b, h, t0:t1], L[b, h, t0:t1] = r.output[0, 0], r.lse[0, 0]
        room = max_tiles - len(tiles)
        tiles.extend(replace(t, batch=b, head=h, q_block=(t0, t1)) for t in r.tiles[:room])
    total = B * H * -(-T // bq) * -(-inp.seq_k // bk)
    checks = (*flash_checks(trace, output, L, base2), *_variant_maps(trace, output, bq, bk, base2))
    return FlashRun(
        trace,
        output,
        L,
        tuple(tiles),
        total,
        bq,
        bk,
        base2,
        causal_offset(inp),
        checks,
        max_tiles,
        sentinel,
    )


def _query_blocks(
    trace: Trace, q: FloatArray, k: FloatArray, v: FloatArray, bq: int, bk: int, base2: bool
) -> Iterator[tuple[tuple[int, int, int, int], Callable[..., FlashResult]]]:
    """Per (batch, head, query block): where it is, and flash_forward on that block alone
    (``record_tiles`` left to the caller); its tiles are those of the whole loop, bit for bit."""
    from attn_cli.core.flash import flash_forward  # flash's own: not on decode's path

    inp = trace.inputs
    B, H, T, _ = q.shape
    groups = H // k.shape[1]  # query head h reads key/value head h // groups
    offset = causal_offset(inp)
    chain = trace_chain(trace)
    for b in range(B):
        for h in range(H):
            g = h // groups
            for t0 in range(0, T, bq):
                t1 = min(T, t0 + bq)
                kv = (k[b : b + 1, g : g + 1], v[b : b + 1, g : g + 1])  # (1, 1, S, D|Dv)
                call = functools.partial(
                    flash_forward,
                    q[b : b + 1, h : h + 1, t0:t1],
                    *kv,
                    chain=chain,
                    scale=trace.scale,
                    block_q=t1 - t0,
                    block_k=bk,
                    causal_offset=None if offset is None else offset + t0,
                    base2=base2,
                    origin=(b, h, t0),
                )
                yield (b, h, t0, t1), call


def flash_checks(
    trace: Trace, output: FloatArray, L: FloatArray, base2: bool
) -> tuple[SelfCheck, ...]:
    """O and L against :func:`reference_rows`'s, exp(x − L) against ``softmax`` (when kept)."""
    from attn_cli.core.flash import LOG2E  # flash's own: not on decode's path
    from attn_cli.core.stages import softmax_input

    inp = trace.inputs
    f32 = trace.dtype == "float32"
    q, k = internal(trace, query_key(inp, "Q")), internal(trace, query_key(inp, "K"))
    ref_o, ref_L = reference_rows(trace, q, k, internal(trace, "V"))
    L_e = L / np.asarray(LOG2E, L.dtype) if base2 else L  # base 2 back to base e
    pairs = [("output", output, ref_o), ("lse", L_e, ref_L)]
    x_name = softmax_input(inp)
    if "softmax" in trace and x_name in trace:
        x = internal(trace, x_name)  # (B, H, T, S)
        Ls = np.where(np.isneginf(L), 0.0, L)[..., None].astype(L.dtype)
        # Triton's form in base 2: exp2(x·log2 e − L₂); else exp(x − L)
        rebuilt = np.exp2(x * np.asarray(LOG2E, x.dtype) - Ls) if base2 else np.exp(x - Ls)
        pairs.append(("softmax", rebuilt.astype(x.dtype), internal(trace, "softmax")))
    # the rounding of exp(x − m) grows with the scores' size: up to about |x| ulps
    scores = finite_max(ref_L) + math.log(inp.seq_k)
    return tuple(self_check(name, mine, ref, scores, f32) for name, mine, ref in pairs)


def _variant_maps(
    trace: Trace, output: FloatArray, bq: int, bk: int, base2: bool
) -> tuple[SelfCheck, ...]:
    """The softmax maps a variant tiles beside the chain's (differential attention's second),
    each O and L checked against plain softmax rows as the chain's are (``output_2``,
    ``lse_2``), then the stages it makes of every map's O against the trace's."""
    from attn_cli.core.flash import LOG2E, flash_forward  # flash's own: not on decode's path

    inp = trace.inputs
    f32 = trace.dtype == "float32"
    args = flash_args(trace)
    v = args["v"]
    checks: list[SelfCheck] = []
    for variant, value in Chain(inp).on:
        if not isinstance(variant, FlashMaps):
            continue
        run = Traced(inp, {s: internal(trace, s) for s in variant.flash_reads})
        outputs: list[AnyArray] = [output]
        for n, (q, k) in enumerate(variant.flash_maps(value, run), start=2):
            maps = {**args, "q": q, "k": k}  # the map's own q and k
            r = flash_forward(block_q=bq, block_k=bk, base2=base2, record_tiles=False, **maps)
            ref_o, ref_L = reference_rows(trace, q, k, v)
            L_e = r.lse / np.asarray(LOG2E, r.lse.dtype) if base2 else r.lse
            scores = finite_max(ref_L) + math.log(inp.seq_k)
            checks += [
                self_check(f"output_{n}", r.output, ref_o, scores, f32),
                self_check(f"lse_{n}", L_e, ref_L, scores, f32),
            ]
            outputs.append(r.output)
        made = variant.flash_finish(value, run, tuple(outputs))
        checks += [
            self_check(name, mine, run.arrays[name], math.log(inp.seq_k), f32)
            for name, mine in made.items()
        ]
    return tuple(checks)


def flash_failure(run: FlashRun) -> ComputeError | None:
    """The error to raise when flash's O, L or weights left the trace's (None: all within)."""
    return check_failure(run.trace, run.checks, "FlashAttention's")
