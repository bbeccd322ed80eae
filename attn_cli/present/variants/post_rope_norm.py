"""The norm of each head of Q and K after RoPE (HunYuan's query/key_layernorm, Llama 4's L2
norm), what present/ says about it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import Lang, label
from attn_cli.present.variant_texts import VariantTexts, stage_explainer

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs

_EN = (
    "Each head's row is divided by its root mean square, √(mean(x²) + eps), after RoPE has "
    "rotated it, then multiplied by a learned weight (HunYuan's query_layernorm and "
    'key_layernorm); Llama 4\'s q/k "L2 norm" is the same RMS without a weight. Every query and '
    "key reaches the dot product with about the same length, so no score can grow without bound. "
    "The rotation does not change a row's length: what the order changes is where the weight "
    "acts, on the rotated dimensions rather than the original ones."
)
_ZH = (
    "每个头的一行在 RoPE 旋转之后除以它的均方根 √(mean(x²) + eps)，再乘以学到的权重"
    "（混元的 query_layernorm 和 key_layernorm）；Llama 4 的 q/k「L2 范数」是同样的均方根，"
    "但没有权重。这样每个查询和键进入点积时长度都差不多，分数不会无限增大。旋转不改变一行的"
    "长度：先后顺序改变的是权重作用在哪些维度上——旋转之后的维度，而不是原来的维度。"
)


class PostRopeNormTexts(VariantTexts):
    name = "post_rope_norm"
    order = 12
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "conv_post_rope_norm": (
                "norm after RoPE: RMSNorm of each head of Q and K, eps {eps}, {weight} "
                "(HunYuan; Llama 4's L2 norm has no weight)"
            ),
            "conv_post_weighted": "with learned weights",
            "conv_post_weightless": "without a weight",
        },
        "zh": {
            "conv_post_rope_norm": (
                "RoPE 之后的归一化：对 Q 和 K 的每个头做 RMSNorm，eps {eps}，{weight}"
                "（混元；Llama 4 的 L2 范数没有权重）"
            ),
            "conv_post_weighted": "带学到的权重",
            "conv_post_weightless": "没有权重",
        },
    }
    grad_note: ClassVar[dict[Lang, str]] = {
        "en": (
            "The norm divides each row by its root mean square, which depends on the whole "
            "row: besides w ∘ d / rms, every entry loses the part of the gradient along the "
            "row's own direction (the mean term). RoPE⁻¹ then turns this gradient back."
        ),
        "zh": (
            "归一化把每一行除以它的均方根，而均方根取决于整行：除了 w ∘ d / rms，每个数还要减去"
            "梯度在这一行自身方向上的分量（mean 那一项）。之后 RoPE⁻¹ 再把这个梯度转回去。"
        ),
    }
    explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {
        "Q_postnorm": stage_explainer(("Q_rot",), _EN, _ZH, fallback="Q"),
        "K_postnorm": stage_explainer(("K_rot",), _EN, _ZH, fallback="K"),
    }
    math_names = ("Q_postnorm", "K_postnorm", "d_Q_postnorm", "d_K_postnorm")
    formula_zh: ClassVar[tuple[tuple[str, str], ...]] = ((r"after RoPE, ", "在 RoPE 之后，"),)

    def grad_transform(self, stage: str, formula: str, lang: Lang) -> tuple[str, str] | None:
        upstream = f"d_{stage.removeprefix('d_')[:1]}_postnorm"
        if stage == upstream or upstream not in formula:
            return None
        return self.grad_note[lang], upstream

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        weight = label(
            lang, "conv_post_weighted" if value.q_weight is not None else "conv_post_weightless"
        )
        return [label(lang, "conv_post_rope_norm", eps=f"{value.eps:g}", weight=weight)]


TEXTS = PostRopeNormTexts()
