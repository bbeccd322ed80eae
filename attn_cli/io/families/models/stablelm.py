"""StableLM: LayerNorm, a quarter of each head rotated, use_parallel_residual."""

from __future__ import annotations

from dataclasses import replace

from attn_cli.io.families.arch import LAYER_NORM
from attn_cli.io.families.blocks import LayerNormBlock
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import ROTARY, SIZES, Keys, Need

ARCH = replace(
    LAYER_NORM,
    eps=("layer_norm_eps", 1e-5),
    qkv_bias="use_qkv_bias",
    o_bias=False,
    partial=0.25,
    reads_head_dim=False,
)
KEYS = Keys(
    reads=SIZES - {"head_dim"}
    | ROTARY
    | {"layer_norm_eps", "use_qkv_bias", "partial_rotary_factor"},
    inert=frozenset({"use_parallel_residual"}),  # the MLP beside attention, or after it
    needs=(Need(("partial_rotary_factor",)),),
    assumed=("layer_norm_eps", "rope_theta"),
)
BLOCK = LayerNormBlock(parallel="flag", gated=True)
FAMILY = family(
    "stablelm",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="StableLmForCausalLM",
    shows="partial rotary, q/k/v biases (use_qkv_bias)",
)
