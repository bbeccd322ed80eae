"""The elementwise and row-wise math every part of attn shares, written once (NumPy only):
the logistic sigmoid, SiLU, RMSNorm and LayerNorm (each with its gradient). Each keeps its input's
dtype, so a float32 trace computes in float32 as the reference implementations do.
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
    safe: bool = False,
) -> FloatArray:
    """x * rsqrt(mean(x^2) + eps) * weight over the last axis, as HF Qwen3RMSNorm.

    Computed in at least float32 and returned in x's dtype; ``plus_one`` scales by
    (1 + weight) as Gemma's RMSNorm does. ``divide``: weight · x / √(mean(x²) + eps) in x's
    own dtype, as the papers' reference code divides (DeepseekV3RMSNorm, the Differential
    Transformer's subln; ``weight`` None: none), times ``times`` (Qwen3NextRMSNormGated's
    SiLU(z)), and inf where mean(x²) overflows (the stage's check names it) rather than the 0
    that x / inf would give. ``safe``: in float64 and overflow-safe (rows of 1e200 or 1e-200
    normalise as rows of 1 would; see :func:`_inverse_root`), ``weight`` None for 1.
    """
    if divide:
        r = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)  # (..., 1)
        y = x / r if weight is None else weight * (x / r)
        y = y if times is None else y * times
        out: FloatArray = np.where(np.isfinite(r), y, np.inf).astype(x.dtype, copy=False)
        return out
    if safe:
        x64 = x.astype(np.float64)
        w = np.float64(1.0) if weight is None else np.asarray(weight).astype(np.float64)
        s = _row_scale(x64)  # (..., 1)
        xs = x64 / s  # (..., C), every |value| < 1
        mean_square = (xs * xs).mean(axis=-1, keepdims=True)  # (..., 1)
        safe_out: FloatArray = xs * _inverse_root(mean_square, s, eps)
        return safe_out * (1.0 + w if plus_one else w)
    xf = x.astype(np.promote_types(x.dtype, np.float32), copy=False)
    variance = np.mean(xf * xf, axis=-1, keepdims=True)  # (..., 1)
    normed = (xf * (1.0 / np.sqrt(variance + eps))).astype(x.dtype, copy=False)  # rsqrt
    w = np.asarray(weight, dtype=x.dtype)  # (D,) or (heads*D,)
    if w.shape != x.shape[-1:]:
        raise ValueError(f"RMSNorm weight must have length {x.shape[-1]}, not {w.shape}")
    scaled: FloatArray = normed * (1 + w if plus_one else w)
    return scaled


def layer_norm(x: FloatArray, weight: Any, bias: Any, eps: float) -> FloatArray:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis (torch's LayerNorm: the
    biased variance), in float64 and overflow-safe as ``rms_norm(..., safe=True)``; ``weight``
    and ``bias`` None for 1 and 0 (OLMo's LayerNorm without parameters)."""
    x64 = x.astype(np.float64)
    w = np.float64(1.0) if weight is None else np.asarray(weight).astype(np.float64)
    s = _row_scale(x64)  # (..., 1)
    xs = x64 / s  # (..., C), every |value| < 1
    centred = xs - xs.mean(axis=-1, keepdims=True)  # (..., C)
    var = (centred * centred).mean(axis=-1, keepdims=True)  # biased, as torch's LayerNorm
    b = 0.0 if bias is None else np.asarray(bias).astype(np.float64)
    out: FloatArray = centred * _inverse_root(var, s, eps) * w + b
    return out


def _row_scale(x: FloatArray) -> FloatArray:
    """Per row, the power of two just above its largest magnitude (1 for a row of zeros); at
    most 2**1023, the largest float64 power of two (a row above it scales to below 2)."""
    top = np.abs(x).max(axis=-1, keepdims=True)  # (..., 1)
    _, exponent = np.frexp(top)  # top = m * 2**exponent, 0.5 <= m < 1
    scale: FloatArray = np.ldexp(1.0, np.minimum(exponent, 1023))
    return np.where(top > 0, scale, 1.0)


def _inverse_root(mean: FloatArray, s: FloatArray, eps: float) -> FloatArray:
    """s / sqrt(mean * s^2 + eps), the factor of the scaled row, with no overflow.

    With k = max(s, 1) it is (s/k) / sqrt(mean (s/k)^2 + eps / k^2): for s <= 1 every term is
    at most 1 (an underflow only drops what eps outweighs), for s > 1 the eps term is at most eps.
    """
    k = np.maximum(s, 1.0)
    r = s / k  # (..., 1), at most 1
    out: FloatArray = r / np.sqrt(mean * r * r + eps / k / k)
    return out


def grad_rms_norm(d_y: FloatArray, x: FloatArray, weight: FloatArray, eps: float) -> FloatArray:
    """y = w ∘ x / r, r = √(mean(x²) + eps) over the last axis  =>
    d_x = (w ∘ d_y − x̂ · mean(x̂ ∘ w ∘ d_y)) / r, with x̂ = x / r."""
    r = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)  # (..., 1)
    x_hat = x / r
    g = d_y * weight  # (..., n)
    d_x: FloatArray = (g - x_hat * np.mean(g * x_hat, axis=-1, keepdims=True)) / r
    return d_x


def grad_layer_norm(d_y: FloatArray, x: FloatArray, weight: Any, eps: float) -> FloatArray:
    """y = w ∘ x̂ + b, x̂ = (x − mean(x)) / σ, σ = √(var(x) + eps) over the last axis  =>
    d_x = (g − mean(g) − x̂ · mean(g ∘ x̂)) / σ, with g = w ∘ d_y (``weight`` None: 1)."""
    centred = x - x.mean(axis=-1, keepdims=True)  # (..., n)
    sigma = np.sqrt(np.mean(centred * centred, axis=-1, keepdims=True) + eps)  # (..., 1)
    x_hat = centred / sigma
    g = d_y if weight is None else d_y * weight  # (..., n)
    mean_g = np.mean(g, axis=-1, keepdims=True)
    d_x: FloatArray = (g - mean_g - x_hat * np.mean(g * x_hat, axis=-1, keepdims=True)) / sigma
    return d_x
