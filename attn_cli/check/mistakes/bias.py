"""The mistakes of the additive bias (torch SDPA's float ``attn_mask``, added after the scale):
the bias added before the scale (and so scaled), left out, subtracted, or transposed (keys and
queries swapped). Axis names as in core/steps.py."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from attn_cli.check.mistake import Mistake, register, register_zh, scaled_with_bias
from attn_cli.check.recompute import Candidate, Change, recomputed

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _before_scale(trace: Trace) -> list[Candidate]:
    if trace.inputs.bias is None:
        return []
    detail = (
        f"Your {{stage}} is what attn gets with the bias added before the scale, and so "
        f"multiplied by {trace.scale:.6g}: (scores + bias) * scale. torch SDPA adds a float "
        "attn_mask after scaling: softmax(q @ k.T * scale + attn_mask). Fix: scores * scale + "
        "bias."
    )
    return scaled_with_bias(trace, detail)


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
    Mistake(
        "bias_before_scale",
        "bias added before the scale (scaled with the scores)",
        _before_scale,
        250,
    ),
    Mistake("bias_ignored", "bias left out", recomputed(_ignored), 251),
    Mistake("bias_sign", "bias subtracted", recomputed(_sign), 252),
    Mistake(
        "bias_transposed",
        "bias transposed (keys and queries swapped)",
        recomputed(_transposed),
        253,
    ),
)

register_zh(
    {
        "bias_before_scale": (
            "偏置加在了缩放之前（被一起缩放）",
            "写成 (scores + bias) * scale；torch SDPA 的浮点 attn_mask 加在缩放之后。修正：scores "
            "* scale + bias。",
        ),
        "bias_ignored": (
            "漏掉了偏置",
            "缩放后的分数上没有加偏置。修正：masked = scaled + bias。",
        ),
        "bias_sign": (
            "偏置被减去了",
            "写成 scaled − bias；加性遮蔽是加上去的。修正：scaled + bias。",
        ),
        "bias_transposed": (
            "偏置被转置了（查询与键交换）",
            "偏置按 [batch, heads, seq_q, seq_k] 排列，查询在行、键在列。修正：按原样加偏置（若你"
            "的是先键后查询，用 bias.mT）。",
        ),
    }
)
