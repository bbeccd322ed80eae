"""FlashAttention-2's forward pass tile by tile, and the log-sum-exp it keeps instead of weights.

Axis names as in the pipeline: B batch, H query heads, Hkv key/value heads, T queries, S keys,
D d_k, Dv d_v; a tile is ``bq`` query rows (t0:t1) by ``bk`` keys (s0:s1) of one (b, h).

Per (batch, head, query block) the key blocks are visited in order, keeping a running row max
m, a running sum l and an unnormalised output acc (Dao, "FlashAttention-2", Algorithm 1)::

    S = capped + bias (-inf where not allowed)        m_new = max(m, rowmax(S))
    alpha = exp(m - m_new)    P = exp(S - m_new)      l = alpha * l + rowsum(P)
    acc = alpha * acc + P @ V                        finally O = acc / l, L = m + log(l)

where capped = softcap·tanh(scaled/softcap) with a softcap (Gemma 2), else scaled; so
weights = exp(masked - L) is never stored. ``base2`` computes as Triton's fused-attention
tutorial: scores times scale * log2(e), exp2, and L in base 2 (L_2 = L / ln 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from attn_cli.core.steps import cap_scores

FloatArray = np.ndarray[Any, np.dtype[np.floating[Any]]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]

# log2(e): Triton writes 1.44269504, which is this number rounded to float32 (and to 9 digits);
# the full float64 value keeps base 2 and base e equal to rounding in float64 too.
LOG2E = 1.0 / math.log(2.0)


def lse(masked: FloatArray, sinks: FloatArray | None = None) -> FloatArray:
    """Log-sum-exp over keys (last axis): (..., T, S) -> (..., T); a row of -inf gives -inf.

    ``sinks`` (one logit per query head, the axis before T) join each row's sum, as gpt-oss.
    """
    m = masked.max(axis=-1)  # (..., T)
    if sinks is not None:
        sink = np.asarray(sinks, dtype=masked.dtype)[:, None]  # (H, 1) broadcasts to (..., H, T)
        m = np.maximum(m, sink)
    empty = np.isneginf(m)
    m_safe = np.where(empty, 0.0, m)  # exp(-inf - 0) = 0, never -inf - -inf
    total = np.exp(masked - m_safe[..., None]).sum(axis=-1)  # (..., T)
    if sinks is not None:
        total = total + np.exp(sink - m_safe)
    out: FloatArray = np.where(empty, -np.inf, m_safe + np.log(np.where(empty, 1.0, total)))
    return out.astype(masked.dtype, copy=False)


@dataclass(frozen=True, eq=False)
class Tile:
    """One tile of the loop and the running values after it (None where a skipped tile has none).

    ``S``, ``P`` are (bq, bk); ``m``, ``alpha``, ``l`` are (bq,); ``acc`` is (bq, Dv).
    """

    batch: int
    head: int
    q_block: tuple[int, int]
    k_block: tuple[int, int]
    skipped: bool
    S: FloatArray | None
    m: FloatArray
    alpha: FloatArray | None
    P: FloatArray | None
    l: FloatArray  # noqa: E741 (the paper's name)
    acc: FloatArray


@dataclass(frozen=True, eq=False)
class FlashResult:
    """O (B, H, T, Dv), L (B, H, T) (base 2 when ``base2``) and the tiles in the order visited."""

    output: FloatArray
    lse: FloatArray
    tiles: tuple[Tile, ...]
    block_q: int
    block_k: int
    base2: bool


@dataclass(frozen=True)
class _Bugs:
    """Mistakes a hand-written kernel makes, for the grader to recompute (all off: correct)."""

    acc_not_rescaled: bool = False
    sum_not_rescaled: bool = False
    lse_without_max: bool = False
    extra_skip: bool = False  # one diagonal tile too many skipped per query block


@dataclass(frozen=True, eq=False)
class _Setup:
    scale: float
    allowed: BoolArray | None  # (B, H, T, S) view, True where a query may attend
    bias: FloatArray | None  # (B, H, T, S) view
    causal_offset: int | None
    base2: bool
    sinks: FloatArray | None  # (H,)
    softcap: float | None
    record: bool


def flash_forward(
    q: FloatArray,  # (B, H, T, D)
    k: FloatArray,  # (B, Hkv, S, D)
    v: FloatArray,  # (B, Hkv, S, Dv)
    *,
    scale: float,
    allowed: BoolArray | None = None,
    bias: FloatArray | None = None,
    block_q: int,
    block_k: int,
    causal_offset: int | None = None,
    base2: bool = False,
    sinks: FloatArray | None = None,
    softcap: float | None = None,
    record_tiles: bool = True,
) -> FlashResult:
    """The FlashAttention-2 forward; ``causal_offset`` o allows key j <= query i + o and skips
    tiles wholly above that diagonal (0 upper-left, S - T lower-right)."""
    return _forward(q, k, v, scale, allowed, bias, block_q, block_k, causal_offset, base2, sinks,
                    record_tiles, _Bugs(), softcap)  # fmt: skip


def _forward(
    q: FloatArray,
    k: FloatArray,
    v: FloatArray,
    scale: float,
    allowed: BoolArray | None,
    bias: FloatArray | None,
    block_q: int,
    block_k: int,
    causal_offset: int | None,
    base2: bool,
    sinks: FloatArray | None,
    record: bool,
    bugs: _Bugs,
    softcap: float | None = None,
) -> FlashResult:
    """The loop over (batch, head, query block); each block runs over its key blocks."""
    B, H, T, _ = q.shape
    _, Hkv, S, Dv = v.shape
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be >= 1, not {block_q}, {block_k}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be > 0, not {softcap}")
    if H % Hkv or k.shape[:3] != (B, Hkv, S):
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape} do not fit together")
    full = (B, H, T, S)
    setup = _Setup(
        scale=scale,
        allowed=None if allowed is None else np.broadcast_to(allowed, full),
        bias=None if bias is None else np.broadcast_to(bias, full),
        causal_offset=causal_offset,
        base2=base2,
        sinks=None if sinks is None else np.asarray(sinks, dtype=q.dtype).reshape(H),
        softcap=softcap,
        record=record,
    )
    groups = H // Hkv  # query head h reads key/value head h // groups
    output = np.zeros((B, H, T, Dv), q.dtype)
    L = np.empty((B, H, T), q.dtype)
    tiles: list[Tile] = []
    for b in range(B):
        for h in range(H):
            for t0 in range(0, T, block_q):
                t1 = min(T, t0 + block_q)
                kv = (k[b, h // groups], v[b, h // groups])  # (S, D), (S, Dv)
                o, L_row, row_tiles = _query_block(q[b, h, t0:t1], kv, (b, h, t0, t1), block_k,
                                                   setup, bugs)  # fmt: skip
                output[b, h, t0:t1], L[b, h, t0:t1] = o, L_row
                tiles.extend(row_tiles)
    return FlashResult(output, L, tuple(tiles), block_q, block_k, base2)


def _query_block(
    q: FloatArray,  # (bq, D)
    kv: tuple[FloatArray, FloatArray],  # (S, D), (S, Dv)
    at: tuple[int, int, int, int],  # (b, h, t0, t1)
    block_k: int,
    setup: _Setup,
    bugs: _Bugs,
) -> tuple[FloatArray, FloatArray, list[Tile]]:
    """One query block over every key block in order: O (bq, Dv), L (bq,) and its tiles."""
    k, v = kv
    b, h, t0, t1 = at
    S, Dv = v.shape
    dtype = q.dtype
    exp = np.exp2 if setup.base2 else np.exp
    log = np.log2 if setup.base2 else np.log
    to_base = LOG2E if setup.base2 else 1.0
    # the running state; a sink is a logit already seen, exp(sink - m) = 1 (gpt-oss)
    m = np.full(t1 - t0, -np.inf, dtype)
    l = np.zeros(t1 - t0, dtype)  # noqa: E741
    if setup.sinks is not None:
        m = np.full(t1 - t0, setup.sinks[h] * to_base, dtype)
        l = np.ones(t1 - t0, dtype)  # noqa: E741
    acc = np.zeros((t1 - t0, Dv), dtype)
    skip_from = _skip_from(t1, S, block_k, setup.causal_offset, bugs.extra_skip)
    tiles: list[Tile] = []
    for s0 in range(0, S, block_k):
        s1 = min(S, s0 + block_k)
        if s0 >= skip_from:
            if setup.record:
                tiles.append(Tile(b, h, (t0, t1), (s0, s1), True, None, m, None, None, l, acc))
            continue
        S_tile = _tile_scores(q, k[s0:s1], (b, h, t0, t1, s0, s1), setup) * dtype.type(to_base)
        m_new = np.maximum(m, S_tile.max(axis=1))  # (bq,)
        # FlashAttention-2's Check_inf: subtract 0 from a row that is still all -inf
        m_safe = np.where(np.isneginf(m_new), 0.0, m_new).astype(dtype)
        alpha = exp(m - m_safe)  # (bq,), 0 on the first tile
        P = exp(S_tile - m_safe[:, None])  # (bq, bk)
        l = (l if bugs.sum_not_rescaled else alpha * l) + P.sum(axis=1)  # noqa: E741
        acc = (acc if bugs.acc_not_rescaled else alpha[:, None] * acc) + P @ v[s0:s1]  # (bq, Dv)
        m = m_new
        if setup.record:
            tiles.append(Tile(b, h, (t0, t1), (s0, s1), False, S_tile, m, alpha, P, l, acc))
    empty = l == 0  # nothing allowed in the row (and no sink): O = 0, L = -inf, never 0/0
    o = acc / np.where(empty, 1.0, l)[:, None].astype(dtype)
    L_row = log(np.where(empty, 1.0, l).astype(dtype))
    if not bugs.lse_without_max:
        L_row = L_row + np.where(empty, 0.0, m)
    return o, np.where(empty, -np.inf, L_row).astype(dtype), tiles


def _skip_from(t1: int, S: int, block_k: int, offset: int | None, extra: bool) -> int:
    """The first key of the first block wholly above the diagonal (S when there is none)."""
    if offset is None:
        return S
    last_key = t1 - 1 + offset  # the last key the block's last query may see
    computed = min(-(-S // block_k), last_key // block_k + 1 if last_key >= 0 else 0)
    if extra:
        computed = max(0, computed - 1)  # the diagonal tile skipped as well
    return min(S, computed * block_k)


def _tile_scores(
    q: FloatArray,  # (bq, D)
    k: FloatArray,  # (bk, D)
    at: tuple[int, int, int, int, int, int],  # (b, h, t0, t1, s0, s1)
    setup: _Setup,
) -> FloatArray:
    """S = q kᵀ × scale (capped) + bias, -inf where the mask or the causal diagonal forbids."""
    b, h, t0, t1, s0, s1 = at
    scaled = (q @ k.T) * q.dtype.type(setup.scale)  # (bq, D) @ (D, bk) -> (bq, bk)
    # Gemma 2's softcap: on the scaled scores, before the bias, the mask and the running max
    S_tile: FloatArray = scaled if setup.softcap is None else cap_scores(scaled, setup.softcap)
    if setup.bias is not None:
        S_tile = S_tile + setup.bias[b, h, t0:t1, s0:s1]
    forbid = np.zeros(S_tile.shape, dtype=bool)
    if setup.allowed is not None:
        forbid |= ~setup.allowed[b, h, t0:t1, s0:s1]
    if setup.causal_offset is not None:
        forbid |= np.arange(s0, s1)[None, :] > np.arange(t0, t1)[:, None] + setup.causal_offset
    return np.where(forbid, -np.inf, S_tile).astype(q.dtype, copy=False)


@dataclass(frozen=True, eq=False)
class FlashMistake:
    """What a kernel with one named mistake returns, to match against a user's dump."""

    name: str
    description: str
    result: FlashResult


_FLASH_MISTAKES = (
    ("acc_not_rescaled", "accumulator not rescaled by alpha", _Bugs(acc_not_rescaled=True)),
    ("sum_not_rescaled", "running sum l not rescaled by alpha", _Bugs(sum_not_rescaled=True)),
    ("lse_without_max", "L = log(l), the max m left out", _Bugs(lse_without_max=True)),
    ("lse_base2", "L in base 2 where base e is expected", _Bugs()),
    ("causal_extra_skip", "one diagonal tile too many skipped", _Bugs(extra_skip=True)),
)


def flash_mistakes(
    q: FloatArray,
    k: FloatArray,
    v: FloatArray,
    *,
    scale: float,
    allowed: BoolArray | None = None,
    bias: FloatArray | None = None,
    block_q: int,
    block_k: int,
    causal_offset: int | None = None,
    sinks: FloatArray | None = None,
    softcap: float | None = None,
    record_tiles: bool = False,
) -> tuple[FlashMistake, ...]:
    """Each named mistake recomputed (base e expected); the causal one only under causal.

    A kernel without the empty-row guard writes NaN where these give O = 0 and L = -inf.
    """
    found = []
    for name, description, bugs in _FLASH_MISTAKES:
        if bugs.extra_skip and causal_offset is None:
            continue
        base2 = name == "lse_base2"
        result = _forward(q, k, v, scale, allowed, bias, block_q, block_k, causal_offset, base2,
                          sinks, record_tiles, bugs, softcap)  # fmt: skip
        found.append(FlashMistake(name, description, result))
    return tuple(found)
