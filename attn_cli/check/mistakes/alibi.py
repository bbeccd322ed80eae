"""The mistakes of ALiBi (Press et al.: −slope_h × |pos_q − pos_k|): the sign flipped; the slopes
given to the heads in reverse; the paper's slopes with the exponent counted from 0, or for a
head count that is no power of two, a plain geometric series; the bias scaled with the scores;
and (with positions.py) the positions read one off."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from attn_cli.check.mistake import (
    Mistake,
    Reader,
    moved_positions,
    register,
    register_reader,
    register_zh,
    scaled_with_bias,
)
from attn_cli.check.recompute import (
    Candidate,
    Change,
    bias_stage,
    recomputed,
)
from attn_cli.core.inputs import FloatArray
from attn_cli.core.plugins.bias import alibi_slopes

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _alibi_sign(trace: Trace) -> list[Change]:
    inp = trace.inputs
    if inp.setting("alibi") is None:
        return []
    flipped = inp.with_setting("alibi", -inp.setting("alibi"))
    detail = (
        "Your {stage} is what attn gets with the ALiBi bias added as +slope·|pos_q - pos_k|: "
        "distant keys gain weight instead of losing it. Fix: bias = -slope * |pos_q - pos_k|."
    )
    return [Change(detail, "alibi", {"alibi": bias_stage(flipped, "alibi")})]


def _moved(trace: Trace, dq: int, dk: int) -> Change | None:
    """The ALiBi stage at moved positions; moving both alike changes no distance: None."""
    if dq == dk:
        return None
    shifted = moved_positions(trace.inputs, dq, dk)
    return Change("", "alibi", {"alibi": bias_stage(shifted, "alibi")})


def _with_slopes(trace: Trace, detail: str, slopes: FloatArray) -> Change:
    """The ALiBi stage (and all after it) with ``slopes`` (H,) in place of the fixture's."""
    wrong = trace.inputs.with_setting("alibi", slopes)
    return Change(detail, "alibi", {"alibi": bias_stage(wrong, "alibi")})


def _slopes_reversed(trace: Trace) -> list[Change]:
    slopes = trace.inputs.setting("alibi")
    if slopes is None or (slopes == slopes[::-1]).all():
        return []
    detail = (
        "Your {stage} is what attn gets with the slopes given to the heads in reverse: head 0 "
        "gets the smallest slope instead of the largest. Press et al.'s get_slopes lists them "
        "from 2^(-8/n) down, head 0 first (BLOOM's build_alibi_tensor, the same order). Fix: "
        "slope of head h = slopes[h]."
    )
    return [_with_slopes(trace, detail, slopes[::-1].copy())]


def _slopes_formula(trace: Trace) -> list[Change]:
    inp = trace.inputs
    if inp.setting("alibi") is None or not np.allclose(
        inp.setting("alibi"), alibi_slopes(inp.heads), 1e-12, 0
    ):
        return []  # slopes of the fixture's own: no formula to get wrong
    n = inp.heads
    out = [
        _with_slopes(
            trace,
            f"Your {{stage}} is what attn gets with the slopes 2^(-8h/{n}) for h = 0..{n - 1}: "
            f"the exponent counted from 0, so head 0 has slope 1. Press et al.: 2^(-8(h+1)/{n}), "
            f"from 2^(-8/{n}). Fix: start = 2 ** (-8 / n); slopes = [start ** (h + 1) for h in "
            "range(n)].",
            np.array([2.0 ** (-8 * h / n) for h in range(n)]),
        )
    ]
    if not math.log2(n).is_integer():
        detail = (
            f"Your {{stage}} is what attn gets with the slopes 2^(-8(h+1)/{n}) straight, for "
            f"{n} heads, no power of two. Press et al.'s get_slopes takes the closest power of "
            "two's slopes and then every other slope of twice that many heads (BLOOM, MPT do "
            "the same). Fix: the paper's get_slopes for n not a power of two."
        )
        out.append(
            _with_slopes(trace, detail, np.array([2.0 ** (-8 * (h + 1) / n) for h in range(n)]))
        )
    return out


def _alibi_scaled(trace: Trace) -> list[Candidate]:
    if trace.inputs.setting("alibi") is None:
        return []
    detail = (
        f"Your {{stage}} is what attn gets with the ALiBi bias added before the scale and so "
        f"multiplied by {trace.scale:.6g} with the scores: (scores + alibi) * scale. The bias "
        "is added to the scaled scores (BLOOM folds 1/√d_k into the product with baddbmm, "
        "beta=1 for the bias). Fix: scores * scale + alibi."
    )
    return scaled_with_bias(trace, detail)


register(
    "alibi",
    Mistake("alibi_sign", "ALiBi sign flipped (+slope·distance)", recomputed(_alibi_sign), 150),
    Mistake(
        "alibi_slopes_reversed",
        "ALiBi slopes in reverse head order",
        recomputed(_slopes_reversed),
        151,
    ),
    Mistake(
        "alibi_slopes_formula",
        "ALiBi slopes from another formula",
        recomputed(_slopes_formula),
        152,
    ),
    Mistake("alibi_scaled", "ALiBi bias scaled with the scores", _alibi_scaled, 153),
)
register_reader("alibi", Reader("ALiBi", "alibi", _moved))

register_zh(
    {
        "alibi_sign": (
            "ALiBi 的符号反了（+斜率·距离）",
            "偏置加成了 +slope·|pos_q − pos_k|，远处的键反而得到更多权重。修正：bias = −slope · |p"
            "os_q − pos_k|。",
        ),
        "alibi_slopes_reversed": (
            "ALiBi 斜率按头的顺序反了",
            "头 0 拿到了最小的斜率；Press 等人的 get_slopes 从 2^(-8/n) 开始递减，头 0 最大。修正"
            "：头 h 的斜率为 slopes[h]。",
        ),
        "alibi_slopes_formula": (
            "ALiBi 斜率用了别的公式",
            "指数从 0 开始（头 0 斜率为 1），或头数不是 2 的幂时直接用等比数列；论文的 get_slopes "
            "取最近的 2 的幂的斜率，再隔一个取两倍头数的斜率。修正：使用论文的 get_slopes。",
        ),
        "alibi_scaled": (
            "ALiBi 偏置和分数一起被缩放了",
            "先加偏置再乘 scale：(scores + alibi) * scale；偏置应加在缩放之后。修正：scores * scal"
            "e + alibi。",
        ),
    }
)
