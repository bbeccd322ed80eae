"""The mistakes of grouped-query attention (``kv_heads`` < ``heads``) besides the heads tiled
(common.py's ``gqa_tiled``): only K, or only V, tiled while the other is grouped; every query
head given kv head 0 (multi-query where grouped is meant); the flat [S, kv_heads*d] K and V
repeated feature by feature before the split into heads. Axis names as in core/steps.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attn_cli.check.mistake import PLAIN, Mistake, register, register_zh
from attn_cli.check.recompute import Change, internal, recomputed
from attn_cli.core.chain import Chain
from attn_cli.core.heads import merge_heads, split_heads
from attn_cli.core.inputs import FloatArray
from attn_cli.core.steps import attention_scores, weighted_sum

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace

GROUPED = "h // groups, repeat_interleave, HF's repeat_kv"


def _tiled(x: FloatArray, groups: int) -> FloatArray:
    """Query head h reads kv head h % Hkv: (B, Hkv, S, D) -> (B, H, S, D)."""
    tiled: FloatArray = np.tile(x, (1, groups, 1, 1))
    return tiled


def _groups(trace: Trace) -> int:
    """Query heads per kv head; 1 when there is nothing to group."""
    inp = trace.inputs
    return inp.heads // inp.kv_heads


def _one_tiled(trace: Trace) -> list[Change]:
    inp, g = trace.inputs, _groups(trace)
    if g == 1 or inp.kv_heads == 1:
        return []  # one kv head: tiled and grouped are the same
    q = internal(trace, Chain(inp).query_key("Q"))  # (B, H, T, D)
    k = internal(trace, Chain(inp).query_key("K"))  # (B, Hkv, S, D)
    scores = attention_scores(q, _tiled(k, g))  # (B, H, T, S)
    output = weighted_sum(internal(trace, "softmax"), _tiled(internal(trace, "V"), g))
    said = (
        "Your {{stage}} is what attn gets with {which} tiled (query head h reads kv head h % "
        f"{inp.kv_heads}: torch .repeat, np.tile) and {{other}} grouped ({GROUPED}): the two "
        "expansions disagree. Fix: expand K and V alike, k.repeat_interleave(groups, dim=1)."
    )
    return [
        Change(said.format(which="K", other="V"), "scores", {"scores": scores}),
        Change(said.format(which="V", other="K"), "output", {"output": output}),
    ]


def _single(trace: Trace) -> list[Change]:
    inp = trace.inputs
    if inp.kv_heads == 1:
        return []
    detail = (
        f"Your {{stage}} is what attn gets when every query head reads kv head 0: multi-query "
        f"attention (k[:, :1] broadcast) where the fixture groups {inp.heads} query heads over "
        f"{inp.kv_heads} kv heads. Fix: query head h reads kv head h // {_groups(trace)} "
        f"({GROUPED})."
    )

    def first(x: FloatArray, groups: int) -> FloatArray:
        return np.repeat(x[:, :1], inp.heads, axis=1)  # (B, H, S, D)

    return [Change(detail, "scores", expand=first)]


def _flat_repeat(trace: Trace) -> list[Change]:
    g = _groups(trace)
    if g == 1:
        return []
    detail = (
        f"Your {{stage}} is what attn gets with K and V repeated feature by feature before the "
        f"split into heads: repeat_interleave({g}, dim=-1) on the flat [seq, kv_heads*d], so a "
        "query head reads half of one kv head's features, each twice. Repeat whole heads, "
        f"after the split. Fix: k.view(B, S, kv_heads, d).repeat_interleave({g}, dim=2)."
    )

    def features(x: FloatArray, groups: int) -> FloatArray:
        flat = np.repeat(merge_heads(x), groups, axis=-1)  # (B, S, H*D)
        return split_heads(flat, x.shape[1] * groups)  # (B, H, S, D)

    return [Change(detail, "scores", expand=features)]


register(
    PLAIN,
    Mistake(
        "gqa_one_tiled", "GQA: K tiled and V grouped, or the reverse", recomputed(_one_tiled), 161
    ),
    Mistake(
        "gqa_single_kv_head", "GQA: every query head reads kv head 0", recomputed(_single), 162
    ),
    Mistake(
        "gqa_flat_repeat",
        "GQA: K and V repeated feature by feature before the split",
        recomputed(_flat_repeat),
        163,
    ),
)

register_zh(
    {
        "gqa_one_tiled": (
            "GQA 中 K 平铺而 V 分组，或反过来",
            "K 和 V 的扩展方式不一致。修正：K、V 都用 repeat_interleave(groups, dim=1)。",
        ),
        "gqa_single_kv_head": (
            "GQA 中每个查询头都读第 0 个 kv 头",
            "做成了多查询注意力（k[:, :1] 广播），而 fixture 把查询头分组到多个 kv 头。修正：查询"
            "头 h 读 kv 头 h // groups。",
        ),
        "gqa_flat_repeat": (
            "GQA 在切分成头之前按特征重复了 K、V",
            "对扁平的 [seq, kv_heads·d] 做 repeat_interleave(dim=−1)，每个查询头读到的是一个kv 头"
            "一半的特征、各两遍。修正：先切分成头，再按整头重复。",
        ),
    }
)
