"""The mistakes of linear attention: Gated DeltaNet's delta rule with the sign of beta's write
flipped (the correction v − Sᵀk subtracted instead of added), q and k not L2-normalised, the
decay e^g not applied; plain linear attention's output not divided by the normaliser φ(q)·z.
Each is recomputed from attn's own stages with the core's own forms (core/plugins/linear.py)
and claimed only where it reproduces the user's numbers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli.check.mistake import Mistake, register, register_zh
from attn_cli.check.recompute import Candidate, internal
from attn_cli.core.heads import merge_heads
from attn_cli.core.linear_forms import (
    delta_chunked,
    delta_parallel,
    delta_recurrent,
    gated_rms_norm,
)
from attn_cli.core.variant import REGISTRY

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _joined(trace: Trace, out: dict[str, Any], last: Any) -> dict[str, Any]:
    """concat and projected from the heads' last stage (B, H, T, Dv), where the trace has them."""
    inp = trace.inputs
    if "concat" in trace:
        out["concat"] = merge_heads(last)  # (B, T, H*Dv)
        if "projected" in trace and inp.W_O is not None:
            b_O = 0.0 if inp.b_O is None else inp.b_O
            out["projected"] = out["concat"] @ inp.W_O.astype(np.float64) + b_O
    return out


def _delta(trace: Trace, q: Any, k: Any, g: Any, beta: Any, detail: str) -> list[Candidate]:
    """Every stage from q_l2 on, with these q, k, g and beta."""
    value = REGISTRY["gated_deltanet"].value(trace.inputs)
    assert value is not None, "the mistakes of gated_deltanet are tried with it on"
    v = internal(trace, "V")
    weights, output = delta_parallel(q, k, v, g, beta)
    states, recurrent = delta_recurrent(q, k, v, g, beta)
    normed = gated_rms_norm(output, internal(trace, "z"), value.norm.astype(np.float64), value.eps)
    out = {
        "q_l2": q,
        "k_l2": k,
        "implicit_weights": weights,
        "output": output,
        "normed": normed,
        "state": states,
        "output_recurrent": recurrent,
        "output_chunked": delta_chunked(q, k, v, g, beta, value.chunk),
    }
    return [Candidate(detail, _joined(trace, out, normed))]


def _on(trace: Trace) -> bool:
    return REGISTRY["gated_deltanet"].value(trace.inputs) is not None


def _beta_sign(trace: Trace) -> list[Candidate]:
    if not _on(trace):
        return []
    q, k, g = (internal(trace, n) for n in ("q_l2", "k_l2", "g"))
    detail = (
        "Your {stage} is what attn gets with the sign of beta's write flipped: the state takes "
        "S − β·k·(v − Sᵀk)ᵀ (or β·(Sᵀk − v)), pushing the memory away from v instead of toward "
        "it. The delta rule corrects what the state predicts for k: delta = β·(v − Sᵀk), then "
        "S ← S + k·deltaᵀ (torch_recurrent_gated_delta_rule). Fix: delta = (v_t − kv_mem)·β_t."
    )
    return _delta(trace, q, k, g, -internal(trace, "beta"), detail)


def _no_l2norm(trace: Trace) -> list[Candidate]:
    if not _on(trace):
        return []
    Q, K = internal(trace, "Q"), internal(trace, "K")
    detail = (
        "Your {stage} is what attn gets with q and k not L2-normalised (q only divided by √d_k): "
        "Qwen3NextGatedDeltaNet calls the kernel with use_qk_l2norm_in_kernel=True, so each key "
        "is a unit direction and the delta rule replaces what the state holds along it. Fix: "
        "q = l2norm(q)/√d_k, k = l2norm(k), with l2norm(x) = x/√(Σx² + 1e-6)."
    )
    g, beta = internal(trace, "g"), internal(trace, "beta")
    return _delta(trace, Q / np.sqrt(Q.shape[-1]), K, g, beta, detail)


def _no_decay(trace: Trace) -> list[Candidate]:
    if not _on(trace):
        return []
    q, k, g = (internal(trace, n) for n in ("q_l2", "k_l2", "g"))
    detail = (
        "Your {stage} is what attn gets with the decay not applied: the state is never multiplied "
        "by e^g (g = −exp(A_log)·softplus(a + dt_bias)), so nothing is forgotten. Fix: "
        "S ← S·exp(g_t) before reading and writing each token."
    )
    return _delta(trace, q, k, np.zeros_like(g), internal(trace, "beta"), detail)


def _no_normaliser(trace: Trace) -> list[Candidate]:
    if REGISTRY["linear_attention"].value(trace.inputs) is None:
        return []
    weights = internal(trace, "implicit_weights")
    phi_q = internal(trace, "phi_Q")
    z = internal(trace, "normaliser")  # (B, H, T, d_k): z_t
    den = np.einsum("bhtk,bhtk->bht", phi_q, z)[..., None]  # φ(q_t)·z_t
    raw = weights * den  # (B, H, T, S): φ(q_t)·φ(k_s), unnormalised
    output = internal(trace, "output") * den
    detail = (
        "Your {stage} is what attn gets without the normaliser: φ(q_t)ᵀS_t alone, not divided "
        "by φ(q_t)ᵀz_t, the sum of query t's similarities (z_t = Σ_(s≤t) φ(k_s)). It is "
        "softmax's denominator here: without it, the output grows with the length. Fix: "
        "output_t = φ(q_t)ᵀS_t / φ(q_t)ᵀz_t."
    )
    out = {
        "implicit_weights": raw,
        "output": output,
        "output_recurrent": output,
        "output_chunked": output,
    }
    return [Candidate(detail, _joined(trace, out, output))]


register(
    "gated_deltanet",
    Mistake("delta_beta_sign", "the delta rule with the wrong sign of beta", _beta_sign, 240),
    Mistake("delta_no_l2norm", "Gated DeltaNet without the L2 norm of q and k", _no_l2norm, 241),
    Mistake("delta_no_decay", "Gated DeltaNet with the decay not applied", _no_decay, 242),
)
register(
    "linear_attention",
    Mistake("linear_no_normaliser", "linear attention without the normaliser", _no_normaliser, 243),
)

register_zh(
    {
        "delta_beta_sign": (
            "delta 规则中 beta 的符号写反了",
            "状态变成了 S − β·k·(v − Sᵀk)ᵀ，把记忆推离 v 而不是推向 v。delta 规则修正的是状态对 k "
            "的预测：delta = β·(v − Sᵀk)，再 S ← S + k·deltaᵀ（torch_recurrent_gated_delta_rul"
            "e）。修正：delta = (v_t − kv_mem)·β_t。",
        ),
        "delta_no_l2norm": (
            "Gated DeltaNet 没有对 q 和 k 做 L2 归一化",
            "Qwen3NextGatedDeltaNet 以 use_qk_l2norm_in_kernel=True 调用核函数，"
            "每个键都是单位方向，delta 规则替换状态在这个方向上的内容。"
            "修正：q = l2norm(q)/√d_k，k = l2norm(k)，"
            "其中 l2norm(x) = x/√(Σx² + 1e-6)。",
        ),
        "delta_no_decay": (
            "Gated DeltaNet 没有施加衰减",
            "状态从未乘以 e^g（g = −exp(A_log)·softplus(a + dt_bias)），于是什么都不会被遗忘。"
            "修正：处理每个词元前先 S ← S·exp(g_t)。",
        ),
        "linear_no_normaliser": (
            "线性注意力漏掉了归一化项",
            "只算了 φ(q_t)ᵀS_t，没有除以 φ(q_t)ᵀz_t（查询 t 所有相似度之和，"
            "z_t = Σ_(s≤t) φ(k_s)）。它在这里就是 softmax 的分母："
            "没有它，输出会随长度增长。"
            "修正：output_t = φ(q_t)ᵀS_t / φ(q_t)ᵀz_t。",
        ),
    }
)
