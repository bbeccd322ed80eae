"""Linear attention (Katharopoulos et al.) and Gated DeltaNet (Qwen3-Next) against references
written here as loops over tokens, transformers' own numbers (tests/reference/
torch_gated_deltanet.py, run once in a throwaway venv), and the law that the recurrent, chunked
and parallel forms give one output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_cli.core.linear_forms import (
    delta_chunked,
    delta_parallel,
    delta_recurrent,
    linear_chunked,
    linear_parallel,
    linear_recurrent,
)
from attn_cli.core.pipeline import run
from attn_cli.io.examples import find_example
from attn_cli.io.fixture import load_fixture
from attn_cli.io.validate import validate


def load_example(name: str) -> Any:
    path = find_example(name)
    assert path is not None
    return load_fixture(str(path))


TORCH = json.loads(
    (Path(__file__).parent.parent / "reference" / "torch_gated_deltanet.json").read_text()
)


# -- the references: the papers' and transformers' formulas as plain loops -----------------------


def loop_linear(Q: Any, K: Any, V: Any) -> Any:
    """o_t = Σ_{s≤t} φ(q_t)·φ(k_s) v_s / Σ_{s≤t} φ(q_t)·φ(k_s), one head, token by token."""

    def phi(x: float) -> float:
        return x + 1 if x > 0 else float(np.exp(x))

    T, out = Q.shape[0], np.zeros((Q.shape[0], V.shape[1]))
    for t in range(T):
        num, den = np.zeros(V.shape[1]), 0.0
        for s in range(t + 1):
            w = float(sum(phi(Q[t, i]) * phi(K[s, i]) for i in range(Q.shape[1])))
            num += w * V[s]
            den += w
        out[t] = num / den
    return out


def loop_delta(q: Any, k: Any, v: Any, g: Any, beta: Any) -> Any:
    """Qwen3-Next's delta rule for one head, number by number, on raw q and k: l2norm, q/√d_k,
    S ← S·e^g; S ← S + k (β (v − Sᵀk))ᵀ; o = Sᵀq."""
    T, dk = q.shape
    dv = v.shape[1]
    S, out = np.zeros((dk, dv)), np.zeros((T, dv))
    for t in range(T):
        qt = q[t] / np.sqrt(np.sum(q[t] ** 2) + 1e-6) / np.sqrt(dk)
        kt = k[t] / np.sqrt(np.sum(k[t] ** 2) + 1e-6)
        S = S * np.exp(g[t])
        for j in range(dv):
            pred = sum(S[i, j] * kt[i] for i in range(dk))
            delta = beta[t] * (v[t, j] - pred)
            for i in range(dk):
                S[i, j] += kt[i] * delta
        out[t] = [sum(S[i, j] * qt[i] for i in range(dk)) for j in range(dv)]
    return out


def loop_front(X: Any, d: dict[str, Any], heads: int, k_heads: int) -> dict[str, Any]:
    """Qwen3NextGatedDeltaNet.forward before the kernel, one batch item, written plainly."""
    T = X.shape[0]
    qkv = np.concatenate([X @ d["W_q"], X @ d["W_k"], X @ d["W_v"]], axis=1)
    conv, K = np.array(d["conv"]), np.array(d["conv"]).shape[1]
    mixed = np.zeros_like(qkv)
    for t in range(T):
        for j in range(K):
            src = t - (K - 1) + j
            if src >= 0:
                mixed[t] += conv[:, j] * qkv[src]
    mixed = mixed / (1 + np.exp(-mixed))
    kd = np.array(d["W_q"]).shape[1]
    dk, dv = kd // k_heads, np.array(d["W_v"]).shape[1] // heads
    q = mixed[:, :kd].reshape(T, k_heads, dk)
    k = mixed[:, kd : 2 * kd].reshape(T, k_heads, dk)
    v = mixed[:, 2 * kd :].reshape(T, heads, dv)
    beta = 1 / (1 + np.exp(-(X @ d["W_b"])))
    a = X @ d["W_a"] + d["dt_bias"]
    g = -np.exp(np.array(d["A_log"])) * np.log1p(np.exp(a))
    return {"q": q, "k": k, "v": v, "beta": beta, "g": g, "z": (X @ d["W_z"]).reshape(T, heads, dv)}


def loop_layer(X: Any, d: dict[str, Any], heads: int, k_heads: int, eps: float) -> Any:
    """The whole layer before out_proj: (T, heads*d_v)."""
    f = loop_front(X, d, heads, k_heads)
    group, outs = heads // k_heads, []
    for h in range(heads):
        o = loop_delta(
            f["q"][:, h // group],
            f["k"][:, h // group],
            f["v"][:, h],
            f["g"][:, h],
            f["beta"][:, h],
        )
        z = f["z"][:, h]
        normed = o / np.sqrt(np.mean(o**2, axis=1, keepdims=True) + eps) * np.array(d["norm"])
        outs.append(normed * z / (1 + np.exp(-z)))
    return np.concatenate(outs, axis=1)


# -- the bundled examples against the loops -------------------------------------------------------


def test_linear_attention_example_matches_the_loop() -> None:
    inp = load_example("linear_attention")
    trace = run(inp)
    Q, K, V = (trace[n].data for n in ("Q", "K", "V"))  # (H, T, d)
    for h in range(inp.heads):
        want = loop_linear(Q[h], K[h], V[h])
        for stage in ("output", "output_recurrent", "output_chunked"):
            np.testing.assert_allclose(trace[stage].data[h], want, rtol=1e-10, err_msg=stage)
    weights = trace["implicit_weights"].data
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-12)
    assert np.all(np.triu(weights, 1) == 0) and np.all(weights >= 0)
    assert trace.scale == 1.0 and "softmax" not in trace and "scores" not in trace
    # the state after the last token is Σ φ(k_s) v_sᵀ, the normaliser Σ φ(k_s)
    phi_K = trace["phi_K"].data
    np.testing.assert_allclose(trace["state"].data[:, -1], phi_K.swapaxes(1, 2) @ V, rtol=1e-12)
    np.testing.assert_allclose(trace["normaliser"].data[:, -1], phi_K.sum(axis=1), rtol=1e-12)


def test_gated_deltanet_example_matches_the_loop() -> None:
    inp = load_example("gated_deltanet")
    trace = run(inp)
    d = {
        k: np.asarray(getattr(inp.extra["gated_deltanet"], k))
        for k in ("W_q", "W_k", "W_v", "W_z", "W_b", "W_a", "conv", "A_log", "dt_bias", "norm")
    }
    assert inp.X is not None and inp.W_O is not None
    want = loop_layer(inp.X[0], d, inp.heads, 1, 1e-6)  # (T, H*d_v)
    np.testing.assert_allclose(trace["concat"].data, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(trace["projected"].data, want @ inp.W_O, rtol=1e-10, atol=1e-12)
    for stage in ("output_recurrent", "output_chunked"):
        np.testing.assert_allclose(trace[stage].data, trace["output"].data, rtol=1e-10, atol=1e-12)
    # the state stays d_k × d_v per head, whatever the token
    assert trace["state"].shape == (2, 6, 4, 3)


def test_the_examples_trace_in_float32() -> None:
    for name in ("linear_attention", "gated_deltanet"):
        r64, r32 = run(load_example(name)), run(load_example(name), dtype="float32")
        np.testing.assert_allclose(
            r32["projected"].data, r64["projected"].data, rtol=1e-4, atol=1e-5
        )


# -- transformers' numbers -------------------------------------------------------------------------


def _prepared(case: dict[str, Any]) -> tuple[Any, ...]:
    """transformers' rule inputs in attn's layout (B, H, T, ·), q/k l2-normed, q scaled."""
    q, k, v = (np.array(case[n]) for n in ("q", "k", "v"))  # (B, T, heads, d)
    g, beta = np.array(case["g"]).swapaxes(1, 2), np.array(case["beta"]).swapaxes(1, 2)
    group = v.shape[2] // q.shape[2]
    q, k = (np.repeat(x, group, axis=2).swapaxes(1, 2) for x in (q, k))
    q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + 1e-6) / np.sqrt(q.shape[-1])
    k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + 1e-6)
    return q, k, v.swapaxes(1, 2), g, beta


def test_the_three_forms_match_transformers_delta_rules() -> None:
    case = TORCH["rules"]
    q, k, v, g, beta = _prepared(case)
    want = np.array(case["recurrent"]).swapaxes(1, 2)  # (B, H, T, d_v)
    # transformers computes in float32 whatever it is given
    np.testing.assert_allclose(delta_recurrent(q, k, v, g, beta)[1], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(delta_parallel(q, k, v, g, beta)[1], want, rtol=1e-4, atol=1e-5)
    for size in (4, 64):
        chunk = np.array(case[f"chunk_{size}"]).swapaxes(1, 2)
        np.testing.assert_allclose(chunk, want, rtol=1e-4, atol=1e-5)
        got = delta_chunked(q, k, v, g, beta, size)
        np.testing.assert_allclose(got, chunk, rtol=1e-4, atol=1e-5)
    assert TORCH["transformers"] == "5.24.0"


def delta_from_torch(w: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Qwen3NextGatedDeltaNet's weights on the gated_deltanet key: in_proj_qkvz is laid out per
    key head [q | k | v of its value heads | z of its value heads] (fix_query_key_value_ordering),
    in_proj_ba per key head [b | a]; Linear weights transposed; conv1d.weight[:, 0, :]."""
    Hk, Hv, dk, dv = (cfg[n] for n in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"))
    r = Hv // Hk
    qkvz = np.array(w["in_proj_qkvz.weight"]).reshape(Hk, 2 * dk + 2 * r * dv, -1)
    q, k, v, z = np.split(qkvz, [dk, 2 * dk, 2 * dk + r * dv], axis=1)
    ba = np.array(w["in_proj_ba.weight"]).reshape(Hk, 2 * r, -1)
    b, a = np.split(ba, [r], axis=1)

    def flat(x: Any) -> Any:
        return x.reshape(-1, x.shape[-1]).T  # (rows per head) -> (d_model, ·)

    return {
        "W_q": flat(q),
        "W_k": flat(k),
        "W_v": flat(v),
        "W_z": flat(z),
        "W_b": flat(b),
        "W_a": flat(a),
        "conv": np.array(w["conv1d.weight"])[:, 0, :],
        "A_log": np.array(w["A_log"]),
        "dt_bias": np.array(w["dt_bias"]),
        "norm": np.array(w["norm.weight"]),
        "k_heads": Hk,
        "eps": cfg["eps"],
    }


def test_attn_computes_what_the_transformers_layer_computes() -> None:
    case = TORCH["layer"]
    cfg, w = case["config"], case["weights"]
    fixture = {
        "X": np.array(case["X"]),
        "heads": cfg["num_v_heads"],
        "causal": True,
        "gated_deltanet": delta_from_torch(w, cfg),
        "W_O": np.array(w["out_proj.weight"]).T,
    }
    trace = run(validate(fixture, "torch_gated_deltanet.json"))
    np.testing.assert_allclose(trace["projected"].data, case["output"], rtol=1e-4, atol=1e-6)
    mapped = delta_from_torch(w, cfg)
    want = loop_layer(np.array(case["X"])[0], mapped, cfg["num_v_heads"], 1, 1e-6)
    np.testing.assert_allclose(trace["concat"].data[0], want, rtol=1e-10, atol=1e-12)


# -- the law: recurrent = chunked = parallel, over random shapes ----------------------------------


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 2),
    H=st.integers(1, 3),
    T=st.integers(1, 13),
    dk=st.integers(1, 5),
    dv=st.integers(1, 4),
    chunk=st.integers(1, 8),
    seed=st.integers(0, 2**31),
)
def test_delta_rule_forms_agree(
    B: int, H: int, T: int, dk: int, dv: int, chunk: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((B, H, T, dk)) for _ in range(2))
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((B, H, T, dv))
    g, beta = -rng.uniform(0, 2, (B, H, T)), rng.uniform(0, 1, (B, H, T))
    rec = delta_recurrent(q, k, v, g, beta)[1]
    weights, par = delta_parallel(q, k, v, g, beta)
    np.testing.assert_allclose(par, rec, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(delta_chunked(q, k, v, g, beta, chunk), rec, rtol=1e-9, atol=1e-10)
    assert np.all(np.triu(weights, 1) == 0)


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 2),
    H=st.integers(1, 3),
    T=st.integers(1, 13),
    dk=st.integers(1, 5),
    dv=st.integers(1, 4),
    chunk=st.integers(1, 8),
    seed=st.integers(0, 2**31),
)
def test_linear_forms_agree(
    B: int, H: int, T: int, dk: int, dv: int, chunk: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    pq, pk = (rng.uniform(0.05, 3, (B, H, T, dk)) for _ in range(2))
    v = rng.standard_normal((B, H, T, dv))
    weights, par = linear_parallel(pq, pk, v)
    rec = linear_recurrent(pq, pk, v)[2]
    np.testing.assert_allclose(par, rec, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(linear_chunked(pq, pk, v, chunk), rec, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-12)


# -- one-line errors and refusals ----------------------------------------------------------------


def _yaml(name: str, old: str, new: str, tmp_path: Path) -> Path:
    found = find_example(name)
    assert found is not None
    text = found.read_text(encoding="utf-8")
    assert old in text, old
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("name", "old", "new", "message"),
    [
        (
            "linear_attention",
            "  feature_map: elu+1",
            "  feature_map: relu",
            "linear_attention.feature_map: got the string 'relu', expected elu+1",
        ),
        (
            "linear_attention",
            "  chunk: 4",
            "  chunk: 0",
            "linear_attention.chunk: got the number 0, expected a whole number from 1 to 1024",
        ),
        (
            "linear_attention",
            "  chunk: 4",
            "  chunk: 9223372036854775808",  # was: a traceback
            "linear_attention.chunk: got the number "
            "9223372036854775808, expected a whole number from "
            "1 to 1024",
        ),
        (
            "gated_deltanet",
            "  chunk: 4",
            "  chunk: 9223372036854775808",  # was: a traceback
            "gated_deltanet.chunk: got the number "
            "9223372036854775808, expected a whole number from 1 "
            "to 1024",
        ),
        (
            "gated_deltanet",
            "  chunk: 4",
            "  chunk: 4.0",
            "gated_deltanet.chunk: got the number 4.0",
        ),
        (
            "gated_deltanet",
            "  k_heads: 1",
            "  k_heads: 2.0",
            "gated_deltanet.k_heads: got the number",
        ),
        (
            "linear_attention",
            "causal: true",
            "causal: true\nsoftcap: 30",
            "softcap: given with linear_attention",
        ),
        (
            "gated_deltanet",
            "  k_heads: 1",
            "  k_heads: 3",
            "gated_deltanet.k_heads: got the number 3, expected a "
            "whole number from 1 to 2 (dividing "
            "heads = 2)",
        ),
        ("gated_deltanet", "  chunk: 4", "  chunk: -1", "gated_deltanet.chunk: got the number -1"),
        (
            "gated_deltanet",
            "causal: true",
            "causal: true\nrope: {base: 10000}",
            "rope: given with gated_deltanet",
        ),
        ("gated_deltanet", "  A_log:", "  A_log: [1]\n  unused:", "gated_deltanet.unused"),
    ],
)
def test_bad_settings_are_one_line_errors(
    name: str, old: str, new: str, message: str, tmp_path: Path
) -> None:
    result = run_cli("trace", str(_yaml(name, old, new, tmp_path)))
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["linear_attention", "gated_deltanet"])
@pytest.mark.parametrize("command", [("flash",), ("trace", "--backward")])
def test_what_is_not_run_yet_is_refused_in_one_line(name: str, command: tuple[str, ...]) -> None:
    result = run_cli(*command, name)
    assert result.exit_code == 2, result.output
    assert f"{name}: " in result.stderr and "does not yet run linear attention" in result.stderr
    assert result.stderr.count("\n") == 1


def test_the_examples_explain_every_stage_in_both_languages() -> None:
    for name in ("linear_attention", "gated_deltanet"):
        for lang in ("en", "zh"):
            result = run_cli("trace", name, "--explain", "--lang", lang)
            assert result.exit_code == 0, result.output
        assert "implicit_weights" in result.stdout and "state" in result.stdout


@pytest.mark.parametrize(
    ("old", "new", "options", "message"),
    [
        ("  A_log: [", "  A_log: [.nan, ", (), "gated_deltanet.A_log[0]: is nan (not a number)"),
        ("  A_log: [1.21, 0.28]", "  A_log: [800, 0.28]", (), "g[head 0, query 0 'The']: is -inf"),
        ("  - [-0.36, 1.2", "  - [1e200, 1.2", (), "q_l2[head 0, query 0 'The', d_k 0]: is inf"),
        (
            "  - [-0.36, 1.2",
            "  - [1e200, 1.2",
            ("--dtype", "float32"),
            "is 1e+200 (float32 overflow)",
        ),
        (
            "  norm: [",
            "  norm: [1, ",
            (),
            "gated_deltanet.norm: has shape [4], expected a vector of",
        ),
    ],
)
def test_hostile_gated_deltanet_numbers_are_one_line_errors(
    old: str, new: str, options: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    """An overflow inside a norm is named where it happens, never a silent 0 (x / inf)."""
    result = run_cli("trace", str(_yaml("gated_deltanet", old, new, tmp_path)), *options)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and result.stderr.count("\n") == 1
