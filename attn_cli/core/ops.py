"""The elementwise and row-wise math every part of attn shares, written once (NumPy only):
the logistic sigmoid, SiLU and RMSNorm (with its gradient). Each keeps its input's dtype, so a
float32 trace computes in float32 as the reference implementations do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FloatArray = np.ndarray[Any, np.dtype[np.float64]]


def sigmoid(x: FloatArray) -> FloatArray:
    """σ(x) = 1 / (1 + e^(−x)), without overflow: e^(−|x|) only."""
    e = np.exp(-np.abs(x))
    out: FloatArray = np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)
    return out


def silu(x: FloatArray) -> FloatArray:
    """x·σ(x), without overflow."""
    out: FloatArray = (x * sigmoid(x)).astype(x.dtype, copy=False)
    return out


def rms_norm(
    x: FloatArray,
    weight: Any,
    eps: float = 1e-6,
    *,
    plus_one: bool = False,
    divide: bool = False,
    times: FloatArray | None = None,
) -> FloatArray:
    """x * rsqrt(mean(x^2) + eps) * weight over the last axis, as HF Qwen3RMSNorm.

    Computed in at least float32 and returned in x's dtype; ``plus_one`` scales by
    (1 + weight) as Gemma's RMSNorm does. ``divide``: weight · x / √(mean(x²) + eps) in x's
    own dtype, as the papers' reference code divides (DeepseekV3RMSNorm, the Differential
    Transformer's subln; ``weight`` None: none), times ``times`` (Qwen3NextRMSNormGated's
    SiLU(z)), and inf where mean(x²) overflows (the stage's check names it) rather than the 0
    that x / inf would give.
    """
    if divide:
        r = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)  # (..., 1)
        y = x / r if weight is None else weight * (x / r)
        y = y if times is None else y * times
        out: FloatArray = np.where(np.isfinite(r), y, np.inf).astype(x.dtype, copy=False)
        return out
    xf = x.astype(np.promote_types(x.dtype, np.float32), copy=False)
    variance = np.mean(xf * xf, axis=-1, keepdims=True)  # (..., 1)
    normed = (xf * (1.0 / np.sqrt(variance + eps))).astype(x.dtype, copy=False)  # rsqrt
    w = np.asarray(weight, dtype=x.dtype)  # (D,) or (heads*D,)
    if w.shape != x.shape[-1:]:
        raise ValueError(f"RMSNorm weight must have length {x.shape[-1]}, not {w.shape}")
    scaled: FloatArray = normed * (1 + w if plus_one else w)
    return scaled


def grad_rms_norm(d_y: FloatArray, x: FloatArray, weight: FloatArray, eps: float) -> FloatArray:
    """y = w ∘ x / r, r = √(mean(x²) + eps) over the last axis  =>
    d_x = (w ∘ d_y − x̂ · mean(x̂ ∘ w ∘ d_y)) / r, with x̂ = x / r."""
    r = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)  # (..., 1)
    x_hat = x / r
    g = d_y * weight  # (..., n)
    d_x: FloatArray = (g - x_hat * np.mean(g * x_hat, axis=-1, keepdims=True)) / r
    return d_x
