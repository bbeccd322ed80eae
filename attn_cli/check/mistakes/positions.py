"""The mistake of reading token positions one off (counted from 1, or queries and keys shifted
against each other), for every variant that reads them: each reader that is on
(check/mistake.py ``Reader``: a Q/K rotation, a bias by distance, the allowed-keys rules) says
what it changes alone, and then all of them read the moved positions together."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from attn_cli.check.mistake import (
    PLAIN,
    Mistake,
    moved_positions,
    readers_for,
    register,
    register_zh,
)
from attn_cli.check.recompute import Change, recomputed

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace

_SHIFTS = ((1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1))  # (queries, keys)


def _shift_text(dq: int, dk: int) -> str:
    if dq == dk:
        first = "1" if dq > 0 else "-1"
        return f"positions counted from {first} instead of 0 (queries and keys alike)"
    who, by = ("query", dq) if dq else ("key", dk)
    return f"the {who} positions shifted by {by:+d} relative to the others"


def _positions_detail(readers: str, what: str) -> str:
    return (
        f"Your {{stage}} is what attn gets when {readers} read {what}. Positions are "
        "0-based: keys 0..seq_k-1, and queries 0..seq_q-1 (with lower-right causal, the last "
        "seq_q key positions, as a KV cache). Fix: use the same positions everywhere, from 0."
    )


def _positions_off_by_one(trace: Trace) -> list[Change]:
    readers = readers_for(trace.inputs)
    if all(r.moved is None for r in readers):
        return []  # a rule on keys alone read one off is that rule off by one: see its mistake
    out: list[Change] = []
    for dq, dk in _SHIFTS:
        what = _shift_text(dq, dk)
        own = [
            (r, c)
            for r in readers
            if r.moved is not None and (c := r.moved(trace, dq, dk)) is not None
        ]
        out += [replace(c, detail=_positions_detail(r.label, what)) for r, c in own]
        if dq == dk or len(readers) < 2:
            continue  # moved alike, no distance changes: only the readers' own stages show it
        detail = _positions_detail(" and ".join(r.label for r in readers), what)
        out.append(Change(detail, own[0][1].start, inputs=moved_positions(trace.inputs, dq, dk)))
    return out


register(
    PLAIN,
    Mistake("positions_off_by_one", "positions off by one", recomputed(_positions_off_by_one), 120),
)

register_zh(
    {
        "positions_off_by_one": (
            "位置差一",
            "RoPE、ALiBi 或遮蔽读取的位置从 1 开始，或查询与键的位置错开了一位。位置从 0 开始；low"
            "er-right 因果时查询位于最后 seq_q 个键的位置。修正：各处使用同一套从 0 开始的位置。",
        ),
    }
)
