"""Gated attention against transformers' own ``Qwen3NextAttention``: numbers recorded once in
tests/reference/torch_gate.json by tests/reference/torch_gate.py (torch 2.13.0, transformers
5.24.0, float64, SDPA), then the laws a gate must obey whatever the numbers (hypothesis).

The fixture is written from the module's weights as the checkpoint holds them: q_proj's rows are,
per head, head_dim query rows then head_dim gate rows (``torch.chunk(..., 2, dim=-1)`` of the
(…, heads, 2·head_dim) view), so W_Q and W_G are those rows transposed; Qwen3-Next's RMSNorm
scales by 1 + weight, so qk_norm gets 1 + weight; partial rotary rotates the first
head_dim·partial_rotary_factor dimensions of each head in the half layout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import Tolerance
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import random_fixture

from attn_cli.core.pipeline import run
from attn_cli.io.fixture import validate

RECORDED = json.loads((Path(__file__).parent.parent / "reference" / "torch_gate.json").read_text())
# transformers' rotary embedding makes cos and sin in float32 (its inv_freq and the product with
# the positions): they carry ~1e-7 of error, which reaches the outputs (of size ~1) as ~1e-7;
# everything else is float64
TORCH: Tolerance = {"rtol": 1e-6, "atol": 1e-6}


def fixture_of(case: dict[str, Any]) -> dict[str, Any]:
    """The attn fixture of one recorded Qwen3NextAttention."""
    cfg, w = case["config"], {k: np.array(v) for k, v in case["weights"].items()}
    H, D = cfg["num_attention_heads"], cfg["head_dim"]
    q_rows = w["q_proj.weight"].reshape(H, 2, D, -1)  # (heads, query|gate, D, hidden)
    fx: dict[str, Any] = {
        "X": case["X"],
        "W_Q": q_rows[:, 0].reshape(H * D, -1).T.tolist(),  # (hidden, heads*D)
        "W_K": w["k_proj.weight"].T.tolist(),
        "W_V": w["v_proj.weight"].T.tolist(),
        "W_O": w["o_proj.weight"].T.tolist(),
        "heads": H,
        "kv_heads": cfg["num_key_value_heads"],
        "causal": True,
        "rope": {"base": cfg["rope_theta"], "dims": int(D * cfg["partial_rotary_factor"])},
        "qk_norm": {
            "q_weight": (1 + w["q_norm.weight"]).tolist(),
            "k_weight": (1 + w["k_norm.weight"]).tolist(),
            "eps": cfg["rms_norm_eps"],
        },
        "gate": {"W_G": q_rows[:, 1].reshape(H * D, -1).T.tolist()},
    }
    if "q_proj.bias" in w:
        q_bias = w["q_proj.bias"].reshape(H, 2, D)
        fx |= {
            "b_Q": q_bias[:, 0].reshape(-1).tolist(),
            "b_K": w["k_proj.bias"].tolist(),
            "b_V": w["v_proj.bias"].tolist(),
            "b_O": w["o_proj.bias"].tolist(),
        }
        fx["gate"]["b_G"] = q_bias[:, 1].reshape(-1).tolist()
    return fx


@pytest.mark.parametrize("name", list(RECORDED["cases"]))
def test_the_trace_is_transformers_qwen3_next_attention(name: str) -> None:
    case = RECORDED["cases"][name]
    trace = run(validate(fixture_of(case), "qwen3_next.json"))
    gated = trace["gated"].data  # (H, T, D)
    joined = np.concatenate(list(gated), axis=-1)  # (T, H*D), o_proj's input
    np.testing.assert_allclose(joined, case["gated"], **TORCH)
    np.testing.assert_allclose(trace["concat"].data, case["gated"], **TORCH)
    np.testing.assert_allclose(trace["projected"].data, case["output"], **TORCH)


def test_the_gate_rows_matter_where_transformers_puts_them() -> None:
    """Swapping query and gate rows (the other reading of q_proj) misses the recorded output."""
    case = RECORDED["cases"]["GQA, partial rotary 0.5, no bias"]
    fx = fixture_of(case)
    fx["W_Q"], fx["gate"]["W_G"] = fx["gate"]["W_G"], fx["W_Q"]
    trace = run(validate(fx, "swapped.json"))
    assert not np.allclose(trace["projected"].data, case["output"], rtol=1e-3, atol=1e-3)


# ---------------------------------------------------------------------------------------------
# Laws (hypothesis): whatever the numbers


def _sizes() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "seed": st.integers(0, 2**16),
            "seq": st.integers(1, 4),
            "heads": st.sampled_from([1, 2]),
            "d_k": st.integers(1, 3),
            "d_model": st.integers(1, 4),
            "causal": st.booleans(),
            "W_O": st.booleans(),
        }
    )


def _fixture(s: dict[str, Any], **kw: Any) -> dict[str, Any]:
    args = {k: v for k, v in s.items() if k != "seed" and (k != "causal" or v)}
    return random_fixture(s["seed"], **args, **kw)


@settings(max_examples=40, deadline=None)
@given(_sizes(), st.floats(40.0, 1e3))
def test_a_wide_open_gate_is_plain_attention(s: dict[str, Any], big: float) -> None:
    fx = _fixture(s, gate=True)
    d_out = s["heads"] * s["d_k"]
    fx["gate"] = {"W_G": np.zeros((s["d_model"], d_out)).tolist(), "b_G": [big] * d_out}
    plain = {k: v for k, v in fx.items() if k != "gate"}
    gated, ungated = run(validate(fx, "g.json")), run(validate(plain, "p.json"))
    # σ(big) = 1 − e^(−big) + ...: within 4e-18 of 1 at big = 40
    for stage in ungated:
        np.testing.assert_allclose(gated[stage.name].data, stage.data, rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(gated["gated"].data, gated["output"].data, rtol=1e-15, atol=0)


@settings(max_examples=40, deadline=None)
@given(_sizes(), st.integers(2, 3))
def test_a_batch_is_its_items_traced_one_by_one(s: dict[str, Any], batch: int) -> None:
    fx = _fixture(s, batch=batch, gate="bias")
    whole = run(validate(fx, "b.json"))
    for b in range(batch):
        item = fx | {"X": fx["X"][b]}
        alone = run(validate(item, "one.json"))
        for stage in alone:
            np.testing.assert_allclose(
                whole[stage.name].data[b], stage.data, rtol=1e-13, atol=1e-13, err_msg=stage.name
            )


@settings(max_examples=30, deadline=None)
@given(_sizes())
def test_the_gate_only_shrinks_each_number_of_the_output(s: dict[str, Any]) -> None:
    trace = run(validate(_fixture(s, gate="bias"), "g.json"))
    out, gated = trace["output"].data, trace["gated"].data
    assert np.all(np.abs(gated) <= np.abs(out)) and np.all(np.sign(gated) * np.sign(out) >= 0)
