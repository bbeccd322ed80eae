"""Qwen3: Qwen2 with an RMSNorm of each head's q and k before RoPE, no biases by default."""

from __future__ import annotations

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import (
    FULL_ROPE,
    LLAMA_ASSUMED,
    LLAMA_READS,
    QWEN_NEEDS,
    WINDOWED,
    Keys,
    Need,
)

ARCH = Arch(head_dim=128, qk_norm="rms", window="from_max_window_layers", window_flag=True)
KEYS = Keys(
    reads=LLAMA_READS | WINDOWED | {"use_sliding_window", "max_window_layers", "attention_bias"},
    ignored={"partial_rotary_factor": FULL_ROPE},
    needs=(*QWEN_NEEDS, Need(("head_dim",))),
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block()
FAMILY = family(
    "qwen3",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="Qwen3ForCausalLM",
    shows="QK-norm (RMSNorm per head), windows",
)
