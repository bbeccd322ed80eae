"""Gated attention (Qwen3-Next): each head's output times σ(X·W_G), what present/ says about it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import Lang, en_zh, label
from attn_cli.present.variant_texts import VariantTexts

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.present.explain_registry import Context, Parts


def _explain_gate(c: Context) -> Parts:
    """The explanation of gate: the gate's logits, projected from X as Q is."""
    gate = TEXTS.setting(c.trace.inputs)
    assert gate is not None
    bias = " + b_G" if gate.b_G is not None else ""
    formula = (f"gate = X·W_G{bias}", en_zh(c, "split into heads as Q is", "像 Q 一样按头拆分"))
    meaning = [en_zh(
        c,
        "The gate's logits: a second projection of the same tokens, one number for every "
        "dimension of every head's output. In Qwen3-Next q_proj makes them beside the query, "
        "each head's query rows followed by its gate rows; here W_G is a weight of its own.",
        "门的 logit：对同样的词元做第二个投影，为每个头输出的每一维各给出一个数。Qwen3-Next "
        "在 q_proj 里把它们和查询放在一起，每个头先是查询的行、再是门的行；这里 W_G 是单独的"
        "权重。",
    )]  # fmt: skip
    from attn_cli.present.explain_registry import shape_text

    weight = shape_text("W_G", ("d_model", "heads*d_v"), gate.W_G.shape, c.lang)
    return formula, (c.shape_of("X"), weight), meaning


def _explain_gated(c: Context) -> Parts:
    """The explanation of gated: the output times the sigmoid of the gate, per dimension."""
    formula = ("gated = output ⊙ σ(gate)", "σ(x) = 1 / (1 + e^(−x))")
    meaning = [en_zh(
        c,
        "Each number of each head's output is multiplied by σ(gate) of the same token, head and "
        "dimension, a weight between 0 and 1: a head can switch itself off for a token, even "
        "where its softmax had to put all of its weight somewhere (an attention sink). The gate "
        "acts before the heads are joined and W_O projects them, as Qwen3-Next does; a large "
        "gate logit leaves the output as it was.",
        "每个头输出的每个数都乘以同一词元、同一头、同一维的 σ(gate)，一个 0 到 1 之间的权重："
        "一个头可以对某个词元把自己关掉，即使它的 softmax 必须把全部权重放在某处（注意力汇聚）。"
        "门在各头拼接、W_O 投影之前起作用，和 Qwen3-Next 一样；门的 logit 很大时输出保持不变。",
    )]  # fmt: skip
    return formula, (c.shape_of("output"), c.shape_of("gate")), meaning


class GateTexts(VariantTexts):
    name = "gate"
    order = 70
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "conv_gate": "gate: each head's output times σ(X·W_G{bias}), before W_O (Qwen3-Next)",
        },
        "zh": {
            "conv_gate": "门控：每个头的输出乘以 σ(X·W_G{bias})，在 W_O 之前（Qwen3-Next）",
        },
    }
    explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {
        "gate": _explain_gate,
        "gated": _explain_gated,
    }
    math_names = ("gate", "gated")
    formula_zh: ClassVar[tuple[tuple[str, str], ...]] = (
        (r", each head gated$", "，每个头都经过门控"),
    )

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        bias = " + b_G" if value.b_G is not None else ""
        return [label(lang, "conv_gate", bias=bias)]


TEXTS = GateTexts()
