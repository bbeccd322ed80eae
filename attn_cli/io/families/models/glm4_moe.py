"""GLM-4.5 (glm4_moe): q/k/v biases (attention_bias), no output bias; an RMSNorm of each head's q
and k before RoPE when use_qk_norm; rotate_half RoPE (unlike GLM-4's interleaved pairs) on the
first partial_rotary_factor (0.5) of each head. Past attention: Llama's block, a dense MLP below
first_k_dense_replace, above it DeepSeek V3's mixture (the sigmoid router whose choice
e_score_correction_bias moves, routed_scaling_factor) plus the shared experts on every token."""

from __future__ import annotations

from dataclasses import replace

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block, TensorOf
from attn_cli.io.families.config import Config
from attn_cli.io.families.decoder import family, llama_like
from attn_cli.io.families.experts import each_expert, shared_mlp
from attn_cli.io.families.keys import LLAMA_ASSUMED, LLAMA_READS, Keys, Need
from attn_cli.io.families.models.deepseek import expert_groups
from attn_cli.io.families.models.qwen3 import QK_RMS_NORM
from attn_cli.io.families.plan import Experts, Grouped, LayerPlan

NAME = "glm4_moe"
ARCH = Arch(eps=("rms_norm_eps", 1e-5), o_bias=False, partial=0.5)
QK_ARCH = replace(ARCH, variants=(QK_RMS_NORM,))  # use_qk_norm true


def plan(config: Config, layer: int) -> LayerPlan:
    """Layer ``layer``'s attention: with q_norm and k_norm only where use_qk_norm builds them."""
    return llama_like(QK_ARCH if config.flag("use_qk_norm", False) else ARCH, NAME, config, layer)


def experts(cfg: Config, plan: LayerPlan, t: TensorOf) -> Experts | None:
    """Glm4MoeMoE from layer first_k_dense_replace on (a dense MLP below): Glm4MoeTopkRouter
    (DeepSeek V3's), the routed experts, and the shared experts (one MLP n_shared_experts ×
    moe_intermediate_size wide, ungated) added to every token."""
    C = plan.hidden
    if plan.layer < cfg.whole("first_k_dense_replace", 1, minimum=0):
        return None
    E, F = cfg.whole("n_routed_experts", 128), cfg.whole("moe_intermediate_size", 1408)
    k = cfg.whole("num_experts_per_tok", 8)
    grouped = Grouped(
        t("router.correction", "mlp.gate.e_score_correction_bias", E),
        expert_groups(cfg, E, (1, 1)),
        cfg.number("routed_scaling_factor", 1.0),
    )
    return Experts(
        t("router", "mlp.gate.weight", E, C),
        each_expert(t, F, C),
        E,
        min(k, E),
        cfg.flag("norm_topk_prob", True),
        grouped=grouped,
        plain_shared=shared_mlp(t, "mlp.shared_experts.", F * cfg.whole("n_shared_experts", 1), C),
    )


KEYS = Keys(
    reads=LLAMA_READS
    | {
        "attention_bias",
        "partial_rotary_factor",
        "use_qk_norm",
        "first_k_dense_replace",
        "n_routed_experts",
        "n_shared_experts",
        "routed_scaling_factor",
        "n_group",
        "topk_group",
    },
    # the multi-token prediction layers (drafting only: not in the forward)
    inert=frozenset({"num_nextn_predict_layers", "num_mtp_layers"}),
    needs=tuple(Need((k,)) for k in ("use_qk_norm", "partial_rotary_factor")),
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block(eps=1e-5, experts=experts)
FAMILY = replace(
    family(
        NAME,
        ARCH,
        KEYS,
        BLOCK,
        hf_class="Glm4MoeForCausalLM",
        shows="QK-norm (when use_qk_norm), partial RoPE (rotate_half); the MoE with shared "
        "experts and the corrected sigmoid router in the forward",
    ),
    plan=plan,
)
