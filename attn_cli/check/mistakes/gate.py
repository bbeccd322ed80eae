"""The mistakes of gated attention (Qwen3-Next): the gate applied after W_O instead of before it,
the gate's logits multiplied in without the sigmoid, or with it the other way (1 − σ), and
q_proj's output split into query and gate over its whole width instead of per head."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from attn_cli.check.mistake import Mistake, register, register_zh
from attn_cli.check.recompute import Change, internal, recomputed
from attn_cli.core.heads import merge_heads
from attn_cli.core.ops import sigmoid
from attn_cli.core.plugins.gate import Gate

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


def _gate_complement(trace: Trace) -> list[Change]:
    if "gate" not in trace:
        return []
    gated = internal(trace, "output") * sigmoid(-internal(trace, "gate"))  # (B, H, T, Dv)
    detail = (
        "Your {stage} is what attn gets with the gate turned the other way: gated = output ⊙ "
        "(1 − σ(gate)) = output ⊙ σ(−gate), as when the gate's logits are negated or the "
        "complement is taken (a GRU's update-gate habit). Qwen3-Next keeps σ(gate): a large "
        "logit lets the head's output through. Fix: gated = output ⊙ σ(gate)."
    )
    return [Change(detail, "gated", {"gated": gated})]


def _gate_whole_chunk(trace: Trace) -> list[Change]:
    """q_proj = per head [query rows | gate rows], chunked in two over its whole width."""
    inp = trace.inputs
    gate = inp.extra.get("gate")
    H, D = inp.heads, inp.d_k
    if gate is None or inp.W_Q is None or H < 2 or inp.d_v != D:
        return []  # one head: both splits agree; q_proj's halves differ in width otherwise

    def joined(q: np.ndarray, g: np.ndarray) -> np.ndarray:  # (..., H*D) each -> per head [q|g]
        both = np.stack([q.reshape(*q.shape[:-1], H, D), g.reshape(*g.shape[:-1], H, D)], -2)
        return both.reshape(*q.shape[:-1], 2 * H * D)  # (..., H, 2, D) flattened

    W = joined(inp.W_Q, gate.W_G)  # (d_model, 2·H·D): q_proj as the checkpoint holds it
    b = None
    if inp.b_Q is not None or gate.b_G is not None:
        zeros = np.zeros(H * D)
        b = joined(zeros if inp.b_Q is None else inp.b_Q, zeros if gate.b_G is None else gate.b_G)
    changed = replace(
        inp,
        W_Q=W[:, : H * D],
        b_Q=None if b is None else b[: H * D],
        extra={**inp.extra, "gate": Gate(W[:, H * D :], None if b is None else b[H * D :])},
    )
    detail = (
        "Your {stage} is what attn gets with q_proj's output split into query and gate over "
        "its whole width (query, gate = q_proj(x).chunk(2, dim=-1)): Qwen3-Next's q_proj holds, "
        "per head, the query's head_dim rows and then the gate's, so the halves mix both. "
        "transformers views it as (…, heads, 2·head_dim) first: query, gate = "
        "torch.chunk(q_proj(x).view(*shape, -1, 2 * head_dim), 2, dim=-1). Fix: split per head."
    )
    return [Change(detail, "Q", inputs=changed)]


register(
    "gate",
    Mistake(
        "gate_after_w_o",
        "gate applied after W_O instead of before",
        recomputed(_gate_after_w_o),
        210,
    ),
    Mistake(
        "gate_without_sigmoid",
        "gate multiplied in without the sigmoid",
        recomputed(_gate_without_sigmoid),
        220,
    ),
    Mistake("gate_complement", "gate as 1 − σ(gate)", recomputed(_gate_complement), 230),
    Mistake(
        "gate_whole_chunk",
        "q_proj split into query and gate over its whole width",
        recomputed(_gate_whole_chunk),
        240,
    ),
)
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
        "gate_complement": (
            "门控取成了 1 − σ(gate)",
            "把门控取反：gated = output ⊙ (1 − σ(gate))，即 σ(−gate)。Qwen3-Next 用 σ(gate)："
            "logit 越大，头的输出通过得越多。修正：gated = output ⊙ σ(gate)。",
        ),
        "gate_whole_chunk": (
            "q_proj 按整个宽度切成查询和门控",
            "q_proj 的输出在每个头内先是查询的 head_dim 行、再是门控的行；"
            "按整个宽度 chunk(2) 会把两者混在一起。修正：先 view 成 (…, heads, 2·head_dim)，"
            "再在每个头内切分（transformers 的写法）。",
        ),
    }
)
