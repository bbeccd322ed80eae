"""attn check names the mistakes people make with linear attention. A student written here with
NumPy from transformers 5.24's Qwen3NextGatedDeltaNet and torch_recurrent_gated_delta_rule, and
from Katharopoulos et al.'s causal linear attention (nothing from attn_cli), computes the bundled
examples with one mistake planted, dumps the stages a learner would print, and attn check must
name that mistake; with none planted, the dump must match."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import FIXTURES, run_cli

Array = np.ndarray[Any, Any]


def sigmoid(x: Array) -> Array:
    out: Array = 1 / (1 + np.exp(-x))
    return out


def delta_student(fx: dict[str, Any], mistake: str | None = None) -> dict[str, Array]:
    """Qwen3NextGatedDeltaNet.forward on one sequence, token by token in the kernel."""
    m = {k: np.asarray(v, dtype=float) for k, v in fx["gated_deltanet"].items()}
    X, H, Hk = np.asarray(fx["X"], dtype=float), fx["heads"], int(m["k_heads"])
    T = X.shape[0]
    mixed = np.concatenate([X @ m["W_q"], X @ m["W_k"], X @ m["W_v"]], axis=1)  # (T, C)
    K = m["conv"].shape[1]
    padded = np.concatenate([np.zeros((K - 1, mixed.shape[1])), mixed])
    conv = np.stack([(padded[t : t + K] * m["conv"].T).sum(0) for t in range(T)])
    conv = conv * sigmoid(conv)
    kd = m["W_q"].shape[1]
    dk, dv = kd // Hk, m["W_v"].shape[1] // H
    q = conv[:, :kd].reshape(T, Hk, dk).repeat(H // Hk, axis=1)  # (T, H, dk)
    k = conv[:, kd : 2 * kd].reshape(T, Hk, dk).repeat(H // Hk, axis=1)
    v = conv[:, 2 * kd :].reshape(T, H, dv)
    beta = sigmoid(X @ m["W_b"])  # (T, H)
    g = -np.exp(m["A_log"]) * np.log1p(np.exp(X @ m["W_a"] + m["dt_bias"]))
    if mistake != "delta_no_l2norm":
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    q = q / np.sqrt(dk)
    S = np.zeros((H, dk, dv))
    out = np.zeros((T, H, dv))
    for t in range(T):
        if mistake != "delta_no_decay":
            S = S * np.exp(g[t])[:, None, None]
        kv_mem = np.einsum("hkv,hk->hv", S, k[t])
        delta = (v[t] - kv_mem) * beta[t][:, None]
        if mistake == "delta_beta_sign":
            delta = (kv_mem - v[t]) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", S, q[t])
    z = (X @ m["W_z"]).reshape(T, H, dv)
    normed = out / np.sqrt((out**2).mean(-1, keepdims=True) + 1e-6) * m["norm"]
    normed = normed * z * sigmoid(z)
    concat = normed.reshape(T, H * dv)
    projected = concat @ np.asarray(fx["W_O"], dtype=float)
    return {
        "output": out.transpose(1, 0, 2),
        "normed": normed.transpose(1, 0, 2),
        "concat": concat,
        "projected": projected,
    }


def linear_student(fx: dict[str, Any], mistake: str | None = None) -> dict[str, Array]:
    """Causal linear attention, φ = elu + 1, from the running sums."""
    X, H = np.asarray(fx["X"], dtype=float), fx["heads"]
    T = X.shape[0]
    q, k, v = (
        (X @ np.asarray(fx[w], dtype=float)).reshape(T, H, -1).transpose(1, 0, 2)
        for w in ("W_Q", "W_K", "W_V")
    )

    def phi(x: Array) -> Array:
        out: Array = np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))
        return out

    pq, pk = phi(q), phi(k)
    S = np.cumsum(pk[..., :, None] * v[..., None, :], axis=1)  # (H, T, dk, dv)
    z = np.cumsum(pk, axis=1)  # (H, T, dk)
    out = np.einsum("htk,htkv->htv", pq, S)
    if mistake != "linear_no_normaliser":
        out = out / np.einsum("htk,htk->ht", pq, z)[..., None]
    concat = out.transpose(1, 0, 2).reshape(T, -1)
    return {
        "output": out,
        "concat": concat,
        "projected": concat @ np.asarray(fx["W_O"], dtype=float),
    }


STUDENTS = {"gated_deltanet": delta_student, "linear_attention": linear_student}
MISTAKES = [
    ("gated_deltanet", "delta_beta_sign"),
    ("gated_deltanet", "delta_no_l2norm"),
    ("gated_deltanet", "delta_no_decay"),
    ("linear_attention", "linear_no_normaliser"),
]


def fixture(name: str) -> Any:
    return yaml.safe_load((FIXTURES / f"{name}.yaml").read_text(encoding="utf-8"))


def check(tmp_path: Path, name: str, dump: dict[str, Array], *options: str) -> Any:
    np.savez(tmp_path / "dump.npz", **dump)  # type: ignore[arg-type]
    return run_cli("check", name, "--against", str(tmp_path / "dump.npz"), *options)


@pytest.mark.parametrize("name", list(STUDENTS))
def test_a_correct_student_matches(tmp_path: Path, name: str) -> None:
    result = check(tmp_path, name, STUDENTS[name](fixture(name)))
    assert result.exit_code == 0, result.stdout


@pytest.mark.parametrize(("name", "mistake"), MISTAKES)
@pytest.mark.parametrize("dumped", [("output", "projected"), ("projected",)])
def test_attn_check_names_the_mistake(
    tmp_path: Path, name: str, mistake: str, dumped: tuple[str, ...]
) -> None:
    stages = STUDENTS[name](fixture(name), mistake)
    result = check(tmp_path, name, {n: stages[n] for n in dumped}, "--format", "json")
    assert result.exit_code == 1, result.stdout
    found = json.loads(result.stdout)["fixtures"][0]["diagnoses"]
    assert [d["name"] for d in found] == [mistake]
    assert found[0]["title_zh"] and found[0]["explanation_zh"]
