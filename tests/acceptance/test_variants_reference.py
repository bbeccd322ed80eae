"""The variants against PyTorch numbers recorded in tests/reference/torch_variants.json.

The JSON was written once by tests/reference/torch_variants.py (torch 2.13.0, float64), which
re-types HF ``rotate_half`` RoPE, Meta's complex RoPE, HF's weight ``permute``, SDPA with an
explicit sliding-window mask and gpt-oss's ``sdpa`` with sinks. No torch is needed here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attn_cli.core import variants as V
from attn_cli.core.pipeline import run
from attn_cli.core.plugins.rope import apply_rope
from attn_cli.io.fixture import validate

DATA: dict[str, Any] = json.loads(
    (Path(__file__).parent.parent / "reference" / "torch_variants.json").read_text()
)
TORCH_RTOL = 1e-12  # both float64; different summation orders
TORCH_ATOL = 1e-13


def a(x: Any) -> Any:
    return np.array(x, dtype=np.float64)


@pytest.mark.parametrize("case", DATA["rope"], ids=lambda c: f"{c['kind']}-{c['base']}-{c['dims']}")
def test_rope_matches_torch(case: dict[str, Any]) -> None:
    layout: V.RopeLayout = "half" if case["kind"] == "hf_rotate_half" else "interleaved"
    got = apply_rope(
        a(case["x"]), case["positions"], base=case["base"], layout=layout, dims=case["dims"]
    )
    np.testing.assert_allclose(got, a(case["out"]), rtol=TORCH_RTOL, atol=TORCH_ATOL)


def test_permuted_weights_match_hf_permute_and_scores() -> None:
    p = DATA["permute"]
    heads, X = p["heads"], a(p["X"])
    T = X.shape[0]
    for meta, hf in (("W_q_meta", "W_q_hf"), ("W_k_meta", "W_k_hf")):
        # torch Linear weights are [out, in]; ours are the transpose, columns per head
        ours = V.interleaved_to_half_columns(a(p[meta]).T, heads)
        np.testing.assert_array_equal(ours, a(p[hf]).T)

    def scores(W_q: Any, W_k: Any, layout: V.RopeLayout) -> Any:
        d = W_q.shape[1] // heads
        q = (X @ W_q).reshape(T, heads, d).transpose(1, 0, 2)  # (H, T, D)
        k = (X @ W_k).reshape(T, heads, d).transpose(1, 0, 2)  # (H, T, D)
        q, k = apply_rope(q, range(T), layout=layout), apply_rope(k, range(T), layout=layout)
        return q @ k.transpose(0, 2, 1)  # (H, T, T)

    meta = scores(a(p["W_q_meta"]).T, a(p["W_k_meta"]).T, "interleaved")
    hf_q = V.interleaved_to_half_columns(a(p["W_q_meta"]).T, heads)
    hf_k = V.interleaved_to_half_columns(a(p["W_k_meta"]).T, heads)
    hf = scores(hf_q, hf_k, "half")
    np.testing.assert_allclose(meta, a(p["scores_meta"])[0], rtol=TORCH_RTOL, atol=1e-12)
    np.testing.assert_allclose(hf, a(p["scores_hf"])[0], rtol=TORCH_RTOL, atol=1e-12)


@pytest.mark.parametrize(
    "case", DATA["window"], ids=lambda c: f"T{c['T']}-S{c['S']}-w{c['window']}"
)
def test_sliding_window_matches_sdpa(case: dict[str, Any]) -> None:
    q, k, v = a(case["q"])[0], a(case["k"])[0], a(case["v"])[0]  # (H, T, D), (Hkv, S, D)
    T, S, window = case["T"], case["S"], case["window"]
    pos_q, pos_k = V.default_positions(T, S, "lower-right")
    allowed = V.window_allowed(pos_q, pos_k, window)  # (T, S)
    np.testing.assert_array_equal(allowed, np.array(case["allowed"]))
    fixture = {
        "Q": [q.tolist()],
        "K": [k.tolist()],
        "V": [v.tolist()],
        "causal": "lower-right",
        "window": window,
    }
    trace = run(validate(fixture, "sdpa"))  # the scale 1/√d_k, grouped heads, as SDPA
    out = trace.stages["output"].data[0]  # (H, T, D)
    np.testing.assert_allclose(out, a(case["out"])[0], rtol=TORCH_RTOL, atol=TORCH_ATOL)


@pytest.mark.parametrize("case", DATA["sinks"], ids=lambda c: f"window{c['window']}")
def test_sinks_match_gpt_oss(case: dict[str, Any]) -> None:
    Q, K, Vv = a(case["Q"]), a(case["K"]), a(case["V"])  # (T, Hkv, m, D), (T, Hkv, D)
    T, Hkv, m, D = Q.shape
    q = Q.reshape(T, Hkv * m, D).transpose(1, 0, 2)  # (H, T, D): head = kv * m + j, grouped
    k = K.transpose(1, 0, 2)  # (Hkv, T, D): query head h reads kv head h // m
    v = Vv.transpose(1, 0, 2)  # (Hkv, T, D)
    fixture = {
        "Q": [q.tolist()],
        "K": [k.tolist()],
        "V": [v.tolist()],
        "causal": True,
        "scale": case["scale"],
        "sinks": case["sinks"],
    }
    if case["window"]:
        fixture["window"] = case["window"]
    trace = run(validate(fixture, "gpt-oss"))
    weights = trace.stages["softmax"].data[0]  # (H, T, T)
    dropped = 1.0 - weights.sum(axis=-1)  # the sink's share of each row, (H, T)
    np.testing.assert_allclose(weights, a(case["weights"]), rtol=TORCH_RTOL, atol=TORCH_ATOL)
    np.testing.assert_allclose(dropped, a(case["dropped"]), rtol=1e-11, atol=TORCH_ATOL)
    out = trace.stages["output"].data[0].transpose(1, 0, 2).reshape(T, -1)  # (T, H*D)
    np.testing.assert_allclose(out, a(case["out"]), rtol=TORCH_RTOL, atol=TORCH_ATOL)
