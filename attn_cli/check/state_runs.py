"""``attn decode`` of linear attention: a recurrent state in place of the KV cache, each step
checked against the trace's other form of the same numbers.

``run_decode_any`` takes a fixture through the ordinary pipeline (Q, K, V, X, and what the
variant's ``decode_stages`` name; no T×T stage), then either core/decode.py (a KV cache, as
``check.runs.run_decode``), core/decode_maps.py when a variant's head output is made of more
than one softmax map over the cache (``Variant.decode_maps``: differential attention), or,
when a variant decodes with a state (``Variant.decode_state``), core/decode_state.py: each
step's output (and the head-output transforms made of it) is compared with the chunked form's
row of its token, computed once over the whole sequence in O(T) memory (the parallel form a
chunk of rows at a time).

Axes: B batch, H heads, T tokens, d_k and d_v per head.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli.blas import blas_limit
from attn_cli.check.references import (
    F64_TOLERANCE,
    max_abs_diff,
    reference_rows,
    scaled_tolerance,
    trace_chain,
)
from attn_cli.check.runs import (
    DecodeRun,
    caster,
    check_decode,
    decode_bytes,
    decode_keep,
    head_output_after,
    internal,
    load_trace,
    quiet,
    refuse_prefill,
    require_finite,
)
from attn_cli.core.decode import kv_cache_bytes
from attn_cli.core.decode import self_check as decode_self_check
from attn_cli.core.decode_state import (
    Recurrence,
    StateBytes,
    StateDecode,
    decode_state,
    state_bytes,
)
from attn_cli.core.variant import Traced

if TYPE_CHECKING:
    from attn_cli.core.decode_maps import MapsForm
    from attn_cli.core.inputs import Inputs
    from attn_cli.core.paged import Paging
    from attn_cli.core.pipeline import Trace

PagedOptions = tuple[int | None, int | None]  # block size, pages (None: the default)


@dataclass(frozen=True, eq=False)
class StateRun:
    """A fixture decoded with a recurrent state: the trace, the steps, the checks, the ledger."""

    trace: Trace
    result: StateDecode
    diffs: tuple[float, ...]  # per step: max |step's output − the chunked form's row|
    prefill_diff: float
    ledger: StateBytes
    formulas: dict[str, str]  # each part of the state and each number a step reads
    tolerance: float = F64_TOLERANCE
    checked: str = "output"  # the stage each step is checked by: output, or normed
    sentinel: float | None = None

    @property
    def worst(self) -> float:
        return max((self.prefill_diff, *self.diffs))

    @property
    def ok(self) -> bool:
        return self.worst <= self.tolerance

    def label(self, index: int) -> str:
        return self.trace.query_labels[index]


def recurrence(trace: Trace) -> Recurrence | None:
    """The variant's recurrent state for this trace (linear attention), None: a KV cache."""
    rec = _first_made(trace, lambda v, *args: v.decode_state(*args))
    assert rec is None or isinstance(rec, Recurrence), "decode_state returns a Recurrence"
    return rec


def _first_made(trace: Trace, hook: Callable[..., Any]) -> Any:
    """The first variant's answer to ``hook`` (its decode_state, decode_maps) on the trace's
    arrays it reads; None when no variant has one."""
    chain = trace_chain(trace)
    cast = caster(np.dtype(trace.dtype))
    for v, value in chain.on:
        names = ("Q", "K", "V", "X", *v.decode_stages)
        arrays = {n: internal(trace, n) for n in names if n in trace}
        made = hook(v, value, Traced(chain.inputs, arrays, cast))
        if made is not None:
            return made
    return None


def state_keep(inputs: Inputs) -> set[str]:
    """decode_keep's stages and Q, K, V whole (a recurrence reads them at every token)."""
    return decode_keep(inputs) | {"Q", "K", "V"}


def run_decode_any(
    fixture: str | os.PathLike[str] | None,
    prefill: int = 1,
    *,
    edges: tuple[int, int] | None = None,
    max_elements: int | None = None,
    max_memory: int | None = None,
    paged: PagedOptions | None = None,
) -> DecodeRun | StateRun:
    """Decode the fixture after ``prefill`` tokens with a KV cache or, for linear attention,
    with its state; ``edges`` (limit, edge): past ``limit`` steps keep the state of only the
    first and last ``edge`` steps, those a view shows (None: every step's); ``paged``: the
    cache in pages of a pool (block size, pages; None in either: the default)."""
    from attn_cli.check.paged_runs import paged_bytes, paging_for, refuse_paged

    pool: list[Paging] = []  # the pool, once the fixture's shapes are known

    def refuse(inputs: Inputs) -> None:
        refuse_prefill(inputs, prefill)
        if paged is not None:
            refuse_paged(inputs)
            pool.append(paging_for(inputs, *paged))

    def extra(inputs: Inputs) -> int:
        pages = paged_bytes(inputs, pool[0]) if pool else 0
        return decode_bytes(inputs, prefill) + states_bytes(inputs, edges) + pages

    trace, sentinel = load_trace(
        fixture,
        state_keep,
        refuse=refuse,
        max_elements=max_elements,
        max_memory=max_memory,
        extra_bytes=extra,
    )
    with quiet():  # a variant's own numbers (a diff's lambda) are checked, not warned about
        rec = recurrence(trace)
        if rec is not None:
            return check_state_decode(trace, rec, prefill, edges, sentinel)
        form = maps_form(trace)
        if form is not None:
            return check_maps_decode(trace, form, prefill, sentinel)
        return check_decode(trace, prefill, sentinel, pool[0] if pool else None)


def maps_form(trace: Trace) -> MapsForm | None:
    """The variant's softmax maps over one cache (differential attention), None: one map."""
    form = _first_made(trace, lambda v, *args: v.decode_maps(*args))
    if form is None:
        return None
    from attn_cli.core.decode_maps import MapsForm  # two maps' loop: theirs only

    assert isinstance(form, MapsForm), "decode_maps returns a MapsForm"
    return form


def check_maps_decode(
    trace: Trace, form: MapsForm, prefill: int, sentinel: float | None = None
) -> DecodeRun:
    """Decode each map over the cache and combine them every step; each step checked against
    the rows of plain softmax attention of each map (streamed, no T×T), combined the same way."""
    from attn_cli.core.decode_maps import decode_maps

    chain = trace_chain(trace)
    final = chain.joined  # diff_scaled
    pos = trace.inputs.token_positions()[0]
    with quiet(), blas_limit(trace.inputs.seq_k):
        refs = [reference_rows(trace, q, k, form.v)[0] for q, k in form.pairs]
        full = form.outs(form.combine(refs))[final]  # (B, H, T, Dv)
        require_finite(trace, final, full)  # before a step: overflow is one line
        result = decode_maps(form, chain=chain, scale=trace.scale, prefill=prefill, positions=pos)
    diffs = tuple(decode_self_check(result, full, final))
    prefill_diff = max_abs_diff(result.prefill_outs[final], full[:, :, :prefill])
    inp = trace.inputs
    cost = kv_cache_bytes(inp.kv_heads, inp.heads, inp.d_k, inp.d_v, 8, inp.seq_q)
    return DecodeRun(
        trace,
        result,
        diffs,
        prefill_diff,
        cost,
        sentinel,
        checked=final,
        tolerance=scaled_tolerance(full),
    )


def states_bytes(inputs: Inputs, edges: tuple[int, int] | None) -> int:
    """About what the steps' kept states hold (a d_k×d_v matrix and a d_k vector per head and
    batch item each), when a variant decodes with a state; 0 otherwise."""
    from attn_cli.core.chain import Chain
    from attn_cli.core.variant import Variant

    if all(type(v).decode_state is Variant.decode_state for v, _ in Chain(inputs).on):
        return 0
    T = inputs.seq_q
    kept = T if edges is None else min(T, max(edges[0], 2 * edges[1]))
    return 8 * kept * inputs.batch * inputs.heads * (inputs.d_k + 1) * inputs.d_v


def check_state_decode(
    trace: Trace,
    rec: Recurrence,
    prefill: int,
    edges: tuple[int, int] | None = None,
    sentinel: float | None = None,
) -> StateRun:
    """Decode with ``rec`` and compare every step with the chunked form's row of its token."""
    chain = trace_chain(trace)
    after = head_output_after(trace, chain)
    final = chain.joined  # output, or the last head-output transform's (normed)
    n = rec.tokens - prefill
    limit, edge = edges or (n, n)

    def keep(k: int) -> bool:
        return n <= limit or k < edge or k >= n - edge

    pos = trace.inputs.token_positions()[0]
    with quiet(), blas_limit(rec.tokens):
        try:
            full = rec.reference()  # (B, H, T, d_v)
        except np.linalg.LinAlgError:  # the chunked form's triangular solve met inf or nan
            from attn_cli.errors import ComputeError

            raise ComputeError(
                trace.inputs.source,
                final,
                "the chunked form's triangular system is singular "
                "(a value of its keys is not finite: float64 overflow)",
                "finite values; scale the inputs down",
            ) from None
        if after is not None:
            full = after(slice(0, rec.tokens), full).get(final, full)
        require_finite(trace, final, full)  # before a step: overflow is one line
        result = decode_state(rec, prefill, pos, keep=keep, after=after)
    diffs = tuple(
        max_abs_diff(s.outs.get(final, s.output)[:, :, 0], full[:, :, s.index])
        for s in result.steps
    )
    prefill_out = result.prefill_outs.get(final, result.prefill_output)
    prefill_diff = max_abs_diff(prefill_out, full[:, :, :prefill])
    ledger = state_bytes(result.prefill_state, rec.heads, rec.d_k, rec.d_v, rec.tokens)
    return StateRun(
        trace,
        result,
        diffs,
        prefill_diff,
        ledger,
        dict(rec.formulas),
        checked=final,
        sentinel=sentinel,
        tolerance=scaled_tolerance(full),
    )


def state_failure(run: DecodeRun | StateRun) -> Any:
    """The error to raise when a step left the reference (None: all within)."""
    from attn_cli.check.runs import decode_failure
    from attn_cli.errors import ComputeError

    if isinstance(run, DecodeRun):
        return decode_failure(run)
    if run.ok:
        return None
    if run.prefill_diff > run.tolerance:
        where = f"prefill (tokens 0..{run.result.prefill - 1})"
    else:
        step = next(
            s for s, d in zip(run.result.steps, run.diffs, strict=True) if not d <= run.tolerance
        )
        where = f"step at position {step.position} ({run.label(step.index)!r})"
    return ComputeError(
        run.trace.inputs.source,
        where,
        f"the state's output differs from the chunked form's rows by {run.worst:.3e}",
        f"at most {run.tolerance:g}",
    )
