"""RoPE (rotary position embedding), what present/ says about it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import Lang, label
from attn_cli.present.variant_texts import VariantTexts

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs


class RopeTexts(VariantTexts):
    name = "rope"
    reads_positions = True
    before_positions = True
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "conv_rope": (
                "RoPE: {layout} layout ({who}), base {base}, {dims} of {d_k} "
                "dims rotate; Q and K, not V"
            ),
            "conv_rope_half": "half: i pairs with i + dims/2, HF rotate_half",
            "conv_rope_interleaved": "interleaved: 2i pairs with 2i + 1, Meta's llama",
        },
        "zh": {
            "conv_rope": (
                "RoPE：{layout}（{who}），base {base}，旋转 {dims} 维（共 {d_k} "
                "维）；只作用于 Q 和 K，不作用于 V"
            ),
            "conv_rope_half": "半分布局：第 i 维与第 i + dims/2 维配对，HF rotate_half",
            "conv_rope_interleaved": "交错布局：第 2i 维与第 2i + 1 维配对，Meta llama",
        },
    }

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        rope = value
        who = label(lang, f"conv_rope_{rope.layout}")
        layout = who.split(":")[0].split("：")[0]
        who = who.split(":")[-1].split("：")[-1].strip()
        return [label(lang, "conv_rope", layout=layout, who=who, base=f"{rope.base:g}",
                      dims=rope.dims, d_k=inp.d_k)]  # fmt: skip


TEXTS = RopeTexts()
