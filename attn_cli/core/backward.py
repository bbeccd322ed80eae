"""The backward pass of attention: every gradient, stage by stage, in pure NumPy.

Each gradient is named ``d_`` + its forward stage and laid out like it (axis names as in the
pipeline: B batch, H query heads, Hkv key/value heads, T queries, S keys, C d_model, D d_k,
Dv d_v, E d_out). Going backward from the final stage:

    projected = concat·W_O + b_O   d_concat = d_projected·W_Oᵀ, d_W_O = concatᵀ·d_projected
    output = P·V                   d_softmax = dP = dO·Vᵀ,  d_V = Pᵀ·dO (summed over a GQA group)
    P = softmax(masked)            d_masked = dS = P ∘ (dP − rowsum(dP ∘ P)), 0 where not allowed
    y = modifier(x)                d_x = the modifier's Jacobian applied to d_y (``grad_modify``)
    scaled = scores × scale        d_scores = d_scaled × scale
    scores = Q·Kᵀ                  d_Q = d_scores·K,  d_K = d_scoresᵀ·Q (summed over a GQA group)
    Q_t = transform(Q) (QK-norm,   d_Q = the transform's Jacobian applied to d_Q_t, each transform
      RoPE, ...)                   in turn, the last first (``grad_transform``)
    an extra logit of the softmax  its gradient from P and Delta (``grad_extra``)
    Q = X·W_Q + b_Q                d_X = d_Q·W_Qᵀ + d_K·W_Kᵀ + d_V·W_Vᵀ,  d_W_Q = Xᵀ·d_Q, ...
    gated = transform(output)      d_output and the transform's own gradients (a gate's d_gate,
      (a gate)                     d_W_G, its path into d_X), the transform's ``grad_out``

The variants that change the scores (the score modifiers between ``scaled`` and ``masked``, the
extra logits of the softmax) come in as the forward's chain (core/chain.py): each modifier's
stage gets its gradient ``d_`` + the stage, each extra logit the gradient its variant names.

FlashAttention-2 stores no weights for the backward: rowsum(dP ∘ P) = rowsum(dO ∘ O) because
O = P·V, so Delta = rowsum(dO ∘ O) (``delta_flash``) gives dS = P ∘ (dP − Delta).

``backward_mistakes`` recomputes the gradients the way the common mistakes do, for the grader.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from attn_cli.core.chain import Chain
from attn_cli.core.heads import merge_heads as merge_heads
from attn_cli.core.heads import split_heads as split_heads
from attn_cli.core.steps import Plain, Way, attention, in_place
from attn_cli.core.variant import REGISTRY

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]
Back = Callable[[FloatArray], FloatArray]  # d_Q_rot -> d_Q_norm: back through one Q/K transform
# d_gated -> (d_output, its gradient stages, its path into d_X): back through a head-output one
BackOut = Callable[[FloatArray], tuple[FloatArray, dict[str, FloatArray], FloatArray | None]]
Unrotate = Back  # (its old name)
_Maybe = FloatArray | None


@dataclass(frozen=True, eq=False)
class ForwardArrays:
    """What the backward needs from the forward, in the internal layouts.

    ``q`` and ``k`` are what entered ``scores``: after the Q/K transforms in ``back_q`` and
    ``back_k``, each (its stage, the map that carries that stage's gradient back to the stage
    before it, e.g. ``apply_rope(..., inverse=True)`` for ``Q_rot``), in forward order.
    ``chain`` holds the variants' hooks (score modifiers, extra logits) and ``before`` what each
    score modifier read, in chain order (``scaled`` for the first); ``bias`` is the sum of the
    chain's biases, needed only by the masked-gradient mistake. ``X`` is None in direct mode;
    ``X_kv`` is set for cross-attention.
    """

    q: FloatArray  # (B, H, T, D)
    k: FloatArray  # (B, Hkv, S, D)
    v: FloatArray  # (B, Hkv, S, Dv)
    weights: FloatArray  # (B, H, T, S), the softmax stage P
    output: FloatArray  # (B, H, T, Dv)
    scale: float
    allowed: BoolArray | None = None  # broadcasts to (B, H, T, S); True where a query may attend
    bias: FloatArray | None = None  # broadcasts to (B, H, T, S), added after the modifiers
    chain: Chain | None = None  # None: no score modifier and no extra logit
    before: tuple[FloatArray, ...] = ()  # (B, H, T, S) each: every score modifier's input
    X: FloatArray | None = None  # (B, T, C)
    X_kv: FloatArray | None = None  # (B, S, C_kv)
    W_Q: FloatArray | None = None  # (C, H*D)
    W_K: FloatArray | None = None  # (C_kv, Hkv*D)
    W_V: FloatArray | None = None  # (C_kv, Hkv*Dv)
    W_O: FloatArray | None = None  # (H*Dv, E)
    b_Q: FloatArray | None = None  # (H*D,)
    b_K: FloatArray | None = None  # (Hkv*D,)
    b_V: FloatArray | None = None  # (Hkv*Dv,)
    b_O: FloatArray | None = None  # (E,)
    back_q: tuple[tuple[str, Back], ...] = ()  # (("Q_norm", d_Q_norm -> d_Q), ("Q_rot", ...))
    back_k: tuple[tuple[str, Back], ...] = ()
    joined: FloatArray | None = None  # (B, H, T, Dv): what concat joined, when not output (gated)
    back_out: tuple[BackOut, ...] = ()  # the head-output transforms, in forward order

    def __post_init__(self) -> None:
        B, H, T, _ = self.q.shape
        Hkv, S = self.k.shape[1], self.k.shape[2]
        assert H % Hkv == 0, f"{H} query heads cannot share {Hkv} key/value heads"
        assert self.weights.shape == (B, H, T, S), f"weights {self.weights.shape}"
        assert self.output.shape == (B, H, T, self.v.shape[3]), f"output {self.output.shape}"
        modifiers = 0 if self.chain is None else len(self.chain.stages)
        assert len(self.before) == modifiers, f"{modifiers} score modifiers need their inputs"
        weights = (self.W_Q, self.W_K, self.W_V)
        assert self.X is None or all(W is not None for W in weights), "X needs W_Q, W_K, W_V"

    @property
    def groups(self) -> int:
        """Query heads per key/value head: head h reads key/value head h // groups."""
        return int(self.q.shape[1] // self.k.shape[1])

    @property
    def has_masked(self) -> bool:
        """Whether the forward has a `masked` stage (a mask, causal, lengths or a bias)."""
        return self.allowed is not None or self.bias is not None

    @property
    def has_concat(self) -> bool:
        """Whether the forward has a `concat` stage (several heads or an output projection)."""
        return self.q.shape[1] > 1 or self.W_O is not None


@dataclass(frozen=True, eq=False)
class Gradients:
    """dL/d(stage) for every stage the forward has, laid out like the stage; None if absent.

    ``variant`` holds the gradients the chain's variants add, by name: each Q/K transform's
    stage (``d_Q_rot``, laid out as Q or K), each score modifier's stage (``d_`` + its stage,
    (B, H, T, S)) and each extra logit's (its ``gradient``, (H,)).
    """

    d_output: FloatArray  # (B, H, T, Dv)
    d_softmax: FloatArray  # (B, H, T, S)
    d_V: FloatArray  # (B, Hkv, S, Dv)
    d_scaled: FloatArray  # (B, H, T, S)
    d_scores: FloatArray  # (B, H, T, S)
    d_Q: FloatArray  # (B, H, T, D)
    d_K: FloatArray  # (B, Hkv, S, D)
    d_projected: FloatArray | None = None  # (B, T, E)
    d_W_O: FloatArray | None = None  # (H*Dv, E)
    d_b_O: FloatArray | None = None  # (E,)
    d_concat: FloatArray | None = None  # (B, T, H*Dv)
    d_masked: FloatArray | None = None  # (B, H, T, S)
    d_X: FloatArray | None = None  # (B, T, C)
    d_X_kv: FloatArray | None = None  # (B, S, C_kv)
    d_W_Q: FloatArray | None = None  # (C, H*D)
    d_W_K: FloatArray | None = None  # (C_kv, Hkv*D)
    d_W_V: FloatArray | None = None  # (C_kv, Hkv*Dv)
    d_b_Q: FloatArray | None = None  # (H*D,)
    d_b_K: FloatArray | None = None  # (Hkv*D,)
    d_b_V: FloatArray | None = None  # (Hkv*Dv,)
    variant: Mapping[str, FloatArray] = field(default_factory=dict)

    def stages(self) -> dict[str, FloatArray]:
        """The gradients present, in backward order (GRADIENT_STAGES, then VARIANT_GRADIENTS,
        as the registry has them now; then any of ``variant`` no longer registered)."""
        have = {**{n: getattr(self, n) for n in _FIELDS}, **self.variant}
        names = dict.fromkeys((*gradient_order(), *self.variant))
        return {n: a for n in names if (a := have.get(n)) is not None}

    def __iter__(self) -> Iterator[tuple[str, FloatArray]]:
        return iter(self.stages().items())


# Backward order: from the final stage to the inputs; the score modifiers' gradients go between
# d_masked and d_scaled, the last modifier's first; the Q/K transforms' between d_scores and d_Q,
# the last transform's first (those with ``grad_late``, QK-norm's, after d_b_V).
_TO_MASKED = (
    "d_projected",
    "d_W_O",
    "d_b_O",
    "d_concat",
    "d_output",
    "d_softmax",
    "d_V",
    "d_masked",
)
_TO_SCORES = ("d_scaled", "d_scores")
_FROM_QK = ("d_Q", "d_K", "d_X", "d_X_kv", "d_W_Q", "d_W_K", "d_W_V", "d_b_Q", "d_b_K", "d_b_V")
_FIELDS = (*_TO_MASKED, *_TO_SCORES, *_FROM_QK)
_CONCAT = _TO_MASKED.index("d_concat") + 1  # the head-output transforms' gradients go after it
assert set(_FIELDS) | {"variant"} == {f.name for f in fields(Gradients)}


def out_gradients() -> tuple[str, ...]:
    """The gradient stages of the registered head-output transforms (a gate's), backward order."""
    return tuple(n for v in reversed(REGISTRY.values()) for n in v.out_gradients)


def modifier_gradients() -> tuple[str, ...]:
    """The gradient stages of the registered score modifiers (``d_`` + stage), backward order."""
    return tuple(f"d_{v.stage}" for v in reversed(REGISTRY.values()) if v.stage is not None)


def extra_gradients() -> tuple[str, ...]:
    """The gradient stages of the registered extra logits, in registry order."""
    return tuple(v.gradient for v in REGISTRY.values() if v.gradient is not None)


def transform_gradients(late: bool) -> tuple[str, ...]:
    """The gradient stages of the registered Q/K transforms (``d_Q_rot``, ``d_K_rot``), the
    last transform's first; ``late``: those listed after the inputs' (``grad_late``)."""
    return tuple(
        f"d_{which}_{v.suffix}"
        for v in reversed(REGISTRY.values())
        if v.suffix is not None and v.grad_late == late
        for which in v.transforms
    )


def gradient_order() -> tuple[str, ...]:
    """Every gradient stage the registry makes possible now, in backward order."""
    return (
        *_TO_MASKED[:_CONCAT],
        *out_gradients(),
        *_TO_MASKED[_CONCAT:],
        *modifier_gradients(),
        *_TO_SCORES,
        *transform_gradients(late=False),
        *_FROM_QK,
        *transform_gradients(late=True),
        *extra_gradients(),
    )


# As the registry stands when this module is imported (the variants attn ships).
GRADIENT_STAGES = (
    *_TO_MASKED[:_CONCAT],
    *out_gradients(),
    *_TO_MASKED[_CONCAT:],
    *modifier_gradients(),
    *_TO_SCORES,
    *transform_gradients(late=False),
    *_FROM_QK,
)
VARIANT_GRADIENTS = (*transform_gradients(late=True), *extra_gradients())


# ---------------------------------------------------------------------------------------------
# One function per gradient step


def grad_linear(
    d_out: FloatArray, x: FloatArray, W: FloatArray, has_bias: bool
) -> tuple[FloatArray, FloatArray, FloatArray | None]:
    """out = x·W + b  =>  d_x = d_out·Wᵀ, d_W = xᵀ·d_out (over batch and rows), d_b = Σ d_out."""
    d_x: FloatArray = d_out @ W.T  # (B, T, out) @ (out, in) -> (B, T, in)
    d_W: FloatArray = np.einsum("bti,bto->io", x, d_out)  # (in, out)
    d_b: FloatArray | None = d_out.sum(axis=(0, 1)) if has_bias else None  # (out,)
    return d_x, d_W, d_b


def group_sum(x: FloatArray, groups: int) -> FloatArray:
    """Sum each GQA group of query heads into its key/value head: (B, H, ...) -> (B, Hkv, ...)."""
    if groups == 1:
        return x
    B, H = x.shape[:2]
    summed: FloatArray = x.reshape(B, H // groups, groups, *x.shape[2:]).sum(axis=2)
    return summed  # (B, Hkv, ...)


def grad_weights(d_output: FloatArray, v: FloatArray, groups: int) -> FloatArray:
    """output = P·V  =>  dP = dO·Vᵀ, query head h reading key/value head h // groups."""
    B, H, T, Dv = d_output.shape
    Hkv, S = v.shape[1], v.shape[2]
    dO = d_output.reshape(B, Hkv, groups, T, Dv)  # (B, Hkv, g, T, Dv)
    vT = v[:, :, None].swapaxes(-1, -2)  # (B, Hkv, 1, Dv, S)
    dP: FloatArray = (dO @ vT).reshape(B, H, T, S)  # (B, H, T, S)
    return dP


def grad_values_per_head(weights: FloatArray, d_output: FloatArray) -> FloatArray:
    """output = P·V  =>  each query head's share of dV: Pᵀ·dO."""
    dV: FloatArray = weights.swapaxes(-1, -2) @ d_output  # (B, H, S, T) @ (B, H, T, Dv)
    return dV  # (B, H, S, Dv)


def delta_softmax(d_softmax: FloatArray, weights: FloatArray) -> FloatArray:
    """Delta = rowsum(dP ∘ P): the weighted mean of dP along each row."""
    delta: FloatArray = (d_softmax * weights).sum(axis=-1)  # (B, H, T)
    return delta


def delta_flash(d_output: FloatArray, output: FloatArray) -> FloatArray:
    """Delta = rowsum(dO ∘ O), FlashAttention-2's form: equals rowsum(dP ∘ P) since O = P·V."""
    delta: FloatArray = (d_output * output).sum(axis=-1)  # (B, H, T)
    return delta


def grad_softmax_input(weights: FloatArray, d_softmax: FloatArray) -> FloatArray:
    """P = softmax(x)  =>  dS = P ∘ (dP − rowsum(dP ∘ P)), the softmax Jacobian applied."""
    delta = delta_softmax(d_softmax, weights)[..., None]  # (B, H, T, 1)
    dS: FloatArray = weights * (d_softmax - delta)
    return dS  # (B, H, T, S)


def zero_not_allowed(d_masked: FloatArray, allowed: BoolArray | None) -> FloatArray:
    """masked is a constant -inf where not allowed, so no gradient goes there: exactly 0."""
    if allowed is None:
        return d_masked
    zeroed: FloatArray = np.where(allowed, d_masked, 0.0)  # (B, H, T, S)
    return zeroed


def grad_masked(
    weights: FloatArray, d_softmax: FloatArray, allowed: BoolArray | None
) -> FloatArray:
    """d_masked = P ∘ (dP − rowsum(dP ∘ P)), exactly 0 where attending is not allowed."""
    return zero_not_allowed(grad_softmax_input(weights, d_softmax), allowed)


def grad_modifiers(
    chain: Chain | None, d_last: FloatArray, before: tuple[FloatArray, ...]
) -> tuple[dict[str, FloatArray], FloatArray]:
    """Back through the score modifiers: each one's stage gradient (``d_`` + its stage), the
    last modifier's first (it is ``d_last``, what the softmax's input passed on), and d_scaled."""
    if chain is None or not chain.stages:
        return {}, d_last
    d_inputs = chain.grad_modifiers(d_last, list(before))  # the last modifier's input first
    d_outputs = [d_last, *d_inputs[:-1]]  # a modifier's output is the next one's input
    names = [f"d_{stage}" for stage in reversed(chain.stages)]
    return dict(zip(names, d_outputs, strict=True)), d_inputs[-1]


def grad_extras(
    chain: Chain | None, weights: FloatArray, d_softmax: FloatArray
) -> dict[str, FloatArray]:
    """The gradient of each extra logit joined to the softmax rows, (H,) each, by stage name."""
    if chain is None or not chain.extra:
        return {}
    return chain.grad_extras(weights, delta_softmax(d_softmax, weights))


def grad_transforms(
    back: tuple[tuple[str, Back], ...], d_last: FloatArray
) -> tuple[dict[str, FloatArray], FloatArray]:
    """Back through the Q/K transforms: each one's stage gradient (``d_Q_rot`` ...), the last
    transform's first (it is ``d_last``, what the scores passed on), and d_Q (or d_K)."""
    grads = {}
    d = d_last
    for stage, grad in reversed(back):
        grads[f"d_{stage}"] = d
        d = grad(d)
    return grads, d


def grad_scale(d_scaled: FloatArray, scale: float) -> FloatArray:
    """scaled = scores × scale  =>  d_scores = d_scaled × scale."""
    d_scores: FloatArray = d_scaled * scale
    return d_scores


def grad_queries(d_scores: FloatArray, k: FloatArray, groups: int) -> FloatArray:
    """scores = Q·Kᵀ  =>  dQ = dScores·K, query head h reading key head h // groups."""
    B, H, T, S = d_scores.shape
    Hkv, D = k.shape[1], k.shape[3]
    dS = d_scores.reshape(B, Hkv, groups, T, S)  # (B, Hkv, g, T, S)
    dQ: FloatArray = (dS @ k[:, :, None]).reshape(B, H, T, D)  # (B, H, T, D)
    return dQ


def grad_keys_per_head(d_scores: FloatArray, q: FloatArray) -> FloatArray:
    """scores = Q·Kᵀ  =>  each query head's share of dK: dScoresᵀ·Q."""
    dK: FloatArray = d_scores.swapaxes(-1, -2) @ q  # (B, H, S, T) @ (B, H, T, D)
    return dK  # (B, H, S, D)


# ---------------------------------------------------------------------------------------------
# The whole backward pass, with the steps a mistake may replace


@dataclass(frozen=True)
class _Steps:
    """The steps where the named mistakes happen; the defaults are the right ones."""

    softmax_input: Callable[[ForwardArrays, FloatArray], FloatArray] = field(
        default=lambda fwd, d_softmax: grad_masked(fwd.weights, d_softmax, fwd.allowed)
    )
    scale: Callable[[FloatArray, float], FloatArray] = grad_scale
    keys_per_head: Callable[[FloatArray, FloatArray], FloatArray] = grad_keys_per_head
    values_per_head: Callable[[FloatArray, FloatArray], FloatArray] = grad_values_per_head
    group: Callable[[FloatArray, int], FloatArray] = group_sum
    paths: frozenset[str] = frozenset("QKV")  # which projections' paths d_X (d_X_kv) sums


_RIGHT = _Steps()


def attention_backward(fwd: ForwardArrays, grad: FloatArray | None = None) -> Gradients:
    """Every gradient of L, given grad = dL/d(final stage); None means L = sum(final stage)."""
    return _backward(fwd, grad, _RIGHT)


def _backward(fwd: ForwardArrays, grad: FloatArray | None, steps: _Steps) -> Gradients:
    """The backward pass, one step per stage, from the final stage to the inputs."""
    g = fwd.groups
    # 1) output projection and heads (d_projected, d_W_O, d_b_O, d_concat), then back through
    # the head-output transforms (a gate) to d_output
    d_projected, d_W_O, d_b_O, d_concat, d_joined = _output_side(fwd, grad)
    d_output, d_outs, d_X_out = _grad_outs(fwd.back_out, d_joined)
    more = {n: d_outs.pop(n) for n in _QKV if n in d_outs}  # a second map's (diff)
    # 2) through the weighted sum: dP and dV
    d_softmax = grad_weights(d_output, fwd.v, g)  # (B, H, T, S)
    d_V = steps.group(steps.values_per_head(fwd.weights, d_output), g)  # (B, Hkv, S, Dv)
    d_V = _plus(d_V, more, "d_V")
    # 3) through the softmax (and the mask), then the score modifiers and the scale
    dS = steps.softmax_input(fwd, d_softmax)  # (B, H, T, S)
    d_modified, d_scaled = grad_modifiers(fwd.chain, dS, fwd.before)
    d_scores = steps.scale(d_scaled, fwd.scale)
    # 4) into the queries and keys, back through each Q/K transform (RoPE, then QK-norm)
    d_q_stages, d_Q = grad_transforms(fwd.back_q, grad_queries(d_scores, fwd.k, g))  # (B, H, T, D)
    d_K_in = steps.group(steps.keys_per_head(d_scores, fwd.q), g)  # (B, Hkv, S, D)
    d_k_stages, d_K = grad_transforms(fwd.back_k, d_K_in)
    d_Q, d_K = _plus(d_Q, more, "d_Q"), _plus(d_K, more, "d_K")
    d_extra = grad_extras(fwd.chain, fwd.weights, d_softmax)  # (H,) each
    # 5) through the input projections
    inputs = _input_side(fwd, d_Q, d_K, d_V, steps.paths, d_X_out)
    return Gradients(
        d_projected=d_projected,
        d_W_O=d_W_O,
        d_b_O=d_b_O,
        d_concat=d_concat,
        d_output=d_output,
        d_softmax=d_softmax,
        d_V=d_V,
        d_masked=dS if fwd.has_masked else None,
        d_scaled=d_scaled,
        d_scores=d_scores,
        d_Q=d_Q,
        d_K=d_K,
        **{f.name: getattr(inputs, f.name) for f in fields(inputs)},  # d_X, d_W_Q, ... d_b_V
        variant={**d_outs, **d_q_stages, **d_k_stages, **d_modified, **d_extra},
    )


def _upstream(grad: FloatArray | None, like: FloatArray, stage: str) -> FloatArray:
    """The upstream gradient; ones (L = sum of the stage) when none is given."""
    if grad is None:
        return np.ones_like(like)
    if grad.shape != like.shape:
        raise ValueError(f"grad has shape {grad.shape}, expected {like.shape} (as {stage})")
    return grad


def _output_side(
    fwd: ForwardArrays, grad: FloatArray | None
) -> tuple[_Maybe, _Maybe, _Maybe, _Maybe, FloatArray]:
    """d_projected, d_W_O, d_b_O, d_concat and the gradient of what concat joined (output, or a
    head-output transform's stage)."""
    H = fwd.q.shape[1]
    joined = fwd.output if fwd.joined is None else fwd.joined  # (B, H, T, Dv)
    if fwd.W_O is None:
        d_joined = _upstream(grad, joined, "output")  # (B, H, T, Dv)
        d_concat = merge_heads(d_joined) if fwd.has_concat else None  # (B, T, H*Dv)
        return None, None, None, d_concat, d_joined
    concat = merge_heads(joined)  # (B, T, H*Dv)
    projected_like = np.empty((*concat.shape[:2], fwd.W_O.shape[1]), fwd.output.dtype)
    d_projected = _upstream(grad, projected_like, "projected")  # (B, T, E)
    d_concat, d_W_O, d_b_O = grad_linear(d_projected, concat, fwd.W_O, fwd.b_O is not None)
    return d_projected, d_W_O, d_b_O, d_concat, split_heads(d_concat, H)  # (B, H, T, Dv)


_QKV = ("d_Q", "d_K", "d_V")  # what a head-output transform that reads Q, K, V adds to them


def _grad_outs(
    backs: tuple[BackOut, ...], d: FloatArray
) -> tuple[FloatArray, dict[str, FloatArray], FloatArray | None]:
    """Back through the head-output transforms, the last first: d_output, their gradient
    stages (``d_Q``, ``d_K``, ``d_V`` among them when one reads Q, K, V: what it adds to
    theirs, differential attention's second map), and what they add to d_X."""
    stages: dict[str, FloatArray] = {}
    d_X: FloatArray | None = None
    for back in reversed(backs):
        d, made, extra = back(d)  # (B, H, T, Dv), ..., (B, T, C)
        for name in _QKV:
            if name in made and name in stages:
                made[name] = made[name] + stages[name]
        stages.update(made)
        if extra is not None:
            d_X = extra if d_X is None else d_X + extra
    return d, stages, d_X


def _plus(d: FloatArray, more: Mapping[str, FloatArray], name: str) -> FloatArray:
    """A gradient with what a head-output transform adds to it (``more``), if anything."""
    return d if name not in more else d + more[name]


@dataclass(frozen=True, eq=False)
class _InputGradients:
    """The gradients of the projection inputs; all None in direct mode."""

    d_X: _Maybe = None
    d_X_kv: _Maybe = None
    d_W_Q: _Maybe = None
    d_W_K: _Maybe = None
    d_W_V: _Maybe = None
    d_b_Q: _Maybe = None
    d_b_K: _Maybe = None
    d_b_V: _Maybe = None


def _input_side(
    fwd: ForwardArrays,
    d_Q: FloatArray,
    d_K: FloatArray,
    d_V: FloatArray,
    paths: frozenset[str],
    d_X_out: FloatArray | None = None,
) -> _InputGradients:
    """d_X (and d_X_kv) as the sum of the Q, K and V paths (and the head-output transforms'
    path, ``d_X_out``: a gate's), and the weight gradients."""
    if fwd.X is None:  # direct mode, or a front end's (MLA's) Q, K, V: they stop at Q, K, V
        return _InputGradients(d_X=d_X_out)  # a gate's path, when a front end made Q, K, V
    assert fwd.W_Q is not None and fwd.W_K is not None and fwd.W_V is not None
    source = fwd.X if fwd.X_kv is None else fwd.X_kv  # where K and V come from
    d_from: dict[str, FloatArray] = {}
    d_from["Q"], d_W_Q, d_b_Q = grad_linear(merge_heads(d_Q), fwd.X, fwd.W_Q, fwd.b_Q is not None)
    d_from["K"], d_W_K, d_b_K = grad_linear(merge_heads(d_K), source, fwd.W_K, fwd.b_K is not None)
    d_from["V"], d_W_V, d_b_V = grad_linear(merge_heads(d_V), source, fwd.W_V, fwd.b_V is not None)
    if fwd.X_kv is None:
        d_X: FloatArray = sum((d_from[p] for p in "QKV" if p in paths), np.zeros_like(fwd.X))
        d_X_kv = None
    else:
        d_X = d_from["Q"] if "Q" in paths else np.zeros_like(fwd.X)
        d_X_kv = sum((d_from[p] for p in "KV" if p in paths), np.zeros_like(fwd.X_kv))
    if d_X_out is not None:
        d_X = d_X + d_X_out  # (B, T, C): the gate is projected from X too
    return _InputGradients(d_X, d_X_kv, d_W_Q, d_W_K, d_W_V, d_b_Q, d_b_K, d_b_V)


# ---------------------------------------------------------------------------------------------
# The blocked backward (FlashAttention-2's): no (T, S) array, the weights recomputed from L

BLOCK_CELLS = 1 << 20  # scores per block of the blocked backward (8 MiB in float64)
TO_MASKED = Way(last="masked")  # a block's logits again: the one chain up to masked
TO_SOFTMAX = Way(last="softmax")


def blocked_backward(
    fwd: ForwardArrays, lse: FloatArray, chain: Chain, grad: FloatArray | None = None
) -> dict[str, FloatArray]:
    """The gradients that are not (T, S)-shaped, as :func:`attention_backward` gives them, a
    block of query rows at a time (Dao, "FlashAttention-2", Algorithm 2): the weights of the
    block recomputed as P = exp(masked − L) from the forward's log-sum-exp ``lse`` (B, H, T),
    Delta = rowsum(dO ∘ O), dS = P ∘ (dP − Delta); dQ written per block, dK and dV summed.

    ``fwd.weights`` is not read (a zero-stride stand-in will do); ``chain`` makes the logits
    (its modifiers, biases and fill), as the forward did. Not for a chain with extra logits.
    """
    assert not chain.extra, "an extra logit's gradient reads the whole weights"
    # 1) output projection and heads, then back through the head-output transforms
    d_projected, d_W_O, d_b_O, d_concat, d_joined = _output_side(fwd, grad)
    d_output, d_outs, d_X_out = _grad_outs(fwd.back_out, d_joined)
    assert not set(_QKV) & set(d_outs), "a second map's gradients need the whole pass"
    # 2)-3) through the weighted sum, the softmax, the modifiers and the scale, by blocks
    d_q, d_k, d_V = _blocked_core(fwd, lse, chain, d_output)
    # 4) back through each Q/K transform, then 5) the input projections
    d_q_stages, d_Q = grad_transforms(fwd.back_q, d_q)
    d_k_stages, d_K = grad_transforms(fwd.back_k, d_k)
    inputs = _input_side(fwd, d_Q, d_K, d_V, _RIGHT.paths, d_X_out)
    have: dict[str, _Maybe] = {
        "d_projected": d_projected,
        "d_W_O": d_W_O,
        "d_b_O": d_b_O,
        "d_concat": d_concat,
        "d_output": d_output,
        "d_V": d_V,
        "d_Q": d_Q,
        "d_K": d_K,
        **{f.name: getattr(inputs, f.name) for f in fields(inputs)},
        **d_outs,
        **d_q_stages,
        **d_k_stages,
    }
    names = dict.fromkeys((*gradient_order(), *have))
    return {n: a for n in names if (a := have.get(n)) is not None}


def _blocked_core(
    fwd: ForwardArrays, lse: FloatArray, chain: Chain, d_output: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """dQ (B, H, T, D), dK (B, Hkv, S, D), dV (B, Hkv, S, Dv) of the scores' Q and K and of
    V, one (batch, kv head, block of query rows) at a time: the group's query heads stacked."""
    from attn_cli.core.chain import allowed_span, cells_of

    q, k, v = fwd.q, fwd.k, fwd.v
    B, _, T, _ = q.shape
    Hkv, S = v.shape[1], v.shape[2]
    g = fwd.groups
    dtype = q.dtype
    delta = delta_flash(d_output, fwd.output)  # (B, H, T)
    L = np.where(np.isneginf(lse), 0.0, lse).astype(dtype)  # an empty row: exp(−∞ − 0) = 0
    d_q, d_k, d_v = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    rows = max(1, BLOCK_CELLS // max(1, g * S))
    exact_zeros = chain.fill == -np.inf  # a finite fill gives hidden keys weight in empty rows
    for b in range(B):
        for G in range(Hkv):
            heads = slice(G * g, (G + 1) * g)  # the query heads reading kv head G
            for t0 in range(0, T, rows):
                t1 = min(T, t0 + rows)
                cells = cells_of(chain.inputs, slice(b, b + 1), heads, slice(t0, t1))
                s0, s1 = allowed_span(chain, cells) if exact_zeros else (0, S)
                cells = cells._replace(keys=cells.keys[s0:s1], pos_k=cells.pos_k[s0:s1])
                at = (b, heads, slice(t0, t1))
                dq, dk, dv = _block_grads(fwd, chain, cells, at, (s0, s1), L, delta, d_output)
                d_q[at] = dq
                d_k[b, G, s0:s1] += dk
                d_v[b, G, s0:s1] += dv
    return d_q, d_k, d_v


def _block_grads(
    fwd: ForwardArrays,
    chain: Chain,
    cells: Any,
    at: tuple[int, slice, slice],  # (b, the group's query heads, rows t0:t1)
    span: tuple[int, int],  # keys s0:s1
    L: FloatArray,  # (B, H, T)
    delta: FloatArray,  # (B, H, T)
    d_output: FloatArray,  # (B, H, T, Dv)
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """One block: dQ (g, R, D) of its rows, its share of dK (n, D) and dV (n, Dv)."""
    b, heads, rows = at
    s0, s1 = span
    G = heads.start // fwd.groups
    q = fwd.q[b, heads, rows]  # (g, R, D)
    k, v = fwd.k[b, G, s0:s1], fwd.v[b, G, s0:s1]  # (n, D), (n, Dv)
    g, R, D = q.shape
    n = s1 - s0
    dtype = q.dtype
    # the forward's logits again: the one chain to masked, each modifier's input kept
    scores = (q @ k.T)[None]  # (1, g, R, n)
    into = in_place(scores, chain, fresh=True)
    made = attention(
        chain,
        None,
        None,
        None,
        cells,
        dtype.type(fwd.scale),
        TO_MASKED,
        into=into,
        start=("scores", scores),
    )
    masked, allowed, before = made.masked, made.allowed, made.before
    assert masked is not None
    P = masked[0] - L[b, heads, rows, None]  # (g, R, n)
    np.exp(P, out=P)
    dO = d_output[b, heads, rows]  # (g, R, Dv)
    dS = dO @ v.T  # dP (g, R, n)
    dS -= delta[b, heads, rows, None]
    dS *= P  # dS = P ∘ (dP − Delta)
    if allowed is not None:
        np.copyto(dS, 0.0, where=~np.broadcast_to(allowed, cells.shape)[0])
    if chain.stages:
        dS = chain.grad_modifiers(dS[None], before)[-1][0]  # d_scaled
    dS *= dtype.type(fwd.scale)  # d_scores
    dq: FloatArray = dS @ k  # (g, R, n) @ (n, D)
    dk: FloatArray = dS.reshape(g * R, n).T @ q.reshape(g * R, D)  # (n, D), the group summed
    dv: FloatArray = P.reshape(g * R, n).T @ dO.reshape(g * R, -1)  # (n, Dv)
    return dq, dk, dv


# ---------------------------------------------------------------------------------------------
# The named mistakes, for the grader

MISTAKES: Mapping[str, str] = {
    "softmax_without_rowsum": "dS = P ∘ dP: the softmax Jacobian without its −rowsum(dP ∘ P) term",
    "scale_left_out": "d_scores = d_scaled: the scale is left out of dQ and dK",
    "scale_applied_twice": "d_scores = d_scaled × scale²: the scale is applied twice in dQ and dK",
    "dK_not_transposed": "dK = dS·Q instead of dSᵀ·Q (only when seq_q == seq_k)",
    "dV_not_transposed": "dV = P·dO instead of Pᵀ·dO (only when seq_q == seq_k)",
    "gqa_not_summed": "dK, dV of a key/value head from the first query head of its group, unsummed",
    "gradient_into_masked": "dS from P recomputed without the mask: masked positions get gradient",
    "dX_missing_Q_path": "d_X without the Q path (d_Q·W_Qᵀ)",
    "dX_missing_K_path": "d_X (d_X_kv in cross-attention) without the K path (d_K·W_Kᵀ)",
    "dX_missing_V_path": "d_X (d_X_kv in cross-attention) without the V path (d_V·W_Vᵀ)",
}


def backward_mistakes(fwd: ForwardArrays, grad: FloatArray | None = None) -> dict[str, Gradients]:
    """Each named mistake that can happen on this fixture, recomputed through the whole pass."""
    return {name: _backward(fwd, grad, steps) for name, steps in _mistaken_steps(fwd).items()}


def _mistaken_steps(fwd: ForwardArrays) -> dict[str, _Steps]:
    """The steps of each mistake, left out where it would equal the right pass."""
    square = fwd.q.shape[2] == fwd.k.shape[2]  # the untransposed products need T == S
    steps = {
        "softmax_without_rowsum": replace(_RIGHT, softmax_input=lambda f, dP: f.weights * dP),
        "scale_left_out": replace(_RIGHT, scale=lambda d, scale: d),
        "scale_applied_twice": replace(_RIGHT, scale=lambda d, scale: d * scale * scale),
        "dK_not_transposed": replace(_RIGHT, keys_per_head=lambda dS, q: dS @ q),
        "dV_not_transposed": replace(_RIGHT, values_per_head=lambda P, dO: P @ dO),
        "gqa_not_summed": replace(_RIGHT, group=lambda x, g: x[:, ::g]),  # (B, Hkv, ...)
        "gradient_into_masked": replace(_RIGHT, softmax_input=_grad_unmasked_softmax_input),
        "dX_missing_Q_path": replace(_RIGHT, paths=frozenset("KV")),
        "dX_missing_K_path": replace(_RIGHT, paths=frozenset("QV")),
        "dX_missing_V_path": replace(_RIGHT, paths=frozenset("QK")),
    }
    applies = {
        "scale_left_out": fwd.scale != 1.0,
        "scale_applied_twice": fwd.scale != 1.0,
        "dK_not_transposed": square,
        "dV_not_transposed": square,
        "gqa_not_summed": fwd.groups > 1,
        "gradient_into_masked": fwd.allowed is not None and not bool(np.all(fwd.allowed)),
        "dX_missing_Q_path": fwd.X is not None and fwd.X_kv is None,
        "dX_missing_K_path": fwd.X is not None,
        "dX_missing_V_path": fwd.X is not None,
    }
    return {name: s for name, s in steps.items() if applies.get(name, True)}


def _grad_unmasked_softmax_input(fwd: ForwardArrays, d_softmax: FloatArray) -> FloatArray:
    """The masked-gradient mistake: P recomputed from the logits as if nothing were masked
    (the chain's modifiers, then its biases without the fill)."""
    B, H, T, S = fwd.weights.shape
    if fwd.before:
        start = ("scaled", fwd.before[0])  # (B, H, T, S)
    else:
        q = fwd.q.reshape(B, -1, fwd.groups, T, fwd.q.shape[3])  # (B, Hkv, g, T, D)
        kT = fwd.k[:, :, None].swapaxes(-1, -2)  # (B, Hkv, 1, D, S)
        start = ("scores", (q @ kT).reshape(B, H, T, S))  # (B, H, T, S)
    bias = None if fwd.bias is None else np.where(np.isfinite(fwd.bias), fwd.bias, 0.0)
    modifiers = () if fwd.chain is None else fwd.chain.modifiers
    unmasked = attention(
        Plain(None, bias, modifiers),
        None,
        None,
        None,
        Plain.cells(B, H, T, S),
        fwd.scale,
        TO_SOFTMAX,
        start=start,
    ).weights  # the chain's modifiers, then its biases without the fill
    assert unmasked is not None
    return grad_softmax_input(unmasked, d_softmax)
