"""Attention sinks (gpt-oss ``sinks``, HF ``GptOssAttention``): one logit per head joined to every
softmax row and dropped after it, so a row's kept weights sum to 1 − p_sink."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from attn_cli.core.inputs import Inputs
from attn_cli.core.plugins.parsing import per_head
from attn_cli.core.variant import (
    Cells,
    ExtraLogit,
    FixtureKey,
    FloatArray,
    NewOption,
    NewSpec,
    exact,
    register,
)


class Sinks(ExtraLogit[FloatArray]):
    order = 30
    name = "sinks"
    gradient = "d_sinks"
    array_parts = ("",)
    key_order = 60
    new_options = (
        NewOption(
            "sinks", bool, "A random sink logit per head, joined to each softmax row (gpt-oss)."
        ),
    )
    new_rank, new_order = 50, 60

    def parse(self, raw: Any, key: FixtureKey) -> FloatArray:
        return per_head(raw, key, self.name)

    def config(self, value: Any, inputs: Inputs) -> list[float]:
        return [float(x) for x in value]

    def stage_formula(self, value: Any, inputs: Inputs, stage: str) -> str:
        return "d_sinks[h] = −Σ (1 − rowsum(softmax[h])) ∘ delta[h]"

    def formula_part(self, value: Any, inputs: Inputs, stage: str) -> str:
        parts = {"softmax": " with the head's sink joined, then dropped", "lse": " + exp(sink)"}
        return parts.get(stage, "")

    def extra_logit(self, value: Any, cells: Cells, dtype: Any) -> FloatArray:
        logits: FloatArray = np.asarray(value, dtype=dtype)[cells.heads]  # (h,)
        return logits

    def grad_extra(self, value: Any, weights: FloatArray, delta: FloatArray) -> FloatArray:
        """d s_h = −Σ_(batch, query) p_sink · Delta; the sink's weight p_sink = 1 − rowsum(P)."""
        p_sink = 1.0 - weights.sum(axis=-1)  # (B, H, T)
        d_sinks: FloatArray = -(p_sink * delta).sum(axis=(0, 2))  # (H,)
        return d_sinks

    def new_members(self, spec: NewSpec, rng: np.random.Generator) -> dict[str, Any]:
        return (
            {self.name: rng.normal(size=spec.heads).round(2)} if spec.options.get(self.name) else {}
        )

    def new_lines(self, spec: NewSpec, members: Mapping[str, Any]) -> list[str]:
        return [
            "sinks: [" + ", ".join(exact(x) for x in members[self.name]) + "]   # one logit per "
            "query head, joined to each softmax row and dropped (gpt-oss): rows sum to less than 1"
        ]


register(Sinks())
