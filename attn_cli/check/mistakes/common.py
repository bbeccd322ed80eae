"""The mistakes of plain attention, whatever the variants: the scale, the softmax's axis and
overflow, Q and K swapped or K not transposed, the heads split or grouped the wrong way, the
weights used transposed, a stage saved under another's name. Axis names as in core/steps.py."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from attn_cli.check.mistake import PLAIN, Mistake, register, register_zh
from attn_cli.check.recompute import (
    Candidate,
    Change,
    Weights,
    candidate,
    downstream,
    extra_logit,
    internal,
    recomputed,
    softmax_and_lse,
)
from attn_cli.core.chain import Chain
from attn_cli.core.heads import merge_heads
from attn_cli.core.inputs import FloatArray
from attn_cli.core.stages import softmax_input
from attn_cli.core.steps import repeat_kv

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def softmax_unguarded(x: FloatArray) -> FloatArray:
    """Softmax as written before torch 2.5: a row of -inf gives nan."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out: FloatArray = e / e.sum(axis=-1, keepdims=True)
    return out


def interleave_heads(x: FloatArray, n: int) -> FloatArray:
    """The mistaken split: head h takes columns h, h+n, h+2n, … of the flat features."""
    B, T, width = x.shape
    heads: FloatArray = x.reshape(B, T, width // n, n).transpose(0, 3, 1, 2)  # (B, n, T, d)
    return heads


def merge_interleaved(x: FloatArray) -> FloatArray:
    """The inverse of ``interleave_heads``: (B, n, T, d) -> (B, T, d*n)."""
    B, n, T, d = x.shape
    flat: FloatArray = x.transpose(0, 2, 3, 1).reshape(B, T, d * n)  # (B, T, d*n)
    return flat


def _both_softmaxes(
    trace: Trace, start: str, values: dict[str, FloatArray], detail: str
) -> list[Candidate]:
    """A mistake followed by a correct softmax, or by the user's where it gives nan rows."""
    return [candidate(trace, detail, start, values)]


def _weights_input(trace: Trace) -> FloatArray:
    return internal(trace, softmax_input(trace.inputs))


# ---------------------------------------------------------------------------------------------
# The scale


def _no_scaling(trace: Trace) -> list[Candidate]:
    if trace.scale == 1:
        return []
    which = "1/√d_k" if trace.scale_source == "default" else "the fixture's scale"
    detail = (
        f"Your {{stage}} is what attn gets when the scores are never multiplied by {which} "
        f"= {trace.scale:.6g}. Fix: scaled = scores * {which}."
    )
    return _both_softmaxes(trace, "scaled", {"scaled": internal(trace, "scores")}, detail)


def _scaled_by_d_k(trace: Trace) -> list[Candidate]:
    d_k = trace.inputs.d_k
    if trace.scale_source != "default" or d_k == 1:
        return []
    detail = (
        f"Your {{stage}} is what attn gets when the scores are divided by d_k = {d_k} instead "
        f"of √d_k = {math.sqrt(d_k):.6g}. Fix: divide by math.sqrt(d_k)."
    )
    scaled = internal(trace, "scores") / d_k
    return _both_softmaxes(trace, "scaled", {"scaled": scaled}, detail)


def _scaled_by_d_model(trace: Trace) -> list[Change]:
    inp = trace.inputs
    # the model's width: X's, or without X the flat width of Q, heads·d_k
    what, width = ("d_model", inp.d_model) if inp.d_model else ("heads·d_k", inp.heads * inp.d_k)
    if trace.scale_source != "default" or width == inp.d_k:
        return []
    detail = (
        f"Your {{stage}} is what attn gets when the scores are multiplied by 1/√{what} = "
        f"1/√{width} instead of 1/√d_k = 1/√{inp.d_k}: d_k is the width of one head, not of "
        f"the model. Fix: scale = 1 / math.sqrt(d_k) = {1 / math.sqrt(inp.d_k):.6g}."
    )
    scaled = internal(trace, "scores") / math.sqrt(width)
    return [Change(detail, "scaled", {"scaled": scaled})]


# ---------------------------------------------------------------------------------------------
# The softmax


def _softmax_wrong_axis(trace: Trace) -> list[Candidate]:
    x = _weights_input(trace).swapaxes(-1, -2)  # (B, H, S, T): softmax now runs over queries
    detail = (
        "Your {stage} is what attn gets with the softmax taken over the queries (axis -2) "
        "instead of the keys (axis -1): each column of the weights sums to 1, not each row. "
        "Fix: softmax(x, axis=-1)."
    )
    extra = extra_logit(trace.inputs)
    kinds: list[Weights] = [lambda y: softmax_and_lse(y, extra)[0]]
    kinds += [softmax_unguarded] if extra is None else []
    return [
        Candidate(detail, downstream(trace, "softmax", {"softmax": f(x).swapaxes(-1, -2)}))
        for f in kinds
    ]


def _no_max_subtraction(trace: Trace) -> list[Candidate]:
    x = _weights_input(trace)
    extra = extra_logit(trace.inputs)  # (1, H, 1, 1) or None
    out = []
    for dtype, limit in ((np.float64, 709.78), (np.float32, 88.72)):
        e = np.exp(x.astype(dtype))  # no row maximum subtracted: exp overflows to inf
        if not np.isposinf(e).any():
            continue  # no overflow in this precision: the mistake changes nothing visible
        total = e.sum(axis=-1, keepdims=True)  # (B, H, T, 1)
        if extra is not None:
            total = total + np.exp(extra.astype(dtype))
        weights = (e / total).astype(np.float64)
        detail = (
            f"Your {{stage}} is what attn gets from exp(x) / sum(exp(x)) in {np.dtype(dtype)} "
            f"without subtracting the row maximum first: exp(x) overflows to inf for x > {limit} "
            "and inf/inf is nan. Fix: exp(x - x.max(axis=-1, keepdims=True))."
        )
        out.append(Candidate(detail, downstream(trace, "softmax", {"softmax": weights})))
    return out


def _empty_row_nan(trace: Trace) -> list[Candidate]:
    if not trace.empty_rows or Chain(trace.inputs).extra:
        return []  # with an extra logit (a sink), an empty row gives its mass to it, never nan
    weights = softmax_unguarded(_weights_input(trace))
    detail = (
        "Your {stage} is what attn gets when a query row that may attend to no key gets nan "
        "(softmax of all -inf) instead of all-zero weights, as torch SDPA gives since 2.5. "
        "Fix: set such rows to 0."
    )
    return [Candidate(detail, downstream(trace, "softmax", {"softmax": weights}))]


# ---------------------------------------------------------------------------------------------
# Q, K and the heads


def _scores_transposed(trace: Trace) -> list[Candidate]:
    scores = internal(trace, "scores").swapaxes(-1, -2)  # (B, H, S, T): K·Qᵀ
    detail = (
        "Your {stage} is what attn gets from K·Qᵀ instead of Q·Kᵀ (Q and K swapped): the "
        "scores are transposed, keys on the rows. Fix: scores = Q @ K.swapaxes(-1, -2)."
    )
    if trace.inputs.seq_q != trace.inputs.seq_k:
        only = {"scores": scores, "scaled": scores * trace.scale}
        return [Candidate(detail, only)]
    return _both_softmaxes(trace, "scores", {"scores": scores}, detail)


def _k_not_transposed(trace: Trace) -> list[Candidate]:
    inp = trace.inputs
    chain = Chain(inp)
    if inp.seq_k != trace[chain.query_key("K")].shape[-1]:
        return []  # Q·K only runs at all when seq_k = d_k (d_k/2 for differential attention)
    k = repeat_kv(internal(trace, chain.query_key("K")), inp.heads // inp.kv_heads)  # (B, H, S, D)
    scores = internal(trace, chain.query_key("Q")) @ k  # (B, H, T, D) @ (B, H, S=D, D)
    detail = (
        f"Your {{stage}} is what attn gets from Q·K instead of Q·Kᵀ (K not transposed; it only "
        f"runs because seq_k = d_k = {inp.d_k}). Fix: scores = Q @ K.swapaxes(-1, -2)."
    )
    return _both_softmaxes(trace, "scores", {"scores": scores}, detail)


def _heads_interleaved(trace: Trace) -> list[Candidate]:
    inp = trace.inputs
    if inp.heads == 1 and inp.kv_heads == 1:
        return []
    q = interleave_heads(merge_heads(internal(trace, "Q")), inp.heads)
    k = interleave_heads(merge_heads(internal(trace, "K")), inp.kv_heads)
    v = interleave_heads(merge_heads(internal(trace, "V")), inp.kv_heads)
    d = inp.d_k
    detail = (
        f"Your {{stage}} is what attn gets when head h takes the columns h, h+{inp.heads}, "
        f"h+{2 * inp.heads}, … (reshape(B, T, d_k, heads)) instead of the block "
        f"h·{d}:(h+1)·{d} (reshape(B, T, heads, d_k)). Fix: "
        "x.reshape(B, T, heads, d_k).transpose(0, 2, 1, 3)."
    )
    values = {"Q": q, "K": k, "V": v}
    return [
        candidate(trace, detail, "Q", values, merge=merge)
        for merge in (merge_heads, merge_interleaved)
    ]


def _tile_kv(x: FloatArray, groups: int) -> FloatArray:
    """The mistaken expansion: query head h reads kv head h % Hkv ([0, 1, 0, 1])."""
    tiled: FloatArray = np.tile(x, (1, groups, 1, 1))  # (B, Hkv, S, D) -> (B, H, S, D)
    return tiled


def _gqa_tiled(trace: Trace) -> list[Change]:
    inp = trace.inputs
    groups = inp.heads // inp.kv_heads
    if groups == 1 or inp.kv_heads == 1:
        return []  # one kv head, or one query head per kv head: nothing to mix up
    tiled = [h % inp.kv_heads for h in range(inp.heads)]
    grouped = [h // groups for h in range(inp.heads)]
    detail = (
        f"Your {{stage}} is what attn gets when query head h reads kv head h % {inp.kv_heads} "
        f"({tiled}, torch .repeat or np.tile) instead of h // {groups} ({grouped}, "
        "repeat_interleave, as HF's repeat_kv): the query heads that share a kv head are "
        "neighbours. Fix: k.repeat_interleave(groups, dim=1), or np.repeat(k, groups, axis=1)."
    )
    return [Change(detail, "scores", expand=_tile_kv)]


def _x_w_transposed(trace: Trace) -> list[Change]:
    inp = trace.inputs
    if inp.mode != "projection" or inp.W_Q is None:  # direct, or Q, K, V made by MLA
        return []
    weights = {n: W for n in ("W_Q", "W_K", "W_V", "W_O") if (W := getattr(inp, n)) is not None}
    if any(weights[n].shape[0] != weights[n].shape[1] for n in ("W_Q", "W_K", "W_V")):
        return []  # X @ W.T of a weight that is not square does not even run
    square = [n for n, W in weights.items() if W.shape[0] == W.shape[1] and (W != W.T).any()]
    if not square:
        return []
    out = []
    for names in [square] + ([[name] for name in square] if len(square) > 1 else []):
        changed = replace(inp, **{name: getattr(inp, name).T for name in names})
        listed = ", ".join(names)
        detail = (
            f"Your {{stage}} is what attn gets with {listed} used transposed: X @ W.T, the "
            "nn.Linear habit (a torch Linear stores its weight as [out, in] and computes "
            "x @ weight.T). The fixture's weights are [in, out], as in the article: Q = X @ "
            "W_Q. It runs only because the weight is square. Fix: X @ W, or pass "
            "W.T as the Linear's weight."
        )
        start = "projected" if names == ["W_O"] else "Q"
        out.append(Change(detail, start, inputs=changed))
    return out


def _stage_mixup(trace: Trace) -> list[Candidate]:
    detail = (
        "Your {stage} equals attn's {other}: the array may be saved under the wrong name "
        "(a naming slip, or the two steps done in another order)."
    )
    return [
        Candidate(detail.replace("{other}", other), {name: internal(trace, other)})
        for name in trace.stages
        for other in trace.stages
        if other != name
    ]


register(
    PLAIN,
    Mistake("no_scaling", "no 1/√d_k scaling", _no_scaling, 10),
    Mistake("scaled_by_d_k", "scaled by d_k instead of √d_k", _scaled_by_d_k, 20),
    Mistake(
        "softmax_wrong_axis",
        "softmax over the wrong axis (columns sum to 1)",
        _softmax_wrong_axis,
        30,
    ),
    Mistake("scores_transposed", "Q and K swapped (scores transposed)", _scores_transposed, 40),
    Mistake("k_not_transposed", "K not transposed (Q·K instead of Q·Kᵀ)", _k_not_transposed, 50),
    Mistake(
        "heads_interleaved", "heads split interleaved instead of in blocks", _heads_interleaved, 80
    ),
    Mistake(
        "no_max_subtraction", "forgot the row-max subtraction (overflow)", _no_max_subtraction, 90
    ),
    Mistake("empty_row_nan", "a row with nothing to attend to gives nan", _empty_row_nan, 100),
    Mistake(
        "gqa_tiled",
        "GQA heads tiled [0,1,0,1] instead of grouped [0,0,1,1]",
        recomputed(_gqa_tiled),
        160,
    ),
    Mistake(
        "scaled_by_d_model",
        "scaled by 1/√d_model instead of 1/√d_k",
        recomputed(_scaled_by_d_model),
        180,
    ),
    Mistake(
        "x_w_transposed", "weights used transposed (X @ W.T)", recomputed(_x_w_transposed), 190
    ),
    Mistake("stage_mixup", "stage saved under another stage's name", _stage_mixup, 1000, True),
)

register_zh(
    {
        "no_scaling": (
            "没有乘 1/√d_k 缩放",
            "分数 Q·Kᵀ 没有乘以缩放因子就进入了 softmax，d_k 越大 softmax 越尖锐。修正：scaled = s"
            "cores * (1 / √d_k)（或 fixture 给定的 scale）。",
        ),
        "scaled_by_d_k": (
            "除以 d_k 而不是 √d_k",
            "分数除以了 d_k，而公式要求除以 √d_k。修正：除以 math.sqrt(d_k)。",
        ),
        "softmax_wrong_axis": (
            "softmax 的轴取错了（每列和为 1）",
            "softmax 沿查询轴（axis=-2）计算，应沿键轴（axis=-1），使每一行的权重和为 1。修正：sof"
            "tmax(x, axis=-1)。",
        ),
        "scores_transposed": (
            "Q 和 K 交换了（分数被转置）",
            "算成了 K·Qᵀ，得到的分数矩阵是转置的：行是键、列是查询。修正：scores = Q @ K.T。",
        ),
        "k_not_transposed": (
            "K 没有转置（Q·K 而不是 Q·Kᵀ）",
            "直接用 Q @ K，只有在形状恰好允许时才能运行，结果不是点积。修正：Q @ K.T（或 K.transpo"
            "se(-2, -1)）。",
        ),
        "heads_interleaved": (
            "多头按交错方式切分，而不是按块",
            "头 h 取了第 h、h+n、h+2n… 列，而不是连续的一块列。修正：x.view(B, T, heads, d_k).tran"
            "spose(1, 2)。",
        ),
        "no_max_subtraction": (
            "忘了减去每行最大值（溢出）",
            "直接算 exp(x)，大数溢出为 inf，inf/inf 得到 nan。修正：exp(x - x.max(axis=-1, keepdim"
            "s=True))。",
        ),
        "empty_row_nan": (
            "没有可关注键的行得到 nan",
            "一行全部被遮蔽时，softmax 对全 −∞ 得到 nan；torch SDPA 自 2.5 起给出全 0。修正：把这"
            "样的行设为 0。",
        ),
        "gqa_tiled": (
            "GQA 的头按平铺 [0,1,0,1] 而不是分组 [0,0,1,1]",
            "查询头 h 读了第 h % kv_heads 个 kv 头（repeat/tile），而共享一个 kv 头的查询头应该相"
            "邻。修正：k.repeat_interleave(groups, dim=1)（HF 的 repeat_kv）。",
        ),
        "scaled_by_d_model": (
            "按 1/√d_model 而不是 1/√d_k 缩放",
            "用了整个模型的宽度；d_k 是一个头的宽度。修正：scale = 1 / √d_k。",
        ),
        "x_w_transposed": (
            "权重被转置使用（X @ W.T）",
            "nn.Linear 的习惯：它把权重存成 [out, in] 再算 x @ W.T；fixture 的权重是 [in, out]。修"
            "正：X @ W，或把 W.T 作为 Linear 的权重。",
        ),
        "stage_mixup": (
            "把一个阶段存成了另一个阶段的名字",
            "你的这个数组等于 attn 的另一个阶段：可能存错了名字，或两步的顺序颠倒。修正：按阶段名"
            "逐一核对保存的数组。",
        ),
    }
)
