"""Continuous batching: several sequences decoded together, their query rows packed into one
batch per step (varlen attention's ``cu_seqlens``), joining and leaving between steps.

Axes: H query heads, Hkv key/value heads, D d_k, Dv d_v; R the packed query rows of a step,
N the packed keys (each sequence's cache, one after another).

A sequence joins at its ``arrive`` step with its prefill (its first ``prefill`` tokens, as one
chunk of rows, or chunks of ``chunk`` rows over the following steps), then adds one row a step
until its last token, and leaves. Each step packs the rows of every sequence present, in order,
and their caches: ``cu_seqlens_q`` and ``cu_seqlens_k`` are where each sequence's rows and keys
start. One product gives the packed scores (R × N); each sequence's diagonal block goes
through its own chain (its variants at its positions, its causal rule inside the chunk: the
steps of the one chain, steps.attention), everything off the diagonal is −∞ (the block-diagonal
mask), the softmax runs over the packed row and one product with the packed values gives every
row's output. Each sequence's rows then equal its own decode's. In a pool of pages, a sliding
window's passed blocks are released before the step writes, and a sequence's packed keys start
at its first live block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from attn_cli.core.chain import Chain
from attn_cli.core.decode import GROUPED, After, Finish, grouped
from attn_cli.core.paged import Paging, PoolStep, SharedPool, freed_before
from attn_cli.core.steps import attention, softmax_rows
from attn_cli.core.variant import Cells

TO_MASKED = replace(GROUPED, last="masked")  # a sequence's block: its chain up to masked

FloatArray = np.ndarray[Any, np.dtype[np.floating[Any]]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]


@dataclass(frozen=True, eq=False)
class Member:
    """One sequence of the batch: q and k already rotated at its positions (as a cache keeps
    them), v, its chain and scale, when it joins and how its prompt is prefilled."""

    name: str
    q: FloatArray  # (1, H, T, D)
    k: FloatArray  # (1, Hkv, T, D)
    v: FloatArray  # (1, Hkv, T, Dv)
    chain: Chain
    scale: float
    positions: IntArray  # (T,)
    arrive: int  # the step it joins at
    prefill: int  # tokens of its prompt, computed before its first generated token
    chunk: int | None = None  # rows of the prompt a step (None: the whole prompt at once)
    finish: Finish | None = None  # a latent cache's W_UV (MLA)
    after: After | None = None  # the head-output transforms (a gate)

    @property
    def tokens(self) -> int:
        return int(self.q.shape[2])

    def rows_at(self, step: int) -> range:
        """The tokens whose queries this sequence adds at ``step`` (empty: not in the batch)."""
        k = step - self.arrive
        if k < 0:
            return range(0)
        chunk = self.chunk or self.prefill
        chunks = -(-self.prefill // chunk)  # steps the prompt takes
        if k < chunks:
            return range(k * chunk, min(self.prefill, (k + 1) * chunk))
        t = self.prefill + k - chunks
        return range(t, t + 1) if t < self.tokens else range(0)

    @property
    def leaves(self) -> int:
        """The step after its last row."""
        chunk = self.chunk or self.prefill
        return self.arrive + -(-self.prefill // chunk) + self.tokens - self.prefill


@dataclass(frozen=True, eq=False)
class BatchStep:
    """One step of the batch: the packed rows and keys, the mask, the tables, the outputs."""

    step: int
    rows: tuple[tuple[int, int], ...]  # (sequence, token) of each packed query row
    keys: tuple[tuple[int, int], ...]  # (sequence, token) of each packed key
    cu_seqlens_q: tuple[int, ...]  # where each present sequence's rows start, then R
    cu_seqlens_k: tuple[int, ...]  # where its keys start, then N
    present: tuple[int, ...]  # the sequences in the batch this step, in packing order
    entering: tuple[int, ...]  # sequences that joined at this step
    leaving: tuple[int, ...]  # sequences whose last row is in this step
    mask: BoolArray  # (R, N) the block-diagonal mask: True where a row may see a key
    scores: FloatArray  # (H, R, N)
    masked: FloatArray  # (H, R, N), −∞ off the diagonal blocks and where a chain hides
    softmax: FloatArray  # (H, R, N)
    output: FloatArray  # (H, R, Dv): each row's output (after its finish and transforms)
    pages: PoolStep | None = None  # a paged batch: the pool after the step


@dataclass(frozen=True, eq=False)
class BatchResult:
    members: tuple[Member, ...]
    steps: tuple[BatchStep, ...]
    paging: Paging | None = None  # the one pool of a paged batch
    share: bool = False  # prompt pages shared (prefix caching)
    peak: int = 0  # the most pages the pool held at once

    def outputs(self, j: int) -> FloatArray:
        """Sequence j's rows, every token in order, (H, T, Dv)."""
        found = {t: s.output[:, r] for s in self.steps for r, (m, t) in enumerate(s.rows) if m == j}
        return np.stack([found[t] for t in range(self.members[j].tokens)], axis=1)


def batch_decode(
    members: Sequence[Member],
    leak: bool = False,
    paging: Paging | None = None,
    share: bool = False,
    no_copy: bool = False,
) -> BatchResult:
    """Every step of the batch until the last sequence leaves; ``leak``: the mistake of one
    causal mask over the packed rows in place of the block-diagonal one (a row sees the earlier
    sequences' keys too); ``paging``: the caches in one pool of pages (core/paged.py's
    SharedPool), ``share`` a joining sequence's prompt pages shared, ``no_copy`` the mistake of
    writing into a shared page without copying it."""
    pool = None
    if paging is not None:
        pool = SharedPool.empty(members[0].k, members[0].v, paging, share, no_copy)
    steps = []
    for s in busy_steps(members):
        present = tuple(j for j, m in enumerate(members) if len(m.rows_at(s)))
        if pool is not None:  # the blocks a window has passed go back before anyone writes
            for j in present:
                _slide(members[j], s, j, pool)
        caches = [_cache(members, s, j, pool) for j in present]
        step = _step(members, s, present, leak, caches)
        if pool is not None:
            tables = {j: tuple(pool.tables[j]) for j in present}
            for j in step.leaving:
                pool.leave(j)
            step = replace(step, pages=pool.record(tables))
        steps.append(step)
    peak = 0 if pool is None else pool.peak
    return BatchResult(tuple(members), tuple(steps), paging, share, peak)


def busy_steps(members: Sequence[Member]) -> list[int]:
    """The steps at which some sequence is in the batch, in order (none waits for an empty one)."""
    return sorted(set().union(*(range(m.arrive, m.leaves) for m in members)))


def packed_cells(members: Sequence[Member]) -> int:
    """Σ over the steps of packed rows × packed keys: what a batch's score tables hold."""
    total = 0
    for s in busy_steps(members):
        rows = [m.rows_at(s) for m in members]
        total += sum(len(r) for r in rows) * sum(r[-1] + 1 for r in rows if len(r))
    return total


def _slide(m: Member, s: int, j: int, pool: SharedPool) -> None:
    """Release sequence j's leading blocks that no query from this step's first row on can
    see (every token on them at least a window behind it): core/paged.py's rule."""
    reach = m.chain.cache_slots()
    if reach is None or j not in pool.tables:
        return
    bs = pool.paging.block_size
    pool.slide(j, freed_before(m.rows_at(s)[0], bs, m.positions, reach, pool.released[j]))


def _cache(
    members: Sequence[Member], s: int, j: int, pool: SharedPool | None
) -> tuple[FloatArray, FloatArray, int]:
    """Sequence j's keys and values at step s, (Hkv, n, D), and its first token among them:
    its tokens so far, this step's written first: a slice of its own (no pool, from token 0),
    or its live blocks gathered through its block table."""
    m = members[j]
    rows = m.rows_at(s)
    if pool is None:
        return m.k[0, :, : rows[-1] + 1], m.v[0, :, : rows[-1] + 1], 0
    if m.arrive == s:
        pool.join(j, m.k[0], m.v[0], m.prefill)
    for t in rows:
        pool.write(j, t, m.k[0, :, t], m.v[0, :, t])
    return (*pool.gather(j, rows[-1] + 1), pool.first(j))


def _step(
    members: Sequence[Member],
    s: int,
    present: tuple[int, ...],
    leak: bool,
    caches: list[tuple[FloatArray, FloatArray, int]],
) -> BatchStep:
    """Pack the present sequences' rows and caches, one product, the mask, softmax, output."""
    first = dict(zip(present, (lo for _, _, lo in caches), strict=True))  # its first key
    rows = [(j, t) for j in present for t in members[j].rows_at(s)]
    keys = [(j, t) for j in present for t in range(first[j], members[j].rows_at(s)[-1] + 1)]
    cu_q = _cumulative([len(members[j].rows_at(s)) for j in present])
    cu_k = _cumulative([members[j].rows_at(s)[-1] + 1 - first[j] for j in present])
    q = np.concatenate([members[j].q[0][:, list(members[j].rows_at(s))] for j in present], axis=1)[
        None
    ]  # (1, H, R, D)
    k = np.concatenate([kj for kj, _, _ in caches], axis=1)[None]  # (1, Hkv, N, D)
    v = np.concatenate([vj for _, vj, _ in caches], axis=1)[None]  # (1, Hkv, N, Dv)
    scores = grouped(q, k.swapaxes(-1, -2))[0]  # (H, R, N)
    scaled = scores * scores.dtype.type(members[present[0]].scale)
    masked = np.full_like(scaled, -np.inf)  # off the diagonal blocks: −∞
    weights = np.zeros_like(scaled)
    heads = np.arange(scaled.shape[0])
    for n, j in enumerate(present):
        m = members[j]
        rq, rk = slice(cu_q[n], cu_q[n + 1]), slice(cu_k[n], cu_k[n + 1])
        toks = np.array(m.rows_at(s), dtype=np.int64)  # (r,)
        ks = np.arange(first[j], first[j] + cu_k[n + 1] - cu_k[n], dtype=np.int64)  # (n,) its keys
        cells = Cells(np.arange(1), heads, toks, ks, m.positions[toks], m.positions[ks])
        later = ks[None, :] > toks[:, None]  # (r, n) keys after the row: not in the cache yet
        own = attention(
            m.chain,
            None,
            None,
            None,
            cells,
            1.0,
            TO_MASKED,
            hidden=later[None, None],
            start=("scaled", scaled[None, :, rq, rk]),
        ).masked  # (1, H, r, n): the chain from scaled
        assert own is not None
        masked[:, rq, rk] = own[0]
        if leak:  # one causal mask over the pack: the earlier sequences' keys seen too
            masked[:, rq, : cu_k[n]] = scaled[:, rq, : cu_k[n]]
        # the softmax over the whole packed row (its chain's extra logit, a sink, joins it)
        w, _ = softmax_rows(masked[None, :, rq], None, sink=m.chain.extra_logit(cells, q.dtype))
        weights[:, rq] = w[0]
    mask = np.isfinite(masked).any(axis=0)  # (R, N): a key some head of the row may see
    out = grouped(weights[None], v)[0]  # (H, R, Dv): one product over the packed keys
    out = _finished(members, present, cu_q, rows, out)
    entering = tuple(j for j in present if members[j].arrive == s)
    leaving = tuple(j for j in present if members[j].leaves == s + 1)
    return BatchStep(
        s,
        tuple(rows),
        tuple(keys),
        tuple(cu_q),
        tuple(cu_k),
        present,
        entering,
        leaving,
        mask,
        scores,
        masked,
        weights,
        out,
    )


def _finished(
    members: Sequence[Member],
    present: tuple[int, ...],
    cu_q: list[int],
    rows: list[tuple[int, int]],
    out: FloatArray,
) -> FloatArray:
    """Each sequence's rows through its latent cache's finish and its head-output transforms."""
    parts = []
    for n, j in enumerate(present):
        m = members[j]
        o = out[None, :, cu_q[n] : cu_q[n + 1]]  # (1, H, r, Dc)
        if m.finish is not None:
            o = m.finish(o)
        if m.after is not None:
            toks = [t for i, t in rows[cu_q[n] : cu_q[n + 1]]]
            o = m.after(slice(toks[0], toks[-1] + 1), o).get(m.chain.joined, o)
        parts.append(o[0])
    return np.concatenate(parts, axis=1)


def _cumulative(counts: list[int]) -> list[int]:
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out
