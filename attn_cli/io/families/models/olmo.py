"""OLMo: a LayerNorm without weight or bias before attention; ``clip_qkv`` clamps Q, K and V
right after the projections (the clip_qkv variant)."""

from __future__ import annotations

from typing import Any

from attn_cli.io.families.arch import Arch, FamilyVariant
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.config import Config
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, ROTARY, SIZES, Keys


def _clip(config: Config, eps: float) -> Any:
    """OlmoAttention's clamp bound, or None where clip_qkv is null (no clamp)."""
    if not config.has("clip_qkv"):
        return None
    return config.number("clip_qkv", 0.0)


CLIP_QKV = FamilyVariant("clip_qkv", _clip)
ARCH = Arch(eps=(None, 1e-5), norm="layer", norm_weight=False, variants=(CLIP_QKV,))
KEYS = Keys(
    reads=SIZES | ROTARY | {"attention_bias", "clip_qkv"},
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
    shows="LayerNorm without parameters, clip_qkv (Q, K, V clamped)",
)
