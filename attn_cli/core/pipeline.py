"""The attention pipeline: inputs in, a trace of every stage that applies out. No I/O.

The steps are the functions of steps.py; the score stages run in the block engine
(engine.py), so ``run(inputs, keep={"output"})`` never holds a (T, S) matrix and a full run
holds nothing beyond its stages. Which stages exist, what they need and their formulas come
from the stage table (stages.py). Axis names as in steps.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, cast

import numpy as np

from attn_cli.core.engine import OUTPUT_AXES, SCORES_AXES, BlockEngine, FiniteCheck
from attn_cli.core.inputs import FloatArray, Inputs
from attn_cli.core.stages import (
    SCORE_STAGES,
    SPECS,
    STAGE_NAMES,
    applicable_stages,
    needed_stages,
    public_axes,
)
from attn_cli.core.steps import concat_heads, project, split_heads

Dtype = Literal["float64", "float32"]
DTYPES: tuple[Dtype, ...] = ("float64", "float32")
Progress = Callable[[int, int], None]  # (blocks done, blocks in all)


@dataclass(frozen=True, eq=False)
class Stage:
    """One named intermediate: its array (public layout), formula and axis names."""

    name: str
    data: FloatArray
    formula: str
    axes: tuple[str, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self.data.shape)


@dataclass(frozen=True, eq=False)
class Trace:
    """The stages of one attention computation that were kept, in pipeline order."""

    inputs: Inputs
    stages: Mapping[str, Stage]
    scale: float
    scale_source: str  # "fixture" or "default"
    empty_rows: tuple[tuple[int, int, int], ...]  # (batch, head, query) rows with no allowed key
    dtype: Dtype = "float64"

    def __getitem__(self, name: str) -> Stage:
        return self.stages[name]

    def __contains__(self, name: object) -> bool:
        return name in self.stages

    def __iter__(self) -> Iterator[Stage]:
        return iter(self.stages.values())

    @property
    def applicable(self) -> tuple[str, ...]:
        """Every stage this fixture has, kept or not."""
        return applicable_stages(self.inputs)

    @cached_property
    def query_labels(self) -> tuple[str, ...]:
        return self.inputs.tokens or tuple(str(i) for i in range(self.inputs.seq_q))

    @cached_property
    def key_labels(self) -> tuple[str, ...]:
        return self.inputs.key_tokens or tuple(str(i) for i in range(self.inputs.seq_k))


def resolve_scale(inputs: Inputs) -> tuple[float, str]:
    """The scale and where it came from: the fixture's, or the default 1/sqrt(d_k)."""
    if inputs.scale is None:
        return 1.0 / math.sqrt(inputs.d_k), "default"
    return inputs.scale, "fixture"


def run(
    inputs: Inputs,
    *,
    keep: Collection[str] | None = None,
    dtype: Dtype = "float64",
    progress: Progress | None = None,
) -> Trace:
    """Run the stages that apply and return the trace.

    ``keep`` names the stages to keep (default: all); stages that none of them depends on are
    not computed at all. ``dtype`` "float32" computes in single precision: faster and half the
    memory, but only about 7 significant digits. ``progress`` is called after each block.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {dtype!r}")
    if keep is not None:
        unknown = set(keep) - set(STAGE_NAMES)
        if unknown:
            raise ValueError(f"unknown stages {sorted(unknown)}; stages are {STAGE_NAMES}")
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        return _Run(inputs, keep, dtype).trace(progress)


class _Run:
    """One run of the pipeline: the arrays computed so far, in the computing dtype."""

    def __init__(self, inputs: Inputs, keep: Collection[str] | None, dtype: Dtype) -> None:
        self.inputs, self.dtype = inputs, dtype
        self.applicable = applicable_stages(inputs)
        self.wanted = set(self.applicable if keep is None else
                          [s for s in self.applicable if s in keep])  # fmt: skip
        self.need = needed_stages(self.wanted, self.applicable)
        self.check = FiniteCheck(inputs, dtype)
        self.arrays: dict[str, FloatArray] = {}  # internal layouts, batch axis included

    def trace(self, progress: Progress | None) -> Trace:
        scale, scale_source = resolve_scale(self.inputs)
        # 1) project X into queries, keys and values (or take them as given)
        self.project() if self.inputs.mode == "projection" else self.given()
        # 2)-6) scores, scale, mask, softmax and the weighted sum of values, block by block
        empty = self.attend(scale, progress) if "scores" in self.need else []
        # 7) heads side by side, then the output projection
        if "concat" in self.need:
            self.heads_out()
        has_batch = self.inputs.has_batch
        stages = {
            name: Stage(name, data if has_batch else data[0],
                        SPECS[name].formula(self.inputs), public_axes(name, has_batch))
            for name in self.applicable
            if name in self.wanted
            for data in (self.arrays[name],)
        }  # fmt: skip
        return Trace(self.inputs, stages, scale, scale_source, tuple(empty), self.dtype)

    def project(self) -> None:
        inp = self.inputs
        assert inp.X is not None
        X = self.arrays["X"] = self.as_dtype("X", inp.X, _FLAT) if self.need else inp.X
        for name, heads in (("Q", inp.heads), ("K", inp.kv_heads), ("V", inp.kv_heads)):
            if name in self.need:
                W = self.as_dtype(f"W_{name}", getattr(inp, f"W_{name}"), _WEIGHT)
                b = getattr(inp, f"b_{name}")
                b = None if b is None else self.as_dtype(f"b_{name}", b, _VECTOR)
                flat = self.check(name, project(X, W, b), _FLAT)  # (B, T, heads*d)
                self.arrays[name] = split_heads(flat, heads)  # (B, heads, T, d)

    def given(self) -> None:
        for name in ("Q", "K", "V"):
            self.arrays[name] = self.as_dtype(name, getattr(self.inputs, name), _HEADS)

    def attend(self, scale: float, progress: Progress | None) -> list[tuple[int, int, int]]:
        bias = self.inputs.bias
        bias = None if bias is None else self.as_dtype("bias", bias, SCORES_AXES)
        q, k, v = self.arrays["Q"], self.arrays["K"], self.arrays.get("V")
        engine = BlockEngine(self.inputs, q, k, v, scale, bias, self.need, self.wanted, self.check)
        attended = engine.run(progress)
        for name in SCORE_STAGES:
            if name in attended.kept:
                self.arrays[name] = attended.kept[name]
        if attended.output is not None:
            self.arrays["output"] = attended.output
        return attended.empty

    def heads_out(self) -> None:
        concat = concat_heads(self.arrays["output"])  # (B, T, H*Dv): a view of output
        self.arrays["concat"] = concat
        if "projected" in self.need:
            inp = self.inputs
            assert inp.W_O is not None
            W_O = self.as_dtype("W_O", inp.W_O, _WEIGHT)
            b_O = None if inp.b_O is None else self.as_dtype("b_O", inp.b_O, _VECTOR)
            axes = SPECS["projected"].axes
            self.arrays["projected"] = self.check("projected", project(concat, W_O, b_O), axes)

    def as_dtype(self, name: str, arr: FloatArray, axes: tuple[str, ...]) -> FloatArray:
        """An input in the computing dtype; a value too big for float32 is an error, not inf."""
        if self.dtype == "float64":
            return arr
        small = cast(FloatArray, arr.astype(np.float32))
        grew = np.isinf(small) & np.isfinite(arr)
        if grew.any():
            self.check.fail(name, small, axes, tuple(int(i) for i in np.argwhere(grew)[0]))
        return small


_FLAT = ("batch", "query", "feature")
_WEIGHT = ("row", "column")
_VECTOR = ("column",)
_HEADS = ("batch", "head", "query", "d")
__all__ = ["DTYPES", "OUTPUT_AXES", "Dtype", "Stage", "Trace", "resolve_scale", "run"]
