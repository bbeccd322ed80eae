"""Chunked attention (Llama 4's ``attention_chunk_size``; transformers' masking_utils
``chunked_overlay``): the positions are cut into chunks of ``chunk`` and a query sees the keys of
its own chunk only, causally within it: ``pos_k <= pos_q`` and ``pos_k // chunk == pos_q // chunk``.
Unlike a sliding window, the first query of a chunk sees itself alone."""

from __future__ import annotations

from typing import Any

from attn_cli.core.inputs import Inputs
from attn_cli.core.plugins.parsing import causal_count
from attn_cli.core.rope_table import MAX_POSITION
from attn_cli.core.variant import BoolArray, Cells, FixtureKey, Variant, register


class Chunk(Variant[int]):
    order = 14
    name = "chunk"
    reads_positions = True
    key_order = 41

    def parse(self, raw: Any, key: FixtureKey) -> int:
        return causal_count(
            raw,
            key,
            "a whole number >= 1 (positions per chunk)",
            "a whole number from 1 to 2**53 (positions per chunk)",
            "causal: true or lower-right alongside chunk (Llama 4's chunks are causal within)",
            MAX_POSITION,  # 10**30 would overflow NumPy's positions // chunk
        )

    def allowed(self, value: Any, inputs: Inputs, cells: Cells) -> BoolArray:
        chunk_q = cells.pos_q[None, None, :, None] // value  # (1, 1, R, 1)
        chunk_k = cells.pos_k[None, None, None, :] // value  # (1, 1, 1, S)
        same: BoolArray = chunk_q == chunk_k  # (1, 1, R, S)
        return same

    def hides(self, value: Any) -> str:
        return f"chunks of {value}"


register(Chunk())
