"""GLM-4.5 (glm4_moe): q/k/v biases (attention_bias), no output bias; an RMSNorm of each head's q
and k before RoPE when use_qk_norm; rotate_half RoPE (unlike GLM-4's interleaved pairs) on the
first partial_rotary_factor (0.5) of each head. Past attention: Llama's block, a dense MLP below
first_k_dense_replace, above it DeepSeek V3's mixture (the sigmoid router whose choice
e_score_correction_bias moves, routed_scaling_factor) plus the shared experts on every token."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.config import Config
from attn_cli.io.families.decoder import family, llama_like
from attn_cli.io.families.keys import LLAMA_ASSUMED, LLAMA_READS, Keys, Need
from attn_cli.io.families.models.deepseek import V3MoE, v3_mixture
from attn_cli.io.families.models.qwen3 import QK_RMS_NORM
from attn_cli.io.families.plan import LayerPlan

NAME = "glm4_moe"
ARCH = Arch(eps=("rms_norm_eps", 1e-5), o_bias=False, partial=0.5)
QK_ARCH = replace(ARCH, variants=(QK_RMS_NORM,))  # use_qk_norm true


def plan(config: Config, layer: int) -> LayerPlan:
    """Layer ``layer``'s attention: with q_norm and k_norm only where use_qk_norm builds them."""
    return llama_like(QK_ARCH if config.flag("use_qk_norm", False) else ARCH, NAME, config, layer)


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
# Glm4MoeMoE: Glm4MoeTopkRouter is DeepSeek V3's
BLOCK = Block(eps=1e-5, experts=partial(v3_mixture, V3MoE(1, 128, 1408, (1, 1), 1.0)))
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
