"""The mistakes of ALiBi (Press et al.: −slope_h × |pos_q − pos_k|): the sign flipped, and
(with positions.py) the positions read one off."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from attn_cli.check.mistake import Mistake, Reader, moved_positions, register, register_reader
from attn_cli.check.recompute import Change, bias_stage, recomputed

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _alibi_sign(trace: Trace) -> list[Change]:
    inp = trace.inputs
    if inp.alibi is None:
        return []
    flipped = replace(inp, alibi=-inp.alibi)
    detail = (
        "Your {stage} is what attn gets with the ALiBi bias added as +slope·|pos_q - pos_k|: "
        "distant keys gain weight instead of losing it. Fix: bias = -slope * |pos_q - pos_k|."
    )
    return [Change(detail, "alibi", {"alibi": bias_stage(flipped, "alibi")})]


def _moved(trace: Trace, dq: int, dk: int) -> Change | None:
    """The ALiBi stage at moved positions; moving both alike changes no distance: None."""
    if dq == dk:
        return None
    shifted = moved_positions(trace.inputs, dq, dk)
    return Change("", "alibi", {"alibi": bias_stage(shifted, "alibi")})


register(
    "alibi",
    Mistake("alibi_sign", "ALiBi sign flipped (+slope·distance)", recomputed(_alibi_sign), 150),
)
register_reader("alibi", Reader("ALiBi", "alibi", _moved))
