"""Llama: the base every decoder here differs from by a table."""

from __future__ import annotations

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, LLAMA_ASSUMED, LLAMA_READS, Keys, Rule

ARCH = Arch()
KEYS = Keys(
    reads=LLAMA_READS | {"attention_bias"},
    ignored={
        "partial_rotary_factor": FULL_ROPE,
        "sliding_window": Rule((None,), "transformers' llama has no sliding window"),
    },
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block()
FAMILY = family(
    "llama",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="LlamaForCausalLM",
    shows="GQA, RoPE (and its scalings), RMSNorm before attention",
)
