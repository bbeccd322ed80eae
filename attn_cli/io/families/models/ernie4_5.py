"""ERNIE 4.5: RoPE on interleaved pairs, use_bias."""

from __future__ import annotations

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, LLAMA_ASSUMED, LLAMA_READS, NO_BIAS, Keys, Need

ARCH = Arch(
    head_dim=128,
    theta=5e5,
    eps=("rms_norm_eps", 1e-5),
    qkv_bias="use_bias",
    o_bias="use_bias",
    layout="interleaved",
)
KEYS = Keys(
    reads=LLAMA_READS | {"use_bias"},
    ignored={"partial_rotary_factor": FULL_ROPE, "attention_bias": NO_BIAS},
    needs=(Need(("head_dim",)),),
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block(eps_key=ARCH.eps, down_first=False, bias_key="use_bias")
FAMILY = family(
    "ernie4_5",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="Ernie4_5ForCausalLM",
    shows="interleaved RoPE",
    arch_refused="ernie4_5's RoPE on interleaved pairs shows in no config.json key, so "
    "--arch ernie4_5 cannot tell an ERNIE 4.5 from a Llama",
)
