"""The attention pipeline: pure NumPy, no I/O, one small function per stage.

Axis names used in every shape comment:
    B  batch            H    query heads        Hkv  key/value heads (grouped-query)
    T  query positions  S    key positions      C    d_model
    D  d_k per head     Dv   d_v per head       E    d_out (columns of W_O)
    n  the query rows of one block (a slice of T)

Semantics follow torch.nn.functional.scaled_dot_product_attention: scores are scaled by
``scale`` (default 1/sqrt(d_k)), a boolean mask is True where a query *may* attend, a float
bias is added after scaling, and a row with nothing to attend to gets all-zero weights.

The score stages (scores, scaled, masked, softmax) are computed block by block, a few hundred
query rows of one head at a time: a stage that is kept is written straight into its array, a
stage that is only passed through lives in one reused block buffer. So ``run(inputs,
keep={"output"})`` never holds a (T, S) matrix, and a full run holds nothing beyond its stages.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, cast

import numpy as np

from attn_cli.core.limits import BLOCK_ELEMENTS, STAGE_NAMES
from attn_cli.errors import ComputeError
from attn_cli.io.fixture import FloatArray, Inputs

BoolArray = np.ndarray[Any, np.dtype[np.bool_]]
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


def applicable_stages(inputs: Inputs) -> tuple[str, ...]:
    """The stages a fixture has, in pipeline order (X only in projection mode, and so on)."""
    absent = set()
    if inputs.mode != "projection":
        absent.add("X")
    if not _has_masked(inputs):
        absent.add("masked")
    if inputs.heads == 1 and inputs.W_O is None:
        absent.add("concat")
    if inputs.W_O is None:
        absent.add("projected")
    return tuple(s for s in STAGE_NAMES if s not in absent)


# What each stage is computed from (only the ones that apply count).
_NEEDS = {
    "X": (), "Q": ("X",), "K": ("X",), "V": ("X",), "scores": ("Q", "K"),
    "scaled": ("scores",), "masked": ("scaled",), "softmax": ("masked", "scaled"),
    "output": ("softmax", "V"), "concat": ("output",), "projected": ("concat",),
}  # fmt: skip


def needed_stages(wanted: Collection[str], applicable: Collection[str]) -> set[str]:
    """The stages that must be computed to get ``wanted``: those and what they depend on."""
    need: set[str] = set()
    todo = [s for s in wanted if s in applicable]
    while todo:
        name = todo.pop()
        if name not in need:
            need.add(name)
            todo.extend(s for s in _NEEDS[name] if s in applicable)
    return need


# ---------------------------------------------------------------------------------------------
# One function per step


def project(X: FloatArray, W: FloatArray, b: FloatArray | None) -> FloatArray:
    """X @ W + b, the article's convention (a torch Linear weight is W transposed)."""
    out = X @ W  # (B, T, C) @ (C, n*D) -> (B, T, n*D)
    if b is not None:
        out += b
    return out


def split_heads(x: FloatArray, n: int) -> FloatArray:
    """Contiguous column blocks become heads: head h owns columns h*d:(h+1)*d."""
    B, T, width = x.shape
    heads: FloatArray = x.reshape(B, T, n, width // n).transpose(0, 2, 1, 3)  # (B, n, T, d)
    return heads


def repeat_kv(x: FloatArray, groups: int) -> FloatArray:
    """Query head h reads key/value head h // groups, as torch's repeat_interleave."""
    return x if groups == 1 else np.repeat(x, groups, axis=1)  # (B, H, S, d)


def attention_scores(q: FloatArray, k: FloatArray, out: FloatArray | None = None) -> FloatArray:
    """scores = Q Kᵀ for every head (or for one head's block of queries)."""
    scores: FloatArray = np.matmul(q, k.swapaxes(-1, -2), out=out)  # (..., T, D) @ (..., D, S)
    return scores


def scale_scores(scores: FloatArray, scale: float, out: FloatArray | None = None) -> FloatArray:
    """scaled = scores × scale."""
    scaled: FloatArray = np.multiply(scores, scale, out=out)
    return scaled


def allowed_positions(
    inputs: Inputs, block: tuple[int, int, int, int] | None = None
) -> BoolArray | None:
    """Where a query may attend (True), from causal, mask and lengths; None when all may.

    The whole (B, H, T, S) array, or for ``block`` = (b, h, t0, t1) the query rows t0:t1 of
    head h in batch item b, as an array that broadcasts to (n, S).
    """
    B, H, T, S = inputs.batch, inputs.heads, inputs.seq_q, inputs.seq_k
    b, h, t0, t1 = block or (0, 0, 0, T)
    parts: list[BoolArray] = []
    if inputs.causal is not None:
        # upper-left: key j <= query i; lower-right: the last query sees every key (KV cache).
        offset = 0 if inputs.causal == "upper-left" else S - T
        parts.append(np.arange(S)[None, :] <= np.arange(t0, t1)[:, None] + offset)  # (n, S)
    if inputs.mask is not None:
        mask = np.broadcast_to(inputs.mask, (B, H, T, S))  # right-aligned, as torch broadcasts
        parts.append(mask if block is None else mask[b, h, t0:t1])
    if inputs.lengths is not None:
        valid = np.arange(S)[None, :] < inputs.lengths[:, None]  # (B, S)
        parts.append(valid[:, None, None, :] if block is None else valid[b][None, :])
    if not parts:
        return None
    if block is not None:
        allowed = parts[0]
        for part in parts[1:]:
            allowed = allowed & part
        return allowed
    whole = np.ones((B, H, T, S), dtype=bool)
    for part in parts:
        whole &= part
    return whole


def apply_mask(
    scaled: FloatArray,
    allowed: BoolArray | None,
    bias: FloatArray | None,
    out: FloatArray | None = None,
) -> FloatArray:
    """masked = scaled + bias, with -inf wherever attending is not allowed."""
    if bias is not None:
        masked: FloatArray = np.add(scaled, bias, out=out)
    elif out is None:
        masked = scaled.copy()
    else:
        masked = out
        if out is not scaled:
            np.copyto(out, scaled)
    if allowed is not None:
        np.copyto(masked, -np.inf, where=~allowed)
    return masked


def softmax(x: FloatArray, out: FloatArray | None = None) -> FloatArray:
    """Softmax over keys after subtracting the row maximum; a row of -inf gives zeros.

    ``out`` may be ``x`` itself: the exponentials and the division then happen in place.
    """
    return _softmax(x, out)[0]


def _softmax(x: FloatArray, out: FloatArray | None) -> tuple[FloatArray, BoolArray]:
    """The softmax and which rows were all -inf (nothing to attend to)."""
    row_max = x.max(axis=-1, keepdims=True)  # (..., T, 1)
    empty = np.isneginf(row_max)
    row_max[empty] = 0.0  # exp(-inf - 0) = 0 across the row
    weights: FloatArray = np.subtract(x, row_max, out=out)
    np.exp(weights, out=weights)
    total = weights.sum(axis=-1, keepdims=True)  # (..., T, 1)
    total[empty] = 1.0  # 0 / 1, not 0 / 0
    np.divide(weights, total, out=weights)
    return weights, empty[..., 0]


def weighted_sum(weights: FloatArray, v: FloatArray, out: FloatArray | None = None) -> FloatArray:
    """output = softmax · V."""
    output: FloatArray = np.matmul(weights, v, out=out)  # (..., T, S) @ (..., S, Dv)
    return output


def concat_heads(out: FloatArray) -> FloatArray:
    """Heads side by side: head h fills columns h*d_v:(h+1)*d_v."""
    B, H, T, Dv = out.shape
    concat: FloatArray = out.transpose(0, 2, 1, 3).reshape(B, T, H * Dv)  # (B, T, H*Dv)
    return concat


# ---------------------------------------------------------------------------------------------
# The whole run


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
        return _run(inputs, keep, dtype, progress)


def _run(
    inputs: Inputs, keep: Collection[str] | None, dtype: Dtype, progress: Progress | None
) -> Trace:
    H, Hkv = inputs.heads, inputs.kv_heads
    applicable = applicable_stages(inputs)
    wanted = set(applicable if keep is None else [s for s in applicable if s in keep])
    need = needed_stages(wanted, applicable)
    check = _FiniteCheck(inputs, dtype)
    as_dtype = _caster(dtype, check)
    staged: dict[str, tuple[FloatArray, str, tuple[str, ...]]] = {}

    # 1) project X into queries, keys and values (or take them as given)
    qkv: dict[str, FloatArray] = {}
    if inputs.mode == "projection":
        assert inputs.X is not None and inputs.W_Q is not None
        assert inputs.W_K is not None and inputs.W_V is not None
        X = as_dtype("X", inputs.X, _FLAT) if need else inputs.X
        staged["X"] = (X, "X (the input embeddings)", ("batch", "seq", "d_model"))
        bq = " + b_Q" if inputs.b_Q is not None else ""
        bk = " + b_K" if inputs.b_K is not None else ""
        bv = " + b_V" if inputs.b_V is not None else ""
        formulas = (f"Q = X·W_Q{bq}", f"K = X·W_K{bk}", f"V = X·W_V{bv}")
        for name, W, b, n in (
            ("Q", inputs.W_Q, inputs.b_Q, H),
            ("K", inputs.W_K, inputs.b_K, Hkv),
            ("V", inputs.W_V, inputs.b_V, Hkv),
        ):
            if name in need:
                W = as_dtype(f"W_{name}", W, _WEIGHT)
                b = None if b is None else as_dtype(f"b_{name}", b, _VECTOR)
                flat = check(name, project(X, W, b), _FLAT)  # (B, T, n*d)
                qkv[name] = split_heads(flat, n)  # (B, n, T, d)
    else:
        assert inputs.Q is not None and inputs.K is not None and inputs.V is not None
        for name, given in (("Q", inputs.Q), ("K", inputs.K), ("V", inputs.V)):
            qkv[name] = as_dtype(name, given, _HEADS)
        formulas = ("Q (given)", "K (given)", "V (given)")
    q, k, v = qkv.get("Q"), qkv.get("K"), qkv.get("V")
    for name, arr, formula, axes in (
        ("Q", q, formulas[0], ("batch", "head", "query", "d_k")),
        ("K", k, formulas[1], ("batch", "kv_head", "key", "d_k")),
        ("V", v, formulas[2], ("batch", "kv_head", "key", "d_v")),
    ):
        if arr is not None:
            staged[name] = (arr, formula, axes)

    # 2)-6) scores, scale, mask, softmax and the weighted sum of values, block by block
    if inputs.scale is None:
        scale, scale_source = 1.0 / math.sqrt(inputs.d_k), "default"
    else:
        scale, scale_source = inputs.scale, "fixture"
    empty: list[tuple[int, int, int]] = []
    if "scores" in need:
        assert q is not None and k is not None
        bias = None if inputs.bias is None else as_dtype("bias", inputs.bias, _SCORES)
        attended = _attend(inputs, q, k, v, scale, bias, need, wanted, check, progress)
        empty = attended.empty
        for name, formula in (
            ("scores", "scores = Q·Kᵀ"),
            ("scaled", "scaled = scores × scale"),
            ("masked", _masked_formula(inputs)),
            ("softmax", f"softmax = softmax({'masked' if _has_masked(inputs) else 'scaled'}) "
                        "over keys"),
        ):  # fmt: skip
            if name in attended.kept:
                staged[name] = (attended.kept[name], formula, _SCORES)
        if attended.output is not None:
            staged["output"] = (attended.output, "output = softmax·V", _OUTPUT)

    # 7) heads side by side, then the output projection
    if "concat" in need:
        output = staged["output"][0]
        concat = concat_heads(output)  # (B, T, H*Dv): a view, output's memory is (B, T, H, Dv)
        staged["concat"] = (
            concat,
            "concat = [head 0 | head 1 | …]",
            ("batch", "query", "heads*d_v"),
        )
        if "projected" in need:
            assert inputs.W_O is not None
            W_O = as_dtype("W_O", inputs.W_O, _WEIGHT)
            b_O = None if inputs.b_O is None else as_dtype("b_O", inputs.b_O, _VECTOR)
            bo = " + b_O" if b_O is not None else ""
            proj_axes = ("batch", "query", "d_out")
            projected = check("projected", project(concat, W_O, b_O), proj_axes)
            staged["projected"] = (projected, f"projected = concat·W_O{bo}", proj_axes)

    stages = {
        name: Stage(name, _public(data, inputs.has_batch), formula, _public_axes(axes, inputs))
        for name in applicable
        if name in wanted
        for data, formula, axes in (staged[name],)
    }
    return Trace(
        inputs=inputs,
        stages=stages,
        scale=scale,
        scale_source=scale_source,
        empty_rows=tuple(empty),
        dtype=dtype,
    )


@dataclass
class _Attended:
    kept: dict[str, FloatArray]  # the score stages that were kept, (B, H, T, S)
    output: FloatArray | None  # (B, H, T, Dv), laid out as (B, T, H, Dv) so concat is a view
    empty: list[tuple[int, int, int]]


def _attend(
    inputs: Inputs,
    q: FloatArray,  # (B, H, T, D)
    k: FloatArray,  # (B, Hkv, S, D)
    v: FloatArray | None,  # (B, Hkv, S, Dv), None when the output is not needed
    scale: float,
    bias: FloatArray | None,  # broadcastable to (B, H, T, S)
    need: set[str],
    wanted: set[str],
    check: _FiniteCheck,
    progress: Progress | None,
) -> _Attended:
    """Steps 2-6 one block of query rows at a time, writing only the stages that are kept."""
    B, H, T, _ = q.shape
    S = k.shape[2]
    groups = H // k.shape[1]  # query head h reads key/value head h // groups (repeat_interleave)
    dtype = q.dtype
    full = (B, H, T, S)
    kept: dict[str, FloatArray] = {
        s: np.empty(full, dtype) for s in ("scores", "scaled", "masked", "softmax") if s in wanted
    }
    chain = [s for s in ("scaled", "masked", "softmax") if s in need]
    output = None
    if "output" in need:
        assert v is not None
        Dv = v.shape[3]
        output = np.empty((B, T, H, Dv), dtype).transpose(0, 2, 1, 3)  # (B, H, T, Dv)
    rows = max(1, min(T, BLOCK_ELEMENTS // max(S, 1)))
    work = None if set(chain) | {"scores"} <= set(kept) else np.empty((rows, S), dtype)
    bias_full = None if bias is None else np.broadcast_to(bias, full)

    # Overflow is impossible when |q|·|k|·scale (+ |bias|) stays far below the dtype's largest
    # number (Cauchy-Schwarz), so the element-wise checks run only for inputs that big.
    big = float(np.finfo(dtype).max) / 4
    qk = _max_norm(q) * _max_norm(k)
    must_check = {
        "scores": not qk < big,
        "scaled": not qk * scale < big,
        "masked": bias is not None and not qk * scale + _max_finite(bias) < big,
        "output": v is not None and not _max_abs(v) < big,
    }
    empty: list[tuple[int, int, int]] = []
    done, blocks = 0, B * H * -(-T // rows)
    for b in range(B):
        for h in range(H):
            kT = k[b, h // groups]  # (S, D)
            for t0 in range(0, T, rows):
                t1 = min(T, t0 + rows)
                at = (b, h, t0)

                def into(stage: str) -> FloatArray:
                    """Where a stage's block goes: its kept array, else the reused buffer."""
                    if stage in kept:
                        return kept[stage][b, h, t0:t1]  # noqa: B023 (used in this iteration)
                    assert work is not None
                    return work[: t1 - t0]  # noqa: B023

                x = attention_scores(q[b, h, t0:t1], kT, out=into("scores"))  # (n, S)
                if must_check["scores"]:
                    check.block("scores", x, at)
                if "scaled" in need:
                    x = scale_scores(x, scale, out=into("scaled"))
                    if must_check["scaled"]:
                        check.block("scaled", x, at)
                if "masked" in need:
                    allowed = allowed_positions(inputs, (b, h, t0, t1))  # broadcasts to (n, S)
                    bias_b = None if bias_full is None else bias_full[b, h, t0:t1]
                    x = apply_mask(x, allowed, bias_b, out=into("masked"))
                    if must_check["masked"]:
                        check.block("masked", x, at, allowed, bias_b)
                if "softmax" in need:
                    x, none = _softmax(x, out=into("softmax"))
                    empty.extend((b, h, t0 + int(i)) for i in np.flatnonzero(none))
                if output is not None:
                    assert v is not None
                    o = weighted_sum(x, v[b, h // groups], out=output[b, h, t0:t1])  # (n, Dv)
                    if must_check["output"]:
                        check.block("output", o, at)
                done += 1
                if progress is not None:
                    progress(done, blocks)
    return _Attended(kept, output, empty)


_FLAT = ("batch", "query", "feature")
_WEIGHT = ("row", "column")
_VECTOR = ("column",)
_HEADS = ("batch", "head", "query", "d")
_SCORES = ("batch", "head", "query", "key")
_OUTPUT = ("batch", "head", "query", "d_v")


def _has_masked(inputs: Inputs) -> bool:
    return any(x is not None for x in (inputs.causal, inputs.mask, inputs.bias, inputs.lengths))


def _max_norm(x: FloatArray) -> float:
    """The largest Euclidean norm of a row (last axis), computed in float64."""
    x64 = x.astype(np.float64, copy=False)
    return float(np.sqrt(np.einsum("...d,...d->...", x64, x64).max(initial=0.0)))


def _max_abs(x: FloatArray) -> float:
    return float(np.abs(x).max(initial=0.0))


def _max_finite(x: FloatArray) -> float:
    finite = x[np.isfinite(x)]
    return _max_abs(finite)


def _masked_formula(inputs: Inputs) -> str:
    parts = ["masked = scaled"]
    if inputs.bias is not None:
        parts.append(" + bias")
    why = [
        name
        for name, given in (
            (f"causal {inputs.causal}", inputs.causal is not None),
            ("mask", inputs.mask is not None),
            ("lengths", inputs.lengths is not None),
        )
        if given
    ]
    if why:
        parts.append(f", −∞ where not allowed ({', '.join(why)})")
    return "".join(parts)


def _public(data: FloatArray, has_batch: bool) -> FloatArray:
    return data if has_batch else data[0]  # drop the batch axis the fixture did not have


def _public_axes(axes: tuple[str, ...], inputs: Inputs) -> tuple[str, ...]:
    return axes if inputs.has_batch else axes[1:]


def _caster(dtype: Dtype, check: _FiniteCheck) -> Callable[..., FloatArray]:
    """Inputs in the computing dtype; a value too big for float32 is an error, not inf."""

    def as_dtype(name: str, arr: FloatArray, axes: tuple[str, ...]) -> FloatArray:
        if dtype == "float64":
            return arr
        small = cast(FloatArray, arr.astype(np.float32))
        grew = np.isinf(small) & np.isfinite(arr)
        if grew.any():
            check.fail(name, small, axes, tuple(int(i) for i in np.argwhere(grew)[0]))
        return small

    return as_dtype


class _FiniteCheck:
    """Raise ComputeError at the first non-finite value of a stage, naming its position."""

    def __init__(self, inputs: Inputs, dtype: Dtype) -> None:
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
        """Check one (n, S) block of a score stage whose rows start at (batch, head, query)."""
        bad = ~np.isfinite(x)
        # in `masked`, -inf is meant where attending is not allowed or where the bias is -inf
        if allowed is not None:
            bad &= allowed
        if bias is not None:
            bad &= ~np.isneginf(bias)
        if bad.any():
            i, j = (int(n) for n in np.argwhere(bad)[0])
            b, h, t0 = at
            axes = _SCORES if stage != "output" else _OUTPUT
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
