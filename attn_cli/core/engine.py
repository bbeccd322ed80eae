"""The block engine: the score stages of attention a block of query rows at a time.

It runs the one chain (steps.attention: scores, scaled, the score modifiers, the bias stages,
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
    Attention,
    BoolArray,
    FloatArray,
    Way,
    attention,
    attention_scores,
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
        self.own = own = set(Chain(inputs).bias_stages)  # a bias stage has its own block
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
        self.runs = {*need, *(("softmax",) if "lse" in need else ())}  # the chain's steps
        if self.output is None:
            self.runs.discard("output")

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
        """The score stages for one block through the one chain (steps.attention), each
        written where :meth:`block_into` says; the chain's arrays are (1, 1, R, S) views of the
        block."""
        cells = self.cells(blk)
        lse = None
        if self.lse is not None:
            lse = self.lse[blk.b : blk.b + 1, blk.h : blk.h + 1, blk.t0 : blk.t1]  # (1, 1, R)
        q = self.q[blk.b, blk.h, blk.t0 : blk.t1]  # (R, D)
        k = self.k[blk.b, blk.h // self.groups]  # (S, D)
        v = None if self.v is None else self.v[blk.b, blk.h // self.groups]  # (S, Dv)
        into = partial(self.block_into, blk)
        way = Way(
            product=lambda q, k: attention_scores(q, k, out=self.into("scores", blk))[None, None],
            mix=lambda w, v: weighted_sum(w[0, 0], v, out=self.output_rows(blk)),  # (R, Dv)
            runs=self.runs,
            check=partial(self._check, (blk.b, blk.h, blk.t0)),
        )
        made = attention(self.chain, q, k, v, cells, self.scale, way, into=into, lse=lse)
        if made.empty is not None:
            attended.empty.extend(
                (blk.b, blk.h, blk.t0 + int(i)) for i in np.flatnonzero(made.empty)
            )
        if self.leaky and made.allowed is not None and made.weights is not None:
            where = _where(made.allowed, made.weights)
            assert where is not None
            attended.leaks.extend(_leaks(made.weights[0, 0], where, (blk.b, blk.h, blk.t0)))

    def block_into(self, blk: Block, stage: str) -> FloatArray | None:
        """Where the chain writes a stage's (1, 1, R, S) block: a bias stage's kept block; a
        chain stage's kept block, else the reused work buffer; None for a modifier's stage that
        is not needed (the hook makes a new array)."""
        if stage in self.own:
            return self.kept_block(blk, stage)
        if stage in self.need or stage in ("scores", "scaled", "masked", "softmax"):
            return self.into(stage, blk)[None, None]
        return None

    def output_rows(self, blk: Block) -> FloatArray:
        """The block's rows of the output, (R, Dv)."""
        assert self.output is not None
        rows: FloatArray = self.output[blk.b, blk.h, blk.t0 : blk.t1]
        return rows

    def cells(self, blk: Block) -> Cells:
        """The block's cells: batch item b, head h, query rows t0:t1, every key."""
        b, h = slice(blk.b, blk.b + 1), slice(blk.h, blk.h + 1)
        return cells_of(self.inputs, b, h, slice(blk.t0, blk.t1))

    def kept_block(self, blk: Block, stage: str) -> FloatArray | None:
        """A kept stage's (1, 1, R, S) block, or None when the stage is not kept."""
        if stage not in self.kept:
            return None
        return self.kept[stage][blk.b : blk.b + 1, blk.h : blk.h + 1, blk.t0 : blk.t1]

    def into(self, stage: str, blk: Block) -> FloatArray:
        """Where a stage's block goes: its kept array, else the reused work buffer."""
        if stage in self.kept:
            return self.kept[stage][blk.b, blk.h, blk.t0 : blk.t1]
        assert self.work is not None
        return self.work[: blk.t1 - blk.t0]

    def _check(self, at: tuple[int, int, int], stage: str, x: FloatArray, made: Attention) -> None:
        """The finite check of a stage's block, (1, 1, R, S) or the output's (R, Dv), when its
        values could overflow; in `masked` -inf is meant where not allowed or a bias put it."""
        if not self.must_check.get(stage, False):
            return
        if stage == "masked":
            where, meant = _where(made.allowed, x), _meant(made.terms, x)
            self.check.block(stage, x[0, 0], at, where, meant)
        else:
            self.check.block(stage, x if x.ndim == 2 else x[0, 0], at)

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
