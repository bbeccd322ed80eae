"""Cohere (Command R): LayerNorm without bias, RoPE on interleaved pairs, a parallel block;
with use_qk_norm a LayerNorm without bias of each head of q and k before RoPE (the
qk_layernorm variant, its weights stored as q_norm / k_norm [heads, head_dim])."""

from __future__ import annotations

from dataclasses import replace

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import LayerNormBlock
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, ROTARY, SIZES, Keys
from attn_cli.io.families.models.stablelm import flagged, qk_layer_norm

ARCH = Arch(theta=5e5, eps=("layer_norm_eps", 1e-5), norm="layer", layout="interleaved")
KEYS = Keys(
    reads=SIZES | ROTARY | {"layer_norm_eps", "attention_bias", "use_qk_norm"},
    ignored={"partial_rotary_factor": FULL_ROPE},
    assumed=("layer_norm_eps", "rope_theta"),
)
COHERE_BLOCK = LayerNormBlock(parallel="always", norm_bias=False, gated=True, logit_scale=True)
BLOCK = COHERE_BLOCK
NORM_PER_HEAD = qk_layer_norm(per_head=True, bias=False, suffix="norm")
FAMILY = replace(
    family(
        "cohere",
        ARCH,
        KEYS,
        BLOCK,
        hf_class="CohereForCausalLM",
        shows="interleaved RoPE; a parallel block, logit_scale; q/k LayerNorm per head "
        "(use_qk_norm)",
    ),
    plan=flagged(ARCH, NORM_PER_HEAD, "cohere", key="use_qk_norm"),
)
