"""Write torch_mla.json: DeepSeek V3's multi-head latent attention computed by transformers
itself, float64.

Run once, by hand, in a throwaway venv (torch and transformers are not dependencies of attn):

    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install torch transformers==5.24.0
    /tmp/hfvenv/bin/python tests/reference/torch_mla.py

Each case builds HF's ``DeepseekV3Attention`` (models/deepseek_v3/modeling_deepseek_v3.py) from a
tiny ``DeepseekV3Config``, draws its weights from a seeded generator (the two RMSNorms' weights
too), and runs its forward with eager attention in float64 on seeded states, with a causal mask and
plain RoPE: cos and sin made as ``DeepseekV3RotaryEmbedding.forward`` makes them for a default-rope
config (cat(freqs, freqs), inv_freq = 1/base^(2i/d_rope)), but in float64, where transformers
computes them in float32 (its 1e-7 would hide nothing attn could get wrong here, but would blur the
comparison). For the yarn case the module's ``scaling`` takes yarn's mscale², what that case
checks, while the cos and sin stay plain. The module's input to o_proj (the heads side by side) is
caught by a forward pre-hook, and its attention weights are what eager attention returns (its
softmax runs in float32, so they and what follows hold float32's digits). Nothing from attn is
imported; tests/acceptance/test_mla_torch.py reads the JSON and builds the fixture from these
weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

OUT = Path(__file__).with_name("torch_mla.json")
f64 = torch.float64

CASES: dict[str, dict[str, Any]] = {
    "V3: q LoRA, interleaved RoPE": {
        "seed": 0,
        "seq": 5,
        "hidden_size": 8,
        "num_attention_heads": 2,
        "q_lora_rank": 6,
        "kv_lora_rank": 4,
        "qk_nope_head_dim": 4,
        "qk_rope_head_dim": 2,
        "v_head_dim": 3,
    },
    "V2-Lite: no q LoRA (q_proj), 3 heads, d_rope 4": {
        "seed": 1,
        "seq": 4,
        "hidden_size": 6,
        "num_attention_heads": 3,
        "q_lora_rank": None,
        "kv_lora_rank": 5,
        "qk_nope_head_dim": 2,
        "qk_rope_head_dim": 4,
        "v_head_dim": 2,
    },
    "yarn's mscale_all_dim in the scale": {
        "seed": 2,
        "seq": 4,
        "hidden_size": 8,
        "num_attention_heads": 2,
        "q_lora_rank": 4,
        "kv_lora_rank": 4,
        "qk_nope_head_dim": 2,
        "qk_rope_head_dim": 4,
        "v_head_dim": 2,
        "yarn": {
            "rope_type": "yarn",
            "factor": 40.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32,
            "beta_slow": 1,
        },
    },
}
SIZES = (
    "hidden_size",
    "num_attention_heads",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
)


def arr(x: torch.Tensor) -> Any:
    return x.detach().cpu().to(f64).numpy().tolist()


def config_of(spec: dict[str, Any], rope: dict[str, Any]) -> DeepseekV3Config:
    config = DeepseekV3Config(
        **{k: spec[k] for k in SIZES},
        num_key_value_heads=spec["num_attention_heads"],
        num_hidden_layers=1,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        rope_parameters={"rope_theta": 10000.0, **rope},
        rope_interleave=True,
        attention_bias=False,
    )
    config._attn_implementation = "eager"
    return config


def case(spec: dict[str, Any]) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(spec["seed"])
    config = config_of(spec, spec.get("yarn", {"rope_type": "default"}))
    module = DeepseekV3Attention(config, layer_idx=0).to(f64).eval()
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=gen, dtype=f64) * 0.5)
    T, d_rope = spec["seq"], spec["qk_rope_head_dim"]
    X = torch.randn(1, T, spec["hidden_size"], generator=gen, dtype=f64)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d_rope, 2, dtype=f64) / d_rope))
    freqs = torch.arange(T, dtype=f64)[:, None] * inv_freq[None, :]  # (T, d_rope/2)
    emb = torch.cat((freqs, freqs), dim=-1)[None]  # (1, T, d_rope), as the rotary's forward
    cos, sin = emb.cos(), emb.sin()
    causal = torch.full((T, T), float("-inf"), dtype=f64).triu(1)[None, None]  # (1, 1, T, T)
    caught: dict[str, torch.Tensor] = {}
    module.o_proj.register_forward_pre_hook(lambda m, args: caught.update(concat=args[0]))
    with torch.no_grad():
        out, weights = module(X, (cos, sin), causal)
    return {
        "config": {k: spec[k] for k in SIZES}
        | {"rope_theta": 10000.0, "eps": 1e-6, "yarn": spec.get("yarn")},
        "scaling": module.scaling,
        "X": arr(X[0]),
        "weights": {k: arr(v) for k, v in module.state_dict().items()},  # (out, in) as Linear
        "softmax": arr(weights[0]),  # (heads, T, T)
        "concat": arr(caught["concat"][0]),  # (T, heads*v_head_dim): o_proj's input
        "output": arr(out[0]),  # (T, hidden_size)
    }


def main() -> None:
    doc = {
        "generator": f"torch {torch.__version__}, transformers {transformers.__version__}",
        "cases": {name: case(spec) for name, spec in CASES.items()},
    }
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
