"""The block engine: steps 2-6 of attention a block of query rows at a time, to save memory.

It runs the same step functions as :func:`attn_cli.core.steps.attention`, on one block of
query rows of one head at a time. A stage that is kept is written straight into its whole
array; a stage that is only passed through lives in one reused block buffer. So a run that
keeps only ``output`` never holds a (T, S) matrix. Axis names as in steps.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli.core.limits import BLOCK_ELEMENTS
from attn_cli.core.stages import SCORE_STAGES
from attn_cli.core.steps import (
    BoolArray,
    FloatArray,
    allowed_positions,
    apply_mask,
    attention_scores,
    scale_scores,
    softmax_rows,
    weighted_sum,
)
from attn_cli.errors import ComputeError

if TYPE_CHECKING:
    from collections.abc import Callable

    from attn_cli.core.inputs import Inputs

SCORES_AXES = ("batch", "head", "query", "key")
OUTPUT_AXES = ("batch", "head", "query", "d_v")


@dataclass
class Attended:
    """What the engine produced: kept score stages, the output, and rows with no key."""

    kept: dict[str, FloatArray]  # (B, H, T, S) each
    output: FloatArray | None  # (B, H, T, Dv), laid out as (B, T, H, Dv) so concat is a view
    empty: list[tuple[int, int, int]] = field(default_factory=list)  # (batch, head, query)


@dataclass(frozen=True)
class Block:
    """Query rows t0:t1 of head h in batch item b."""

    b: int
    h: int
    t0: int
    t1: int


class BlockEngine:
    """Runs scores -> scaled -> masked -> softmax -> output for each block of query rows."""

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
        self.bias = None if bias is None else np.broadcast_to(bias, full)
        self.kept = {s: np.empty(full, q.dtype) for s in SCORE_STAGES if s in wanted}
        self.rows = max(1, min(T, BLOCK_ELEMENTS // max(S, 1)))
        chain = {"scores", *(s for s in SCORE_STAGES if s in need)}
        self.work = None if chain <= set(self.kept) else np.empty((self.rows, S), q.dtype)
        self.output = None
        if "output" in need:
            assert v is not None
            layout = np.empty((B, T, H, v.shape[3]), q.dtype)  # (B, T, H, Dv)
            self.output = layout.transpose(0, 2, 1, 3)  # (B, H, T, Dv): concat is a view
        self.must_check = self._overflow_possible(bias)

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
        """All blocks in order; ``progress(done, total)`` after each."""
        attended = Attended(self.kept, self.output)
        blocks = self.blocks()
        for done, block in enumerate(blocks, 1):
            self.run_block(block, attended.empty)
            if progress is not None:
                progress(done, len(blocks))
        return attended

    def run_block(self, blk: Block, empty: list[tuple[int, int, int]]) -> None:
        """Steps 2-6 for one block, each written where :meth:`into` says."""
        at = (blk.b, blk.h, blk.t0)
        k = self.k[blk.b, blk.h // self.groups]  # (S, D)
        x = attention_scores(self.q[blk.b, blk.h, blk.t0 : blk.t1], k, out=self.into("scores", blk))
        self._check("scores", x, at)  # (R, S)
        if "scaled" in self.need:
            x = scale_scores(x, self.scale, out=self.into("scaled", blk))
            self._check("scaled", x, at)
        if "masked" in self.need:
            allowed = allowed_positions(self.inputs, (blk.b, blk.h, blk.t0, blk.t1))  # (R, S)
            bias = None if self.bias is None else self.bias[blk.b, blk.h, blk.t0 : blk.t1]
            x = apply_mask(x, allowed, bias, out=self.into("masked", blk))
            self._check("masked", x, at, allowed, bias)
        if "softmax" in self.need:
            x, none = softmax_rows(x, out=self.into("softmax", blk))
            empty.extend((blk.b, blk.h, blk.t0 + int(i)) for i in np.flatnonzero(none))
        if self.output is not None:
            assert self.v is not None
            v = self.v[blk.b, blk.h // self.groups]  # (S, Dv)
            o = weighted_sum(x, v, out=self.output[blk.b, blk.h, blk.t0 : blk.t1])  # (R, Dv)
            self._check("output", o, at)

    def into(self, stage: str, blk: Block) -> FloatArray:
        """Where a stage's block goes: its kept array, else the reused work buffer."""
        if stage in self.kept:
            return self.kept[stage][blk.b, blk.h, blk.t0 : blk.t1]
        assert self.work is not None
        return self.work[: blk.t1 - blk.t0]

    def _check(
        self,
        stage: str,
        x: FloatArray,
        at: tuple[int, int, int],
        allowed: BoolArray | None = None,
        bias: FloatArray | None = None,
    ) -> None:
        if self.must_check[stage]:
            self.check.block(stage, x, at, allowed, bias)

    def _overflow_possible(self, bias: FloatArray | None) -> dict[str, bool]:
        """Which stages could overflow: none while |q|·|k|·scale (+ |bias|) stays small.

        By Cauchy-Schwarz a score is at most the product of the largest row norms, so the
        element-wise checks run only for inputs that big.
        """
        big = float(np.finfo(self.q.dtype).max) / 4
        qk = _max_norm(self.q) * _max_norm(self.k)  # bias as given, not broadcast
        return {
            "scores": not qk < big,
            "scaled": not qk * self.scale < big,
            "masked": bias is not None and not qk * self.scale + _max_finite(bias) < big,
            "output": self.v is not None and not _max_abs(self.v) < big,
        }


def _max_norm(x: FloatArray) -> float:
    """The largest Euclidean norm of a row (last axis), computed in float64."""
    x64 = x.astype(np.float64, copy=False)
    return float(np.sqrt(np.einsum("...d,...d->...", x64, x64).max(initial=0.0)))


def _max_abs(x: FloatArray) -> float:
    return float(np.abs(x).max(initial=0.0))


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
        bias: FloatArray | None = None,
    ) -> None:
        """Check one (R, S) block of a score stage whose rows start at (batch, head, query)."""
        bad = ~np.isfinite(x)
        # in `masked`, -inf is meant where attending is not allowed or where the bias is -inf
        if allowed is not None:
            bad &= allowed
        if bias is not None:
            bad &= ~np.isneginf(bias)
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
    ) -> None:
        value = arr[pos] if value is None else value
        if not self.inputs.has_batch and axes[0] == "batch":
            axes, pos = axes[1:], pos[1:]
        where = ", ".join(self._label(a, i) for a, i in zip(axes, pos, strict=True))
        raise ComputeError(
            self.inputs.source, f"{stage}[{where}]", f"is {value} ({self.dtype} overflow)",
            "finite values; scale the inputs down",
        )  # fmt: skip

    def _label(self, axis: str, i: int) -> str:
        labels = {"query": self.inputs.tokens, "key": self.inputs.key_tokens}.get(axis)
        if labels:
            return f"{axis} {i} {labels[i]!r}"
        return f"{axis} {i}"
