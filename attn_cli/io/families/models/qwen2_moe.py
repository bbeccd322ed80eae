"""Qwen2-MoE: Qwen2's attention (qkv_bias), a sparse MLP with a gated shared expert."""

from __future__ import annotations

from functools import partial

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.experts import QwenMoE, qwen_experts
from attn_cli.io.families.keys import (
    FULL_ROPE,
    LLAMA_ASSUMED,
    LLAMA_READS,
    NO_BIAS,
    QWEN_NEEDS,
    WINDOWED,
    Keys,
    Need,
)

ARCH = Arch(
    qkv_bias="qkv_bias", o_bias=False, bias_default=True, window="qwen2_moe", window_flag=True
)
KEYS = Keys(
    reads=LLAMA_READS | WINDOWED | {"use_sliding_window", "max_window_layers", "qkv_bias"},
    ignored={"partial_rotary_factor": FULL_ROPE, "attention_bias": NO_BIAS},
    needs=(*QWEN_NEEDS, Need(("qkv_bias",))),
    assumed=LLAMA_ASSUMED,
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
