"""The backward pass wired to the pipeline: what it reads from a forward run, and its stages.

The math is core/backward.py's; this module only gathers its inputs from a run's arrays (the
internal layouts, batch axis first: axis names as in steps.py) and names its results after the
stage table's gradient rows. QK-norm (RMSNorm backward) and RoPE (rotation by −angle) are
passed to it as the maps that carry a gradient back through them; the score modifiers and the
extra logits as the forward's chain (core/chain.py), with what each modifier read. The chain's
biases are constants added to the logits, so the gradient passes them unchanged and they take
none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import numpy as np

from attn_cli.core.backward import (
    ForwardArrays,
    Unrotate,
    attention_backward,
    delta_flash,
    grad_rms_norm,
    merge_heads,
    split_heads,
)
from attn_cli.core.chain import Chain, cells_of
from attn_cli.core.inputs import FloatArray, Inputs
from attn_cli.core.stages import FORWARD_STAGE_NAMES, applicable_stages
from attn_cli.core.steps import allowed_positions
from attn_cli.core.variants import apply_rope

Cast = Callable[[str, FloatArray], FloatArray]  # an input in the computing dtype

# What the backward reads from the forward run, when the fixture has it.
_READS = ("X", "X_kv", "Q", "K", "V", "Q_norm", "K_norm", "Q_rot", "K_rot", "softmax", "output")


def backward_needs(inputs: Inputs) -> set[str]:
    """The forward stages the backward pass reads: they are kept whole while it runs."""
    have = set(applicable_stages(inputs))
    need = {s for s in _READS if s in have} | set(modifier_inputs(Chain(inputs)))
    assert need <= set(FORWARD_STAGE_NAMES)
    return need


def modifier_inputs(chain: Chain) -> tuple[str, ...]:
    """The stage each score modifier reads, in chain order: ``scaled``, then each one's stage."""
    stages = chain.stages
    return ("scaled", *stages[:-1]) if stages else ()


def _same(name: str, arr: FloatArray) -> FloatArray:
    return arr


def forward_arrays(
    inputs: Inputs, arrays: Mapping[str, FloatArray], scale: float, cast: Cast = _same
) -> ForwardArrays:
    """The backward's view of a forward run: ``arrays`` holds its stages (internal layouts)."""
    inp = inputs
    weights = {
        n: None if (w := getattr(inp, n)) is None else cast(n, w)
        for n in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
    }
    dtype = arrays["softmax"].dtype
    chain = Chain(inp)
    return ForwardArrays(
        q=_entering("Q", arrays),
        k=_entering("K", arrays),
        v=arrays["V"],
        weights=arrays["softmax"],
        output=arrays["output"],
        scale=scale,
        allowed=allowed_positions(inp),
        bias=_logit_bias(inp, cast, dtype),
        chain=chain,
        before=tuple(arrays[s] for s in modifier_inputs(chain)),
        X=arrays.get("X"),
        X_kv=arrays.get("X_kv"),
        unrotate_q=_unrotate(inp, "Q"),
        unrotate_k=_unrotate(inp, "K"),
        unnorm_q=_unnorm(inp, arrays, "Q", cast),
        unnorm_k=_unnorm(inp, arrays, "K", cast),
        **weights,
    )


def _entering(name: str, arrays: Mapping[str, FloatArray]) -> FloatArray:
    """What entered the scores for Q or K: rotated, else normalised, else plain."""
    return next(arrays[s] for s in (f"{name}_rot", f"{name}_norm", name) if s in arrays)


def _logit_bias(inp: Inputs, cast: Cast, dtype: np.dtype[np.float64]) -> FloatArray | None:
    """The chain's biases summed, (B, H, T, S)-broadcastable, as added to the logits; None if
    it has none. The fixture's bias is cast to the computing dtype, as the forward adds it."""
    chain = Chain(inp if inp.bias is None else replace(inp, bias=cast("bias", inp.bias)))
    cells = cells_of(inp, slice(None), slice(None), slice(None))
    terms = chain.bias_terms(cells, dtype, lambda stage: None)  # (b, h, R, S) each
    if not terms:
        return None
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


def _unrotate(inp: Inputs, name: str) -> Unrotate | None:
    """RoPE is a rotation per position: its transpose, rotation by −angle, carries d back."""
    rope = inp.rope
    if rope is None:
        return None
    pos_q, pos_k = inp.token_positions()
    positions = pos_q if name == "Q" else pos_k

    def unrotate(d: FloatArray) -> FloatArray:
        return apply_rope(
            d, positions, base=rope.base, layout=rope.layout, dims=rope.dims, inverse=True
        )  # (B, heads, seq, D)

    return unrotate


def _unnorm(
    inp: Inputs, arrays: Mapping[str, FloatArray], name: str, cast: Cast
) -> Unrotate | None:
    """RMSNorm's backward, per head (weight (D,)) or over the whole projection (heads*D,)."""
    norm = inp.qk_norm
    if norm is None:
        return None
    x = arrays[name]  # (B, heads, seq, D), before the norm
    w = cast(f"qk_norm.{name.lower()}_weight", norm.q_weight if name == "Q" else norm.k_weight)
    heads = x.shape[1]

    def unnorm(d: FloatArray) -> FloatArray:
        if w.shape[0] == x.shape[-1]:
            return grad_rms_norm(d, x, w, norm.eps)  # (B, heads, seq, D)
        flat = grad_rms_norm(merge_heads(d), merge_heads(x), w, norm.eps)  # (B, seq, heads*D)
        return split_heads(flat, heads)  # (B, heads, seq, D)

    return unnorm


def gradient_stages(
    inputs: Inputs, arrays: Mapping[str, FloatArray], scale: float, cast: Cast = _same
) -> dict[str, FloatArray]:
    """Every gradient stage of the fixture, internal layouts, named as in the stage table."""
    fwd = forward_arrays(inputs, arrays, scale, cast)
    grad = None if inputs.grad is None else cast("grad", inputs.grad)
    grads = attention_backward(fwd, grad)
    out = grads.stages()
    out["delta"] = delta_flash(grads.d_output, fwd.output)  # (B, H, T)
    return out
