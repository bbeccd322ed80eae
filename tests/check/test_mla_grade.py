"""attn check names the mistakes people make with multi-head latent attention. A student written
here with NumPy from transformers 5.24's DeepseekV3Attention.forward (nothing from attn_cli)
computes the bundled deepseek_mla example with one mistake planted, dumps the stages a learner
would print, and attn check must name that mistake; with none planted, the dump must match."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import FIXTURES, run_cli

Array = np.ndarray[Any, Any]


def rms(x: Array, w: Array, eps: float = 1e-6) -> Array:
    out: Array = w * x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + eps)
    return out


def rope(x: Array, pos: Array, base: float = 10000.0) -> Array:
    """DeepSeek's interleaved pairs, written out as transformers returns them."""
    d = x.shape[-1]
    ang = pos[:, None] * base ** (-np.arange(0, d, 2) / d)  # (T, d/2)
    c, s = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def student(fx: dict[str, Any], mistake: str | None = None) -> dict[str, Array]:
    m = {k: np.asarray(v, dtype=float) for k, v in fx["mla"].items()}
    X, H = np.asarray(fx["X"], dtype=float), fx["heads"]
    T = X.shape[0]
    pos = np.arange(T, dtype=float)
    q = (rms(X @ m["W_DQ"], m["q_norm"]) @ m["W_UQ"]).reshape(T, H, -1).transpose(1, 0, 2)
    r, d_rope = m["W_DKV"].shape[1], m["W_KR"].shape[1]
    d_nope = q.shape[-1] - d_rope
    c_kv = rms(X @ m["W_DKV"], m["kv_norm"])  # (T, r)
    k_pe = X @ m["W_KR"]  # (T, d_rope)
    k_nope = (c_kv @ m["W_UK"]).reshape(T, H, d_nope).transpose(1, 0, 2)  # (H, T, d_nope)
    v = (c_kv @ m["W_UV"]).reshape(T, H, -1).transpose(1, 0, 2)  # (H, T, d_v)
    if mistake == "mla_rope_whole_head":
        Q = rope(q, pos)
        K = rope(np.concatenate([k_nope, np.broadcast_to(k_pe, (H, T, d_rope))], -1), pos)
    else:
        q_pe, k_rot = rope(q[..., d_nope:], pos), rope(k_pe, pos)
        if mistake == "mla_k_rope_per_head":  # each head a slice, repeated feature by feature
            k_heads = np.repeat(k_rot, H, axis=-1).reshape(T, H, d_rope).transpose(1, 0, 2)
        else:
            k_heads = np.broadcast_to(k_rot, (H, T, d_rope))
        Q = np.concatenate([q[..., :d_nope], q_pe], axis=-1)
        K = np.concatenate([k_nope, k_heads], axis=-1)
    scores = Q @ K.transpose(0, 2, 1)  # (H, T, T)
    if mistake == "mla_absorbed_without_rope":  # W_UK absorbed, k_rope's part forgotten
        W_UK = m["W_UK"].reshape(r, H, d_nope).transpose(1, 0, 2)  # (H, r, d_nope)
        scores = (q[..., :d_nope] @ W_UK.transpose(0, 2, 1)) @ c_kv.T
    d = d_nope if mistake == "mla_scale_nope_only" else d_nope + d_rope
    scaled = scores / np.sqrt(d)
    masked = np.where(np.tril(np.ones((T, T), bool)), scaled, -np.inf)
    e = np.exp(masked - masked.max(-1, keepdims=True))
    softmax = e / e.sum(-1, keepdims=True)
    output = softmax @ v  # (H, T, d_v)
    concat = output.transpose(1, 0, 2).reshape(T, -1)
    projected = concat @ np.asarray(fx["W_O"], dtype=float)
    return {
        "Q": Q,
        "K": K,
        "V": v,
        "scores": scores,
        "scaled": scaled,
        "masked": masked,
        "softmax": softmax,
        "output": output,
        "concat": concat,
        "projected": projected,
    }


FX = yaml.safe_load((FIXTURES / "deepseek_mla.yaml").read_text(encoding="utf-8"))
MISTAKES = [
    "mla_absorbed_without_rope",
    "mla_rope_whole_head",
    "mla_scale_nope_only",
    "mla_k_rope_per_head",
]


def check(tmp_path: Path, dump: dict[str, Array], *options: str) -> Any:
    np.savez(tmp_path / "dump.npz", **dump)  # type: ignore[arg-type]
    return run_cli("check", "deepseek_mla", "--against", str(tmp_path / "dump.npz"), *options)


def test_a_correct_student_matches(tmp_path: Path) -> None:
    result = check(tmp_path, student(FX))
    assert result.exit_code == 0, result.stdout


@pytest.mark.parametrize("mistake", MISTAKES)
@pytest.mark.parametrize("dumped", [("scores", "softmax", "output"), ("softmax", "projected")])
def test_attn_check_names_the_mistake(
    tmp_path: Path, mistake: str, dumped: tuple[str, ...]
) -> None:
    stages = student(FX, mistake)
    if mistake == "mla_scale_nope_only" and "scores" in dumped:
        dumped = ("scores", "scaled", "softmax")  # the scores are right: scaled is the first
    result = check(tmp_path, {n: stages[n] for n in dumped}, "--format", "json")
    assert result.exit_code == 1, result.stdout
    found = json.loads(result.stdout)["fixtures"][0]["diagnoses"]
    assert [d["name"] for d in found] == [mistake]
    assert found[0]["title_zh"] and found[0]["explanation_zh"]
