"""OLMo: a LayerNorm without weight or bias before attention."""

from __future__ import annotations

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, ROTARY, SIZES, Keys

ARCH = Arch(eps=(None, 1e-5), norm="layer", norm_weight=False)
KEYS = Keys(
    reads=SIZES | ROTARY | {"attention_bias"},
    ignored={"partial_rotary_factor": FULL_ROPE},
    assumed=("rope_theta",),
)
BLOCK = Block(eps_key=ARCH.eps, weightless=True, down_first=False, bias_key=None)
FAMILY = family(
    "olmo",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="OlmoForCausalLM",
    shows="LayerNorm without parameters",
)
