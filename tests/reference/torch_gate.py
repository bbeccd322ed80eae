"""Write torch_gate.json: Qwen3-Next gated attention computed by transformers itself, float64.

Run once, by hand, in a throwaway venv (torch and transformers are not dependencies of attn):

    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install torch==2.13.0 transformers==5.24.0
    /tmp/hfvenv/bin/python tests/reference/torch_gate.py

Each case builds HF's ``Qwen3NextAttention`` (models/qwen3_next/modeling_qwen3_next.py) from a
tiny ``Qwen3NextConfig``, draws its weights from a seeded generator (the q/k norms' weights too:
Qwen3-Next's RMSNorm scales by 1 + weight), and runs its forward with SDPA in float64 on
seeded states, with a causal mask and the model's own rotary embedding (partial rotary). The
module's input to o_proj (the gated heads) is caught by a forward pre-hook. Nothing from attn is
imported; tests/acceptance/test_gate_torch.py reads the JSON and builds the fixture from these
weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
from transformers.models.qwen3_next.modeling_qwen3_next import (
    Qwen3NextAttention,
    Qwen3NextRotaryEmbedding,
)

OUT = Path(__file__).with_name("torch_gate.json")
f64 = torch.float64

CASES: dict[str, dict[str, Any]] = {
    "GQA, partial rotary 0.5, no bias": {
        "seed": 0,
        "seq": 5,
        "hidden_size": 8,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 4,
        "partial_rotary_factor": 0.5,
        "attention_bias": False,
    },
    "4 heads, 2 kv heads, rotary 0.25 (the model's), bias": {
        "seed": 1,
        "seq": 6,
        "hidden_size": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "partial_rotary_factor": 0.25,
        "attention_bias": True,
    },
}


def arr(x: torch.Tensor) -> Any:
    return x.detach().cpu().to(f64).numpy().tolist()


def case(spec: dict[str, Any]) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(spec["seed"])
    config = Qwen3NextConfig(
        hidden_size=spec["hidden_size"],
        num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"],
        head_dim=spec["head_dim"],
        attention_bias=spec["attention_bias"],
        num_hidden_layers=1,
        rms_norm_eps=1e-6,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": spec["partial_rotary_factor"],
        },
    )
    config._attn_implementation = "sdpa"
    module = Qwen3NextAttention(config, layer_idx=0).to(f64).eval()
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=gen, dtype=f64) * 0.5)
    rotary = Qwen3NextRotaryEmbedding(config)
    T = spec["seq"]
    X = torch.randn(1, T, spec["hidden_size"], generator=gen, dtype=f64)
    position_ids = torch.arange(T)[None]
    cos, sin = rotary(X, position_ids)
    causal = torch.full((T, T), float("-inf"), dtype=f64).triu(1)[None, None]  # (1, 1, T, T)
    caught: dict[str, torch.Tensor] = {}
    module.o_proj.register_forward_pre_hook(lambda m, args: caught.update(gated=args[0]))
    with torch.no_grad():
        out, _ = module(X, (cos.to(f64), sin.to(f64)), causal)
    state = {k: arr(v) for k, v in module.state_dict().items()}
    return {
        "config": {k: spec[k] for k in spec if k != "seed"}
        | {"rope_theta": 10000.0, "rms_norm_eps": 1e-6},
        "X": arr(X[0]),
        "weights": state,  # torch Linear layout: (out_features, in_features)
        "gated": arr(caught["gated"][0]),  # (T, heads*head_dim): o_proj's input
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
