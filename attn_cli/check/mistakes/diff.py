"""The mistakes of differential attention (Differential Transformer, unilm's MultiheadDiffAttn):
λ not re-parameterised (kept at λ_init, λ_init left out, or the exponentials left out), λ_init
from the layer counted from 1, the per-head RMSNorm (subln) left out, the (1 − λ_init) scale
left out. Each is recomputed from attn's own stages (softmax, softmax_2, V)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli.check.mistake import Mistake, register, register_zh
from attn_cli.check.recompute import Change, internal, recomputed
from attn_cli.core.ops import rms_norm
from attn_cli.core.plugins.diff import VECTORS, Diff, lambda_init_fn

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _setting(trace: Trace) -> Diff | None:
    value = trace.inputs.extra.get("diff")
    ok = isinstance(value, Diff) and all(s in trace for s in ("softmax", "softmax_2", "V"))
    return value if ok else None


def _from_lambda(trace: Trace, d: Diff, lam: np.ndarray, init: float) -> dict[str, Any]:
    """lambda and every stage after it, with ``lam`` (H,) and ``init`` in place of attn's."""
    diff = internal(trace, "softmax") - lam[None, :, None, None] * internal(trace, "softmax_2")
    out = diff @ internal(trace, "V")  # (B, H, T, Dv)
    normed = rms_norm(out, d.norm, d.eps, divide=True)
    return {
        "lambda": lam,
        "diff": diff,
        "diff_output": out,
        "diff_norm": normed,
        "diff_scaled": normed * (1.0 - init),
    }


def _dots(d: Diff, heads: int) -> tuple[np.ndarray, np.ndarray]:
    """λ_q1·λ_k1 and λ_q2·λ_k2 of each head, (H,)."""
    q1, k1, q2, k2 = (getattr(d, n) for n in VECTORS)
    one = np.broadcast_to(np.sum(q1 * k1, axis=-1), (heads,))
    two = np.broadcast_to(np.sum(q2 * k2, axis=-1), (heads,))
    return one.astype(float), two.astype(float)


def _lambda_raw(trace: Trace) -> list[Change]:
    d = _setting(trace)
    if d is None:
        return []
    H, init = trace.inputs.heads, d.lambda_init
    one, two = _dots(d, H)
    right = f"λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init = {float(trace['lambda'].data[0]):.6g}"
    ways = (
        (np.full(H, init), f"λ kept at λ_init = {init:.6g} (the four learned vectors left out)"),
        (np.exp(one) - np.exp(two), "λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) without λ_init"),
        (one - two + init, "λ = λ_q1·λ_k1 − λ_q2·λ_k2 + λ_init, without the exponentials"),
    )
    return [
        Change(
            f"Your {{stage}} is what attn gets with {how}. The paper re-parameterises λ: "
            f"{right} (unilm's lambda_1 − lambda_2 + self.lambda_init). Fix: λ from the "
            "four vectors through exp, plus λ_init.",
            "lambda",
            _from_lambda(trace, d, lam, init),
        )
        for lam, how in ways
    ]


def _lambda_init_from_one(trace: Trace) -> list[Change]:
    d = _setting(trace)
    if d is None or d.depth is None or d.depth < 1:
        return []
    wrong = lambda_init_fn(d.depth - 1)
    one, two = _dots(d, trace.inputs.heads)
    lam = np.exp(one) - np.exp(two) + wrong
    detail = (
        f"Your {{stage}} is what attn gets with λ_init = 0.8 − 0.6·exp(−0.3·(depth − 1)) = "
        f"{wrong:.6g}, the layer counted from 1, instead of 0.8 − 0.6·exp(−0.3·{d.depth}) = "
        f"{d.lambda_init:.6g}: unilm's lambda_init_fn(depth) takes the layer index from 0. "
        "Fix: λ_init = 0.8 − 0.6·exp(−0.3·depth) with depth the 0-based layer index (it changes "
        "both λ and the (1 − λ_init) scale)."
    )
    return [Change(detail, "lambda", _from_lambda(trace, d, lam, wrong))]


def _scale_missing(trace: Trace) -> list[Change]:
    d = _setting(trace)
    if d is None or "diff_norm" not in trace or d.lambda_init == 0.0:  # a scale of 1
        return []
    detail = (
        f"Your {{stage}} is what attn gets without the (1 − λ_init) = {1 - d.lambda_init:.6g} "
        "scale after the norm: the reference multiplies every head's normed output by it "
        "(attn = attn * (1 - self.lambda_init)), so that the gradients flow as in a Transformer. "
        "Fix: diff_scaled = diff_norm × (1 − λ_init)."
    )
    return [Change(detail, "diff_scaled", {"diff_scaled": internal(trace, "diff_norm")})]


def _norm_missing(trace: Trace) -> list[Change]:
    d = _setting(trace)
    if d is None or "diff_output" not in trace:
        return []
    out = internal(trace, "diff_output")
    detail = (
        "Your {stage} is what attn gets without the per-head RMSNorm (the reference's subln, "
        f"eps {d.eps:g}{', with its weight' if d.norm is not None else ''}): the difference "
        "map's rows sum to 1 − λ, not 1, so each head's output is normed on its own before the "
        "(1 − λ_init) scale. Fix: diff_norm = norm ⊙ x / √(mean(x²) + eps) over each head's d_v."
    )
    values = {"diff_norm": out, "diff_scaled": out * (1.0 - d.lambda_init)}
    return [Change(detail, "diff_norm", values)]


register(
    "diff",
    Mistake(
        "diff_lambda_not_reparameterised",
        "differential λ not re-parameterised",
        recomputed(_lambda_raw),
        250,
    ),
    Mistake(
        "diff_lambda_init_from_one",
        "λ_init from the layer counted from 1",
        recomputed(_lambda_init_from_one),
        255,
    ),
    Mistake(
        "diff_norm_missing", "per-head RMSNorm (subln) missing", recomputed(_norm_missing), 260
    ),
    Mistake("diff_scale_missing", "(1 − λ_init) scale missing", recomputed(_scale_missing), 265),
)
register_zh(
    {
        "diff_lambda_not_reparameterised": (
            "差分注意力的 λ 没有重新参数化",
            "λ 被当作原始参数使用：停在 λ_init、漏掉 λ_init，或者少了指数。论文的写法是 "
            "λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init。"
            "修正：用四个向量经过 exp 再加上 λ_init。",
        ),
        "diff_lambda_init_from_one": (
            "λ_init 的层号从 1 开始数",
            "用了 λ_init = 0.8 − 0.6·exp(−0.3·(depth − 1))；参考代码的 lambda_init_fn(depth) "
            "中层号从 0 开始。修正：λ_init = 0.8 − 0.6·exp(−0.3·depth)，它同时影响 λ 和 "
            "(1 − λ_init) 缩放。",
        ),
        "diff_norm_missing": (
            "少了每个头的 RMSNorm（subln）",
            "差分图的每行之和是 1 − λ 而不是 1，所以参考代码在 (1 − λ_init) 缩放之前对每个头的"
            "输出各自做 RMSNorm。"
            "修正：diff_norm = norm ⊙ x / √(mean(x²) + eps)，按每个头的 d_v 计算。",
        ),
        "diff_scale_missing": (
            "少了 (1 − λ_init) 缩放",
            "参考代码在 RMSNorm 之后把每个头的输出乘以 (1 − λ_init)，使梯度像普通 Transformer "
            "一样流动。修正：diff_scaled = diff_norm × (1 − λ_init)。",
        ),
    }
)
