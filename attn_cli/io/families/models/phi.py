"""Phi (1, 1.5, 2): LayerNorm, partial rotary, attention and MLP in parallel; with qk_layernorm
one LayerNorm (with a bias) of every head of q and of k before RoPE (stablelm.py's
``qk_layer_norm``, shared by all heads)."""

from __future__ import annotations

from dataclasses import replace

from attn_cli.io.families.arch import LAYER_NORM
from attn_cli.io.families.blocks import LayerNormBlock
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import ROTARY, SIZES, Keys, Need
from attn_cli.io.families.models.stablelm import flagged, qk_layer_norm

ARCH = replace(
    LAYER_NORM,
    eps=("layer_norm_eps", 1e-5),
    qkv_bias=True,
    o_bias=True,
    partial=0.5,
    o_name="dense",
)
KEYS = Keys(
    reads=SIZES | ROTARY | {"layer_norm_eps", "partial_rotary_factor", "qk_layernorm"},
    needs=(Need(("partial_rotary_factor",)),),
    assumed=("layer_norm_eps", "rope_theta"),
)
BLOCK = LayerNormBlock(
    parallel="always",
    always_bias=True,
    act="gelu_new",
    final="final_layernorm",
    head_bias=True,
)
FAMILY = replace(
    family(
        "phi",
        ARCH,
        KEYS,
        BLOCK,
        hf_class="PhiForCausalLM",
        shows="partial rotary, biases, q/k LayerNorm (qk_layernorm); a parallel block",
    ),
    plan=flagged(ARCH, qk_layer_norm(per_head=False, bias=True), "phi"),
)
