"""Qwen2: q/k/v biases, a window from max_window_layers on when use_sliding_window."""

from __future__ import annotations

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import (
    FULL_ROPE,
    LLAMA_ASSUMED,
    LLAMA_READS,
    NO_BIAS,
    QWEN_NEEDS,
    WINDOWED,
    Keys,
)

ARCH = Arch(qkv_bias=True, o_bias=False, window="from_max_window_layers", window_flag=True)
KEYS = Keys(
    reads=LLAMA_READS | WINDOWED | {"use_sliding_window", "max_window_layers"},
    ignored={"partial_rotary_factor": FULL_ROPE, "attention_bias": NO_BIAS},
    needs=QWEN_NEEDS,
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block()
FAMILY = family(
    "qwen2",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="Qwen2ForCausalLM",
    shows="q/k/v biases; a window on the layers past max_window_layers",
)
