"""Gemma 3: gemma3_text (Gemma 2's layer with QK-norm scaling by 1 + weight, no softcap, a RoPE
base per layer type) and the image-text gemma3, read as its text model."""

from __future__ import annotations

from dataclasses import replace

from attn_cli.io.families.blocks import SANDWICH
from attn_cli.io.families.config import Config
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import (
    FULL_ROPE,
    LLAMA_ASSUMED,
    LLAMA_READS,
    PATTERN,
    WINDOWED,
    Keys,
    Need,
    Rule,
)
from attn_cli.io.families.models.gemma import GEMMA
from attn_cli.io.families.models.qwen3 import qk_rms_norm
from attn_cli.io.families.plan import LayerPlan
from attn_cli.io.families.registry import Family, Wrapper

ARCH = replace(
    GEMMA,
    scale="query_pre_attn_scalar",
    variants=(qk_rms_norm(plus_one=True, who="Gemma"),),
    window="types",
    pattern=6,
    by_type=(1e4, 1e6),
    sizes=(
        ("vocab_size", 262_208),
        ("hidden_size", 2304),
        ("num_hidden_layers", 26),
        ("num_attention_heads", 8),
        ("num_key_value_heads", 4),
        ("max_position_embeddings", 131_072),
    ),
    post_norm=True,
    local_theta="rope_local_base_freq",
    pattern_keys=True,
)
KEYS = Keys(
    reads=LLAMA_READS
    | WINDOWED
    | PATTERN
    | {
        "attention_bias",
        "query_pre_attn_scalar",
        "use_bidirectional_attention",
        "rope_local_base_freq",
    },
    ignored={
        "partial_rotary_factor": FULL_ROPE,
        "attn_logit_softcapping": Rule(
            (None,), "transformers' gemma3_text passes no softcap to its attention"
        ),
    },
    needs=(
        *(Need((k,)) for k in ("head_dim", "query_pre_attn_scalar", "sliding_window")),
        Need(("layer_types", *PATTERN)),
    ),
    assumed=LLAMA_ASSUMED,
)
BLOCK = replace(SANDWICH, norm="rms1p", act=("hidden_activation", "gelu_pytorch_tanh"))
FAMILY = family(
    "gemma3_text",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="Gemma3ForCausalLM",
    shows="QK-norm (1 + weight), sliding and global layers with their own RoPE bases",
)

# The image side (the vision tower's config, the image tokens) changes no text layer's numbers.
# Gemma 3's image_token_index is replaced by id 0 only where it is past the vocabulary, where
# attn's --text refuses the id.
IMAGE_SIDE = frozenset(
    {
        "vision_config",
        "mm_tokens_per_image",
        "boi_token_index",
        "eoi_token_index",
        "image_token_index",
        "boi_token_id",
        "eoi_token_id",
        "image_token_id",
    }
)


def _no_plan(config: Config, layer: int) -> LayerPlan:
    raise AssertionError("a wrapper is planned as its text model (checks.plan_layer)")


# Gemma3ForConditionalGeneration (Gemma 3 4B, 12B, 27B): its module names the text layers
# model.language_model.layers.N; save_pretrained (5.24) writes them as the Hub's checkpoints
# do, language_model.model.layers.N, which the conversion mapping ("llava": ^language_model
# -> model.language_model, then Gemma3Model's ^language_model.model -> language_model)
# renames on loading. transformers loads either.
WRAPPER = Family(
    "gemma3",
    "Gemma3ForConditionalGeneration",
    "its text model (gemma3_text's layers under language_model.model.)",
    Keys(reads=frozenset({"text_config"}), inert=IMAGE_SIDE),
    _no_plan,
    wrapper=Wrapper("gemma3_text", ("language_model.model.", "model.language_model.")),
)
