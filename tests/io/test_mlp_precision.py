"""The deep forward's MLP in its weights' own precision (io/forward.py ``mlp_as_stored``): float32
weights multiply in float32, as the model does, and a block that float32 cannot hold is computed
in float64 instead; each against a loop written here."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attn_cli.io.families import BlockPlan
from attn_cli.io.forward import mlp_as_stored

T, C, F = 3, 4, 5


def _loop(h: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
    """SwiGLU by hand in Python floats: (silu(h Wgᵀ) ∘ (h Wuᵀ)) Wdᵀ, nn.Linear's [out, in]."""
    out = np.zeros((T, C))
    for t in range(T):
        mid = []
        for f in range(F):
            g = sum(float(h[t, c]) * float(gate[f, c]) for c in range(C))
            u = sum(float(h[t, c]) * float(up[f, c]) for c in range(C))
            silu = g / (1.0 + math.exp(-g)) if g >= 0 else g * math.exp(g) / (1.0 + math.exp(g))
            mid.append(silu * u)
        for c in range(C):
            out[t, c] = sum(mid[f] * float(down[c, f]) for f in range(F))
    return out


def _weights(scale: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    shapes = {"gate.weight": (F, C), "up.weight": (F, C), "down.weight": (C, F)}
    return {k: (scale * rng.standard_normal(s)).astype(np.float32) for k, s in shapes.items()}


PLAN = BlockPlan("pre", {}, "gated", False, "silu", ())


def test_float32_weights_multiply_in_float32() -> None:
    t = _weights(0.5)
    h = np.random.default_rng(4).standard_normal((T, C))
    out = mlp_as_stored(PLAN, t, h)
    assert out.dtype == np.float32
    want = _loop(h, t["gate.weight"], t["up.weight"], t["down.weight"])
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)  # float32's rounding


def test_float64_weights_stay_float64() -> None:
    t = {k: w.astype(np.float64) for k, w in _weights(0.5).items()}
    h = np.random.default_rng(5).standard_normal((T, C))
    out = mlp_as_stored(PLAN, t, h)
    assert out.dtype == np.float64
    want = _loop(h, t["gate.weight"], t["up.weight"], t["down.weight"])
    np.testing.assert_allclose(out, want, rtol=1e-12)


@pytest.mark.parametrize("scale", [1e15, 1e30])
def test_what_float32_cannot_hold_is_computed_in_float64(scale: float) -> None:
    """Products past float32's 3.4e38 (but not float64's): the block in float64, not inf."""
    t = _weights(scale)
    h = np.random.default_rng(6).standard_normal((T, C)) * scale
    out = mlp_as_stored(PLAN, t, h)
    assert out.dtype == np.float64 and np.isfinite(out).all()
    want = _loop(h, t["gate.weight"], t["up.weight"], t["down.weight"])
    np.testing.assert_allclose(out, want, rtol=1e-9)
