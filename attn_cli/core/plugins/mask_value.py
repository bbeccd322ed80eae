"""The mask sentinel (``masked_fill(mask, -1e9)``, fp16's -1e4): what fills the places a query
may not attend instead of −∞. A finite one leaks weight where a row hides every key."""

from __future__ import annotations

import math
from typing import Any

from attn_cli.core.inputs import Inputs
from attn_cli.core.plugins.parsing import is_number
from attn_cli.core.variant import FixtureKey, Variant, register

DOC = "-inf (the default) or a negative number such as -1e9, -1e4"


class MaskValue(Variant):
    name = "mask_value"
    key_order = 70

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


register(MaskValue())
