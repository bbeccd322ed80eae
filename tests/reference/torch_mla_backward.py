"""Write torch_mla_backward.json: torch.autograd float64 gradients through transformers' own
``DeepseekV3Attention`` (multi-head latent attention), for attn's backward pass of MLA.

Run once, by hand, in a throwaway venv (torch and transformers are not dependencies of attn):

    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install torch transformers==5.24.0 pyyaml
    /tmp/hfvenv/bin/python tests/reference/torch_mla_backward.py

Two cases. "example": the bundled fixtures/deepseek_mla.yaml (q LoRA, 2 heads, causal, W_O), its
weights put into the module (attn's ``X @ W`` layout transposed to torch Linear's; W_DKV and W_KR
joined into kv_a_proj_with_mqa, W_UK and W_UV interleaved per head into kv_b_proj), L = Σ
projected as attn takes it when the fixture has no ``grad``. "no q LoRA": q_proj, 3 heads,
d_rope 4, seeded weights and a seeded upstream gradient of o_proj's output.

The module runs as transformers 5.24 writes it, with two changes so every number is float64:
``DeepseekV3RMSNorm`` without its cast to float32, and an eager attention whose softmax stays in
float64 (transformers' takes it in float32). cos and sin are made as ``DeepseekV3RotaryEmbedding``
makes them for a default-rope config, in float64. Gradients are read from ``.grad`` of the
parameters and of intermediate tensors kept by forward hooks (c_Q, c_Q_norm, q_b_proj's output,
c_KV|k_rope, c_KV_norm, kv_b_proj's output, o_proj's input) and by the attention function (the
query and key states that enter the scores, the values, the weights). Nothing from attn is
imported; tests/core/test_mla_backward.py reads the JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
import yaml
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mdl
from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config

HERE = Path(__file__).parent
OUT = HERE / "torch_mla_backward.json"
EXAMPLE = HERE.parent.parent / "fixtures" / "deepseek_mla.yaml"
f64 = torch.float64
kept: dict[str, torch.Tensor] = {}


def rms_norm_f64(self: Any, x: torch.Tensor) -> torch.Tensor:
    """DeepseekV3RMSNorm.forward without the float32 cast."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))


def eager_f64(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> Any:
    """eager_attention_forward with its softmax in float64; keeps what it reads."""
    for name, x in (("Q", query), ("K", key), ("V", value)):
        x.retain_grad()
        kept[name] = x
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1)
    weights.retain_grad()
    kept["softmax"] = weights
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


mdl.DeepseekV3RMSNorm.forward = rms_norm_f64
mdl.eager_attention_forward = eager_f64


def arr(x: torch.Tensor) -> Any:
    return x.detach().to(f64).numpy().tolist()


def keep_output(name: str) -> Any:
    def hook(module: Any, args: Any, out: torch.Tensor) -> None:
        out.retain_grad()
        kept[name] = out

    return hook


def build(spec: dict[str, Any]) -> Any:
    config = DeepseekV3Config(
        hidden_size=spec["d_model"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["heads"],
        q_lora_rank=spec["q_rank"],
        kv_lora_rank=spec["rank"],
        qk_nope_head_dim=spec["d_nope"],
        qk_rope_head_dim=spec["d_rope"],
        v_head_dim=spec["d_v"],
        num_hidden_layers=1,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        rope_interleave=True,
        attention_bias=False,
    )
    config._attn_implementation = "eager"
    module = mdl.DeepseekV3Attention(config, layer_idx=0).to(f64).eval()
    hooks = {
        "kv_a_proj_with_mqa": "c_KV|k_rope",
        "kv_a_layernorm": "c_KV_norm",
        "kv_b_proj": "kv_b",
        "q_a_proj": "c_Q",
        "q_a_layernorm": "c_Q_norm",
        "q_b_proj": "q",
        "q_proj": "q",
    }
    for sub, name in hooks.items():
        if getattr(module, sub, None) is not None:
            getattr(module, sub).register_forward_hook(keep_output(name))

    def pre(m: Any, args: Any) -> None:
        args[0].retain_grad()
        kept["concat"] = args[0]

    module.o_proj.register_forward_pre_hook(pre)
    return module


def example_weights(fx: dict[str, Any]) -> tuple[dict[str, Any], np.ndarray]:
    """The example's weights as the module's state dict (torch Linear layout), and X."""
    m = {k: np.array(v, dtype=float) for k, v in fx["mla"].items() if isinstance(v, list)}
    H = fx["heads"]
    r = m["W_DKV"].shape[1]
    nope, dv = m["W_UK"].shape[1] // H, m["W_UV"].shape[1] // H
    kv_b = np.concatenate([m["W_UK"].reshape(r, H, nope), m["W_UV"].reshape(r, H, dv)], axis=2)
    return {
        "q_a_proj.weight": m["W_DQ"].T,
        "q_a_layernorm.weight": m["q_norm"],
        "q_b_proj.weight": m["W_UQ"].T,
        "kv_a_proj_with_mqa.weight": np.concatenate([m["W_DKV"], m["W_KR"]], axis=1).T,
        "kv_a_layernorm.weight": m["kv_norm"],
        "kv_b_proj.weight": kv_b.reshape(r, -1).T,
        "o_proj.weight": np.array(fx["W_O"], dtype=float).T,
    }, np.array(fx["X"], dtype=float)


def run(spec: dict[str, Any], weights: dict[str, Any] | None, X: Any) -> dict[str, Any]:
    kept.clear()
    module = build(spec)
    gen = torch.Generator().manual_seed(spec.get("seed", 0))
    with torch.no_grad():
        for name, param in module.named_parameters():
            if weights is None:
                param.copy_(torch.randn(param.shape, generator=gen, dtype=f64) * 0.5)
            else:
                param.copy_(torch.tensor(weights[name], dtype=f64))
    T, d_rope = spec["seq"], spec["d_rope"]
    if X is None:
        X = torch.randn(1, T, spec["d_model"], generator=gen, dtype=f64)
    else:
        X = torch.tensor(X, dtype=f64)[None]
    X.requires_grad_(True)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d_rope, 2, dtype=f64) / d_rope))
    freqs = torch.arange(T, dtype=f64)[:, None] * inv_freq[None, :]  # (T, d_rope/2)
    emb = torch.cat((freqs, freqs), dim=-1)[None]  # (1, T, d_rope), as the rotary's forward
    causal = torch.full((T, T), float("-inf"), dtype=f64).triu(1)[None, None]  # (1, 1, T, T)
    out, _ = module(X, (emb.cos(), emb.sin()), causal)
    grad = None if weights is not None else torch.randn(out.shape, generator=gen, dtype=f64)
    (out.sum() if grad is None else (out * grad).sum()).backward()
    return {
        "spec": spec,
        "scaling": module.scaling,
        "X": arr(X[0]),
        "grad": None if grad is None else arr(grad[0]),
        "weights": {k: arr(v) for k, v in module.state_dict().items()},
        "forward": {"projected": arr(out[0]), "softmax": arr(kept["softmax"][0])},
        "param_grads": {n: arr(p.grad) for n, p in module.named_parameters()},
        "d_X": arr(X.grad[0]),
        "stage_grads": {n: arr(t.grad[0]) for n, t in kept.items()},
    }


def main() -> None:
    fx = yaml.safe_load(EXAMPLE.read_text())
    weights, X = example_weights(fx)
    m = fx["mla"]
    H = fx["heads"]
    example = {
        "seq": len(X),
        "d_model": X.shape[1],
        "heads": H,
        "q_rank": len(m["q_norm"]),
        "rank": len(m["kv_norm"]),
        "d_nope": len(m["W_UK"][0]) // H,
        "d_rope": len(m["W_KR"][0]),
        "d_v": len(m["W_UV"][0]) // H,
    }
    lite = {
        "seed": 3,
        "seq": 4,
        "d_model": 6,
        "heads": 3,
        "q_rank": None,
        "rank": 5,
        "d_nope": 2,
        "d_rope": 4,
        "d_v": 2,
    }
    doc = {
        "generator": f"torch {torch.__version__}, transformers {transformers.__version__}",
        "cases": {"example": run(example, weights, X), "no q LoRA": run(lite, None, None)},
    }
    OUT.write_text(json.dumps(doc) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
