"""The mistakes of logit softcapping (Gemma 2: capped = cap·tanh(scaled / cap)): the cap applied
after the mask, where it turns -inf into -cap and gives hidden keys weight; the division or the
multiplication by cap left out, or both (tanh(scaled)); the cap applied before the 1/√d_k
scale; the cap left out; the final logits' cap (30) where the attention's (50) is meant, or the
reverse."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attn_cli.check.mistake import Mistake, register, register_zh
from attn_cli.check.recompute import (
    Change,
    extra_logit,
    internal,
    masked_with,
    recomputed,
    softmax_and_lse,
)
from attn_cli.check.recompute import allowed as chain_allowed
from attn_cli.core.stages import softmax_input
from attn_cli.core.variant import REGISTRY, ScoreModifier

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _softcap_after_mask(trace: Trace) -> list[Change]:
    inp = trace.inputs
    softcap = REGISTRY["softcap"]
    assert isinstance(softcap, ScoreModifier)
    cap = softcap.value(inp)
    if cap is None or softmax_input(inp) != "masked":
        return []
    masked = masked_with(trace, chain_allowed(inp), before="scaled")
    capped = softcap.modify(cap, masked)  # -inf -> -softcap
    weights = softmax_and_lse(capped, extra_logit(inp))[0]
    detail = (
        f"Your {{stage}} is what attn gets with the softcap applied after the mask: "
        f"{cap:g}·tanh(-inf/{cap:g}) = -{cap:g}, so the hidden keys get "
        "a little weight instead of none. Gemma 2 caps the scaled scores before the mask. Fix: "
        "capped = softcap * tanh(scaled / softcap), then mask."
    )
    return [
        Change(detail, "capped", {"capped": capped, "masked": m, "softmax": weights})
        for m in (masked, capped)  # your masked: before the cap, or the capped scores again
    ]


def _cap(trace: Trace) -> float | None:
    cap: float | None = REGISTRY["softcap"].value(trace.inputs)
    return cap


def _formula(trace: Trace) -> list[Change]:
    cap = _cap(trace)
    if cap is None:
        return []
    x = internal(trace, "scaled")  # (B, H, T, S)
    fix = f"Fix: capped = {cap:g} * tanh(scaled / {cap:g})."
    return [
        Change(
            f"Your {{stage}} is what attn gets with the division by the cap left out: {cap:g}·"
            f"tanh(scaled) instead of {cap:g}·tanh(scaled / {cap:g}), so every score saturates "
            f"at ±{cap:g}. {fix}",
            "capped",
            {"capped": cap * np.tanh(x)},
        ),
        Change(
            f"Your {{stage}} is what attn gets with the multiplication by the cap left out: "
            f"tanh(scaled / {cap:g}), every score squeezed into (-1, 1), instead of "
            f"{cap:g}·tanh(scaled / {cap:g}). {fix}",
            "capped",
            {"capped": np.tanh(x / cap)},
        ),
    ]


def _no_factor(trace: Trace) -> list[Change]:
    cap = _cap(trace)
    if cap is None:
        return []
    x = internal(trace, "scaled")  # (B, H, T, S)
    detail = (
        f"Your {{stage}} is what attn gets with the cap left out on both sides: tanh(scaled), "
        f"every score squeezed into (-1, 1) without the division by {cap:g} first, instead of "
        f"{cap:g}·tanh(scaled / {cap:g}). Fix: capped = {cap:g} * tanh(scaled / {cap:g})."
    )
    return [Change(detail, "capped", {"capped": np.tanh(x)})]


def _before_scale(trace: Trace) -> list[Change]:
    cap = _cap(trace)
    if cap is None or trace.scale == 1:
        return []
    scores = internal(trace, "scores")  # (B, H, T, S)
    detail = (
        f"Your {{stage}} is what attn gets with the cap applied to the raw scores and the scale "
        f"after it: {trace.scale:.6g}·{cap:g}·tanh(scores / {cap:g}). Gemma 2 scales first (by "
        "query_pre_attn_scalar^-0.5), then caps. Fix: capped = cap * tanh((scores * scale) / "
        "cap)."
    )
    return [Change(detail, "capped", {"capped": trace.scale * cap * np.tanh(scores / cap)})]


def _left_out(trace: Trace) -> list[Change]:
    cap = _cap(trace)
    if cap is None:
        return []
    detail = (
        f"Your {{stage}} is what attn gets with the softcap left out: the scaled scores go on "
        f"as they are, where Gemma 2 caps them at ±{cap:g} (attn_logit_softcapping). Fix: "
        f"capped = {cap:g} * tanh(scaled / {cap:g})."
    )
    return [Change(detail, "capped", {"capped": internal(trace, "scaled")})]


def _other_cap(trace: Trace) -> list[Change]:
    cap = _cap(trace)
    if cap is None:
        return []
    x = internal(trace, "scaled")  # (B, H, T, S)
    return [
        Change(
            f"Your {{stage}} is what attn gets with a cap of {other:g} instead of {cap:g}: Gemma "
            "2 caps the attention logits at 50 (attn_logit_softcapping) and the final logits at "
            "30 (final_logit_softcapping); the two are easy to swap. Fix: the fixture's "
            f"softcap, {cap:g}.",
            "capped",
            {"capped": other * np.tanh(x / other)},
        )
        for other in (50.0, 30.0)
        if other != cap
    ]


register(
    "softcap",
    Mistake(
        "softcap_after_mask", "softcap applied after the mask", recomputed(_softcap_after_mask), 140
    ),
    Mistake(
        "softcap_formula",
        "softcap without dividing by the cap, or without multiplying back",
        recomputed(_formula),
        141,
    ),
    Mistake(
        "softcap_no_factor",
        "softcap without its factor: tanh(scaled), not cap·tanh(scaled / cap)",
        recomputed(_no_factor),
        145,
    ),
    Mistake(
        "softcap_before_scale", "softcap applied before the scale", recomputed(_before_scale), 142
    ),
    Mistake("softcap_left_out", "softcap left out", recomputed(_left_out), 143),
    Mistake("softcap_other_cap", "the other Gemma 2 cap (30 vs 50)", recomputed(_other_cap), 144),
)

register_zh(
    {
        "softcap_after_mask": (
            "softcap 放在了遮蔽之后",
            "cap·tanh(−inf/cap) = −cap，被遮蔽的键得到了一点权重。Gemma 2 先对缩放后的分数做 softc"
            "ap，再遮蔽。修正：capped = cap * tanh(scaled / cap)，然后遮蔽。",
        ),
        "softcap_formula": (
            "softcap 少了除以 cap 或乘回 cap",
            "写成 cap·tanh(scaled)（每个分数都饱和到 ±cap）或 tanh(scaled / cap)（被压进 (−1, 1)）"
            "。修正：capped = cap * tanh(scaled / cap)。",
        ),
        "softcap_no_factor": (
            "softcap 漏掉了 cap 因子",
            "写成 tanh(scaled)：既没有先除以 cap，也没有再乘回 cap，每个分数都被压进 (−1, 1)。"
            "修正：capped = cap * tanh(scaled / cap)。",
        ),
        "softcap_before_scale": (
            "softcap 放在了缩放之前",
            "先对原始分数 softcap 再缩放；Gemma 2 先缩放再 softcap。修正：capped = cap * tanh((sco"
            "res * scale) / cap)。",
        ),
        "softcap_left_out": (
            "漏掉了 softcap",
            "缩放后的分数没有经过 cap·tanh(x/cap)。修正：capped = cap * tanh(scaled / cap)。",
        ),
        "softcap_other_cap": (
            "用了 Gemma 2 的另一个 cap（30 与 50）",
            "Gemma 2 注意力 logits 的 cap 是 50（attn_logit_softcapping），最终 logits 的是 30（fi"
            "nal_logit_softcapping），容易弄混。修正：用 fixture 的 softcap。",
        ),
    }
)
