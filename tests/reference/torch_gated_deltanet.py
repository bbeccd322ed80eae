"""Reference numbers for Gated DeltaNet from transformers' own code (issue 24, linear attention).

Run once in a throwaway venv with torch (cpu) and transformers 5.24 (neither is a dependency of
attn); writes tests/reference/torch_gated_deltanet.json, which tests/test_linear_torch.py reads:

* ``torch_recurrent_gated_delta_rule`` and ``torch_chunk_gated_delta_rule`` (chunk_size 4 and
  64) of models/qwen3_next/modeling_qwen3_next.py on random q, k, v, g, beta (two value heads
  per key head, use_qk_l2norm_in_kernel=True as Qwen3NextGatedDeltaNet calls them); both run
  in float32 inside, whatever comes in;
* the whole ``Qwen3NextGatedDeltaNet`` layer of a tiny random config, no cache (the chunked
  path, the conv's torch fallback), its weights as the checkpoint holds them and its output.

    /tmp/hfvenv/bin/python tests/reference/torch_gated_deltanet.py
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import Qwen3NextConfig
from transformers.models.qwen3_next import modeling_qwen3_next as m

OUT = Path(__file__).with_suffix(".json")


def rules() -> dict[str, object]:
    g = torch.Generator().manual_seed(0)
    B, T, Hk, Hv, dk, dv = 2, 11, 2, 4, 4, 3
    q = torch.randn(B, T, Hk, dk, generator=g, dtype=torch.float64)
    k = torch.randn(B, T, Hk, dk, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, Hv, dv, generator=g, dtype=torch.float64)
    beta = torch.rand(B, T, Hv, generator=g, dtype=torch.float64)
    decay = -torch.rand(B, T, Hv, generator=g, dtype=torch.float64) * 0.7
    kw = dict(g=decay, beta=beta, use_qk_l2norm_in_kernel=True)
    rec, _ = m.torch_recurrent_gated_delta_rule(q, k, v, **kw)
    out: dict[str, object] = {
        "q": q.tolist(),
        "k": k.tolist(),
        "v": v.tolist(),
        "g": decay.tolist(),
        "beta": beta.tolist(),
        "recurrent": rec.tolist(),
    }
    for size in (4, 64):
        chunk, _ = m.torch_chunk_gated_delta_rule(q, k, v, chunk_size=size, **kw)
        out[f"chunk_{size}"] = chunk.tolist()
    return out


def layer() -> dict[str, object]:
    torch.manual_seed(1)
    config = Qwen3NextConfig(
        hidden_size=8,
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        linear_key_head_dim=4,
        linear_value_head_dim=3,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        intermediate_size=8,
        vocab_size=16,
    )
    net = m.Qwen3NextGatedDeltaNet(config, 0).double()
    with torch.no_grad():
        for p in (net.dt_bias, net.norm.weight):
            p.copy_(torch.rand_like(p) + 0.5)
    X = torch.randn(1, 7, 8, dtype=torch.float64)
    with torch.no_grad():
        y = net(X)
    state = {k: v.tolist() for k, v in net.state_dict().items()}
    return {
        "config": {
            "hidden_size": 8,
            "num_k_heads": 1,
            "num_v_heads": 2,
            "head_k_dim": 4,
            "head_v_dim": 3,
            "conv_kernel": 4,
            "eps": 1e-6,
        },
        "X": X.tolist(),
        "weights": state,
        "output": y.tolist(),
    }


if __name__ == "__main__":
    import transformers

    data = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "rules": rules(),
        "layer": layer(),
    }
    OUT.write_text(json.dumps(data) + "\n", encoding="utf-8")
