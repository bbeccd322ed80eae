"""The rest of a Transformer block around attention, in NumPy: activations, MLPs, the residual.

Axes: ``T`` tokens, ``C`` hidden (the residual stream), ``F`` the MLP's width. Weights are in
the ``x @ W`` layout ([in, out]). Everything is float64; the checkpoint's float32 weights are
widened, so a block computes what the model computes, to float32's rounding.

Where the norms sit (transformers' modeling code of each family):

    pre        h = x + attn(n1(x));            x' = h + mlp(n2(h))           Llama, GPT-2, Phi-3,
                                                                             StarCoder2, StableLM
    sandwich   h = x + n1b(attn(n1(x)));       x' = h + n2b(mlp(n2(h)))      Gemma 2/3, GLM-4
    post_only  h = x + n1b(attn(x));           x' = h + n2b(mlp(h))          OLMo 2/3, EXAONE 4
    post       h = n1b(x + attn(x));           x' = n2b(h + mlp(h))          BERT, DistilBERT
    parallel   x' = x + attn(n1(x)) + mlp(n2(x))                             GPT-NeoX, Pythia
               (n2 = n1: Phi, Cohere, StableLM's use_parallel_residual)

``n1`` (the norm before attention) belongs to attn's traced layer; the block receives the
attention's output projection (``projected``) already made from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from attn_cli.core import ops
from attn_cli.core.steps import softmax

FloatArray = np.ndarray[Any, np.dtype[np.floating[Any]]]
Placement = Literal["pre", "sandwich", "post_only", "post", "parallel"]
PLACEMENTS: tuple[Placement, ...] = ("pre", "sandwich", "post_only", "post", "parallel")

_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x: FloatArray) -> FloatArray:
    """GELU with the exact normal CDF: x · Φ(x) = x · (1 + erf(x / √2)) / 2."""
    erf = np.asarray(_erf(x / math.sqrt(2.0)), dtype=np.float64)  # (…) as x
    out: FloatArray = 0.5 * x * (1.0 + erf)
    return out


def gelu_tanh(x: FloatArray) -> FloatArray:
    """GELU's tanh approximation (gelu_new, gelu_pytorch_tanh, gelu_fast)."""
    out: FloatArray = 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return out


def silu(x: FloatArray) -> FloatArray:
    """x · sigmoid(x), computed without overflow for large negative x."""
    out: FloatArray = x * _logistic(x)
    return out


def quick_gelu(x: FloatArray) -> FloatArray:
    out: FloatArray = x * _logistic(1.702 * x)
    return out


def relu(x: FloatArray) -> FloatArray:
    out: FloatArray = np.maximum(x, 0.0)
    return out


def _logistic(x: FloatArray) -> FloatArray:
    """core.ops' sigmoid of a float64 block (everything here is float64)."""
    return ops.sigmoid(np.asarray(x, dtype=np.float64))


def xielu(x: FloatArray, alpha_p: float, alpha_n: float, beta: float, eps: float) -> FloatArray:
    """xIELU (transformers' XIELUActivation, Apertus), its raw learned parameters as saved:
    with ap = softplus(alpha_p) and an = beta + softplus(alpha_n), ap·x² + beta·x where x > 0,
    else (expm1(min(x, eps)) − x)·an + beta·x."""
    ap = float(np.logaddexp(0.0, alpha_p))  # softplus, without overflow
    an = beta + float(np.logaddexp(0.0, alpha_n))
    x = np.asarray(x, dtype=np.float64)
    negative = (np.expm1(np.minimum(x, eps)) - x) * an + beta * x
    out: FloatArray = np.where(x > 0, ap * x * x + beta * x, negative)
    return out


# transformers' ACT2CLS names of activations with learned parameters: the function, and its
# parameters' names (keyword arguments after x, each a tensor of one value in the checkpoint)
PARAMETRIC: dict[str, tuple[Callable[..., FloatArray], tuple[str, ...]]] = {
    "xielu": (xielu, ("alpha_p", "alpha_n", "beta", "eps")),
}

# transformers' ACT2FN names of the activations above
ACTIVATIONS: dict[str, Callable[[FloatArray], FloatArray]] = {
    "gelu": gelu,
    "gelu_new": gelu_tanh,
    "gelu_pytorch_tanh": gelu_tanh,
    "gelu_fast": gelu_tanh,
    "silu": silu,
    "swish": silu,
    "quick_gelu": quick_gelu,
    "relu": relu,
}


def dense_mlp(
    x: FloatArray,
    W_in: FloatArray,
    b_in: FloatArray | None,
    W_out: FloatArray,
    b_out: FloatArray | None,
    act: Callable[[FloatArray], FloatArray],
) -> FloatArray:
    """act(x W_in + b_in) W_out + b_out: BERT's, GPT-2's, GPT-NeoX's MLP."""
    h = x @ W_in  # (T, F)
    if b_in is not None:
        h = h + b_in
    out: FloatArray = act(h) @ W_out  # (T, C)
    return out if b_out is None else out + b_out


def gated_mlp(
    x: FloatArray,
    W_gate: FloatArray,
    W_up: FloatArray,
    W_down: FloatArray,
    act: Callable[[FloatArray], FloatArray],
    biases: tuple[FloatArray | None, FloatArray | None, FloatArray | None] = (None, None, None),
) -> FloatArray:
    """(act(x W_gate) ∘ (x W_up)) W_down: SwiGLU (silu), GeGLU (gelu)."""
    b_gate, b_up, b_down = biases
    gate = x @ W_gate  # (T, F)
    up = x @ W_up  # (T, F)
    if b_gate is not None and b_up is not None:
        gate, up = gate + b_gate, up + b_up
    out: FloatArray = (act(gate) * up) @ W_down  # (T, C)
    return out if b_down is None else out + b_down


Norm = Callable[[FloatArray], FloatArray]


def block(
    x: FloatArray,
    placement: Placement,
    attention: FloatArray,
    mlp: Callable[[FloatArray], FloatArray],
    norms: dict[str, Norm],
) -> FloatArray:
    """The residual stream leaving a block, from the one entering it (``x``, [T, C]) and the
    attention output projection (``attention``, [T, C]); ``norms`` by role: ``attn_out``
    (after attention), ``mlp_in`` (before the MLP), ``mlp_out`` (after it)."""
    if placement == "parallel":
        return x + attention + mlp(norms["mlp_in"](x))
    if placement == "post":
        h = norms["attn_out"](x + attention)
        return norms["mlp_out"](h + mlp(h))
    if placement in ("sandwich", "post_only"):
        h = x + norms["attn_out"](attention)
        m = mlp(norms["mlp_in"](h) if placement == "sandwich" else h)
        return h + norms["mlp_out"](m)
    h = x + attention
    return h + mlp(norms["mlp_in"](h))


def cap_logits(logits: FloatArray, cap: float | None) -> FloatArray:
    """The final logits capped, cap · tanh(logits / cap) (Gemma 2's LM head); None: as they are."""
    if cap is None:
        return logits
    out: FloatArray = cap * np.tanh(logits / cap)
    return out


def route(
    x: FloatArray, W_router: FloatArray, k: int, normalize: bool
) -> tuple[np.ndarray[Any, np.dtype[np.intp]], FloatArray]:
    """A mixture of experts' router: softmax(x W_router) over the experts, the top ``k`` per
    token (most likely first) and their weights, renormalised to sum to 1 if ``normalize``."""
    return route_logits(x @ W_router, k, normalize)  # (T, E) logits


def route_logits(
    logits: FloatArray, k: int, normalize: bool
) -> tuple[np.ndarray[Any, np.dtype[np.intp]], FloatArray]:
    """``route`` from the router's logits [T, E] (gpt-oss: with the router's bias; its softmax
    over the top k logits is this one renormalised)."""
    p = softmax(np.asarray(logits, dtype=np.float64))  # (T, E), float64 as everything here
    chosen = np.argsort(-p, axis=-1, kind="stable")[:, :k]  # (T, k)
    weights: FloatArray = np.take_along_axis(p, chosen, axis=-1)  # (T, k)
    if normalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return chosen, weights


def mixture(
    x: FloatArray,
    chosen: np.ndarray[Any, np.dtype[np.intp]],
    weights: FloatArray,
    expert: Callable[[int, FloatArray], FloatArray],
) -> FloatArray:
    """Σ over each token's chosen experts of weight · expert(x): each expert computed once, on
    the tokens that chose it (an expert no token chose is never asked for)."""
    out = np.zeros_like(x)  # (T, C)
    for e in np.unique(chosen):
        rows, slot = np.nonzero(chosen == e)  # the tokens that chose e, and in which place
        out[rows] += weights[rows, slot][:, None] * expert(int(e), x[rows])
    return out


# ---------------------------------------------------------------------------------------------
# gpt-oss's and DeepSeek V3's experts and routers (transformers 5.24, models/gpt_oss and
# models/deepseek_v3: GptOssExperts, DeepseekV3TopkRouter)


def clamped_swiglu(gate_up: FloatArray, alpha: float, limit: float) -> FloatArray:
    """gpt-oss's activation on x W_gate_up + b [T, 2F], whose columns interleave gate and up:
    (clamp(up, ±limit) + 1) · g · sigmoid(alpha · g), g = min(gate, limit)."""
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]  # (T, F) each: even columns, odd columns
    gate = np.minimum(gate, limit)
    up = np.clip(up, -limit, limit)
    out: FloatArray = (up + 1.0) * gate * _logistic(alpha * gate)
    return out


def route_greedy(
    logits: FloatArray, k: int, groups: tuple[int, int] | None, scale: float
) -> tuple[np.ndarray[Any, np.dtype[np.intp]], FloatArray]:
    """DeepSeek V2's router on its logits [T, E]: p = softmax over every expert; the top ``k``
    of p (greedy), or of p with the experts outside the ``groups[1]`` best of ``groups[0]``
    equal groups set to 0, a group worth its largest p (group_limited_greedy); the weights
    the chosen p, not renormalised, times ``scale`` (routed_scaling_factor)."""
    T, E = logits.shape
    p = softmax(np.asarray(logits, dtype=np.float64))  # (T, E), float64 as everything here
    pick = p
    if groups is not None:
        n_group, top_groups = groups
        worth = p.reshape(T, n_group, E // n_group).max(axis=-1)  # (T, groups)
        best = np.argsort(-worth, axis=-1, kind="stable")[:, :top_groups]
        kept = np.zeros((T, n_group), dtype=bool)
        np.put_along_axis(kept, best, True, axis=-1)
        pick = np.where(np.repeat(kept, E // n_group, axis=-1), p, 0.0)  # masked_fill 0
    chosen = np.argsort(-pick, axis=-1, kind="stable")[:, :k]  # (T, k)
    weights: FloatArray = np.take_along_axis(pick, chosen, axis=-1) * scale
    return chosen, weights


def route_corrected(
    logits: FloatArray, k: int, correction: FloatArray, norm_min: float
) -> tuple[np.ndarray[Any, np.dtype[np.intp]], FloatArray]:
    """ERNIE 4.5 MoE's router on its logits [T, E]: p = softmax over every expert; the top
    ``k`` of p + ``correction`` (e_score_correction_bias moves the choice, not the weights); the
    weights the chosen p divided by max(their sum, ``norm_min``) (moe_norm_min)."""
    p = softmax(np.asarray(logits, dtype=np.float64))  # (T, E), float64 as everything here
    chosen = np.argsort(-(p + correction), axis=-1, kind="stable")[:, :k]  # (T, k)
    weights: FloatArray = np.take_along_axis(p, chosen, axis=-1)  # (T, k)
    return chosen, weights / np.maximum(weights.sum(axis=-1, keepdims=True), norm_min)


def route_grouped(
    logits: FloatArray,
    k: int,
    correction: FloatArray,
    groups: tuple[int, int],
    normalize: bool,
    scale: float,
) -> tuple[np.ndarray[Any, np.dtype[np.intp]], FloatArray]:
    """DeepSeek V3's router on its logits [T, E]: scores sigmoid(logits); the experts chosen by
    scores + ``correction`` (e_score_correction_bias), only within the ``groups[1]`` best of
    ``groups[0]`` equal groups (a group's worth: its two best corrected scores); the weights
    are the chosen experts' uncorrected scores, renormalised (+1e-20) if ``normalize``, times
    ``scale`` (routed_scaling_factor)."""
    T, E = logits.shape
    n_group, top_groups = groups
    scores = _logistic(logits)  # (T, E)
    choice = scores + correction  # (T, E): the bias moves the choice, not the weights
    per_group = choice.reshape(T, n_group, E // n_group)  # (T, groups, E / groups)
    worth = np.sort(per_group, axis=-1)[..., -2:].sum(axis=-1)  # (T, groups)
    best = np.argsort(-worth, axis=-1, kind="stable")[:, :top_groups]  # (T, top_groups)
    kept = np.zeros((T, n_group), dtype=bool)
    np.put_along_axis(kept, best, True, axis=-1)
    allowed = np.repeat(kept, E // n_group, axis=-1)  # (T, E): the experts of the kept groups
    choice = np.where(allowed, choice, -np.inf)
    chosen = np.argsort(-choice, axis=-1, kind="stable")[:, :k]  # (T, k)
    weights: FloatArray = np.take_along_axis(scores, chosen, axis=-1)  # (T, k)
    if normalize:
        weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
    return chosen, weights * scale
