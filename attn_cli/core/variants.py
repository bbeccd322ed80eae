"""Positions and layouts the variants share: token positions, which dimensions RoPE pairs, the
Meta <-> HF column permutation, the causal and window rules as whole (T, S) arrays.

Pure NumPy, no I/O. Each function states the convention it follows, because the conventions
are what people trip on. The math of each variant lives in its plug-in (core/plugins/).

Axis names used in every shape comment:
    T    query positions     S    key positions     D    d_k per head
    R    rotary dims (``dims`` <= D, even)          P    R/2 rotary pairs
    W    a projection's output columns (heads*D)    ...  any leading axes (batch, heads)

Conventions and the reference each follows:
    positions      keys 0..S-1; queries 0..T-1, or with lower-right causal the last T key
                   positions (S-T+i), as in KV-cache decoding (torch's bottom-right causal).
    RoPE pairs     ``half`` pairs dimension i with i + R/2: HF ``rotate_half``, GPT-NeoX.
                   ``interleaved`` pairs 2i with 2i+1: GPT-J, Meta llama ``view_as_complex``.
    Meta <-> HF    HF's ``convert_llama_weights_to_hf`` ``permute``: per head, columns
                   [0, 2, 4, ..., 1, 3, 5, ...] of the interleaved layout become the half layout.
    window         0 <= pos_q - pos_k < window: at most ``window`` keys, the query's own included
                   (HF/Mistral ``sliding_window``, gpt-oss); FlashAttention's
                   ``window_size=(window-1, 0)``.
"""

from __future__ import annotations

from typing import Any, Literal

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
# RoPE layouts


def rope_pairs(dims: int, layout: RopeLayout = "half") -> tuple[IntArray, IntArray]:
    """Which dimensions rotate together: pair i is (first[i], second[i])."""
    check_rope_dims(dims)
    if layout == "half":  # i with i + dims/2 (rotate_half)
        first = np.arange(dims // 2, dtype=np.int64)
        return first, first + dims // 2
    if layout == "interleaved":  # 2i with 2i+1 (view_as_complex)
        first = np.arange(0, dims, 2, dtype=np.int64)
        return first, first + 1
    raise ValueError(f"RoPE layout must be one of {ROPE_LAYOUTS}, not {layout!r}")


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


def check_rope_dims(dims: int) -> None:
    """RoPE rotates pairs: ``dims`` is a positive even number."""
    if dims < 2 or dims % 2:
        raise ValueError(f"RoPE dims must be a positive even number, not {dims}")


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
