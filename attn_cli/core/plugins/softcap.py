"""Logit softcapping (Gemma 2 ``attn_logit_softcapping``): capped = cap·tanh(scaled / cap), on
the scaled scores before the bias and the mask."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from attn_cli.core.inputs import Inputs
from attn_cli.core.plugins.parsing import finite_flag, positive_number
from attn_cli.core.stage_spec import number_text
from attn_cli.core.variant import (
    FixtureKey,
    FloatArray,
    NewOption,
    NewSpec,
    ScoreModifier,
    exact,
    register,
)


class Softcap(ScoreModifier[float]):
    order = 40
    name = "softcap"
    stage = "capped"
    key_order = 50
    new_options = (
        NewOption(
            "softcap",
            float,
            "Logit soft-capping: C·tanh(scaled/C) before the mask (Gemma 2 uses 50).",
            metavar="C",
            field="softcap",
            example=("gemma.yaml --softcap 50", "Gemma 2 logit capping"),
        ),
    )
    new_rank, new_order = 40, 50

    def parse(self, raw: Any, key: FixtureKey) -> float:
        return positive_number(raw, key, "cap × tanh(x / cap)")

    def stage_formula(self, value: float, inputs: Inputs, stage: str) -> str:
        return f"capped = softcap × tanh(scaled / softcap), softcap = {value:g}"

    def grad_formula(self, value: float, inputs: Inputs, d_out: str, x_in: str) -> str:
        return f"{d_out} ∘ (1 − tanh²({x_in} / {number_text(value)}))"

    def modify(self, value: Any, x: FloatArray, out: FloatArray | None = None) -> FloatArray:
        capped: FloatArray = np.divide(x, value, out=out)
        np.tanh(capped, out=capped)
        np.multiply(capped, value, out=capped)
        return capped

    def grad_modify(self, value: Any, d_out: FloatArray, x_in: FloatArray) -> FloatArray:
        t = np.tanh(x_in / value)
        d_in: FloatArray = d_out * (1.0 - t * t)  # d tanh(u) = 1 − tanh²(u)
        return d_in

    def bound_modify(self, value: Any, bound: float) -> float:
        return min(bound, float(value))  # |cap·tanh(·)| < cap

    def new_problem(self, spec: NewSpec) -> tuple[str, str, str] | None:
        return finite_flag(spec, self.name)

    def new_lines(self, spec: NewSpec, members: Mapping[str, Any]) -> list[str]:
        cap = spec.options[self.name]
        return [
            f"softcap: {exact(cap)}   # capped = {cap:g} * tanh(scaled / {cap:g}), before the mask "
            "(Gemma 2)"
        ]

    def new_words(self, spec: NewSpec, members: Mapping[str, Any]) -> str:
        return f"softcap {spec.options[self.name]:g}"


register(Softcap())
