"""Gemma: RMSNorm scaling by 1 + weight, embeddings times sqrt(hidden), head_dim 256."""

from __future__ import annotations

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, LLAMA_ASSUMED, LLAMA_READS, Keys, Need

GEMMA = Arch(head_dim=256, norm="rms1p", embed="sqrt")
ARCH = GEMMA
KEYS = Keys(
    reads=LLAMA_READS | {"attention_bias", "use_bidirectional_attention"},
    ignored={"partial_rotary_factor": FULL_ROPE},
    needs=(Need(("head_dim",)),),
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block(norm="rms1p")
FAMILY = family(
    "gemma",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="GemmaForCausalLM",
    shows="RMSNorm (1 + weight), the embedding scale",
    arch_refused="gemma's RMSNorm (1 + weight) and embedding scale show in no config.json key, so "
    "--arch gemma cannot tell a Gemma from a Llama",
)
