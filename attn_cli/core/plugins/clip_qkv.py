"""OLMo's ``clip_qkv``: Q, K and V clamped to [-c, c] right after the projections, before
QK-norm and RoPE (transformers' OlmoAttention: ``.clamp_(min=-c, max=c)`` on each). A Q/K
transform of the chain, Q -> Q_clip, K -> K_clip; V is clamped where the projections leave it
(the trace's V is the clamped one). Decoding and FlashAttention read the trace's Q_clip, K_clip
and V, so they run it exactly; the backward pass refuses it in one line (the clamp's zero slope
on V is not in its chain)."""

from __future__ import annotations

from typing import Any

import numpy as np

from attn_cli.core.inputs import Inputs
from attn_cli.core.plugins.parsing import positive_number
from attn_cli.core.stage_spec import number_text
from attn_cli.core.variant import (
    FixtureKey,
    FloatArray,
    QKAt,
    Variant,
    register,
)


class ClipQKV(Variant[float]):
    order = 54  # first of the Q/K transforms: right after the projections
    name = "clip_qkv"
    suffix = "clip"
    key_order = 8

    def parse(self, raw: Any, key: FixtureKey) -> float:
        return positive_number(raw, key, "Q, K and V clamped to [-clip_qkv, clip_qkv]")

    def stage_formula(self, value: float, inputs: Inputs, stage: str) -> str:
        name, c = stage[0], number_text(value)
        return f"{name}_clip = clamp({name}, −{c}, {c})"

    def formula_part(self, value: float, inputs: Inputs, stage: str) -> str:
        c = number_text(value)
        return f", clamped to [−{c}, {c}] (clip_qkv)" if stage == "V" else ""

    def grad_formula(self, value: float, inputs: Inputs, d_out: str, x_in: str) -> str:
        return f"{d_out} ∘ [|{x_in}| ≤ {number_text(value)}]"

    def transform(self, value: float, at: QKAt, x: FloatArray) -> FloatArray:
        return clamp(x, value)  # (B, heads, n, D)

    def grad_transform(
        self, value: float, at: QKAt, d_out: FloatArray, x_in: FloatArray
    ) -> FloatArray:
        """torch's clamp passes the gradient where -c <= x <= c, nothing elsewhere."""
        inside: FloatArray = d_out * (np.abs(x_in) <= value)
        return inside

    def transform_v(self, value: float, v: FloatArray) -> FloatArray:
        return clamp(v, value)  # (B, kv_heads, S, Dv)

    def refuses(self, value: float, inputs: Inputs, what: str) -> tuple[str, str, str] | None:
        if what != "the backward pass":
            return None
        return (
            "clip_qkv",
            f"is {value:g}: {what} does not take the clamp of V back",
            "a fixture without clip_qkv (the forward trace, decoding and FlashAttention run it)",
        )


def clamp(x: FloatArray, c: float) -> FloatArray:
    """x with every entry clamped to [-c, c] (a new array)."""
    out: FloatArray = np.clip(x, -c, c)
    return out


register(ClipQKV())
