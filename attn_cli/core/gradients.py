"""The backward pass wired to the pipeline: what it reads from a forward run, and its stages.

The math is core/backward.py's; this module only gathers its inputs from a run's arrays (the
internal layouts, batch axis first: axis names as in steps.py) and names its results after the
stage table's gradient rows. The Q/K transforms (QK-norm's RMSNorm backward, RoPE's rotation by
−angle) are passed to it as the maps that carry a gradient back through each (``back_q``,
``back_k``); the score modifiers and the extra logits as the forward's chain (core/chain.py),
with what each modifier read. The chain's
biases are constants added to the logits, so the gradient passes them unchanged and they take
none.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from attn_cli.core.backward import (
    Back,
    BackOut,
    ForwardArrays,
    attention_backward,
    blocked_backward,
    delta_flash,
)
from attn_cli.core.chain import Chain, cells_of
from attn_cli.core.inputs import FloatArray, Inputs
from attn_cli.core.stages import FORWARD_STAGE_NAMES, SPECS, applicable_stages
from attn_cli.core.steps import allowed_positions
from attn_cli.core.variant import Cast, QKAt, Traced

# What the backward reads from the forward run, when the fixture has it (and each Q/K
# transform's stage).
_READS = ("X", "X_kv", "Q", "K", "V", "softmax", "output")


def backward_needs(inputs: Inputs, kept: Collection[str] | None = None) -> set[str]:
    """The forward stages the backward pass reads: they are kept whole while it runs. When
    the stages ``kept`` let the backward run blocked (:func:`blocked`), no (T, S) stage:
    ``lse`` instead of the weights."""
    have = set(applicable_stages(inputs, opt_in=("lse",)))
    chain = Chain(inputs)
    reads = (
        *_READS,
        *chain.qk_stages("Q"),
        *chain.qk_stages("K"),
        *chain.out_stages,
        *(s for v, _ in chain.on for s in v.front_reads),
    )
    if kept is not None and blocked(inputs, kept):
        return {s for s in (*reads, "lse") if s in have and s != "softmax"}
    need = {s for s in reads if s in have} | set(modifier_inputs(chain))
    assert need <= set(FORWARD_STAGE_NAMES)
    return need


def blocked(inputs: Inputs, kept: Collection[str]) -> bool:
    """Whether the backward runs blocked (core/backward.py ``blocked_backward``): gradients
    are kept, no stage kept is (T, S)-shaped (else the weights are held anyway: the whole pass
    reads them) and no extra logit (a sink) needs the whole weights."""
    if not any(SPECS[s].gradient for s in kept) or any(SPECS[s].score_like for s in kept):
        return False
    on = Chain(inputs).on  # a second form beside the chain, or a second map, read whole
    return not Chain(inputs).extra and not any(v.side_stages or v.out_reads for v, _ in on)


def modifier_inputs(chain: Chain) -> tuple[str, ...]:
    """The stage each score modifier reads, in chain order: ``scaled``, then each one's stage."""
    stages = chain.stages
    return ("scaled", *stages[:-1]) if stages else ()


def _same(name: str, arr: FloatArray) -> FloatArray:
    return arr


def forward_arrays(
    inputs: Inputs,
    arrays: Mapping[str, FloatArray],
    scale: float,
    cast: Cast = _same,
    whole: bool = True,
) -> ForwardArrays:
    """The backward's view of a forward run: ``arrays`` holds its stages (internal layouts).
    Not ``whole``: for the blocked backward, without the weights (a zero-stride stand-in), the
    modifiers' inputs, the allowed keys or the biases, each (T, S): it makes them per block."""
    inp = inputs
    weights = {
        n: None if (w := getattr(inp, n)) is None else cast(n, w)
        for n in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
    }
    dtype = arrays["output"].dtype
    chain = Chain(inp)
    q, k = _entering(chain, "Q", arrays), _entering(chain, "K", arrays)
    return ForwardArrays(
        q=q,
        k=k,
        v=arrays["V"],
        weights=arrays["softmax"] if whole else _no_weights(q, k),
        output=arrays["output"],
        scale=scale,
        allowed=allowed_positions(inp) if whole else None,
        bias=_logit_bias(inp, cast, dtype) if whole else None,
        chain=chain if whole else None,
        before=tuple(arrays[s] for s in modifier_inputs(chain)) if whole else (),
        X=None if chain.front else arrays.get("X"),  # a front end takes d_Q, d_K, d_V on
        X_kv=arrays.get("X_kv"),
        back_q=_back(chain, "Q", arrays, cast),
        back_k=_back(chain, "K", arrays, cast),
        joined=arrays[chain.joined] if chain.outs else None,
        back_out=_back_out(chain, arrays, cast),
        **weights,
    )


def _entering(chain: Chain, name: str, arrays: Mapping[str, FloatArray]) -> FloatArray:
    """What entered the scores for Q or K: the last transform's stage, else Q or K."""
    return next(arrays[s] for s in reversed(chain.qk_stages(name)) if s in arrays)


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


def _back(
    chain: Chain, which: str, arrays: Mapping[str, FloatArray], cast: Cast
) -> tuple[tuple[str, Back], ...]:
    """Each Q/K transform's stage and the map that carries its gradient back to the stage
    before it (RoPE: rotation by −angle; QK-norm: RMSNorm's backward), in forward order."""
    inp = chain.inputs
    at = QKAt(inp, which, inp.token_positions()[0 if which == "Q" else 1], cast)
    stages = chain.qk_stages(which)
    back = []
    pairs = zip(chain.transforms_of(which), stages[:-1], stages[1:], strict=True)
    for (v, value), x_in, stage in pairs:

        def grad(d: FloatArray, v: Any = v, value: Any = value, x_in: str = x_in) -> FloatArray:
            d_in: FloatArray = v.grad_transform(value, at, d, arrays[x_in])
            return d_in

        back.append((stage, grad))
    return tuple(back)


def _back_out(chain: Chain, arrays: Mapping[str, FloatArray], cast: Cast) -> tuple[BackOut, ...]:
    """Each head-output transform (a gate) as the map that carries the gradient of its last
    stage back to the stage it read, in forward order."""
    backs: list[BackOut] = []
    before, run = "output", Traced(chain.inputs, arrays, cast)
    for v, value in chain.outs:
        made = {
            **{s: arrays[s] for s in v.out_reads},
            "output": arrays[before],
            **{s: arrays[s] for s in v.out_stages},
        }

        def back(d: FloatArray, v: Any = v, value: Any = value, made: Any = made) -> Any:
            return v.grad_out(value, run, d, made)

        backs.append(back)
        before = v.out_stages[-1]
    return tuple(backs)


def gradient_stages(
    inputs: Inputs,
    arrays: Mapping[str, FloatArray],
    scale: float,
    cast: Cast = _same,
    kept: Collection[str] | None = None,
) -> dict[str, FloatArray]:
    """Every gradient stage of the fixture, internal layouts, named as in the stage table; the
    ones that are not (T, S)-shaped only, blocked, when the stages ``kept`` let it
    (:func:`blocked`; ``arrays`` then holds ``lse``, not the weights)."""
    grad = None if inputs.grad is None else cast("grad", inputs.grad)
    if kept is not None and blocked(inputs, kept):
        fwd = forward_arrays(inputs, arrays, scale, cast, whole=False)
        chain = Chain(
            inputs if inputs.bias is None else replace(inputs, bias=cast("bias", inputs.bias))
        )
        out = blocked_backward(fwd, arrays["lse"], chain, grad)
        out["delta"] = delta_flash(out["d_output"], fwd.output)  # (B, H, T)
        return out
    fwd = forward_arrays(inputs, arrays, scale, cast)
    grads = attention_backward(fwd, grad)
    out = grads.stages()
    out["delta"] = delta_flash(grads.d_output, fwd.output)  # (B, H, T)
    front = Chain(inputs).front
    if front is not None:  # back through the front end that made Q, K, V (MLA's latent)
        v, value = front
        made = v.grad_front(value, Traced(inputs, arrays, cast), out)
        if grads.d_X is not None:  # a gate's path into d_X
            made["d_X"] = made["d_X"] + grads.d_X
        out.update(made)
    return out


def _no_weights(q: FloatArray, k: FloatArray) -> FloatArray:
    """A (B, H, T, S) array of zeros that holds one number (zero strides): never read."""
    shape = (*q.shape[:3], k.shape[2])  # (B, H, T, S)
    return np.broadcast_to(np.zeros((), q.dtype), shape)
