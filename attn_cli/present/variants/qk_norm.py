"""QK-norm (Qwen3, OLMo 2): RMSNorm of Q and K before RoPE, what present/ says about it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import Lang, en_zh, label
from attn_cli.present.text import short_number
from attn_cli.present.variant_texts import VariantTexts

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.present.explain_registry import Context, Parts


def _explain_norm(c: Context) -> Parts:
    """The explanation of Q_norm and K_norm (RMSNorm, as Qwen3, Gemma 3 and OLMo 2)."""
    src = c.name.removesuffix("_norm")
    qk = TEXTS.setting(c.trace.inputs)
    assert qk is not None
    weight = qk.q_weight if src == "Q" else qk.k_weight
    per_head = weight.shape[0] == c.trace.inputs.d_k
    over = en_zh(
        c,
        "each head" if per_head else "the whole projection",
        "按每个头" if per_head else "对整个投影",
    )
    eps = short_number(qk.eps, c.precision + 4)
    formula = (
        f"{c.name} = {src} / √(mean({src}²) + eps) × {src.lower()}_weight",
        en_zh(c, f"over {over}, eps = {eps}", f"{over}，eps = {eps}"),
    )
    meaning = [
        en_zh(
            c,
            f"RMSNorm of {src}: each row is divided by its root mean square, then multiplied by a "
            "learned weight. Without it, the dot products can grow very large during training and "
            "the softmax saturates; with it, every query and key has about the same length before "
            "the rotation and the dot product.",
            f"{src} 的 RMSNorm：每一行除以它的均方根，再乘以学到的权重。没有这一步，"
            "训练中点积可能变得很大，softmax 就会饱和；有了它，每个查询和键在旋转和点积之前"
            "长度都差不多。",
        )
    ]
    return formula, (c.shape_of(src),), meaning


class QkNormTexts(VariantTexts):
    name = "qk_norm"
    order = 10
    before_positions = True
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "conv_qk_norm": (
                "QK-norm: RMSNorm of Q and K {over}, eps {eps}, before RoPE (Qwen3, OLMo 2)"
            ),
            "conv_qk_head": "per head",
            "conv_qk_whole": "over the whole projection",
        },
        "zh": {
            "conv_qk_norm": (
                "QK-norm：在 RoPE 之前对 Q 和 K 做 RMSNorm，{over}，eps {eps}（Qwen3、OLMo 2）"
            ),
            "conv_qk_head": "按每个头",
            "conv_qk_whole": "对整个投影",
        },
    }
    explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {
        "Q_norm": _explain_norm,
        "K_norm": _explain_norm,
    }

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        qk = value
        per_head = qk.q_weight.shape[0] == inp.d_k
        over = label(lang, "conv_qk_head" if per_head else "conv_qk_whole")
        return [label(lang, "conv_qk_norm", over=over, eps=f"{qk.eps:g}")]


TEXTS = QkNormTexts()
