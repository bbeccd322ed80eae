"""Parity with PyTorch: F.scaled_dot_product_attention and nn.MultiheadAttention, float64.

Skipped when torch is not installed (it is not a test dependency). PyTorch builds every tensor
from the raw fixture mapping, never from the pipeline's output.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import Tolerance
from reference import random_fixture

from attn_cli.core.pipeline import run
from attn_cli.io.fixture import validate

torch = pytest.importorskip("torch")
F = torch.nn.functional

# Both sides are float64 with different summation orders (and torch's fused CPU kernel uses an
# online softmax): agreement to ~1e-15 is typical; allow a little headroom.
TORCH: Tolerance = {"rtol": 1e-11, "atol": 1e-12}
f64 = torch.float64


def t(x: Any) -> Any:
    """A float64 tensor from nested lists (the string "-inf" allowed)."""
    return torch.tensor(np.array(x, dtype=np.float64), dtype=f64)


def heads_of(x: Any, n: int) -> Any:
    """(B, T, n*d) -> (B, n, T, d): head h owns columns h*d:(h+1)*d."""
    B, T, width = x.shape
    return x.view(B, T, n, width // n).transpose(1, 2)


def torch_qkv(fx: dict[str, Any]) -> tuple[Any, Any, Any, bool]:
    """q (B, H, T, D), k and v (B, Hkv, S, d) in torch, and whether the fixture had a batch axis."""
    H = fx.get("heads", 1)
    Hkv = fx.get("kv_heads", H)
    if "X" in fx:
        X = t(fx["X"])
        has_batch = X.dim() == 3
        X = X if has_batch else X[None]  # (B, T, C)
        # torch Linear computes x @ weight.T + bias, so weight = W.T
        q = F.linear(X, t(fx["W_Q"]).T, t(fx["b_Q"]) if "b_Q" in fx else None)
        k = F.linear(X, t(fx["W_K"]).T, t(fx["b_K"]) if "b_K" in fx else None)
        v = F.linear(X, t(fx["W_V"]).T, t(fx["b_V"]) if "b_V" in fx else None)
        return heads_of(q, H), heads_of(k, Hkv), heads_of(v, Hkv), has_batch
    q, k, v = t(fx["Q"]), t(fx["K"]), t(fx["V"])
    if q.dim() == 4:
        return q, k, v, True
    has_batch = q.dim() == 3
    if not has_batch:
        q, k, v = q[None], k[None], v[None]
    return heads_of(q, H), heads_of(k, Hkv), heads_of(v, Hkv), has_batch


def torch_attn_mask(fx: dict[str, Any], shape: tuple[int, int, int, int]) -> Any:
    """One attn_mask for SDPA: bool (True = attend), or float when there is a bias."""
    _, _, T, S = shape
    allowed = torch.ones(shape, dtype=torch.bool)
    causal = fx.get("causal")
    if causal in (True, "upper-left"):
        allowed = allowed & torch.ones(T, S, dtype=torch.bool).tril()
    elif causal == "lower-right":
        allowed = allowed & torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
    if "mask" in fx:
        allowed = allowed & torch.tensor(fx["mask"], dtype=torch.bool)  # torch broadcasting
    if "lengths" in fx:
        lengths = torch.tensor(fx["lengths"]).reshape(-1)  # (B,)
        allowed = allowed & (torch.arange(S)[None, :] < lengths[:, None])[:, None, None, :]
    if "bias" not in fx:
        return allowed
    bias = t(fx["bias"]) + torch.zeros(shape, dtype=f64)
    return bias.masked_fill(~allowed, -torch.inf)


def torch_sdpa(fx: dict[str, Any], *, gqa: str = "enable_gqa") -> dict[str, np.ndarray]:
    """softmax, output, concat and projected computed by torch, in the public trace layout."""
    q, k, v, has_batch = torch_qkv(fx)
    B, H, T, _ = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    kwargs: dict[str, Any] = {"scale": fx.get("scale")}
    masking = any(key in fx for key in ("mask", "bias", "lengths"))
    if fx.get("causal") in (True, "upper-left") and not masking:
        kwargs["is_causal"] = True  # torch's own causal mask (upper-left)
    elif masking or fx.get("causal"):
        kwargs["attn_mask"] = torch_attn_mask(fx, (B, H, T, S))
    if Hkv != H and gqa == "enable_gqa":
        kwargs["enable_gqa"] = True
    elif Hkv != H:
        k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, **kwargs)  # (B, H, T, Dv)
    # With V = I (one-hot keys) the output *is* the attention weights.
    eye = torch.eye(S, dtype=f64).expand(B, k.shape[1], S, S)
    weights = F.scaled_dot_product_attention(q, k, eye, **kwargs)  # (B, H, T, S)
    result = {"softmax": weights, "output": out}
    if H > 1 or "W_O" in fx:
        concat = out.transpose(1, 2).reshape(B, T, -1)  # (B, T, H*Dv)
        result["concat"] = concat
        if "W_O" in fx:
            b_O = t(fx["b_O"]) if "b_O" in fx else None
            result["projected"] = F.linear(concat, t(fx["W_O"]).T, b_O)
    return {k: (x if has_batch else x[0]).numpy() for k, x in result.items()}


SDPA_CASES: dict[str, dict[str, Any]] = {
    "projection-single": {},
    "projection-heads-biases-W_O": {
        "batch": 2,
        "heads": 2,
        "d_model": 6,
        "qkv_bias": True,
        "W_O": True,
        "b_O": True,
    },
    "projection-gqa-causal": {"heads": 4, "kv_heads": 2, "causal": True, "seq": 5},
    "direct-upper-left-cross": {"mode": "direct", "seq": 3, "seq_k": 5, "causal": True},
    "direct-upper-left-short-keys": {"mode": "direct", "seq": 4, "seq_k": 2, "causal": True},
    "direct-lower-right-cache": {"mode": "direct", "seq": 2, "seq_k": 5, "causal": "lower-right"},
    "direct-lower-right-short-keys": {
        "mode": "direct",
        "seq": 4,
        "seq_k": 2,
        "causal": "lower-right",
    },
    "direct3-mask-scale": {"mode": "direct", "layout": 3, "heads": 2, "mask": (3, 3), "scale": 0.4},
    "direct4-mqa-bias-neginf": {
        "mode": "direct",
        "layout": 4,
        "heads": 3,
        "kv_heads": 1,
        "seq_k": 4,
        "bias": (3, 1, 4),
        "neg_inf_bias": True,
    },
    "direct4-lengths-empty-item": {"mode": "direct", "layout": 4, "batch": 3, "lengths": [3, 0, 1]},
    "everything": {
        "batch": 2,
        "heads": 4,
        "kv_heads": 2,
        "qkv_bias": True,
        "W_O": True,
        "b_O": True,
        "causal": "lower-right",
        "mask": (2, 1, 3, 3),
        "bias": (3,),
        "neg_inf_bias": True,
        "lengths": [3, 2],
        "seq": 3,
    },
}


@pytest.mark.parametrize("gqa", ["enable_gqa", "repeat_interleave"])
@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_matches_torch_sdpa(case: str, gqa: str) -> None:
    fx = random_fixture(7 + len(case), **SDPA_CASES[case])
    want = torch_sdpa(fx, gqa=gqa)
    trace = run(validate(fx, "torch.json"))
    for name in ("concat", "projected"):
        assert (name in trace) == (name in want), name
    for name, expected in want.items():
        np.testing.assert_allclose(trace[name].data, expected, err_msg=name, **TORCH)


def test_lower_right_matches_torch_causal_bias() -> None:
    """Our "lower-right" is torch's CausalBias LOWER_RIGHT (the KV-cache alignment)."""
    from torch.nn.attention.bias import causal_lower_right

    fx = random_fixture(3, mode="direct", seq=2, seq_k=5, causal="lower-right", d_v=5)
    q, k, v, _ = torch_qkv(fx)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(2, 5))
    trace = run(validate(fx, "torch.json"))
    np.testing.assert_allclose(trace["output"].data, want[0].numpy(), **TORCH)


@pytest.mark.parametrize("masking", ["none", "causal", "key_padding"])
def test_projection_matches_torch_multihead_attention(masking: str) -> None:
    B, T, C, H = 2, 4, 6, 3  # d_k = d_v = C / H = 2, as nn.MultiheadAttention requires
    fx = random_fixture(
        11,
        batch=B,
        seq=T,
        d_model=C,
        heads=H,
        d_k=C // H,
        qkv_bias=True,
        W_O=True,
        b_O=True,
        d_out=C,
    )
    mha = torch.nn.MultiheadAttention(C, H, bias=True, batch_first=True, dtype=f64)
    mha.eval()
    with torch.no_grad():
        # in_proj_weight stacks the three Linear weights, each the transpose of our W
        mha.in_proj_weight.copy_(torch.cat([t(fx["W_Q"]).T, t(fx["W_K"]).T, t(fx["W_V"]).T]))
        mha.in_proj_bias.copy_(torch.cat([t(fx["b_Q"]), t(fx["b_K"]), t(fx["b_V"])]))
        mha.out_proj.weight.copy_(t(fx["W_O"]).T)
        mha.out_proj.bias.copy_(t(fx["b_O"]))
    kwargs: dict[str, Any] = {}
    if masking == "causal":
        fx["causal"] = True
        # nn.MultiheadAttention's boolean mask is True where a query may NOT attend
        kwargs["attn_mask"] = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
    elif masking == "key_padding":
        fx["lengths"] = [4, 2]
        kwargs["key_padding_mask"] = torch.arange(T)[None, :] >= torch.tensor([4, 2])[:, None]
    X = t(fx["X"])
    with torch.no_grad():
        projected, weights = mha(X, X, X, need_weights=True, average_attn_weights=False, **kwargs)
    trace = run(validate(fx, "torch.json"))
    np.testing.assert_allclose(trace["projected"].data, projected.numpy(), **TORCH)
    np.testing.assert_allclose(trace["softmax"].data, weights.numpy(), **TORCH)
