"""Qwen3: Qwen2 with an RMSNorm of each head's q and k before RoPE, no biases by default."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from attn_cli.io.families.arch import Arch, FamilyVariant
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.config import Config
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import (
    FULL_ROPE,
    LLAMA_ASSUMED,
    LLAMA_READS,
    QWEN_NEEDS,
    WINDOWED,
    Keys,
    Need,
)
from attn_cli.io.families.plan import FloatArray, FromTensors, Tensor


def qk_rms_norm(
    *,
    plus_one: bool = False,
    whole: bool = False,
    who: str = "",
    variant: str = "qk_norm",
    names: tuple[str, str] = ("q_norm", "k_norm"),
) -> FamilyVariant:
    """The qk_norm variant as the QK-norm families read it: an RMSNorm of q and k before RoPE,
    each head's (Qwen3) or the whole projection's (``whole``: OLMo 2 and 3), its weights
    q_norm and k_norm, the eps the layer's norms'. ``plus_one``: the norm scales by 1 + weight
    (Gemma 3, Qwen3-Next), which the fixture's weights hold, as the note says (naming ``who``,
    else the family). ``variant`` and ``names``: another variant with the same setting, read from
    other modules (HunYuan's post_rope_norm from query_layernorm and key_layernorm)."""
    plus = 1.0 if plus_one else 0.0
    q_name, k_name = names

    def setting(config: Config, eps: float) -> FromTensors:
        def make(t: Mapping[str, FloatArray], w: Mapping[str, FloatArray]) -> dict[str, Any]:
            return {
                "q_weight": plus + t[f"{q_name}.weight"].astype(np.float64),
                "k_weight": plus + t[f"{k_name}.weight"].astype(np.float64),
                "eps": eps,
            }

        return FromTensors(make)

    def tensors(a: str, sizes: tuple[int, int, int, int]) -> tuple[Tensor, ...]:
        _, H, Hkv, D = sizes
        q, k = ((H * D,), (Hkv * D,)) if whole else ((D,), (D,))
        return (
            Tensor(f"{q_name}.weight", f"{a}{q_name}.weight", q),
            Tensor(f"{k_name}.weight", f"{a}{k_name}.weight", k),
        )

    def note(family: str) -> str:
        return (
            f"q_norm / k_norm scale by 1 + weight ({who or family}): the fixture holds 1 + weight"
        )

    return FamilyVariant(variant, setting, tensors, note if plus_one else None)


QK_RMS_NORM = qk_rms_norm()  # Qwen3's: each head's q and k
ARCH = Arch(
    head_dim=128, variants=(QK_RMS_NORM,), window="from_max_window_layers", window_flag=True
)
KEYS = Keys(
    reads=LLAMA_READS | WINDOWED | {"use_sliding_window", "max_window_layers", "attention_bias"},
    ignored={"partial_rotary_factor": FULL_ROPE},
    needs=(*QWEN_NEEDS, Need(("head_dim",))),
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block()
FAMILY = family(
    "qwen3",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="Qwen3ForCausalLM",
    shows="QK-norm (RMSNorm per head), windows",
)
