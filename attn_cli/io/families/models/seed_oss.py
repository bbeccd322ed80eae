"""Seed-OSS: Llama with q/k/v biases (attention_bias, on by default) and an output projection
whose bias has its own key (attention_out_bias, off by default); RoPE theta 1e7 as shipped."""

from __future__ import annotations

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, LLAMA_ASSUMED, LLAMA_READS, Keys, Need, Rule

ARCH = Arch(
    head_dim=128,
    qkv_bias="attention_bias",
    o_bias="attention_out_bias",
    bias_default=True,
    o_bias_default=False,
)
KEYS = Keys(
    reads=LLAMA_READS | {"attention_bias", "attention_out_bias"},
    # residual_dropout and attention_dropout end in "dropout": off in eval, as for every family
    inert=frozenset({"pretraining_tp"}),
    ignored={
        "partial_rotary_factor": FULL_ROPE,
        "sliding_window": Rule((None,), "transformers' seed_oss has no sliding window"),
    },
    # read as seed_oss, a checkpoint says its head size and biases (the defaults, 128 and on,
    # are Seed-OSS's own)
    needs=(Need(("head_dim",)), Need(("attention_bias",))),
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block()
FAMILY = family(
    "seed_oss",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="SeedOssForCausalLM",
    shows="q/k/v biases without an output bias (attention_out_bias)",
)
