"""Granite: attention_multiplier as the scale, embedding, residual and logits multipliers."""

from __future__ import annotations

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, LLAMA_ASSUMED, LLAMA_READS, NO_WINDOW, Keys, Need

ARCH = Arch(scale="attention_multiplier", embed="multiplier")
KEYS = Keys(
    reads=LLAMA_READS | {"attention_bias", "attention_multiplier", "embedding_multiplier"},
    inert=frozenset({"residual_multiplier"}),  # on the residual branches, after attention
    ignored={"partial_rotary_factor": FULL_ROPE, "sliding_window": NO_WINDOW},
    needs=(Need(("attention_multiplier",)),),
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block(eps_key=ARCH.eps, down_first=False, residual=True, divide=True)
FAMILY = family(
    "granite",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="GraniteForCausalLM",
    shows="the attention_multiplier scale, embedding_multiplier",
)
