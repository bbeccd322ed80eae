"""The mistakes of gated attention (Qwen3-Next): the gate applied after W_O instead of before it,
and the gate's logits multiplied in without the sigmoid."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attn_cli.check.mistake import Mistake, register, register_zh
from attn_cli.check.recompute import Change, internal, recomputed
from attn_cli.core.heads import merge_heads
from attn_cli.core.plugins.gate import sigmoid

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _gate_after_w_o(trace: Trace) -> list[Change]:
    inp = trace.inputs
    if "gate" not in trace or inp.W_O is None or inp.W_O.shape[1] != inp.W_O.shape[0]:
        return []  # σ(gate) [.., heads*d_v] multiplies projected [.., d_out] only when they match
    output, gate = internal(trace, "output"), internal(trace, "gate")  # (B, H, T, Dv)
    concat = merge_heads(output)  # (B, T, H*Dv): the heads joined ungated
    projected = concat @ inp.W_O + (0.0 if inp.b_O is None else inp.b_O)  # (B, T, d_out)
    projected = projected * sigmoid(merge_heads(gate))
    detail = (
        "Your {stage} is what attn gets with the gate applied after W_O: projected = "
        "(concat·W_O) ⊙ σ(gate). Qwen3-Next gates each head's output before the heads are "
        "joined and projected (attn_output * sigmoid(gate), then o_proj). Fix: gated = output ⊙ "
        "σ(gate) per head, then concat, then W_O."
    )
    values = {"gated": output, "concat": concat, "projected": projected}
    return [Change(detail, "gated", values)]


def _gate_without_sigmoid(trace: Trace) -> list[Change]:
    if "gate" not in trace:
        return []
    gated = internal(trace, "output") * internal(trace, "gate")  # (B, H, T, Dv)
    detail = (
        "Your {stage} is what attn gets with the gate's logits multiplied in as they are: "
        "gated = output ⊙ gate. The gate is squeezed into (0, 1) first: gated = output ⊙ "
        "σ(gate), σ(x) = 1 / (1 + e^(−x)) (torch.sigmoid). Fix: apply the sigmoid to the gate."
    )
    return [Change(detail, "gated", {"gated": gated})]


register(
    "gate",
    Mistake("gate_after_w_o", "gate applied after W_O instead of before",
            recomputed(_gate_after_w_o), 210),
    Mistake("gate_without_sigmoid", "gate multiplied in without the sigmoid",
            recomputed(_gate_without_sigmoid), 220),
)  # fmt: skip
register_zh(
    {
        "gate_after_w_o": (
            "门控放在了 W_O 之后",
            "先把各头拼接并乘以 W_O（加 b_O），再乘以 σ(gate)：门控作用在投影之后的输出上。"
            "Qwen3-Next 的门控作用在每个头的输出上，在 o_proj 之前。"
            "修正：gated = output ⊙ σ(gate)，再拼接各头并乘以 W_O。",
        ),
        "gate_without_sigmoid": (
            "门控少了 sigmoid",
            "把门控的 logit 直接乘到输出上（output ⊙ gate），而不是乘以 σ(gate)，"
            "后者是每个头、每个词、每一维在 (0, 1) 之间的权重。修正：gated = output ⊙ σ(gate)。",
        ),
    }
)
