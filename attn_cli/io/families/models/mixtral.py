"""Mixtral: Mistral's attention, a mixture of eight experts in place of the MLP."""

from __future__ import annotations

from dataclasses import replace

from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.experts import mixtral_experts
from attn_cli.io.families.keys import FULL_ROPE, LLAMA_ASSUMED, LLAMA_READS, NO_BIAS, Keys, Rule
from attn_cli.io.families.models.mistral import MISTRAL

ARCH = replace(MISTRAL, theta=1e6, eps=("rms_norm_eps", 1e-5), window_default=None)
KEYS = Keys(
    reads=LLAMA_READS | {"sliding_window"},
    ignored={
        "partial_rotary_factor": FULL_ROPE,
        "attention_bias": NO_BIAS,
        "layer_types": Rule((None,), "transformers' mixtral slides every layer"),
    },
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block(experts=mixtral_experts)
FAMILY = family(
    "mixtral",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="MixtralForCausalLM",
    shows="a sliding window (when given); the MoE in the forward",
)
