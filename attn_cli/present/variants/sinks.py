"""Attention sinks (gpt-oss): a learned logit per head, what present/ says about it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import Lang, label
from attn_cli.present.variant_texts import VariantTexts

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs


class SinksTexts(VariantTexts):
    name = "sinks"
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "conv_sinks": (
                "sinks: one learned logit per head joins each softmax row "
                "and is dropped (gpt-oss): rows sum to less than 1"
            ),
        },
        "zh": {
            "conv_sinks": (
                "sinks：每个头一个学到的 logit，加入每行 softmax 后丢弃（gpt-oss）：每行之和小于 1"
            ),
        },
    }

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        return [label(lang, "conv_sinks")]

    def extra_logit(self, inp: Inputs, head: int) -> float | None:
        return float(self.setting(inp)[head])


TEXTS = SinksTexts()
