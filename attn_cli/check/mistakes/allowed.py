"""The mistakes of the rules that hide keys (core/plugins/allowed.py), together as the rules
are: a user's mask is one band, so a causal mask inverted or shifted keeps the window's far end.

The causal mask and the boolean mask: either inverted, the causal limit one key off, the causal
mask built from triu (transposed), aligned to the other corner (upper-left vs lower-right when
seq_q != seq_k), left out; any mask applied after the softmax; in a FlashAttention kernel, the
tile on the diagonal skipped with those above it. Axis names as in core/steps.py.

The mistakes of the sliding window (HF/Mistral ``sliding_window``): a window of one key more
or one less, the two ways ``<=`` and ``<`` get mixed up; the window left out (plain causal); the
window taken two-sided, |pos_q - pos_k| < window, without the causal half; the last window keys
kept for every query (a decode rule used in a prefill); in a decode loop, a ring buffer of one
slot too many trusted to hold only the window."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from attn_cli.check.mistake import (
    DECODE,
    FLASH,
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
    band,
    candidate,
    extra_logit,
    masked_candidate,
    masked_with,
    recomputed,
    softmax_and_lse,
)
from attn_cli.check.recompute import allowed as chain_allowed
from attn_cli.core.decode import DecodeBugs
from attn_cli.core.flash import FlashBugs
from attn_cli.core.inputs import BoolArray, Inputs
from attn_cli.core.plugins.allowed import window_reach
from attn_cli.core.variant import Cells
from attn_cli.core.variants import causal_allowed, window_allowed

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def with_causal(inputs: Inputs, causal: BoolArray) -> BoolArray:
    """A (T, S) causal part (the window's far end in it) combined with the fixture's other
    rules, the mask and the lengths: (B, H, T, S)."""
    return chain_allowed(inputs, {"causal": lambda cells: causal, "window": None})


def allowed(
    inp: Inputs, *, causal_shift: int = 0, invert_causal: bool = False, invert_mask: bool = False
) -> BoolArray:
    """Where a query may attend (B, H, T, S), from causal and window (at the token positions),
    mask and lengths, possibly with a mistake: the causal limit moved ``causal_shift`` keys
    (the window's far end stays), the causal part inverted, or the boolean mask inverted."""
    pos_q, pos_k = inp.token_positions()
    causal = np.ones((inp.seq_q, inp.seq_k), dtype=bool)  # (T, S)
    if inp.causal is not None:
        causal = causal_allowed(pos_q + causal_shift, pos_k)  # key <= query + shift
        if inp.window is not None:
            reach = window_reach(inp.window, pos_q, pos_k)
            causal &= np.subtract.outer(pos_q, pos_k) < reach  # (T, S): the far end
        causal = ~causal if invert_causal else causal
    if invert_mask and inp.mask is not None:
        inp = replace(inp, mask=~inp.mask)
    return with_causal(inp, causal)


def _mask_inverted(trace: Trace) -> list[Candidate]:
    inp = trace.inputs
    inversions = (
        (
            inp.mask,
            {"invert_mask": True},
            "Your {stage} is what attn gets with the boolean mask inverted: true taken as "
            "'blocked' (nn.MultiheadAttention's convention) instead of 'may attend' (torch "
            "SDPA's, and the fixture's). Fix: masked = where(mask, scaled, -inf).",
        ),
        (
            inp.causal,
            {"invert_causal": True},
            "Your {stage} is what attn gets with the causal mask inverted: each query sees only "
            "the keys after it and never the ones up to it. Fix: block where key > query, e.g. "
            "where(tril(ones), scaled, -inf).",
        ),
    )
    return [
        masked_candidate(trace, detail, allowed(inp, **flag))
        for given, flag, detail in inversions
        if given is not None
    ]


def _causal_shifted(trace: Trace) -> list[Candidate]:
    if trace.inputs.causal is None:
        return []
    shifts = (
        (1, "each query also sees the next key (tril(…, k=1), or triu(…, 2) blocked)"),
        (-1, "each query misses its own key (tril(…, k=-1), or triu(…, 0) blocked)"),
    )
    return [
        masked_candidate(
            trace,
            f"Your {{stage}} is what attn gets with the causal mask shifted by one: {what}. "
            "Fix: query i may attend to keys j <= i.",
            allowed(trace.inputs, causal_shift=shift),
        )
        for shift, what in shifts
    ]


def _causal_triu(trace: Trace) -> list[Change]:
    inp = trace.inputs
    if inp.causal is None:
        return []
    pos_q, pos_k = inp.token_positions()
    ahead = causal_allowed(-pos_q, -pos_k)  # (T, S): pos_k >= pos_q
    if inp.window is not None:
        reach = window_reach(inp.window, -pos_q, -pos_k)
        ahead &= window_allowed(-pos_q, -pos_k, reach)  # the window transposed too
    detail = (
        "Your {stage} is what attn gets with the causal mask built from triu where tril is "
        "meant: query i sees the keys j >= i (itself and the future) instead of j <= i (itself "
        "and the past); the mask is transposed. Fix: allowed = tril(ones(seq_q, seq_k)), or "
        "block where triu(ones, k=1)."
    )
    masked = masked_with(trace, with_causal(inp, ahead))
    return [Change(detail, "masked", {"masked": masked})]


def _causal_corner(trace: Trace) -> list[Candidate]:
    inp = trace.inputs
    T, S = inp.seq_q, inp.seq_k
    if inp.causal is None or T == S or inp.positions is not None:
        return []  # one corner when square; given positions say where each query is
    lower = inp.causal == "lower-right"
    shift = S - T if not lower else T - S  # the other corner's limit, against this one's
    yours, meant = ("upper-left", "lower-right") if lower else ("lower-right", "upper-left")
    tell = {
        "upper-left": "query i sees keys j <= i (tril(ones(seq_q, seq_k)), torch SDPA's "
        "is_causal, FlashAttention before 2.1)",
        "lower-right": "the last query sees every key, query i keys j <= i + seq_k - seq_q (a "
        "KV cache; FlashAttention from 2.1, torch's causal_lower_right)",
    }
    detail = (
        f"Your {{stage}} is what attn gets with the causal mask aligned {yours}: {tell[yours]}. "
        f"The fixture's causal is {meant}: {tell[meant]}. With seq_q = {T} and seq_k = {S} the two "
        f"differ. Fix: tril(ones(seq_q, seq_k), k={S - T if lower else 0})."
    )
    ok = allowed(inp, causal_shift=shift)  # (B, H, T, S)
    return [masked_candidate(trace, detail, ok)]


def _causal_missing(trace: Trace) -> list[Candidate]:
    inp = trace.inputs
    if inp.causal is None:
        return []
    detail = (
        "Your {stage} is what attn gets with no causal mask: every query sees the keys after "
        "it too (is_causal left False, or the mask built and never applied). Fix: where(tril("
        "ones(seq_q, seq_k)), scaled, -inf)."
    )
    swaps: list[dict[str, Rule | None]] = [{"causal": None}]
    if inp.window is not None:
        swaps.append({"causal": None, "window": None})  # the window built from the causal mask
    oks = [chain_allowed(inp, swap) for swap in swaps]  # (B, H, T, S) each
    return [masked_candidate(trace, detail, ok) for ok in oks]


def _mask_after_softmax(trace: Trace) -> list[Candidate]:
    inp = trace.inputs
    ok = chain_allowed(inp)  # (B, H, T, S)
    if ok.all():
        return []
    logits = masked_with(trace, None)  # every key allowed: the softmax's input, unmasked
    weights = softmax_and_lse(logits, extra_logit(inp))[0] * ok  # (B, H, T, S)
    detail = (
        "Your {stage} is what attn gets with the mask applied after the softmax: the hidden "
        "keys' weights set to 0 and the rest left as they were, so a row sums to less than 1. "
        "The hidden keys must be out of the softmax's sum: fill them with -inf before it (or "
        "renormalise each row after, as LLMs-from-scratch's chapter 3 shows). Fix: masked = "
        "where(allowed, scaled, -inf), then softmax."
    )
    return [
        candidate(trace, detail, "softmax", {"softmax": weights}),
        candidate(trace, detail, "masked", {"masked": logits, "softmax": weights}),
    ]


MASK_INVERTED = Mistake("mask_inverted", "mask polarity inverted", _mask_inverted, 60)
MASK_AFTER_SOFTMAX = Mistake(
    "mask_after_softmax",
    "mask applied after the softmax (rows sum to less than 1)",
    _mask_after_softmax,
    220,
)
for _hider in ("causal", "mask", "lengths"):
    register(_hider, MASK_AFTER_SOFTMAX)
register("mask", MASK_INVERTED)
register(
    "causal",
    MASK_INVERTED,
    Mistake("causal_shifted", "causal mask shifted by one", _causal_shifted, 70),
    Mistake("causal_triu", "causal mask from triu (transposed)", recomputed(_causal_triu), 170),
    Mistake(
        "causal_corner",
        "causal mask aligned to the other corner (upper-left vs lower-right)",
        _causal_corner,
        171,
    ),
    Mistake("causal_missing", "causal mask left out", _causal_missing, 172),
)
register_reader("causal", Reader("the causal mask", "masked"))
register_loop(
    FLASH,
    "causal",
    LoopMistake(
        "causal_extra_skip",
        "one diagonal tile too many skipped",
        FlashBugs(extra_skip=True),
        lambda chain, options: options.get("causal_offset") is not None,
        title="causal tiles skipped wrongly (the diagonal tile too)",
    ),
)

register_zh(
    {
        "mask_inverted": (
            "遮蔽的极性反了",
            "把 True 当成“屏蔽”（nn.MultiheadAttention 的约定），而 fixture 中 True 表示“可以关注”"
            "（torch SDPA 的约定）；或因果遮蔽整个反了。修正：masked = where(allowed, scaled, −inf"
            ")。",
        ),
        "causal_shifted": (
            "因果遮蔽错开了一位",
            "查询多看到了下一个键（tril(k=1)），或看不到自己（tril(k=−1)）。修正：查询 i 可以关注"
            "键 j <= i。",
        ),
        "causal_triu": (
            "因果遮蔽用了 triu（被转置）",
            "查询 i 看到 j >= i 的键（自己和未来），遮蔽被转置了。修正：allowed = tril(ones)。",
        ),
        "causal_corner": (
            "因果遮蔽对齐到了另一个角（左上与右下）",
            "seq_q ≠ seq_k 时，左上对齐是查询 i 看到 j <= i（torch SDPA 的 is_causal，FlashAttenti"
            "on 2.1 之前），右下对齐是最后一个查询看到所有键（KV 缓存，FlashAttention 2.1 起）。修"
            "正：按 fixture 的对齐方式，tril(ones, k=seq_k − seq_q) 为右下。",
        ),
        "causal_missing": (
            "漏掉了因果遮蔽",
            "每个查询也看到了后面的键（is_causal 没设，或遮蔽做了却没用上）。修正：where(tril(ones"
            "), scaled, −inf)。",
        ),
        "mask_after_softmax": (
            "遮蔽放在了 softmax 之后（行和小于 1）",
            "softmax 之后才把被遮蔽的权重置 0，其余权重不变，所以每行和小于 1。修正：softmax 之前"
            "把被遮蔽的位置填成 −inf（或之后重新归一化每一行）。",
        ),
    }
)


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
    return masked_candidate(trace, detail, chain_allowed(trace.inputs, swap))  # (B, H, T, S)


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
    detail = (
        f"Your {{stage}} is what attn gets with the window taken two-sided, |pos_q - pos_k| < "
        f"{inp.window}, and no causal part: each query also sees the next {inp.window - 1} keys. "
        f"FlashAttention's window_size=(left, right) gives this with right = left; the sliding "
        f"window looks back only, window_size=({inp.window - 1}, 0). Fix: allowed = "
        f"(0 <= pos_q - pos_k) & (pos_q - pos_k < {inp.window})."
    )
    return [_masked_by(trace, detail, {"causal": None, "window": band(reach, two_sided=True)})]


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
