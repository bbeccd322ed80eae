"""The mask sentinel (``masked_fill(mask, -1e9)``, fp16's -1e4): what fills the places a query
may not attend instead of −∞. A finite one leaks weight where a row hides every key."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from attn_cli.core.inputs import Inputs
from attn_cli.core.plugins.parsing import is_number
from attn_cli.core.roles import SETS_FILL
from attn_cli.core.variant import (
    FixtureKey,
    NewOption,
    NewSpec,
    Variant,
    exact,
    register,
)

DOC = "-inf (the default) or a negative number such as -1e9, -1e4"


class MaskValue(Variant[float]):
    order = 50
    name = "mask_value"
    key_order = 70
    declares = frozenset({SETS_FILL})  # no hook: the chain reads its fill from the inputs
    new_options = (
        NewOption(
            "mask_value",
            float,
            "Fill hidden places with V (e.g. -1e4) instead of −∞, to see it leak. Needs --causal.",
            metavar="V",
            field="mask_value",
            example=("leak.yaml --causal --mask-value -1e4", "a sentinel that leaks"),
        ),
    )
    new_rank, new_order = 80, 70

    def value(self, inputs: Inputs) -> float | None:
        return None if inputs.mask_value == -math.inf else inputs.mask_value

    def parse(self, raw: Any, key: FixtureKey) -> float:
        value = -math.inf if raw == "-inf" else raw
        if not is_number(value):
            raise key(f"got {key.describe(value)}", DOC)
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if math.isnan(number) or number >= 0:
            raise key(f"is {value}", DOC)
        if not key.masks:
            raise key(
                "given but nothing is masked",
                "causal, window, mask or lengths alongside mask_value",
            )
        return number

    def new_problem(self, spec: NewSpec) -> tuple[str, str, str] | None:
        value = spec.options.get(self.name)
        if value is not None and math.isnan(value):
            return self.name, "is nan", "-inf or a negative number such as -1e4"
        if value is not None and not spec.causal:
            return (
                self.name,
                "given but nothing is masked",
                "--causal alongside --mask-value (it fills the places a query may not see)",
            )
        return None

    def new_lines(self, spec: NewSpec, members: Mapping[str, Any]) -> list[str]:
        value = spec.options[self.name]
        what = (
            "the default: -inf where a key may not be attended"
            if value == -math.inf
            else "fills where a key may not be attended, instead of -inf: a finite sentinel "
            "can leak weight (attn warns)"
        )
        return [f"mask_value: {exact(value)}   # {what}"]

    def new_words(self, spec: NewSpec, members: Mapping[str, Any]) -> str:
        return f"mask_value {spec.options[self.name]:g}"


register(MaskValue())
