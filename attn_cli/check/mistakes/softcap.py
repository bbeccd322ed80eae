"""The mistake of logit softcapping (Gemma 2): the cap applied after the mask, where it turns
-inf into -cap and gives hidden keys weight."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attn_cli.check.mistake import Mistake, register
from attn_cli.check.recompute import (
    Change,
    extra_logit,
    masked_with,
    recomputed,
    softmax_and_lse,
)
from attn_cli.check.recompute import allowed as chain_allowed
from attn_cli.core.stages import softmax_input
from attn_cli.core.variant import REGISTRY

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _softcap_after_mask(trace: Trace) -> list[Change]:
    inp = trace.inputs
    softcap = REGISTRY["softcap"]
    cap = softcap.value(inp)
    if cap is None or softmax_input(inp) != "masked":
        return []
    masked = masked_with(trace, chain_allowed(inp), before="scaled")
    capped = softcap.modify(cap, masked)  # -inf -> -softcap
    weights = softmax_and_lse(capped, extra_logit(inp))[0]
    detail = (
        f"Your {{stage}} is what attn gets with the softcap applied after the mask: "
        f"{cap:g}·tanh(-inf/{cap:g}) = -{cap:g}, so the hidden keys get "
        "a little weight instead of none. Gemma 2 caps the scaled scores before the mask. Fix: "
        "capped = softcap * tanh(scaled / softcap), then mask."
    )
    return [
        Change(detail, "capped", {"capped": capped, "masked": m, "softmax": weights})
        for m in (masked, capped)  # your masked: before the cap, or the capped scores again
    ]


register(
    "softcap",
    Mistake("softcap_after_mask", "softcap applied after the mask",
            recomputed(_softcap_after_mask), 140),
)  # fmt: skip
