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
    meaning = [
        en_zh(
            c,
            "The gate's logits: a second projection of the same tokens, one number for every "
            "dimension of every head's output. In Qwen3-Next q_proj makes them beside the query, "
            "each head's query rows followed by its gate rows; here W_G is a weight of its own.",
            "门的 logit：对同样的词元做第二个投影，为每个头输出的每一维各给出一个数。Qwen3-Next "
            "在 q_proj 里把它们和查询放在一起，每个头先是查询的行、再是门的行；这里 W_G 是单独的"
            "权重。",
        )
    ]
    from attn_cli.present.explain_registry import shape_text

    weight = shape_text("W_G", ("d_model", "heads*d_v"), gate.W_G.shape, c.lang)
    return formula, (c.shape_of("X"), weight), meaning


def _explain_gated(c: Context) -> Parts:
    """The explanation of gated: the output times the sigmoid of the gate, per dimension."""
    formula = ("gated = output ⊙ σ(gate)", "σ(x) = 1 / (1 + e^(−x))")
    meaning = [
        en_zh(
            c,
            "Each number of each head's output is multiplied by "
            "σ(gate) of the same token, head and "
            "dimension, a weight between 0 and 1: a head can switch itself off for a token, even "
            "where its softmax had to put all of its weight "
            "somewhere (an attention sink). The gate "
            "acts before the heads are joined and W_O projects them, as Qwen3-Next does; a large "
            "gate logit leaves the output as it was.",
            "每个头输出的每个数都乘以同一词元、同一头、同一维的 σ(gate)，一个 0 到 1 之间的权重："
            "一个头可以对某个词元把自己关掉，即使它的 softmax "
            "必须把全部权重放在某处（注意力汇聚）。"
            "门在各头拼接、W_O 投影之前起作用，和 Qwen3-Next 一样；门的 logit 很大时输出保持不变。",
        )
    ]
    return formula, (c.shape_of("output"), c.shape_of("gate")), meaning


def _explain_d_gated(c: Context) -> Parts:
    """d_gated: the upstream gradient, or d_concat cut into heads."""
    from attn_cli.present.explain_backward import explain_upstream, gradient_meaning, shaped

    if c.trace.inputs.W_O is None:
        return explain_upstream(c)
    meaning = [
        gradient_meaning(c),
        en_zh(
            c,
            "concat joined the gated heads, so head h's gradient is d_concat's columns h·d_v to "
            "(h+1)·d_v.",
            "concat 拼接的是门控后的各头，所以第 h 个头的梯度就是 d_concat 的"
            "第 h·d_v 到 (h+1)·d_v 列。",
        ),
    ]
    return (c.trace[c.name].formula,), (shaped(c, "d_concat"),), meaning


def _explain_d_gate(c: Context) -> Parts:
    """d_gate: the product rule, then the sigmoid's slope σ(1 − σ)."""
    from attn_cli.present.explain_backward import gradient_meaning, shaped

    meaning = [
        gradient_meaning(c),
        en_zh(
            c,
            "gated = output ⊙ σ(gate), one number at a time: its gradient in the gate is "
            "d_gated ⊙ output times the sigmoid's slope σ(1 − σ), at most 1/4 (at gate = 0) and "
            "near 0 for a gate far from 0, so a gate that is fully open or shut barely learns.",
            "gated = output ⊙ σ(gate)，逐个数相乘：对 gate 的梯度是 d_gated ⊙ output 乘以 sigmoid "
            "的斜率 σ(1 − σ)，最大为 1/4（gate = 0 时），gate "
            "远离 0 时接近 0，所以完全打开或关上的门"
            "几乎学不动。",
        ),
    ]
    inputs = (shaped(c, "d_gated"), shaped(c, "output"), shaped(c, "gate"))
    return (c.trace[c.name].formula,), inputs, meaning


def _explain_d_gate_weights(c: Context) -> Parts:
    """d_W_G, d_b_G: as any projection's, from d_gate with the heads joined."""
    from attn_cli.present.explain_backward import gradient_meaning, shaped

    meaning = [
        gradient_meaning(c),
        en_zh(
            c,
            "gate = X·W_G + b_G is a projection like Q's: W_G's gradient is Xᵀ times d_gate (the "
            "heads side by side, as W_G's columns are), b_G's the sum of d_gate over the tokens. "
            "d_gate·W_Gᵀ is one more path into d_X.",
            "gate = X·W_G + b_G 和 Q 一样是一个投影：W_G 的梯度是 Xᵀ 乘以 d_gate（各头并排，与 W_G "
            "的列一致），b_G 的梯度是 d_gate 沿词元求和。d_gate·W_Gᵀ 是流向 d_X 的又一条路径。",
        ),
    ]
    inputs = (shaped(c, "X"), shaped(c, "d_gate")) if c.name == "d_W_G" else (shaped(c, "d_gate"),)
    return (c.trace[c.name].formula,), inputs, meaning


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
        "d_gated": _explain_d_gated,
        "d_gate": _explain_d_gate,
        "d_W_G": _explain_d_gate_weights,
        "d_b_G": _explain_d_gate_weights,
    }
    math_names = ("gate", "gated", "d_gate", "d_gated")
    grad_note: ClassVar[dict[Lang, str]] = {}
    # attn decode: the new token's gate, and its output gated, after softmax·V_cache
    view_notes: ClassVar[dict[str, dict[str, dict[Lang, tuple[str, str]]]]] = {
        "decode": {
            "gate": {
                "en": (
                    "gate = x·W_G (+ b_G) of the new token, one row per head",
                    "The gate is projected from the new token's own input row, as its query "
                    "is: nothing of it is cached, and earlier tokens' gates are never needed "
                    "again.",
                ),
                "zh": (
                    "gate = 新词的 x·W_G（+ b_G），每个头一行",
                    "门控和查询一样由新词自己的输入行投影得到：不需要缓存，"
                    "之前各词的门控以后也用不到。",
                ),
            },
            "gated": {
                "en": (
                    "gated = output ⊙ σ(gate)",
                    "Each head's output of this step, squeezed dimension by dimension by the "
                    "sigmoid of its gate, before the heads are joined and W_O projects them "
                    "(transformers' Qwen3NextAttention). It must equal the row of gated in "
                    "the full computation.",
                ),
                "zh": (
                    "gated = output ⊙ σ(gate)",
                    "这一步每个头的输出逐维乘以其门控的 sigmoid，然后各头拼接、由 W_O 投影"
                    "（transformers 的 Qwen3NextAttention）。它必须等于完整计算中 gated "
                    "的那一行。",
                ),
            },
        },
    }
    view_inputs: ClassVar[dict[str, dict[str, tuple[str, ...]]]] = {
        "decode": {"gate": ("X", "W_G"), "gated": ("output", "gate")},
    }
    formula_zh: ClassVar[tuple[tuple[str, str], ...]] = (
        (r", each head gated$", "，每个头都经过门控"),
    )

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        bias = " + b_G" if value.b_G is not None else ""
        return [label(lang, "conv_gate", bias=bias)]


TEXTS = GateTexts()
