"""Logit soft-capping (Gemma 2), what present/ says about it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.explain_registry import Cell, CellText, Context, Parts, en_zh
from attn_cli.present.i18n import Lang, label
from attn_cli.present.text import short_number
from attn_cli.present.variant_texts import VariantTexts

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs


def _explain_capped(c: Context) -> Parts:
    """The explanation of capped (logit soft-capping, as Gemma 2)."""
    cap = short_number(TEXTS.setting(c.trace.inputs) or 0.0, c.precision)
    formula = (f"capped = {cap} × tanh(scaled / {cap})",)
    meaning = [en_zh(
        c,
        f"Soft-capping: tanh squeezes every score smoothly into (−{cap}, {cap}), so no single "
        "score can dominate; small scores pass almost unchanged. Gemma 2 applies it before the "
        "mask, as here.",
        f"软截断：tanh 把每个分数平滑地压进 (−{cap}, {cap})，任何一个分数都无法独占注意力；"
        "小的分数几乎不变。Gemma 2 在遮盖之前做这一步，这里也一样。",
    )]  # fmt: skip
    return formula, (c.shape_of("scaled"),), meaning


def _cell_capped(c: Cell) -> CellText | None:
    """The worked cell under ``capped``: cap·tanh(scaled / cap) with the numbers."""
    cell = c.cell
    if cell.softcap is None or cell.capped is None:
        return None
    n, at = c.n, c.at
    cap = n(cell.softcap)
    ratio = cell.scaled / cell.softcap
    return c.worked(
        "cell_cap",
        f"capped{at} = {cap} × tanh(scaled{at} / {cap}) = {cap} × tanh({n(cell.scaled)} / "
        f"{cap}) = {cap} × tanh({n(ratio)}) = {cap} × {n(math.tanh(ratio))} = "
        f"{n(cell.capped)}",
        cap=cap,
    )


class SoftcapTexts(VariantTexts):
    name = "softcap"
    stage = "capped"
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "conv_softcap": (
                "softcap {cap}: capped = {cap}·tanh(scaled/{cap}), before the mask (Gemma 2)"
            ),
            "cell_cap": "soft-capping squeezes the score into (−{cap}, {cap}):",
        },
        "zh": {
            "conv_softcap": (
                "softcap {cap}：capped = {cap}·tanh(scaled/{cap})，在遮盖之前（Gemma 2）"
            ),
            "cell_cap": "软截断把分数压进 (−{cap}, {cap})：",
        },
    }
    explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {"capped": _explain_capped}
    cell_texts: ClassVar[dict[str, Callable[[Any], Any]]] = {"capped": _cell_capped}

    def setting_values(self, value: Any, head: int) -> dict[str, Any]:
        return {"softcap": value}

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        return [label(lang, "conv_softcap", cap=f"{value:g}")]


TEXTS = SoftcapTexts()
