"""The mistakes of the sliding window (HF/Mistral ``sliding_window``): a window of one key more
or one less, the two ways ``<=`` and ``<`` get mixed up; the window left out (plain causal); the
window taken two-sided, |pos_q - pos_k| < window, without the causal half; the last window keys
kept for every query (a decode rule used in a prefill); in a decode loop, a ring buffer of one
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
    register_zh,
)
from attn_cli.check.recompute import (
    Candidate,
    Change,
    Rule,
    allowed,
    candidate,
    masked_with,
    recomputed,
)
from attn_cli.core.decode import DecodeBugs
from attn_cli.core.inputs import BoolArray
from attn_cli.core.plugins.allowed import window_reach
from attn_cli.core.variant import Cells

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


def _masked_by(trace: Trace, detail: str, swap: dict[str, Rule | None]) -> Candidate:
    """The stages from masked on with the allowed-keys rules of ``swap`` done that way."""
    ok = allowed(trace.inputs, swap)  # (B, H, T, S)
    return candidate(trace, detail, "masked", {"masked": masked_with(trace, ok)})


def _window_ignored(trace: Trace) -> list[Candidate]:
    w = trace.inputs.window
    if w is None:
        return []
    detail = (
        f"Your {{stage}} is what attn gets with the sliding window left out: plain causal "
        f"attention, every earlier key seen, where a query sees only the last {w} keys "
        "counting itself. A path that forgets the window (an SDPA or eager branch that never "
        "builds it, a mask made before sliding_window was read) gives this. Fix: allowed &= "
        f"(pos_q - pos_k < {w})."
    )
    return [_masked_by(trace, detail, {"window": None})]


def _window_two_sided(trace: Trace) -> list[Candidate]:
    inp = trace.inputs
    if inp.window is None:
        return []
    reach = window_reach(inp.window, *inp.token_positions())

    def band(cells: Cells) -> BoolArray:
        near: BoolArray = abs(cells.pos_q[:, None] - cells.pos_k[None, :]) < reach  # (R, S)
        return near[None, None]  # (1, 1, R, S)

    detail = (
        f"Your {{stage}} is what attn gets with the window taken two-sided, |pos_q - pos_k| < "
        f"{inp.window}, and no causal part: each query also sees the next {inp.window - 1} keys. "
        f"FlashAttention's window_size=(left, right) gives this with right = left; the sliding "
        f"window looks back only, window_size=({inp.window - 1}, 0). Fix: allowed = "
        f"(0 <= pos_q - pos_k) & (pos_q - pos_k < {inp.window})."
    )
    return [_masked_by(trace, detail, {"causal": None, "window": band})]


def _window_last_keys(trace: Trace) -> list[Candidate]:
    inp = trace.inputs
    if inp.window is None:
        return []
    pos_q, pos_k = inp.token_positions()
    reach = window_reach(inp.window, pos_q, pos_k)
    last = int(pos_q.max())

    def kept(cells: Cells) -> BoolArray:
        recent: BoolArray = cells.pos_k[None, None, None, :] > last - reach  # (1, 1, 1, S)
        return recent

    detail = (
        f"Your {{stage}} is what attn gets when every query keeps the same last {inp.window} keys "
        f"(positions > {last - inp.window}), the window measured from the last query: the rule "
        "of a rolling KV cache while decoding, used on a whole prompt at once, or the keys cut "
        "to k[-window:] before the scores. Each query has a window of its own. Fix: allowed = "
        f"(0 <= pos_q - pos_k) & (pos_q - pos_k < {inp.window}), query by query."
    )
    return [_masked_by(trace, detail, {"window": kept})]


register(
    "window",
    Mistake("window_off_by_one", "sliding window off by one", recomputed(_window_off_by_one), 130),
    Mistake("window_ignored", "sliding window left out (plain causal)", _window_ignored, 131),
    Mistake(
        "window_two_sided", "sliding window two-sided (no causal part)", _window_two_sided, 132
    ),
    Mistake(
        "window_last_keys",
        "sliding window from the last query (the same keys for all)",
        _window_last_keys,
        133,
    ),
)
register_reader("window", Reader("window", "masked"))
register_loop(
    DECODE,
    "window",
    LoopMistake(
        "ring_buffer_off_by_one",
        "ring buffer of window + 1 slots (one key too many)",
        DecodeBugs(extra_slots=1),
        lambda chain, options: chain.cache_slots() is not None,
    ),
)

register_zh(
    {
        "window_off_by_one": (
            "滑动窗口差一",
            "窗口多了或少了一个键（<= 与 < 混淆）。查询看到 0 <= pos_q − pos_k < window 的键，包括"
            "自己最多 window 个（FlashAttention 的 window_size=(window−1, 0)）。修正：allowed = (0"
            " <= d) & (d < window)。",
        ),
        "window_ignored": (
            "滑动窗口被漏掉了（普通因果）",
            "只做了因果遮蔽，每个查询看到所有更早的键。修正：再加上 pos_q − pos_k < window。",
        ),
        "window_two_sided": (
            "滑动窗口做成了双向（没有因果部分）",
            "用了 |pos_q − pos_k| < window，查询也看到了后面的键；滑动窗口只向后看。修正：(0 <= po"
            "s_q − pos_k) & (pos_q − pos_k < window)。",
        ),
        "window_last_keys": (
            "窗口从最后一个查询量起（所有查询用同样的键）",
            "把解码时滚动缓存的规则（只保留最后 window 个键）用在整段 prompt 上。每个查询有自己的"
            "窗口。修正：逐个查询计算 pos_q − pos_k < window。",
        ),
    }
)
