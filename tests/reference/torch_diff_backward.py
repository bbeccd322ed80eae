"""Write torch_diff_backward.json: torch.autograd float64 gradients through differential
attention as the paper's reference code computes it, for attn's backward pass of ``diff``.

Run once, by hand, in a throwaway venv (torch is not a dependency of attn):

    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install torch pyyaml
    /tmp/hfvenv/bin/python tests/reference/torch_diff_backward.py

The module is torch_diff.py's transcription of microsoft/unilm's ``MultiheadDiffAttn``; its
forward is run as :func:`forward64` below: the same lines with the reference's three float32
casts left out (the softmax's ``dtype=torch.float32``, λ's ``.float()``, the RMSNorm's
``x.float()``), so every number is float64, and each intermediate kept with ``retain_grad()``.
Two cases: "example", the bundled fixtures/diff_transformer.yaml (2 heads, depth 2, a norm
weight, causal, L = Σ projected as attn takes it without ``grad``); "3 heads, batch 2", seeded
weights, λ vectors and upstream gradient. Nothing from attn is imported;
tests/core/test_diff_backward.py reads the JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from torch_diff import MultiheadDiffAttn, repeat_kv

HERE = Path(__file__).parent
OUT = HERE / "torch_diff_backward.json"
EXAMPLE = HERE.parent.parent / "fixtures" / "diff_transformer.yaml"
f64 = torch.float64
VECTORS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def forward64(self: Any, x: Any, kept: dict[str, Any]) -> Any:
    """MultiheadDiffAttn.forward without its float32 casts (and without rotary, as
    torch_diff.py), every intermediate kept with its gradient."""

    def keep(name: str, t: Any) -> Any:
        t.retain_grad()
        kept[name] = t
        return t

    bsz, tgt_len, _embed_dim = x.size()
    src_len = tgt_len
    q = keep("Q", self.q_proj(x))
    k = keep("K", self.k_proj(x))
    v = keep("V", self.v_proj(x))
    q = q.view(bsz, tgt_len, 2 * self.num_heads, self.head_dim)
    k = k.view(bsz, src_len, 2 * self.num_kv_heads, self.head_dim)
    v = v.view(bsz, src_len, self.num_kv_heads, 2 * self.head_dim)
    offset = src_len - tgt_len
    q = q.transpose(1, 2)
    k = repeat_kv(k.transpose(1, 2), self.n_rep)
    v = repeat_kv(v.transpose(1, 2), self.n_rep)
    q = q * self.scaling  # (the reference scales in place; a leaf-safe copy here)
    attn_weights = torch.matmul(q, k.transpose(-1, -2))
    attn_mask = torch.triu(
        torch.zeros([tgt_len, src_len]).fill_(float("-inf")).type_as(attn_weights), 1 + offset
    )
    attn_weights = torch.nan_to_num(attn_weights)
    attn_weights = attn_weights + attn_mask
    attn_weights = keep("maps", torch.softmax(attn_weights, dim=-1))  # (b, 2·heads, T, S)
    lambda_1 = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dim=-1))
    lambda_2 = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dim=-1))
    lambda_full = keep("lambda", lambda_1 - lambda_2 + self.lambda_init)
    attn_weights = attn_weights.view(bsz, self.num_heads, 2, tgt_len, src_len)
    attn_weights = keep("diff", attn_weights[:, :, 0] - lambda_full * attn_weights[:, :, 1])
    attn = keep("diff_output", torch.matmul(attn_weights, v))
    sub = self.subln
    attn = keep(
        "diff_norm", attn * torch.rsqrt(attn.pow(2).mean(-1, keepdim=True) + sub.eps) * sub.weight
    )
    attn = keep("diff_scaled", attn * (1 - self.lambda_init))
    attn = attn.transpose(1, 2).reshape(bsz, tgt_len, self.num_heads * 2 * self.head_dim)
    return self.out_proj(attn)


def arr(x: torch.Tensor) -> Any:
    return x.detach().to(f64).numpy().tolist()


def run(module: Any, x: Any, grad: Any) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    x.requires_grad_(True)
    out = forward64(module, x, kept)
    (out.sum() if grad is None else (out * grad).sum()).backward()
    params = dict(module.named_parameters())
    return {
        "heads": module.num_heads,
        "depth": module.depth,
        "lambda_init": module.lambda_init,
        "X": arr(x),
        "W_Q": arr(module.q_proj.weight.T),
        "W_K": arr(module.k_proj.weight.T),
        "W_V": arr(module.v_proj.weight.T),
        "W_O": arr(module.out_proj.weight.T),
        **{n: arr(params[n]) for n in VECTORS},
        "norm": arr(module.subln.weight),
        "grad": None if grad is None else arr(grad),
        "projected": arr(out),
        "d_X": arr(x.grad),
        "d_W": {n: arr(p.grad.T if p.grad.ndim == 2 else p.grad) for n, p in params.items()},
        "d_stage": {n: arr(t.grad) for n, t in kept.items()},
    }


def module_of(embed: int, depth: int, heads: int) -> Any:
    module = MultiheadDiffAttn(embed, depth, heads).to(f64)
    module.depth = depth
    return module


def example() -> dict[str, Any]:
    fx = yaml.safe_load(EXAMPLE.read_text())
    X = torch.tensor(fx["X"], dtype=f64)[None]  # (1, T, d_model)
    d = fx["diff"]
    module = module_of(X.shape[2], d["depth"], fx["heads"])
    with torch.no_grad():
        for n, w in (("q_proj", "W_Q"), ("k_proj", "W_K"), ("v_proj", "W_V"), ("out_proj", "W_O")):
            getattr(module, n).weight.copy_(torch.tensor(fx[w], dtype=f64).T)
        for n in VECTORS:
            getattr(module, n).copy_(torch.tensor(d[n], dtype=f64))
        module.subln.weight.copy_(torch.tensor(d["norm"], dtype=f64))
    return run(module, X, None)


def seeded() -> dict[str, Any]:
    torch.manual_seed(4)
    module = module_of(12, 5, 3)
    with torch.no_grad():
        for n in VECTORS:
            getattr(module, n).normal_(mean=0, std=0.6)
        module.subln.weight.copy_(1.0 + 0.3 * torch.randn(4, dtype=f64))
    X = torch.randn(2, 5, 12, dtype=f64)
    return run(module, X, torch.randn(2, 5, 12, dtype=f64))


def main() -> None:
    doc = {
        "generator": f"torch {torch.__version__}",
        "cases": {"example": example(), "3 heads, batch 2": seeded()},
    }
    OUT.write_text(json.dumps(doc) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
