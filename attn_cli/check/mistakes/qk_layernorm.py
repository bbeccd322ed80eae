"""The mistakes of q/k LayerNorm (StableLM 2, Phi: a LayerNorm of each head of Q and K before
RoPE): an RMSNorm in its place (the mean not subtracted), one weight shared by all heads where
each head has its own, the norm over the whole projection instead of each head. Axis names as
in core/steps.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attn_cli.check.mistake import Mistake, register, register_zh
from attn_cli.check.recompute import Change, internal, recomputed
from attn_cli.core.heads import merge_heads, split_heads
from attn_cli.core.inputs import FloatArray
from attn_cli.core.ops import layer_norm, rms_norm
from attn_cli.core.plugins.qk_layernorm import QKLayerNorm, head_params
from attn_cli.core.variant import same

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _value(trace: Trace) -> QKLayerNorm | None:
    value: QKLayerNorm | None = trace.inputs.setting("qk_layernorm")
    return value


def _rms(x: FloatArray, w: FloatArray, b: FloatArray | None, eps: float) -> FloatArray:
    """The LayerNorm's weight and bias on an RMSNorm: x / √(mean(x²) + eps) · w (+ b)."""
    y = rms_norm(x, None, eps, divide=True) * w  # (B, heads, n, D)
    return y if b is None else y + b


def _rms_not_layer(trace: Trace) -> list[Change]:
    value = _value(trace)
    if value is None:
        return []
    values = {}
    for which in "QK":
        w, b = head_params(value, which, same)
        values[f"{which}_ln"] = _rms(internal(trace, which), w, b, value.eps)
    detail = (
        "Your {stage} is what attn gets with an RMSNorm where the fixture has a LayerNorm: "
        "x / sqrt(mean(x²) + eps) * weight, the mean never subtracted. StableLM 2's and Phi's "
        "q/k norms are nn.LayerNorm: (x - mean(x)) / sqrt(var(x) + eps) * weight (+ bias), over "
        "each head's d_k. Fix: subtract each row's mean first, and divide by its standard "
        "deviation, not its root mean square."
    )
    return [Change(detail, "Q_ln", values)]


def _shared(trace: Trace) -> list[Change]:
    """Head 0's LayerNorm for every head, where each head has its own (StableLM 2)."""
    value = _value(trace)
    if value is None or not any(
        value.per_head(w) and value.params(w)[0].shape[0] > 1 for w in "QK"
    ):
        return []
    values = {}
    for which in "QK":
        w, b = value.params(which)
        if value.per_head(which):
            w, b = w[0], None if b is None else b[0]  # (D,): the first head's
        values[f"{which}_ln"] = layer_norm(internal(trace, which), w, b, value.eps)
    detail = (
        "Your {stage} is what attn gets with one LayerNorm for all heads, the first head's weight "
        "on every head, where each head has its own: StableLM 2's q_layernorm is a list of "
        "LayerNorms, norms.{{h}} for head h (StableLmLayerNormPerHead), and k_layernorm one per "
        "kv head. Fix: normalise head h with q_weight[h] (k_weight[h] for the keys)."
    )
    return [Change(detail, "Q_ln", values)]


def _whole(trace: Trace) -> list[Change]:
    """One LayerNorm over each token's whole projection (heads × d_k) before the split."""
    value, inp = _value(trace), trace.inputs
    if value is None or max(inp.heads, inp.kv_heads) == 1:
        return []  # one head: the head is the whole projection
    values = {}
    for which in "QK":
        x = internal(trace, which)  # (B, heads, n, D)
        w, b = value.params(which)
        H = x.shape[1]
        flat_w = w.reshape(-1) if w.ndim == 2 else np.tile(w, H)  # (heads*D,)
        flat_b = None if b is None else b.reshape(-1) if b.ndim == 2 else np.tile(b, H)
        whole = layer_norm(merge_heads(x), flat_w, flat_b, value.eps)  # (B, n, heads*D)
        values[f"{which}_ln"] = split_heads(whole, H)  # (B, heads, n, D)
    detail = (
        "Your {stage} is what attn gets with the LayerNorm over each token's whole projection "
        "(every head at once, heads*d_k numbers) before splitting it into heads. The q/k "
        "LayerNorm runs after the split, over each head's d_k alone: q.view(batch, n, heads, "
        "head_dim), then the norm. Fix: split into heads first, then normalise."
    )
    return [Change(detail, "Q_ln", values)]


register(
    "qk_layernorm",
    Mistake(
        "qk_layernorm_rms",
        "q/k LayerNorm as an RMSNorm (mean not subtracted)",
        recomputed(_rms_not_layer),
        217,
    ),
    Mistake(
        "qk_layernorm_shared",
        "q/k LayerNorm with one weight shared by all heads",
        recomputed(_shared),
        218,
    ),
    Mistake(
        "qk_layernorm_whole",
        "q/k LayerNorm over the whole projection instead of each head",
        recomputed(_whole),
        219,
    ),
)

register_zh(
    {
        "qk_layernorm_rms": (
            "q/k LayerNorm 做成了 RMSNorm（没有减均值）",
            "StableLM 2 和 Phi 的 q/k 归一化是 nn.LayerNorm：先减去每行的均值，再除以标准差，"
            "乘权重（加偏置）。修正：先中心化 x。",
        ),
        "qk_layernorm_shared": (
            "q/k LayerNorm 所有头共用了一个权重",
            "StableLM 2 每个头有自己的 LayerNorm（norms.h）。修正：第 h 个头用 q_weight[h]"
            "（键用 k_weight[h]）。",
        ),
        "qk_layernorm_whole": (
            "q/k LayerNorm 对整个投影做了归一化，而不是每个头",
            "q/k LayerNorm 在拆分成多头之后、对每个头的 d_k 单独做。修正：先拆头，再归一化。",
        ),
    }
)
