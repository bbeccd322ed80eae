"""One small pure function per step of attention, named after the math; NumPy only.

Axis names used in every shape comment:
    B  batch            H    query heads        Hkv  key/value heads (grouped-query)
    T  query positions  S    key positions      C    d_model
    D  d_k per head     Dv   d_v per head       E    d_out (columns of W_O)
    R  the query rows of one block (a slice of T)

Semantics follow torch.nn.functional.scaled_dot_product_attention: scores are scaled by
``scale`` (default 1/sqrt(d_k)), a boolean mask is True where a query *may* attend, a float
bias is added after scaling, and a row with nothing to attend to gets all-zero weights. The
variants slot in as the one chain (core/chain.py) runs them, as HF transformers places them:
the Q/K transforms (QK-norm, then RoPE) on Q and K, score modifiers on the scaled scores before
the mask, biases added with the fixture's, extra logits joined to the softmax.

:func:`attention` is the chain, written once to be read top to bottom; the block engine
(engine.py), decoding, FlashAttention's tiles, the backward pass and the grader call it over
their own cells (a block of query rows, a step's cache, a tile).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from attn_cli.core.chain import Chain, Into, cells_of
from attn_cli.core.variant import Cells

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]
Array = np.ndarray[Any, Any]  # float32 or float64: a loop's arrays, as the chain's hooks take them
Where = Callable[[str], "Array | None"]  # where a step writes a stage (a kept array), or None


def project(X: FloatArray, W: FloatArray, b: FloatArray | None) -> FloatArray:
    """X @ W + b, the article's convention (a torch Linear weight is W transposed)."""
    out = X @ W  # (B, T, C) @ (C, H*D) -> (B, T, H*D)
    if b is not None:
        out += b
    return out


def repeat_kv(x: FloatArray, groups: int) -> FloatArray:
    """Query head h reads key/value head h // groups, as torch's repeat_interleave."""
    return x if groups == 1 else np.repeat(x, groups, axis=1)  # (B, Hkv, S, D) -> (B, H, S, D)


def attention_scores(q: FloatArray, k: FloatArray, out: FloatArray | None = None) -> FloatArray:
    """scores = Q Kᵀ for every head (or for one head's block of queries)."""
    scores: FloatArray = np.matmul(q, k.swapaxes(-1, -2), out=out)  # (.., T, D) @ (.., D, S)
    return scores


def scale_scores(scores: FloatArray, scale: float, out: FloatArray | None = None) -> FloatArray:
    """scaled = scores × scale."""
    scaled: FloatArray = np.multiply(scores, scale, out=out)
    return scaled


def apply_mask(
    scaled: FloatArray,
    allowed: BoolArray | None,
    bias: FloatArray | None,
    out: FloatArray | None = None,
    *,
    fill: float = -np.inf,
) -> FloatArray:
    """masked = scaled + bias, with ``fill`` (-inf, or a finite sentinel) wherever attending
    is not allowed."""
    if bias is not None:
        masked: FloatArray = np.add(scaled, bias, out=out)
    elif out is None:
        masked = scaled.copy()
    else:
        masked = out
        if out is not scaled:
            np.copyto(out, scaled)
    if allowed is not None:
        np.copyto(masked, fill, where=~allowed)
    return masked


def softmax(x: FloatArray, out: FloatArray | None = None) -> FloatArray:
    """Softmax over keys after subtracting the row maximum; a row of -inf gives zeros.

    ``out`` may be ``x`` itself: the exponentials and the division then happen in place.
    """
    return softmax_rows(x, out)[0]


def softmax_rows(
    x: FloatArray,
    out: FloatArray | None,
    sink: float | FloatArray | None = None,
    lse: FloatArray | None = None,
) -> tuple[FloatArray, BoolArray]:
    """The softmax and which rows had no key allowed (all -inf): those get all-zero weights.

    ``sink`` (gpt-oss; a number, or one per row broadcasting to (..., T, 1)) joins every row
    as one more logit and is dropped after the softmax, so the kept weights sum to less than 1.
    ``lse`` (..., T), when given, receives each row's log-sum-exp, the sink included:
    softmax = exp(x - lse).
    """
    weights, total, empty = exp_rows(x, out, sink, lse)
    np.divide(weights, total, out=weights)
    return weights, empty


def exp_rows(
    x: Array, out: Array | None, sink: float | Array | None = None, lse: Array | None = None
) -> tuple[Array, Array, Array]:
    """The softmax before its division: (exp(x − row max), each row's total (..., T, 1), which
    rows had no key allowed). The one place attn exponentiates logits; the arguments are
    :func:`softmax_rows`'. A row with nothing to exponentiate has total 1 (0 / 1, not 0 / 0).
    """
    row_max = x.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., T, 1); no key: -inf
    empty = row_max == -np.inf  # as np.isneginf, without its Python wrapper (a decode step's)
    if sink is not None:
        np.maximum(row_max, sink, out=row_max)
    none = row_max == -np.inf if sink is not None else empty  # nothing to exponentiate
    row_max[none] = 0.0  # exp(-inf - 0) = 0 across the row
    weights: Array = np.subtract(x, row_max, out=out)
    np.exp(weights, out=weights)
    total = weights.sum(axis=-1, keepdims=True)  # (..., T, 1)
    if sink is not None:
        total += np.exp(sink - row_max)
    if lse is not None:
        np.copyto(
            lse, np.where(none, -np.inf, row_max + np.log(np.where(none, 1.0, total)))[..., 0]
        )
    total[none] = 1.0  # 0 / 1, not 0 / 0
    return weights, total, empty[..., 0]


def weighted_sum(weights: FloatArray, v: FloatArray, out: FloatArray | None = None) -> FloatArray:
    """output = softmax · V."""
    output: FloatArray = np.matmul(weights, v, out=out)  # (.., T, S) @ (.., S, Dv)
    return output


# ---------------------------------------------------------------------------------------------
# The one chain of attention: every loop (the block engine, decoding, FlashAttention's tiles,
# the backward pass, the grader's references and recomputations) runs it over its own cells.


class Hooks(Protocol):
    """What :func:`attention` asks of a chain (core/chain.py ``Chain``, or :class:`Plain`)."""

    @property
    def modifiers(self) -> Sequence[tuple[Any, Any]]: ...

    def masked(
        self, x: Array, cells: Cells, out: Array | None, into: Into, fill: float | None
    ) -> tuple[Array, Array | None, list[Array]]: ...

    def extra_logit(self, cells: Cells, dtype: Any) -> Array | None: ...


def nowhere(stage: str) -> None:
    """No stage is kept: each step makes a new array."""
    return None


@dataclass(frozen=True)
class Way:
    """How a loop runs the chain over its cells; the defaults are the plain whole-array way."""

    product: Callable[[Array, Array], Array] = attention_scores  # Q Kᵀ
    mix: Callable[[Array, Array], Array] = weighted_sum  # weights · V
    runs: Container[str] | None = None  # the steps to run (None: every one)
    last: str = "output"  # the step to stop after
    fill: float | None = None  # where no key is allowed (None: the fixture's mask_value)
    divide_late: bool = False  # O = (exp · V) / total, as a fused kernel (flash's reference)
    check: Callable[[str, Array, Attention], None] | None = None  # each stage once made


PLAIN = Way()


@dataclass(slots=True)
class Attention:
    """The stages :func:`attention` made (None where a step did not run)."""

    scores: Array | None = None  # (b, h, R, S)
    scaled: Array | None = None
    modified: dict[str, Array] = field(default_factory=dict)  # capped, ...
    before: list[Array] = field(default_factory=list)  # what each modifier read
    masked: Array | None = None
    allowed: Array | None = None  # (b, h, R, S)-broadcastable; None: every key
    terms: list[Array] = field(default_factory=list)  # the biases added
    weights: Array | None = None  # softmax
    empty: Array | None = None  # (b, h, R): rows with no key allowed
    output: Array | None = None  # (b, h, R, Dv)


def attention(
    chain: Hooks,
    q: Array | None,  # (b, h, R, D), or as way.product takes it; None: ``start`` is later
    k: Array | None,  # (b, h, S, D): the keys after the K transforms, as q
    v: Array | None,  # (b, h, S, Dv), or as way.mix takes it; None: stop at the softmax
    cells: Cells,
    scale: float,
    way: Way = PLAIN,
    *,
    into: Where = nowhere,  # where a stage goes (a kept array); None: a new array
    lse: Array | None = None,  # (b, h, R): receives each row's log-sum-exp
    hidden: Array | None = None,  # more cells to hide, (b, h, R, S)-broadcastable
    start: tuple[str, Array] | None = None,  # begin after this stage, given
) -> Attention:
    """Scaled dot-product attention over the cells, the variants' hooks in place: the one
    composition of the chain. ``way.product`` and ``way.mix`` are the loop's matrix products
    (a group of query heads stacked on its kv head); ``start`` and ``way.last`` run a part of it
    (the recomputations: one stage from the one before)."""
    run = _steps(chain, way, start)
    made = Attention()
    x = None if start is None else start[1]
    # 1) scores = Q Kᵀ                                                            (b, h, R, S)
    if run("scores") and q is not None and k is not None:
        x = made.scores = _seen(way, "scores", way.product(q, k), made)
    assert x is not None, "a chain started after its last stage"
    # 2) scaled = scores × scale
    if run("scaled"):
        x = made.scaled = _seen(way, "scaled", scale_scores(x, scale, out=into("scaled")), made)
    dtype = x.dtype  # the logits' (a hook's setting never widens them)
    # 3) the score modifiers in turn (a cap: capped = cap · tanh(scaled / cap))
    for variant, value in chain.modifiers:
        if run(str(variant.stage)):
            made.before.append(x)
            x = made.modified[variant.stage] = variant.modify(value, x, out=into(variant.stage))
    # 4) masked = + the biases (the fixture's, ALiBi), the fill where no key is allowed
    if run("masked"):
        x, made.allowed, made.terms = chain.masked(x, cells, into("masked"), into, way.fill)
        if hidden is not None:
            np.copyto(x, -np.inf, where=hidden)
        x = made.masked = _seen(way, "masked", x.astype(dtype, copy=False), made)
    # 5) softmax, the extra logits (a sink per head) joined to every row         (b, h, R, S)
    if run("softmax"):
        sink = chain.extra_logit(cells, x.dtype)  # (1, h, 1, 1) or None
        x, total, made.empty = exp_rows(x, into("softmax"), sink, lse)
        if not way.divide_late:
            x = np.divide(x, total, out=x)
        made.weights = x
    # 6) output = softmax · V                                                     (b, h, R, Dv)
    if run("output") and v is not None:
        made.output = way.mix(x, v)
        if way.divide_late:
            np.divide(made.output, total, out=made.output)
        _seen(way, "output", made.output, made)
    return made


def _steps(chain: Hooks, way: Way, start: tuple[str, Array] | None) -> Callable[[str], bool]:
    """Whether a step runs: after ``start``, up to ``way.last``, and in ``way.runs``."""
    if start is None and way.runs is None and way.last == "output":
        return _every  # the whole chain (a decode step's: no list to build)
    order = ["scores", "scaled", *(str(v.stage) for v, _ in chain.modifiers)]
    order += ["masked", "softmax", "output"]
    first = 0 if start is None else order.index(start[0]) + 1
    last = order.index(way.last)
    runs = way.runs
    return lambda step: first <= order.index(step) <= last and (runs is None or step in runs)


def _every(step: str) -> bool:
    return True


def _seen(way: Way, stage: str, x: Array, made: Attention) -> Array:
    if way.check is not None:
        way.check(stage, x, made)
    return x


def in_place(x: Array, chain: Hooks, fresh: bool = False) -> Where:
    """Where a tile's or a block's chain writes: every step into ``x``, its scores (each score
    modifier into a new array when ``fresh``: the backward pass keeps what each read, and
    masked into the last of them); a bias stage nowhere."""
    made = [x]
    modifiers = {str(v.stage) for v, _ in chain.modifiers}

    def into(stage: str) -> Array | None:
        if stage in modifiers:
            if fresh:
                made.append(np.empty_like(x))
            return made[-1]
        return made[-1] if stage in ("scaled", "masked", "softmax") else None

    return into


class Plain:
    """The hooks of attention without variants: torch's scaled_dot_product_attention with a
    boolean ``allowed`` (True: may attend) and a float ``bias``."""

    def __init__(
        self,
        allowed: BoolArray | None,
        bias: FloatArray | None,
        modifiers: Sequence[tuple[Any, Any]] = (),  # a chain's score modifiers, if any
    ) -> None:
        self.allowed, self.bias, self.modifiers = allowed, bias, modifiers

    @staticmethod
    def cells(B: int, H: int, T: int, S: int) -> Cells:
        """Cells of the right sizes: no hook of these reads them."""
        return Cells(*(np.zeros(n, np.int64) for n in (B, H, T, S, T, S)))

    def masked(
        self, x: FloatArray, cells: Cells, out: FloatArray | None, into: Into, fill: float | None
    ) -> tuple[FloatArray, BoolArray | None, list[FloatArray]]:
        if self.allowed is None and self.bias is None:
            return x, None, []
        fill = -np.inf if fill is None else fill
        return apply_mask(x, self.allowed, self.bias, out, fill=fill), self.allowed, []

    def extra_logit(self, cells: Cells, dtype: Any) -> FloatArray | None:
        return None


def sdpa(
    q: FloatArray,  # (B, H, T, D)
    k: FloatArray,  # (B, Hkv, S, D)
    v: FloatArray,  # (B, Hkv, S, Dv)
    allowed: BoolArray | None = None,  # broadcasts to (B, H, T, S); True = may attend
    bias: FloatArray | None = None,  # broadcasts to (B, H, T, S)
    scale: float | None = None,
) -> tuple[FloatArray, FloatArray]:
    """torch's scaled_dot_product_attention on whole arrays, :func:`attention` without
    variants: ``(output, weights)``, the probe's reference."""
    groups = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # (B, H, S, D), (B, H, S, Dv)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    B, H, T = q.shape[:3]
    cells = Plain.cells(B, H, T, k.shape[2])
    made = attention(Plain(allowed, bias), q, k, v, cells, float(scale))
    assert made.output is not None and made.weights is not None
    return made.output, made.weights  # (B, H, T, Dv), (B, H, T, S)


def allowed_positions(
    inputs: Inputs, block: tuple[int, int, int, int] | None = None
) -> BoolArray | None:
    """Where a query may attend (True), as the chain's rules say (causal, window, mask,
    lengths); None when all may.

    The whole (B, H, T, S) array, or for ``block`` = (b, h, t0, t1) the query rows t0:t1 of
    head h in batch item b, as an array that broadcasts to (R, S).
    """
    if block is None:
        cells = cells_of(inputs, slice(None), slice(None), slice(None))
        allowed = Chain(inputs).allowed(cells)
        return None if allowed is None else np.broadcast_to(allowed, cells.shape).copy()
    b, h, t0, t1 = block
    cells = cells_of(inputs, slice(b, b + 1), slice(h, h + 1), slice(t0, t1))
    allowed = Chain(inputs).allowed(cells)
    return None if allowed is None else np.broadcast_to(allowed, cells.shape)[0, 0]
