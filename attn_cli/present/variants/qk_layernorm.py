"""q/k LayerNorm (StableLM 2 one per head, Phi one for all heads): a LayerNorm of each head of
Q and K before RoPE, what present/ says about it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.core.plugins.qk_layernorm import formula
from attn_cli.present.i18n import Lang, en_zh, label
from attn_cli.present.text import short_number
from attn_cli.present.variant_texts import VariantTexts

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.present.explain_registry import Context, Parts


def _explain_ln(c: Context) -> Parts:
    """The explanation of Q_ln and K_ln (a LayerNorm of each head, StableLM 2 and Phi)."""
    src = c.name.removesuffix("_ln")
    value = TEXTS.setting(c.trace.inputs)
    assert value is not None
    weight = value.params(src)[0]
    eps = short_number(value.eps, c.precision + 4)
    own = en_zh(
        c,
        "each head with its own weight" if weight.ndim == 2 else "one weight for every head",
        "每个头有自己的权重" if weight.ndim == 2 else "所有头共用一个权重",
    )
    lines = (
        formula(value, src),
        en_zh(
            c, f"over each head's d_k, {own}, eps = {eps}", f"在每个头的 d_k 上，{own}，eps = {eps}"
        ),
    )
    meaning = [
        en_zh(
            c,
            f"LayerNorm of each head of {src}: subtract the row's mean, divide by its standard "
            "deviation, then multiply by a learned weight. Unlike the RMSNorm of QK-norm, the "
            "mean is taken out first, so every head's query and key is centred and of about the "
            "same length before the rotation and the dot product; StableLM 2 learns a separate "
            "weight for each head.",
            f"{src} 每个头的 LayerNorm：减去这一行的均值，除以标准差，再乘以学到的权重。"
            "与 QK-norm 的 RMSNorm 不同，这里先减去均值，所以每个头的查询和键在旋转和点积"
            "之前都居中、长度也差不多；StableLM 2 为每个头学一个单独的权重。",
        )
    ]
    return lines, (c.shape_of(src),), meaning


class QkLayerNormTexts(VariantTexts):
    name = "qk_layernorm"
    order = 11
    before_positions = True
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "conv_qk_layernorm": (
                "q/k LayerNorm: a LayerNorm of each head of Q and K, {own}, eps {eps}, before "
                "RoPE (StableLM 2, Phi)"
            ),
            "conv_qk_ln_own": "one per head",
            "conv_qk_ln_shared": "one for every head",
        },
        "zh": {
            "conv_qk_layernorm": (
                "q/k LayerNorm：在 RoPE 之前对 Q 和 K 的每个头做 LayerNorm，{own}，eps {eps}"
                "（StableLM 2、Phi）"
            ),
            "conv_qk_ln_own": "每个头一个",
            "conv_qk_ln_shared": "所有头共用一个",
        },
    }
    grad_note: ClassVar[dict[Lang, str]] = {
        "en": "LayerNorm's backward: the gradient loses its mean and its part along x̂, over σ.",
        "zh": "LayerNorm 的反向：梯度减去均值和沿 x̂ 的分量，再除以 σ。",
    }
    explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {
        "Q_ln": _explain_ln,
        "K_ln": _explain_ln,
    }
    formula_zh: ClassVar[tuple[tuple[str, str], ...]] = (
        (r"over each head's d_k, its own weight per head", "在每个头的 d_k 上，每个头有自己的权重"),
        (r"over each head's d_k, one weight for every head", "在每个头的 d_k 上，所有头共用权重"),
    )

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        own = label(lang, "conv_qk_ln_own" if value.per_head("Q") else "conv_qk_ln_shared")
        return [label(lang, "conv_qk_layernorm", own=own, eps=f"{value.eps:g}")]


TEXTS = QkLayerNormTexts()
