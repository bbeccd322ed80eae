"""The mistakes of OLMo's clip_qkv (Q, K and V clamped to [-c, c] after the projections): the
clamp left out, or left out on Q and K only (V's is what the output shows)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attn_cli.check.mistake import Mistake, register, register_zh
from attn_cli.check.recompute import Change, internal, recomputed

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _bound(trace: Trace) -> float | None:
    value: float | None = trace.inputs.setting("clip_qkv")
    return value


def _left_out(trace: Trace) -> list[Change]:
    c = _bound(trace)
    if c is None:
        return []
    detail = (
        f"Your {{stage}} is what attn gets with clip_qkv left out: Q and K go on as the "
        f"projections leave them, where OLMo clamps them (and V) to [-{c:g}, {c:g}] right after "
        f"the projections, before RoPE. Fix: q = q.clamp(-{c:g}, {c:g}), the same for k and v."
    )
    values = {"Q_clip": internal(trace, "Q"), "K_clip": internal(trace, "K")}
    return [Change(detail, "Q_clip", values)]


register(
    "clip_qkv",
    Mistake("clip_qkv_left_out", "clip_qkv left out", recomputed(_left_out), 205),
)

register_zh(
    {
        "clip_qkv_left_out": (
            "漏掉了 Q、K、V 的截断",
            "Q 和 K 没有截断就往下算了；OLMo 在投影之后、RoPE 之前把 Q、K、V 截断到 [−c, c]。"
            "修正：q = q.clamp(-c, c)，k、v 同样。",
        ),
    }
)
