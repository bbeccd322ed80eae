"""KV-cache decoding: a prefill, then one token at a time against the cache of keys and values.

Axis names as in the pipeline: B batch, H query heads, Hkv key/value heads, T tokens (each
token sees only the ones up to it, and keys are the same tokens, S == T), D d_k, Dv d_v,
C cache slots.

A key is rotated once (``rotate``, e.g. RoPE), when it enters the cache, at its own position;
the query of a step is rotated at its position. Each step and the prefill run the one chain
(core/chain.py) over their cells: scaled -> the score modifiers -> masked -> the softmax with
the chain's extra logit. A step's cells are every batch item and head, its one query and the
cache slots (``keys`` the token each slot holds, -1 while empty). When a variant asks for a
cache of so many slots (``chain.cache_slots()``) the cache is a ring buffer: the token at
position p goes to slot p mod C, evicting the one C positions back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cached_property, partial
from typing import Any, NamedTuple

import numpy as np

from attn_cli.core.chain import Chain
from attn_cli.core.paged import PagedBugs, PagedCache, PageStep, Paging
from attn_cli.core.steps import Attention, Way, attention, nowhere
from attn_cli.core.variant import REGISTRY, Cells

FloatArray = np.ndarray[Any, np.dtype[np.floating[Any]]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]
Rotate = Callable[[FloatArray, IntArray], FloatArray]  # (x (..., n, D), positions (n,)) -> x
Finish = Callable[[FloatArray], FloatArray]  # softmax·V_cache (B, H, n, Dc) -> output (B, H, n, Dv)
# the head-output transforms (a gate) of tokens ``sl``: their output (B, H, n, Dv) -> each stage
After = Callable[[slice, FloatArray], dict[str, FloatArray]]


@dataclass(frozen=True, eq=False)
class CacheView:
    """The cache as one step saw it, without a copy: slot s holds token ``held[s]`` (-1: empty).

    ``K`` and ``V`` are the keys and values of every token by token index (B, Hkv, T, D), each
    written once when its token arrives, so a step's cache is a slice of them (a growing cache)
    or a gather (a ring buffer), made only when asked for. A loop that changes keys already
    cached (``DecodeBugs.rerotate_cache``) gives each step its own arrays: ``held`` then
    indexes nothing and ``K``, ``V`` are the cache itself (``copied``).
    """

    K: FloatArray  # (B, Hkv, T, D) by token, or (B, Hkv, C, D) when copied
    V: FloatArray  # (B, Hkv, T, Dv) or (B, Hkv, C, Dv)
    held: IntArray  # (C,) the token index each slot holds, -1 while empty
    grows: bool  # slots are tokens 0..C-1 in order: a slice, no copy
    copied: bool = False
    where: IntArray | None = None  # a paged cache: the pool row each slot reads (K, V: the pool)

    def keys(self) -> FloatArray:
        return self._slots(self.K)

    def values(self) -> FloatArray:
        return self._slots(self.V)

    def _slots(self, by_token: FloatArray) -> FloatArray:
        if self.copied:
            return by_token
        if self.where is not None:  # the gather through the block table
            paged = by_token[:, :, self.where]  # (B, Hkv, C, D)
            paged[:, :, self.held < 0] = 0  # the last page's empty slots read as zeros
            return paged
        if self.grows:
            return by_token[:, :, : self.held.size]  # (B, Hkv, C, D), a view
        out = by_token[:, :, np.maximum(self.held, 0)]  # (B, Hkv, C, D)
        out[:, :, self.held < 0] = 0  # an empty slot holds zeros
        return out

    def key_positions(self, positions: IntArray) -> IntArray:
        """The position of the token each slot holds (0 for an empty slot), (C,)."""
        if self.grows:
            return positions[: self.held.size]  # slots are tokens 0..C-1: a view
        held = self.held
        out: IntArray = np.where(held >= 0, positions[np.maximum(held, 0)], 0)
        return out


class StepTables(NamedTuple):
    """What one step computes against its cache, (B, H, 1, C) each; output (B, H, 1, Dv)."""

    scores: FloatArray
    scaled: FloatArray
    masked: FloatArray  # the last modifier's stage + biases, -inf where hidden
    softmax: FloatArray  # the kept weights (with an extra logit, less than 1)
    output: FloatArray
    modified: dict[str, FloatArray]  # each score modifier's stage (``capped``)


class _Recomputed:
    """A step's table of the same name (``step.scores``), computed again when read."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, step: DecodeStep, owner: type | None = None) -> FloatArray:
        table: FloatArray = getattr(step.attend(step), self.name)
        return table


@dataclass(frozen=True, eq=False)
class DecodeStep:
    """One generated token: its query, the cache as it is now, and the attention against it.

    A step holds its output and a view of the cache, not its score rows: ``scores``,
    ``scaled``, ``masked``, ``softmax`` and each score modifier's stage (``capped``, read as an
    attribute; None when that modifier is off) are computed again when read, by the same code
    and so to the same bits, the last step read kept (a whole decode holds O(T) numbers).
    """

    index: int  # the token's index in the sequence
    position: int  # its position (RoPE, the allowed-keys rules)
    slot: int  # the cache slot its key and value went to
    cache: CacheView
    Q: FloatArray  # (B, H, 1, D) as projected
    Q_rot: FloatArray | None  # (B, H, 1, D) rotated at the position, when rotating
    output: FloatArray  # (B, H, 1, Dv)
    attend: _Attend  # the step's tables, computed again
    latent: FloatArray | None = None  # softmax·V_cache before ``finish`` made it the output
    outs: Mapping[str, FloatArray] = field(default_factory=dict)  # the head-output transforms'
    # more score-like rows (B, H, 1, C) beside the chain's: a second map and what the maps make
    # (differential attention's scores_2, softmax_2, diff; core/decode_maps.py)
    rows: Mapping[str, FloatArray] = field(default_factory=dict)
    pages: PageStep | None = None  # a paged cache: the block table after this step

    @property
    def slots(self) -> int:
        """C, the cache length at this step."""
        return int(self.cache.held.size)

    @cached_property
    def cache_positions(self) -> tuple[int, ...]:
        """The position each slot holds, -1 when empty."""
        held = self.cache.held
        at = np.where(held >= 0, self.attend.positions[np.maximum(held, 0)], -1)  # (C,)
        return tuple(at.tolist())

    @property
    def K_cache(self) -> FloatArray:  # (B, Hkv, C, D) rotated keys, as cached
        return self.cache.keys()

    @property
    def V_cache(self) -> FloatArray:  # (B, Hkv, C, Dv)
        return self.cache.values()

    scores = _Recomputed()
    scaled = _Recomputed()
    masked = _Recomputed()
    softmax = _Recomputed()

    @property
    def modified(self) -> dict[str, FloatArray]:
        return self.attend(self).modified

    def __getattr__(self, name: str) -> FloatArray | None:
        """A score modifier's stage by its name (``step.capped``); None when it is off."""
        if name.startswith("_") or any(f.name == name for f in fields(DecodeStep)):
            raise AttributeError(name)
        if any(v.stage == name for v in REGISTRY.values()):
            return self.modified.get(name)
        raise AttributeError(name)


@dataclass(frozen=True, eq=False)
class DecodeResult:
    """The prefill of the first ``prefill`` tokens and the steps that follow."""

    prefill: int
    prefill_output: FloatArray  # (B, H, prefill, Dv), each prefill token over those up to it
    steps: tuple[DecodeStep, ...]
    prefill_outs: Mapping[str, FloatArray] = field(default_factory=dict)  # (B, H, prefill, Dv)
    paging: Paging | None = None  # the pool, when the cache is paged
    prefill_pages: PageStep | None = None  # the block table after the prefill
    # the first stage of a step that is not finite (a float64 overflow), and the step's token
    overflow: tuple[str, int] | None = None


class DecodeBugs(NamedTuple):
    """Mistakes of hand-written decode loops, for the grader to recompute (all off: correct)."""

    rerotate_cache: bool = False  # cached keys rotated again at every step
    restart_positions: bool = False  # positions counted from 0 again after the prefill
    head_tiled: bool = False  # query head h reads cache head h mod Hkv, not h // groups
    attend_before_append: bool = False  # a step attends to the cache, then caches its own k, v
    # a ring buffer this many slots bigger than the cache rules ask, trusted to hide the rest
    # (the allowed-keys rules of the variants with a cache rule left out)
    extra_slots: int = 0
    table_shift: bool = False  # paged: logical block b gathered through table[b + 1]
    global_slot: bool = False  # paged: a token's slot in its page is its global index


class _Setup(NamedTuple):
    chain: Chain
    scale: float
    positions: IntArray  # (T,)
    rotate: Rotate | None
    finish: Finish | None = None
    after: After | None = None
    paging: Paging | None = None
    rotate_q: Rotate | None = None  # the queries' own, where it differs from the keys'


def decode(
    q: FloatArray,  # (B, H, T, D)
    k: FloatArray,  # (B, Hkv, T, D)
    v: FloatArray,  # (B, Hkv, T, Dv)
    *,
    chain: Chain,
    scale: float,
    prefill: int,
    positions: Any,
    rotate: Rotate | None = None,
    finish: Finish | None = None,
    after: After | None = None,
    paging: Paging | None = None,
    rotate_q: Rotate | None = None,
) -> DecodeResult:
    """Prefill the first ``prefill`` tokens, then decode the rest one step at a time;
    ``finish`` turns softmax·V_cache (B, H, n, Dc) into the output when the cache holds
    something other than the values (MLA's latent: W_UV after attention); ``after`` gives the
    head-output transforms' stages (a gate) of each step's output; ``paging``: the cache in
    pages of a pool, read through a block table (core/paged.py); ``rotate_q``: what a query
    takes at its position where it differs from a key's ``rotate`` (a norm after RoPE with a
    weight of Q's own)."""
    setup = _setup(q, k, v, chain, scale, prefill, positions, rotate, finish, after, paging)
    setup = setup._replace(rotate_q=rotate_q or rotate)
    return _decode(q, k, v, prefill, setup, DecodeBugs())


def _setup(
    q: FloatArray,
    k: FloatArray,
    v: FloatArray,
    chain: Chain,
    scale: float,
    prefill: int,
    positions: Any,
    rotate: Rotate | None,
    finish: Finish | None = None,
    after: After | None = None,
    paging: Paging | None = None,
) -> _Setup:
    """Check the shapes and gather the options every step reads."""
    B, H, T, _ = q.shape
    Hkv = k.shape[1]
    if k.shape[:3] != (B, Hkv, T) or v.shape[:3] != (B, Hkv, T) or H % Hkv:
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape}: decoding needs S == T")
    if not 1 <= prefill <= T:
        raise ValueError(f"prefill must be 1..{T}, not {prefill}")
    pos = np.asarray(positions, dtype=np.int64).reshape(T)
    return _Setup(
        chain=chain,
        scale=scale,
        positions=pos,
        rotate=rotate,
        finish=finish,
        after=after,
        paging=paging,
        rotate_q=rotate,
    )


def _decode(
    q: FloatArray, k: FloatArray, v: FloatArray, prefill: int, setup: _Setup, bugs: DecodeBugs
) -> DecodeResult:
    """The prefill, the cache it leaves, and one step per remaining token."""
    T = q.shape[2]
    pos = setup.positions
    k_rot, q_pre = k[:, :, :prefill], q[:, :, :prefill]
    if setup.rotate_q is not None:
        q_pre = setup.rotate_q(q_pre, pos[:prefill])  # (B, H, P, D)
    if setup.rotate is not None:
        k_rot = setup.rotate(k_rot, pos[:prefill])  # (B, Hkv, P, D)
    prefill_output, overflow = _prefill(q_pre, k_rot, v[:, :, :prefill], setup)
    if setup.finish is not None:
        prefill_output = setup.finish(prefill_output)
    prefill_outs = {} if setup.after is None else setup.after(slice(0, prefill), prefill_output)
    ring = setup.chain.cache_slots()
    cache: _Cache | _Paged
    if setup.paging is None:
        cache = _Cache.empty(k, v, None if ring is None else ring + bugs.extra_slots)
    else:
        cache = _Paged(
            PagedCache.empty(
                k, v, setup.paging, pos, ring, PagedBugs(bugs.table_shift, bugs.global_slot)
            )
        )
    for i in range(prefill):
        cache.put(i, int(pos[i]), k_rot[:, :, i], v[:, :, i])
    prefill_pages = cache.record()
    attend = _Attend(setup, bugs)
    steps = []
    for i in range(prefill, T):
        rot_pos = pos[i - prefill] if bugs.restart_positions else pos[i]
        if bugs.rerotate_cache and setup.rotate is not None:
            cache.rerotate(setup.rotate, pos)
        k_new = k[:, :, i : i + 1]  # (B, Hkv, 1, D)
        q_new = q[:, :, i : i + 1]  # (B, H, 1, D), a view
        q_rot = None
        if setup.rotate is not None:
            k_new = setup.rotate(k_new, np.array([rot_pos]))
        if setup.rotate_q is not None:
            q_rot = setup.rotate_q(q_new, np.array([rot_pos]))
        if bugs.attend_before_append:  # the cache as it was: the token does not see itself
            view = cache.view()
            tables = attend.compute(i, q_new if q_rot is None else q_rot, view)
            slot = cache.put(i, int(pos[i]), k_new[:, :, 0], v[:, :, i])
        else:
            slot = cache.put(i, int(pos[i]), k_new[:, :, 0], v[:, :, i])
            view = cache.view()
            tables = attend.compute(i, q_new if q_rot is None else q_rot, view)
        output, latent = tables.output, None
        if setup.finish is not None:
            output, latent = setup.finish(tables.output), tables.output
        outs = {} if setup.after is None else setup.after(slice(i, i + 1), output)
        steps.append(
            DecodeStep(
                i,
                int(pos[i]),
                slot,
                view,
                q_new,
                q_rot,
                output,
                attend,
                latent,
                outs,
                pages=cache.record(),
            )
        )
        if overflow is None:
            overflow = _not_finite(tables, i)
    return DecodeResult(
        prefill, prefill_output, tuple(steps), prefill_outs, setup.paging, prefill_pages, overflow
    )


def _not_finite(tables: StepTables, i: int) -> tuple[str, int] | None:
    """The first of a step's stages that holds a value that is not finite (masked: +inf or
    nan; -inf is its fill), with the step's token; None when every one is finite."""
    named = [("scores", tables.scores), ("scaled", tables.scaled), *tables.modified.items()]
    return _first_not_finite(named, tables.masked, tables.output, i)


def _first_not_finite(
    named: list[tuple[str, FloatArray]], masked: FloatArray, output: FloatArray, first: int
) -> tuple[str, int] | None:
    """The first stage of ``named``, then masked and the output, (B, H, n, ·) each, that holds
    a value that is not finite, with the token of its first such row (rows from ``first``)."""
    with np.errstate(over="ignore", invalid="ignore"):  # a sum of huge finite values is inf
        for stage, x in [*named, ("masked", masked), ("output", output)]:
            total = float(x.sum())  # one pass: finite (masked: or its -inf fill) when all are
            if math.isfinite(total) or (stage == "masked" and total == -math.inf):
                continue
            bad = np.isnan(x) | np.isposinf(x) if stage == "masked" else ~np.isfinite(x)
            if bad.any():
                return stage, first + int(np.argwhere(bad)[0][2])
    return None


@dataclass(eq=False)
class _Cache:
    """Every token's key and value, by token index, and which token each slot holds."""

    K: FloatArray  # (B, Hkv, T, D); with rerotate_cache, the slots themselves (B, Hkv, C, D)
    V: FloatArray  # (B, Hkv, T, Dv)
    held: IntArray  # (C,) token indices, -1: empty
    ring: int | None  # ring buffer size, None: the cache grows
    copied: bool = False  # each step has its own arrays (a loop that changes cached keys)
    tokens: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))  # 0..T-1, sliced

    @classmethod
    def empty(cls, k: FloatArray, v: FloatArray, ring: int | None) -> _Cache:
        B, Hkv, T, D = k.shape
        K = np.zeros((B, Hkv, T, D), k.dtype)
        V = np.zeros((B, Hkv, T, v.shape[3]), v.dtype)
        held = np.zeros(0, np.int64) if ring is None else np.full(ring, -1, np.int64)
        return cls(K, V, held, ring, tokens=np.arange(T, dtype=np.int64))

    def put(self, index: int, position: int, k: FloatArray, v: FloatArray) -> int:
        """Write one token's key and value (B, Hkv, D) and return its slot."""
        if self.ring is None:
            slot = self.held.size
            self.held = self.tokens[: slot + 1]  # a view: tokens 0..slot, in their slots
        else:
            slot = position % self.ring
            self.held = self.held.copy()  # the steps already taken keep the slots they saw
            self.held[slot] = index
        if self.copied:
            self.K, self.V = self._grown(self.K, slot), self._grown(self.V, slot)
            self.K[:, :, slot], self.V[:, :, slot] = k, v
        else:
            self.K[:, :, index], self.V[:, :, index] = k, v
        return slot

    def _grown(self, x: FloatArray, slot: int) -> FloatArray:
        """A copy with room for ``slot``, so that the steps already taken keep theirs."""
        grown: FloatArray = (
            x.copy()
            if slot < x.shape[2]
            else np.concatenate([x, np.zeros_like(x[:, :, :1])], axis=2)
        )
        return grown

    def view(self) -> CacheView:
        return CacheView(self.K, self.V, self.held, self.ring is None, self.copied)

    def record(self) -> None:
        return None  # a contiguous cache has no block table

    def rerotate(self, rotate: Rotate, positions: IntArray) -> None:
        """The classic bug: rotate the (already rotated) cached keys again at their positions.
        From then on each step holds its own copy of the slots."""
        if not self.copied:
            view = self.view()
            self.K, self.V = view.keys().copy(), view.values().copy()
            self.copied = True
        full = self.held >= 0
        self.K = self.K.copy()
        self.K[:, :, full] = rotate(self.K[:, :, full], positions[self.held[full]])


@dataclass(eq=False)
class _Paged:
    """A paged cache (core/paged.py) as the loop writes and reads a cache."""

    pool: PagedCache

    def put(self, index: int, position: int, k: FloatArray, v: FloatArray) -> int:
        """Write one token's key and value (B, Hkv, D); return its slot in the gathered cache."""
        self.pool.put(index, k, v)
        _, held = self.pool.gather()
        return int(np.flatnonzero(held == index)[0])

    def view(self) -> CacheView:
        where, held = self.pool.gather()
        return CacheView(self.pool.K, self.pool.V, held, False, where=where)

    def record(self) -> PageStep:
        return self.pool.record()

    def rerotate(self, rotate: Rotate, positions: IntArray) -> None:
        """The classic bug in a pool: every cached key rotated again, in a copy."""
        where, held = self.pool.gather()
        full = held >= 0
        self.pool.K = self.pool.K.copy()
        rows = where[full]
        self.pool.K[:, :, rows] = rotate(self.pool.K[:, :, rows], positions[held[full]])


class _Attend:
    """A step's attention against its cache: scores, scaled, the chain, softmax, output; the
    tables of the last step asked for are kept (a view reads them stage by stage)."""

    def __init__(self, setup: _Setup, bugs: DecodeBugs) -> None:
        self.setup, self.bugs = setup, bugs
        self.positions = setup.positions
        self.tokens = np.arange(setup.positions.size)
        self.rows: tuple[IntArray, IntArray] | None = None  # np.arange(B), np.arange(H)
        self.last: tuple[DecodeStep | None, StepTables | None] = (None, None)

    def __call__(self, step: DecodeStep) -> StepTables:
        held_step, tables = self.last
        if held_step is not step or tables is None:
            tables = self.compute(
                step.index, step.Q if step.Q_rot is None else step.Q_rot, step.cache
            )
            self.last = (step, tables)
        return tables

    def compute(self, i: int, q: FloatArray, cache: CacheView) -> StepTables:
        """Token i's query (B, H, 1, D) against ``cache``; a value that is not finite is found
        by ``_not_finite`` (DecodeResult.overflow), not warned about, here and when a view asks
        for a step's tables again."""
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            return self._compute(i, q, cache)

    def _compute(self, i: int, q: FloatArray, cache: CacheView) -> StepTables:
        setup, bugs = self.setup, self.bugs
        K, V = cache.keys(), cache.values()  # (B, Hkv, C, D), (B, Hkv, C, Dv)
        B, H = q.shape[:2]
        tiled = np.arange(H) % K.shape[1] if bugs.head_tiled else None
        pos = setup.positions
        held = cache.held  # (C,) token indices, -1 for empty slots: the chain hides those
        if self.rows is None or self.rows[0].size != B or self.rows[1].size != H:
            self.rows = (np.arange(B), np.arange(H))
        cells = Cells(
            *self.rows, self.tokens[i : i + 1], held, pos[i : i + 1], cache.key_positions(pos)
        )
        chain = setup.chain.without_cache_rules() if bugs.extra_slots else setup.chain
        made = attend_cells(chain, q, K, V, cells, setup.scale, tiled)
        assert made.scores is not None and made.scaled is not None and made.masked is not None
        assert made.weights is not None and made.output is not None
        return StepTables(
            made.scores, made.scaled, made.masked, made.weights, made.output, made.modified
        )


# A product of a few rows over a long inner axis (a decode step's weights, g rows, times the
# cached values) is computed as (yᵀ·xᵀ)ᵀ: the same sums, and OpenBLAS's kernel for few rows
# is slower (g = 4, d_v 64, 1,024 cached tokens: 74 against 55 µs; the same bits, measured).
FEW_ROWS = 16
LONG_INNER = 128


def grouped(x: FloatArray, y: FloatArray, tiled: IntArray | None = None) -> FloatArray:
    """x (B, H, n, a) @ y (B, Hkv, a, b) with query head h reading kv head h // (H/Hkv), as
    one product per kv head over its group's rows (no kv head copied H/Hkv times); ``tiled``:
    the kv head each query head reads instead (a mistake's), gathered."""
    B, H, n, a = x.shape
    Hkv = y.shape[1]
    if tiled is not None:
        out: FloatArray = x @ y[:, tiled]
        return out
    g = H // Hkv
    rows = x.reshape(B, Hkv, g * n, a)
    if g * n <= FEW_ROWS and a >= LONG_INNER:  # a step's softmax · V_cache
        out = (y.swapaxes(-1, -2) @ rows.swapaxes(-1, -2)).swapaxes(-1, -2)
    else:
        out = rows @ y  # (B, Hkv, g*n, b)
    return out.reshape(B, H, n, y.shape[3])


def attend_cells(
    chain: Chain,
    q: FloatArray,  # (B, H, n, D)
    k: FloatArray,  # (B, Hkv, C, D)
    v: FloatArray,  # (B, Hkv, C, Dv)
    cells: Cells,
    scale: float,
    tiled: IntArray | None = None,
    hidden: BoolArray | None = None,
) -> Attention:
    """The one chain (steps.attention) over a step's cells (B, H, n, C), products by
    :func:`grouped`: each modifier's stage an array of its own, -inf where not allowed (and
    where ``hidden``), the softmax with the chain's extra logit."""
    way = GROUPED
    if tiled is not None:  # a mistake's: each query head reads the kv head tiled says
        way = replace(way, product=partial(_scores, tiled=tiled), mix=partial(grouped, tiled=tiled))
    shape, dtype = (*q.shape[:3], k.shape[2]), q.dtype
    fresh = chain.stages  # each modifier's stage an array of its own (a step keeps them)

    def into(stage: str) -> FloatArray | None:
        return np.empty(shape, dtype) if stage in fresh else None

    where = into if chain.modifiers else nowhere
    return attention(chain, q, k, v, cells, dtype.type(scale), way, into=where, hidden=hidden)


def _scores(q: FloatArray, k: FloatArray, tiled: IntArray | None = None) -> FloatArray:
    """scores = Q Kᵀ, query head h reading kv head h // (H/Hkv): (B, H, n, C)."""
    return grouped(q, k.swapaxes(-1, -2), tiled)


GROUPED = Way(product=_scores, mix=grouped, fill=-np.inf)  # a decode loop's way


def _prefill(
    q: FloatArray, k: FloatArray, v: FloatArray, setup: _Setup
) -> tuple[FloatArray, tuple[str, int] | None]:
    """Each prefill token attending to those up to it (q and k already rotated): (B, H, P, Dv),
    and the first of its stages that is not finite (``_first_not_finite``), if one is."""
    B, H, P = q.shape[:3]
    tokens, pos = np.arange(P), setup.positions[:P]
    cells = Cells(np.arange(B), np.arange(H), tokens, tokens, pos, pos)
    later = np.triu(np.ones((P, P), dtype=bool), 1)  # key j > query i: not in the cache yet
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        made = attend_cells(setup.chain, q, k, v, cells, setup.scale, hidden=later)
    assert made.scores is not None and made.scaled is not None and made.masked is not None
    assert made.output is not None  # (B, H, P, Dv)
    named = [("scores", made.scores), ("scaled", made.scaled), *made.modified.items()]
    return made.output, _first_not_finite(named, made.masked, made.output, 0)


def self_check(result: DecodeResult, full_output: FloatArray, stage: str = "output") -> list[float]:
    """The largest |step's ``stage`` - full row| of each step; full is (B?, H, T, Dv); ``stage``
    the output or a head-output transform's (``gated``)."""
    full = full_output if full_output.ndim == 4 else full_output[None]  # (B, H, T, Dv)
    return [
        float(np.abs(step_out(s, stage)[:, :, 0] - full[:, :, s.index]).max()) for s in result.steps
    ]


def step_out(step: DecodeStep, stage: str) -> FloatArray:
    """A step's output, or the stage of a head-output transform (``gated``) made from it."""
    return step.outs.get(stage, step.output)


class KVCacheBytes(NamedTuple):
    """Bytes of K and V cache per token per layer, for this model, MHA and MQA, and for seq."""

    kv_heads: int
    heads: int
    seq: int
    per_token: int  # kv_heads * (d_k + d_v) * itemsize
    per_token_mha: int  # kv_heads = heads
    per_token_mqa: int  # kv_heads = 1
    total: int  # per_token * seq
    total_mha: int
    total_mqa: int
    latent: int | None = None  # numbers per token of a latent cache (MLA's), None: K and V


def kv_cache_bytes(
    kv_heads: int,
    heads: int,
    d_k: int,
    d_v: int,
    itemsize: int,
    seq: int,
    latent: int | None = None,
) -> KVCacheBytes:
    """What the cache costs: K and V (kv_heads * d_k and kv_heads * d_v numbers) per token, or
    ``latent`` numbers per token (MLA's c_KV and RoPE key, for every head), against the same
    heads' K and V in MHA and MQA."""

    def per_token(n: int) -> int:
        return n * (d_k + d_v) * itemsize

    own = per_token(kv_heads) if latent is None else latent * itemsize
    return KVCacheBytes(
        kv_heads=kv_heads,
        heads=heads,
        seq=seq,
        per_token=own,
        per_token_mha=per_token(heads),
        per_token_mqa=per_token(1),
        total=own * seq,
        total_mha=per_token(heads) * seq,
        total_mqa=per_token(1) * seq,
        latent=latent,
    )


@dataclass(frozen=True, eq=False)
class DecodeMistake:
    """What a decode loop with one named mistake returns, to match against a user's dump."""

    name: str
    description: str
    result: DecodeResult


def decode_mistakes(
    q: FloatArray,
    k: FloatArray,
    v: FloatArray,
    *,
    chain: Chain,
    scale: float,
    prefill: int,
    positions: Any,
    rotate: Rotate | None = None,
    finish: Finish | None = None,
    after: After | None = None,
    paging: Paging | None = None,
    extra: Sequence[tuple[str, str, DecodeBugs]] = (),
    rotate_q: Rotate | None = None,
) -> tuple[DecodeMistake, ...]:
    """Each named mistake of the loop that can apply here (RoPE, GQA, a paged cache),
    recomputed; then each of ``extra`` (name, description, bugs): the variants' own
    (check/mistakes/)."""
    setup = _setup(q, k, v, chain, scale, prefill, positions, rotate, finish, after, paging)
    setup = setup._replace(rotate_q=rotate_q or rotate)
    candidates = (
        (
            "rerotate_cache",
            "cached keys rotated again at every step",
            DecodeBugs(rerotate_cache=True),
            rotate is not None,
        ),
        (
            "restart_positions",
            "positions restarted at 0 after the prefill",
            DecodeBugs(restart_positions=True),
            rotate is not None,
        ),
        (
            "cache_by_query_head",
            "cache read by query head (h mod kv_heads), not h // groups",
            DecodeBugs(head_tiled=True),
            q.shape[1] != k.shape[1],
        ),
        (
            "block_table_off_by_one",
            "logical block b gathered through block_table[b + 1]",
            DecodeBugs(table_shift=True),
            paging is not None,
        ),
        (
            "page_slot_from_global_position",
            "a token's slot in its page taken as its global index, not index mod block_size",
            DecodeBugs(global_slot=True),
            paging is not None,
        ),
        (
            "attend_before_append",
            "attended to the cache before appending the step's own key "
            "and value (the new token does not see itself)",
            DecodeBugs(attend_before_append=True),
            True,
        ),
        *((name, description, bugs, True) for name, description, bugs in extra),
    )
    return tuple(
        DecodeMistake(name, description, _decode(q, k, v, prefill, setup, bugs))
        for name, description, bugs, applies in candidates
        if applies
    )
