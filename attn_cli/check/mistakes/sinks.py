"""The mistakes of attention sinks (gpt-oss: one logit per head joined to every softmax row and
dropped after it): the sinks left out; the sink scaled with the scores; the row maximum taken
without the sink and the sink then not shifted by it; exp left off the sink; a query head given
the sink of its kv head's number. Axis names as in core/steps.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attn_cli.check.mistake import Mistake, register, register_zh
from attn_cli.check.recompute import Change, internal, recomputed, softmax_and_lse
from attn_cli.core.inputs import FloatArray
from attn_cli.core.stages import softmax_input
from attn_cli.core.steps import softmax

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _sinks_left_out(trace: Trace) -> list[Change]:
    if trace.inputs.setting("sinks") is None:
        return []
    detail = (
        "Your {stage} is what attn gets when the sinks are left out of the softmax: each row "
        "sums to 1. gpt-oss joins one learned logit per head to every row, takes the softmax, "
        "and drops that column, so a row sums to less than 1. Fix: softmax over "
        "[scores, sink], then drop the sink's column."
    )
    start = softmax_input(trace.inputs)
    return [Change(detail, "softmax", {"softmax": softmax(internal(trace, start))})]


def _logits(trace: Trace) -> tuple[FloatArray, FloatArray] | None:
    """The softmax's input (B, H, T, S) and the sinks (1, H, 1, 1); None without sinks."""
    sinks = trace.inputs.setting("sinks")
    if sinks is None:
        return None
    return internal(trace, softmax_input(trace.inputs)), sinks.reshape(1, -1, 1, 1)


def _weights(trace: Trace, detail: str, extra: FloatArray) -> Change:
    x = internal(trace, softmax_input(trace.inputs))  # (B, H, T, S)
    return Change(detail, "softmax", {"softmax": softmax_and_lse(x, extra)[0]})


def _sinks_scaled(trace: Trace) -> list[Change]:
    found = _logits(trace)
    if found is None or trace.scale == 1:
        return []
    detail = (
        f"Your {{stage}} is what attn gets with the sinks multiplied by the scale "
        f"{trace.scale:.6g} along with the scores: the sink joined to the raw scores before "
        "scaling. gpt-oss joins the sink to the scaled (and masked) scores, as it is. Fix: "
        "concatenate the sink after scaling."
    )
    return [_weights(trace, detail, found[1] * trace.scale)]


def _sinks_by_kv_head(trace: Trace) -> list[Change]:
    found = _logits(trace)
    inp = trace.inputs
    if found is None or inp.kv_heads == inp.heads:
        return []
    groups = inp.heads // inp.kv_heads
    taken = [h // groups for h in range(inp.heads)]
    detail = (
        f"Your {{stage}} is what attn gets when query head h takes sinks[h // {groups}] "
        f"(heads {taken}): the sink indexed by the kv head. gpt-oss has one sink per query head "
        "(sinks of length num_attention_heads). Fix: sinks[h] for query head h."
    )
    sinks = found[1][:, taken]  # (1, H, 1, 1)
    return [_weights(trace, detail, sinks)]


def _by_hand(trace: Trace, exponentiated: bool) -> FloatArray | None:
    """A softmax with the sinks written by hand: the row maximum of the scores alone, and
    exp(sink - max) (``exponentiated``) or the sink itself added to the sum."""
    found = _logits(trace)
    if found is None:
        return None
    x, s = found
    top = x.max(axis=-1, keepdims=True)  # (B, H, T, 1): the sink left out of the maximum
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(x - top)
    total = e.sum(axis=-1, keepdims=True) + (np.exp(s) if exponentiated else s)
    weights: FloatArray = e / total
    return weights


def _sinks_unshifted(trace: Trace) -> list[Change]:
    weights = _by_hand(trace, exponentiated=True)
    if weights is None:
        return []
    detail = (
        "Your {stage} is what attn gets with exp(x - max) over the scores and exp(sink) joined "
        "to the sum without the same shift: the sink's term must be exp(sink - max) too, or "
        "the max taken over the scores and the sink together. Fix: m = max(row.max(), sink); "
        "w = exp(row - m) / (exp(row - m).sum() + exp(sink - m))."
    )
    return [Change(detail, "softmax", {"softmax": weights})]


def _sinks_not_exp(trace: Trace) -> list[Change]:
    weights = _by_hand(trace, exponentiated=False)
    if weights is None:
        return []
    detail = (
        "Your {stage} is what attn gets with the sink added to the softmax's sum as it is, not "
        "exponentiated: exp(x - max) / (sum + sink). The sink is a logit like the scores: its "
        "term is exp(sink - max). Fix: add exp(sink - max) to the sum."
    )
    return [Change(detail, "softmax", {"softmax": weights})]


register(
    "sinks",
    Mistake(
        "sinks_left_out",
        "sinks left out of the softmax (rows sum to 1)",
        recomputed(_sinks_left_out),
        200,
    ),
    Mistake("sinks_scaled", "sinks scaled with the scores", recomputed(_sinks_scaled), 201),
    Mistake("sinks_by_kv_head", "sink indexed by the kv head", recomputed(_sinks_by_kv_head), 202),
    Mistake(
        "sinks_unshifted", "sink not shifted by the row maximum", recomputed(_sinks_unshifted), 203
    ),
    Mistake("sinks_not_exp", "sink added to the sum without exp", recomputed(_sinks_not_exp), 204),
)

register_zh(
    {
        "sinks_left_out": (
            "softmax 漏掉了 sink（行和为 1）",
            "gpt-oss 给每个头一个可学习的 logit，拼到每一行上做 softmax 再丢掉那一列，所以行和小于"
            " 1。修正：对 [scores, sink] 做 softmax，再去掉 sink 列。",
        ),
        "sinks_scaled": (
            "sink 和分数一起被缩放了",
            "sink 在缩放之前拼了进去，也乘了 scale；gpt-oss 把它原样拼到缩放后的分数上。修正：缩放"
            "之后再拼接 sink。",
        ),
        "sinks_by_kv_head": (
            "sink 按 kv 头编号取了",
            "查询头 h 用了 sinks[h // groups]；gpt-oss 每个查询头一个 sink。修正：查询头 h 用 sink"
            "s[h]。",
        ),
        "sinks_unshifted": (
            "sink 没有减去行最大值",
            "分数用 exp(x − max)，sink 却用 exp(sink)，两者没有同样平移。修正：m = max(row.max(), "
            "sink)，w = exp(row − m) / (Σ exp(row − m) + exp(sink − m))。",
        ),
        "sinks_not_exp": (
            "sink 没有取指数就加进了分母",
            "分母写成 Σ exp(x − max) + sink；sink 和分数一样是 logit。修正：加 exp(sink − max)。",
        ),
    }
)
