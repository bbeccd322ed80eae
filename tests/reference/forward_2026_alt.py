"""Make tests/reference/forward_2026_alt/: forward_2026.py's cases in another shape (issue 41's
hidden set will not have our sizes, seed, text or key values).

Run ONCE, in a throwaway venv with torch and transformers 5.25 (as forward_2026.py):

    /tmp/hfvenv/bin/python tests/reference/forward_2026_alt.py [case ...] [--out DIR]
    (add --wide for the wide shape, --second for the second key values)

forward_2026.py's builders and its make() are reused as they are; only what they read is changed:
seed 5, an 11-word text with repeated words, 5 layers with the deep layers 3 and 4, and per case
the keys in ALT, merged over what the builder passes (a second value of each key with several
meaningful values). Sizes: families.py's (hidden 16, 2 heads, 1 KV head), or with --wide hidden
32, 4 heads, 2 KV heads (and WIDE's per-case sizes). GPT-J's config is not built by families.tiny:
its keys are merged into the builder's config.

Measured (transformers 5.25.0, torch 2.13.0): from --text, attn matches all 26 deep checks of the
narrow set at rtol 1e-4 / atol 1e-5; in the wide set the residual stream reaches |h| ~ 100 and 10
of the 26 `projected` checks miss by 1-13 of 352 elements (at most 2.7e-4 absolute) while X and
the weights pass and the same layers imported from transformers' own hidden states pass: the
float32 reference's rounding along the walk (transformers run in float64 misses its own float32
output by as much: 1.5e-5 to 2.2e-4). With --second, 23 of 26 match; ministral3's layer 4
misses by one element (3.0e-5, the same rounding: 1.6e-6 from transformers' hidden states) and
glm4_moe's n_shared_experts 0 is refused in one line (both layers).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import families as fam
import forward_2026 as f26

LAYERS = 5
SIZES = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
# --wide: per-case sizes (the narrow set keeps the builders' and families.py's)
WIDE: dict[str, dict[str, Any]] = {
    "stablelm": {"num_key_value_heads": 2},
    "gptj": {"n_embd": 48, "n_head": 4, "rotary_dim": 6},
    "glm4_moe": {"head_dim": 16},
    "ernie4_5_moe": {"head_dim": 16},
    "seed_oss": {"head_dim": 12},
}
TEXT = "h a c e g b d f a h c"  # 11 tokens, repeated words

# per case: keys merged over the builder's (the builder's value -> another meaningful value)
ALT: dict[str, dict[str, Any]] = {
    # T = 11 <= original 16: the short factors (and the attention factor of 64 / 16)
    "phi3": {
        "original_max_position_embeddings": 16,
        "max_position_embeddings": 64,
        "rope_scaling": {
            "type": "longrope",
            "short_factor": [1.0, 2.0, 4.0],
            "long_factor": [2.0, 5.0, 9.0],
        },
    },
    # NoPE on layers 2 and 4; a sliding window of 5 on the layers layer_types says
    "smollm3": {
        "no_rope_layers": [1, 1, 0, 1, 0],
        "use_sliding_window": True,
        "sliding_window": 5,
        "max_window_layers": 3,
        "layer_types": [
            *("full_attention", "sliding_attention", "full_attention"),
            *("sliding_attention", "sliding_attention"),
        ],
    },
    # explicit layer_types (layer 3 full NoPE, layer 4 sliding with RoPE), window 5
    "cohere2": {
        "sliding_window": 5,
        "logit_scale": 0.5,
        "layer_types": [
            *("sliding_attention", "full_attention", "sliding_attention"),
            *("full_attention", "sliding_attention"),
        ],
    },
    "stablelm": {"use_qkv_bias": True, "partial_rotary_factor": 0.5},
    # MoE on every layer, chunks of 3, NoPE every 2nd layer (1, 3), llama3 with a smooth band
    "llama4_text": {
        "interleave_moe_layer_step": 1,
        "attention_chunk_size": 3,
        "no_rope_layer_interval": 2,
        "floor_scale": 3,
        "attn_scale": 0.2,
        "num_local_experts": 3,
        "num_experts_per_tok": 1,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 2.0,
            "original_max_position_embeddings": 32,
        },
        "rope_theta": 10_000.0,
    },
    "hunyuan_v1_dense": {
        "rope_scaling": {"type": "dynamic", "alpha": 50.0, "factor": 1.0},
        "rope_theta": 20_000.0,
    },
    "gptj": {"n_inner": 40, "n_layer": LAYERS},
    "glm4_moe": {
        "use_qk_norm": False,
        "partial_rotary_factor": 0.25,
        "n_group": 2,
        "topk_group": 1,
        "norm_topk_prob": False,
        "routed_scaling_factor": 1.5,
        "first_k_dense_replace": 2,
    },
    "ernie4_5_moe": {
        "num_key_value_heads": 1,
        "moe_num_experts": 3,
        "moe_k": 1,
        "moe_layer_interval": 2,
        "moe_norm_min": 0.5,
    },
    "seed_oss": {"rope_theta": 100_000.0},
    "apertus": {
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 2.0,
            "original_max_position_embeddings": 32,
        },
        "rope_theta": 10_000.0,
        "max_position_embeddings": 128,
    },
    "ministral3": {
        "rope_parameters": {
            "type": "yarn",
            "rope_theta": 10_000.0,
            "factor": 8.0,
            "original_max_position_embeddings": 3,
            "max_position_embeddings": 64,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
            "mscale_all_dim": 0.5,
            "mscale": 1.0,
            "llama_4_scaling_beta": 0.3,
        },
    },
    "olmo_clip": {"clip_qkv": 0.8},
}
# --second: a third value of other keys (narrow shape only: GPT-J's rotary_dim 16 is its head)
SECOND: dict[str, dict[str, Any]] = {
    "phi3": {
        "sliding_window": 5,
        "partial_rotary_factor": 1.0,
        "rope_scaling": {
            "type": "longrope",
            "short_factor": [1.0, 1.5, 2.0, 3.0],
            "long_factor": [2.0, 3.0, 5.0, 8.0],
        },
    },
    "smollm3": {"use_sliding_window": False, "sliding_window": None, "layer_types": None},
    "cohere2": {"layer_types": ["sliding_attention"] * LAYERS},
    "stablelm": {"use_parallel_residual": False, "qk_layernorm": False},
    "llama4_text": {
        "attn_temperature_tuning": False,
        "use_qk_norm": False,
        "interleave_moe_layer_step": 2,
    },
    "hunyuan_v1_dense": {"rope_scaling": {"type": "dynamic", "alpha": 1.0, "factor": 1.0}},
    "gptj": {"rotary_dim": 16},
    # n_shared_experts 0 builds a 0-wide shared MLP in transformers; attn refuses it in one line
    "glm4_moe": {"n_shared_experts": 0, "attention_bias": False, "norm_topk_prob": True},
    "ernie4_5_moe": {"moe_num_shared_experts": 0, "use_bias": False, "moe_layer_end_index": 3},
    "seed_oss": {"attention_out_bias": True, "attention_bias": False},
    "apertus": {"rope_scaling": None, "rope_theta": 500_000.0},
    "ministral3": {
        "rope_parameters": {
            "type": "yarn",
            "rope_theta": 10_000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "max_position_embeddings": 64,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale_all_dim": 1.0,
            "mscale": 1.0,
            "llama_4_scaling_beta": 0.0,
        },
    },
    "olmo_clip": {"clip_qkv": None},
}
CASE = {"name": ""}  # the case being built, read by tiny()


def tiny(cls_name: str, **extra: Any) -> Any:
    return fam.tiny(cls_name, **{**f26.DEEP, **extra, **ALT[CASE["name"]]})


def gptj() -> Any:
    config = BUILDERS["gptj"]()
    return type(config)(**{**config.to_dict(), **ALT["gptj"]})


BUILDERS: dict[str, Callable[[], Any]] = {case: build for case, (build, _) in f26.CASES.items()}


def shape(wide: bool, second: bool) -> None:
    """Point forward_2026.py and families.py at this set's shape."""
    for case, keys in SECOND.items():
        ALT[case] = {**ALT[case], **(keys if second else {})}
    fam.TINY = {**fam.TINY, **(SIZES if wide else {}), "max_position_embeddings": 64}
    for case, sizes in WIDE.items():
        ALT[case] = {**ALT[case], **(sizes if wide else {})}
    fam.SEED = 5
    fam.TEXT = TEXT
    f26.LAYERS = LAYERS
    f26.DEEP = {"num_hidden_layers": LAYERS, "intermediate_size": 40}
    f26.DEEP_LAYERS = [3, 4]
    f26.SHIPPED = {}  # cohere2 keeps its explicit layer_types
    f26.tiny = tiny
    f26.CASES = {
        case: (gptj if case == "gptj" else build, f"{notes} [alt: {ALT[case]}]")
        for case, (build, notes) in f26.CASES.items()
    }


def main() -> None:
    args = sys.argv[1:]
    f26.ROOT = Path(__file__).with_name("forward_2026_alt")
    if "--out" in args:
        at = args.index("--out")
        f26.ROOT = Path(args[at + 1])
        del args[at : at + 2]
    flags = {a for a in args if a.startswith("--")}
    args = [a for a in args if a not in flags]
    shape("--wide" in flags, "--second" in flags)
    for case in f26.CASES:
        if not args or case in args:
            CASE["name"] = case
            f26.make(case)


if __name__ == "__main__":
    main()
