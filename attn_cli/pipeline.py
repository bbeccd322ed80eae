"""The attention pipeline: pure NumPy, float64, no I/O, one small function per stage.

Axis names used in every shape comment:
    B  batch            H    query heads        Hkv  key/value heads (grouped-query)
    T  query positions  S    key positions      C    d_model
    D  d_k per head     Dv   d_v per head       E    d_out (columns of W_O)

Semantics follow torch.nn.functional.scaled_dot_product_attention: scores are scaled by
``scale`` (default 1/sqrt(d_k)), a boolean mask is True where a query *may* attend, a float
bias is added after scaling, and a row with nothing to attend to gets all-zero weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from attn_cli.errors import ComputeError
from attn_cli.fixture import STAGE_NAMES, FloatArray, Inputs

BoolArray = np.ndarray[Any, np.dtype[np.bool_]]


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
    """Every stage of one attention computation, in pipeline order."""

    inputs: Inputs
    stages: Mapping[str, Stage]
    scale: float
    scale_source: str  # "fixture" or "default"
    empty_rows: tuple[tuple[int, int, int], ...]  # (batch, head, query) rows with no allowed key

    def __getitem__(self, name: str) -> Stage:
        return self.stages[name]

    def __contains__(self, name: object) -> bool:
        return name in self.stages

    def __iter__(self) -> Iterator[Stage]:
        return iter(self.stages.values())

    @property
    def query_labels(self) -> tuple[str, ...]:
        return self.inputs.tokens or tuple(str(i) for i in range(self.inputs.seq_q))

    @property
    def key_labels(self) -> tuple[str, ...]:
        return self.inputs.key_tokens or tuple(str(i) for i in range(self.inputs.seq_k))


# ---------------------------------------------------------------------------------------------
# One function per step


def project(X: FloatArray, W: FloatArray, b: FloatArray | None) -> FloatArray:
    """X @ W + b, the article's convention (a torch Linear weight is W transposed)."""
    out = X @ W  # (B, T, C) @ (C, n*D) -> (B, T, n*D)
    return out if b is None else out + b


def split_heads(x: FloatArray, n: int) -> FloatArray:
    """Contiguous column blocks become heads: head h owns columns h*d:(h+1)*d."""
    B, T, width = x.shape
    heads: FloatArray = x.reshape(B, T, n, width // n).transpose(0, 2, 1, 3)  # (B, n, T, d)
    return heads


def repeat_kv(x: FloatArray, groups: int) -> FloatArray:
    """Query head h reads key/value head h // groups, as torch's repeat_interleave."""
    return x if groups == 1 else np.repeat(x, groups, axis=1)  # (B, H, S, d)


def attention_scores(q: FloatArray, k: FloatArray) -> FloatArray:
    """scores = Q Kᵀ for every head."""
    scores: FloatArray = q @ k.swapaxes(-1, -2)  # (B, H, T, D) @ (B, H, D, S) -> (B, H, T, S)
    return scores


def scale_scores(scores: FloatArray, scale: float) -> FloatArray:
    """scaled = scores × scale."""
    return scores * scale


def allowed_positions(inputs: Inputs) -> BoolArray | None:
    """Where a query may attend (True), from causal, mask and lengths; None when all may."""
    B, H, T, S = inputs.batch, inputs.heads, inputs.seq_q, inputs.seq_k
    allowed = np.ones((B, H, T, S), dtype=bool)
    touched = False
    if inputs.causal is not None:
        # upper-left: key j <= query i; lower-right: the last query sees every key (KV cache).
        offset = 0 if inputs.causal == "upper-left" else S - T
        allowed &= np.tril(np.ones((T, S), dtype=bool), k=offset)  # (T, S)
        touched = True
    if inputs.mask is not None:
        allowed &= inputs.mask  # broadcast right-aligned to (B, H, T, S)
        touched = True
    if inputs.lengths is not None:
        allowed &= (np.arange(S)[None, :] < inputs.lengths[:, None])[:, None, None, :]  # (B,1,1,S)
        touched = True
    return allowed if touched else None


def apply_mask(
    scaled: FloatArray, allowed: BoolArray | None, bias: FloatArray | None
) -> FloatArray:
    """masked = scaled + bias, with -inf wherever attending is not allowed."""
    masked = scaled if bias is None else scaled + bias  # (B, H, T, S)
    if allowed is not None:
        masked = np.where(allowed, masked, -np.inf)
    return masked


def softmax(x: FloatArray) -> FloatArray:
    """Softmax over keys after subtracting the row maximum; a row of -inf gives zeros."""
    row_max = x.max(axis=-1, keepdims=True)  # (B, H, T, 1)
    empty = np.isneginf(row_max)
    e = np.exp(x - np.where(empty, 0.0, row_max))
    total = e.sum(axis=-1, keepdims=True)
    weights: FloatArray = np.divide(e, total, out=np.zeros_like(e), where=~empty)
    return weights


def weighted_sum(weights: FloatArray, v: FloatArray) -> FloatArray:
    """output = softmax · V."""
    out: FloatArray = weights @ v  # (B, H, T, S) @ (B, H, S, Dv) -> (B, H, T, Dv)
    return out


def concat_heads(out: FloatArray) -> FloatArray:
    """Heads side by side: head h fills columns h*d_v:(h+1)*d_v."""
    B, H, T, Dv = out.shape
    concat: FloatArray = out.transpose(0, 2, 1, 3).reshape(B, T, H * Dv)  # (B, T, H*Dv)
    return concat


# ---------------------------------------------------------------------------------------------
# The whole run


def run(inputs: Inputs) -> Trace:
    """Run every stage that applies and return the trace."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        return _run(inputs)


def _run(inputs: Inputs) -> Trace:
    H, Hkv = inputs.heads, inputs.kv_heads
    bq = " + b_Q" if inputs.b_Q is not None else ""
    bk = " + b_K" if inputs.b_K is not None else ""
    bv = " + b_V" if inputs.b_V is not None else ""
    staged: dict[str, tuple[FloatArray, str, tuple[str, ...]]] = {}
    check = _FiniteCheck(inputs)

    # 1) project X into queries, keys and values (or take them as given)
    if inputs.mode == "projection":
        assert inputs.X is not None and inputs.W_Q is not None
        assert inputs.W_K is not None and inputs.W_V is not None
        staged["X"] = (inputs.X, "X (the input embeddings)", ("batch", "seq", "d_model"))
        q = split_heads(check("Q", project(inputs.X, inputs.W_Q, inputs.b_Q), _FLAT), H)
        k = split_heads(check("K", project(inputs.X, inputs.W_K, inputs.b_K), _FLAT), Hkv)
        v = split_heads(check("V", project(inputs.X, inputs.W_V, inputs.b_V), _FLAT), Hkv)
        formulas = (f"Q = X·W_Q{bq}", f"K = X·W_K{bk}", f"V = X·W_V{bv}")
    else:
        assert inputs.Q is not None and inputs.K is not None and inputs.V is not None
        q, k, v = inputs.Q, inputs.K, inputs.V
        formulas = ("Q (given)", "K (given)", "V (given)")
    staged["Q"] = (q, formulas[0], ("batch", "head", "query", "d_k"))
    staged["K"] = (k, formulas[1], ("batch", "kv_head", "key", "d_k"))
    staged["V"] = (v, formulas[2], ("batch", "kv_head", "key", "d_v"))

    # 2) every query against every key; grouped-query heads share their key/value head
    groups = H // Hkv
    k_rep, v_rep = repeat_kv(k, groups), repeat_kv(v, groups)  # (B, H, S, D), (B, H, S, Dv)
    score_axes = ("batch", "head", "query", "key")
    scores = check("scores", attention_scores(q, k_rep), score_axes)
    staged["scores"] = (scores, "scores = Q·Kᵀ", score_axes)

    # 3) scale, so that the spread of scores does not grow with d_k
    if inputs.scale is None:
        scale, scale_source = 1.0 / math.sqrt(inputs.d_k), "default"
    else:
        scale, scale_source = inputs.scale, "fixture"
    scaled = check("scaled", scale_scores(scores, scale), score_axes)
    staged["scaled"] = (scaled, "scaled = scores × scale", score_axes)

    # 4) mask: add the bias, then -inf where a query may not look
    allowed = allowed_positions(inputs)
    weights_in = scaled
    if allowed is not None or inputs.bias is not None:
        masked = apply_mask(scaled, allowed, inputs.bias)
        # -inf is meant only where not allowed or where the bias is -inf; elsewhere it is overflow
        meant = np.zeros(masked.shape, bool) if inputs.bias is None else np.isneginf(inputs.bias)
        if allowed is not None:
            meant = meant | ~allowed
        check("masked", np.where(meant, 0.0, masked), score_axes)
        staged["masked"] = (masked, _masked_formula(inputs), score_axes)
        weights_in = masked

    # 5) softmax over keys: each row becomes weights that sum to 1 (or 0 for an empty row)
    weights = softmax(weights_in)  # (B, H, T, S)
    empty = np.argwhere(np.isneginf(weights_in).all(axis=-1))  # (n, 3): batch, head, query
    staged["softmax"] = (weights, "softmax = softmax(masked) over keys"
                         if "masked" in staged else "softmax = softmax(scaled) over keys",
                         score_axes)  # fmt: skip

    # 6) weighted sum of values
    out_axes = ("batch", "head", "query", "d_v")
    output = check("output", weighted_sum(weights, v_rep), out_axes)
    staged["output"] = (output, "output = softmax·V", out_axes)

    # 7) heads side by side, then the output projection
    if H > 1 or inputs.W_O is not None:
        concat = concat_heads(output)  # (B, T, H*Dv)
        staged["concat"] = (
            concat,
            "concat = [head 0 | head 1 | …]",
            ("batch", "query", "heads*d_v"),
        )
        if inputs.W_O is not None:
            bo = " + b_O" if inputs.b_O is not None else ""
            proj_axes = ("batch", "query", "d_out")
            projected = check("projected", project(concat, inputs.W_O, inputs.b_O), proj_axes)
            staged["projected"] = (projected, f"projected = concat·W_O{bo}", proj_axes)

    assert list(staged) == [s for s in STAGE_NAMES if s in staged]
    stages = {
        name: Stage(name, _public(data, inputs.has_batch), formula, _public_axes(axes, inputs))
        for name, (data, formula, axes) in staged.items()
    }
    return Trace(
        inputs=inputs,
        stages=stages,
        scale=scale,
        scale_source=scale_source,
        empty_rows=tuple((int(b), int(h), int(t)) for b, h, t in empty),
    )


_FLAT = ("batch", "query", "feature")


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


class _FiniteCheck:
    """Raise ComputeError at the first non-finite value of a stage, naming its position."""

    def __init__(self, inputs: Inputs) -> None:
        self.inputs = inputs

    def __call__(self, stage: str, arr: FloatArray, axes: tuple[str, ...]) -> FloatArray:
        bad = ~np.isfinite(arr)
        if bad.any():
            pos = tuple(int(i) for i in np.argwhere(bad)[0])
            where = ", ".join(self._label(a, i) for a, i in zip(axes, pos, strict=True))
            raise ComputeError(
                self.inputs.source, f"{stage}[{where}]",
                f"is {arr[pos]} (float64 overflow)", "finite values; scale the inputs down",
            )  # fmt: skip
        return arr

    def _label(self, axis: str, i: int) -> str:
        labels = {"query": self.inputs.tokens, "key": self.inputs.key_tokens}.get(axis)
        if labels:
            return f"{axis} {i} {labels[i]!r}"
        return f"{axis} {i}"
