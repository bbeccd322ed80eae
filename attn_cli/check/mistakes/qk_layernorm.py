"""The mistakes of q/k LayerNorm (StableLM 2, Phi: a LayerNorm of each head of Q and K before
RoPE): an RMSNorm in its place (the mean not subtracted), one weight shared by all heads where
each head has its own, the norm over the whole projection instead of each head. Axis names as
in core/steps.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from attn_cli.check.mistake import Mistake, register, register_zh
from attn_cli.check.recompute import Change, internal, recomputed
from attn_cli.core.heads import merge_heads, split_heads
from attn_cli.core.inputs import FloatArray, Inputs
from attn_cli.core.ops import layer_norm, rms_norm
from attn_cli.core.plugins.qk_layernorm import QKLayerNorm, head_params
from attn_cli.core.variant import same

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _value(trace: Trace) -> QKLayerNorm | None:
    value: QKLayerNorm | None = trace.inputs.setting("qk_layernorm")
    return value


Norm = Callable[[QKLayerNorm, str, FloatArray], FloatArray]  # (setting, "Q" or "K", x) -> x_ln
When = Callable[[QKLayerNorm, Inputs], bool]  # whether the mistake changes anything


def _changes(norm: Norm, detail: str, when: When) -> Callable[[Trace], list[Change]]:
    """The change of Q_ln and K_ln into ``norm`` of attn's Q and K, where qk_layernorm is on and
    ``when`` says the mistake would change them."""

    def changes(trace: Trace) -> list[Change]:
        value = _value(trace)
        if value is None or not when(value, trace.inputs):
            return []
        values = {f"{w}_ln": norm(value, w, internal(trace, w)) for w in "QK"}  # (B, heads, n, D)
        return [Change(detail, "Q_ln", values)]

    return changes


def _rms(value: QKLayerNorm, which: str, x: FloatArray) -> FloatArray:
    """The LayerNorm's weight and bias on an RMSNorm: x / √(mean(x²) + eps) · w (+ b)."""
    w, b = head_params(value, which, same)
    y = rms_norm(x, None, value.eps, divide=True) * w  # (B, heads, n, D)
    return y if b is None else y + b


def _first_head(value: QKLayerNorm, which: str, x: FloatArray) -> FloatArray:
    """Head 0's LayerNorm on every head."""
    w, b = value.params(which)
    if value.per_head(which):
        w, b = w[0], None if b is None else b[0]  # (D,): the first head's
    return layer_norm(x, w, b, value.eps)


def _whole(value: QKLayerNorm, which: str, x: FloatArray) -> FloatArray:
    """One LayerNorm over each token's whole projection (heads × d_k) before the split."""
    w, b = value.params(which)
    H = x.shape[1]
    flat_w = w.reshape(-1) if w.ndim == 2 else np.tile(w, H)  # (heads*D,)
    flat_b = None if b is None else b.reshape(-1) if b.ndim == 2 else np.tile(b, H)
    whole = layer_norm(merge_heads(x), flat_w, flat_b, value.eps)  # (B, n, heads*D)
    return split_heads(whole, H)  # (B, heads, n, D)


def _always(value: QKLayerNorm, inputs: Inputs) -> bool:
    return True


def _own_weights(value: QKLayerNorm, inputs: Inputs) -> bool:
    """Some side has more than one head, each with a weight of its own."""
    return any(value.per_head(w) and value.params(w)[0].shape[0] > 1 for w in "QK")


def _heads(value: QKLayerNorm, inputs: Inputs) -> bool:
    """More than one head: else the head is the whole projection."""
    return max(inputs.heads, inputs.kv_heads) > 1


RMS = (
    "Your {stage} is what attn gets with an RMSNorm where the fixture has a LayerNorm: "
    "x / sqrt(mean(x²) + eps) * weight, the mean never subtracted. StableLM 2's and Phi's q/k "
    "norms are nn.LayerNorm: (x - mean(x)) / sqrt(var(x) + eps) * weight (+ bias), over each "
    "head's d_k. Fix: subtract each row's mean first, and divide by its standard deviation, not "
    "its root mean square."
)
SHARED = (
    "Your {stage} is what attn gets with one LayerNorm for all heads, the first head's weight on "
    "every head, where each head has its own: StableLM 2's q_layernorm is a list of LayerNorms, "
    "norms.{{h}} for head h (StableLmLayerNormPerHead), and k_layernorm one per kv head. Fix: "
    "normalise head h with q_weight[h] (k_weight[h] for the keys)."
)
WHOLE = (
    "Your {stage} is what attn gets with the LayerNorm over each token's whole projection (every "
    "head at once, heads*d_k numbers) before splitting it into heads. The q/k LayerNorm runs after "
    "the split, over each head's d_k alone: q.view(batch, n, heads, head_dim), then the norm. Fix: "
    "split into heads first, then normalise."
)
# name, title, the student's norm, what it says, when it changes anything
MISTAKES: tuple[tuple[str, str, Norm, str, When], ...] = (
    ("qk_layernorm_rms", "q/k LayerNorm as an RMSNorm (mean not subtracted)", _rms, RMS, _always),
    (
        "qk_layernorm_shared",
        "q/k LayerNorm with one weight shared by all heads",
        _first_head,
        SHARED,
        _own_weights,
    ),
    (
        "qk_layernorm_whole",
        "q/k LayerNorm over the whole projection instead of each head",
        _whole,
        WHOLE,
        _heads,
    ),
)
register(
    "qk_layernorm",
    *(
        Mistake(name, title, recomputed(_changes(norm, detail, when)), 217 + i)
        for i, (name, title, norm, detail, when) in enumerate(MISTAKES)
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
