"""Logit soft-capping (Gemma 2), what present/ says about it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import Lang, en_zh, label
from attn_cli.present.text import short_number
from attn_cli.present.variant_texts import VariantTexts

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.present.explain_registry import Cell, CellText, Context, Parts


def _explain_capped(c: Context) -> Parts:
    """The explanation of capped (logit soft-capping, as Gemma 2)."""
    cap = short_number(TEXTS.setting(c.trace.inputs) or 0.0, c.precision)
    formula = (f"capped = {cap} × tanh(scaled / {cap})",)
    meaning = [
        en_zh(
            c,
            f"Soft-capping: tanh squeezes every score smoothly into (−{cap}, {cap}), so no single "
            "score can dominate; small scores pass almost unchanged. Gemma 2 applies it before the "
            "mask, as here.",
            f"软截断：tanh 把每个分数平滑地压进 (−{cap}, {cap})，任何一个分数都无法独占注意力；"
            "小的分数几乎不变。Gemma 2 在遮盖之前做这一步，这里也一样。",
        )
    ]
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


# The flash view's S with the cap: lang -> (formula, meaning)
_FLASH_S: dict[Lang, tuple[str, str]] = {
    "en": (
        "S = softcap·tanh(Q_block · K_blockᵀ × scale / softcap) (+ bias), −∞ where not allowed",
        "Gemma 2's softcap is applied to the tile's scaled scores before the bias, the mask "
        "and the running max, as in the full computation: the same numbers as the "
        "matching block of the trace's masked stage.",
    ),
    "zh": (
        "S = softcap·tanh(Q_块 · K_块ᵀ × scale / softcap)（+ bias），不允许看的位置为 −∞",
        "Gemma 2 的软截断作用在这一块缩放后的分数上，在 bias、遮盖和运行最大值之前，"
        "与完整计算相同：与 trace 中 masked 阶段对应的那一块数值相同。",
    ),
}


# The decode view's capped row: lang -> (formula, meaning)
_DECODE_CAPPED: dict[Lang, tuple[str, str]] = {
    "en": (
        "capped = softcap × tanh(scaled / softcap)",
        "Gemma 2's logit softcapping, on the scaled row before the bias and the mask, "
        "exactly as in the full computation: large scores flatten towards ±softcap, "
        "small ones pass almost unchanged. masked then starts from capped.",
    ),
    "zh": (
        "capped = softcap × tanh(scaled / softcap)",
        "Gemma 2 的 logit 软截断，作用在缩放后的这一行上，在 bias 和遮盖之前，与完整计算"
        "完全相同：大的分数被压向 ±softcap，小的几乎不变。masked 随后从 capped 开始。",
    ),
}


class SoftcapTexts(VariantTexts):
    name = "softcap"
    order = 40
    stage = "capped"
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "conv_softcap": (
                "softcap {cap}: capped = {cap}·tanh(scaled/{cap}), before the mask (Gemma 2)"
            ),
            "flash_S_cap": (
                "S: capped scores of the tile, {c}·tanh(scaled/{c}) (−∞ where not allowed)"
            ),
            "cell_cap": "soft-capping squeezes the score into (−{cap}, {cap}):",
        },
        "zh": {
            "conv_softcap": (
                "softcap {cap}：capped = {cap}·tanh(scaled/{cap})，在遮盖之前（Gemma 2）"
            ),
            "flash_S_cap": ("S：这一块截断后的分数，{c}·tanh(scaled/{c})（不允许看的位置为 −∞）"),
            "cell_cap": "软截断把分数压进 (−{cap}, {cap})：",
        },
    }
    grad_note: ClassVar[dict[Lang, str]] = {
        "en": "capped = c × tanh(scaled / c), whose slope is 1 − tanh²(scaled / c): near 1 for "
        "small scores, near 0 for large ones, so a saturated score barely learns.",
        "zh": "capped = c × tanh(scaled / c)，它的斜率是 1 − tanh²(scaled / c)：分数小时接近 1，"
        "分数大时接近 0，所以饱和的分数几乎学不动。",
    }
    math_names = ("softcap",)
    view_notes: ClassVar[dict[str, dict[str, dict[Lang, tuple[str, str]]]]] = {
        "flash": {"S_cap": _FLASH_S},
        "decode": {"capped": _DECODE_CAPPED},
    }
    view_inputs: ClassVar[dict[str, dict[str, tuple[str, ...]]]] = {
        "flash": {"S_cap": ("Q_block", "K_block", "softcap")},
        "decode": {"capped": ("scaled", "softcap")},
    }
    explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {"capped": _explain_capped}
    cell_texts: ClassVar[dict[str, Callable[[Any], Any]]] = {"capped": _cell_capped}

    def setting_values(self, value: Any, head: int) -> dict[str, Any]:
        return {"softcap": value}

    def view_title(self, view: str, value: Any, lang: Lang) -> str | None:
        return label(lang, "flash_S_cap", c=f"{value:g}") if view == "flash" else None

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        return [label(lang, "conv_softcap", cap=f"{value:g}")]


TEXTS = SoftcapTexts()
