"""Cohere (Command R): LayerNorm without bias, RoPE on interleaved pairs, a parallel block."""

from __future__ import annotations

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import LayerNormBlock
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, ROTARY, SIZES, Keys

ARCH = Arch(theta=5e5, eps=("layer_norm_eps", 1e-5), norm="layer", layout="interleaved")
KEYS = Keys(
    reads=SIZES | ROTARY | {"layer_norm_eps", "attention_bias"},
    ignored={"partial_rotary_factor": FULL_ROPE},
    assumed=("layer_norm_eps", "rope_theta"),
)
COHERE_BLOCK = LayerNormBlock(parallel="always", norm_bias=False, gated=True, logit_scale=True)
BLOCK = COHERE_BLOCK
FAMILY = family(
    "cohere",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="CohereForCausalLM",
    shows="interleaved RoPE; a parallel block, logit_scale",
)
