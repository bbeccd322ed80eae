"""ALiBi (Press et al., attention with linear biases), what present/ says about it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import Lang, en_zh, label
from attn_cli.present.variant_texts import VariantTexts

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.present.explain_registry import Cell, CellText, Context, Parts


def _explain_alibi(c: Context) -> Parts:
    """The explanation of alibi (Press et al., attention with linear biases)."""
    formula = ("alibi[h, i, j] = −slope_h × |pos_i − pos_j|",)
    meaning = [
        en_zh(
            c,
            "ALiBi: no position embedding at all; instead each head subtracts a penalty that grows "
            "linearly with the distance between query and key, steeper for some heads than others "
            "(slopes 2^(−8/n), 2^(−16/n), ...). It is added in `masked`. BLOOM's slope × key "
            "position differs from this by a constant per row, which softmax cancels.",
            "ALiBi：完全不用位置编码，而是让每个头减去一个随查询与键之间距离线性增长的惩罚，"
            "不同的头斜率不同（2^(−8/n)、2^(−16/n)……）。它在 masked 这一步加上。"
            "BLOOM 的 slope × 键位置 与此只差每行一个常数，softmax 会把它抵消。",
        )
    ]
    return formula, (label(c.lang, "given"),), meaning


def _cell_alibi(c: Cell) -> CellText | None:
    """The worked cell under ``alibi``: −slope × |pos_q − pos_k| with the numbers."""
    cell = c.cell
    if cell.slope is None or cell.alibi is None:
        return None
    n = c.n
    pos_q, pos_k = cell.positions
    slope = c.g(cell.slope)
    return c.worked(
        "cell_alibi",
        f"alibi{c.at} = −{slope} × |{pos_q} − {pos_k}| = −{slope} × {abs(pos_q - pos_k)} = "
        f"{n(cell.alibi)}",
        head=cell.head,
    )


class AlibiTexts(VariantTexts):
    name = "alibi"
    order = 50
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
    add_label = "cell_add_alibi"
    math_names = ("alibi",)
    explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {"alibi": _explain_alibi}
    cell_texts: ClassVar[dict[str, Callable[[Any], Any]]] = {"alibi": _cell_alibi}

    def setting_values(self, value: Any, head: int) -> dict[str, Any]:
        return {"slope": None if value is None else float(value[head])}

    def masked_note(self, value: Any, zh: bool) -> list[str]:
        return [
            "alibi：每个头按查询与键的距离扣分，在这里加到分数上（见 alibi 这一步）。"
            if zh
            else "alibi: each head's distance penalty (the alibi stage) is added to the scores "
            "here."
        ]

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        slopes = ", ".join(f"{s:.4g}" for s in value)
        return [label(lang, "conv_alibi", slopes=slopes)]


TEXTS = AlibiTexts()
