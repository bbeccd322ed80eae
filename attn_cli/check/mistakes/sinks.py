"""The mistake of attention sinks (gpt-oss): the sinks left out of the softmax."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attn_cli.check.mistake import Mistake, register
from attn_cli.check.recompute import Change, internal, recomputed
from attn_cli.core.stages import softmax_input
from attn_cli.core.steps import softmax

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _sinks_left_out(trace: Trace) -> list[Change]:
    if trace.inputs.sinks is None:
        return []
    detail = (
        "Your {stage} is what attn gets when the sinks are left out of the softmax: each row "
        "sums to 1. gpt-oss joins one learned logit per head to every row, takes the softmax, "
        "and drops that column, so a row sums to less than 1. Fix: softmax over "
        "[scores, sink], then drop the sink's column."
    )
    start = softmax_input(trace.inputs)
    return [Change(detail, "softmax", {"softmax": softmax(internal(trace, start))})]


register(
    "sinks",
    Mistake("sinks_left_out", "sinks left out of the softmax (rows sum to 1)",
            recomputed(_sinks_left_out), 200),
)  # fmt: skip
