"""Ministral: Mistral with a window on the layers layer_types slides."""

from __future__ import annotations

from dataclasses import replace

from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import (
    FULL_ROPE,
    LLAMA_ASSUMED,
    LLAMA_READS,
    NO_BIAS,
    WINDOWED,
    Keys,
    Need,
)
from attn_cli.io.families.models.mistral import MISTRAL

ARCH = replace(MISTRAL, window="when_given")
KEYS = Keys(
    reads=LLAMA_READS | WINDOWED,
    ignored={"partial_rotary_factor": FULL_ROPE, "attention_bias": NO_BIAS},
    needs=(Need(("head_dim",)), Need(("sliding_window",))),
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block(eps_key=ARCH.eps, down_first=False, bias_key=None)
FAMILY = family(
    "ministral",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="MinistralForCausalLM",
    shows="sliding and full layers",
)
