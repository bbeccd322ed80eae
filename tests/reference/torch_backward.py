"""Make torch_backward.json: torch.autograd float64 gradients of every attention stage.

Run once in a throwaway venv that has torch (never the dev venv):
    /tmp/torchvenv/bin/python tests/reference/torch_backward.py
The fixture (fixed NumPy seed) is projection mode with GQA (4 query heads, 2 key/value heads,
grouped [0, 0, 1, 1]), a causal mask, W_O and every bias. torch computes each stage, keeps its
gradient with retain_grad(), and back-propagates a random upstream gradient of `projected`.
The weight and input gradients are also checked against F.scaled_dot_product_attention
(enable_gqa, is_causal), a second route through torch.
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

torch: Any = importlib.import_module("torch")  # only in the throwaway venv
F: Any = importlib.import_module("torch.nn.functional")

OUT = Path(__file__).with_name("torch_backward.json")
B, T, C, H, Hkv, D, Dv, E = 2, 4, 5, 4, 2, 3, 2, 3


def inputs() -> dict[str, np.ndarray[Any, Any]]:
    """The fixture: X, weights in the X @ W convention, biases, and the upstream gradient."""
    rng = np.random.default_rng(12)
    return {
        "X": rng.normal(size=(B, T, C)),
        "W_Q": rng.normal(scale=0.6, size=(C, H * D)),
        "W_K": rng.normal(scale=0.6, size=(C, Hkv * D)),
        "W_V": rng.normal(scale=0.6, size=(C, Hkv * Dv)),
        "W_O": rng.normal(scale=0.6, size=(H * Dv, E)),
        "b_Q": rng.normal(scale=0.3, size=H * D),
        "b_K": rng.normal(scale=0.3, size=Hkv * D),
        "b_V": rng.normal(scale=0.3, size=Hkv * Dv),
        "b_O": rng.normal(scale=0.3, size=E),
        "grad": rng.normal(size=(B, T, E)),  # dL/d(projected)
    }


def heads(x: Any, n: int) -> Any:
    return x.view(B, T, n, -1).transpose(1, 2)  # (B, n, T, d)


def forward(t: dict[str, Any], scale: float) -> dict[str, Any]:
    """Every stage, each kept with retain_grad()."""
    s: dict[str, Any] = {}

    def keep(name: str, x: Any) -> Any:
        x.retain_grad()
        s[name] = x
        return x

    q = keep("Q", heads(t["X"] @ t["W_Q"] + t["b_Q"], H))  # (B, H, T, D)
    k = keep("K", heads(t["X"] @ t["W_K"] + t["b_K"], Hkv))  # (B, Hkv, T, D)
    v = keep("V", heads(t["X"] @ t["W_V"] + t["b_V"], Hkv))  # (B, Hkv, T, Dv)
    k_rep = k.repeat_interleave(H // Hkv, dim=1)  # (B, H, T, D), grouped [0, 0, 1, 1]
    v_rep = v.repeat_interleave(H // Hkv, dim=1)  # (B, H, T, Dv)
    scores = keep("scores", q @ k_rep.transpose(-1, -2))  # (B, H, T, T)
    scaled = keep("scaled", scores * scale)
    causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T), True where allowed
    masked = keep("masked", scaled.masked_fill(~causal, float("-inf")))
    weights = keep("softmax", torch.softmax(masked, dim=-1))
    output = keep("output", weights @ v_rep)  # (B, H, T, Dv)
    concat = keep("concat", output.transpose(1, 2).reshape(B, T, H * Dv))  # (B, T, H*Dv)
    keep("projected", concat @ t["W_O"] + t["b_O"])  # (B, T, E)
    return s


def sdpa_gradients(arrays: dict[str, Any], scale: float) -> dict[str, Any]:
    """The input and weight gradients through F.scaled_dot_product_attention instead."""
    t = {n: torch.tensor(a, requires_grad=n != "grad") for n, a in arrays.items()}
    q = heads(t["X"] @ t["W_Q"] + t["b_Q"], H)
    k = heads(t["X"] @ t["W_K"] + t["b_K"], Hkv)
    v = heads(t["X"] @ t["W_V"] + t["b_V"], Hkv)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    projected = out.transpose(1, 2).reshape(B, T, H * Dv) @ t["W_O"] + t["b_O"]
    projected.backward(t["grad"])
    return {n: x.grad for n, x in t.items() if n != "grad"}


def main() -> None:
    arrays = inputs()
    scale = 1 / math.sqrt(D)
    t = {n: torch.tensor(a, requires_grad=n != "grad") for n, a in arrays.items()}
    stages = forward(t, scale)
    stages["projected"].backward(t["grad"])
    grads = {f"d_{n}": x.grad for n, x in stages.items()}
    grads |= {f"d_{n}": x.grad for n, x in t.items() if n != "grad"}
    for n, g in sdpa_gradients(arrays, scale).items():
        assert torch.allclose(g, grads[f"d_{n}"], rtol=1e-12, atol=1e-14), n
    data = {
        "about": "torch.autograd float64 gradients of every stage; made by torch_backward.py",
        "torch": torch.__version__,
        "scale": scale,
        "causal": "upper-left",
        "heads": H,
        "kv_heads": Hkv,
        **{n: a.tolist() for n, a in arrays.items()},
        **{f"forward_{n}": x.detach().tolist() for n, x in stages.items() if n != "masked"},
        **{n: g.tolist() for n, g in grads.items()},
    }
    lines = (f"{json.dumps(key)}: {json.dumps(value)}" for key, value in data.items())
    OUT.write_text("{\n" + ",\n".join(lines) + "\n}\n")  # one key a line


if __name__ == "__main__":
    main()
