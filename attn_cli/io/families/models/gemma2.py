"""Gemma 2: Gemma with softcapped scores, query_pre_attn_scalar, sliding and global layers."""

from __future__ import annotations

from dataclasses import replace

from attn_cli.io.families.arch import FamilyVariant
from attn_cli.io.families.blocks import SANDWICH
from attn_cli.io.families.config import Config
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, LLAMA_ASSUMED, LLAMA_READS, WINDOWED, Keys, Need
from attn_cli.io.families.models.gemma import GEMMA


def attn_softcap(config: Config, eps: float) -> float | None:
    """The scores' cap, attn_logit_softcapping (Gemma2Config's default 50; null: none)."""
    return config.optional_number("attn_logit_softcapping", 50.0)


ARCH = replace(
    GEMMA,
    scale="query_pre_attn_scalar",
    window="types",
    post_norm=True,
    variants=(FamilyVariant("softcap", attn_softcap),),
)
KEYS = Keys(
    reads=LLAMA_READS
    | WINDOWED
    | {
        "attention_bias",
        "query_pre_attn_scalar",
        "attn_logit_softcapping",
        "use_bidirectional_attention",
    },
    inert=frozenset({"sliding_window_size"}),  # early configs; the model reads sliding_window
    ignored={"partial_rotary_factor": FULL_ROPE},
    needs=tuple(
        Need((k,))
        for k in (
            "head_dim",
            "query_pre_attn_scalar",
            "attn_logit_softcapping",
            "sliding_window",
            "layer_types",
        )
    ),
    assumed=LLAMA_ASSUMED,
)
BLOCK = replace(
    SANDWICH, norm="rms1p", act=("hidden_activation", "gelu_pytorch_tanh"), final_cap=30.0
)
FAMILY = family(
    "gemma2",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="Gemma2ForCausalLM",
    shows="softcap, the query_pre_attn_scalar scale, sliding windows, sandwich norms",
)
