"""The mistakes of the mask's sentinel, what fills the places a query may not attend: a finite
number (-1e9, -1e4, finfo.min) where the fixture has -inf, -inf where it has a finite one (the
``mask_value`` variant), another finite one, 0 (the scores multiplied by a 0/1 mask), and the
sentinel added to the scores (BERT's extended attention mask) instead of filling them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from attn_cli.check.mistake import Mistake, register, register_zh
from attn_cli.check.recompute import Candidate, candidate, masked_with
from attn_cli.check.recompute import allowed as chain_allowed
from attn_cli.core.inputs import BoolArray, FloatArray

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace

# masked_fill(mask, -1e9) (the annotated transformer), -1e4 (fp16 code, BERT's -10000.0),
# fp16's lowest -65504, -1e30, torch.finfo(float32).min (HF's min_dtype)
SENTINELS = (-1e9, -1e4, -65504.0, -1e30, float(np.finfo(np.float32).min))
# added, -1e30 and finfo.min swamp every score: the numbers of a fill, said as one
ADDED_SENTINELS = (-1e9, -1e4, -65504.0)
HIDERS = ("causal", "mask", "lengths")  # the variants whose rules hide keys (window needs causal)


def _hidden(trace: Trace) -> tuple[FloatArray, BoolArray] | None:
    """The logits with every key allowed (the biases added) and where keys may be attended;
    None when nothing is hidden."""
    ok = chain_allowed(trace.inputs)  # (B, H, T, S)
    if ok.all():
        return None
    return masked_with(trace, None), ok  # (B, H, T, S) each


def _filled(trace: Trace, detail: str, fill: float) -> Candidate:
    """The stages from masked on with the hidden places filled with ``fill``."""
    found = _hidden(trace)
    assert found is not None
    logits, ok = found
    return candidate(trace, detail, "masked", {"masked": np.where(ok, logits, fill)})


def _fixture_fill(trace: Trace) -> float:
    fill: float = trace.inputs.mask_value
    return fill


def _finite_sentinel(trace: Trace) -> list[Candidate]:
    if _fixture_fill(trace) != -math.inf or _hidden(trace) is None:
        return []
    out = []
    for s in SENTINELS:
        detail = (
            f"Your {{stage}} is what attn gets with the hidden places filled with {s:g} "
            f"(masked_fill(~allowed, {s:g})) instead of -inf. It is the same as long as a row "
            "keeps some key far above the sentinel; a row that hides every key (a padded "
            "query, an item of length 0) then gets uniform weights over the hidden keys "
            "instead of none, and scores near the sentinel leak weight. Fix: fill with "
            "float('-inf') (and give an empty row zeros)."
        )
        out.append(_filled(trace, detail, s))
    return out


def _zero_fill(trace: Trace) -> list[Candidate]:
    if _hidden(trace) is None:
        return []
    detail = (
        "Your {stage} is what attn gets with the hidden places set to 0 instead of -inf: the "
        "scores multiplied by the 0/1 mask (scores * mask), or masked_fill with 0. exp(0) = 1 "
        "is no less than the scores', so hidden keys keep real weight. Fix: "
        "masked_fill(~allowed, float('-inf'))."
    )
    return [_filled(trace, detail, 0.0)]


def _added(trace: Trace) -> list[Candidate]:
    fixture = _fixture_fill(trace)
    found = _hidden(trace)
    if found is None:
        return []
    logits, ok = found
    out = []
    for s in (fixture,) if math.isfinite(fixture) else ADDED_SENTINELS:
        detail = (
            f"Your {{stage}} is what attn gets with the sentinel {s:g} added to the hidden places "
            f"(scores + (1 - mask) * {s:g}, BERT's extended attention mask) instead of filling "
            "them: a hidden score keeps its own value on top of the sentinel, and a row that "
            "hides every key gets the weights of its scores, as if nothing were hidden. Fix: "
            f"masked_fill(~allowed, {s:g})."
        )
        added = logits + np.where(ok, 0.0, s)  # (B, H, T, S)
        out.append(candidate(trace, detail, "masked", {"masked": added}))
    return out


def _value_ignored(trace: Trace) -> list[Candidate]:
    fill = _fixture_fill(trace)
    if not math.isfinite(fill) or _hidden(trace) is None:
        return []
    detail = (
        f"Your {{stage}} is what attn gets with the hidden places filled with -inf where the "
        f"fixture's mask_value is {fill:g}: the model's code fills with a finite sentinel (fp16 "
        "code, masked_fill(mask, -1e4)), which leaks weight to hidden keys whose scores come "
        "near it and gives a row that hides every key uniform weights. To reproduce that "
        f"model, fill with {fill:g}."
    )
    return [_filled(trace, detail, -math.inf)]


def _value_other(trace: Trace) -> list[Candidate]:
    fill = _fixture_fill(trace)
    if not math.isfinite(fill) or _hidden(trace) is None:
        return []
    return [
        _filled(
            trace,
            f"Your {{stage}} is what attn gets with the hidden places filled with {s:g} where "
            f"the fixture's mask_value is {fill:g}. Fix: masked_fill(~allowed, {fill:g}).",
            s,
        )
        for s in SENTINELS
        if s != fill
    ]


FINITE = Mistake(
    "mask_finite_sentinel", "a finite mask sentinel where -inf is meant", _finite_sentinel, 225
)
ZERO = Mistake("mask_zero_fill", "hidden places set to 0 (scores * mask)", _zero_fill, 226)
ADDED = Mistake(
    "mask_sentinel_added", "mask sentinel added to the scores instead of filling", _added, 227
)
for _hider in HIDERS:
    register(_hider, FINITE, ZERO, ADDED)
register(
    "mask_value",
    Mistake(
        "mask_value_ignored",
        "-inf where the fixture's finite mask_value is meant",
        _value_ignored,
        228,
    ),
    Mistake(
        "mask_value_other", "another finite mask sentinel than the fixture's", _value_other, 229
    ),
)

register_zh(
    {
        "mask_finite_sentinel": (
            "该用 −inf 的地方用了有限的哨兵值",
            "用 −1e9、−1e4 或 finfo.min 填充被遮蔽的位置：只要一行还有远高于它的分数，结果相同；但"
            "整行被遮蔽时权重变成均匀分布，分数接近哨兵值时还会漏权重。修正：填 float('-inf')，空"
            "行给 0。",
        ),
        "mask_zero_fill": (
            "被遮蔽的位置设成了 0（scores * mask）",
            "用 0/1 遮蔽去乘分数，或 masked_fill 填 0：exp(0) = 1 并不小，被遮蔽的键仍有权重。修正"
            "：masked_fill(~allowed, float('-inf'))。",
        ),
        "mask_sentinel_added": (
            "哨兵值被加到分数上而不是填充",
            "像 BERT 的扩展注意力遮蔽那样 scores + (1 − mask) * 哨兵值：被遮蔽的分数保留了自己的值"
            "，整行被遮蔽时得到的是分数本身的权重。修正：masked_fill(~allowed, 哨兵值)。",
        ),
        "mask_value_ignored": (
            "fixture 的 mask_value 是有限值，却用了 −inf",
            "模型的代码用有限哨兵值（如 fp16 的 −1e4）填充，它会把权重漏给分数接近它的被遮蔽键，并"
            "让整行被遮蔽的查询得到均匀权重。修正：要复现该模型，就填 mask_value。",
        ),
        "mask_value_other": (
            "用了另一个有限哨兵值",
            "被遮蔽位置填的数与 fixture 的 mask_value 不同。修正：填 fixture 的 mask_value。",
        ),
    }
)
