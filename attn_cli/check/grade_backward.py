"""Grading someone's own backward pass: the classic mistakes of core/backward.py, each named
only when recomputing it reproduces their numbers (the names gradients go by are in dump.py).

The recomputation is ``backward_mistakes``: the whole backward pass again, from attn's own
forward stages, with one step done the mistaken way. grade.py calls in here when the first
stage that differs is a gradient.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from attn_cli.check.compare import Diagnosis, Tolerance, all_close, as_traced, conform
from attn_cli.check.dump import DS_ALIAS, Dump
from attn_cli.core.backward import MISTAKES, ForwardArrays, backward_mistakes
from attn_cli.core.gradients import forward_arrays
from attn_cli.core.inputs import FloatArray
from attn_cli.core.pipeline import Trace
from attn_cli.core.stages import SPECS, softmax_input


def retarget(dump: Dump, trace: Trace) -> Dump:
    """A dump's ``dS`` under the stage that receives dS here (d_capped or d_scaled when
    nothing masks)."""
    target = f"d_{softmax_input(trace.inputs)}"
    if DS_ALIAS not in dump.arrays or DS_ALIAS in trace.applicable or target == DS_ALIAS:
        return dump
    arrays = {(target if k == DS_ALIAS else k): v for k, v in dump.arrays.items()}
    aliases = {k: (target if v == DS_ALIAS else v) for k, v in dump.aliases.items()}
    return replace(dump, arrays=arrays, aliases=aliases)


def wants_backward(dump: Dump) -> bool:
    """Whether the dump holds any gradient."""
    return any(SPECS[name].gradient for name in dump.arrays)


FIXES = {
    "softmax_without_rowsum": "dS = P * (dP - (dP * P).sum(-1, keepdims=True)).",
    "scale_left_out": "d_scores = d_scaled * scale, then dQ = d_scores @ K, dK = d_scores.T @ Q.",
    "scale_applied_twice": "multiply by the scale once, in d_scores = d_scaled * scale.",
    "dK_not_transposed": "dK = d_scores.swapaxes(-1, -2) @ Q (sum over the queries).",
    "dV_not_transposed": "dV = P.swapaxes(-1, -2) @ dO (sum over the queries).",
    "gqa_not_summed": "sum the query heads of each group: dK.reshape(B, Hkv, g, S, D).sum(2).",
    "gradient_into_masked": "use the masked weights P (0 where not allowed) in dS.",
    "dX_missing_Q_path": "dX = dQ @ W_Q.T + dK @ W_K.T + dV @ W_V.T (heads merged).",
    "dX_missing_K_path": "dX = dQ @ W_Q.T + dK @ W_K.T + dV @ W_V.T (heads merged).",
    "dX_missing_V_path": "dX = dQ @ W_Q.T + dK @ W_K.T + dV @ W_V.T (heads merged).",
}


def diagnose_backward(
    trace: Trace,
    given: Mapping[str, FloatArray],
    stage: str,
    later: Sequence[str],
    tolerance: Tolerance,
) -> tuple[tuple[Diagnosis, ...], tuple[str, ...]]:
    """Every backward mistake that reproduces ``given[stage]``, and the titles of those tried."""
    with np.errstate(all="ignore"):
        candidates = backward_mistakes(_forward(trace), trace.inputs.grad)
    correct = trace[stage]
    found: list[Diagnosis] = []
    tried: list[str] = []
    for name, grads in candidates.items():
        stages = grads.stages()
        if stage not in stages:
            continue
        tried.append(MISTAKES[name])
        value = as_traced(trace, stage, stages[stage])
        if value.shape == correct.shape and all_close(value, correct.data, tolerance):
            continue  # the mistake changes nothing here: it cannot be told apart
        if not _fits(given[stage], value, correct.axes, tolerance):
            continue
        explains = tuple(
            n
            for n in later
            if n in stages
            and _fits(given[n], as_traced(trace, n, stages[n]), trace[n].axes, tolerance)
        )
        detail = (
            f"Your {stage} is what attn gets with this mistake: {MISTAKES[name]}. Fix: "
            f"{FIXES[name]} Confirmed: recomputed from attn's own forward stages, it "
            f"reproduces every cell of your {stage} ({tolerance})."
        )
        found.append(
            Diagnosis(
                name=name,
                title=MISTAKES[name],
                detail=detail,
                stage=stage,
                explains=explains,
                unexplained=tuple(n for n in later if n not in explains),
            )
        )
    return tuple(found), tuple(tried)


def _forward(trace: Trace) -> ForwardArrays:
    """The backward's inputs from the trace's own forward stages (float64)."""
    arrays = {s.name: _internal(trace, s.name) for s in trace if not SPECS[s.name].gradient}
    return forward_arrays(trace.inputs, arrays, trace.scale)


def with_backward(trace: Trace) -> Trace:
    """The trace itself when it holds the backward pass and every forward stage, else a full
    backward run of its inputs (in its dtype)."""
    from attn_cli.core.gradients import backward_needs
    from attn_cli.core.pipeline import run

    if trace.backward and backward_needs(trace.inputs) <= set(trace.stages):
        return trace
    return run(trace.inputs, dtype=trace.dtype, backward=True)


def _internal(trace: Trace, name: str) -> FloatArray:
    data = trace[name].data.astype(np.float64)
    has_batch = trace.inputs.has_batch or SPECS[name].axes[0] != "batch"
    return data if has_batch else data[None]


def _fits(raw: FloatArray, value: FloatArray, axes: tuple[str, ...], tol: Tolerance) -> bool:
    fitted = conform(raw, value.shape, axes)
    return fitted is not None and all_close(fitted, value, tol)
