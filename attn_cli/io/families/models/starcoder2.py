"""StarCoder2: LayerNorm with biases, use_bias on every projection, a window."""

from __future__ import annotations

from dataclasses import replace

from attn_cli.io.families.arch import LAYER_NORM
from attn_cli.io.families.blocks import LayerNormBlock
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, NO_BIAS, ROTARY, SIZES, Keys, Need

ARCH = replace(
    LAYER_NORM,
    eps=("norm_epsilon", 1e-5),
    qkv_bias="use_bias",
    o_bias="use_bias",
    bias_default=True,
    window="all",
    window_default=None,
)
KEYS = Keys(
    reads=SIZES | ROTARY | {"norm_epsilon", "use_bias", "sliding_window"},
    ignored={"partial_rotary_factor": FULL_ROPE, "attention_bias": NO_BIAS},
    needs=(Need(("use_bias",)),),
    assumed=("norm_epsilon", "rope_theta"),
)
BLOCK = LayerNormBlock(mlp=("mlp.c_fc.", "mlp.c_proj."))
FAMILY = family(
    "starcoder2",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="Starcoder2ForCausalLM",
    shows="LayerNorm, biases, a sliding window",
)
