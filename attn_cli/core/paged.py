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
        cls, k: FloatArray, v: FloatArray, paging: Paging, positions: IntArray,
        reach: int | None, bugs: PagedBugs | None = None,
    ) -> PagedCache:  # fmt: skip
        B, Hkv, _, D = k.shape
        rows = paging.pages * paging.block_size
        K = np.zeros((B, Hkv, rows, D), k.dtype)  # (B, Hkv, N·bs, D)
        V = np.zeros((B, Hkv, rows, v.shape[3]), v.dtype)  # (B, Hkv, N·bs, Dv)
        return cls(K, V, paging, positions, reach, bugs or PagedBugs(),
                   free=list(range(paging.pages)))  # fmt: skip

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
        step = PageStep(tuple(self.table), tuple(placed), tuple(taken), tuple(released),
                        len(live), self.count - first * self.paging.block_size)  # fmt: skip
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
        block_size=bs, pages=paging.pages, pages_used=used, per_token=per_token,
        pool=paging.pages * bs * per_token, used=used * bs * per_token,
        contiguous=kept * per_token, waste=empty * per_token, waste_slots=empty,
    )  # fmt: skip
