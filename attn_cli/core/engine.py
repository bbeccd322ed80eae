"""The block engine: the score stages of attention a block of query rows at a time.

It runs the step functions of steps.py (scores, scaled, the score modifiers, the bias stages,
masked, softmax with its lse, output) on one block of query rows of one head at a time. A stage
that is kept is written straight into its whole array; a stage that is only passed through lives
in one reused block buffer (a bias stage in one block of its own). So a run that keeps only
``output`` never holds a (T, S) matrix, whatever the variants. Axis names as in steps.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from attn_cli.blas import blas_limit
from attn_cli.core.blocks import rows_per_block
from attn_cli.core.chain import Chain, cells_of
from attn_cli.core.stages import SCORE_STAGES
from attn_cli.core.steps import (
    BoolArray,
    FloatArray,
    attention_scores,
    scale_scores,
    softmax_rows,
    weighted_sum,
)
from attn_cli.core.variant import Cells
from attn_cli.errors import ComputeError

if TYPE_CHECKING:
    from collections.abc import Callable

    from attn_cli.core.inputs import Inputs

SCORES_AXES = ("batch", "head", "query", "key")
OUTPUT_AXES = ("batch", "head", "query", "d_v")


class SentinelRow(NamedTuple):
    """A row where a finite ``mask_value`` let weight through to keys it should hide.

    ``leaked`` is the weight those keys got; ``uniform`` says the row had no allowed key at all,
    so the sentinel made it uniform (with -inf its weights would be zero).
    """

    batch: int
    head: int
    query: int
    leaked: float
    uniform: bool


@dataclass
class Attended:
    """What the engine produced: kept score stages, lse, the output, and rows to warn about."""

    kept: dict[str, FloatArray]  # (B, H, T, S) each
    output: FloatArray | None  # (B, H, T, Dv), laid out as (B, T, H, Dv) so concat is a view
    lse: FloatArray | None = None  # (B, H, T)
    empty: list[tuple[int, int, int]] = field(default_factory=list)  # (batch, head, query)
    leaks: list[SentinelRow] = field(default_factory=list)


class Block(NamedTuple):
    """Query rows t0:t1 of head h in batch item b."""

    b: int
    h: int
    t0: int
    t1: int


class BlockEngine:
    """Runs scores -> scaled -> modifiers -> masked (+ bias stages) -> softmax (+ lse) -> output."""

    def __init__(
        self,
        inputs: Inputs,
        q: FloatArray,  # (B, H, T, D)
        k: FloatArray,  # (B, Hkv, S, D)
        v: FloatArray | None,  # (B, Hkv, S, Dv), None when the output is not needed
        scale: float,
        bias: FloatArray | None,  # broadcastable to (B, H, T, S)
        need: set[str],
        wanted: set[str],
        check: FiniteCheck,
    ) -> None:
        self.inputs, self.q, self.k, self.v = inputs, q, k, v
        self.scale, self.need, self.check = scale, need, check
        B, H, T, _ = q.shape
        S = k.shape[2]
        self.groups = H // k.shape[1]  # query head h reads kv head h // groups
        full = (B, H, T, S)
        self.kept = {s: np.empty(full, q.dtype) for s in SCORE_STAGES if s in wanted}
        self.lse = np.empty((B, H, T), q.dtype) if "lse" in wanted else None
        self.rows = rows_per_block(T, S, q.dtype.itemsize)  # measured: see core/blocks.py
        own = set(Chain(inputs).bias_stages)  # a bias stage has its own block (kept_block)
        chain = {"scores", *(s for s in SCORE_STAGES if s in need and s not in own)}
        self.work = None if chain <= set(self.kept) else np.empty((self.rows, S), q.dtype)
        self.leaky = inputs.mask_value != -np.inf  # a finite sentinel: watch for leaks
        self.output = None
        if "output" in need:
            assert v is not None
            layout = np.empty((B, T, H, v.shape[3]), q.dtype)  # (B, T, H, Dv)
            self.output = layout.transpose(0, 2, 1, 3)  # (B, H, T, Dv): concat is a view
        self.chain = Chain(inputs if bias is None else replace(inputs, bias=bias))
        self.must_check = self._overflow_possible()

    def blocks(self) -> list[Block]:
        """Every block, batch item by head by query rows."""
        B, H, T = self.q.shape[:3]
        return [
            Block(b, h, t0, min(T, t0 + self.rows))
            for b in range(B)
            for h in range(H)
            for t0 in range(0, T, self.rows)
        ]

    def run(self, progress: Callable[[int, int], None] | None = None) -> Attended:
        """All blocks in order; ``progress(done, total)`` after each. (The run that calls this
        sets BLAS's threads for all its products: pipeline.run.)"""
        attended = Attended(self.kept, self.output, self.lse)
        blocks = self.blocks()
        for done, block in enumerate(blocks, 1):
            self.run_block(block, attended)
            if progress is not None:
                progress(done, len(blocks))
        return attended

    def stream(self, stage: str, attended: Attended | None = None) -> Iterator[FloatArray]:
        """The (R, S) blocks of ``stage``, the last step this engine runs, in (b, h, t) order.

        Each block lives in the reused work buffer: it is valid until the next is asked for.
        """
        assert stage not in self.kept and self.output is None, "a streamed stage is not kept"
        attended = Attended(self.kept, self.output, self.lse) if attended is None else attended
        with blas_limit(self.k.shape[2]):
            for block in self.blocks():
                self.run_block(block, attended)
                yield self.into(stage, block)

    def run_block(self, blk: Block, attended: Attended) -> None:
        """The score stages for one block, each written where :meth:`into` says; the chain's
        arrays are (1, 1, R, S) views of the block."""
        at = (blk.b, blk.h, blk.t0)
        k = self.k[blk.b, blk.h // self.groups]  # (S, D)
        x = attention_scores(self.q[blk.b, blk.h, blk.t0 : blk.t1], k, out=self.into("scores", blk))
        self._check("scores", x, at)  # (R, S)
        x = x[None, None]  # (1, 1, R, S)
        if "scaled" in self.need:
            x = scale_scores(x, self.scale, out=self.into4("scaled", blk))
            self._check("scaled", x[0, 0], at)
        x = self.chain.modify(x, lambda st: self.into4(st, blk) if st in self.need else None)
        allowed = None
        cells = self.cells(blk)
        if "masked" in self.need:
            into = partial(self.kept_block, blk)
            x, allowed, terms = self.chain.masked(x, cells, self.into4("masked", blk), into)
            if self.must_check["masked"]:
                self.check.block("masked", x[0, 0], at, _where(allowed, x), _meant(terms, x))
        if "softmax" in self.need or "lse" in self.need:
            sink = self.chain.extra_logit(cells, x.dtype)
            lse = None
            if self.lse is not None:
                lse = self.lse[blk.b : blk.b + 1, blk.h : blk.h + 1, blk.t0 : blk.t1]  # (1, 1, R)
            x, none = softmax_rows(x, out=self.into4("softmax", blk), sink=sink, lse=lse)
            attended.empty.extend((blk.b, blk.h, blk.t0 + int(i)) for i in np.flatnonzero(none))
            if self.leaky and allowed is not None:
                where = _where(allowed, x)
                assert where is not None
                attended.leaks.extend(_leaks(x[0, 0], where, at))
        if self.output is not None:
            assert self.v is not None
            v = self.v[blk.b, blk.h // self.groups]  # (S, Dv)
            o = weighted_sum(x[0, 0], v, out=self.output[blk.b, blk.h, blk.t0 : blk.t1])  # (R, Dv)
            self._check("output", o, at)

    def cells(self, blk: Block) -> Cells:
        """The block's cells: batch item b, head h, query rows t0:t1, every key."""
        b, h = slice(blk.b, blk.b + 1), slice(blk.h, blk.h + 1)
        return cells_of(self.inputs, b, h, slice(blk.t0, blk.t1))

    def kept_block(self, blk: Block, stage: str) -> FloatArray | None:
        """A kept stage's (1, 1, R, S) block, or None when the stage is not kept."""
        if stage not in self.kept:
            return None
        return self.kept[stage][blk.b : blk.b + 1, blk.h : blk.h + 1, blk.t0 : blk.t1]

    def into4(self, stage: str, blk: Block) -> FloatArray:
        """:meth:`into` as a (1, 1, R, S) view, as the chain's hooks see a block."""
        return self.into(stage, blk)[None, None]

    def into(self, stage: str, blk: Block) -> FloatArray:
        """Where a stage's block goes: its kept array, else the reused work buffer."""
        if stage in self.kept:
            return self.kept[stage][blk.b, blk.h, blk.t0 : blk.t1]
        assert self.work is not None
        return self.work[: blk.t1 - blk.t0]

    def _check(self, stage: str, x: FloatArray, at: tuple[int, int, int]) -> None:
        if self.must_check[stage]:
            self.check.block(stage, x, at)

    def _overflow_possible(self) -> dict[str, bool]:
        """Which stages could overflow: none while |q|·|k|·scale (+ the biases) stays small.

        By Cauchy-Schwarz a score is at most the product of the largest row norms, so the
        element-wise checks run only for inputs that big. A modifier bounds what it returns
        (a capped score is at most the cap).
        """
        big = float(np.finfo(self.q.dtype).max) / 4
        qk = _max_norm(self.q) * _max_norm(self.k)
        logits = self.chain.bound_logits(qk * self.scale)
        added = self.chain.bound_biases()
        return {
            "scores": not qk < big,
            "scaled": not qk * self.scale < big,
            "masked": added > 0 and not logits + added < big,
            "output": self.v is not None and not _max_abs(self.v) < big,
        }


def _where(allowed: BoolArray | None, x: FloatArray) -> BoolArray | None:
    """A block's allowed cells as (R, S), from the chain's (1, 1, R, S)-broadcastable array."""
    return None if allowed is None else np.broadcast_to(allowed, x.shape)[0, 0]


def _meant(terms: list[FloatArray], x: FloatArray) -> BoolArray | None:
    """Where a bias put -inf on purpose, (R, S); None when no bias did."""
    meant = None
    for term in terms:
        neginf = np.isneginf(np.broadcast_to(term, x.shape)[0, 0])
        meant = neginf if meant is None else meant | neginf
    return meant


def _leaks(weights: FloatArray, allowed: BoolArray, at: tuple[int, int, int]) -> list[SentinelRow]:
    """The rows of a block whose hidden keys got weight (a finite sentinel let it through)."""
    hidden: BoolArray = ~np.broadcast_to(allowed, weights.shape)  # (R, S)
    leaked = np.where(hidden, weights, 0.0).sum(axis=-1)  # (R,)
    uniform = np.asarray(hidden.all(axis=-1))  # (R,)
    b, h, t0 = at
    return [
        SentinelRow(b, h, t0 + int(i), float(leaked[i]), bool(uniform[i]))
        for i in np.flatnonzero(leaked > 0)
    ]


def _max_norm(x: FloatArray) -> float:
    """The largest Euclidean norm of a row (last axis), computed in float64 (einsum casts as
    it goes: no float64 copy of a float32 Q, which would be the run's largest array)."""
    squares = np.einsum("...d,...d->...", x, x, dtype=np.float64)
    return float(np.sqrt(squares.max(initial=0.0)))


def _max_abs(x: FloatArray) -> float:
    """The largest |value| without an |x| copy of the array; NaN if there is one."""
    if x.size == 0:
        return 0.0
    return float(np.maximum(np.abs(x.max()), np.abs(x.min())))


def _max_finite(x: FloatArray) -> float:
    return _max_abs(x[np.isfinite(x)])


class FiniteCheck:
    """Raise ComputeError at the first non-finite value of a stage, naming its position."""

    def __init__(self, inputs: Inputs, dtype: str) -> None:
        self.inputs = inputs
        self.dtype = dtype

    def __call__(self, stage: str, arr: FloatArray, axes: tuple[str, ...]) -> FloatArray:
        if not np.isfinite(arr.sum()):  # one pass, no temporary; exact search only on failure
            bad = ~np.isfinite(arr)
            if bad.any():
                self.fail(stage, arr, axes, tuple(int(i) for i in np.argwhere(bad)[0]))
        return arr

    def block(
        self,
        stage: str,
        x: FloatArray,
        at: tuple[int, int, int],
        allowed: BoolArray | None = None,
        meant: BoolArray | None = None,
    ) -> None:
        """Check one (R, S) block of a score stage whose rows start at (batch, head, query);
        in `masked` -inf is meant where a key is not ``allowed`` and where a bias is -inf
        (``meant``)."""
        bad = ~np.isfinite(x)
        if allowed is not None:
            bad &= allowed
        if meant is not None:
            bad &= ~meant
        if bad.any():
            i, j = (int(n) for n in np.argwhere(bad)[0])
            b, h, t0 = at
            axes = SCORES_AXES if stage != "output" else OUTPUT_AXES
            self.fail(stage, x, axes, (b, h, t0 + i, j), value=x[i, j])

    def fail(
        self,
        stage: str,
        arr: FloatArray,
        axes: tuple[str, ...],
        pos: tuple[int, ...],
        value: Any = None,
        shape: tuple[int, ...] | None = None,
    ) -> None:
        """Raise the ComputeError for ``pos`` along ``axes``; ``shape`` is given for an input
        that broadcasts (a bias (1, S) holds one row for every query)."""
        value = arr[pos] if value is None else value
        sizes: tuple[int | None, ...] = (None,) * len(pos) if shape is None else shape
        if not self.inputs.has_batch and axes[0] == "batch" and len(axes) == len(pos) > 1:
            axes, pos, sizes = axes[1:], pos[1:], sizes[1:]
        where = ", ".join(self._label(*a) for a in zip(axes, pos, sizes, strict=True))
        raise ComputeError(
            self.inputs.source,
            f"{stage}[{where}]",
            f"is {value} ({self.dtype} overflow)",
            "finite values; scale the inputs down",
        )

    def _label(self, axis: str, i: int, size: int | None = None) -> str:
        labels = {"query": self.inputs.tokens, "key": self.inputs.key_tokens}.get(axis)
        if size == 1 and labels is not None and len(labels) > 1:
            return f"every {axis}"  # broadcast: the one value serves them all
        if labels and i < len(labels):
            return f"{axis} {i} {labels[i]!r}"
        return f"{axis} {i}"
