"""Phi-3: a fused qkv_proj (Q | K | V rows), longrope, a fused gate_up_proj."""

from __future__ import annotations

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import LLAMA_ASSUMED, LLAMA_READS, NO_BIAS, Keys

ARCH = Arch(
    eps=("rms_norm_eps", 1e-5),
    qkv_bias=False,
    o_bias=False,
    partial=1.0,
    window="all",
    window_default=None,
    fused="rows",
    fixed_original=True,
    renamed_ropes=(("su", "longrope"), ("yarn", "longrope")),
)
KEYS = Keys(
    reads=LLAMA_READS
    | {"sliding_window", "original_max_position_embeddings", "partial_rotary_factor"},
    # in Phi-4-mini's config.json, never read by transformers' phi3 (its layers have no biases)
    inert=frozenset({"full_attn_mod", "interpolate_factor", "lm_head_bias"}),
    ignored={"attention_bias": NO_BIAS},
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block(eps=1e-5, fused=True, no_bias="false (Phi-3's MLP has no biases)")
FAMILY = family(
    "phi3",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="Phi3ForCausalLM",
    shows="the fused qkv split, partial rotary, longrope",
)
