"""The mistakes of the norm after RoPE (HunYuan's query/key_layernorm, Llama 4's q/k L2 norm):
the norm applied before RoPE (as Qwen3's QK-norm is), and Llama 4's "L2 norm" taken literally,
x / ‖x‖, where it is an RMS, x / √(mean(x²) + eps). Axis names as in core/steps.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli.check.mistake import Mistake, register, register_zh
from attn_cli.check.recompute import Change, internal, recomputed
from attn_cli.core.chain import Chain
from attn_cli.core.inputs import FloatArray
from attn_cli.core.variant import QKAt

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace

NAME = "post_rope_norm"


def _value(trace: Trace) -> Any:
    return trace.inputs.extra.get(NAME)


def _weight(value: Any, which: str) -> Any:
    w = value.weight(which)
    return 1.0 if w is None else w


def _norm_first(trace: Trace, which: str) -> dict[str, FloatArray] | None:
    """Q's or K's stages with the norm moved before the positional transforms (RoPE) it follows:
    each of their stages and the norm's own hold rope(norm(x)); None: nothing to move."""
    inp, chain = trace.inputs, Chain(trace.inputs)
    stages, transforms = chain.qk_stages(which), chain.transforms_of(which)
    mine = next(i for i, (v, _) in enumerate(transforms) if v.name == NAME)
    first = next((i for i, (v, _) in enumerate(transforms[:mine]) if v.positional), None)
    if first is None:
        return None
    value = transforms[mine][1]
    positions = inp.token_positions()[1 if which == "K" else 0]
    at = QKAt(inp, which, positions)
    x = transforms[mine][0].transform(value, at, internal(trace, stages[first]))  # (B, h, n, D)
    out: dict[str, FloatArray] = {}
    for i in range(first, mine):
        v, setting = transforms[i]
        x = out[stages[i + 1]] = v.transform(setting, at, x)  # (B, h, n, D)
    out[stages[mine + 1]] = x
    return out


def _before_rope(trace: Trace) -> list[Change]:
    value = _value(trace)
    if value is None:
        return []
    q, k = _norm_first(trace, "Q"), _norm_first(trace, "K")
    if q is None or k is None:
        return []
    final = ("Q_postnorm", "K_postnorm")
    if all(np.allclose(q[n] if n[0] == "Q" else k[n], internal(trace, n)) for n in final):
        return []  # no weight and every dim rotated: a rotation keeps the RMS, the order is moot
    detail = (
        "Your {stage} is what attn gets with the q/k norm applied before RoPE: rope(norm(q)) "
        "instead of norm(rope(q)). HunYuan normalises the rotated q and k (query_layernorm and "
        "key_layernorm come after apply_rotary_pos_emb), unlike Qwen3's QK-norm; the norm's "
        "weight does not commute with the rotation. Fix: q = q_norm(rope(q)), k = k_norm(rope(k))."
    )
    first = next(iter(q))
    return [
        Change(detail, first, {**q, **k}),
        Change(detail, "Q_postnorm", {n: a for n, a in {**q, **k}.items() if n in final}),
    ]


def _l2_literal(trace: Trace) -> list[Change]:
    value = _value(trace)
    if value is None:
        return []
    chain, values = Chain(trace.inputs), {}
    for which in "QK":
        stages = chain.qk_stages(which)
        x = internal(trace, stages[stages.index(f"{which}_postnorm") - 1])  # (B, h, n, D)
        norm = np.sqrt(np.sum(x * x, axis=-1, keepdims=True))  # (B, h, n, 1)
        values[f"{which}_postnorm"] = x / norm * _weight(value, which)
    detail = (
        "Your {stage} is what attn gets with the norm taken as a true L2 norm, x / ‖x‖: "
        "Llama 4's Llama4TextL2Norm (and HunYuan's RMSNorm) is x * rsqrt(mean(x²) + eps), an "
        "RMS, √head_dim times larger than x / ‖x‖ (F.normalize). Fix: divide by "
        f"sqrt(mean(x²) + {value.eps:g})."
    )
    return [Change(detail, "Q_postnorm", values)]


register(
    NAME,
    Mistake(
        "post_rope_norm_before_rope",
        "q/k norm applied before RoPE instead of after",
        recomputed(_before_rope),
        217,
    ),
    Mistake(
        "post_rope_norm_l2_literal",
        "L2 norm taken literally (x / ‖x‖) instead of RMS (x / √(mean x² + eps))",
        recomputed(_l2_literal),
        218,
    ),
)

register_zh(
    {
        "post_rope_norm_before_rope": (
            "q/k 归一化放在了 RoPE 之前",
            "混元先旋转再归一化（query_layernorm、key_layernorm 在 apply_rotary_pos_emb 之后），"
            "与 Qwen3 的 QK-norm 相反；权重与旋转不可交换。修正：q = q_norm(rope(q))，"
            "k = k_norm(rope(k))。",
        ),
        "post_rope_norm_l2_literal": (
            "把 L2 范数当成了 x / ‖x‖",
            "Llama 4 的 L2 范数其实是均方根：x * rsqrt(mean(x²) + eps)，比 x / ‖x‖ 大 √head_dim "
            "倍。修正：除以 sqrt(mean(x²) + eps)。",
        ),
    }
)
