"""The mistakes of the sliding window (HF/Mistral ``sliding_window``): a window of one key more
or one less, the two ways ``<=`` and ``<`` get mixed up; in a decode loop, a ring buffer of one
slot too many trusted to hold only the window."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from attn_cli.check.mistake import (
    DECODE,
    LoopMistake,
    Mistake,
    Reader,
    register,
    register_loop,
    register_reader,
)
from attn_cli.check.recompute import Change, recomputed
from attn_cli.core.decode import DecodeBugs

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _window_off_by_one(trace: Trace) -> list[Change]:
    w = trace.inputs.window
    if w is None:
        return []
    out = []
    for wrong, rule in ((w + 1, f"<= {w}"), (w - 1, f"< {w - 1}")):
        if wrong < 1:
            continue
        detail = (
            f"Your {{stage}} is what attn gets with a window of {wrong} keys (0 <= pos_q - pos_k "
            f"{rule}) instead "
            f"of {w}: a query sees keys with 0 <= pos_q - pos_k < {w}, at most {w} keys "
            f"counting itself (HF/Mistral sliding_window; FlashAttention's window_size=({w - 1}, "
            f"0) is the same window). Fix: allowed = (0 <= pos_q - pos_k) & (pos_q - pos_k < {w})."
        )
        changed = replace(trace.inputs, window=wrong)
        out.append(Change(detail, "masked", inputs=changed))
    return out


register(
    "window",
    Mistake("window_off_by_one", "sliding window off by one", recomputed(_window_off_by_one), 130),
)
register_reader("window", Reader("window", "masked"))
register_loop(
    DECODE,
    "window",
    LoopMistake(
        "ring_buffer_off_by_one", "ring buffer of window + 1 slots (one key too many)",
        DecodeBugs(extra_slots=1), lambda chain, options: chain.cache_slots() is not None,
    ),
)  # fmt: skip
