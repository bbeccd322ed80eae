"""The mistakes of attention temperature (Llama 4's attn_temperature_tuning, Ministral 3's
llama_4_scaling_beta): the factor applied to the keys too (it scales the queries only), and the
position taken one off (Llama 4 adds 1 to the 0-based position, Ministral 3 does not)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from attn_cli.check.mistake import Mistake, register, register_zh
from attn_cli.check.recompute import Candidate, Change, candidate, internal, recomputed
from attn_cli.core.chain import Chain

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _value(trace: Trace) -> Any:
    return trace.inputs.extra.get("temperature")


def _on_keys(trace: Trace) -> list[Candidate]:
    value = _value(trace)
    if value is None:
        return []
    k_last = [n for n in ("K", *Chain(trace.inputs).qk_stages("K")) if n in trace][-1]
    _, pos_k = trace.inputs.token_positions()
    k = internal(trace, k_last) * value.factors(pos_k)[:, None]  # (B, Hkv, S, D)
    detail = (
        f"Your {{stage}} is what attn gets with the temperature applied to the keys as well "
        f"({k_last} × the factor of each key's position): the temperature scales the queries "
        "only, so that a far query attends more sharply. Fix: Q_tuned = Q × factor(pos_q), "
        "K unchanged."
    )
    return [candidate(trace, detail, "scores", {k_last: k})]


def _off_by_one(trace: Trace) -> list[Change]:
    value = _value(trace)
    if value is None:
        return []
    wrong = 1 - value.offset
    said = "position + 1" if value.offset else "position"
    detail = (
        f"Your {{stage}} is what attn gets with the temperature's position one off: "
        f"⌊({'position + 1' if wrong else 'position'}) / {value.floor_scale:g}⌋ where it is "
        f"⌊({said}) / {value.floor_scale:g}⌋ (Llama 4 adds 1 to the 0-based position, "
        f"Ministral 3 does not). Fix: factor = 1 + {value.attn_scale:g} · ln(1 + ⌊({said}) / "
        f"{value.floor_scale:g}⌋)."
    )
    extra = {**trace.inputs.extra, "temperature": replace(value, offset=wrong)}
    return [Change(detail, "Q_tuned", inputs=replace(trace.inputs, extra=extra))]


register(
    "temperature",
    Mistake("temperature_on_keys", "temperature applied to the keys", _on_keys, 136),
    Mistake(
        "temperature_off_by_one",
        "temperature's position one off",
        recomputed(_off_by_one),
        137,
    ),
)

register_zh(
    {
        "temperature_on_keys": (
            "温度也乘到了键上",
            "温度只缩放查询，让靠后的查询注意力更集中；键不变。修正：Q_tuned = Q × factor(pos_q)。",
        ),
        "temperature_off_by_one": (
            "温度的位置差一",
            "位置多加或少加了 1（Llama 4 用 pos + 1，Ministral 3 用 pos）。"
            "修正：factor = 1 + attn_scale · ln(1 + ⌊(pos + offset) / floor_scale⌋)。",
        ),
    }
)
