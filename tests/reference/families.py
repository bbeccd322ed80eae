"""Make tests/reference/families/: tiny checkpoints of many families and transformers' numbers.

Run ONCE, in a throwaway venv (torch and transformers are not dependencies of attn):

    python3 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install transformers==5.24.0 torch==2.13.0 safetensors tokenizers
    /tmp/hfvenv/bin/python tests/reference/families.py

For each case the script builds a tiny random model from its config class (transformers 5.24.0,
float32, torch.manual_seed(0), initializer_range 0.4; every 1-D parameter, i.e. every norm weight
and bias, then gets seeded noise so that a norm or bias that is skipped or misread shows), saves it
with save_pretrained into families/<case>/ (config.json + model.safetensors) next to a WordLevel
tokenizer.json ("a".."h" -> ids 3..10), loads it back with eager attention and records what
transformers computed, layer by layer: the residual stream entering the layer, the output of the
attention output projection (before any residual add or post-attention norm; for a linear-attention
layer, Qwen3-Next's Gated DeltaNet, the output of its linear_attn module, i.e. of its out_proj, and
nothing else), q and k as passed to
the eager attention function (after q/k norms, clamping and RoPE), the scale eager was given, the
softmax weights and the mask.
Two runs a case: "hidden" (a seeded h fed as inputs_embeds, every layer) and "text" (the ids of
"a b c d e f g", layer 0 only). families/<case>/reference.json holds the numbers (float32 values
written as float64 reprs).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"  # tiny models from config classes only: never the network
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import torch
import transformers
from safetensors import safe_open
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
from transformers.utils import logging

logging.disable_progress_bar()

ROOT = Path(__file__).with_name("families")
SEED = 0
T = 7
TEXT = "a b c d e f g"
WORDS = {w: 3 + i for i, w in enumerate("abcdefgh")}  # ids 3..10: clear of pad/bos/eos 0, 1, 2
VOCAB = {**WORDS, "[UNK]": 11}
NOISE = 0.3  # std of the seeded noise added to every 1-D parameter (norm weights, biases)
WINDOW = 4  # sliding windows (and llama4's attention chunks) of 4 cut the 7 tokens
TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
TINY = {
    "vocab_size": 16,
    "hidden_size": 16,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 8,
    "num_hidden_layers": 1,
    "intermediate_size": 16,
    "max_position_embeddings": 32,
    "initializer_range": 0.4,
    "dtype": "float32",
    **TOKENS,
}
# initializer_range 0.4, not 0.02: q.k logits of a few units, so the weights are far from uniform
ROBERTA = {
    "vocab_size": 16,
    "hidden_size": 16,
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "intermediate_size": 16,
    "max_position_embeddings": 34,
    "initializer_range": 0.4,
    "dtype": "float32",
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
}
# RoBERTa's positions start at pad_token_id + 1 = 2: 32 usable positions need 34 rows
SLIDING = {
    "layer_types": ["sliding_attention", "full_attention"],
    "sliding_window": WINDOW,
    "num_hidden_layers": 2,
}


def tiny(cls_name: str, **extra: Any) -> Any:
    """cls_name's config with TINY's sizes, leaving out the keys the class has no field for
    (head_dim, num_key_value_heads): an unknown key would become a stray config attribute."""
    cls = getattr(transformers, cls_name)
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in TINY.items() if k in names} | extra)


def gemma3_text() -> Any:
    # query_pre_attn_scalar 12, not head_dim 8: the scale is 12**-0.5, not 8**-0.5.
    # Gemma3TextConfig's defaults: sliding layers rope_theta 10000 (rope_local_base_freq), full
    # layers 1e6, both "default"; written per layer type in rope_parameters.
    return tiny("Gemma3TextConfig", **SLIDING, query_pre_attn_scalar=12)


def gemma3_text_linear() -> Any:
    rope = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    }
    return tiny("Gemma3TextConfig", **SLIDING, query_pre_attn_scalar=12, rope_parameters=rope)


def gemma3() -> Any:
    # Gemma3ForConditionalGeneration: gemma3_text's config as its text_config, a tiny SigLIP
    # tower (1 layer, 8 x 8 pixels in 4 x 4 patches: 4 patches, pooled to mm_tokens_per_image 4)
    # that the text runs never call; the token indices stay the class's (past the vocabulary).
    vision = transformers.SiglipVisionConfig(
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=8,
        patch_size=4,
        dtype="float32",
    )
    return transformers.Gemma3Config(
        text_config=gemma3_text(),
        vision_config=vision,
        mm_tokens_per_image=4,
        initializer_range=0.4,
        dtype="float32",
    )


def olmo_clip() -> Any:
    return tiny("OlmoConfig", clip_qkv=0.5)


def olmo3() -> Any:
    return tiny("Olmo3Config", **SLIDING)


def phi3_partial() -> Any:
    return tiny("Phi3Config", partial_rotary_factor=0.5)


def phi(qk_layernorm: bool) -> Callable[[], Any]:
    rope = {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5}
    return lambda: tiny("PhiConfig", rope_parameters=rope, qk_layernorm=qk_layernorm)


def gpt_neox() -> Any:
    # GPTNeoXConfig reads rotary_pct / rotary_emb_base only as legacy kwargs: 5.24 writes both
    # into rope_parameters (partial_rotary_factor, rope_theta).
    rope = {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.25}
    return tiny("GPTNeoXConfig", rope_parameters=rope, attention_bias=True)


def roberta(cls_name: str) -> Callable[[], Any]:
    return lambda: getattr(transformers, cls_name)(**ROBERTA)


def distilbert() -> Any:
    sizes = {
        "vocab_size": 16,
        "dim": 16,
        "n_heads": 2,
        "n_layers": 1,
        "hidden_dim": 16,
        "max_position_embeddings": 32,
        "initializer_range": 0.4,
        "dtype": "float32",
    }
    return transformers.DistilBertConfig(**sizes, sinusoidal_pos_embds=False, pad_token_id=0)


def qwen3_moe() -> Any:
    return tiny("Qwen3MoeConfig", num_experts=2, num_experts_per_tok=1, moe_intermediate_size=8)


def qwen2_moe() -> Any:
    # qkv_bias stays Qwen2MoeConfig's default (true): q/k/v biases, no o_proj bias
    return tiny(
        "Qwen2MoeConfig",
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=8,
        shared_expert_intermediate_size=8,
    )


def mixtral() -> Any:
    return tiny("MixtralConfig", num_local_experts=2, num_experts_per_tok=1, sliding_window=WINDOW)


def starcoder2() -> Any:
    return tiny("Starcoder2Config", sliding_window=WINDOW, use_bias=True)


def smollm3() -> Any:
    # no_rope_layer_interval stays 4: no_rope_layers [1, 1, 1, 0], layer 3 is NoPE
    return tiny("SmolLM3Config", num_hidden_layers=4)


def granite() -> Any:
    return tiny(
        "GraniteConfig",
        attention_multiplier=0.3,
        embedding_multiplier=2.0,
        residual_multiplier=0.5,
        logits_scaling=4.0,
    )


def stablelm() -> Any:
    return tiny("StableLmConfig", partial_rotary_factor=0.25, use_qkv_bias=True, qk_layernorm=False)


def gptj() -> Any:
    sizes = {
        "vocab_size": 16,
        "n_embd": 16,
        "n_head": 2,
        "n_layer": 1,
        "n_inner": 16,
        "n_positions": 32,
        "initializer_range": 0.4,
        "dtype": "float32",
        **TOKENS,
    }
    return transformers.GPTJConfig(**sizes, rotary_dim=4)


def llama4_text() -> Any:
    # no_rope_layers [1, 0]: layer 0 RoPE (interleaved, complex) then qk norm + chunked attention,
    # layer 1 NoPE, no qk norm, full attention, temperature tuning. floor_scale 2 (not 8192): the
    # NoPE temperature log1p(floor((pos + 1) / 2)) * 0.1 + 1 varies within 7 tokens.
    return tiny(
        "Llama4TextConfig",
        num_hidden_layers=2,
        no_rope_layers=[1, 0],
        attention_chunk_size=WINDOW,
        floor_scale=2,
        attn_scale=0.1,
        intermediate_size_mlp=16,
        num_local_experts=2,
        num_experts_per_tok=1,
    )


def qwen3_next() -> Any:
    # layers 0 and 2 full_attention (gated attention: q_proj holds each head's query and gate,
    # q/k RMSNorm 1 + w, partial rotary 0.25 = 2 of 8 dims), layer 1 linear_attention (Gated
    # DeltaNet, the gated_deltanet key); 2 experts top-1, a shared expert (attention unaffected)
    return tiny(
        "Qwen3NextConfig",
        num_hidden_layers=3,
        layer_types=["full_attention", "linear_attention", "full_attention"],
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=8,
        shared_expert_intermediate_size=8,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=4,
        linear_value_head_dim=4,
    )


def qwen3_next_linear() -> Any:
    # layer 0 linear_attention, so that a text reaches it; 4 value heads over 2 key heads: each
    # key head's rows of in_proj_qkvz hold the v and z rows of two value heads
    return tiny(
        "Qwen3NextConfig",
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=8,
        shared_expert_intermediate_size=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=4,
        linear_value_head_dim=4,
    )


def deepseek_v3() -> Any:
    # multi-head latent attention: q LoRA (rank 12), a latent of rank 8 and a RoPE key of 4 shared
    # by both heads, nope 4, v 4; layer 0 dense, layer 1 MoE (its MLP is not attn's concern)
    return tiny(
        "DeepseekV3Config",
        num_hidden_layers=2,
        num_key_value_heads=2,
        q_lora_rank=12,
        kv_lora_rank=8,
        qk_nope_head_dim=4,
        qk_rope_head_dim=4,
        v_head_dim=4,
        first_k_dense_replace=1,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        moe_intermediate_size=8,
    )


def deepseek_v3_yarn() -> Any:
    # deepseek_v3's sizes with the yarn DeepSeek V3 ships (factor 40, mscale 1, mscale_all_dim 1,
    # original 4096) brought down to a few positions: factor 8 over an original 4, and mscale
    # 0.9 / mscale_all_dim 0.6 so both the attention factor on cos, sin and the mscale² on the
    # softmax scale differ from 1
    yarn = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "original_max_position_embeddings": 4,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 0.9,
        "mscale_all_dim": 0.6,
    }
    config = deepseek_v3()
    config.rope_parameters = yarn
    return config


def deepseek_v2() -> Any:
    # DeepSeek V2 (Lite's shape: no q LoRA, one q_proj) with the yarn V2 ships (factor 40,
    # mscale 0.707, mscale_all_dim 0.707, original 4096) brought down to a few positions as
    # deepseek_v3_yarn's; its RoPE by view_as_complex keeps each rotated pair in place
    yarn = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "original_max_position_embeddings": 4,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
    }
    return tiny(
        "DeepseekV2Config",
        num_hidden_layers=2,
        num_key_value_heads=2,
        q_lora_rank=None,
        kv_lora_rank=8,
        qk_nope_head_dim=4,
        qk_rope_head_dim=4,
        v_head_dim=4,
        first_k_dense_replace=1,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        moe_intermediate_size=8,
        rope_parameters=yarn,
    )


def simple(cls_name: str, **extra: Any) -> Callable[[], Any]:
    return lambda: tiny(cls_name, **extra)


# case: (config builder, encoder?, notes)
CASES: dict[str, tuple[Callable[[], Any], bool, str]] = {
    "gemma3_text": (
        gemma3_text,
        False,
        "Gemma 3: layer 0 sliding_attention (window 4, rope_theta 10000), layer 1 "
        "full_attention (rope_theta 1e6); q/k RMSNorm (1 + w) per head before RoPE; "
        "scale query_pre_attn_scalar**-0.5 = 12**-0.5; post-attention norm",
    ),
    "gemma3_text_linear": (
        gemma3_text_linear,
        False,
        "as gemma3_text, but the full_attention layer's RoPE is linear, factor "
        "8, as Gemma 3 4B/12B/27B ship (rope_parameters per layer type)",
    ),
    "gemma3": (
        gemma3,
        False,
        "Gemma 3 image-text (Gemma3ForConditionalGeneration): gemma3_text's case as "
        "text_config, run as model.language_model, saved as language_model.model.* "
        "(save_pretrained writes the Hub's names); a 1-layer SigLIP tower the runs never "
        "call (no image: token ids or inputs_embeds only)",
    ),
    "olmo2": (
        simple("Olmo2Config"),
        False,
        "OLMo 2: q/k RMSNorm over the whole projection (all heads at once) before RoPE; "
        "norms after attention and MLP (post_attention_layernorm), none before",
    ),
    "olmo": (
        simple("OlmoConfig"),
        False,
        "OLMo: clip_qkv null; non-parametric LayerNorm (no weight, no bias)",
    ),
    "olmo_clip": (
        olmo_clip,
        False,
        "OLMo with clip_qkv 0.5: q, k and v projections clamped to [-0.5, 0.5] before "
        "RoPE (same weights as olmo, numbers visibly changed)",
    ),
    "olmo3": (
        olmo3,
        False,
        "OLMo 3: layer 0 sliding_attention (window 4), layer 1 full_attention, both RoPE "
        "(rope_parameters per layer type, theta 500000); whole-projection q/k norm",
    ),
    "phi3": (
        simple("Phi3Config"),
        False,
        "Phi-3: fused qkv_proj (q, k, v rows), fused gate_up_proj, default RoPE",
    ),
    "phi3_partial": (
        phi3_partial,
        False,
        "Phi-3 with partial_rotary_factor 0.5: RoPE on the first 4 of 8 dims",
    ),
    "phi": (
        phi(False),
        False,
        "Phi-1/2: partial_rotary_factor 0.5 (4 of 8 dims), q/k/v/dense biases, one LayerNorm "
        "feeding attention and MLP in parallel; qk_layernorm false",
    ),
    "phi_qk_layernorm": (
        phi(True),
        False,
        "phi with qk_layernorm true: LayerNorm (weight + bias) over each head's "
        "q and k before the partial RoPE",
    ),
    "gpt_neox": (
        gpt_neox,
        False,
        "GPT-NeoX: fused query_key_value laid out per head [q k v], partial RoPE 0.25 "
        "(2 of 8 dims), biases, parallel residual",
    ),
    "roberta": (
        roberta("RobertaConfig"),
        True,
        "RoBERTa encoder: no mask, positions from pad_token_id + 1 = 2, token type 0, "
        "embeddings LayerNorm; output = attention.output.dense, before residual + "
        "LayerNorm",
    ),
    "xlm_roberta": (roberta("XLMRobertaConfig"), True, "XLM-RoBERTa: as roberta"),
    "camembert": (roberta("CamembertConfig"), True, "CamemBERT: as roberta"),
    "distilbert": (
        distilbert,
        True,
        "DistilBERT: learned positions from 0, no token types, q_lin/k_lin/v_lin/"
        "out_lin, post-LayerNorm sa_layer_norm",
    ),
    "qwen3_moe": (
        qwen3_moe,
        False,
        "Qwen3-MoE: q/k RMSNorm per head before RoPE, 2 experts top-1 (attention unaffected)",
    ),
    "qwen2_moe": (
        qwen2_moe,
        False,
        "Qwen2-MoE: q/k/v biases (qkv_bias true), no o_proj bias; shared expert",
    ),
    "mixtral": (
        mixtral,
        False,
        "Mixtral: sliding_window 4 on every layer (no layer_types), 2 experts top-1",
    ),
    "starcoder2": (
        starcoder2,
        False,
        "StarCoder2: sliding_window 4, biases everywhere (use_bias), LayerNorm with bias",
    ),
    "smollm3": (
        smollm3,
        False,
        "SmolLM3: no_rope_layers [1, 1, 1, 0] (interval 4): layers 0-2 RoPE, layer 3 "
        "NoPE; sliding disabled",
    ),
    "cohere2": (
        simple("Cohere2Config", **SLIDING),
        False,
        "Cohere 2: layer 0 sliding_attention (window 4) with interleaved RoPE, layer 1 "
        "full_attention WITHOUT RoPE (NoPE); parallel block, LayerNorm without bias",
    ),
    "cohere": (
        simple("CohereConfig", use_qk_norm=False),
        False,
        "Cohere: interleaved RoPE (pairs 2i, 2i+1), parallel attention + MLP from one "
        "LayerNorm (no bias); use_qk_norm false",
    ),
    "cohere_qk_norm": (
        simple("CohereConfig", use_qk_norm=True),
        False,
        "Cohere with use_qk_norm: a LayerNorm without bias of each head of q and of k "
        "(q_norm.weight [heads, head_dim], k_norm.weight [kv_heads, head_dim]) before RoPE",
    ),
    "exaone4": (
        simple("Exaone4Config", **SLIDING),
        False,
        "EXAONE 4: layer 0 sliding_attention (window 4) with RoPE, layer 1 full_attention "
        "NoPE; q/k RMSNorm per head before RoPE; post-norms (after attention and MLP)",
    ),
    "ernie4_5": (
        simple("Ernie4_5Config"),
        False,
        "ERNIE 4.5: interleaved RoPE (GLM style, pairs 2i, 2i+1) in float32",
    ),
    "glm4": (
        simple("Glm4Config", attention_bias=True),
        False,
        "GLM-4: partial_rotary_factor 0.5 (default), interleaved RoPE on the first 4 dims, "
        "q/k/v biases; extra post_self_attn_layernorm / post_mlp_layernorm",
    ),
    "granite": (
        granite,
        False,
        "Granite: scale attention_multiplier 0.3 (not head_dim**-0.5); layer 0 input = "
        "2.0 * inputs_embeds (embedding_multiplier); residual_multiplier 0.5",
    ),
    "hunyuan_v1_dense": (
        simple("HunYuanDenseV1Config"),
        False,
        "HunYuan dense: q/k RMSNorm per head AFTER RoPE (always on: the config has no use_qk_norm)",
    ),
    "stablelm": (
        stablelm,
        False,
        "StableLM: partial_rotary_factor 0.25 (2 of 8 dims), q/k/v biases, LayerNorm "
        "with bias, qk_layernorm false",
    ),
    "ministral": (
        simple("MinistralConfig", **SLIDING),
        False,
        "Ministral: layer 0 sliding_attention (window 4), layer 1 full_attention",
    ),
    "gemma": (
        simple("GemmaConfig"),
        False,
        "Gemma: RMSNorm (1 + w); text run's embeddings scaled by sqrt(16) = 4",
    ),
    "gptj": (
        gptj,
        False,
        "GPT-J: rotary_dim 4 of head 8, interleaved RoPE (pairs 2i, 2i+1) on the first 4 "
        "dims; no q/k/v/out biases; parallel attention + MLP",
    ),
    "llama4_text": (
        llama4_text,
        False,
        "Llama 4 text: layer 0 chunked_attention (chunk 4) with interleaved complex "
        "RoPE then a weightless RMS qk norm (Llama4TextL2Norm: x * rsqrt(mean(x^2) + "
        "eps)); layer 1 NoPE full_attention, no qk norm, q times the temperature "
        "log1p(floor((pos+1)/2))*0.1+1",
    ),
    "qwen3_next": (
        qwen3_next,
        False,
        "Qwen3-Next: layers 0 and 2 full_attention, gated (q_proj rows per head: "
        "query then gate; attn_output * sigmoid(gate) before o_proj), q/k RMSNorm "
        "(1 + w) per head, partial rotary 0.25; layer 1 linear_attention (Gated "
        "DeltaNet: its input and linear_attn's output, out_proj's, before the "
        "residual)",
    ),
    "qwen3_next_linear": (
        qwen3_next_linear,
        False,
        "Qwen3-Next with layer 0 linear_attention (Gated DeltaNet, 2 key heads, "
        "4 value heads: v and z rows of two value heads per key head in "
        "in_proj_qkvz), so the text run reaches it; layer 1 full_attention",
    ),
    "deepseek_v3": (
        deepseek_v3,
        False,
        "DeepSeek V3's multi-head latent attention (DeepseekV3Attention): q through "
        "q_a_proj, q_a_layernorm, q_b_proj; kv_a_proj_with_mqa gives the latent "
        "(rank 8, kv_a_layernorm) and a RoPE key of 4 shared by the heads, kv_b_proj "
        "decompresses K_nope and V per head; interleaved RoPE (rope_interleave); "
        "scale (4 + 4)**-0.5; layer 1's MLP is MoE",
    ),
    "deepseek_v2": (
        deepseek_v2,
        False,
        "DeepSeek V2's multi-head latent attention (DeepseekV2Attention), Lite's "
        "shape (q_proj, no q LoRA): RoPE by view_as_complex, each rotated pair in "
        "place in query_states and key_states; yarn on the rope dims (factor 8, "
        "original 4, mscale 0.707, mscale_all_dim 0.707); layer 1's MLP is MoE",
    ),
    "deepseek_v3_yarn": (
        deepseek_v3_yarn,
        False,
        "deepseek_v3 with yarn on the rope dims (factor 8, original 4, beta 32/1, "
        "mscale 0.9, mscale_all_dim 0.6): yarn's frequencies over "
        "qk_rope_head_dim 4, cos and sin times the attention factor, the scale "
        "times yarn_get_mscale(8, 0.6)**2 (yarn_apply_mscale)",
    ),
}

# The attention output projection, relative to the decoder / encoder layer: exactly one exists.
OUT_PROJ = [
    "self_attn.o_proj",
    "self_attn.dense",
    "attention.dense",
    "attn.out_proj",
    "attention.output.dense",
    "attention.out_lin",
]
LAYERS = [
    "model.layers",
    "model.language_model.layers",
    "gpt_neox.layers",
    "transformer.h",
    "encoder.layer",
    "transformer.layer",
]
RELEVANT = re.compile(
    r"rope|rotary|window|layer_types|head|attn|attention|qk|clip|partial|"
    r"scalar|multiplier|scal|norm|bias|chunk|softcap|floor|parallel|pattern|"
    r"position|type_vocab|pad_token"
)


def floats(x: torch.Tensor) -> Any:
    """float32 tensor -> nested lists of python floats (exact float64 values of the float32s)."""
    return x.detach().to(torch.float64).cpu().tolist()


def attention_output(layer: Any) -> Any:
    """The layer's attention output projection; for a linear-attention layer (Qwen3-Next's
    Gated DeltaNet) the ``linear_attn`` module itself, whose output is its out_proj's."""
    if hasattr(layer, "linear_attn"):
        return layer.linear_attn
    return submodule(layer, OUT_PROJ)[1]


def submodule(root: Any, paths: list[str]) -> tuple[str, Any]:
    found = []
    for path in paths:
        try:
            found.append((path, root.get_submodule(path)))
        except AttributeError:
            continue
    assert len(found) == 1, [p for p, _ in found]
    return found[0]


def write_tokenizer(folder: Path) -> list[int]:
    tokenizer = Tokenizer(WordLevel(VOCAB, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    ids: list[int] = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(TEXT).ids
    assert ids == [WORDS[w] for w in TEXT.split()], ids
    return ids


def allowed(mask: torch.Tensor | None) -> Any:
    """The mask eager received -> (T, T) ints, 1 where query i may see key j."""
    if mask is None:
        return torch.ones(T, T, dtype=torch.int64).tolist()
    m = mask[0, 0] if mask.dim() == 4 else mask
    seen = m if m.dtype == torch.bool else m == 0
    return seen.to(torch.int64).tolist()


def mask_kind(mask: list[list[int]]) -> str:
    kinds: dict[str, Callable[[int, int], bool]] = {
        "all": lambda i, j: True,
        "causal": lambda i, j: j <= i,
        f"sliding{WINDOW}": lambda i, j: i - WINDOW < j <= i,
        f"chunked{WINDOW}": lambda i, j: j <= i and i // WINDOW == j // WINDOW,
    }
    for name, rule in kinds.items():
        if all(mask[i][j] == int(rule(i, j)) for i in range(T) for j in range(T)):
            return name
    return "other"


def run(folder: Path, encoder: bool, kind: str, ids: list[int]) -> dict[str, Any]:
    """Every layer's attention (kind "hidden") or layer 0's (kind "text"), as transformers does."""
    auto = AutoModel if encoder else AutoModelForCausalLM
    model = auto.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32, local_files_only=True
    ).eval()
    path, layers = submodule(model, LAYERS)
    modeling: Any = sys.modules[type(layers[0]).__module__]
    # every family here calls its modeling module's eager_attention_forward (llama4's own copy
    # does not upcast the softmax; bert-style ones have no repeat_kv): swap it for a spy
    eager = modeling.eager_attention_forward
    seen: list[dict[str, Any]] = [{} for _ in layers]
    current = [-1]

    def layer_input(index: int) -> Callable[..., None]:
        def hook(_module, args, kwargs):  # type: ignore[no-untyped-def]
            current[0] = index
            hidden = args[0] if args else kwargs["hidden_states"]
            seen[index]["layer_in"] = hidden.detach().clone()

        return hook

    def out_proj(index: int) -> Callable[..., None]:
        def hook(_module, _args, output):  # type: ignore[no-untyped-def]
            assert "output" not in seen[index], "output projection called twice"
            seen[index]["output"] = output.detach().clone()

        return hook

    def spy(module, query, key, value, attention_mask, *args, **kwargs):  # type: ignore[no-untyped-def]
        out, weights = eager(module, query, key, value, attention_mask, *args, **kwargs)
        record = seen[current[0]]
        assert "q" not in record, "eager called twice in one layer"
        record.update(
            q=query.detach().clone(),
            k=key.detach().clone(),
            mask=attention_mask,
            weights=weights.detach().clone(),
            scaling=kwargs["scaling"],
        )
        return out, weights

    handles = []
    for index, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(layer_input(index), with_kwargs=True))
        handles.append(attention_output(layer).register_forward_hook(out_proj(index)))
        if hasattr(layer, "linear_attn"):
            seen[index]["linear_attention"] = True
    modeling.eager_attention_forward = spy
    config = model.config.get_text_config()  # a wrapper's (gemma3) text model's; else itself
    hidden = config.hidden_size if hasattr(config, "hidden_size") else config.dim
    h = torch.randn(T, hidden, generator=torch.Generator().manual_seed(1000 + T))
    inputs: dict[str, Any] = (
        {"inputs_embeds": h[None]} if kind == "hidden" else {"input_ids": torch.tensor([ids])}
    )
    if not encoder:
        inputs |= {"position_ids": torch.arange(T)[None], "use_cache": False}
    if getattr(config, "type_vocab_size", None):
        inputs["token_type_ids"] = torch.zeros(1, T, dtype=torch.int64)
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        modeling.eager_attention_forward = eager
        for handle in handles:
            handle.remove()
    result: dict[str, Any] = {"kind": kind, "T": T}
    if kind == "hidden":
        result["h"] = floats(h)
        if not encoder:  # inputs_embeds is layer 0's input (granite: times embedding_multiplier)
            scale = float(getattr(config, "embedding_multiplier", 1.0))
            assert torch.equal(seen[0]["layer_in"][0], h * scale), "layer 0's input is not h"
    else:
        result |= {"text": TEXT, "ids": ids}
    if not encoder:
        result["position_ids"] = list(range(T))
    result["layers_path"] = path
    result["layers"] = []
    for record in seen if kind == "hidden" else seen[:1]:
        if record.get("linear_attention"):  # no eager attention: its input and output
            result["layers"].append(
                {
                    "layer_in": floats(record["layer_in"][0]),
                    "output": floats(record["output"][0]),  # linear_attn's
                    "linear_attention": True,
                }
            )
            continue
        assert {"layer_in", "output", "q", "k", "weights"} <= record.keys(), record.keys()
        result["layers"].append(
            {
                "layer_in": floats(record["layer_in"][0]),  # (T, hidden)
                "output": floats(
                    record["output"][0]
                ),  # (T, hidden): out projection, before residual
                "q": floats(record["q"][0]),  # (heads, T, head_dim): after q norm / clamp / RoPE
                "k": floats(record["k"][0]),  # (kv_heads, T, head_dim): before repeat_kv
                "scaling": float(record["scaling"]),  # the logits' scale eager was given
                "weights": floats(record["weights"][0]),  # (heads, T, T): softmax
                "mask": allowed(record["mask"]),  # (T, T): 1 where query i may see key j
            }
        )
    return result


def perturb(model: Any) -> None:
    """Seeded noise on every 1-D parameter: norm weights (1, or Gemma's 0) and biases (0) that a
    reader could skip or misplace without any change in the numbers otherwise."""
    generator = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for _name, p in sorted(model.named_parameters()):
            if p.dim() == 1:
                p.add_(NOISE * torch.randn(p.shape, generator=generator))


def layer0_tensors(folder: Path) -> list[str]:
    """Layer 0's saved tensor names, without the layers prefix and without the MLP / experts."""
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    out = []
    for name in names:
        m = re.match(r"^.*?\.0\.(.*)$", name)
        ffn = r"(mlp|feed_forward|block_sparse_moe|ffn|intermediate|output\.dense)\b"
        if m and not re.match(ffn, m.group(1)):
            out.append(m.group(1))
    return sorted(out)


def make(case: str, build: Callable[[], Any], encoder: bool, notes: str) -> None:
    folder = ROOT / case
    shutil.rmtree(folder, ignore_errors=True)
    torch.manual_seed(SEED)
    config = build()
    auto = AutoModel if encoder else AutoModelForCausalLM
    model = auto.from_config(config, dtype=torch.float32).eval()
    perturb(model)
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "generation_config.json").unlink(missing_ok=True)
    ids = write_tokenizer(folder)
    saved = json.loads((folder / "config.json").read_text())
    reloaded = AutoConfig.from_pretrained(folder, local_files_only=True)
    runs = [run(folder, encoder, "hidden", ids), run(folder, encoder, "text", ids)]
    data: dict[str, Any] = {
        "made_by": "tests/reference/families.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "case": case,
        "model_type": reloaded.model_type,
        "notes": notes,
    }
    text = reloaded.get_text_config()  # a wrapper's (gemma3) text model's; else itself
    if getattr(text, "layer_types", None):
        data["layer_types"] = list(text.layer_types)
    data["runs"] = runs
    lines = (f"{json.dumps(key)}: {json.dumps(value)}" for key, value in data.items())
    (folder / "reference.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")  # one key a line

    masks = [
        mask_kind(layer["mask"]) if "mask" in layer else "linear" for layer in runs[0]["layers"]
    ]
    keys = {
        k: v
        for k, v in sorted(saved.items())
        if RELEVANT.search(k) and k not in ("architectures", "transformers_version")
    }
    print(f"== {case} ({reloaded.model_type}, {runs[0]['layers_path']}): masks {masks}")
    print(f"   layer 0 tensors: {' '.join(layer0_tensors(folder))}")
    print(f"   config: {json.dumps(keys)}")


def main() -> None:
    only = set(sys.argv[1:])  # case names: remake only those
    for case, (build, encoder, notes) in CASES.items():
        if not only or case in only:
            make(case, build, encoder, notes)
    total = sum(p.stat().st_size for p in ROOT.rglob("*") if p.is_file())
    print(f"wrote {ROOT} ({total:,} bytes)")


if __name__ == "__main__":
    main()
