"""What a config.json may hold: each family's allowlist (``Keys``) and the tables shared by all.

A key of config.json is accepted when the family's plan reads it (and checks its value), when
it cannot change one attention layer's numbers (``INERT``, or the family's own ``inert``: keys
transformers' modeling code for that model_type never reads, noted in the import's notes), or
when its value is the neutral one (a ``Rule``). Any other key is refused unless it is null:
attn does not guess what a key it does not know does to the attention. Built from transformers
5.24's configuration_*.py of each family (and of the families people mistake for them), and
from the keys older versions wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Rule:
    """A key accepted at its neutral values only; ``does`` says what any other value does."""

    neutral: tuple[Any, ...]
    does: str


@dataclass(frozen=True)
class Need:
    """Keys one of which a checkpoint read as the family must give (when ``when`` is true):
    the family's default for them turns something on that another model may not have."""

    keys: tuple[str, ...]
    when: str | None = None


@dataclass(frozen=True)
class Keys:
    """One family's config.json keys: read by its plan, inert for it, or neutral-only.

    ``ignored`` keys are ones transformers' class of the family leaves unused: with that
    model_type they are noted as ignored; read as the family (a model_type attn does not know),
    their model's own code may use them, so they must be neutral. Read so, the keys of ``needs``
    must be given, and those of ``assumed`` (an epsilon, a RoPE base) are noted when absent.
    """

    reads: frozenset[str]
    inert: frozenset[str] = frozenset()
    neutral: Mapping[str, Rule] = field(default_factory=dict)
    ignored: Mapping[str, Rule] = field(default_factory=dict)
    needs: tuple[Need, ...] = ()
    assumed: tuple[str, ...] = ()


# Keys that change no attention layer's numbers: bookkeeping, tokens, the MLP, the LM head.
INERT = frozenset(
    {
        # PreTrainedConfig and what earlier versions of it saved
        "model_type",
        "_name_or_path",
        "name_or_path",
        "_commit_hash",
        "architectures",
        "auto_map",
        "custom_pipelines",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "use_bfloat16",
        "id2label",
        "label2id",
        "num_labels",
        "problem_type",
        "finetuning_task",
        "tokenizer_class",
        "prefix",
        "task_specific_params",
        "return_dict",
        "use_return_dict",
        "output_attentions",
        "output_hidden_states",
        "torchscript",
        "xla_device",
        "chunk_size_feed_forward",
        "attn_implementation",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "experts_implementation",
        "use_cache",
        "cache_implementation",
        "gradient_checkpointing",
        "initializer_range",
        "initializer_factor",
        "init_std",
        "vocab_size",
        "max_position_embeddings",
        "tie_word_embeddings",
        "tie_encoder_decoder",
        # token ids
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "cls_token_id",
        "mask_token_id",
        "unk_token_id",
        "decoder_start_token_id",
        "eod_token_id",
        # generation settings (GenerationConfig._get_default_generation_params)
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "encoder_repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "epsilon_cutoff",
        "eta_cutoff",
        "assistant_confidence_threshold",
        "assistant_lookbehind",
        "target_lookbehind",
        "num_assistant_tokens",
        "num_assistant_tokens_schedule",
        # the MLP (traced by no stage), mixture-of-experts routing, the LM head
        "hidden_act",
        "hidden_activation",
        "activation_function",
        "intermediate_size",
        "n_inner",
        "mlp_bias",
        "pretraining_tp",
        "num_local_experts",
        "num_experts",
        "num_experts_per_tok",
        "experts_per_token",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "decoder_sparse_step",
        "mlp_only_layers",
        "norm_topk_prob",
        "output_router_logits",
        "router_aux_loss_coef",
        "router_jitter_noise",
        "swiglu_alpha",
        "swiglu_limit",
        "final_logit_softcapping",
        "logit_scale",
        "logits_scaling",
        # quantized attention tensors are refused by their dtype, or as tensors the layout lacks
        "quantization_config",
    }
)
DROPOUT = ("dropout", "_pdrop", "dropout_prob")  # key endings: dropout is off when tracing

# the final logits' cap, cap · tanh(logits / cap), that any decoder's LM head applies if given
FINAL_CAP_KEY = "final_logit_softcapping"
OFF = (None, False)
# Keys of other families that change the attention: accepted at their neutral value only.
NEUTRAL = {
    "pruned_heads": Rule((None, {}), "heads pruned from layers"),
    "is_decoder": Rule(OFF, "a decoder (causal) layer"),
    "is_encoder_decoder": Rule(OFF, "an encoder-decoder model"),
    "add_cross_attention": Rule(OFF, "cross-attention layers"),
    "per_layer_config": Rule((None,), "settings that differ per layer"),
    "position_embedding_type": Rule((None,), "the kind of position embedding"),
    "use_qk_norm": Rule(OFF, "a norm of each query and key (Cohere, Llama 4)"),
    "qk_layernorm": Rule(OFF, "a LayerNorm of each query and key (Phi, StableLM)"),
    "clip_qkv": Rule((None,), "Q, K and V clamped to +-clip_qkv (OLMo)"),
    "attention_multiplier": Rule(
        (None,), "the attention scale in place of 1/sqrt(head_dim) (Granite)"
    ),
    "embedding_multiplier": Rule((None, 1, 1.0), "a factor on the embeddings (Granite)"),
    "attn_logit_softcapping": Rule((None,), "scores softcapped (Gemma 2)"),
    "query_pre_attn_scalar": Rule((None,), "the scale 1/sqrt(query_pre_attn_scalar) (Gemma)"),
    "use_bidirectional_attention": Rule(OFF, "attention without the causal mask"),
    "sliding_window": Rule((None,), "a sliding window"),
    "use_sliding_window": Rule(OFF, "a sliding window"),
    "max_window_layers": Rule((None,), "which layers slide (Qwen)"),
    "layer_types": Rule((None,), "attention that differs per layer"),
    "sliding_window_pattern": Rule((None,), "sliding and global layers alternating"),
    "_sliding_window_pattern": Rule((None,), "sliding and global layers alternating"),
    "rope_local_base_freq": Rule((None,), "a second RoPE base for sliding layers (Gemma 3)"),
    "no_rope_layers": Rule((None,), "layers without RoPE (SmolLM3, Llama 4)"),
    "no_rope_layer_interval": Rule((None,), "layers without RoPE (SmolLM3, Llama 4)"),
    "attention_chunk_size": Rule((None,), "chunked attention (Llama 4)"),
    "attn_temperature_tuning": Rule(OFF, "queries scaled by position (Llama 4)"),
    "partial_rotary_factor": Rule((None, 1, 1.0), "RoPE on part of each head"),
    "rotary_pct": Rule((None, 1, 1.0), "RoPE on part of each head (GPT-NeoX)"),
    "rotary_dim": Rule((None,), "RoPE on part of each head (GPT-J)"),
    "rope_interleave": Rule(OFF, "RoPE on interleaved pairs"),
    "rope_theta": Rule((None,), "rotary position embeddings"),
    "rope_scaling": Rule((None,), "rotary position embeddings"),
    "rope_parameters": Rule((None,), "rotary position embeddings"),
    "alibi": Rule(OFF, "ALiBi position biases"),
    "use_mrope": Rule(OFF, "multimodal RoPE (Qwen2-VL)"),
    "num_key_value_heads": Rule((None,), "grouped key/value heads"),
    "head_dim": Rule((None,), "a head size other than hidden / heads"),
    "attention_bias": Rule(OFF, "biases on the projections"),
    "layer_norm_eps": Rule((None,), "LayerNorm where this family's norm is RMSNorm"),
    "layer_norm_epsilon": Rule((None,), "LayerNorm where this family's norm is RMSNorm"),
    "norm_epsilon": Rule((None,), "a LayerNorm (StarCoder 2)"),
    "rms_norm_eps": Rule((None,), "RMSNorm where this family's norm is LayerNorm"),
}

ROTARY = frozenset({"rope_parameters", "rope_scaling", "rope_theta"})
LLAMA_READS = ROTARY | {
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "head_dim",
    "rms_norm_eps",
}
WINDOWED = frozenset({"sliding_window", "layer_types"})
QWEN_NEEDS = (
    Need(("sliding_window",), when="use_sliding_window"),
    Need(("max_window_layers", "layer_types"), when="use_sliding_window"),
)
LLAMA_ASSUMED = ("rms_norm_eps", "rope_theta")
SIZES = frozenset(
    {"hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "head_dim"}
)
PATTERN = frozenset({"sliding_window_pattern", "_sliding_window_pattern"})
NO_WINDOW = Rule((None,), "transformers' {family} has no sliding window")
EVERY_LAYER = Rule((None,), "transformers' {family} slides every layer or none")
FULL_ROPE = Rule((None, 1, 1.0), "transformers' {family} rotates every dim of each head")
NO_BIAS = Rule(OFF, "transformers' {family} reads no attention_bias")
