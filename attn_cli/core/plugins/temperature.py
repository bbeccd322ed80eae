"""Attention temperature: each query scaled by a factor that grows with its position, so that
attention stays sharp on long contexts. One formula covers both shipped forms:

    factor(pos) = 1 + attn_scale · ln(1 + ⌊(pos + offset) / floor_scale⌋)

Llama 4 (``attn_temperature_tuning`` on its NoPE layers, transformers' Llama4TextAttention):
offset 1, ``floor_scale``, ``attn_scale``. Ministral 3 (``llama_4_scaling_beta``, after RoPE):
offset 0, floor_scale = ``original_max_position_embeddings``, attn_scale = beta. Queries only;
``pos`` is the 0-based position of the token."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from attn_cli.core.inputs import FloatArray, Inputs
from attn_cli.core.variant import FixtureKey, QKAt, Variant, before, register

KEYS = ("floor_scale", "attn_scale", "offset")


@dataclass(frozen=True)
class Temperature:
    """The setting: the floor's step, the log's scale, and what is added to a 0-based position."""

    floor_scale: float
    attn_scale: float
    offset: int = 1

    def factors(self, positions: Any) -> FloatArray:
        """factor(pos) for each position, (n,), float64."""
        pos = np.asarray(positions, dtype=np.float64)  # (n,)
        steps = np.floor((pos + self.offset) / self.floor_scale)  # (n,)
        out: FloatArray = np.log1p(steps) * self.attn_scale + 1.0
        return out


class AttentionTemperature(Variant[Temperature]):
    order = 1100  # the last Q/K transform: after RoPE (Ministral 3) and QK-norm
    name = "temperature"
    subkeys = KEYS
    key_order = 42
    suffix = "tuned"  # its stage: Q_tuned (and d_Q_tuned)
    transforms = ("Q",)
    positional = True
    reads_positions = True

    def parse(self, raw: Any, key: FixtureKey) -> Temperature:
        want = "a mapping {floor_scale: > 0, attn_scale: a number, offset: 0 or 1 (default 1)}"
        if not isinstance(raw, dict) or not {"floor_scale", "attn_scale"} <= set(raw) <= set(KEYS):
            raise key(f"got {key.describe(raw)}", want)
        floor, scale = finite(raw["floor_scale"]), finite(raw["attn_scale"])
        offset = raw.get("offset", 1)
        bad_offset = type(offset) is not int or offset not in (0, 1)
        if floor is None or scale is None or floor <= 0 or bad_offset:
            raise key(f"got {key.describe(raw)}", want)
        return Temperature(floor, scale, offset)

    def config(self, value: Temperature, inputs: Inputs) -> Any:
        return {
            "floor_scale": value.floor_scale,
            "attn_scale": value.attn_scale,
            "offset": value.offset,
        }

    def stage_formula(self, value: Temperature, inputs: Inputs, stage: str) -> str:
        pos = "position + 1" if value.offset else "position"
        return (
            f"Q_tuned = {before(inputs, stage)} × (1 + {value.attn_scale:g} · "
            f"ln(1 + ⌊({pos}) / {value.floor_scale:g}⌋))"
        )

    def grad_formula(self, value: Temperature, inputs: Inputs, d_out: str, x_in: str) -> str:
        return f"{d_out} × the query's temperature"

    def transform(self, value: Temperature, at: QKAt, x: FloatArray) -> FloatArray:
        out: FloatArray = x * value.factors(at.positions).astype(x.dtype)[:, None]  # (B, H, n, D)
        return out

    def grad_transform(
        self, value: Temperature, at: QKAt, d_out: FloatArray, x_in: FloatArray
    ) -> FloatArray:
        out: FloatArray = d_out * value.factors(at.positions).astype(d_out.dtype)[:, None]
        return out  # (B, H, n, D)


def finite(x: Any) -> float | None:
    """``x`` as a finite float, else None: a bool, a string, nan, ±inf, or an int past float's
    range (10**400), which NumPy's isfinite cannot take."""
    if type(x) not in (int, float):
        return None
    try:
        number = float(x)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


register(AttentionTemperature())
