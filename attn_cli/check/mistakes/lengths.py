"""The mistakes of padding (``lengths``: only the first lengths[b] keys of batch item b are
real): the padding taken at the start (left padding), the padded queries hidden instead of the
padded keys, one key more or one less, the padding not hidden at all. Axis names as in
core/steps.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from attn_cli.check.mistake import Mistake, register, register_zh
from attn_cli.check.recompute import Candidate, allowed, masked_candidate
from attn_cli.core.inputs import BoolArray, IntArray
from attn_cli.core.variant import Cells

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace

Valid = Callable[
    [Cells, IntArray], BoolArray
]  # (cells, lengths of its batch items) -> (b,1,R|1,S|1)


def _with(trace: Trace, detail: str, valid: Valid | None) -> Candidate:
    """The stages from masked on with the padding rule done as ``valid`` (None: left out)."""
    lengths = trace.inputs.lengths
    assert lengths is not None

    def rule(cells: Cells) -> BoolArray:
        assert valid is not None
        return valid(cells, lengths[cells.batch])

    ok = allowed(trace.inputs, {"lengths": None if valid is None else rule})  # (B, H, T, S)
    return masked_candidate(trace, detail, ok)


def _left(cells: Cells, n: IntArray) -> BoolArray:
    S = len(cells.keys)
    ok: BoolArray = cells.keys[None, :] >= S - n[:, None]  # (b, S): the last n keys
    return ok[:, None, None, :]


def _queries(cells: Cells, n: IntArray) -> BoolArray:
    ok: BoolArray = cells.queries[None, :] < n[:, None]  # (b, R): the first n queries
    return ok[:, None, :, None]


def _padding_side(trace: Trace) -> list[Candidate]:
    if trace.inputs.lengths is None:
        return []
    detail = (
        "Your {stage} is what attn gets with the padding taken at the start of each item: the "
        "last lengths[b] keys kept instead of the first (left padding, as tokenizers pad for "
        "generation with padding_side='left'). The fixture's lengths count real keys from the "
        "start. Fix: allowed = arange(seq_k) < lengths[b]."
    )
    return [_with(trace, detail, _left)]


def _on_queries(trace: Trace) -> list[Candidate]:
    if trace.inputs.lengths is None:
        return []
    detail = (
        "Your {stage} is what attn gets with the padding hidden along the queries instead of "
        "the keys: the padded query rows emptied while every query still attends to the padded "
        "keys. The padding mask hides keys (its shape broadcasts as [batch, 1, 1, seq_k]). "
        "Fix: mask[:, None, None, :], not mask[:, None, :, None]."
    )
    return [_with(trace, detail, _queries)]


def _off_by_one(trace: Trace) -> list[Candidate]:
    if trace.inputs.lengths is None:
        return []
    out = []
    for by, said in (
        (1, "<= lengths[b]: one padding key seen"),
        (-1, "< lengths[b] - 1: the last real key hidden"),
    ):

        def valid(cells: Cells, n: IntArray, by: int = by) -> BoolArray:
            ok: BoolArray = cells.keys[None, :] < n[:, None] + by  # (b, S)
            return ok[:, None, None, :]

        detail = (
            f"Your {{stage}} is what attn gets with the keys kept where key {said}. Keys "
            "0..lengths[b]-1 are real. Fix: allowed = arange(seq_k) < lengths[b]."
        )
        out.append(_with(trace, detail, valid))
    return out


def _ignored(trace: Trace) -> list[Candidate]:
    if trace.inputs.lengths is None:
        return []
    detail = (
        "Your {stage} is what attn gets with the padding not hidden: every query attends to "
        "the padded keys too (the attention_mask built and never passed on, or passed where "
        "the model ignores it). Fix: hide the keys at and past lengths[b]."
    )
    return [_with(trace, detail, None)]


register(
    "lengths",
    Mistake(
        "lengths_padding_side",
        "padding taken at the start (left) instead of the end",
        _padding_side,
        240,
    ),
    Mistake(
        "lengths_on_queries",
        "padding hidden along the queries instead of the keys",
        _on_queries,
        241,
    ),
    Mistake("lengths_off_by_one", "padding mask one key off", _off_by_one, 242),
    Mistake("lengths_ignored", "padding not hidden", _ignored, 243),
)

register_zh(
    {
        "lengths_padding_side": (
            "把填充当成在开头（左填充）",
            "保留了最后 lengths[b] 个键而不是前面的；fixture 的 lengths 从开头数真实的键。修正：al"
            "lowed = arange(seq_k) < lengths[b]。",
        ),
        "lengths_on_queries": (
            "填充遮蔽加在了查询上而不是键上",
            "填充的查询行被清空，每个查询却仍关注填充的键。填充遮蔽的形状应广播为 [batch, 1, 1, se"
            "q_k]。修正：mask[:, None, None, :]。",
        ),
        "lengths_off_by_one": (
            "填充遮蔽差一个键",
            "多看到一个填充键，或把最后一个真实键遮住了。键 0..lengths[b]−1 是真实的。修正：allowe"
            "d = arange(seq_k) < lengths[b]。",
        ),
        "lengths_ignored": (
            "填充没有被遮蔽",
            "每个查询也关注了填充的键（attention_mask 建了却没传下去）。修正：遮住 lengths[b] 及之"
            "后的键。",
        ),
    }
)
