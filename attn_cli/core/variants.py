"""The math of modern attention variants: RoPE, ALiBi, sliding window, softcap, sinks, QK-norm.

Pure NumPy, no I/O. Each function is one step, named after the math, and states the convention
it follows, because the conventions are what people trip on.

Axis names used in every shape comment:
    H    query heads        T    query positions     S    key positions
    D    d_k per head       R    rotary dims (``dims`` <= D, even)     P    R/2 rotary pairs
    W    a projection's output columns (heads*D)      ...  any leading axes (batch, heads)

Conventions and the reference each follows:
    positions      keys 0..S-1; queries 0..T-1, or with lower-right causal the last T key
                   positions (S-T+i), as in KV-cache decoding (torch's bottom-right causal).
    RoPE           inv_freq[i] = base^(-2i/R), angle = position * inv_freq[i] (HF
                   ``_compute_default_rope_parameters``, Meta ``precompute_freqs_cis``).
                   ``half`` pairs dimension i with i + R/2: HF ``rotate_half``, GPT-NeoX.
                   ``interleaved`` pairs 2i with 2i+1: GPT-J, Meta llama ``view_as_complex``.
                   Partial rotary (R < D): the first R dimensions rotate, the rest pass through
                   (GPT-NeoX ``rotary_pct``, Phi ``partial_rotary_factor``).
                   Angles are float64 here; HF computes them in float32 (differences ~1e-7).
    Meta <-> HF    HF's ``convert_llama_weights_to_hf`` ``permute``: per head, columns
                   [0, 2, 4, ..., 1, 3, 5, ...] of the interleaved layout become the half layout.
    ALiBi          slopes as Press et al.'s reference ``get_slopes``; bias -slope_h*|pos_q - pos_k|
                   (the paper's symmetric form; BLOOM's slope*pos_k differs by a per-row constant).
    window         0 <= pos_q - pos_k < window: at most ``window`` keys, the query's own included
                   (HF/Mistral ``sliding_window``, gpt-oss); FlashAttention's
                   ``window_size=(window-1, 0)``.
    softcap        cap * tanh(x / cap), applied to the scaled scores before the mask (Gemma 2
                   ``attn_logit_softcapping``).
    sinks          one logit per head joined to every row for the softmax and dropped after it
                   (gpt-oss ``sdpa``, HF ``GptOssAttention``); kept weights sum to 1 - dropped.
    RMSNorm        x * rsqrt(mean(x^2) + eps) * weight over the last axis (HF ``Qwen3RMSNorm``);
                   Gemma scales by (1 + weight) (``plus_one=True``).
    mask sentinel  -inf by default; finite sentinels (-1e9, -1e4, finfo.min) as real code uses,
                   with ``sentinel_leak`` to show the weight they let through.
"""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import numpy as np

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]
RopeLayout = Literal["half", "interleaved"]
ROPE_LAYOUTS: tuple[RopeLayout, ...] = ("half", "interleaved")


# ---------------------------------------------------------------------------------------------
# Positions


def default_positions(
    seq_q: int, seq_k: int, causal: str | None = None
) -> tuple[IntArray, IntArray]:
    """Token positions (pos_q (T,), pos_k (S,)): lower-right causal puts queries at S-T+i."""
    pos_k = np.arange(seq_k, dtype=np.int64)  # (S,)
    offset = seq_k - seq_q if causal == "lower-right" else 0
    pos_q = np.arange(seq_q, dtype=np.int64) + offset  # (T,)
    return pos_q, pos_k


# ---------------------------------------------------------------------------------------------
# Rotary position embedding (RoPE)


def rope_inv_freq(dims: int, base: float = 10000.0) -> FloatArray:
    """inv_freq[i] = base^(-2i/dims) for i < dims/2, as HF: 1 / base^(arange(0, dims, 2)/dims)."""
    _check_rope_dims(dims)
    inv_freq: FloatArray = 1.0 / base ** (np.arange(0, dims, 2, dtype=np.float64) / dims)  # (P,)
    return inv_freq


def rope_angles(positions: Any, dims: int, base: float = 10000.0) -> FloatArray:
    """angle[t, i] = position[t] * inv_freq[i]."""
    pos = np.asarray(positions, dtype=np.float64)  # (T,)
    angles: FloatArray = np.outer(pos, rope_inv_freq(dims, base))  # (T, P)
    return angles


def rope_pairs(dims: int, layout: RopeLayout = "half") -> tuple[IntArray, IntArray]:
    """Which dimensions rotate together: pair i is (first[i], second[i])."""
    _check_rope_dims(dims)
    if layout == "half":  # i with i + dims/2 (rotate_half)
        first = np.arange(dims // 2, dtype=np.int64)
        return first, first + dims // 2
    if layout == "interleaved":  # 2i with 2i+1 (view_as_complex)
        first = np.arange(0, dims, 2, dtype=np.int64)
        return first, first + 1
    raise ValueError(f"RoPE layout must be one of {ROPE_LAYOUTS}, not {layout!r}")


def apply_rope(
    x: FloatArray,
    positions: Any,
    *,
    base: float = 10000.0,
    layout: RopeLayout = "half",
    dims: int | None = None,
    inverse: bool = False,
) -> FloatArray:
    """Rotate each pair (a, b) of x (..., T, D) by its angle: (a cos - b sin, b cos + a sin).

    ``inverse`` rotates by -angle (undoes the rotation; the backward pass needs it).
    """
    D = x.shape[-1]
    R = D if dims is None else dims
    if not 0 < R <= D:
        raise ValueError(f"RoPE dims must be in 1..{D} (d_k), not {R}")
    pos = np.asarray(positions)
    if pos.shape != (x.shape[-2],):
        raise ValueError(f"positions must have shape ({x.shape[-2]},), not {pos.shape}")
    first, second = rope_pairs(R, layout)
    angles = rope_angles(pos, R, base)  # (T, P)
    cos = np.cos(angles).astype(x.dtype, copy=False)  # (T, P)
    sin = np.sin(angles).astype(x.dtype, copy=False)  # (T, P)
    if inverse:
        sin = -sin
    a = x[..., first]  # (..., T, P)
    b = x[..., second]  # (..., T, P)
    out: FloatArray = x.copy()  # dimensions R..D-1 pass through (partial rotary)
    out[..., first] = a * cos - b * sin
    out[..., second] = b * cos + a * sin
    return out


def interleaved_to_half_permutation(d: int, dims: int | None = None) -> IntArray:
    """Column r of one head in half layout is column perm[r] in interleaved layout.

    HF's ``permute`` in convert_llama_weights_to_hf: [0, 2, 4, ..., 1, 3, 5, ...]; with
    partial rotary only the first ``dims`` columns move.
    """
    R = d if dims is None else dims
    if not 0 < R <= d:
        raise ValueError(f"RoPE dims must be in 1..{d} (d_k), not {R}")
    first, second = rope_pairs(R, "interleaved")
    rest = np.arange(R, d, dtype=np.int64)
    return np.concatenate([first, second, rest])  # (D,)


def interleaved_to_half_columns(
    W: FloatArray, heads: int, *, dims: int | None = None, inverse: bool = False
) -> FloatArray:
    """Permute a projection's columns (last axis, heads*d) head by head from Meta to HF layout.

    Works for W_Q/W_K [d_model, heads*d] (the article's X @ W) and for biases [heads*d];
    ``inverse`` goes from HF (half) back to Meta (interleaved).
    """
    width = W.shape[-1]
    if heads < 1 or width % heads:
        raise ValueError(f"{width} columns do not split into {heads} heads")
    d = width // heads
    perm = interleaved_to_half_permutation(d, dims)  # (D,)
    if inverse:
        perm = np.argsort(perm)
    cols = (np.arange(heads)[:, None] * d + perm[None, :]).reshape(-1)  # (heads*D,)
    out: FloatArray = W[..., cols]  # (..., W)
    return out


def _check_rope_dims(dims: int) -> None:
    if dims < 2 or dims % 2:
        raise ValueError(f"RoPE dims must be a positive even number, not {dims}")


# ---------------------------------------------------------------------------------------------
# ALiBi


def alibi_slopes(n_heads: int) -> FloatArray:
    """Press et al.'s ``get_slopes``: 2^(-8/n)^(1..n), else the closest power of two plus
    every other slope of twice that."""
    if n_heads < 1:
        raise ValueError(f"ALiBi needs at least one head, not {n_heads}")
    return np.array(_get_slopes(n_heads), dtype=np.float64)  # (H,)


def _get_slopes(n: int) -> list[float]:
    """The reference code of "Train Short, Test Long" (ofirpress/attention_with_linear_biases)."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + _get_slopes(2 * closest)[0::2][: n - closest]


def alibi_bias(slopes: Any, pos_q: Any, pos_k: Any) -> FloatArray:
    """bias[h, t, s] = -slope_h * |pos_q[t] - pos_k[s]| (the paper's symmetric distance)."""
    m = np.asarray(slopes, dtype=np.float64)  # (H,)
    dist = np.abs(np.subtract.outer(np.asarray(pos_q), np.asarray(pos_k)))  # (T, S)
    bias: FloatArray = -m[:, None, None] * dist[None, :, :]  # (H, T, S)
    return bias


# ---------------------------------------------------------------------------------------------
# Which keys a query may see (True = may attend, torch SDPA polarity)


def causal_allowed(pos_q: Any, pos_k: Any) -> BoolArray:
    """allowed[t, s] = pos_k[s] <= pos_q[t]."""
    allowed: BoolArray = np.asarray(pos_k)[None, :] <= np.asarray(pos_q)[:, None]  # (T, S)
    return allowed


def window_allowed(pos_q: Any, pos_k: Any, window: int) -> BoolArray:
    """allowed[t, s] = 0 <= pos_q[t] - pos_k[s] < window: at most ``window`` keys, itself too."""
    if window < 1:
        raise ValueError(f"window must be a whole number >= 1, not {window}")
    behind = np.subtract.outer(np.asarray(pos_q), np.asarray(pos_k))  # (T, S)
    allowed: BoolArray = (behind >= 0) & (behind < window)
    return allowed


# ---------------------------------------------------------------------------------------------
# Scores and softmax


def softcap(x: FloatArray, cap: float) -> FloatArray:
    """capped = cap * tanh(x / cap): squashes scores into (-cap, cap); apply before the mask."""
    if not cap > 0:
        raise ValueError(f"softcap must be a number > 0, not {cap}")
    capped: FloatArray = cap * np.tanh(x / cap)
    return capped


def fill_not_allowed(x: FloatArray, allowed: Any, mask_value: float = -math.inf) -> FloatArray:
    """x where allowed, else ``mask_value`` (-inf, or a finite sentinel as real code uses)."""
    filled: FloatArray = np.where(allowed, x, np.asarray(mask_value, dtype=x.dtype))
    return filled


def sentinel_leak(weights: FloatArray, allowed: Any) -> FloatArray:
    """Weight mass per row (..., T) that went to keys that were not allowed."""
    leak: FloatArray = np.where(allowed, 0.0, weights).sum(axis=-1)  # (..., T)
    return leak


class SinkSoftmax(NamedTuple):
    """The kept weights (..., H, T, S) and the mass each row gave to its sink (..., H, T)."""

    weights: FloatArray
    dropped: FloatArray


def softmax_with_sinks(x: FloatArray, sinks: Any = None) -> SinkSoftmax:
    """Softmax over [x row, sink_h] with the row max subtracted, then the sink column dropped.

    x is (..., H, T, S) and sinks (H,) or None. A row with no allowed key (all -inf) puts all
    its mass on the sink, or without a sink gets all-zero weights (never NaN).
    """
    row_max = x.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., H, T, 1)
    sink = None
    if sinks is not None:
        s = np.asarray(sinks, dtype=x.dtype)
        if s.shape != (x.shape[-3],):
            raise ValueError(f"sinks must have one logit per head ({x.shape[-3]}), not {s.shape}")
        sink = np.broadcast_to(s[:, None, None], row_max.shape)  # (..., H, T, 1)
        row_max = np.maximum(row_max, sink)
    empty = np.isneginf(row_max)
    row_max[empty] = 0.0  # exp(-inf - 0) = 0 across the row, not exp(nan)
    weights: FloatArray = np.exp(x - row_max)  # (..., H, T, S)
    total = weights.sum(axis=-1, keepdims=True)  # (..., H, T, 1)
    dropped = np.zeros_like(total) if sink is None else np.exp(sink - row_max)
    total = total + dropped
    total[empty] = 1.0  # 0 / 1, not 0 / 0
    weights /= total
    return SinkSoftmax(weights, (dropped / total)[..., 0])  # (..., H, T, S), (..., H, T)


# ---------------------------------------------------------------------------------------------
# QK-norm


def rms_norm(
    x: FloatArray, weight: Any, eps: float = 1e-6, *, plus_one: bool = False
) -> FloatArray:
    """x * rsqrt(mean(x^2) + eps) * weight over the last axis, as HF Qwen3RMSNorm.

    Computed in at least float32 and returned in x's dtype; ``plus_one`` scales by
    (1 + weight) as Gemma's RMSNorm does.
    """
    xf = x.astype(np.promote_types(x.dtype, np.float32), copy=False)
    variance = np.mean(xf * xf, axis=-1, keepdims=True)  # (..., 1)
    normed = (xf * (1.0 / np.sqrt(variance + eps))).astype(x.dtype, copy=False)  # rsqrt
    w = np.asarray(weight, dtype=x.dtype)  # (D,) or (heads*D,)
    if w.shape != x.shape[-1:]:
        raise ValueError(f"RMSNorm weight must have length {x.shape[-1]}, not {w.shape}")
    scaled: FloatArray = normed * (1 + w if plus_one else w)
    return scaled
