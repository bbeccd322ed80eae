"""Split-KV (flash-decoding, FlashInfer's ``merge_state``): each query's keys in S chunks, each
run on its own, then merged by their log-sum-exp.

Axis names as in core/flash.py: B batch, H query heads, Hkv key/value heads, T queries, S keys,
Dv d_v; n chunks. The keys 0..S-1 are cut into n contiguous chunks as evenly as possible, the
first S mod n chunks one key longer (as ``np.array_split``). Each chunk is FlashAttention's
tile loop (core/flash.py) over its own keys, which leaves per query row a running max m_s, a
running sum l_s, the partial output O_s = acc_s / l_s and lse_s = m_s + log l_s. The merge::

    m* = max_s lse_s        lse = m* + log Σ_s exp(lse_s − m*)
    w_s = exp(lse_s − lse)  O = Σ_s w_s · O_s

A chunk whose keys are all hidden from a query (under causal, the later chunks) has lse_s = −∞
and weight exactly 0; a row with no key at all gives lse = −∞ and O = 0. An extra logit of the
chain (gpt-oss's sink logits) is a term of its own, lse = the logit and O = 0, joined once in the
merge rather than once per chunk. With ``base2`` every lse is in base 2 (exp2, log2), as
Triton keeps it. The merge of two states is associative and commutative: :func:`fold` (left to
right) and :func:`tree` (right to left, in pairs) give the one-shot merge's numbers to rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attn_cli.core.chain import Chain, cells_of
from attn_cli.core.flash import LOG2E, FloatArray, flash_forward


def chunk_bounds(keys: int, splits: int) -> tuple[tuple[int, int], ...]:
    """The keys (s0, s1) of each of ``splits`` chunks of ``keys`` keys, as even as possible, the
    first ``keys mod splits`` one longer (``np.array_split``'s rule)."""
    if not 1 <= splits <= keys:
        raise ValueError(f"cannot split {keys} keys in {splits} chunks")
    size, longer = divmod(keys, splits)
    bounds = []
    s0 = 0
    for n in range(splits):
        s1 = s0 + size + (n < longer)
        bounds.append((s0, s1))
        s0 = s1
    return tuple(bounds)


@dataclass(frozen=True, eq=False)
class Chunk:
    """One chunk's state for every query row: m, l, lse (B, H, T), O (B, H, T, Dv)."""

    keys: tuple[int, int]  # (s0, s1): its keys s0 .. s1 - 1
    m: FloatArray
    l: FloatArray  # noqa: E741 (the paper's name)
    lse: FloatArray
    output: FloatArray


@dataclass(frozen=True, eq=False)
class Merged:
    """A merge: m* (B, H, T), the weights exp(lse_s − lse) (n, B, H, T), lse and O."""

    m_star: FloatArray
    weights: FloatArray
    lse: FloatArray
    output: FloatArray


@dataclass(frozen=True)
class MergeBugs:
    """Mistakes a hand-written merge makes, for the grader to recompute (all off: correct)."""

    without_max: bool = False  # exp(lse_s) summed as is: overflows on large logits
    weights_by_l: bool = False  # O weighted by each chunk's l, not by exp(lse_s)
    wrong_base: bool = False  # exp2/log2 where the chunks' lse are base e (and the reverse)


@dataclass(frozen=True, eq=False)
class SplitResult:
    """The chunks, the extra logit (B, H) joined once (None: none), the one-shot merge, and the
    same merge as a left fold and as a tree: (lse, O) each."""

    chunks: tuple[Chunk, ...]
    extra: FloatArray | None
    merged: Merged
    fold: tuple[FloatArray, FloatArray]
    tree: tuple[FloatArray, FloatArray]
    base2: bool


def merge(
    lses: Sequence[FloatArray],  # n × (B, H, T)
    outputs: Sequence[FloatArray],  # n × (B, H, T, Dv)
    base2: bool = False,
    bugs: MergeBugs = MergeBugs(),
    sums: Sequence[FloatArray] | None = None,  # n × (B, H, T): each chunk's l (weights_by_l)
) -> Merged:
    """The log-sum-exp merge of n states, with the max shift; exact for lse_s = −∞ (weight 0)."""
    exp, log = (np.exp2, np.log2) if base2 != bugs.wrong_base else (np.exp, np.log)
    L = np.stack(lses)  # (n, B, H, T)
    O = np.stack(outputs)  # noqa: E741 (n, B, H, T, Dv)
    if bugs.without_max:
        return _merge_without_max(L, O, exp, log)
    m_star = L.max(axis=0)  # (B, H, T)
    empty = np.isneginf(m_star)  # no chunk saw a key: −∞ − (−∞) is never computed
    m_safe = np.where(empty, 0.0, m_star).astype(L.dtype)
    total = exp(L - m_safe).sum(axis=0)  # (B, H, T), >= 1 where not empty
    lse = np.where(empty, -np.inf, m_safe + log(np.where(empty, 1.0, total))).astype(L.dtype)
    lse_safe = np.where(empty, 0.0, lse).astype(L.dtype)
    weights = exp(L - lse_safe)  # (n, B, H, T): 0 where lse_s = −∞
    if bugs.weights_by_l:
        assert sums is not None
        l_all = np.stack(sums)  # (n, B, H, T), as many as the chunks (an extra term has none)
        by_l = l_all / np.where(empty, 1.0, l_all.sum(axis=0))
        weights = np.concatenate([by_l, np.zeros_like(weights[len(sums) :])]).astype(L.dtype)
    output = (weights[..., None] * O).sum(axis=0)  # (B, H, T, Dv)
    return Merged(m_star, weights, lse, output.astype(O.dtype, copy=False))


def _merge_without_max(
    L: FloatArray,
    O: FloatArray,  # noqa: E741 (the paper's name)
    exp: Callable[..., Any],
    log: Callable[..., Any],
) -> Merged:
    """The mistake: Σ exp(lse_s) as is, which overflows to ∞ (lse ∞, O NaN) on large logits
    and underflows to 0 (lse −∞, O NaN) on very negative ones."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        w = exp(L)  # (n, B, H, T)
        total = w.sum(axis=0)
        lse = log(total)
        output = (w[..., None] * O).sum(axis=0) / total[..., None]
        weights = w / total
    return Merged(np.zeros_like(lse), weights, lse, output)


def fold(
    lses: Sequence[FloatArray], outputs: Sequence[FloatArray], base2: bool = False
) -> tuple[FloatArray, FloatArray]:
    """The merge as a left fold, two states at a time: ((0 ⊕ 1) ⊕ 2) ⊕ ...: (lse, O)."""
    lse, out = lses[0], outputs[0]
    for L, o in zip(lses[1:], outputs[1:], strict=True):
        both = merge([lse, L], [out, o], base2)
        lse, out = both.lse, both.output
    return lse, out


def tree(
    lses: Sequence[FloatArray], outputs: Sequence[FloatArray], base2: bool = False
) -> tuple[FloatArray, FloatArray]:
    """The merge right to left in pairs, as a reduction tree: (n−1 ⊕ n−2) ⊕ (n−3 ⊕ n−4) ...:
    (lse, O)."""
    states = list(zip(lses[::-1], outputs[::-1], strict=True))
    while len(states) > 1:
        paired = []
        for n in range(0, len(states) - 1, 2):
            (La, Oa), (Lb, Ob) = states[n], states[n + 1]
            both = merge([La, Lb], [Oa, Ob], base2)
            paired.append((both.lse, both.output))
        if len(states) % 2:
            paired.append(states[-1])
        states = paired
    return states[0]


def split_kv_forward(
    q: FloatArray,  # (B, H, T, D)
    k: FloatArray,  # (B, Hkv, S, D)
    v: FloatArray,  # (B, Hkv, S, Dv)
    *,
    chain: Chain,
    scale: float,
    splits: int,
    block_q: int,
    block_k: int | None = None,
    causal_offset: int | None = None,
    base2: bool = False,
    bugs: MergeBugs = MergeBugs(),
) -> SplitResult:
    """Each chunk of keys through flash's tile loop (blocks ``block_q`` × ``block_k``, a chunk's
    whole length when None), then merged; ``causal_offset`` as flash_forward's."""
    chunks = []
    for s0, s1 in chunk_bounds(k.shape[2], splits):
        offset = None if causal_offset is None else causal_offset - s0  # keys from s0
        r = flash_forward(
            q,
            k[:, :, s0:s1],
            v[:, :, s0:s1],
            chain=chain,
            scale=scale,
            block_q=block_q,
            block_k=block_k or s1 - s0,
            causal_offset=offset,
            base2=base2,
            record_tiles=False,
            key_origin=s0,
            with_extra=False,
        )
        assert r.m is not None and r.l is not None
        chunks.append(Chunk((s0, s1), r.m, r.l, r.lse, r.output))
    extra = _extra(chain, q, base2)
    lses = [c.lse for c in chunks]
    outputs = [c.output for c in chunks]
    if extra is not None:  # the sink: one more state, lse = its logit and O = 0
        lses.append(np.broadcast_to(extra[:, :, None], lses[0].shape))
        outputs.append(np.zeros_like(outputs[0]))
    merged = merge(lses, outputs, base2, bugs, [c.l for c in chunks])
    return SplitResult(
        tuple(chunks), extra, merged, fold(lses, outputs, base2), tree(lses, outputs, base2), base2
    )


def _extra(chain: Chain, q: FloatArray, base2: bool) -> FloatArray | None:
    """The chain's extra logit per (batch, head), (B, H), in the merge's base; None: none."""
    B, H = q.shape[:2]
    cells = cells_of(chain.inputs, slice(0, 1), slice(0, H), slice(0, 1), slice(0, 1))
    logit = chain.extra_logit(cells, q.dtype)  # (1, H, 1, 1)
    if logit is None:
        return None
    to_base = q.dtype.type(LOG2E if base2 else 1.0)
    return np.broadcast_to(logit[0, :, 0, 0] * to_base, (B, H)).astype(q.dtype)


SPLIT_MISTAKES = (
    (
        "merge_without_max",
        "lse = log Σ exp(lse_s) without the max shift (overflows on large logits)",
        MergeBugs(without_max=True),
    ),
    (
        "merge_weights_by_l",
        "O weighted by each chunk's l instead of exp(lse_s − lse)",
        MergeBugs(weights_by_l=True),
    ),
    (
        "merge_wrong_base",
        "chunks merged with exp2/log2 where their lse is base e (or the reverse)",
        MergeBugs(wrong_base=True),
    ),
)
