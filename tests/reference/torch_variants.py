"""Write torch_variants.json: PyTorch reference numbers for the attention variants, float64.

Run once, by hand, in a throwaway venv (torch is not a dependency of attn):

    python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch==2.13.0 numpy
    /tmp/torchvenv/bin/python tests/reference/torch_variants.py

Each case re-types the way the reference code computes it, in torch, from seeded inputs:
HF ``rotate_half`` RoPE (GPT-NeoX partial rotary too), Meta llama's complex RoPE
(``torch.polar`` / ``view_as_complex``), HF's ``permute`` of Meta weights, SDPA with an explicit
HF-style sliding-window mask (checked against FlashAttention's ``window_size`` rule), and gpt-oss's
``sdpa`` with sinks. Nothing from attn is imported.
tests/acceptance/test_variants_reference.py reads the JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

OUT = Path(__file__).with_name("torch_variants.json")
f64 = torch.float64


def arr(x: torch.Tensor) -> Any:
    return x.detach().cpu().numpy().tolist()


def tensor(x: np.ndarray) -> torch.Tensor:
    return torch.tensor(x, dtype=f64)


# --- HF transformers (modeling_llama / modeling_gpt_neox), in float64 ---------------------------


def hf_inv_freq(dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(f64) / dim))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def hf_rope(x: torch.Tensor, positions: torch.Tensor, base: float, rot: int) -> torch.Tensor:
    """x (B, H, T, D); GPT-NeoX partial rotary: the first ``rot`` dims rotate."""
    freqs = positions[:, None].to(f64) * hf_inv_freq(rot, base)[None, :]  # (T, rot/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, rot)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)


# --- Meta llama (model.py) ----------------------------------------------------------------------


def precompute_freqs_cis(dim: int, positions: torch.Tensor, theta: float) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].to(f64) / dim))
    freqs = torch.outer(positions.to(f64), freqs)
    return torch.polar(torch.ones_like(freqs), freqs)  # complex128


def meta_rope(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """x (B, T, H, D) as Meta lays it out."""
    x_ = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
    freqs = freqs_cis.view(1, x_.shape[1], 1, x_.shape[-1])
    return torch.view_as_real(x_ * freqs).flatten(3)


def hf_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """convert_llama_weights_to_hf: Meta (interleaved) rows -> HF (rotate_half) rows."""
    dim1, dim2 = w.shape
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


# --- gpt-oss (gpt_oss/torch/model.py) -----------------------------------------------------------


def gpt_oss_sdpa(
    Q: torch.Tensor,
    K: torch.Tensor,
    V: torch.Tensor,
    S: torch.Tensor,
    sm_scale: float,
    sliding_window: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss ``sdpa``, returning the kept weights too."""
    n_tokens, n_heads, q_mult, d_head = Q.shape
    assert K.shape == (n_tokens, n_heads, d_head)
    assert V.shape == (n_tokens, n_heads, d_head)
    K = K[:, :, None, :].expand(-1, -1, q_mult, -1)
    V = V[:, :, None, :].expand(-1, -1, q_mult, -1)
    S = S.reshape(n_heads, q_mult, 1, 1).expand(-1, -1, n_tokens, -1)
    mask = torch.triu(Q.new_full((n_tokens, n_tokens), -float("inf")), diagonal=1)
    if sliding_window > 0:
        mask += torch.tril(
            mask.new_full((n_tokens, n_tokens), -float("inf")), diagonal=-sliding_window
        )
    QK = torch.einsum("qhmd,khmd->hmqk", Q, K)
    QK *= sm_scale
    QK += mask[None, None, :, :]
    QK = torch.cat([QK, S], dim=-1)
    W = torch.softmax(QK, dim=-1)
    W = W[..., :-1]
    attn = torch.einsum("hmqk,khmd->qhmd", W, V)
    return attn.reshape(n_tokens, -1), W


# --- the cases ----------------------------------------------------------------------------------


def rope_cases(rng: np.random.Generator) -> list[dict[str, Any]]:
    cases = []
    x = rng.normal(size=(1, 2, 5, 8))  # (B, H, T, D)
    positions = [0, 1, 2, 7, 100]
    for base, rot in ((10000.0, 8), (500000.0, 8), (10000.0, 4)):
        out = hf_rope(tensor(x), torch.tensor(positions), base, rot)
        cases.append(
            {
                "kind": "hf_rotate_half",
                "base": base,
                "dims": rot,
                "positions": positions,
                "x": x.tolist(),
                "out": arr(out),
            }
        )
    for base in (10000.0, 500000.0):
        fc = precompute_freqs_cis(8, torch.tensor(positions), base)
        out = meta_rope(tensor(x).transpose(1, 2), fc).transpose(1, 2)  # (B, H, T, D)
        cases.append(
            {
                "kind": "meta_complex",
                "base": base,
                "dims": 8,
                "positions": positions,
                "x": x.tolist(),
                "out": arr(out),
            }
        )
    return cases


def permute_case(rng: np.random.Generator) -> dict[str, Any]:
    """Meta weights + complex RoPE and HF-permuted weights + rotate_half give the same scores."""
    heads, d, d_model, T = 2, 8, 6, 5
    X = tensor(rng.normal(size=(T, d_model)))
    wq, wk = (tensor(rng.normal(size=(heads * d, d_model))) for _ in range(2))  # Linear [out, in]
    pos = torch.arange(T)

    def heads_of(y: torch.Tensor) -> torch.Tensor:
        return y.view(1, T, heads, d)  # (B, T, H, D)

    fc = precompute_freqs_cis(d, pos, 10000.0)
    q_meta = meta_rope(heads_of(F.linear(X, wq)), fc).transpose(1, 2)  # (B, H, T, D)
    k_meta = meta_rope(heads_of(F.linear(X, wk)), fc).transpose(1, 2)
    wq_hf, wk_hf = hf_permute(wq, heads), hf_permute(wk, heads)
    q_hf = hf_rope(heads_of(F.linear(X, wq_hf)).transpose(1, 2), pos, 10000.0, d)
    k_hf = hf_rope(heads_of(F.linear(X, wk_hf)).transpose(1, 2), pos, 10000.0, d)
    return {
        "heads": heads,
        "X": arr(X),
        "W_q_meta": arr(wq),
        "W_k_meta": arr(wk),
        "W_q_hf": arr(wq_hf),
        "W_k_hf": arr(wk_hf),
        "scores_meta": arr(q_meta @ k_meta.transpose(-1, -2)),
        "scores_hf": arr(q_hf @ k_hf.transpose(-1, -2)),
    }


def window_cases(rng: np.random.Generator) -> list[dict[str, Any]]:
    """SDPA with an explicit boolean mask built HF-style (causal and kv_idx > q_idx - window)."""
    cases = []
    H, Hkv, D = 4, 2, 4
    for T, S, window in ((6, 6, 3), (6, 6, 1), (2, 7, 3), (6, 6, 6)):
        q = rng.normal(size=(1, H, T, D))
        k, v = rng.normal(size=(2, 1, Hkv, S, D))
        q_idx = torch.arange(T)[:, None] + (S - T)  # lower-right: queries are the last T keys
        kv_idx = torch.arange(S)[None, :]
        allowed = (kv_idx <= q_idx) & (kv_idx > q_idx - window)  # HF sliding_window_overlay
        # FlashAttention window_size=(window-1, 0): i + S - T - left <= j <= i + S - T + right
        i = torch.arange(T)[:, None]
        flash = (kv_idx >= i + S - T - (window - 1)) & (kv_idx <= i + S - T + 0)
        assert torch.equal(allowed, flash)
        out = F.scaled_dot_product_attention(
            tensor(q), tensor(k), tensor(v), attn_mask=allowed, enable_gqa=True
        )
        cases.append(
            {
                "T": T,
                "S": S,
                "window": window,
                "q": q.tolist(),
                "k": k.tolist(),
                "v": v.tolist(),
                "allowed": allowed.tolist(),
                "out": arr(out),
            }
        )
    return cases


def sink_cases(rng: np.random.Generator) -> list[dict[str, Any]]:
    """gpt-oss sdpa: kv heads x q_mult query heads (grouped), sinks one per query head."""
    cases = []
    n_tokens, n_kv, q_mult, d = 5, 2, 2, 4
    for window, sinks in ((0, [0.5, -1.0, 2.0, -30.0]), (2, [1.5, 0.0, -0.5, 3.0])):
        Q = rng.normal(size=(n_tokens, n_kv, q_mult, d))
        K, V = rng.normal(size=(2, n_tokens, n_kv, d))
        scale = 1.0 / d**0.5
        out, W = gpt_oss_sdpa(
            tensor(Q), tensor(K), tensor(V), tensor(np.array(sinks)), scale, window
        )
        W = W.reshape(n_kv * q_mult, n_tokens, n_tokens)  # (H, T, S), head = kv * q_mult + m
        cases.append(
            {
                "window": window,
                "sinks": sinks,
                "scale": scale,
                "Q": Q.tolist(),
                "K": K.tolist(),
                "V": V.tolist(),
                "weights": arr(W),
                "dropped": arr(1.0 - W.sum(-1)),
                "out": arr(out),
            }
        )
    return cases


def main() -> None:
    rng = np.random.default_rng(20240610)
    data = {
        "made_by": "tests/reference/torch_variants.py",
        "torch": torch.__version__,
        "rope": rope_cases(rng),
        "permute": permute_case(rng),
        "window": window_cases(rng),
        "sinks": sink_cases(rng),
    }
    OUT.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
