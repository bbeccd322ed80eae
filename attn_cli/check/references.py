"""What the decode and flash runs are checked against, and how: plain softmax attention's
rows (the one chain over each row's allowed keys, a two-pass softmax, no cache, no tile, O(T)
memory) and the comparisons (largest difference, in ulps, the tolerances)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli.core.chain import Chain, allowed_span, cells_of
from attn_cli.core.steps import Way, attention, in_place
from attn_cli.errors import ComputeError

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
AnyArray = np.ndarray[Any, Any]  # float64 or float32, as core returns them

F64_TOLERANCE = 1e-12  # float64: the order of summation moves the last bits only
ULPS = 64  # flash: up to 64 ulps of the scores' size (times the values') is rounding
REF_CELLS = 1 << 19  # scores per block of flash's reference rows (2 MiB in float32)
REF_ROWS = 64  # rows per block at most: a causal block computes its keys up to its last row


def trace_chain(trace: Trace) -> Chain:
    """The chain of the trace's variants, its bias in the trace's computing dtype (as the
    block engine adds it)."""
    inp = trace.inputs
    if inp.bias is None:
        return Chain(inp)
    return Chain(replace(inp, bias=inp.bias.astype(np.dtype(trace.dtype), copy=False)))


def scaled_tolerance(full: AnyArray) -> float:
    """What a step may differ from its reference row by: F64_TOLERANCE of the largest |value|
    of the rows (at least F64_TOLERANCE): rounding moves the last bits of numbers of 1e196 by
    far more than 1e-12."""
    return F64_TOLERANCE * max(1.0, finite_max(full))


def max_abs_diff(actual: AnyArray, expected: AnyArray) -> float:
    """max |actual − expected|; equal non-finite values differ by 0, unequal ones by inf."""
    if actual.size == 0:
        return 0.0
    finite = np.isfinite(actual) & np.isfinite(expected)
    same = (actual == expected) | (np.isnan(actual) & np.isnan(expected))
    diff = np.where(
        finite,
        np.abs(np.where(finite, actual, 0.0) - np.where(finite, expected, 0.0)),
        np.where(same, 0.0, np.inf),
    )
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


@dataclass(frozen=True)
class SelfCheck:
    """One comparison of flash with the trace: the largest difference, and in ulps (float32)."""

    name: str  # "output", "lse", "softmax"
    max_abs: float
    ulps: float | None  # float32 only
    tolerance: float
    ok: bool


def reference_rows(
    trace: Trace, q: AnyArray, k: AnyArray, v: AnyArray
) -> tuple[AnyArray, AnyArray]:
    """O (B, H, T, Dv) and L (B, H, T) as plain softmax attention computes them, a few whole
    rows at a time: the chain over every key of the rows, L = log Σ exp (with the extra logit),
    O = exp(x − L) · V. O(T) memory beyond a block of ``REF_CELLS`` scores; no tile, no
    running max, no skipped key: what flash's loop is checked against."""
    inp = trace.inputs
    chain = trace_chain(trace)
    B, H, T, _ = q.shape
    _, Hkv, S, Dv = v.shape
    g = H // Hkv  # query heads h0:h0+g read key/value head h0 // g: one product for the group
    dtype = q.dtype
    rows = max(1, min(REF_ROWS, REF_CELLS // max(1, S * g)))
    output = np.zeros((B, H, T, Dv), dtype)
    L = np.empty((B, H, T), dtype)
    for b, j in itertools.product(range(B), range(Hkv)):
        kT, vj, heads = k[b, j].T, v[b, j], slice(j * g, (j + 1) * g)  # (D, S), (S, Dv)
        for t0 in range(0, T, rows):
            t1 = min(T, t0 + rows)
            cells = cells_of(inp, slice(b, b + 1), heads, slice(t0, t1))
            s0, s1 = allowed_span(chain, cells)
            cells = cells._replace(keys=cells.keys[s0:s1], pos_k=cells.pos_k[s0:s1])
            R = t1 - t0  # the group's g × R rows in one product, not g products of R rows
            scores = q[b, heads, t0:t1].reshape(g * R, -1) @ kT[:, s0:s1]  # (g·R, n)
            scores = scores.reshape(1, g, R, s1 - s0)
            made = attention(
                chain,
                None,
                None,
                vj[s0:s1],
                cells,
                dtype.type(trace.scale),
                _REFERENCE,
                into=in_place(scores, chain),
                lse=L[b : b + 1, heads, t0:t1],
                start=("scores", scores),
            )
            assert made.output is not None
            output[b, heads, t0:t1] = made.output[0]
    return output, L


def _rows_times_values(weights: AnyArray, v: AnyArray) -> AnyArray:
    """exp · V for a group's rows (1, g, R, S) @ (S, Dv), in one product: (1, g, R, Dv)."""
    _, g, R, S = weights.shape
    out: AnyArray = (weights.reshape(g * R, S) @ v).reshape(1, g, R, -1)
    return out


# the reference's way: -inf where hidden, O = (exp · V) / total (a fused kernel's order)
_REFERENCE = Way(mix=_rows_times_values, fill=-np.inf, divide_late=True)


def self_check(name: str, mine: AnyArray, ref: AnyArray, scores: float, f32: bool) -> SelfCheck:
    """One comparison, within ULPS ulps of the scores' and the values' size (1e-12 at least
    in float64)."""
    diff = max_abs_diff(mine, ref)
    eps = float(np.finfo(mine.dtype).eps)
    tol = ULPS * eps * (1 + scores) * (1 + finite_max(ref))
    tol = min(tol, float(np.finfo(np.float64).max))  # scores and values of 1e200: not inf
    tol = tol if f32 else max(F64_TOLERANCE, tol)
    ulps = max_ulps(mine, ref) if f32 else None
    return SelfCheck(name, diff, ulps, tol, diff <= tol)


def finite_max(x: AnyArray) -> float:
    """The largest finite |x| (0 when there is none)."""
    return float(np.abs(x[np.isfinite(x)]).max(initial=0.0))


def check_failure(trace: Trace, checks: tuple[SelfCheck, ...], what: str) -> ComputeError | None:
    """The error to raise for the first check that left the trace's numbers (None: all
    within); ``what`` names the loop (FlashAttention's, split-KV's)."""
    bad = next((c for c in checks if not c.ok), None)
    if bad is None:
        return None
    return ComputeError(
        trace.inputs.source,
        bad.name,
        f"{what} {bad.name} differs from the trace's by {bad.max_abs:.3e}",
        f"at most {bad.tolerance:.3g}",
    )
