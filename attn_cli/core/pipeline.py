"""The attention pipeline: inputs in, a trace of every stage that applies out. No I/O.

The steps are the functions of steps.py; the score stages run in the block engine
(engine.py), so ``run(inputs, keep={"output"})`` never holds a (T, S) matrix and a full run
holds nothing beyond its stages. Which stages exist, what they need and their formulas come
from the stage table (stages.py). Axis names as in steps.py.

``run(inputs, backward=True)`` adds the gradient stages after the forward ones (gradients.py,
whole arrays: the backward keeps the weights it reads).

``run_streamed`` is the hook for writers of big traces: it holds every stage but the score
stages kept, and hands each of those out as a :class:`Deferred` stage, computed again by the
block engine one block at a time while a writer walks it (the numbers are those of ``run``,
to the last bit, as a ``keep`` subset's are).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, replace
from functools import cached_property, partial
from typing import Any, Literal, cast

import numpy as np

from attn_cli.blas import blas_limit
from attn_cli.core.blocks import rows_per_block
from attn_cli.core.chain import Chain, cells_of
from attn_cli.core.engine import (
    OUTPUT_AXES,
    SCORES_AXES,
    Attended,
    BlockEngine,
    FiniteCheck,
    SentinelRow,
)
from attn_cli.core.heads import merge_heads, split_heads
from attn_cli.core.inputs import FloatArray, Inputs
from attn_cli.core.stage_facts import final_stage
from attn_cli.core.stages import (
    SCORE_STAGES,
    SPECS,
    STAGE_NAMES,
    applicable_stages,
    needed_stages,
    public_axes,
)
from attn_cli.core.steps import project
from attn_cli.core.variant import QKAt, Traced

Dtype = Literal["float64", "float32"]
Upstream = Literal["grad", "ones"]  # the fixture's grad, or ones (L = sum of the final stage)
DTYPES: tuple[Dtype, ...] = ("float64", "float32")
Progress = Callable[[int, int], None]  # (blocks done, blocks in all)
ROW_BLOCK_BYTES = 4 << 20  # rows handed to a writer at a time, from a stage held whole


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

    def row_blocks(self) -> Iterator[FloatArray]:
        """Its numbers as (R, last axis) blocks of rows in C order, each a view, for writers."""
        yield from _row_blocks(self.data)

    @property
    def table(self) -> tuple[FloatArray, tuple[str, ...]]:
        """Its data and axes with at least two axes, for tables: a vector (``d_b_O``) as one row."""
        if self.data.ndim >= 2:
            return self.data, self.axes
        return self.data[None], ("", *self.axes)


@dataclass(frozen=True, eq=False)
class Trace:
    """The stages of one attention computation that were kept, in pipeline order."""

    inputs: Inputs
    stages: Mapping[str, Stage]
    scale: float
    scale_source: str  # "fixture" or "default"
    empty_rows: tuple[tuple[int, int, int], ...]  # (batch, head, query) rows with no allowed key
    dtype: Dtype = "float64"
    sentinel_rows: tuple[SentinelRow, ...] = ()  # rows a finite mask_value let weight leak into
    upstream: Upstream | None = None  # set when the backward pass ran: where dL/d(final) came from

    @property
    def backward(self) -> bool:
        """Whether the backward pass ran (the gradient stages apply)."""
        return self.upstream is not None

    @property
    def loss(self) -> str:
        """What L is: ``sum(grad ∘ projected)`` or ``sum(projected)`` (else of ``output``)."""
        final = final_stage(self.inputs)
        return f"L = Σ {final}" if self.upstream == "ones" else f"L = Σ grad ∘ {final}"

    def __getitem__(self, name: str) -> Stage:
        return self.stages[name]

    def __contains__(self, name: object) -> bool:
        return name in self.stages

    def __iter__(self) -> Iterator[Stage]:
        return iter(self.stages.values())

    @property
    def applicable(self) -> tuple[str, ...]:
        """Every stage this fixture has, kept or not (an opt-in stage only when kept)."""
        return applicable_stages(self.inputs, opt_in=self.stages, backward=self.backward)

    @cached_property
    def query_labels(self) -> tuple[str, ...]:
        return self.inputs.tokens or tuple(str(i) for i in range(self.inputs.seq_q))

    def _repr_html_(self) -> str | None:
        """The interactive page in a notebook cell (Jupyter, Colab and marimo call this), once
        present/html_page.py has put it in HTML_VIEWS; None (plain text) before."""
        return HTML_VIEWS[-1](self) if HTML_VIEWS else None

    @cached_property
    def key_labels(self) -> tuple[str, ...]:
        return self.inputs.key_tokens or tuple(str(i) for i in range(self.inputs.seq_k))


# How a Trace shows itself in a notebook: present/html_page.py adds its page when it is
# imported (attn_cli.trace_file and attn_cli.run import it), so core names nothing above it.
HTML_VIEWS: list[Callable[[Trace], str]] = []


def _row_blocks(data: FloatArray) -> Iterator[FloatArray]:
    if data.ndim < 2:
        yield data.reshape(1, -1)  # (1, n): a vector is one row
        return
    rows = max(1, ROW_BLOCK_BYTES // max(1, data.shape[-1] * data.itemsize))
    for lead in np.ndindex(*data.shape[:-2]):
        matrix = data[lead]  # (rows, last axis)
        for r0 in range(0, matrix.shape[0], rows):
            yield matrix[r0 : r0 + rows]


@dataclass(frozen=True)
class Deferred:
    """A score stage that is not held: its blocks are computed when :meth:`row_blocks` is
    walked."""

    name: str
    shape: tuple[int, ...]  # public layout, as Stage.shape
    formula: str
    axes: tuple[str, ...]
    blocks: Callable[[], Iterator[FloatArray]]  # (R, S) blocks in C order, each reused

    def row_blocks(self) -> Iterator[FloatArray]:
        """Its numbers as (R, key) blocks of rows in C order, each valid until the next."""
        return self.blocks()


@dataclass(frozen=True, eq=False)
class Streamed:
    """A trace for writers: every stage kept, in pipeline order, the score stages deferred."""

    trace: Trace  # the stages held, and what the JSON trace's header reads
    stages: Mapping[str, Stage | Deferred]
    late: Attended  # empty and leaking rows, when softmax is computed only as it is written

    def __iter__(self) -> Iterator[Stage | Deferred]:
        return iter(self.stages.values())

    def finished(self) -> Trace:
        """The held trace, with the rows found while the deferred stages were written."""
        if not self.late.empty and not self.late.leaks:
            return self.trace
        return replace(
            self.trace,
            empty_rows=tuple(dict.fromkeys([*self.trace.empty_rows, *self.late.empty])),
            sentinel_rows=tuple(dict.fromkeys([*self.trace.sentinel_rows, *self.late.leaks])),
        )


def resolve_scale(inputs: Inputs) -> tuple[float, str]:
    """The scale and where it came from: the fixture's, a variant's (MLA's mscale²), or the
    default 1/sqrt(d_k)."""
    if inputs.scale is not None:
        return inputs.scale, "fixture"
    for v, value in Chain(inputs).on:
        own = v.default_scale(value, inputs)
        if own is not None:
            return own, v.name
    return 1.0 / math.sqrt(inputs.d_k), "default"


def refuse(inputs: Inputs, what: str) -> None:
    """A variant that ``what`` (the backward pass, FlashAttention, decoding) cannot run refuses
    it in one line (its ``refuses``)."""
    from attn_cli.errors import UsageError

    for v, value in Chain(inputs).on:
        problem = v.refuses(value, inputs, what)
        if problem is not None:
            raise UsageError(inputs.source, *problem)


def run(
    inputs: Inputs,
    *,
    keep: Collection[str] | None = None,
    dtype: Dtype = "float64",
    progress: Progress | None = None,
    backward: bool = False,
) -> Trace:
    """Run the stages that apply and return the trace.

    ``keep`` names the stages to keep (default: all but the opt-in ``lse``); stages that none
    of them depends on are not computed at all. ``dtype`` "float32" computes in single
    precision: faster and half the memory, but only about 7 significant digits. ``progress``
    is called after each block. ``backward`` adds the gradient stages (``d_Q``, ...) of
    L = Σ grad ∘ final stage (the fixture's ``grad``, else ones); without it they do not apply.
    """
    _check_arguments(keep, dtype)
    if backward:
        refuse(inputs, "the backward pass")
    with _quiet(), blas_limit(inputs.seq_k):  # the projections too: under load they suffer most
        return _Run(inputs, keep, dtype, backward).trace(progress)


def run_streamed(
    inputs: Inputs,
    *,
    keep: Collection[str] | None = None,
    dtype: Dtype = "float64",
    progress: Progress | None = None,
    backward: bool = False,
) -> Streamed:
    """As :func:`run`, for writers: the score stages kept are :class:`Deferred`, not held.

    Each is computed again, a block at a time, when a writer walks it, so a run holds one
    block of them. With ``backward`` and gradient stages kept, every stage is held (the
    backward pass reads them whole).
    """
    _check_arguments(keep, dtype)
    if backward:
        refuse(inputs, "the backward pass")
    walk = _Run(inputs, keep, dtype, backward, stream=True)
    with _quiet(), blas_limit(inputs.seq_k):
        return walk.streamed(walk.trace(progress))


def _quiet() -> np.errstate:
    """Overflow and the like are found by FiniteCheck, naming the stage, not warned about."""
    return np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore")


def _check_arguments(keep: Collection[str] | None, dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {dtype!r}")
    if keep is not None:
        unknown = set(keep) - set(STAGE_NAMES)
        if unknown:
            raise ValueError(f"unknown stages {sorted(unknown)}; stages are {STAGE_NAMES}")


class _Run:
    """One run of the pipeline: the arrays computed so far, in the computing dtype."""

    def __init__(
        self,
        inputs: Inputs,
        keep: Collection[str] | None,
        dtype: Dtype,
        backward: bool,
        stream: bool = False,
    ) -> None:
        self.inputs, self.dtype, self.backward = inputs, dtype, backward
        self.applicable = applicable_stages(inputs, opt_in=keep or (), backward=backward)
        self.wanted = set(
            self.applicable if keep is None else [s for s in self.applicable if s in keep]
        )
        self.gradients = {s for s in self.wanted if SPECS[s].gradient}
        self.chain = Chain(inputs)
        # the score stages computed again as they are written (run_streamed), never held; a
        # head-output transform's (differential attention's second map) are not the engine's
        engine_scores = set(SCORE_STAGES) - set(self.chain.out_stages)
        self.deferred = set() if not stream or self.gradients else self.wanted & engine_scores
        # the forward stages to hold whole: those kept, and those the backward pass reads
        self.held = self.wanted - self.gradients - self.deferred
        # a second form (MLA's absorbed one) runs, and is checked against the chain, on every
        # run that shows one of its stages; a run that shows none pays nothing for it
        self.sides = [
            (v, x) for v, x in self.chain.on if v.side_stages and self.wanted & set(v.side_stages)
        ]
        if self.sides:  # what the check compares: all held
            self.deferred = set()
            pairs = {theirs for v, _ in self.sides for _, theirs in v.side_equal}
            self.held = (self.wanted - self.gradients - set(self.sides_of())) | pairs
            self.held |= {"softmax"}
        if self.gradients:
            from attn_cli.core.gradients import backward_needs  # only with the backward pass

            self.held |= backward_needs(inputs, self.wanted)
            if "lse" in self.held:  # the blocked backward reads L, not the weights
                self.applicable = applicable_stages(
                    inputs, opt_in=(*(keep or ()), "lse"), backward=backward
                )
        self.need = needed_stages(self.held, self.applicable)
        self.need |= needed_stages(self.deferred, self.applicable) - set(SCORE_STAGES)  # Q, K
        reads = {s for v, _ in self.chain.outs for s in v.out_reads} & set(self.applicable)
        if reads and self.need & set(self.chain.out_stages):  # read whole (a second map)
            self.deferred -= reads
            self.held |= reads
            self.need |= needed_stages(reads, self.applicable)
        self.check = FiniteCheck(inputs, dtype)
        self.arrays: dict[str, FloatArray] = {}  # internal layouts, batch axis included
        self.bias: FloatArray | None = None  # in the computing dtype, once asked for

    def trace(self, progress: Progress | None) -> Trace:
        scale, scale_source = resolve_scale(self.inputs)
        # 1) project X into queries, keys and values (or take them as given)
        self.project() if self.inputs.mode == "projection" else self.given()
        if "V" in self.arrays:  # a variant may change V where the projections leave it (a clamp)
            for v, value in self.chain.on:
                self.arrays["V"] = v.transform_v(value, self.arrays["V"])
        # 2)-3) the Q/K transforms (QK-norm, then RoPE), on queries and keys
        self.transform_qk()
        # 4)-8) scores, scale, score modifiers, biases and mask, softmax, weighted sum: by block
        attended = self.attend(scale, progress) if "scores" in self.need else None
        mixer = next(((v, x) for v, x in self.chain.on if v.mixer_stages), None)
        if mixer is not None and "output" in self.need:  # linear attention: no softmax
            self.mix(*mixer)
        for name in self.chain.bias_stages:  # kept, though nothing masks with them here
            if name in self.held and name not in self.arrays:
                self.arrays[name] = self.bias_stage(name)
        # 9) the head-output transforms (a gate), then heads side by side, the output projection
        if any(name in self.need for name in self.chain.out_stages):
            self.transform_out()
        if "concat" in self.need:
            self.heads_out()
        # 10) a second form of the same attention (MLA's absorbed one), checked against it
        for v, value in self.sides:
            self.side(v, value, scale)
        # 11) the backward pass, from dL/d(final stage) back to the inputs
        if self.gradients:
            self.backward_pass(scale)
        has_batch = self.inputs.has_batch
        stages = {
            name: Stage(
                name,
                data if has_batch or axes[0] != "batch" else data[0],
                SPECS[name].formula(self.inputs),
                public_axes(name, has_batch),
            )
            for name in self.applicable
            if name in self.wanted and name not in self.deferred
            for data, axes in ((self.arrays[name], SPECS[name].axes),)
        }
        empty = () if attended is None else tuple(attended.empty)
        leaks = () if attended is None else tuple(attended.leaks)
        upstream: Upstream | None = None
        if self.backward:
            upstream = "ones" if self.inputs.grad is None else "grad"
        return Trace(self.inputs, stages, scale, scale_source, empty, self.dtype, leaks, upstream)

    def backward_pass(self, scale: float) -> None:
        """Every gradient stage, from the forward stages held whole (gradients.py)."""
        from attn_cli.core.gradients import gradient_stages

        grads = gradient_stages(self.inputs, self.arrays, scale, self.as_dtype_any, self.wanted)
        assert self.gradients <= set(grads), sorted(self.gradients - set(grads))
        for name in self.gradients:
            self.arrays[name] = self.check(name, grads[name], SPECS[name].axes)

    def sides_of(self) -> tuple[str, ...]:
        """The side stages of the variants that are on."""
        return tuple(s for v, _ in self.sides for s in v.side_stages)

    def side(self, v: Any, value: Any, scale: float) -> None:
        """A variant's second form, each stage checked finite, then equal to the chain's."""
        made = v.side(value, Traced(self.inputs, self.arrays, self.as_dtype_any), scale)
        for name in v.side_stages:
            self.arrays[name] = self.check(name, made[name], SPECS[name].axes)
        rtol = 1e-9 if self.dtype == "float64" else 1e-4
        for mine, theirs in v.side_equal:
            a, b = self.arrays[mine], self.arrays[theirs]
            tol = rtol * (1.0 + float(np.max(np.abs(b), initial=0.0)))
            finite = np.isfinite(b)  # masked scores hold -inf in both or in neither
            worst = float(np.max(np.abs(np.where(finite, a - b, 0.0)), initial=0.0))
            if worst > tol or not np.array_equal(finite, np.isfinite(a)):
                from attn_cli.errors import ComputeError

                raise ComputeError(
                    self.inputs.source,
                    mine,
                    f"differs from {theirs} by {worst:.3g} ({v.name}'s two forms disagree)",
                    f"equal to rounding ({tol:.1e})",
                )

    def mix(self, v: Any, value: Any) -> None:
        """A mixer's stages and output from Q, K, V (linear attention), each checked finite."""
        made = v.mix(value, Traced(self.inputs, self.arrays, self.as_dtype_any))
        for name in (*v.mixer_stages, "output"):
            self.arrays[name] = self.check(name, made[name], SPECS[name].axes)

    def project(self) -> None:
        inp = self.inputs
        assert inp.X is not None
        X = self.as_dtype("X", inp.X, _FLAT) if self.need else inp.X
        front = self.chain.front
        if front is not None:  # Q, K and V made by the variant (MLA)
            if "X" in self.held:
                self.arrays["X"] = X
            made = front[0].front(front[1], inp, X, inp.token_positions()[0], self.as_dtype_any)
            for name in (*front[0].front_stages, "Q", "K", "V"):
                if name in made:
                    self.arrays[name] = self.check(name, made[name], SPECS[name].axes)
            return
        X_kv = None
        if inp.X_kv is not None:  # cross-attention: keys and values from X_kv
            X_kv = self.as_dtype("X_kv", inp.X_kv, _FLAT) if self.need else inp.X_kv
        for name, x in (("X", X), ("X_kv", X_kv)):
            if x is not None and name in self.held:  # else gone once Q, K, V are made
                self.arrays[name] = x
        for name, heads in (("Q", inp.heads), ("K", inp.kv_heads), ("V", inp.kv_heads)):
            if name in self.need:
                W = self.as_dtype(f"W_{name}", getattr(inp, f"W_{name}"), _WEIGHT)
                b = getattr(inp, f"b_{name}")
                b = None if b is None else self.as_dtype(f"b_{name}", b, _VECTOR)
                source = X if name == "Q" or X_kv is None else X_kv
                flat = self.check(name, project(source, W, b), _FLAT)  # (B, T, heads*d)
                self.arrays[name] = split_heads(flat, heads)  # (B, heads, T, d)

    def given(self) -> None:
        for name in ("Q", "K", "V"):
            self.arrays[name] = self.as_dtype(name, getattr(self.inputs, name), _HEADS)

    def transform_qk(self) -> None:
        """The chain's Q/K transforms in turn (QK-norm, then RoPE), at each token's position;
        V is left alone."""
        pos_q, pos_k = self.inputs.token_positions()
        for which, positions in (("Q", pos_q), ("K", pos_k)):
            x, at = self.arrays.get(which), QKAt(self.inputs, which, positions, self.as_dtype_any)
            for v, value in self.chain.transforms_of(which):
                stage = f"{which}_{v.suffix}"
                if stage in self.need:
                    assert x is not None
                    x = v.transform(value, at, x)
                    self.arrays[stage] = x  # (B, heads, T, D)

    def attend(self, scale: float, progress: Progress | None) -> Attended:
        q, k, v = self.query_key("Q"), self.query_key("K"), self.arrays.get("V")
        bias = self.score_bias()
        engine = BlockEngine(self.inputs, q, k, v, scale, bias, self.need, self.held, self.check)
        attended = engine.run(progress)
        for name in SCORE_STAGES:
            if name in attended.kept:
                self.arrays[name] = attended.kept[name]
        if attended.lse is not None:
            self.arrays["lse"] = attended.lse
        if attended.output is not None:
            self.arrays["output"] = attended.output
        return attended

    def score_bias(self) -> FloatArray | None:
        """The fixture's additive bias in the computing dtype (converted once)."""
        if self.bias is None and self.inputs.bias is not None:
            self.bias = self.as_dtype("bias", self.inputs.bias, SCORES_AXES)
        return self.bias

    def streamed(self, trace: Trace) -> Streamed:
        """The trace for writers: held stages as they are, deferred ones in their place."""
        late = Attended({}, None)
        stages: dict[str, Stage | Deferred] = {}
        inp = self.inputs
        shape = (inp.batch,) * inp.has_batch + (inp.heads, inp.seq_q, inp.seq_k)  # (B, H, T, S)
        for name in self.applicable:
            if name in trace.stages:
                stages[name] = trace.stages[name]
            elif name in self.deferred:
                blocks = partial(self.stream, name, trace.scale, late)
                axes = public_axes(name, inp.has_batch)
                stages[name] = Deferred(name, shape, SPECS[name].formula(inp), axes, blocks)
        return Streamed(trace, stages, late)

    def stream(self, name: str, scale: float, late: Attended) -> Iterator[FloatArray]:
        """The (R, S) blocks of a deferred stage, from a block engine that runs up to it."""
        if name in self.chain.bias_stages:
            yield from self.bias_stage_blocks(name)
            return
        need = needed_stages({name}, self.applicable)
        q, k = self.query_key("Q"), self.query_key("K")
        engine = BlockEngine(
            self.inputs, q, k, None, scale, self.score_bias(), need, set(), self.check
        )
        # empty and leaking rows: found by the first pass through softmax (run's, else this)
        found = late if "softmax" not in self.need else Attended({}, None)
        blocks = engine.stream(name, found)
        while True:
            with _quiet():
                block = next(blocks, None)
            if block is None:
                return
            yield block

    def bias_stage_blocks(self, name: str) -> Iterator[FloatArray]:
        """A bias stage (ALiBi) a block of rows at a time, (R, S) each, in (b, h, t) order."""
        inp, dtype = self.inputs, np.dtype(self.dtype)
        rows = rows_per_block(inp.seq_q, inp.seq_k, dtype.itemsize)
        for b in range(inp.batch):
            for h in range(inp.heads):
                for t0 in range(0, inp.seq_q, rows):
                    t1 = min(inp.seq_q, t0 + rows)
                    cells = cells_of(inp, slice(b, b + 1), slice(h, h + 1), slice(t0, t1))
                    yield self.chain.bias_stage(name, cells, dtype)[0, 0]  # (R, S)

    def query_key(self, name: str) -> FloatArray:
        """What the scores read: the last transform's stage of Q or K, else Q or K itself."""
        for stage in reversed(self.chain.qk_stages(name)):
            if stage in self.arrays:
                return self.arrays[stage]
        raise AssertionError(f"{name} was not computed")

    def bias_stage(self, name: str) -> FloatArray:
        """A whole bias stage (B, H, T, S), when it is kept but nothing masks with it."""
        inp = self.inputs
        cells = cells_of(inp, slice(None), slice(None), slice(None))
        whole = self.chain.bias_stage(name, cells, np.dtype(self.dtype))
        return np.ascontiguousarray(np.broadcast_to(whole, cells.shape))  # (B, H, T, S)

    def transform_out(self) -> None:
        """The chain's head-output transforms, on the output of every head (B, H, T, Dv)."""
        X = None
        if self.inputs.X is not None:
            X = self.arrays.get("X")
            X = self.as_dtype("X", self.inputs.X, _FLAT) if X is None else X  # (B, T, d_model)
        self.chain.transform_out(
            self.arrays["output"], X, self.as_dtype_any, self.arrays.__setitem__, self.arrays
        )
        for name in self.chain.out_stages:
            self.arrays[name] = self.check(name, self.arrays[name], SPECS[name].axes)

    def heads_out(self) -> None:
        joined = self.arrays[self.chain.joined]  # output, or a transform's (gated)
        concat = merge_heads(joined)  # (B, T, H*Dv): a view of it
        self.arrays["concat"] = concat
        if "projected" in self.need:
            inp = self.inputs
            assert inp.W_O is not None
            W_O = self.as_dtype("W_O", inp.W_O, _WEIGHT)
            b_O = None if inp.b_O is None else self.as_dtype("b_O", inp.b_O, _VECTOR)
            axes = SPECS["projected"].axes
            self.arrays["projected"] = self.check("projected", project(concat, W_O, b_O), axes)

    def as_dtype_any(self, name: str, arr: FloatArray) -> FloatArray:
        """An input of any layout in the computing dtype (a vector's axis is its column, a
        matrix's its rows and columns, other axes named by position)."""
        axes = {1: _VECTOR, 2: _WEIGHT}.get(arr.ndim) or tuple(f"axis {i}" for i in range(arr.ndim))
        return self.as_dtype(name, arr, axes)

    def as_dtype(self, name: str, arr: FloatArray, axes: tuple[str, ...]) -> FloatArray:
        """An input in the computing dtype; a value too big for float32 is an error, not inf."""
        return _as_dtype(self.check, self.dtype, name, arr, axes)


def in_dtype(inputs: Inputs, dtype: Dtype) -> Inputs:
    """The inputs with their big arrays (X, the weights, biases, given Q/K/V, the score bias)
    in the computing dtype, checked as a run checks them. A float32 run never reads the
    float64 arrays again: a caller that lets them go holds the inputs at half the size."""
    _check_arguments(None, dtype)
    if dtype == "float64":
        return inputs
    check = FiniteCheck(inputs, dtype)
    layouts = {
        "X": _FLAT,
        "X_kv": _FLAT,
        "Q": _HEADS,
        "K": _HEADS,
        "V": _HEADS,
        "bias": SCORES_AXES,
    }
    layouts.update({f"W_{n}": _WEIGHT for n in "QKVO"})
    layouts.update({f"b_{n}": _VECTOR for n in "QKVO"})
    with _quiet():
        cast_arrays: dict[str, Any] = {
            name: _as_dtype(check, dtype, name, arr, axes)
            for name, axes in layouts.items()
            if (arr := getattr(inputs, name)) is not None
        }
    return replace(inputs, **cast_arrays)


def _as_dtype(
    check: FiniteCheck, dtype: str, name: str, arr: FloatArray, axes: tuple[str, ...]
) -> FloatArray:
    """``arr`` in ``dtype`` (as it is if it already is); a value too big for float32 is an
    error naming ``name`` and the position along ``axes``, not inf."""
    if dtype == "float64" or arr.dtype == np.float32:
        return arr
    small = cast(FloatArray, arr.astype(np.float32))
    grew = np.isinf(small) & np.isfinite(arr)
    if grew.any():
        pos = tuple(int(i) for i in np.argwhere(grew)[0])
        # an input of fewer axes (a bias (T, S) for scores (B, H, T, S)) names its own
        axes = axes[len(axes) - arr.ndim :] if arr.ndim < len(axes) else axes
        if name in ("K", "V", "X_kv"):  # these run along the keys, not the queries
            axes = tuple("key" if a == "query" else a for a in axes)
        check.fail(name, small, axes, pos, value=arr[pos], shape=arr.shape)
    return small


_FLAT = ("batch", "query", "feature")
_WEIGHT = ("row", "column")
_VECTOR = ("column",)
_HEADS = ("batch", "head", "query", "d")
__all__ = [
    "DTYPES",
    "OUTPUT_AXES",
    "Deferred",
    "Dtype",
    "SentinelRow",
    "Stage",
    "Streamed",
    "Trace",
    "Upstream",
    "in_dtype",
    "resolve_scale",
    "run",
    "run_streamed",
]
