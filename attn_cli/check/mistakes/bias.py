"""The mistakes of the additive bias (torch SDPA's float ``attn_mask``, added after the scale):
the bias added before the scale (and so scaled), left out, subtracted, or transposed (keys and
queries swapped). Axis names as in core/steps.py."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from attn_cli.check.mistake import Mistake, register
from attn_cli.check.recompute import Candidate, Change, allowed, candidate, masked_with, recomputed

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _before_scale(trace: Trace) -> list[Candidate]:
    inp = trace.inputs
    if inp.bias is None or trace.scale == 1 or inp.softcap is not None or inp.alibi is not None:
        return []
    masked = masked_with(trace, allowed(inp), before="scores") * trace.scale  # (B, H, T, S)
    detail = (
        f"Your {{stage}} is what attn gets with the bias added before the scale, and so "
        f"multiplied by {trace.scale:.6g}: (scores + bias) * scale. torch SDPA adds a float "
        "attn_mask after scaling: softmax(q @ k.T * scale + attn_mask). Fix: scores * scale + "
        "bias."
    )
    return [candidate(trace, detail, "masked", {"masked": masked})]


def _ignored(trace: Trace) -> list[Change]:
    inp = trace.inputs
    if inp.bias is None:
        return []
    detail = (
        "Your {stage} is what attn gets with the bias left out: nothing added to the scaled "
        "scores (a float attn_mask built and never passed on). Fix: masked = scaled + bias."
    )
    return [Change(detail, "masked", inputs=replace(inp, bias=None))]


def _sign(trace: Trace) -> list[Change]:
    bias = trace.inputs.bias
    if bias is None or not np.isfinite(bias).any():
        return []
    flipped = np.where(np.isfinite(bias), -bias, bias)  # -inf stays: still hidden
    detail = (
        "Your {stage} is what attn gets with the bias subtracted (or its sign flipped): "
        "scaled - bias. An additive mask is added. Fix: scaled + bias."
    )
    return [Change(detail, "masked", inputs=replace(trace.inputs, bias=flipped))]


def _transposed(trace: Trace) -> list[Change]:
    inp = trace.inputs
    if inp.bias is None or inp.seq_q != inp.seq_k:
        return []
    full = np.broadcast_to(inp.bias, (inp.batch, inp.heads, inp.seq_q, inp.seq_k))
    if (full == full.swapaxes(-1, -2)).all():
        return []
    detail = (
        "Your {stage} is what attn gets with the bias transposed: bias[..., key, query] added "
        "at (query, key). The bias is laid out [batch, heads, seq_q, seq_k], queries down, "
        "keys across. Fix: add the bias as it is (or bias.mT if yours was built keys first)."
    )
    swapped = full.swapaxes(-1, -2).copy()  # (B, H, S, T) read as (B, H, T, S)
    return [Change(detail, "masked", inputs=replace(inp, bias=swapped))]


register(
    "bias",
    Mistake("bias_before_scale", "bias added before the scale (scaled with the scores)",
            _before_scale, 250),
    Mistake("bias_ignored", "bias left out", recomputed(_ignored), 251),
    Mistake("bias_sign", "bias subtracted", recomputed(_sign), 252),
    Mistake("bias_transposed", "bias transposed (keys and queries swapped)",
            recomputed(_transposed), 253),
)  # fmt: skip
