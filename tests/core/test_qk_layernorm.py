"""q/k LayerNorm (the qk_layernorm variant: StableLM 2 one LayerNorm per head, Phi one for every
head with a bias), against a loop forward written here: each head's row of Q and K through
torch's LayerNorm formula ((x − mean) / √(biased var + eps) · w + b) with plain Python loops,
then grouped-query attention with a causal mask. Its gradients against central finite
differences of that loop forward; a law (a LayerNorm forgets a shift of its row) as a
hypothesis property. The command line (decoding, FlashAttention, the backward pass, attn new):
tests/cli/test_qk_layernorm_cli.py."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_cli.core.pipeline import run
from attn_cli.io.validate import validate

Array = np.ndarray[Any, np.dtype[Any]]
T, C, H, HKV, D = 4, 5, 2, 1, 3  # tokens, d_model, heads, kv heads, d_k


def _fixture(seed: int, per_head: bool, bias: bool) -> dict[str, Any]:
    rng = np.random.default_rng(seed)

    def r(*shape: int) -> list[Any]:
        return rng.normal(scale=0.8, size=shape).tolist()  # type: ignore[no-any-return]

    fx: dict[str, Any] = {"X": r(T, C), "W_Q": r(C, H * D), "W_K": r(C, HKV * D)}
    fx |= {"W_V": r(C, HKV * D), "heads": H, "kv_heads": HKV, "causal": True}
    ln: dict[str, Any] = {"eps": 1e-5}
    for side, n in (("q", H), ("k", HKV)):
        ln[f"{side}_weight"] = rng.uniform(0.5, 1.5, (n, D) if per_head else D).tolist()
        if bias:
            ln[f"{side}_bias"] = r(n, D) if per_head else r(D)
    fx["qk_layernorm"] = ln
    return fx


def _layer_norm(row: list[float], w: list[float], b: list[float] | None, eps: float) -> list[float]:
    mean = math.fsum(row) / len(row)
    var = math.fsum((x - mean) ** 2 for x in row) / len(row)
    out = [(x - mean) / math.sqrt(var + eps) * wi for x, wi in zip(row, w, strict=True)]
    return out if b is None else [y + bi for y, bi in zip(out, b, strict=True)]


def loop_forward(fx: dict[str, Any]) -> dict[str, Array]:
    """Q_ln, K_ln, softmax and output, [heads, T, ...], by loops over tokens and heads."""
    X, ln = fx["X"], fx["qk_layernorm"]
    n = len(X)

    def project(W: list[list[float]], t: int, h: int) -> list[float]:
        return [math.fsum(X[t][c] * W[c][h * D + j] for c in range(C)) for j in range(D)]

    def head_param(side: str, part: str, h: int) -> list[float] | None:
        p = ln.get(f"{side}_{part}")
        return None if p is None else p[h] if isinstance(p[0], list) else p

    def normed(side: str, W: list[list[float]], heads: int) -> list[list[list[float]]]:
        return [
            [
                _layer_norm(
                    project(W, t, h),
                    head_param(side, "weight", h) or [],
                    head_param(side, "bias", h),
                    ln["eps"],
                )
                for t in range(n)
            ]
            for h in range(heads)
        ]

    q, k = normed("q", fx["W_Q"], H), normed("k", fx["W_K"], HKV)
    v = [[project(fx["W_V"], t, h) for t in range(n)] for h in range(HKV)]
    weights, output = [], []
    for h in range(H):
        g = h // (H // HKV)  # the kv head query head h reads
        rows, outs = [], []
        for i in range(n):
            s = [  # causal: keys 0..i
                math.fsum(a * b for a, b in zip(q[h][i], k[g][j], strict=True)) / math.sqrt(D)
                for j in range(i + 1)
            ]
            top = max(s)
            e = [math.exp(x - top) for x in s]
            p = [x / math.fsum(e) for x in e] + [0.0] * (n - i - 1)
            rows.append(p)
            outs.append([math.fsum(p[j] * v[g][j][c] for j in range(i + 1)) for c in range(D)])
        weights.append(rows)
        output.append(outs)
    return {
        "Q_ln": np.array(q),
        "K_ln": np.array(k),
        "softmax": np.array(weights),
        "output": np.array(output),
    }


# (per_head, bias): StableLM 2's, Phi's, and both at once
CASES = {
    "StableLM: a LayerNorm per head": (True, False),
    "Phi: one LayerNorm for all heads, with a bias": (False, True),
    "a LayerNorm per head, with biases": (True, True),
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", CASES)
def test_matches_the_loop_forward(case: str, seed: int) -> None:
    fx = _fixture(seed, *CASES[case])
    trace = run(validate(fx, "ln.json"))
    for name, want in loop_forward(fx).items():
        np.testing.assert_allclose(trace[name].data, want, rtol=1e-12, atol=1e-13, err_msg=name)


def test_each_head_takes_its_own_weight() -> None:
    """Swapping the two query heads' weights swaps what each head's Q_ln is scaled by."""
    fx = _fixture(5, per_head=True, bias=False)
    swapped = json.loads(json.dumps(fx))
    swapped["qk_layernorm"]["q_weight"].reverse()
    a, b = (run(validate(f, "ln.json"))["Q_ln"].data for f in (fx, swapped))
    w = np.array(fx["qk_layernorm"]["q_weight"])  # (H, D)
    np.testing.assert_allclose(a[0] / w[0] * w[1], b[0], rtol=1e-12)
    assert not np.allclose(a[0], b[0])


def _loss(fx: dict[str, Any]) -> float:
    """L = Σ output: the backward pass's default upstream gradient (ones) on the final stage."""
    return math.fsum(loop_forward(fx)["output"].ravel())


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_the_gradients_are_finite_differences_of_the_loop_forward(case: str) -> None:
    fx = _fixture(3, *CASES[case])
    trace = run(validate(fx, "ln.json"), backward=True)
    step = 1e-6
    for name in ("X", "W_Q", "W_K", "W_V"):
        base = np.array(fx[name])
        numeric = np.zeros_like(base)
        for idx in np.ndindex(*base.shape):
            for sign in (1.0, -1.0):
                moved = base.copy()
                moved[idx] += sign * step
                numeric[idx] += sign * _loss({**fx, name: moved.tolist()}) / (2 * step)
        got = trace[f"d_{name}"].data
        np.testing.assert_allclose(got, numeric, rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.slow
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), size=st.floats(0.0, 50.0))
def test_a_shift_of_each_head_row_changes_nothing(seed: int, size: float) -> None:
    """LayerNorm subtracts the row's mean: Q and K shifted by a constant per token and head
    give the same Q_ln, K_ln and weights (an RMSNorm would not)."""
    rng = np.random.default_rng(seed)
    Q, K, V = (rng.normal(size=(T, n * D)) for n in (H, HKV, HKV))
    ln = {f"{s}_weight": rng.uniform(0.5, 1.5, (n, D)).tolist() for s, n in (("q", H), ("k", HKV))}

    def shift(x: Array, heads: int) -> Array:
        return x + np.repeat(rng.normal(size=(T, heads)) * size, D, axis=1)  # (T, heads*D)

    def trace(q: Array, k: Array) -> Any:
        fx = {"Q": q.tolist(), "K": k.tolist(), "V": V.tolist(), "heads": H, "kv_heads": HKV}
        return run(validate(fx | {"causal": True, "qk_layernorm": ln}, "p.json"))

    base, moved = trace(Q, K), trace(shift(Q, H), shift(K, HKV))
    for name in ("Q_ln", "K_ln", "softmax"):
        np.testing.assert_allclose(moved[name].data, base[name].data, atol=1e-9, err_msg=name)
