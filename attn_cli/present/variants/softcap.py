"""Logit soft-capping (Gemma 2), what present/ says about it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import Lang, label
from attn_cli.present.variant_texts import VariantTexts

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs


class SoftcapTexts(VariantTexts):
    name = "softcap"
    stage = "capped"
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "conv_softcap": (
                "softcap {cap}: capped = {cap}·tanh(scaled/{cap}), before the mask (Gemma 2)"
            ),
            "cell_cap": "soft-capping squeezes the score into (−{cap}, {cap}):",
        },
        "zh": {
            "conv_softcap": (
                "softcap {cap}：capped = {cap}·tanh(scaled/{cap})，在遮盖之前（Gemma 2）"
            ),
            "cell_cap": "软截断把分数压进 (−{cap}, {cap})：",
        },
    }

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        return [label(lang, "conv_softcap", cap=f"{value:g}")]


TEXTS = SoftcapTexts()
