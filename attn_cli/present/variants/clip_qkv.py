"""OLMo's clip_qkv (Q, K and V clamped to [-c, c] after the projections), what present/ says
about it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import Lang, en_zh, label
from attn_cli.present.text import short_number
from attn_cli.present.variant_texts import VariantTexts

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.present.explain_registry import Context, Parts


def _explain_clip(c: Context) -> Parts:
    """The explanation of Q_clip and K_clip (OLMo's clip_qkv)."""
    src = c.name.removesuffix("_clip")
    bound = short_number(TEXTS.setting(c.trace.inputs) or 0.0, c.precision)
    formula = (f"{c.name} = clamp({src}, −{bound}, {bound})",)
    meaning = [
        en_zh(
            c,
            f"clip_qkv: every entry of {src} above {bound} becomes {bound}, every entry below "
            f"−{bound} becomes −{bound}; the rest pass unchanged. OLMo clamps Q, K and V this way "
            "right after the projections, before RoPE, so that no single large activation blows "
            "up the dot products during training. V is clamped too: the trace's V is already "
            "the clamped one.",
            f"截断：{src} 中大于 {bound} 的元素变成 {bound}，小于 −{bound} 的变成 −{bound}，"
            "其余不变。OLMo 在投影之后、RoPE 之前就这样截断 Q、K 和 V，避免训练中个别很大的"
            "激活让点积失控。V 也被截断：这里显示的 V 已经是截断后的。",
        )
    ]
    return formula, (c.shape_of(src),), meaning


class ClipQkvTexts(VariantTexts):
    name = "clip_qkv"
    order = 5
    before_positions = True
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "conv_clip_qkv": (
                "clip_qkv {c}: Q, K and V clamped to [−{c}, {c}] after the projections (OLMo)"
            ),
        },
        "zh": {
            "conv_clip_qkv": "截断 {c}：投影之后把 Q、K 和 V 截断到 [−{c}, {c}]（OLMo）",
        },
    }
    grad_note: ClassVar[dict[Lang, str]] = {
        "en": "clamp(x, −c, c) passes the gradient where |x| ≤ c and stops it elsewhere.",
        "zh": "clamp(x, −c, c) 在 |x| ≤ c 处让梯度原样通过，其余位置梯度为 0。",
    }
    explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {
        "Q_clip": _explain_clip,
        "K_clip": _explain_clip,
    }
    formula_zh: ClassVar[tuple[tuple[str, str], ...]] = (
        (r", clamped to \[(.*)\] \(clip_qkv\)$", r"，截断到 [\1]（OLMo）"),
    )

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        return [label(lang, "conv_clip_qkv", c=f"{value:g}")]


TEXTS = ClipQkvTexts()
