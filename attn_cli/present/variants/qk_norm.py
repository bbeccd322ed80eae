"""QK-norm (Qwen3, OLMo 2): RMSNorm of Q and K before RoPE, what present/ says about it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import Lang, label
from attn_cli.present.variant_texts import VariantTexts

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs


class QkNormTexts(VariantTexts):
    name = "qk_norm"
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

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        qk = value
        per_head = qk.q_weight.shape[0] == inp.d_k
        over = label(lang, "conv_qk_head" if per_head else "conv_qk_whole")
        return [label(lang, "conv_qk_norm", over=over, eps=f"{qk.eps:g}")]


TEXTS = QkNormTexts()
