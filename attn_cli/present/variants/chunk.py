"""Chunked attention (Llama 4's attention_chunk_size), what present/ says about it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import Lang, label
from attn_cli.present.variant_texts import VariantTexts

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs


class ChunkTexts(VariantTexts):
    name = "chunk"
    order = 31
    reads_positions = True
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "conv_chunk": (
                "chunks of {c}: a query sees keys with pos_k <= pos_q and pos_k // {c} == "
                "pos_q // {c} (Llama 4 attention_chunk_size)"
            ),
        },
        "zh": {
            "conv_chunk": (
                "每块 {c} 个位置：查询只看 pos_k <= pos_q 且 pos_k // {c} == pos_q // {c} "
                "的键（分块注意力）"
            ),
        },
    }

    formula_zh: ClassVar[tuple[tuple[str, str], ...]] = ((r"chunks of (\d+)", r"每块 \1"),)

    def masked_note(self, value: Any, zh: bool) -> list[str]:
        c = value
        return [
            f"分块注意力 chunk = {c}：位置被切成每 {c} 个一块，查询只看自己这一块里不晚于它的键"
            f"（pos_k // {c} == pos_q // {c}）。与滑动窗口不同，每块的第一个查询只看到它自己"
            "。"
            if zh
            else f"Chunked attention, chunk = {c}: positions are cut into chunks of {c} and a "
            f"query sees only the keys of its own chunk up to itself (pos_k // {c} == "
            f"pos_q // {c}). Unlike a sliding window, the first query of a chunk sees itself "
            "alone (Llama 4 attention_chunk_size)."
        ]

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        return [label(lang, "conv_chunk", c=value)]


TEXTS = ChunkTexts()
