"""Qwen3-MoE: Qwen3's attention, a sparse MLP without a shared expert."""

from __future__ import annotations

from functools import partial

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.experts import QwenMoE, qwen_experts
from attn_cli.io.families.keys import EVERY_LAYER, FULL_ROPE, LLAMA_ASSUMED, LLAMA_READS, Keys, Need
from attn_cli.io.families.models.qwen3 import QK_RMS_NORM

ARCH = Arch(variants=(QK_RMS_NORM,), window="all", window_flag=True)
KEYS = Keys(
    reads=LLAMA_READS | {"use_sliding_window", "sliding_window", "attention_bias"},
    ignored={
        "partial_rotary_factor": FULL_ROPE,
        "max_window_layers": EVERY_LAYER,
        "layer_types": EVERY_LAYER,
    },
    needs=(Need(("sliding_window",), when="use_sliding_window"),),
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block(experts=partial(qwen_experts, QwenMoE(128, 8, False, shared=False)))
FAMILY = family(
    "qwen3_moe",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="Qwen3MoeForCausalLM",
    shows="QK-norm; the MoE in the forward",
)
