"""FlashAttention-2's forward pass tile by tile, and the log-sum-exp it keeps instead of weights.

Axis names as in the pipeline: B batch, H query heads, Hkv key/value heads, T queries, S keys,
D d_k, Dv d_v; a tile is ``bq`` query rows (t0:t1) by ``bk`` keys (s0:s1) of one (b, h).

Per (batch, head, query block) the key blocks are visited in order, keeping a running row max
m, a running sum l and an unnormalised output acc (Dao, "FlashAttention-2", Algorithm 1)::

    S = masked (-inf where not allowed)               m_new = max(m, rowmax(S))
    alpha = exp(m - m_new)    P = exp(S - m_new)      l = alpha * l + rowsum(P)
    acc = alpha * acc + P @ V                        finally O = acc / l, L = m + log(l)

where masked is the one chain (core/chain.py) over the tile's cells: scaled -> the score
modifiers -> + the biases, -inf where a key is not allowed; an extra logit of the chain starts
m and l (exp(extra - m) = 1); so weights = exp(masked - L) is never stored. ``base2`` computes
as Triton's fused-attention tutorial: scores times scale * log2(e), exp2, and L in base 2
(L_2 = L / ln 2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attn_cli.core.chain import Chain, cells_of
from attn_cli.core.steps import Way, attention, exp_rows, in_place
from attn_cli.core.variant import Cells

FloatArray = np.ndarray[Any, np.dtype[np.floating[Any]]]

# log2(e): Triton writes 1.44269504, which is this number rounded to float32 (and to 9 digits);
# the full float64 value keeps base 2 and base e equal to rounding in float64 too.
LOG2E = 1.0 / math.log(2.0)


def lse(masked: FloatArray, extra: FloatArray | None = None) -> FloatArray:
    """Log-sum-exp over keys (last axis): (..., T, S) -> (..., T); a row of -inf gives -inf.

    ``extra`` (one logit per query head, the axis before T) joins each row's sum, as gpt-oss.
    """
    sink = None if extra is None else np.asarray(extra, dtype=masked.dtype)[:, None, None]
    out: FloatArray = np.empty(masked.shape[:-1], masked.dtype)  # (..., T)
    exp_rows(masked, None, sink, out)  # the softmax's own (steps.py), its lse kept
    return out


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
    m: FloatArray | None = None  # (B, H, T): the running max after the last key block
    l: FloatArray | None = None  # noqa: E741 (B, H, T): the running sum after it


@dataclass(frozen=True)
class FlashBugs:
    """Mistakes a hand-written kernel makes, for the grader to recompute (all off: correct)."""

    acc_not_rescaled: bool = False
    sum_not_rescaled: bool = False
    lse_without_max: bool = False
    extra_skip: bool = False  # one diagonal tile too many skipped per query block


_Bugs = FlashBugs  # the name a test's wrong kernel uses


@dataclass(frozen=True, eq=False)
class _Setup:
    chain: Chain
    scale: float
    origin: tuple[int, int, int]  # (batch, head, query) of q[0, 0, 0] in the chain's inputs
    skip_offset: int | None  # keys j > query i + offset are hidden: tiles above are skipped
    base2: bool
    record: bool
    key_origin: int = 0  # the chain's key index of k[:, :, 0] (a split-KV chunk's first key)
    with_extra: bool = True  # False: an extra logit (a sink per head) is left to the caller's merge


def flash_forward(
    q: FloatArray,  # (B, H, T, D)
    k: FloatArray,  # (B, Hkv, S, D)
    v: FloatArray,  # (B, Hkv, S, Dv)
    *,
    chain: Chain,
    scale: float,
    block_q: int,
    block_k: int,
    causal_offset: int | None = None,
    base2: bool = False,
    record_tiles: bool = True,
    origin: tuple[int, int, int] = (0, 0, 0),
    key_origin: int = 0,
    with_extra: bool = True,
) -> FlashResult:
    """The FlashAttention-2 forward; ``causal_offset`` o says the chain hides every key
    j > query i + o, so the tiles wholly above that diagonal are skipped (None: none is).

    ``origin`` is where q starts in the chain's inputs, (batch, head, query): a block run on
    its own; ``key_origin`` is where k and v start (a split-KV chunk: core/split_kv.py), and
    ``with_extra=False`` leaves the chain's extra logit out of m and l (the merge adds it once).
    """
    setup = _Setup(chain, scale, origin, causal_offset, base2, record_tiles, key_origin, with_extra)
    return _forward(q, k, v, block_q, block_k, setup, FlashBugs())


def _forward(
    q: FloatArray,
    k: FloatArray,
    v: FloatArray,
    block_q: int,
    block_k: int,
    setup: _Setup,
    bugs: FlashBugs,
) -> FlashResult:
    """The loop over (batch, head, query block); each block runs over its key blocks. Without
    tiles to record, a block runs every head of its batch item at once (one product per kv
    head and tile, its query heads stacked): the same arithmetic, an eighth of the Python."""
    B, H, T, _ = q.shape
    _, Hkv, S, Dv = v.shape
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be >= 1, not {block_q}, {block_k}")
    if H % Hkv or k.shape[:3] != (B, Hkv, S):
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape} do not fit together")
    groups = H // Hkv  # query head h reads key/value head h // groups
    output = np.zeros((B, H, T, Dv), q.dtype)
    L = np.empty((B, H, T), q.dtype)
    m, l = np.empty((B, H, T), q.dtype), np.empty((B, H, T), q.dtype)  # noqa: E741
    tiles: list[Tile] = []
    # (first query head, query heads, first kv head, kv heads) of each call
    heads = [(h, 1, h // groups, 1) for h in range(H)] if setup.record else [(0, H, 0, Hkv)]
    for b in range(B):
        for h0, n_h, g0, n_g in heads:
            kv = (k[b, g0 : g0 + n_g], v[b, g0 : g0 + n_g])  # (G, S, D), (G, S, Dv)
            for t0 in range(0, T, block_q):
                t1 = min(T, t0 + block_q)
                at = (b, h0, t0, t1)
                o, L_row, row_tiles, (m_row, l_row) = _query_block(
                    q[b, h0 : h0 + n_h, t0:t1], kv, at, block_k, setup, bugs
                )
                output[b, h0 : h0 + n_h, t0:t1], L[b, h0 : h0 + n_h, t0:t1] = o, L_row
                m[b, h0 : h0 + n_h, t0:t1], l[b, h0 : h0 + n_h, t0:t1] = m_row, l_row
                tiles.extend(row_tiles)
    return FlashResult(output, L, tuple(tiles), block_q, block_k, setup.base2, m, l)


def _query_block(
    q: FloatArray,  # (Hq, bq, D): query heads h0 .. h0 + Hq - 1
    kv: tuple[FloatArray, FloatArray],  # (G, S, D), (G, S, Dv): their kv heads, Hq = G·g
    at: tuple[int, int, int, int],  # (b, h0, t0, t1)
    block_k: int,
    setup: _Setup,
    bugs: FlashBugs,
) -> tuple[FloatArray, FloatArray, list[Tile], tuple[FloatArray, FloatArray]]:
    """One query block over every key block in order: O (Hq, bq, Dv), L (Hq, bq), its tiles
    (recorded for one head only) and the last running m and l (Hq, bq)."""
    k, v = kv
    b, h0, t0, t1 = at
    Hq, n, D = q.shape
    G, S, Dv = v.shape
    dtype = q.dtype
    exp = np.exp2 if setup.base2 else np.exp
    to_base = dtype.type(LOG2E if setup.base2 else 1.0)
    scale = dtype.type(setup.scale)
    record = setup.record and Hq == 1
    qg = q.reshape(G, Hq // G * n, D)  # (G, g·bq, D): each kv head's query heads stacked
    # the running state; an extra logit is one already seen, exp(extra - m) = 1 (gpt-oss)
    m = np.full((Hq, n), -np.inf, dtype)
    l = np.zeros((Hq, n), dtype)  # noqa: E741
    row = _cells(setup, b, (h0, h0 + Hq), t0, t1, 0, S)  # the block's cells, sliced per tile
    extra = setup.chain.extra_logit(row, dtype) if setup.with_extra else None  # (1, Hq, 1, 1)
    if extra is not None:
        m = np.broadcast_to(extra[0, :, :, 0] * to_base, (Hq, n)).astype(dtype)
        l = np.ones((Hq, n), dtype)  # noqa: E741
    acc = np.zeros((Hq, n, Dv), dtype)
    skip_from = _skip_from(t1, S, block_k, setup.skip_offset, bugs.extra_skip)
    tiles: list[Tile] = []
    for s0 in range(0, S, block_k):
        s1 = min(S, s0 + block_k)
        if s0 >= skip_from:
            if record:
                tiles.append(
                    Tile(b, h0, (t0, t1), (s0, s1), True, None, m[0], None, None, l[0], acc[0])
                )
            continue
        cells = row._replace(keys=row.keys[s0:s1], pos_k=row.pos_k[s0:s1])
        scores = np.matmul(qg, k[:, s0:s1].transpose(0, 2, 1))  # (G, g·bq, bk)
        S_tile = _tile_scores(
            scores.reshape(1, Hq, n, s1 - s0), cells, scale, setup
        )  # (Hq, bq, bk)
        if setup.base2:
            S_tile *= to_base
        m_new = np.maximum(m, S_tile.max(axis=2))  # (Hq, bq)
        # FlashAttention-2's Check_inf: subtract 0 from a row that is still all -inf
        m_safe = np.where(np.isneginf(m_new), dtype.type(0), m_new)
        alpha = exp(m - m_safe)  # (Hq, bq), 0 on the first tile
        P = S_tile - m_safe[:, :, None]  # (Hq, bq, bk)
        exp(P, out=P)
        l = (l if bugs.sum_not_rescaled else alpha * l) + P.sum(axis=2)  # noqa: E741
        pv = np.matmul(P.reshape(G, -1, s1 - s0), v[:, s0:s1]).reshape(Hq, n, Dv)
        acc = (acc if bugs.acc_not_rescaled else alpha[:, :, None] * acc) + pv  # (Hq, bq, Dv)
        m = m_new
        if record:
            tiles.append(
                Tile(
                    b, h0, (t0, t1), (s0, s1), False, S_tile[0], m[0], alpha[0], P[0], l[0], acc[0]
                )
            )
    o, L_row = _finish(acc, l, m, setup.base2, bugs)
    return o, L_row, tiles, (m, l)


def _finish(
    acc: FloatArray,
    l: FloatArray,  # noqa: E741 (the paper's name)
    m: FloatArray,
    base2: bool,
    bugs: FlashBugs,
) -> tuple[FloatArray, FloatArray]:
    """O = acc / l (Hq, bq, Dv) and L = m + log l (Hq, bq); a row with nothing allowed (and no
    sink) gives O = 0 and L = -inf, never 0/0."""
    dtype = acc.dtype
    log = np.log2 if base2 else np.log
    empty = l == 0
    o = acc / np.where(empty, 1.0, l)[:, :, None].astype(dtype)
    L_row = log(np.where(empty, 1.0, l).astype(dtype))
    if not bugs.lse_without_max:
        L_row = L_row + np.where(empty, 0.0, m)
    return o, np.where(empty, -np.inf, L_row).astype(dtype)


def _skip_from(t1: int, S: int, block_k: int, offset: int | None, extra: bool) -> int:
    """The first key of the first block wholly above the diagonal (S when there is none)."""
    if offset is None:
        return S
    last_key = t1 - 1 + offset  # the last key the block's last query may see
    computed = min(-(-S // block_k), last_key // block_k + 1 if last_key >= 0 else 0)
    if extra:
        computed = max(0, computed - 1)  # the diagonal tile skipped as well
    return min(S, computed * block_k)


def _cells(
    setup: _Setup, b: int, heads: tuple[int, int], t0: int, t1: int, s0: int, s1: int
) -> Cells:
    """A block's cells in the chain's inputs: (b, heads h0:h1, rows t0:t1, keys s0:s1) from
    the origin."""
    ob, oh, ot = setup.origin
    ok = setup.key_origin
    h0, h1 = heads
    return cells_of(
        setup.chain.inputs,
        slice(ob + b, ob + b + 1),
        slice(oh + h0, oh + h1),
        slice(ot + t0, ot + t1),
        slice(ok + s0, ok + s1),
    )


def _tile_scores(scores: FloatArray, cells: Cells, scale: Any, setup: _Setup) -> FloatArray:
    """S = the one chain (steps.attention) from a tile's scores (1, Hq, bq, bk) to masked, in
    place: scaled, modified, + the biases, -inf where not allowed. (Hq, bq, bk)"""
    into = in_place(scores, setup.chain)
    made = attention(
        setup.chain, None, None, None, cells, scale, TILE, into=into, start=("scores", scores)
    )
    assert made.masked is not None
    tile: FloatArray = made.masked[0]
    return tile


TILE = Way(fill=-np.inf, last="masked")  # a tile: the chain up to masked, -inf where hidden


@dataclass(frozen=True, eq=False)
class FlashMistake:
    """What a kernel with one named mistake returns, to match against a user's dump."""

    name: str
    description: str
    result: FlashResult


_FLASH_MISTAKES = (
    ("acc_not_rescaled", "accumulator not rescaled by alpha", FlashBugs(acc_not_rescaled=True)),
    ("sum_not_rescaled", "running sum l not rescaled by alpha", FlashBugs(sum_not_rescaled=True)),
    ("lse_without_max", "L = log(l), the max m left out", FlashBugs(lse_without_max=True)),
    ("lse_base2", "L in base 2 where base e is expected", FlashBugs()),
)


def flash_mistakes(
    q: FloatArray,
    k: FloatArray,
    v: FloatArray,
    *,
    chain: Chain,
    scale: float,
    block_q: int,
    block_k: int,
    causal_offset: int | None = None,
    record_tiles: bool = False,
    origin: tuple[int, int, int] = (0, 0, 0),
    extra: Sequence[tuple[str, str, FlashBugs]] = (),
) -> tuple[FlashMistake, ...]:
    """Each named mistake of the loop recomputed (base e expected), then each of ``extra``
    (name, description, bugs): the variants' own (check/mistakes/).

    A kernel without the empty-row guard writes NaN where these give O = 0 and L = -inf.
    """
    found = []
    for name, description, bugs in (*_FLASH_MISTAKES, *extra):
        base2 = name == "lse_base2"
        setup = _Setup(chain, scale, origin, causal_offset, base2, record_tiles)
        found.append(
            FlashMistake(name, description, _forward(q, k, v, block_q, block_k, setup, bugs))
        )
    return tuple(found)
