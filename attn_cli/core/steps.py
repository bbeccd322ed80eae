"""One small pure function per step of attention, named after the math; NumPy only.

Axis names used in every shape comment:
    B  batch            H    query heads        Hkv  key/value heads (grouped-query)
    T  query positions  S    key positions      C    d_model
    D  d_k per head     Dv   d_v per head       E    d_out (columns of W_O)
    R  the query rows of one block (a slice of T)

Semantics follow torch.nn.functional.scaled_dot_product_attention: scores are scaled by
``scale`` (default 1/sqrt(d_k)), a boolean mask is True where a query *may* attend, a float
bias is added after scaling, and a row with nothing to attend to gets all-zero weights. The
variants slot in as the one chain (core/chain.py) runs them, as HF transformers places them:
the Q/K transforms (QK-norm, then RoPE) on Q and K, score modifiers on the scaled scores before
the mask, biases added with the fixture's, extra logits joined to the softmax.

:func:`attention` is the whole computation on whole arrays, written to be read; the block
engine (engine.py) runs the same steps a block of query rows at a time to save memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli.core.chain import Chain, cells_of

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]


def project(X: FloatArray, W: FloatArray, b: FloatArray | None) -> FloatArray:
    """X @ W + b, the article's convention (a torch Linear weight is W transposed)."""
    out = X @ W  # (B, T, C) @ (C, H*D) -> (B, T, H*D)
    if b is not None:
        out += b
    return out


def repeat_kv(x: FloatArray, groups: int) -> FloatArray:
    """Query head h reads key/value head h // groups, as torch's repeat_interleave."""
    return x if groups == 1 else np.repeat(x, groups, axis=1)  # (B, Hkv, S, D) -> (B, H, S, D)


def attention_scores(q: FloatArray, k: FloatArray, out: FloatArray | None = None) -> FloatArray:
    """scores = Q Kᵀ for every head (or for one head's block of queries)."""
    scores: FloatArray = np.matmul(q, k.swapaxes(-1, -2), out=out)  # (.., T, D) @ (.., D, S)
    return scores


def scale_scores(scores: FloatArray, scale: float, out: FloatArray | None = None) -> FloatArray:
    """scaled = scores × scale."""
    scaled: FloatArray = np.multiply(scores, scale, out=out)
    return scaled


def apply_mask(
    scaled: FloatArray,
    allowed: BoolArray | None,
    bias: FloatArray | None,
    out: FloatArray | None = None,
    *,
    fill: float = -np.inf,
) -> FloatArray:
    """masked = scaled + bias, with ``fill`` (-inf, or a finite sentinel) wherever attending
    is not allowed."""
    if bias is not None:
        masked: FloatArray = np.add(scaled, bias, out=out)
    elif out is None:
        masked = scaled.copy()
    else:
        masked = out
        if out is not scaled:
            np.copyto(out, scaled)
    if allowed is not None:
        np.copyto(masked, fill, where=~allowed)
    return masked


def softmax(x: FloatArray, out: FloatArray | None = None) -> FloatArray:
    """Softmax over keys after subtracting the row maximum; a row of -inf gives zeros.

    ``out`` may be ``x`` itself: the exponentials and the division then happen in place.
    """
    return softmax_rows(x, out)[0]


def softmax_rows(
    x: FloatArray,
    out: FloatArray | None,
    sink: float | FloatArray | None = None,
    lse: FloatArray | None = None,
) -> tuple[FloatArray, BoolArray]:
    """The softmax and which rows had no key allowed (all -inf): those get all-zero weights.

    ``sink`` (gpt-oss; a number, or one per row broadcasting to (..., T, 1)) joins every row
    as one more logit and is dropped after the softmax, so the kept weights sum to less than 1.
    ``lse`` (..., T), when given, receives each row's log-sum-exp, the sink included:
    softmax = exp(x - lse).
    """
    row_max = x.max(axis=-1, keepdims=True)  # (..., T, 1)
    empty = row_max == -np.inf  # as np.isneginf, without its Python wrapper (a decode step's)
    if sink is not None:
        np.maximum(row_max, sink, out=row_max)
    none = row_max == -np.inf if sink is not None else empty  # nothing to exponentiate
    row_max[none] = 0.0  # exp(-inf - 0) = 0 across the row
    weights: FloatArray = np.subtract(x, row_max, out=out)
    np.exp(weights, out=weights)
    total = weights.sum(axis=-1, keepdims=True)  # (..., T, 1)
    if sink is not None:
        total += np.exp(sink - row_max)
    if lse is not None:
        np.copyto(
            lse, np.where(none, -np.inf, row_max + np.log(np.where(none, 1.0, total)))[..., 0]
        )
    total[none] = 1.0  # 0 / 1, not 0 / 0
    np.divide(weights, total, out=weights)
    return weights, empty[..., 0]


def weighted_sum(weights: FloatArray, v: FloatArray, out: FloatArray | None = None) -> FloatArray:
    """output = softmax · V."""
    output: FloatArray = np.matmul(weights, v, out=out)  # (.., T, S) @ (.., S, Dv)
    return output


def attention(
    q: FloatArray,  # (B, H, T, D)
    k: FloatArray,  # (B, Hkv, S, D)
    v: FloatArray,  # (B, Hkv, S, Dv)
    allowed: BoolArray | None = None,  # broadcasts to (B, H, T, S); True = may attend
    bias: FloatArray | None = None,  # broadcasts to (B, H, T, S)
    scale: float | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Scaled dot-product attention on whole arrays: ``(output, weights)``, the reference."""
    groups = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # (B, H, S, D), (B, H, S, Dv)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    # 1) scores, 2) scaled, 3) masked, 4) softmax, 5) the weighted sum of values
    att = scale_scores(attention_scores(q, k), float(scale))  # (B, H, T, S)
    if allowed is not None or bias is not None:
        att = apply_mask(att, allowed, bias)
    att = softmax(att)
    return weighted_sum(att, v), att  # (B, H, T, Dv), (B, H, T, S)


def allowed_positions(
    inputs: Inputs, block: tuple[int, int, int, int] | None = None
) -> BoolArray | None:
    """Where a query may attend (True), as the chain's rules say (causal, window, mask,
    lengths); None when all may.

    The whole (B, H, T, S) array, or for ``block`` = (b, h, t0, t1) the query rows t0:t1 of
    head h in batch item b, as an array that broadcasts to (R, S).
    """
    if block is None:
        cells = cells_of(inputs, slice(None), slice(None), slice(None))
        allowed = Chain(inputs).allowed(cells)
        return None if allowed is None else np.broadcast_to(allowed, cells.shape).copy()
    b, h, t0, t1 = block
    cells = cells_of(inputs, slice(b, b + 1), slice(h, h + 1), slice(t0, t1))
    allowed = Chain(inputs).allowed(cells)
    return None if allowed is None else np.broadcast_to(allowed, cells.shape)[0, 0]
