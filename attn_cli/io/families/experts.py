"""The mixtures of experts families share, for the NumPy forward: Mixtral's block_sparse_moe
and Qwen's sparse MLP (with Qwen2-MoE's and Qwen3-Next's gated shared expert), and Llama 4's,
computed whole (``Llama4Mixture``). A family module gives the one it has as its ``Block``'s
experts (``partial(qwen_experts, QwenMoE(...))``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from attn_cli.core import forward as fw
from attn_cli.core import ops
from attn_cli.io.families.blocks import TensorOf
from attn_cli.io.families.config import Config
from attn_cli.io.families.plan import Experts, FloatArray, LayerPlan, MixtureReads, Tensor


def each_expert(t: TensorOf, F: int, C: int) -> Callable[[int], tuple[Tensor, ...]]:
    """Expert e's gate, up and down projections (mlp.experts.e.*_proj: Qwen's, DeepSeek's)."""
    return lambda e: (
        t(f"e{e}.gate", f"mlp.experts.{e}.gate_proj.weight", F, C),
        t(f"e{e}.up", f"mlp.experts.{e}.up_proj.weight", F, C),
        t(f"e{e}.down", f"mlp.experts.{e}.down_proj.weight", C, F),
    )


def shared_mlp(t: TensorOf, a: str, S: int, C: int) -> tuple[Tensor, Tensor, Tensor]:
    """A shared expert's gate, up and down projections under ``a``, S wide."""
    return (
        t("s.gate", f"{a}gate_proj.weight", S, C),
        t("s.up", f"{a}up_proj.weight", S, C),
        t("s.down", f"{a}down_proj.weight", C, S),
    )


@dataclass(frozen=True)
class QwenMoE:
    """A Qwen sparse MLP's config class defaults, and whether it has a gated shared expert."""

    experts: int  # num_experts
    k: int  # num_experts_per_tok
    normalize: bool  # norm_topk_prob
    shared: bool = True


def mixtral_experts(cfg: Config, plan: LayerPlan, t: TensorOf) -> Experts:
    """Mixtral's block_sparse_moe on every layer: w1 (gate), w3 (up), w2 (down) per expert."""
    C = plan.hidden
    E, F = cfg.whole("num_local_experts", 8), cfg.whole("intermediate_size")
    k = cfg.whole("num_experts_per_tok", 2)
    a = "block_sparse_moe."
    return Experts(
        t("router", f"{a}gate.weight", E, C),
        lambda e: (
            t(f"e{e}.gate", f"{a}experts.{e}.w1.weight", F, C),
            t(f"e{e}.up", f"{a}experts.{e}.w3.weight", F, C),
            t(f"e{e}.down", f"{a}experts.{e}.w2.weight", C, F),
        ),
        E,
        min(k, E),
        True,
    )


def qwen_experts(moe: QwenMoE, cfg: Config, plan: LayerPlan, t: TensorOf) -> Experts | None:
    """Qwen's sparse MLP, or None for a dense MLP (Qwen's mlp_only_layers and
    decoder_sparse_step)."""
    C, layer = plan.hidden, plan.layer
    E_default, k_default, normalize = moe.experts, moe.k, moe.normalize
    key = "num_local_experts" if cfg.has("num_local_experts") else "num_experts"  # 5's and 4's
    E = cfg.whole(key, E_default, minimum=0)
    only = cfg.data.get("mlp_only_layers") or []
    if not isinstance(only, list) or any(type(i) is not int for i in only):
        raise cfg.error("mlp_only_layers", f"got {only!r}", "a list of layer numbers")
    if layer in only or E == 0 or (layer + 1) % cfg.whole("decoder_sparse_step", 1) != 0:
        return None
    F = cfg.whole("moe_intermediate_size")
    k = cfg.whole("num_experts_per_tok", k_default)
    shared = None
    if moe.shared:  # Qwen2-MoE's and Qwen3-Next's gated shared expert
        S = cfg.whole("shared_expert_intermediate_size")
        gate = t("s.sigmoid", "mlp.shared_expert_gate.weight", 1, C)
        shared = (*shared_mlp(t, "mlp.shared_expert.", S, C), gate)
    return Experts(
        t("router", "mlp.gate.weight", E, C),
        each_expert(t, F, C),
        E,
        min(k, E),
        cfg.flag("norm_topk_prob", normalize),
        shared,
    )


# ---------------------------------------------------------------------------------------------
# Llama 4's mixture (transformers 5.25 modeling_llama4.py: Llama4Router, Llama4TextMoe,
# Llama4TextExperts)


def route_sigmoid_top(
    logits: FloatArray, k: int
) -> tuple[np.ndarray[Any, np.dtype[np.intp]], FloatArray]:
    """Llama 4's router on its logits [T, E]: the top ``k`` logits per token (largest first),
    their weights sigmoid(logit) (the others' sigmoid(-inf) = 0): no softmax, no renormalising."""
    x: np.ndarray[Any, np.dtype[np.float64]] = np.asarray(logits, dtype=np.float64)  # (T, E)
    chosen = np.argsort(-x, axis=-1, kind="stable")[:, :k]  # (T, k)
    weights: FloatArray = ops.sigmoid(np.take_along_axis(x, chosen, axis=-1))  # (T, k)
    return chosen, weights


@dataclass(frozen=True)
class Llama4Mixture:
    """Llama4TextMoe: each chosen expert takes the token SCALED by its router weight
    (expert(w · h), not w · expert(h)), its gate_up_proj [C, 2F] the gate's columns then the
    up's; plus the shared expert (an ungated gate/up/down MLP) on every token."""

    router: Tensor  # (E, C)
    gate_up: Tensor  # (E, C, 2F)
    down: Tensor  # (E, F, C)
    shared: tuple[Tensor, Tensor, Tensor]  # gate (S, C), up (S, C), down (C, S)
    k: int

    def tensors(self) -> tuple[Tensor, ...]:
        return (self.gate_up, self.down, *self.shared)

    def held(self) -> tuple[Tensor, ...]:
        """One expert's row of each stacked tensor (read one at a time), the shared expert."""
        rows = (replace(t, shape=t.shape[1:]) for t in (self.gate_up, self.down))
        return (*rows, *self.shared)

    def __call__(self, h: FloatArray, reads: MixtureReads) -> FloatArray:
        act = reads.act
        chosen, weights = route_sigmoid_top(h @ reads.whole(self.router).T, self.k)  # (T, k)
        out = np.zeros_like(h)  # (T, C)
        for e in np.unique(chosen):
            tokens, slot = np.nonzero(chosen == e)  # the tokens that chose e, and in which place
            scaled = h[tokens] * weights[tokens, slot][:, None]  # (n, C): the input scaled
            gate_up = scaled @ reads.row(self.gate_up, int(e))  # (n, 2F)
            gate, up = np.split(gate_up, 2, axis=-1)  # (n, F) each: the gate's columns first
            out[tokens] += (up * act(gate)) @ reads.row(self.down, int(e))  # (n, C)
        gate_w, up_w, down_w = (reads.whole(t) for t in self.shared)
        shared: FloatArray = fw.gated_mlp(h, gate_w.T, up_w.T, down_w.T, act)  # (T, C)
        return out + shared
