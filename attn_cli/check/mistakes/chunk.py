"""The mistakes of chunked attention (Llama 4's ``attention_chunk_size``): the chunk boundaries
put one position early or late (``(pos + 1) // chunk``, a 1-based position), and the chunks taken
for a sliding window of the same size (each query sees the last ``chunk`` keys, across a
boundary)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attn_cli.check.mistake import Mistake, Reader, register, register_reader, register_zh
from attn_cli.check.recompute import Candidate, Rule, allowed, band, masked_candidate
from attn_cli.core.inputs import BoolArray
from attn_cli.core.variant import Cells

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _chunk(trace: Trace) -> int | None:
    chunk: Any = trace.inputs.extra.get("chunk")
    return None if chunk is None else int(chunk)


def _masked_by(trace: Trace, detail: str, rule: Rule) -> Candidate:
    """The stages from masked on with the chunk rule done ``rule``'s way."""
    return masked_candidate(trace, detail, allowed(trace.inputs, {"chunk": rule}))  # (B, H, T, S)


def _shifted(chunk: int, shift: int) -> Rule:
    def rule(cells: Cells) -> BoolArray:
        q = (cells.pos_q[None, None, :, None] + shift) // chunk  # (1, 1, R, 1)
        k = (cells.pos_k[None, None, None, :] + shift) // chunk  # (1, 1, 1, S)
        same: BoolArray = q == k  # (1, 1, R, S)
        return same

    return rule


def _chunk_off_by_one(trace: Trace) -> list[Candidate]:
    c = _chunk(trace)
    if c is None or c < 2:
        return []
    out = []
    for shift, where in ((1, "one position early"), (-1, "one position late")):
        detail = (
            f"Your {{stage}} is what attn gets with every chunk boundary {where}, "
            f"(pos + {shift}) // {c} for the chunk of a position (a 1-based position, or a "
            f"boundary at multiples of {c} counted from 1): chunks start at positions 0, {c}, "
            f"{2 * c}, ... Fix: allowed = (pos_k <= pos_q) & (pos_k // {c} == pos_q // {c})."
        ).replace("+ -1", "- 1")
        out.append(_masked_by(trace, detail, _shifted(c, shift)))
    return out


def _chunk_as_window(trace: Trace) -> list[Candidate]:
    c = _chunk(trace)
    if c is None:
        return []
    detail = (
        f"Your {{stage}} is what attn gets with a sliding window of {c} in place of chunks of "
        f"{c}: each query sees its last {c} keys, across a chunk boundary. Llama 4's chunks are "
        f"fixed blocks: the first query of a chunk sees itself alone. Fix: allowed = "
        f"(pos_k <= pos_q) & (pos_k // {c} == pos_q // {c})."
    )
    return [_masked_by(trace, detail, band(c, two_sided=False))]


register(
    "chunk",
    Mistake("chunk_off_by_one", "chunk boundary off by one", _chunk_off_by_one, 134),
    Mistake("chunk_as_window", "chunk and window confused", _chunk_as_window, 135),
)
register_reader("chunk", Reader("chunk", "masked"))

register_zh(
    {
        "chunk_off_by_one": (
            "分块边界差一",
            "块的边界整体错了一个位置（用了从 1 数起的位置）。块从位置 0、chunk、2·chunk……开始。"
            "修正：allowed = (pos_k <= pos_q) & (pos_k // chunk == pos_q // chunk)。",
        ),
        "chunk_as_window": (
            "把分块和滑动窗口混淆了",
            "用了大小为 chunk 的滑动窗口，查询跨过块边界看到前一块的键。Llama 4 的块是固定的，"
            "每块第一个查询只看自己。修正：pos_k // chunk == pos_q // chunk。",
        ),
    }
)
