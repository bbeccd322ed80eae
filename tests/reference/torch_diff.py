"""Write torch_diff.json: differential attention as the paper's reference code computes it.

Run once, by hand, in a throwaway venv (torch is not a dependency of attn):

    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install torch
    /tmp/hfvenv/bin/python tests/reference/torch_diff.py

``MultiheadDiffAttn`` below is microsoft/unilm's ``Diff-Transformer/multihead_diffattn.py``
(``lambda_init_fn``, ``__init__`` and ``forward``) and ``Diff-Transformer/diff/rms_norm.py``
(``RMSNorm``, the fallback when apex is absent), transcribed line for line with three changes
only: no rotary embedding (``apply_rotary_emb`` with cos = 1, sin = 0 is the identity, so the
lines are left out: attn refuses diff with rope), no flash_attn import (the forward never calls
it), and the module in float64 (the reference's own ``.float()`` casts of the softmax, λ and
the norm's input are kept, so those steps round to float32 as the reference's do). Weights
and λ vectors are drawn from a seeded generator; each forward's intermediates are recorded.
Nothing from attn is imported; tests/core/test_diff.py reads the JSON.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

OUT = Path(__file__).with_name("torch_diff.json")
f64 = torch.float64


class RMSNorm(nn.Module):  # type: ignore[misc]
    def __init__(
        self,
        dim: int,
        eps: float = 1e-6,
        elementwise_affine: bool = True,
        memory_efficient: bool = False,
    ) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if self.elementwise_affine:
            self.weight = nn.Parameter(torch.ones(dim))
        else:
            self.register_parameter("weight", None)

    def _norm(self, x: Any) -> Any:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: Any) -> Any:
        output = self._norm(x.float()).type_as(x)
        if self.weight is not None:
            output = output * self.weight
        return output


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    bs, n_kv_heads, slen, head_dim = x.shape
    if n_rep == 1:
        return x
    return (
        x[:, :, None, :, :]
        .expand(bs, n_kv_heads, n_rep, slen, head_dim)
        .reshape(bs, n_kv_heads * n_rep, slen, head_dim)
    )


def lambda_init_fn(depth: int) -> float:
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


class MultiheadDiffAttn(nn.Module):  # type: ignore[misc]
    def __init__(
        self, embed_dim: int, depth: int, num_heads: int, num_kv_heads: int | None = None
    ) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads if num_kv_heads is not None else num_heads
        self.n_rep = self.num_heads // self.num_kv_heads
        self.head_dim = embed_dim // num_heads // 2
        self.scaling = self.head_dim**-0.5
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.k_proj = nn.Linear(embed_dim, embed_dim // self.n_rep, bias=False)
        self.v_proj = nn.Linear(embed_dim, embed_dim // self.n_rep, bias=False)
        self.out_proj = nn.Linear(self.num_heads * 2 * self.head_dim, embed_dim, bias=False)
        self.lambda_init = lambda_init_fn(depth)
        self.lambda_q1 = nn.Parameter(
            torch.zeros(self.head_dim, dtype=torch.float32).normal_(mean=0, std=0.1)
        )
        self.lambda_k1 = nn.Parameter(
            torch.zeros(self.head_dim, dtype=torch.float32).normal_(mean=0, std=0.1)
        )
        self.lambda_q2 = nn.Parameter(
            torch.zeros(self.head_dim, dtype=torch.float32).normal_(mean=0, std=0.1)
        )
        self.lambda_k2 = nn.Parameter(
            torch.zeros(self.head_dim, dtype=torch.float32).normal_(mean=0, std=0.1)
        )
        self.subln = RMSNorm(2 * self.head_dim, eps=1e-5, elementwise_affine=True)

    def forward(self, x: Any, rel_pos: Any, attn_mask: Any = None, record: Any = None) -> Any:
        bsz, tgt_len, _embed_dim = x.size()
        src_len = tgt_len
        q = self.q_proj(x)
        k = self.k_proj(x)
        v = self.v_proj(x)
        q = q.view(bsz, tgt_len, 2 * self.num_heads, self.head_dim)
        k = k.view(bsz, src_len, 2 * self.num_kv_heads, self.head_dim)
        v = v.view(bsz, src_len, self.num_kv_heads, 2 * self.head_dim)
        # (apply_rotary_emb left out: rel_pos = (cos 1, sin 0) turns nothing)
        offset = src_len - tgt_len
        q = q.transpose(1, 2)
        k = repeat_kv(k.transpose(1, 2), self.n_rep)
        v = repeat_kv(v.transpose(1, 2), self.n_rep)
        q *= self.scaling
        attn_weights = torch.matmul(q, k.transpose(-1, -2))
        if attn_mask is None:
            attn_mask = torch.triu(
                torch.zeros([tgt_len, src_len]).float().fill_(float("-inf")).type_as(attn_weights),
                1 + offset,
            )
        attn_weights = torch.nan_to_num(attn_weights)
        attn_weights += attn_mask
        attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).type_as(attn_weights)
        record["weights"] = attn_weights.clone()  # (bsz, 2·heads, T, S): A1, A2 per head
        lambda_1 = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dim=-1).float()).type_as(q)
        lambda_2 = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dim=-1).float()).type_as(q)
        lambda_full = lambda_1 - lambda_2 + self.lambda_init
        record["lambda_full"] = lambda_full.clone()
        attn_weights = attn_weights.view(bsz, self.num_heads, 2, tgt_len, src_len)
        attn_weights = attn_weights[:, :, 0] - lambda_full * attn_weights[:, :, 1]
        record["diff"] = attn_weights.clone()
        attn = torch.matmul(attn_weights, v)
        record["diff_output"] = attn.clone()
        attn = self.subln(attn)
        record["diff_norm"] = attn.clone()
        attn = attn * (1 - self.lambda_init)
        record["diff_scaled"] = attn.clone()
        attn = attn.transpose(1, 2).reshape(bsz, tgt_len, self.num_heads * 2 * self.head_dim)
        attn = self.out_proj(attn)
        return attn


CASES: dict[str, dict[str, Any]] = {
    "causal (the reference's default mask), 2 heads, depth 3": {
        "seed": 0,
        "batch": 2,
        "seq": 5,
        "embed_dim": 16,
        "heads": 2,
        "depth": 3,
        "lambda_std": 0.5,
        "mask": None,
    },
    "bidirectional (a zero mask), 1 head, depth 0": {
        "seed": 1,
        "batch": 1,
        "seq": 4,
        "embed_dim": 8,
        "heads": 1,
        "depth": 0,
        "lambda_std": 0.1,
        "mask": "zeros",
    },
    "key padding (-inf on the last keys of item 1), 4 heads, depth 11": {
        "seed": 2,
        "batch": 2,
        "seq": 6,
        "embed_dim": 16,
        "heads": 4,
        "depth": 11,
        "lambda_std": 0.8,
        "mask": "padding",
    },
}


def arr(x: torch.Tensor) -> Any:
    return x.detach().cpu().to(f64).numpy().tolist()


def case(spec: dict[str, Any]) -> dict[str, Any]:
    torch.manual_seed(spec["seed"])
    E, H, T, B = spec["embed_dim"], spec["heads"], spec["seq"], spec["batch"]
    module = MultiheadDiffAttn(E, spec["depth"], H).to(f64)
    with torch.no_grad():
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(module, name).normal_(mean=0, std=spec["lambda_std"])
        module.subln.weight.copy_(1.0 + 0.3 * torch.randn(2 * module.head_dim, dtype=f64))
    x = torch.randn(B, T, E, dtype=f64)
    mask: Any = None
    if spec["mask"] == "zeros":
        mask = torch.zeros(T, T, dtype=f64)
    elif spec["mask"] == "padding":
        mask = torch.zeros(B, 1, T, T, dtype=f64)
        mask[1, :, :, T - 2 :] = float("-inf")  # item 1's last two keys are padding
    record: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        out = module(x, None, attn_mask=mask, record=record)
    keys_allowed = None if spec["mask"] != "padding" else arr(torch.isfinite(mask[:, 0, 0]))
    return {
        "torch": torch.__version__,
        "spec": spec,
        "X": arr(x),
        "W_Q": arr(module.q_proj.weight.T),
        "W_K": arr(module.k_proj.weight.T),
        "W_V": arr(module.v_proj.weight.T),
        "W_O": arr(module.out_proj.weight.T),
        "lambda_q1": arr(module.lambda_q1),
        "lambda_k1": arr(module.lambda_k1),
        "lambda_q2": arr(module.lambda_q2),
        "lambda_k2": arr(module.lambda_k2),
        "lambda_init": module.lambda_init,
        "norm": arr(module.subln.weight),
        "keys_allowed": keys_allowed,
        **{name: arr(t) for name, t in record.items()},
        "out": arr(out),
    }


def main() -> None:
    cases = {name: case(spec) for name, spec in CASES.items()}
    OUT.write_text(json.dumps(cases, indent=1) + "\n")


if __name__ == "__main__":
    main()
