"""Qwen2-MoE: Qwen2's attention (qkv_bias), a sparse MLP with a gated shared expert."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.experts import QwenMoE, qwen_experts
from attn_cli.io.families.keys import Need
from attn_cli.io.families.models import qwen2

ARCH = Arch(
    qkv_bias="qkv_bias",
    o_bias=False,
    bias_default=True,
    window="even_below_max_window_layers",
    window_flag=True,
)
KEYS = replace(  # Qwen2's, and qkv_bias in place of Qwen2's biases always on
    qwen2.KEYS,
    reads=qwen2.KEYS.reads | {"qkv_bias"},
    needs=(*qwen2.KEYS.needs, Need(("qkv_bias",))),
)
BLOCK = Block(experts=partial(qwen_experts, QwenMoE(60, 4, False)))
FAMILY = family(
    "qwen2_moe",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="Qwen2MoeForCausalLM",
    shows="q/k/v biases, windows; the MoE and shared expert in the forward",
)
