"""The sliding window (Mistral, Gemma 2), what present/ says about it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import Lang, label
from attn_cli.present.variant_texts import VariantTexts

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs


class WindowTexts(VariantTexts):
    name = "window"
    reads_positions = True
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "conv_window": (
                "window {w}: a query sees keys with 0 ≤ pos_q − pos_k < {w} "
                "(HF/Mistral; FlashAttention window_size=({left}, 0))"
            ),
        },
        "zh": {
            "conv_window": (
                "窗口 {w}：查询只看 0 ≤ pos_q − pos_k < {w} "
                "的键（HF/Mistral；FlashAttention window_size=({left}, 0)）"
            ),
        },
    }

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        return [label(lang, "conv_window", w=value, left=value - 1)]


TEXTS = WindowTexts()
