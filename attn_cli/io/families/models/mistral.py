"""Mistral: Llama with a sliding window on every layer and no attention biases."""

from __future__ import annotations

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import (
    FULL_ROPE,
    LLAMA_ASSUMED,
    LLAMA_READS,
    NO_BIAS,
    Keys,
    Need,
    Rule,
)

MISTRAL = Arch(qkv_bias=False, o_bias=False, window="all")
ARCH = MISTRAL
KEYS = Keys(
    reads=LLAMA_READS | {"sliding_window"},
    ignored={
        "partial_rotary_factor": FULL_ROPE,
        "attention_bias": NO_BIAS,
        "layer_types": Rule((None,), "transformers' mistral slides every layer"),
    },
    needs=(Need(("sliding_window",)),),
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block()
FAMILY = family(
    "mistral",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="MistralForCausalLM",
    shows="a sliding window on every layer",
)
