"""The sliding window (Mistral, Gemma 2), what present/ says about it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import Lang, label
from attn_cli.present.variant_texts import VariantTexts

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs


class WindowTexts(VariantTexts):
    name = "window"
    order = 30
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

    formula_zh: ClassVar[tuple[tuple[str, str], ...]] = ((r"window (\d+)", r"窗口 \1"),)
    cost: ClassVar[dict[Lang, str]] = {
        "en": "with window {w} the ring buffer keeps only {w} tokens: {n} bytes at most",
        "zh": "窗口为 {w} 时，环形缓冲区只保留 {w} 个词：最多 {n} 字节",
    }

    def cost_notes(self, value: Any, per_token: int, seq: int, lang: Lang) -> list[str]:
        w = value
        return [self.cost[lang].format(w=w, n=f"{per_token * w:,}")] if w < seq else []

    def masked_note(self, value: Any, zh: bool) -> list[str]:
        w = value
        return [
            f"滑动窗口 window = {w}：查询只看满足 0 ≤ pos_q − pos_k < {w} 的键，最多 {w} 个，"
            f"包括它自己（HF/Mistral 的 sliding_window；FlashAttention 写作 "
            f"window_size=({w - 1}, 0)）。"
            if zh
            else f"Sliding window {w}: a query sees only keys with 0 ≤ pos_q − pos_k < {w}, at "
            f"most {w} keys, itself included (HF/Mistral sliding_window; FlashAttention's "
            f"window_size=({w - 1}, 0))."
        ]

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        return [label(lang, "conv_window", w=value, left=value - 1)]


TEXTS = WindowTexts()
