"""Attention sinks (gpt-oss): a learned logit per head, what present/ says about it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from attn_cli.present.i18n import Lang, en_zh, label
from attn_cli.present.text import short_number
from attn_cli.present.variant_texts import VariantTexts

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.present.explain_registry import Context, Parts


def _sink_meaning(c: Context) -> list[str]:
    """With sinks: where the rest of each row's mass went, with the trace's numbers."""
    sinks = TEXTS.setting(c.trace.inputs)
    if sinks is None:
        return []
    kept = c.trace["softmax"].data.sum(axis=-1)  # (..., H, T): each row's kept mass
    dropped = 1.0 - kept
    low, high = (short_number(float(f(dropped)), c.precision) for f in (np.min, np.max))
    return [
        en_zh(
            c,
            "Sinks (gpt-oss): each head's learned logit sink joins every row for the softmax and "
            "is dropped after it, so a row's weights sum to 1 − d_i, where d_i = "
            f"e^(sink − m_i) / (Σ_k e^(x_k − m_i) + e^(sink − m_i)) is the mass the sink took. "
            f"Here d_i runs from {low} to {high}. That mass reaches no value: a query can "
            "attend to nothing much without being forced onto some key.",
            "sinks（gpt-oss）：每个头学到的 logit sink 加入每一行参与 softmax，之后被丢掉，"
            "所以每一行的权重之和是 1 − d_i，其中 d_i = "
            "e^(sink − m_i) / (Σ_k e^(x_k − m_i) + e^(sink − m_i)) 是 sink 拿走的份额。"
            f"这里 d_i 介于 {low} 和 {high} 之间。这部分份额不落到任何值上："
            "查询可以几乎什么都不看，而不必被迫集中到某个键上。",
        )
    ]


def _explain_sinks(c: Context) -> Parts:
    """d_sinks: the sink takes weight p_sink from every row."""
    from attn_cli.present.explain_backward import gradient_meaning, shaped

    meaning = [
        gradient_meaning(c),
        en_zh(
            c,
            "A sink is one more logit in every row of its head, dropped after the softmax: "
            "raising it takes weight from every key in proportion, which moves L by −p_sink × "
            "Delta per row (p_sink = 1 − the row's kept weights). The rows of dS then sum to "
            "p_sink × Delta, not 0.",
            "sink 是每个头每一行多出的一个对数几率，softmax 之后被丢掉：它变大，就按比例从每个键"
            "那里拿走权重，每一行让 L 改变 −p_sink × Delta（p_sink = 1 − 该行保留的权重之和）。"
            "因此 dS 的每一行之和是 p_sink × Delta，而不是 0。",
        ),
    ]
    return (
        (c.trace[c.name].formula,),
        (shaped(c, "softmax"), shaped(c, "delta")),
        meaning,
    )


# What the decode view's softmax note says of sinks, on or off: lang -> sentence
_DECODE_SOFTMAX: dict[Lang, str] = {
    "en": " With sinks (gpt-oss) each head's sink joins the sum and is dropped, so the row sums "
    "to less than 1.",
    "zh": "有 sink（gpt-oss）时，每个头的 sink 加入求和后被去掉，所以这一行的和小于 1。",
}


class SinksTexts(VariantTexts):
    name = "sinks"
    order = 60
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "conv_sinks": (
                "sinks: one learned logit per head joins each softmax row "
                "and is dropped (gpt-oss): rows sum to less than 1"
            ),
        },
        "zh": {
            "conv_sinks": (
                "sinks：每个头一个学到的 logit，加入每行 softmax 后丢弃（gpt-oss）：每行之和小于 1"
            ),
        },
    }

    explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {"d_sinks": _explain_sinks}
    view_asides: ClassVar[dict[str, dict[str, dict[Lang, str]]]] = {
        "decode": {"softmax": _DECODE_SOFTMAX},
    }

    def notes(self, stage: str, c: Any) -> list[str]:
        return _sink_meaning(c) if stage == "softmax" else []

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        return [label(lang, "conv_sinks")]

    def extra_logit(self, inp: Inputs, head: int) -> float | None:
        return float(self.setting(inp)[head])


TEXTS = SinksTexts()
