"""The grader's mistakes of modern attention: RoPE, ALiBi, windows, softcap, sinks, GQA, and
three a new user makes (a transposed causal mask, 1/√d_model, ``X @ W.T``).

Each mistake says only what the mistaken code changes (a :class:`Change`: some stages or
inputs replaced from a stage on); grade.py recomputes everything after it with the pipeline's
own step functions (``downstream``) and claims the mistake only when that reproduces the
user's numbers. A mistake that does not apply to a fixture (no RoPE, no window, ...) returns
no changes. This module also holds the pieces of the recomputation that read the variants
(the softmax with sinks, the ALiBi stage, the masks besides causal), so that grade.py and
these mistakes share them. Axis names as in core/steps.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from attn_cli.core.inputs import BoolArray, FloatArray, Inputs
from attn_cli.core.stages import STAGE_NAMES, softmax_input
from attn_cli.core.steps import (
    alibi_rows,
    allowed_positions,
    apply_mask,
    cap_scores,
    norm_heads,
    project,
    rotate,
    softmax,
    softmax_rows,
    split_heads,
    window_reach,
)
from attn_cli.core.variants import RopeLayout, causal_allowed, window_allowed

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace

Weights = Callable[[FloatArray], FloatArray]
Expand = Callable[[FloatArray, int], FloatArray]  # kv heads (B, Hkv, S, D) -> (B, H, S, D)


# ---------------------------------------------------------------------------------------------
# What the recomputation shares with the mistakes


def internal(trace: Trace, name: str) -> FloatArray:
    """A stage of the trace in the internal layout: float64, batch axis first."""
    data = trace[name].data.astype(np.float64)
    return data if trace.inputs.has_batch else data[None]


def softmax_and_lse(x: FloatArray, sinks: FloatArray | None) -> tuple[FloatArray, FloatArray]:
    """The pipeline's softmax of (B, H, T, S), each head with its sink, and each row's lse."""
    B, H, T, _ = x.shape
    weights = np.empty_like(x)  # (B, H, T, S)
    lse = np.empty((B, H, T), dtype=x.dtype)  # (B, H, T)
    for h in range(H):
        sink = None if sinks is None else float(sinks[h])
        softmax_rows(x[:, h], weights[:, h], sink=sink, lse=lse[:, h])  # (B, T, S)
    return weights, lse


def alibi_stage(inputs: Inputs) -> FloatArray:
    """The ALiBi stage (B, H, T, S) from ``inputs``' slopes and positions, head by head."""
    one = np.stack([alibi_rows(inputs, h, 0, inputs.seq_q) for h in range(inputs.heads)])
    return np.ascontiguousarray(np.broadcast_to(one, (inputs.batch, *one.shape)))  # (B, H, T, S)


def other_masks(inputs: Inputs) -> BoolArray | None:
    """Where the boolean mask and the lengths allow attending (B, H, T, S); None: anywhere."""
    return allowed_positions(replace(inputs, causal=None, window=None))


def with_causal(inputs: Inputs, causal: BoolArray) -> BoolArray:
    """A (T, S) causal part combined with the fixture's mask and lengths: (B, H, T, S)."""
    rest = other_masks(inputs)
    shape = (inputs.batch, inputs.heads, inputs.seq_q, inputs.seq_k)
    ok = np.broadcast_to(causal, shape)  # (B, H, T, S)
    return ok.copy() if rest is None else ok & rest


def logits_before_mask(trace: Trace) -> FloatArray:
    """What the mask is applied to: capped with a softcap, else scaled."""
    return internal(trace, "capped" if trace.inputs.softcap is not None else "scaled")


def masked_with(trace: Trace, ok: BoolArray | None, inputs: Inputs | None = None) -> FloatArray:
    """masked recomputed from the trace's logits with the allowed places ``ok``."""
    inp = inputs or trace.inputs
    alibi = internal(trace, "alibi") if inp.alibi is not None else None
    return apply_mask(logits_before_mask(trace), ok, inp.bias, alibi=alibi, fill=inp.mask_value)


@dataclass(frozen=True, eq=False)
class Change:
    """What a mistaken computation changes: from ``start`` on, ``values`` replace stages and
    ``inputs`` the fixture's inputs (positions, window, slopes, weights); ``expand`` maps kv heads
    to query heads and ``weights`` is the softmax, when the mistake is there. Whether a row
    the mistake empties is nan or 0 is not said here: grade.py follows the user's own softmax."""

    detail: str
    start: str
    values: Mapping[str, FloatArray] = field(default_factory=dict)
    inputs: Inputs | None = None
    expand: Expand | None = None
    weights: Weights | None = None


@dataclass(frozen=True)
class VariantMistake:
    """A named mistake: ``changes(trace)`` is empty when it does not apply to the fixture."""

    name: str
    title: str
    changes: Callable[[Trace], list[Change]]


# ---------------------------------------------------------------------------------------------
# RoPE


def _qk_before_rope(trace: Trace, name: str) -> FloatArray:
    """What RoPE rotates: Q_norm / K_norm with QK-norm, else Q / K."""
    return internal(trace, f"{name}_norm" if trace.inputs.qk_norm is not None else name)


def _rope_layout(trace: Trace) -> list[Change]:
    rope = trace.inputs.rope
    if rope is None or rope.dims < 4:
        return []  # with 2 rotary dims both layouts pair (0, 1)
    other: RopeLayout = "interleaved" if rope.layout == "half" else "half"
    wrong = replace(rope, layout=other)
    pos_q, pos_k = trace.inputs.token_positions()
    values = {
        "Q_rot": rotate(_qk_before_rope(trace, "Q"), pos_q, wrong),  # (B, H, T, D)
        "K_rot": rotate(_qk_before_rope(trace, "K"), pos_k, wrong),  # (B, Hkv, S, D)
    }
    pairs = {
        "half": "dimension i with i + d/2 (HF's rotate_half, GPT-NeoX)",
        "interleaved": "dimension 2i with 2i+1 (GPT-J, Meta's view_as_complex)",
    }
    detail = (
        f"Your {{stage}} is what attn gets with RoPE in the {other} layout, pairing "
        f"{pairs[other]}, where the fixture's {rope.layout} layout pairs {pairs[rope.layout]}. "
        "The two give the same scores only if W_Q and W_K are permuted to match (HF's "
        "convert_llama_weights_to_hf permutes each head's columns [0, 2, 4, ..., 1, 3, 5, ...]). "
        f"Fix: rotate in the {rope.layout} layout, or permute the weights."
    )
    return [Change(detail, "Q_rot", values)]


def _rope_on_v(trace: Trace) -> list[Change]:
    inp = trace.inputs
    if inp.rope is None or inp.d_v < inp.rope.dims:
        return []  # a V narrower than the rotary dims would not even rotate
    _, pos_k = inp.token_positions()
    v = rotate(internal(trace, "V"), pos_k, inp.rope)  # (B, Hkv, S, Dv)
    detail = (
        "Your {stage} is what attn gets when V is rotated too. RoPE rotates only queries and "
        "keys, so that each score q·k depends on how far apart the two tokens are; the values "
        "carry content and are not rotated. Fix: apply RoPE to Q and K only."
    )
    return [Change(detail, "V", {"V": v})]


def _rope_not_on_k(trace: Trace) -> list[Change]:
    if trace.inputs.rope is None:
        return []
    detail = (
        "Your {stage} is what attn gets when RoPE rotates Q but not K. A score q·k then "
        "depends on the query's absolute position instead of the distance between query and "
        "key, which is the point of RoPE. Fix: rotate K too, at the key positions."
    )
    return [Change(detail, "K_rot", {"K_rot": _qk_before_rope(trace, "K")})]


# ---------------------------------------------------------------------------------------------
# Positions and the window


_SHIFTS = ((1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1))  # (queries, keys)


def _shift_text(dq: int, dk: int) -> str:
    if dq == dk:
        first = "1" if dq > 0 else "-1"
        return f"positions counted from {first} instead of 0 (queries and keys alike)"
    who, by = ("query", dq) if dq else ("key", dk)
    return f"the {who} positions shifted by {by:+d} relative to the others"


def _positions_off_by_one(trace: Trace) -> list[Change]:
    inp = trace.inputs
    if inp.rope is None and inp.alibi is None:
        return []  # a window alone read one off is a window off by one: see that mistake
    pos_q, pos_k = inp.token_positions()
    out: list[Change] = []
    for dq, dk in _SHIFTS:
        shifted = replace(inp, positions=pos_q + dq, key_positions=pos_k + dk)
        what = _shift_text(dq, dk)
        if dq == dk:  # distances unchanged: only Q_rot and K_rot show it, the rest is the trace's
            if inp.rope is not None:
                after = STAGE_NAMES[STAGE_NAMES.index("K_rot") + 1 :]
                values = {n: internal(trace, n) for n in after if n in trace}
                values["Q_rot"] = rotate(_qk_before_rope(trace, "Q"), pos_q + dq, inp.rope)
                values["K_rot"] = rotate(_qk_before_rope(trace, "K"), pos_k + dk, inp.rope)
                out.append(Change(_positions_detail("RoPE", what), "Q_rot", values))
            continue
        if inp.rope is not None:
            values = {
                "Q_rot": rotate(_qk_before_rope(trace, "Q"), pos_q + dq, inp.rope),
                "K_rot": rotate(_qk_before_rope(trace, "K"), pos_k + dk, inp.rope),
            }
            out.append(Change(_positions_detail("RoPE", what), "Q_rot", values))
        if inp.alibi is not None:
            values = {"alibi": alibi_stage(shifted)}
            out.append(Change(_positions_detail("ALiBi", what), "alibi", values))
        readers = [r for r, on in (("RoPE", inp.rope), ("ALiBi", inp.alibi)) if on is not None]
        if inp.causal is not None:
            readers.append("the causal mask" + (" and window" if inp.window else ""))
        if len(readers) > 1:
            start = "Q_rot" if inp.rope is not None else "alibi"
            detail = _positions_detail(" and ".join(readers), what)
            out.append(Change(detail, start, inputs=shifted))
    return out


def _positions_detail(readers: str, what: str) -> str:
    return (
        f"Your {{stage}} is what attn gets when {readers} read {what}. Positions are "
        "0-based: keys 0..seq_k-1, and queries 0..seq_q-1 (with lower-right causal, the last "
        "seq_q key positions, as a KV cache). Fix: use the same positions everywhere, from 0."
    )


def _window_off_by_one(trace: Trace) -> list[Change]:
    w = trace.inputs.window
    if w is None:
        return []
    out = []
    for wrong, rule in ((w + 1, f"<= {w}"), (w - 1, f"< {w - 1}")):
        if wrong < 1:
            continue
        detail = (
            f"Your {{stage}} is what attn gets with a window of {wrong} keys (0 <= pos_q - pos_k "
            f"{rule}) instead "
            f"of {w}: a query sees keys with 0 <= pos_q - pos_k < {w}, at most {w} keys "
            f"counting itself (HF/Mistral sliding_window; FlashAttention's window_size=({w - 1}, "
            f"0) is the same window). Fix: allowed = (0 <= pos_q - pos_k) & (pos_q - pos_k < {w})."
        )
        changed = replace(trace.inputs, window=wrong)
        out.append(Change(detail, "masked", inputs=changed))
    return out


def _causal_triu(trace: Trace) -> list[Change]:
    inp = trace.inputs
    if inp.causal is None:
        return []
    pos_q, pos_k = inp.token_positions()
    ahead = causal_allowed(-pos_q, -pos_k)  # (T, S): pos_k >= pos_q
    if inp.window is not None:
        reach = window_reach(inp.window, -pos_q, -pos_k)
        ahead &= window_allowed(-pos_q, -pos_k, reach)  # the window transposed too
    detail = (
        "Your {stage} is what attn gets with the causal mask built from triu where tril is "
        "meant: query i sees the keys j >= i (itself and the future) instead of j <= i (itself "
        "and the past); the mask is transposed. Fix: allowed = tril(ones(seq_q, seq_k)), or "
        "block where triu(ones, k=1)."
    )
    masked = masked_with(trace, with_causal(inp, ahead))
    return [Change(detail, "masked", {"masked": masked})]


# ---------------------------------------------------------------------------------------------
# Softcap, ALiBi, sinks


def _softcap_after_mask(trace: Trace) -> list[Change]:
    inp = trace.inputs
    if inp.softcap is None or softmax_input(inp) != "masked":
        return []
    alibi = internal(trace, "alibi") if inp.alibi is not None else None
    masked = apply_mask(
        internal(trace, "scaled"), allowed_positions(inp), inp.bias, alibi=alibi,
        fill=inp.mask_value,
    )  # fmt: skip
    capped = cap_scores(masked, inp.softcap)  # -inf -> -softcap
    weights = softmax_and_lse(capped, inp.sinks)[0]
    detail = (
        f"Your {{stage}} is what attn gets with the softcap applied after the mask: "
        f"{inp.softcap:g}·tanh(-inf/{inp.softcap:g}) = -{inp.softcap:g}, so the hidden keys get "
        "a little weight instead of none. Gemma 2 caps the scaled scores before the mask. Fix: "
        "capped = softcap * tanh(scaled / softcap), then mask."
    )
    return [
        Change(detail, "capped", {"capped": capped, "masked": m, "softmax": weights})
        for m in (masked, capped)  # your masked: before the cap, or the capped scores again
    ]


def _alibi_sign(trace: Trace) -> list[Change]:
    inp = trace.inputs
    if inp.alibi is None:
        return []
    flipped = replace(inp, alibi=-inp.alibi)
    detail = (
        "Your {stage} is what attn gets with the ALiBi bias added as +slope·|pos_q - pos_k|: "
        "distant keys gain weight instead of losing it. Fix: bias = -slope * |pos_q - pos_k|."
    )
    return [Change(detail, "alibi", {"alibi": alibi_stage(flipped)})]


def _sinks_left_out(trace: Trace) -> list[Change]:
    if trace.inputs.sinks is None:
        return []
    detail = (
        "Your {stage} is what attn gets when the sinks are left out of the softmax: each row "
        "sums to 1. gpt-oss joins one learned logit per head to every row, takes the softmax, "
        "and drops that column, so a row sums to less than 1. Fix: softmax over "
        "[scores, sink], then drop the sink's column."
    )
    start = softmax_input(trace.inputs)
    return [Change(detail, "softmax", {"softmax": softmax(internal(trace, start))})]


# ---------------------------------------------------------------------------------------------
# Heads, scale, weights


def _tile_kv(x: FloatArray, groups: int) -> FloatArray:
    """The mistaken expansion: query head h reads kv head h % Hkv ([0, 1, 0, 1])."""
    tiled: FloatArray = np.tile(x, (1, groups, 1, 1))  # (B, Hkv, S, D) -> (B, H, S, D)
    return tiled


def _gqa_tiled(trace: Trace) -> list[Change]:
    inp = trace.inputs
    groups = inp.heads // inp.kv_heads
    if groups == 1 or inp.kv_heads == 1:
        return []  # one kv head, or one query head per kv head: nothing to mix up
    tiled = [h % inp.kv_heads for h in range(inp.heads)]
    grouped = [h // groups for h in range(inp.heads)]
    detail = (
        f"Your {{stage}} is what attn gets when query head h reads kv head h % {inp.kv_heads} "
        f"({tiled}, torch .repeat or np.tile) instead of h // {groups} ({grouped}, "
        "repeat_interleave, as HF's repeat_kv): the query heads that share a kv head are "
        "neighbours. Fix: k.repeat_interleave(groups, dim=1), or np.repeat(k, groups, axis=1)."
    )
    return [Change(detail, "scores", expand=_tile_kv)]


def _scaled_by_d_model(trace: Trace) -> list[Change]:
    inp = trace.inputs
    # the model's width: X's, or without X the flat width of Q, heads·d_k
    what, width = ("d_model", inp.d_model) if inp.d_model else ("heads·d_k", inp.heads * inp.d_k)
    if trace.scale_source != "default" or width == inp.d_k:
        return []
    detail = (
        f"Your {{stage}} is what attn gets when the scores are multiplied by 1/√{what} = "
        f"1/√{width} instead of 1/√d_k = 1/√{inp.d_k}: d_k is the width of one head, not of "
        f"the model. Fix: scale = 1 / math.sqrt(d_k) = {1 / math.sqrt(inp.d_k):.6g}."
    )
    scaled = internal(trace, "scores") / math.sqrt(width)
    return [Change(detail, "scaled", {"scaled": scaled})]


def _x_w_transposed(trace: Trace) -> list[Change]:
    inp = trace.inputs
    if inp.mode != "projection":
        return []
    weights = {n: W for n in ("W_Q", "W_K", "W_V", "W_O") if (W := getattr(inp, n)) is not None}
    if any(weights[n].shape[0] != weights[n].shape[1] for n in ("W_Q", "W_K", "W_V")):
        return []  # X @ W.T of a weight that is not square does not even run
    square = [n for n, W in weights.items() if W.shape[0] == W.shape[1] and (W != W.T).any()]
    if not square:
        return []
    out = []
    for names in [square] + ([[name] for name in square] if len(square) > 1 else []):
        changed = replace(inp, **{name: getattr(inp, name).T for name in names})
        listed = ", ".join(names)
        detail = (
            f"Your {{stage}} is what attn gets with {listed} used transposed: X @ W.T, the "
            "nn.Linear habit (a torch Linear stores its weight as [out, in] and computes "
            "x @ weight.T). The fixture's weights are [in, out], as in the article: Q = X @ "
            "W_Q. It runs only because the weight is square. Fix: X @ W, or pass "
            "W.T as the Linear's weight."
        )
        start = "projected" if names == ["W_O"] else "Q"
        out.append(Change(detail, start, inputs=changed))
    return out


def projections(inputs: Inputs, X: FloatArray, X_kv: FloatArray | None) -> dict[str, FloatArray]:
    """Q, K and V from X (K, V from X_kv in cross-attention), split into heads."""
    out = {}
    for name, heads in (("Q", inputs.heads), ("K", inputs.kv_heads), ("V", inputs.kv_heads)):
        W, b = getattr(inputs, f"W_{name}"), getattr(inputs, f"b_{name}")
        source = X if name == "Q" or X_kv is None else X_kv
        out[name] = split_heads(project(source, W, b), heads)  # (B, heads, T, d)
    return out


def qk_norm(inputs: Inputs, name: str, x: FloatArray) -> FloatArray:
    """QK-norm of Q or K (B, heads, T, D), as the pipeline does it."""
    assert inputs.qk_norm is not None
    w = inputs.qk_norm.q_weight if name == "Q" else inputs.qk_norm.k_weight
    return norm_heads(x, w, inputs.qk_norm.eps)


VARIANT_MISTAKES = (
    VariantMistake("rope_layout", "RoPE half vs interleaved layout", _rope_layout),
    VariantMistake("rope_on_v", "RoPE applied to V as well", _rope_on_v),
    VariantMistake("rope_not_on_k", "RoPE not applied to K", _rope_not_on_k),
    VariantMistake("positions_off_by_one", "positions off by one", _positions_off_by_one),
    VariantMistake("window_off_by_one", "sliding window off by one", _window_off_by_one),
    VariantMistake("softcap_after_mask", "softcap applied after the mask", _softcap_after_mask),
    VariantMistake("alibi_sign", "ALiBi sign flipped (+slope·distance)", _alibi_sign),
    VariantMistake("gqa_tiled", "GQA heads tiled [0,1,0,1] instead of grouped [0,0,1,1]",
                   _gqa_tiled),
    VariantMistake("causal_triu", "causal mask from triu (transposed)", _causal_triu),
    VariantMistake("scaled_by_d_model", "scaled by 1/√d_model instead of 1/√d_k",
                   _scaled_by_d_model),
    VariantMistake("x_w_transposed", "weights used transposed (X @ W.T)", _x_w_transposed),
    VariantMistake("sinks_left_out", "sinks left out of the softmax (rows sum to 1)",
                   _sinks_left_out),
)  # fmt: skip
