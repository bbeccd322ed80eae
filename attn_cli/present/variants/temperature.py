"""Attention temperature (Llama 4's attn_temperature_tuning, Ministral 3's
llama_4_scaling_beta), what present/ says about it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import Lang, label
from attn_cli.present.variant_texts import VariantTexts, stage_explainer

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs

_EN = (
    "Each query is multiplied by a temperature that grows with its position, 1 + attn_scale · "
    "ln(1 + ⌊(pos + offset) / floor_scale⌋): far queries get sharper attention on long contexts. "
    "Llama 4 does it on its layers without RoPE (offset 1), Ministral 3 after RoPE (offset 0, "
    "floor_scale = the original context length, attn_scale = beta). Keys are not scaled."
)
_ZH = (
    "每个查询乘以一个随位置增大的温度 1 + attn_scale · log(1 + ⌊(pos + offset) / floor_scale⌋)："
    "在长上下文里，位置靠后的查询的注意力更集中。只缩放查询，不缩放键。"
)


class TemperatureTexts(VariantTexts):
    name = "temperature"
    order = 32
    reads_positions = True
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "conv_temperature": (
                "temperature: Q × (1 + {s} · ln(1 + ⌊(pos + {o}) / {f}⌋)), queries only "
                "(Llama 4 attn_temperature_tuning, Ministral 3 llama_4_scaling_beta)"
            ),
        },
        "zh": {
            "conv_temperature": "温度：Q × (1 + {s} · log(1 + ⌊(位置 + {o}) / {f}⌋))，只缩放查询",
        },
    }
    explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {
        "Q_tuned": stage_explainer(("Q_rot", "Q_norm", "Q"), _EN, _ZH, fallback="Q"),
    }
    math_names = ("Q_tuned", "d_Q_tuned")
    formula_zh: ClassVar[tuple[tuple[str, str], ...]] = (
        (r"ln\(1 \+ ⌊\(position", "log(1 + ⌊(位置"),  # Q_tuned's, as the header's label says it
        (r" × the query's temperature$", " × 该查询的温度"),  # d_Q's
    )

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        return [
            label(
                lang,
                "conv_temperature",
                s=f"{value.attn_scale:g}",
                o=value.offset,
                f=f"{value.floor_scale:g}",
            )
        ]


TEXTS = TemperatureTexts()
