"""ALiBi (Press et al., attention with linear biases), what present/ says about it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import Lang, label
from attn_cli.present.variant_texts import VariantTexts

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs


class AlibiTexts(VariantTexts):
    name = "alibi"
    bias_stage = "alibi"
    reads_positions = True
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "conv_alibi": "ALiBi: bias −slope_h·|pos_q − pos_k|, slopes {slopes} (Press et al.)",
            "cell_add_alibi": "plus the ALiBi bias:",
            "cell_alibi": "head {head}'s ALiBi bias: −slope × |query position − key position|",
        },
        "zh": {
            "conv_alibi": "ALiBi：偏置 −slope_h·|pos_q − pos_k|，斜率 {slopes}（Press 等）",
            "cell_add_alibi": "加上 ALiBi 偏置：",
            "cell_alibi": "头 {head} 的 ALiBi 偏置：−slope × |查询位置 − 键位置|",
        },
    }

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        slopes = ", ".join(f"{s:.4g}" for s in value)
        return [label(lang, "conv_alibi", slopes=slopes)]


TEXTS = AlibiTexts()
