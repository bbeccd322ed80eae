"""The norm after RoPE, the shipped variant ``post_rope_norm`` (HunYuan's query/key_layernorm with
weights, Llama 4's weightless q/k "L2 norm"): Q_postnorm, K_postnorm, softmax and output against
plain loops written here (RoPE from the loop reference of the fixture without the norm, then the
norm, then attention), a law of the weightless norm, its texts and bad settings, the backward
pass against the norm's Jacobian written out, decoding, flash, and the grader's two mistakes."""

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
from reference import random_fixture, reference

from attn_cli.api import trace_file
from attn_cli.check.dump import load_dump
from attn_cli.check.grade import grade
from attn_cli.core.pipeline import run
from attn_cli.io.fixture import validate

F64 = 1e-12
HUNYUAN: dict[str, Any] = {"q_weight": [1.2, 0.6, 0.9, 1.4], "k_weight": [0.7, 1.3, 1.1, 0.8]}
HUNYUAN["eps"] = 1e-5
LLAMA4: dict[str, Any] = {"eps": 1e-5}  # no weight: Llama4TextL2Norm


def fixture(setting: dict[str, Any], T: int = 6, heads: int = 2, kv: int = 1) -> dict[str, Any]:
    fx = random_fixture(
        7, seq=T, d_model=8, heads=heads, kv_heads=kv, d_k=4, W_O=True, causal=True, rope=True
    )
    return {**fx, "post_rope_norm": setting}


def rms_row(x: list[float], w: list[float], eps: float, literal: bool = False) -> list[float]:
    """x / sqrt(mean(x²) + eps) * w, one number at a time (``literal``: x / ‖x‖ * w)."""
    total = math.fsum(a * a for a in x)
    r = math.sqrt(total) if literal else math.sqrt(total / len(x) + eps)
    return [a / r * wi for a, wi in zip(x, w, strict=True)]


def loops(fx: dict[str, Any], before: bool = False, literal: bool = False) -> dict[str, Any]:
    """Q_postnorm, K_postnorm, softmax, output by loops, RoPE first, then the norm (``before``:
    the norm first, then RoPE, a student's mistake; ``literal``: x / ‖x‖)."""
    setting = fx["post_rope_norm"]
    plain = {k: v for k, v in fx.items() if k != "post_rope_norm"}
    ref = reference(plain)
    D = ref["Q"].shape[-1]
    ones = [1.0] * D
    w = {"Q": setting.get("q_weight", ones), "K": setting.get("k_weight", ones)}
    normed = {}
    for which in "QK":
        if before:  # norm(Q) rotated by the loop reference: a fixture whose Q is norm(X·W_Q)
            x = np.asarray(ref[which])  # (h, T, D)
            rows = [[rms_row(list(r), w[which], setting["eps"]) for r in hd] for hd in x]
            normed[which] = _rotated(fx, which, np.asarray(rows))
        else:
            x = np.asarray(ref[f"{which}_rot"])
            rows = [[rms_row(list(r), w[which], setting["eps"], literal) for r in hd] for hd in x]
            normed[which] = np.asarray(rows)  # (h, T, D)
    q, k, v = normed["Q"], normed["K"], np.asarray(ref["V"])
    H, T, _ = q.shape
    group = H // k.shape[0]
    P = np.zeros((H, T, T))
    out = np.zeros((H, T, v.shape[-1]))
    for h in range(H):
        for t in range(T):
            logits = [math.fsum(q[h, t] * k[h // group, s]) / math.sqrt(D) for s in range(t + 1)]
            top = max(logits)
            e = [math.exp(x - top) for x in logits]
            for s in range(t + 1):
                P[h, t, s] = e[s] / math.fsum(e)
                out[h, t] += P[h, t, s] * v[h // group, s]
    return {"Q_postnorm": q, "K_postnorm": k, "softmax": P, "output": out}


def _rotated(fx: dict[str, Any], which: str, rows: Any) -> Any:
    """``rows`` (h, T, D) rotated by the loop reference, as given Q (or K) of a direct fixture."""
    h, T, D = rows.shape
    flat = rows.transpose(1, 0, 2).reshape(T, h * D).tolist()  # (T, h*D)
    direct = {"Q": flat, "K": flat, "V": flat, "heads": h, "kv_heads": h, "rope": fx["rope"]}
    return np.asarray(reference(direct)[f"{which}_rot"])


@pytest.mark.parametrize("setting", [HUNYUAN, LLAMA4], ids=["hunyuan", "llama4"])
def test_q_and_k_are_normalised_after_rope_as_the_loops_say(setting: dict[str, Any]) -> None:
    fx = fixture(setting)
    trace = run(validate(fx, "post.json"))
    want = loops(fx)
    names = [s.name for s in trace]
    assert names.index("Q_rot") < names.index("Q_postnorm") < names.index("scores")
    for name in ("Q_postnorm", "K_postnorm", "softmax", "output"):
        np.testing.assert_allclose(trace[name].data, want[name], rtol=F64, atol=F64)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    eps=st.sampled_from([1e-6, 1e-5, 1e-2, 1.0]),
    heads=st.sampled_from([(1, 1), (2, 1), (4, 2)]),
    magnitude=st.sampled_from([1e-3, 1.0, 1e3]),
)
def test_a_weightless_row_has_mean_square_ms_over_ms_plus_eps(
    seed: int, eps: float, heads: tuple[int, int], magnitude: float
) -> None:
    """Without a weight every row of Q_postnorm has mean square m / (m + eps), m the row's own
    mean square before the norm (RoPE keeps it): about 1, whatever the scale of X."""
    H, Hkv = heads
    fx = random_fixture(
        seed, seq=4, d_model=6, heads=H, kv_heads=Hkv, d_k=4, rope=True, magnitude=magnitude
    )
    trace = run(validate({**fx, "post_rope_norm": {"eps": eps}}, "law.json"))
    for which in "QK":
        before = trace[f"{which}_rot"].data
        m = np.mean(before * before, axis=-1)
        after = trace[f"{which}_postnorm"].data
        np.testing.assert_allclose(np.mean(after * after, axis=-1), m / (m + eps), rtol=1e-9)


@pytest.mark.slow
def test_trace_json_and_explain_in_both_languages(tmp_path: Path) -> None:
    path = tmp_path / "post.json"
    path.write_text(json.dumps(fixture(HUNYUAN)))
    doc = run_cli("trace", str(path), "--format", "json")
    assert doc.exit_code == 0, doc.output
    assert json.loads(doc.stdout)["config"]["post_rope_norm"] == {"eps": 1e-5, "weight": True}
    for lang, said in (("en", "root mean square"), ("zh", "旋转之后")):
        result = run_cli(
            "trace", str(path), "--stage", "K_postnorm", "--explain", "--lang", lang, "-f", "plain"
        )
        assert result.exit_code == 0, result.output
        flat = " ".join(result.stdout.split())  # the lines joined, as the text was written
        assert said in flat or said in flat.replace(" ", ""), flat


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({}, "post_rope_norm.eps"),
        ({"eps": 0}, "post_rope_norm.eps"),
        ({"eps": "1e-5"}, "post_rope_norm.eps"),
        ({"q_weight": [1, 1, 1, 1], "eps": 1e-5}, "post_rope_norm.k_weight"),
        ({**HUNYUAN, "q_weight": [1, 1, 1]}, "post_rope_norm.q_weight"),
        ({**HUNYUAN, "k_weight": [1, 1, 1, 1, 1, 1, 1, 1]}, "post_rope_norm.k_weight"),
        ({**HUNYUAN, "weight": [1, 1, 1, 1]}, "post_rope_norm.weight"),
        (1e-5, "post_rope_norm"),
    ],
)
def test_a_bad_setting_is_one_line(tmp_path: Path, raw: Any, field: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**fixture(HUNYUAN), "post_rope_norm": raw}))
    result = run_cli("trace", str(path))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: {path}: {field}: ")
    assert len(result.stderr.splitlines()) == 1


def _jacobian_back(d_y: Any, x: Any, w: Any, eps: float) -> Any:
    """d_x of y = w ∘ x / r, r = √(mean(x²) + eps), by the Jacobian written out entry by entry:
    ∂y_i/∂x_j = w_i (δ_ij / r − x_i x_j / (D r³))."""
    out = np.zeros_like(x)
    for idx in np.ndindex(*x.shape[:-1]):
        row, d_row = x[idx], d_y[idx]
        D = len(row)
        r = math.sqrt(math.fsum(a * a for a in row) / D + eps)
        for j in range(D):
            out[idx][j] = math.fsum(
                d_row[i] * w[i] * ((i == j) / r - row[i] * row[j] / (D * r**3)) for i in range(D)
            )
    return out


@pytest.mark.parametrize("setting", [HUNYUAN, LLAMA4], ids=["hunyuan", "llama4"])
def test_backward_decode_and_flash(tmp_path: Path, setting: dict[str, Any]) -> None:
    from attn_cli.check.runs import run_decode, run_flash

    fx = fixture(setting, heads=2, kv=2)
    trace = run(validate(fx, "post.json"), backward=True)
    names = [s.name for s in trace]
    assert names.index("d_Q_postnorm") < names.index("d_Q_rot")
    for which in "QK":
        w = np.asarray(setting.get(f"{which.lower()}_weight", [1.0] * 4))
        want = _jacobian_back(
            trace[f"d_{which}_postnorm"].data, trace[f"{which}_rot"].data, w, setting["eps"]
        )
        np.testing.assert_allclose(trace[f"d_{which}_rot"].data, want, rtol=1e-10, atol=1e-12)
    path = tmp_path / "post.json"
    path.write_text(json.dumps(fx))
    want = loops(fx)["output"]
    decoded = run_decode(str(path), prefill=2)
    assert decoded.ok, decoded.worst
    np.testing.assert_allclose(decoded.result.prefill_output[0], want[:, :2], rtol=F64, atol=F64)
    for step in decoded.result.steps:
        np.testing.assert_allclose(step.output[0, :, 0], want[:, step.index], rtol=F64, atol=F64)
    flash = run_flash(str(path), block_q=2, block_k=2)
    assert flash.ok
    np.testing.assert_allclose(flash.output[0], want, rtol=F64, atol=F64)


@pytest.mark.parametrize(
    ("mistake", "how"),
    [
        ("post_rope_norm_before_rope", {"before": True}),
        ("post_rope_norm_l2_literal", {"literal": True}),
    ],
)
def test_a_planted_mistake_is_named(tmp_path: Path, mistake: str, how: dict[str, Any]) -> None:
    fx = fixture(HUNYUAN)
    student = loops(fx, **how)
    dump = {n: student[n][None] for n in ("Q_postnorm", "K_postnorm", "softmax", "output")}
    np.savez(tmp_path / "dump.npz", **dump)
    path = tmp_path / "fx.json"
    path.write_text(json.dumps(fx))
    comparison = grade(trace_file(str(path)), load_dump(tmp_path / "dump.npz"))
    assert [d.name for d in comparison.diagnoses] == [mistake]


def test_before_rope_is_no_mistake_without_a_weight(tmp_path: Path) -> None:
    """A rotation keeps a row's RMS: without a weight, norm(rope(x)) == rope(norm(x))."""
    fx = fixture(LLAMA4)
    np.testing.assert_allclose(
        loops(fx, before=True)["output"], loops(fx)["output"], rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("setting", [HUNYUAN, LLAMA4], ids=["hunyuan", "llama4"])
def test_decode_with_a_query_temperature_after_the_norm(tmp_path: Path, setting: Any) -> None:
    """RoPE, the norm, then a position-dependent query scale: decoding applies all three to
    each token in that order (the norm would undo a scale applied before it)."""
    from attn_cli.check.runs import run_decode

    fx = {**fixture(setting), "temperature": {"floor_scale": 2, "attn_scale": 0.5}}
    want = reference(fx)["output"]  # (H, T, Dv), the loop reference's
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(fx))
    decoded = run_decode(str(path), prefill=2)
    assert decoded.ok, decoded.worst
    for step in decoded.result.steps:
        np.testing.assert_allclose(step.output[0, :, 0], want[:, step.index], rtol=F64, atol=F64)
