"""A paged KV cache (PagedAttention, as vLLM keeps it): the keys and values in a pool of pages of
``block_size`` tokens each, a block table from each logical block of the sequence to the
physical page that holds it, and a gather through the table at every step.

Token i lands in logical block i // block_size, at slot i % block_size of that block's page. A
page is taken from the pool (the lowest free one) when a token starts a new block, and handed
back when a sliding window has passed every token on it; a later block may reuse it. The pool
keeps K and V as (B, Hkv, pages · block_size, D) with page p at rows p·block_size ...; a step
reads the live blocks' pages in logical order (``where``), the empty slots of the last page as
zeros that the chain hides. Paging changes where K and V live and how they are read, not the
math of a step: core/decode.py runs the same step against the gathered cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

FloatArray = np.ndarray[Any, np.dtype[np.floating[Any]]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]

FREED = -1  # a logical block whose page went back to the pool (the window passed it)


class Paging(NamedTuple):
    """The pool: pages of ``block_size`` tokens, ``pages`` of them."""

    block_size: int
    pages: int


class PagedBugs(NamedTuple):
    """Mistakes of hand-written paged loops, for the grader to recompute (all off: correct)."""

    table_shift: bool = False  # the gather reads logical block b through table[b + 1]
    global_slot: bool = False  # a token's slot in its page taken from its global index


@dataclass(frozen=True)
class PageStep:
    """The pool after a step (or after the prefill): the block table (logical block -> page,
    FREED once released), where each token placed now went, the pages taken and released."""

    table: tuple[int, ...]
    placed: tuple[tuple[int, int, int], ...]  # (token, page, slot in the page)
    allocated: tuple[int, ...]
    freed: tuple[int, ...]
    in_use: int  # pages held now
    filled: int  # slots of those pages holding a token the gather reads


def freed_before(
    index: int, block_size: int, positions: IntArray, reach: int | None, known: int = 0
) -> int:
    """How many leading logical blocks no query from token ``index`` on can see: every token on
    them is at a position <= positions[index] - reach (None: no window, none); ``known``: as
    many as an earlier token's (positions increase, so the count only grows)."""
    if reach is None:
        return 0
    limit = positions[index] - reach
    blocks = index // block_size  # the blocks before the token's own, every slot written
    done = known
    while done < blocks and positions[(done + 1) * block_size - 1] <= limit:
        done += 1
    return done


def pages_needed(tokens: int, block_size: int, positions: Any, reach: int | None) -> int:
    """The most pages held at once over ``tokens`` tokens (the pool a decode needs)."""
    pos = np.asarray(positions, dtype=np.int64)
    most = done = 0
    for i in range(tokens):
        done = freed_before(i, block_size, pos, reach, done)
        most = max(most, i // block_size + 1 - done)
    return most


@dataclass(eq=False)
class PagedCache:
    """The pool, the block table and the free list; ``put`` writes a token, ``gather`` reads."""

    K: FloatArray  # (B, Hkv, pages · block_size, D)
    V: FloatArray  # (B, Hkv, pages · block_size, Dv)
    paging: Paging
    positions: IntArray  # (T,)
    reach: int | None  # a window's reach in positions, None: pages are never released
    bugs: PagedBugs = field(default_factory=PagedBugs)
    table: list[int] = field(default_factory=list)
    free: list[int] = field(default_factory=list)
    written: set[int] = field(default_factory=set)  # pool rows ever written
    count: int = 0  # tokens written
    released: int = 0  # leading logical blocks given back to the pool
    log: tuple[list[tuple[int, int, int]], list[int], list[int]] = field(
        default_factory=lambda: ([], [], [])
    )  # since the last record: tokens placed, pages taken, pages released

    @classmethod
    def empty(
        cls,
        k: FloatArray,
        v: FloatArray,
        paging: Paging,
        positions: IntArray,
        reach: int | None,
        bugs: PagedBugs | None = None,
    ) -> PagedCache:
        B, Hkv, _, D = k.shape
        rows = paging.pages * paging.block_size
        K = np.zeros((B, Hkv, rows, D), k.dtype)  # (B, Hkv, N·bs, D)
        V = np.zeros((B, Hkv, rows, v.shape[3]), v.dtype)  # (B, Hkv, N·bs, Dv)
        return cls(
            K, V, paging, positions, reach, bugs or PagedBugs(), free=list(range(paging.pages))
        )

    def put(self, index: int, k: FloatArray, v: FloatArray) -> tuple[int, int]:
        """Write token ``index``'s key and value (B, Hkv, D): release the blocks the window has
        passed, take a page when the token starts a block; return (page, slot in the page)."""
        bs = self.paging.block_size
        done = freed_before(index, bs, self.positions, self.reach, self.released)
        for b in range(self.released, done):
            if self.table[b] != FREED:
                self.log[2].append(self.table[b])
                self.free.append(self.table[b])
                self.table[b] = FREED
        self.free.sort()
        self.released = done
        block = index // bs
        if block == len(self.table):
            assert self.free, f"the pool of {self.paging.pages} pages is full"
            page = self.free.pop(0)
            self.table.append(page)
            self.log[1].append(page)
        page = self.table[block]
        slot = index if self.bugs.global_slot else index % bs
        row = (page * bs + slot) % (self.paging.pages * bs)
        # a page taken again: the steps already taken keep the pool they saw (one copy per
        # reused page; its later rows read as empty slots in the steps between)
        if row in self.written and (slot == 0 or self.bugs.global_slot):
            self.K, self.V = self.K.copy(), self.V.copy()
        self.written.add(row)
        self.K[:, :, row], self.V[:, :, row] = k, v
        self.count = index + 1
        self.log[0].append((index, page, index % bs))
        return page, index % bs

    def gather(self) -> tuple[IntArray, IntArray]:
        """The live blocks' slots in logical order: the pool row each reads (C,) and the token
        it holds (C,), -1 for the empty slots of the last page."""
        bs = self.paging.block_size
        table = np.array(self.table, np.int64)  # (blocks,)
        live = np.flatnonzero(table != FREED)  # the live logical blocks, in order
        pages = np.roll(table, -1) if self.bugs.table_shift else table  # b read through b + 1
        slots = np.arange(bs, dtype=np.int64)
        where = (pages[live, None] * bs + slots).reshape(-1)  # (live · bs,) pool rows
        tokens = (live[:, None] * bs + slots).reshape(-1)  # the token each slot is for
        held: IntArray = np.where(tokens < self.count, tokens, -1)
        return where, held

    def record(self) -> PageStep:
        """The pool now, and what changed since the last record."""
        placed, taken, released = self.log
        live = [p for p in self.table if p != FREED]
        first = next((b for b, p in enumerate(self.table) if p != FREED), len(self.table))
        step = PageStep(
            tuple(self.table),
            tuple(placed),
            tuple(taken),
            tuple(released),
            len(live),
            self.count - first * self.paging.block_size,
        )
        self.log = ([], [], [])
        return step


class PoolBytes(NamedTuple):
    """What the paged pool costs beside a contiguous cache, per layer, in float64."""

    block_size: int
    pages: int  # in the pool
    pages_used: int  # the most held at once
    per_token: int  # bytes of K and V per token slot
    pool: int  # pages · block_size · per_token
    used: int  # pages_used · block_size · per_token
    contiguous: int  # the cache's tokens · per_token (a ring: its slots)
    waste: int  # the last page's empty slots at the end, in bytes
    waste_slots: int


def pool_bytes(
    paging: Paging, per_token: int, tokens: int, positions: Any, reach: int | None
) -> PoolBytes:
    """The pool, the pages the sequence holds at its end and most at once, against a contiguous
    cache of the tokens it keeps; waste: the empty slots of the last page."""
    bs = paging.block_size
    used = pages_needed(tokens, bs, positions, reach)
    empty = -tokens % bs
    kept = tokens if reach is None else min(tokens, reach)
    return PoolBytes(
        block_size=bs,
        pages=paging.pages,
        pages_used=used,
        per_token=per_token,
        pool=paging.pages * bs * per_token,
        used=used * bs * per_token,
        contiguous=kept * per_token,
        waste=empty * per_token,
        waste_slots=empty,
    )


# ---------------------------------------------------------------------------------------------
# One pool for a batch of sequences: a block table each, shared prompt pages, copy on write


@dataclass(frozen=True)
class PoolStep:
    """The shared pool after a step of a batch: each sequence's block table, each page's
    reference count, and what the step shared, copied, took and released."""

    tables: tuple[tuple[int, tuple[int, ...]], ...]  # (sequence, its block table)
    refcounts: tuple[tuple[int, int], ...]  # (page, sequences holding it), pages in use
    shared: tuple[tuple[int, int, int], ...]  # (sequence, block, page) taken as cached
    copied: tuple[tuple[int, int, int, int], ...]  # (sequence, block, from page, to page)
    allocated: tuple[int, ...]
    freed: tuple[int, ...]


@dataclass(eq=False)
class SharedPool:
    """Pages of ``block_size`` rows shared by a batch's sequences: each sequence's block table,
    each page's reference count; ``share``: a joining sequence takes the whole (full) pages of
    the pool that already hold its prompt's keys and values, block by block from the first;
    a write into a page another sequence holds copies the page first (unless ``no_copy``, the
    mistake); a sliding window's passed blocks are released (FREED in the block table), their
    page back to the pool once no sequence holds it."""

    K: FloatArray  # (Hkv, pages · block_size, D)
    V: FloatArray  # (Hkv, pages · block_size, Dv)
    paging: Paging
    share: bool = False
    no_copy: bool = False
    tables: dict[int, list[int]] = field(default_factory=dict)
    refs: dict[int, int] = field(default_factory=dict)  # page -> sequences holding it
    rows: dict[int, int] = field(default_factory=dict)  # page -> rows written
    cached: dict[int, int] = field(default_factory=dict)  # sequence -> prompt tokens cached
    released: dict[int, int] = field(default_factory=dict)  # sequence -> leading blocks freed
    peak: int = 0  # the most pages held at once
    log: dict[str, list[Any]] = field(default_factory=dict)

    @classmethod
    def empty(
        cls, k: FloatArray, v: FloatArray, paging: Paging, share: bool, no_copy: bool = False
    ) -> SharedPool:
        rows = paging.pages * paging.block_size
        K = np.zeros((k.shape[1], rows, k.shape[3]), k.dtype)  # (Hkv, N·bs, D)
        V = np.zeros((v.shape[1], rows, v.shape[3]), v.dtype)  # (Hkv, N·bs, Dv)
        pool = cls(K, V, paging, share, no_copy)
        pool.record({})
        return pool

    def join(self, j: int, k: FloatArray, v: FloatArray, prompt: int) -> None:
        """Sequence j arrives with a prompt of ``prompt`` tokens (k, v: (Hkv, T, D)): with
        sharing, take each whole page whose rows equal its prompt's keys and values, from block 0
        on, as long as one matches; those tokens are not written again."""
        self.tables[j] = []
        self.cached[j] = 0
        self.released[j] = 0
        if not self.share:
            return
        bs = self.paging.block_size
        for b in range(-(-prompt // bs)):
            toks = range(b * bs, min((b + 1) * bs, prompt))
            page = next(
                (
                    p
                    for p in sorted(self.refs)
                    if self.rows.get(p) == bs and self._holds(p, toks, k, v)
                ),
                None,
            )
            if page is None:
                break
            self.tables[j].append(page)
            self.refs[page] += 1
            self.cached[j] = toks[-1] + 1
            self.log["shared"].append((j, b, page))

    def _holds(self, page: int, toks: range, k: FloatArray, v: FloatArray) -> bool:
        bs = self.paging.block_size
        rows = [page * bs + t % bs for t in toks]
        return bool(
            np.array_equal(self.K[:, rows], k[:, list(toks)])
            and np.array_equal(self.V[:, rows], v[:, list(toks)])
        )

    def write(self, j: int, t: int, k: FloatArray, v: FloatArray) -> None:
        """Token t of sequence j (k (Hkv, D), v (Hkv, Dv)) into its block's page: a new page at
        a block's first token, a copy of a page another sequence holds before writing into it."""
        if t < self.cached[j]:
            return  # its prompt's keys and values are already in a shared page
        bs, table = self.paging.block_size, self.tables[j]
        block = t // bs
        if block == len(table):
            table.append(self._take())
        page = table[block]
        if self.refs[page] > 1 and not self.no_copy:  # copy on write
            new = self._take()
            self.K[:, new * bs : (new + 1) * bs] = self.K[:, page * bs : (page + 1) * bs]
            self.V[:, new * bs : (new + 1) * bs] = self.V[:, page * bs : (page + 1) * bs]
            self.rows[new] = self.rows[page]
            self.refs[page] -= 1
            table[block] = new
            self.log["copied"].append((j, block, page, new))
            page = new
        self.K[:, page * bs + t % bs], self.V[:, page * bs + t % bs] = k, v
        self.rows[page] = max(self.rows[page], t % bs + 1)

    def _take(self) -> int:
        free = [p for p in range(self.paging.pages) if p not in self.refs]
        assert free, f"the pool of {self.paging.pages} pages is full"
        self.refs[free[0]] = 1
        self.rows[free[0]] = 0
        self.peak = max(self.peak, len(self.refs))
        self.log["allocated"].append(free[0])
        return free[0]

    def first(self, j: int) -> int:
        """Sequence j's first token still in the pool (its released blocks' tokens are gone)."""
        return self.released.get(j, 0) * self.paging.block_size

    def gather(self, j: int, tokens: int) -> tuple[FloatArray, FloatArray]:
        """Sequence j's keys and values through its block table, (Hkv, n, D): its tokens from
        ``first(j)`` (the live blocks) to ``tokens`` − 1."""
        bs, table = self.paging.block_size, self.tables[j]
        where = [table[t // bs] * bs + t % bs for t in range(self.first(j), tokens)]
        return self.K[:, where], self.V[:, where]

    def slide(self, j: int, blocks: int) -> None:
        """A window has passed every token of sequence j's first ``blocks`` logical blocks: each
        is released (FREED in its table), its page's count drops, back to the pool at 0."""
        table = self.tables[j]
        for b in range(self.released[j], blocks):
            self._drop(table[b])
            table[b] = FREED
        self.released[j] = max(self.released[j], blocks)

    def leave(self, j: int) -> None:
        """Sequence j is done: its pages' counts drop; a page no one holds goes back."""
        for page in self.tables.pop(j):
            if page != FREED:
                self._drop(page)

    def _drop(self, page: int) -> None:
        self.refs[page] -= 1
        if self.refs[page] == 0:
            del self.refs[page]
            self.log["freed"].append(page)

    def in_use(self) -> int:
        return len(self.refs)

    def record(self, tables: dict[int, tuple[int, ...]]) -> PoolStep | None:
        """The pool now (``tables``: the block tables the step read), and what changed since
        the last record (None the first time)."""
        log, self.log = self.log, {k: [] for k in ("shared", "copied", "allocated", "freed")}
        if not log:
            return None
        done = (tuple(log[k]) for k in ("shared", "copied", "allocated", "freed"))
        return PoolStep(tuple(tables.items()), tuple(sorted(self.refs.items())), *done)
