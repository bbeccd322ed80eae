"""The additive biases of `masked`: the fixture's own ``bias`` (torch SDPA's float attn_mask,
added after scaling) and ALiBi (Press et al.: −slope_h × |pos_q − pos_k|, a stage of its own)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from attn_cli.core.inputs import Inputs
from attn_cli.core.plugins.parsing import broadcasts, known_subkeys, per_head, true_or_mapping
from attn_cli.core.variant import (
    Cells,
    FixtureKey,
    FloatArray,
    NewOption,
    NewSpec,
    Variant,
    register,
    take,
)


class Bias(Variant[FloatArray]):
    order = 20
    name = "bias"

    def parse(self, raw: Any, key: FixtureKey) -> FloatArray:
        """An additive bias broadcastable to [batch, heads, seq_q, seq_k]; -inf allowed."""
        doc = "at most 4 axes, broadcastable to [batch, heads, seq_q, seq_k]"
        bias = key.floats(raw, self.name, (0, 1, 2, 3, 4), doc, allow=("-inf",))
        bad = np.isnan(bias) | (bias == np.inf)
        if bad.any():
            pos = tuple(int(i) for i in np.argwhere(bad)[0])
            where = "".join(f"[{i}]" for i in pos)
            raise key(f"is {bias[pos]}", "a finite number or -inf", f"bias{where}")
        broadcasts(bias.shape, key)
        return bias

    def bias(self, value: Any, inputs: Inputs, cells: Cells, dtype: Any) -> FloatArray:
        full = np.broadcast_to(value, (inputs.batch, inputs.heads, inputs.seq_q, inputs.seq_k))
        cells_bias: FloatArray = take(full, cells)  # (b, h, R, S)
        return cells_bias

    def bound_bias(self, value: Any, inputs: Inputs) -> float:
        finite = value[np.isfinite(value)]
        return float(np.abs(finite).max()) if finite.size else 0.0


class Alibi(Variant[FloatArray]):
    order = 21
    name = "alibi"
    bias_stage = "alibi"
    array_parts = subkeys = ("slopes",)
    reads_positions = True
    key_order = 30
    new_options = (
        NewOption(
            "alibi", bool, "ALiBi: a distance penalty per head instead of positions (BLOOM)."
        ),
    )
    new_rank, new_order = 20, 30

    def parse(self, raw: Any, key: FixtureKey) -> FloatArray | None:
        value = true_or_mapping(raw, key, "true (the paper's slopes) or {slopes: [one per head]}")
        if value is None:
            return None
        if value is True:
            return alibi_slopes(key.heads)
        known_subkeys(value, key, self.name, self.subkeys)
        if value.get("slopes") is None:
            return alibi_slopes(key.heads)
        slopes = per_head(value["slopes"], key, "alibi.slopes")
        if (slopes < 0).any():
            i = int(np.argmax(slopes < 0))
            raise key(
                f"is {slopes[i]}",
                "a number >= 0 (the bias is −slope × distance: a positive slope penalises "
                "distance)",
                f"alibi.slopes[{i}]",
            )
        return slopes

    def config(self, value: Any, inputs: Inputs) -> dict[str, list[float]]:
        return {"slopes": [float(m) for m in value]}

    def stage_formula(self, value: Any, inputs: Inputs, stage: str) -> str:
        return "alibi = −slope_head × |query position − key position|"

    def bias(self, value: Any, inputs: Inputs, cells: Cells, dtype: Any) -> FloatArray:
        q, k = cells.pos_q.astype(np.float64), cells.pos_k.astype(np.float64)  # exact below 2^53
        distance = np.abs(np.subtract.outer(q, k))  # (R, S)
        slopes = np.asarray(value, dtype=np.float64)[cells.heads]  # (h,)
        bias = distance * -slopes[:, None, None]  # (h, R, S)
        out: FloatArray = bias[None].astype(dtype, copy=False)  # (1, h, R, S)
        return out

    def bound_bias(self, value: Any, inputs: Inputs) -> float:
        pos_q, pos_k = inputs.token_positions()
        span = max(int(pos_q.max()), int(pos_k.max())) - min(int(pos_q.min()), int(pos_k.min()))
        return float(np.abs(value).max()) * span

    def new_lines(self, spec: NewSpec, members: Mapping[str, Any]) -> list[str]:
        return [
            "alibi: true   # ALiBi: bias -slope_h * |pos_q - pos_k| added to the scores, slopes "
            "of Press et al."
        ]

    def new_words(self, spec: NewSpec, members: Mapping[str, Any]) -> str:
        return "ALiBi"


def alibi_slopes(n_heads: int) -> FloatArray:
    """Press et al.'s ``get_slopes``: 2^(-8/n)^(1..n), else the closest power of two plus
    every other slope of twice that."""
    if n_heads < 1:
        raise ValueError(f"ALiBi needs at least one head, not {n_heads}")
    return np.array(_get_slopes(n_heads), dtype=np.float64)  # (H,)


def _get_slopes(n: int) -> list[float]:
    """The reference code of "Train Short, Test Long" (ofirpress/attention_with_linear_biases)."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + _get_slopes(2 * closest)[0::2][: n - closest]


register(Bias())
register(Alibi())
