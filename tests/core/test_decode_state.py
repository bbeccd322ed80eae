"""``attn decode`` of linear attention (a recurrent state in place of the KV cache) and of
differential attention (two softmax maps over one cache), against loops written here token by
token and number by number, transformers' Gated DeltaNet layer (tests/reference/
torch_gated_deltanet.json) and the law that decoding gives the full computation's rows."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import random_fixture

from attn_cli.check.runs import decode_args
from attn_cli.check.state_runs import (
    StateRun,
    check_maps_decode,
    check_state_decode,
    maps_form,
    recurrence,
    run_decode_any,
    state_keep,
)
from attn_cli.core.decode_state import decode_state
from attn_cli.core.pipeline import run
from attn_cli.core.plugins.linear import PlainRecurrence
from attn_cli.errors import UsageError
from attn_cli.io.examples import find_example
from attn_cli.io.fixture import load_fixture, validate

TORCH = json.loads(
    (Path(__file__).parent.parent / "reference" / "torch_gated_deltanet.json").read_text()
)
DELTA_KEYS = ("W_q", "W_k", "W_v", "W_z", "W_b", "W_a", "conv", "A_log", "dt_bias", "norm")


def example(name: str) -> Any:
    path = find_example(name)
    assert path is not None
    return load_fixture(str(path))


def decode_inputs(inputs: Any, prefill: int) -> Any:
    """The decode of ``inputs`` as attn decode runs it (a state, two maps or a cache)."""
    trace = run(inputs, keep=state_keep(inputs))
    rec = recurrence(trace)
    if rec is not None:
        return check_state_decode(trace, rec, prefill)
    form = maps_form(trace)
    assert form is not None
    return check_maps_decode(trace, form, prefill)


# -- the references: each recurrence as a loop over tokens and numbers --------------------------


def loop_katharopoulos(Q: Any, K: Any, V: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """One head: S_t = S_{t−1} + φ(k_t)v_tᵀ, z_t = z_{t−1} + φ(k_t), o_t = φ(q_t)ᵀS_t / φ(q_t)ᵀz_t,
    number by number; the states, normalisers and outputs after every token."""

    def phi(x: float) -> float:
        return x + 1.0 if x > 0 else math.exp(x)

    T, dk, dv = Q.shape[0], Q.shape[1], V.shape[1]
    S, z = [[0.0] * dv for _ in range(dk)], [0.0] * dk
    states, zs, outs = [], [], []
    for t in range(T):
        for i in range(dk):
            z[i] += phi(K[t, i])
            for j in range(dv):
                S[i][j] += phi(K[t, i]) * V[t, j]
        den = sum(phi(Q[t, i]) * z[i] for i in range(dk))
        outs.append([sum(phi(Q[t, i]) * S[i][j] for i in range(dk)) / den for j in range(dv)])
        states.append([row[:] for row in S])
        zs.append(z[:])
    return states, zs, outs


def loop_delta_layer(X: Any, d: dict[str, Any], heads: int, k_heads: int, eps: float) -> Any:
    """Gated DeltaNet as a decode loop would be written from Qwen3-Next's code: per token, the
    conv over a window of the last K tokens' qkv, SiLU, l2norm, beta, g, the delta rule, the
    gated RMSNorm; (T, heads, d_v) and the state of every head after each token."""

    def silu(x: Any) -> Any:
        return x / (1.0 + np.exp(-x))

    W = np.concatenate([d["W_q"], d["W_k"], d["W_v"]], axis=1)
    K = d["conv"].shape[1]
    dk = d["W_q"].shape[1] // k_heads
    dv = d["W_v"].shape[1] // heads
    window = [np.zeros(W.shape[1]) for _ in range(K)]
    S = [np.zeros((dk, dv)) for _ in range(heads)]
    outs, states = [], []
    for t in range(X.shape[0]):
        x = X[t]
        window = [*window[1:], x @ W]
        mixed = silu(sum(d["conv"][:, j] * window[j] for j in range(K)))
        row = []
        for h in range(heads):
            kh = h // (heads // k_heads)
            q = mixed[kh * dk : (kh + 1) * dk]
            k = mixed[k_heads * dk + kh * dk : k_heads * dk + (kh + 1) * dk]
            v = mixed[2 * k_heads * dk + h * dv : 2 * k_heads * dk + (h + 1) * dv]
            q = q / math.sqrt(float(q @ q) + 1e-6) / math.sqrt(dk)
            k = k / math.sqrt(float(k @ k) + 1e-6)
            beta = 1.0 / (1.0 + math.exp(-float(x @ d["W_b"][:, h])))
            a = float(x @ d["W_a"][:, h]) + d["dt_bias"][h]
            g = -math.exp(d["A_log"][h]) * math.log1p(math.exp(a))
            S[h] = S[h] * math.exp(g)
            S[h] = S[h] + np.outer(k, beta * (v - S[h].T @ k))
            o = S[h].T @ q
            zt = x @ d["W_z"][:, h * dv : (h + 1) * dv]
            normed = o / math.sqrt(float(np.mean(o * o)) + eps) * d["norm"] * silu(zt)
            row.append(normed)
        outs.append(row)
        states.append([s.copy() for s in S])
    return np.array(outs), states


def loop_diff(Q: Any, K: Any, V: Any, lam: float, d: Any, scale: float) -> Any:
    """One head of differential attention, causal, row by row as the paper's formula reads:
    (softmax(q1·K1ᵀ·s) − λ·softmax(q2·K2ᵀ·s))·V, RMSNorm with subln's weight, × (1 − λ_init)."""
    norm = np.ones(V.shape[1]) if d.norm is None else np.asarray(d.norm)
    half = Q.shape[1] // 2
    out = []
    for t in range(Q.shape[0]):
        rows = []
        for lo, hi in ((0, half), (half, 2 * half)):
            x = [scale * float(Q[t, lo:hi] @ K[s, lo:hi]) for s in range(t + 1)]
            m = max(x)
            e = [math.exp(v - m) for v in x]
            rows.append([v / sum(e) for v in e])
        o = sum((rows[0][s] - lam * rows[1][s]) * V[s] for s in range(t + 1))
        out.append(o / math.sqrt(float(np.mean(o * o)) + d.eps) * norm * (1 - d.lambda_init))
    return np.array(out)


# -- the bundled examples against the loops -------------------------------------------------------


@pytest.mark.parametrize("prefill", [1, 3, 6])
def test_linear_attention_steps_match_the_loop(prefill: int) -> None:
    inp = example("linear_attention")
    r = decode_inputs(inp, prefill)
    trace = run(inp)
    Q, K, V = (trace[n].data for n in ("Q", "K", "V"))  # (H, T, d)
    assert len(r.result.steps) == 6 - prefill and r.ok
    for h in range(inp.heads):
        states, zs, outs = loop_katharopoulos(Q[h], K[h], V[h])
        np.testing.assert_allclose(r.result.prefill_output[0, h], outs[:prefill], rtol=1e-12)
        for s in r.result.steps:
            t = s.index
            np.testing.assert_allclose(s.output[0, h, 0], outs[t], rtol=1e-12)
            np.testing.assert_allclose(s.state["S"][0, h], states[t], rtol=1e-12)
            np.testing.assert_allclose(s.state["z"][0, h], zs[t], rtol=1e-12)
    # the full trace's parallel form (the T×T weights times V) gives the same rows
    full = trace["output"].data
    for s in r.result.steps:
        np.testing.assert_allclose(s.output[0, :, 0], full[:, s.index], rtol=1e-12)
    # the ledger: S (H×d_k×d_v) and z (H×d_k), 8 bytes each, against K and V per token
    assert r.ledger.state == 8 * (2 * 4 * 4 + 2 * 4) == 320
    assert r.ledger.kv_per_token == 2 * (4 + 4) * 8 and r.ledger.kv_at(6) == 768


@pytest.mark.parametrize("prefill", [1, 2, 5])
def test_gated_deltanet_steps_match_the_loop(prefill: int) -> None:
    inp = example("gated_deltanet")
    value = inp.extra["gated_deltanet"]
    d = {k: np.asarray(getattr(value, k)) for k in DELTA_KEYS}
    X = np.asarray(inp.X).reshape(-1, np.shape(inp.X)[-1])  # (T, d_model)
    want, states = loop_delta_layer(X, d, inp.heads, value.k_heads, value.eps)
    r = decode_inputs(inp, prefill)
    assert r.checked == "normed" and r.ok
    np.testing.assert_allclose(
        r.result.prefill_outs["normed"][0].swapaxes(0, 1), want[:prefill], rtol=1e-10, atol=1e-13
    )
    for s in r.result.steps:
        np.testing.assert_allclose(s.outs["normed"][0, :, 0], want[s.index], rtol=1e-10, atol=1e-13)
        for h in range(inp.heads):
            np.testing.assert_allclose(
                s.state["S"][0, h], states[s.index][h], rtol=1e-10, atol=1e-13
            )
        # the conv's window: the last K−1 tokens' qkv, the earliest first
        W = np.concatenate([d["W_q"], d["W_k"], d["W_v"]], axis=1)
        K = d["conv"].shape[1]
        rows = [
            X[i] @ W if i >= 0 else np.zeros(W.shape[1])
            for i in range(s.index - K + 2, s.index + 1)
        ]
        np.testing.assert_allclose(s.state["conv"][0], np.array(rows), rtol=1e-12)
    # constant in T: the window (K−1)·channels and S heads·d_k·d_v, whatever the token
    parts = dict(r.ledger.parts)
    assert parts == {"conv": (K - 1, W.shape[1]), "S": (inp.heads, value.d_k, inp.d_v)}


def test_gated_deltanet_decode_matches_the_transformers_layer() -> None:
    from test_linear import delta_from_torch  # the weight layout's mapping, not a reference

    case = TORCH["layer"]
    cfg, w = case["config"], case["weights"]
    fixture = {
        "X": np.array(case["X"]),
        "heads": cfg["num_v_heads"],
        "causal": True,
        "gated_deltanet": delta_from_torch(w, cfg),
        "W_O": np.array(w["out_proj.weight"]).T,
    }
    r = decode_inputs(validate(fixture, "torch_gated_deltanet.json"), 1)
    W_O = fixture["W_O"]
    for s in r.result.steps:
        joined = s.outs["normed"][0, :, 0].reshape(-1)  # heads side by side
        np.testing.assert_allclose(joined @ W_O, case["output"][0][s.index], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("prefill", [1, 4])
def test_diff_steps_match_the_paper_formula(prefill: int) -> None:
    inp = example("diff_transformer")
    value = inp.extra["diff"]
    r = decode_inputs(inp, prefill)
    trace = run(inp)
    Q, K, V = (trace[n].data for n in ("Q", "K", "V"))
    lam = (
        math.exp(float(np.sum(value.lambda_q1 * value.lambda_k1)))
        - math.exp(float(np.sum(value.lambda_q2 * value.lambda_k2)))
        + value.lambda_init
    )
    assert r.checked == "diff_scaled" and r.ok
    for h in range(inp.heads):
        want = loop_diff(Q[h], K[h], V[h], lam, value, 1 / math.sqrt(inp.d_k // 2))
        np.testing.assert_allclose(
            r.result.prefill_outs["diff_scaled"][0, h], want[:prefill], rtol=1e-10
        )
        for s in r.result.steps:
            np.testing.assert_allclose(s.outs["diff_scaled"][0, h, 0], want[s.index], rtol=1e-10)
    for s in r.result.steps:  # both maps' rows and their difference, as the full trace's rows
        t = s.index
        for name, full in (("softmax_2", "softmax_2"), ("diff", "diff"), ("scores_2", "scores_2")):
            np.testing.assert_allclose(
                s.rows[name][0, :, 0], trace[full].data[:, t, : t + 1], rtol=1e-12, atol=1e-15
            )
        np.testing.assert_allclose(
            s.softmax[0, :, 0], trace["softmax"].data[:, t, : t + 1], rtol=1e-12
        )
    assert r.cost.per_token == 2 * (4 + 4) * 8  # the cache holds K (both halves) and V


# -- the law: decoding gives the full computation's rows, over random shapes --------------------


@settings(max_examples=25, deadline=None)
@given(
    B=st.integers(1, 2),
    Hkv=st.integers(1, 2),
    group=st.integers(1, 2),
    T=st.integers(1, 9),
    dk=st.integers(1, 4),
    dv=st.integers(1, 4),
    data=st.data(),
)
def test_katharopoulos_decode_equals_the_parallel_form(
    B: int, Hkv: int, group: int, T: int, dk: int, dv: int, data: Any
) -> None:
    from attn_cli.core.linear_forms import elu1, linear_parallel

    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    prefill = data.draw(st.integers(1, T))
    Q = rng.standard_normal((B, Hkv * group, T, dk))
    K, V = rng.standard_normal((B, Hkv, T, dk)), rng.standard_normal((B, Hkv, T, dv))
    rec = PlainRecurrence(Q, K, V, chunk=3)
    got = decode_state(rec, prefill, np.arange(T))
    k, v = (np.repeat(x, group, axis=1) for x in (elu1(K), V))
    _, want = linear_parallel(elu1(Q), k, v)  # (B, H, T, dv)
    np.testing.assert_allclose(got.prefill_output, want[:, :, :prefill], rtol=1e-10)
    for s in got.steps:
        np.testing.assert_allclose(s.output[:, :, 0], want[:, :, s.index], rtol=1e-10)
    assert got.prefill_state["S"].shape == (B, Hkv, dk, dv)  # per kv head: shared by its group


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    T=st.integers(1, 8),
    k_heads=st.integers(1, 2),
    group=st.integers(1, 2),
    dk=st.integers(1, 3),
    dv=st.integers(1, 3),
    kernel=st.integers(1, 4),
    batch=st.sampled_from([None, 2]),
    data=st.data(),
)
def test_gated_deltanet_decode_equals_the_parallel_form(
    seed: int,
    T: int,
    k_heads: int,
    group: int,
    dk: int,
    dv: int,
    kernel: int,
    batch: int | None,
    data: Any,
) -> None:
    rng = np.random.default_rng(seed)
    H, d_model = k_heads * group, 3
    C = 2 * k_heads * dk + H * dv

    def m(*shape: int) -> Any:
        return rng.normal(0, 0.7, shape).round(3)

    delta = {
        "W_q": m(d_model, k_heads * dk),
        "W_k": m(d_model, k_heads * dk),
        "W_v": m(d_model, H * dv),
        "W_z": m(d_model, H * dv),
        "W_b": m(d_model, H),
        "W_a": m(d_model, H),
        "conv": m(C, kernel),
        "A_log": m(H),
        "dt_bias": m(H),
        "norm": 1 + m(dv),
        "k_heads": k_heads,
    }
    X = m(*((batch,) if batch else ()), T, d_model)
    inputs = validate({"X": X, "heads": H, "causal": True, "gated_deltanet": delta}, "rand")
    prefill = data.draw(st.integers(1, T))
    r = decode_inputs(inputs, prefill)
    full = run(inputs)  # the parallel form's output, normed by the trace
    normed = full["normed"].data if batch else full["normed"].data[None]  # (B, H, T, dv)
    for s in r.result.steps:
        np.testing.assert_allclose(
            s.outs["normed"][:, :, 0], normed[:, :, s.index], rtol=1e-9, atol=1e-12
        )
    assert r.ok and r.ledger.state == 8 * ((kernel - 1) * C + H * dk * dv)


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    seq=st.integers(1, 7),
    heads=st.integers(1, 3),
    d_k=st.sampled_from([2, 4]),
    window=st.sampled_from([None, 2]),
    batch=st.sampled_from([None, 2]),
    data=st.data(),
)
def test_diff_decode_equals_the_full_trace(
    seed: int, seq: int, heads: int, d_k: int, window: int | None, batch: int | None, data: Any
) -> None:
    extra: dict[str, Any] = {} if window is None else {"window": window}
    fx = random_fixture(
        seed, seq=seq, heads=heads, d_k=d_k, causal=True, batch=batch, diff=True, **extra
    )
    inputs = validate(fx, "rand")
    prefill = data.draw(st.integers(1, seq))
    r = decode_inputs(inputs, prefill)
    full = run(inputs)["diff_scaled"].data
    full = full if batch else full[None]  # (B, H, T, d_v)
    np.testing.assert_allclose(
        r.result.prefill_outs["diff_scaled"], full[:, :, :prefill], rtol=1e-9, atol=1e-12
    )
    for s in r.result.steps:
        np.testing.assert_allclose(
            s.outs["diff_scaled"][:, :, 0], full[:, :, s.index], rtol=1e-9, atol=1e-12
        )
    assert r.ok


def test_the_state_is_constant_in_the_length_and_only_shown_states_are_kept() -> None:
    rng = np.random.default_rng(0)
    ledgers = []
    for T in (40, 160):
        X = rng.standard_normal((T, 4)).round(3)
        W = {n: rng.standard_normal((4, 4)).round(3) for n in ("W_Q", "W_K", "W_V")}
        inputs = validate(
            {"X": X, **W, "heads": 2, "causal": True, "linear_attention": True}, "long"
        )
        trace = run(inputs, keep=state_keep(inputs))
        rec = recurrence(trace)
        assert rec is not None
        r = check_state_decode(trace, rec, 1, edges=(16, 3))
        kept = [s.index for s in r.result.steps if s.state is not None]
        assert kept == [1, 2, 3, T - 3, T - 2, T - 1] and r.ok
        ledgers.append(r.ledger)
    assert ledgers[0].state == ledgers[1].state == 8 * (2 * 2 * 2 + 2 * 2)
    assert ledgers[1].kv_at(160) == 4 * ledgers[0].kv_at(40)


def test_the_one_cache_loop_refuses_them_in_one_line() -> None:
    for name in ("linear_attention", "diff_transformer"):
        inputs = example(name)
        with pytest.raises(UsageError, match="KV-cache loop of one softmax map does not run"):
            decode_args(run(inputs, keep=state_keep(inputs)))


# -- the CLI: tables, JSON, both languages ---------------------------------------------------------


@pytest.mark.parametrize("name", ["linear_attention", "gated_deltanet"])
def test_cli_shows_the_state_and_its_ledger(name: str) -> None:
    result = run_cli("decode", name, "--prefill", "2", "--no-color", "--width", "120")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "a state in place of the KV cache" in out and "state ledger per layer" in out
    assert "state after the token: S = " in out and "head 1 (d_k × d_v)" in out
    assert "131,072" in out and "outweighs the state from" in out
    assert out.count("self-check: max |") == 4 and "✗" not in out
    zh = run_cli("decode", name, "--lang", "zh", "--explain", "--no-color", "--width", "120")
    assert zh.exit_code == 0, zh.output
    assert "线性注意力解码" in zh.stdout and "状态账本" in zh.stdout and "自检" in zh.stdout


def test_cli_json_has_the_state_bytes_and_every_state(tmp_path: Path) -> None:
    out = tmp_path / "dec.json"
    result = run_cli("decode", "gated_deltanet", "-f", "json", "-o", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    sb = doc["state_bytes"]
    assert sb["parts"] == {"conv": [3, 14], "S": [2, 4, 3]} and sb["state"] == 8 * (42 + 24)
    assert sb["kv_cache_per_token"] == 2 * (4 + 3) * 8 and doc["checked"] == "normed"
    assert len(doc["steps"]) == 5 and doc["max_abs_diff"] < 1e-12
    step = doc["steps"][-1]
    assert step["state_bytes"] == sb["state"] and step["kv_cache_bytes"] == 6 * 112
    assert {"q", "k", "v", "g", "beta", "state.S", "state.conv", "output", "normed"} <= set(
        step["stages"]
    )
    assert step["stages"]["state.S"]["shape"] == [2, 4, 3]


def test_cli_diff_shows_both_maps_and_dumps_them(tmp_path: Path) -> None:
    result = run_cli("decode", "diff_transformer", "-p", "3", "--no-color", "--explain")
    assert result.exit_code == 0, result.output
    assert "softmax_2" in result.stdout and "diff_scaled = diff_norm × (1 − λ_init)" in (
        result.stdout
    )
    out = tmp_path / "d.json"
    assert run_cli("decode", "diff_transformer", "-f", "json", "-o", str(out)).exit_code == 0
    doc = json.loads(out.read_text())
    stages = doc["steps"][0]["stages"]
    assert {"scores_2", "softmax_2", "diff", "lambda", "diff_scaled"} <= set(stages)
    assert doc["max_abs_diff"] < 1e-12


@pytest.mark.parametrize("name", ["linear_attention", "gated_deltanet"])  # diff runs both now
def test_flash_and_backward_still_refuse_in_one_line(name: str) -> None:
    for args in (("flash", name), ("trace", name, "--backward")):
        result = run_cli(*args)
        assert result.exit_code == 2, result.output
        assert result.stderr.count("\n") == 1 and "does not yet run" in result.stderr


def test_a_prefill_past_the_end_is_one_line() -> None:
    result = run_cli("decode", "gated_deltanet", "--prefill", "9")
    assert result.exit_code == 2
    assert "prefill: is 9, expected 1 to 6" in result.stderr and result.stderr.count("\n") == 1


def test_run_decode_any_returns_the_kind_of_run() -> None:
    assert isinstance(run_decode_any("linear_attention", 2), StateRun)
    assert not isinstance(run_decode_any("causal_multihead", 2), StateRun)


def test_step_mode_pages_are_the_overview_each_step_and_the_checks() -> None:
    from attn_cli.present.options import RenderOptions
    from attn_cli.present.state_view import state_pages, state_titles

    r = run_decode_any("gated_deltanet", 3)
    assert isinstance(r, StateRun)
    pages = list(state_pages(r, RenderOptions(explain=True, lang="zh")))
    assert len(pages) == 2 + 3
    assert state_titles(r, "en") == [
        "overview and state ledger",
        "on@3",
        "the@4",
        "mat@5",
        "self-check of every step",
    ]


def test_the_memory_budget_counts_the_states_kept() -> None:
    from attn_cli.check.state_runs import states_bytes

    rng = np.random.default_rng(1)
    T = 300
    inputs = validate(
        {
            "X": rng.standard_normal((T, 8)).round(2),
            "heads": 2,
            "causal": True,
            **{n: rng.standard_normal((8, 8)).round(2) for n in ("W_Q", "W_K", "W_V")},
            "linear_attention": True,
        },
        "long",
    )
    assert states_bytes(inputs, None) == 8 * T * 2 * (4 + 1) * 4  # every step's S and z
    assert states_bytes(inputs, (16, 3)) == 8 * 16 * 2 * (4 + 1) * 4  # the steps a view shows
    assert states_bytes(example("causal_multihead"), None) == 0  # a KV cache: none
    result = run_cli("decode", "gated_deltanet", "-f", "json", "--max-memory", "1KB")
    assert result.exit_code == 2 and "--max-memory" in result.stderr
    assert result.stderr.count("\n") == 1
