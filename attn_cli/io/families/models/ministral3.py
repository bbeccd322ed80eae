"""Ministral 3 (text): Mistral's block with yarn RoPE and Llama 4's query scaling after RoPE,
``q × (1 + llama_4_scaling_beta · ln(1 + ⌊pos / original_max_position_embeddings⌋))``
(transformers 5.25 modeling_ministral3.py: get_llama_4_attn_scale), shown as the
``temperature`` variant with offset 0."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from attn_cli.errors import InputError
from attn_cli.io.families.arch import FamilyVariant
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.config import Config
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, LLAMA_ASSUMED, LLAMA_READS, NO_BIAS, Keys, Need
from attn_cli.io.families.models.mistral import MISTRAL
from attn_cli.io.families.rope import rope_mapping

BETA = "llama_4_scaling_beta"


def _temperature(config: Config, eps: float) -> dict[str, Any] | None:
    """The query scaling from the rope mapping's beta and original length; None: no beta."""
    params, key = rope_mapping(config)
    params = params or {}
    beta = params.get(BETA)
    if beta is None:
        return None
    original = params.get("original_max_position_embeddings")
    if type(beta) not in (int, float) or beta != beta or abs(beta) == float("inf"):
        raise InputError(config.source, f"{config.path}{key}.{BETA}", f"got {beta!r}", "a number")
    if type(original) is not int or original < 1:
        raise InputError(
            config.source,
            f"{config.path}{key}.original_max_position_embeddings",
            f"got {original!r}",
            f"a whole number >= 1 (the floor of the query scaling {BETA} reads)",
        )
    return {"floor_scale": original, "attn_scale": beta, "offset": 0}


ARCH = replace(
    MISTRAL,
    window="when_given",
    # the rope mapping's max_position_embeddings is never read (validation reads the top level)
    rope_extra=(BETA, "max_position_embeddings"),
    variants=(FamilyVariant("temperature", _temperature),),
)
KEYS = Keys(
    reads=LLAMA_READS | {"sliding_window"},
    ignored={"partial_rotary_factor": FULL_ROPE, "attention_bias": NO_BIAS},
    needs=(Need(("head_dim",)),),
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block(eps_key=ARCH.eps, down_first=False, bias_key=None)
FAMILY = family(
    "ministral3",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="Ministral3ForCausalLM",
    shows="yarn RoPE and Llama 4's query scaling (temperature) after RoPE",
)
