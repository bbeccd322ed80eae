"""Attention temperature, the shipped variant ``temperature`` (Llama 4's attn_temperature_tuning,
Ministral 3's llama_4_scaling_beta): Q_tuned, softmax and the output against loops written here
from the loop reference's Q_rot, K_rot and V (tests/reference.py knows nothing of it), its texts,
its bad settings, the backward pass, decoding, flash, and the grader's two mistakes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli
from reference import random_fixture, reference

from attn_cli.api import trace_file
from attn_cli.check.dump import load_dump
from attn_cli.check.grade import grade
from attn_cli.core.pipeline import run
from attn_cli.io.fixture import validate

F64 = 1e-12
LLAMA4: dict[str, Any] = {"floor_scale": 2, "attn_scale": 0.5}  # offset 1 by default
MINISTRAL3: dict[str, Any] = {"floor_scale": 2, "attn_scale": 0.5, "offset": 0}


def factor(pos: int, floor_scale: float, attn_scale: float, offset: int = 1) -> float:
    """HF's line: log1p(floor((pos + offset) / floor_scale)) * attn_scale + 1."""
    return float(np.log1p(np.floor((pos + offset) / floor_scale)) * attn_scale + 1.0)


def fixture(setting: dict[str, Any], T: int = 6) -> dict[str, Any]:
    fx = random_fixture(
        5, seq=T, d_model=8, heads=2, kv_heads=1, d_k=4, W_O=True, causal=True, rope=True
    )
    return {**fx, "temperature": setting}


def loops(fx: dict[str, Any], on_keys: bool = False, offset: int | None = None) -> dict[str, Any]:
    """Q_tuned, scores, softmax, output by loops (optionally a student's mistake)."""
    setting = dict(fx["temperature"])
    if offset is not None:
        setting["offset"] = offset
    ref = reference({k: v for k, v in fx.items() if k != "temperature"})
    q_rot, k_rot, v = ref["Q_rot"], ref["K_rot"].copy(), ref["V"]
    H, T, D = q_rot.shape
    q = np.array([[q_rot[h, t] * factor(t, **setting) for t in range(T)] for h in range(H)])
    if on_keys:
        k_rot = np.array([[k_rot[0, s] * factor(s, **setting) for s in range(T)]])
    scores = np.zeros((H, T, T))
    P = np.zeros((H, T, T))
    out = np.zeros((H, T, v.shape[-1]))
    for h in range(H):
        for t in range(T):
            for s in range(T):
                scores[h, t, s] = sum(q[h, t, d] * k_rot[0, s, d] for d in range(D))
            logits = scores[h, t, : t + 1] / D**0.5
            e = np.exp(logits - logits.max())
            P[h, t, : t + 1] = e / e.sum()
            out[h, t] = P[h, t, : t + 1] @ v[0, : t + 1]
    return {"Q_tuned": q, "scores": scores, "softmax": P, "output": out}


@pytest.mark.parametrize("setting", [LLAMA4, MINISTRAL3], ids=["llama4", "ministral3"])
def test_the_queries_are_tuned_as_the_loops_say(setting: dict[str, Any]) -> None:
    fx = fixture(setting)
    trace = run(validate(fx, "tuned"))
    want = loops(fx)
    names = [s.name for s in trace]
    assert names.index("Q_rot") < names.index("Q_tuned") < names.index("scores")
    assert "K_tuned" not in names
    for name in ("Q_tuned", "softmax", "output"):
        np.testing.assert_allclose(trace[name].data, want[name], rtol=F64, atol=F64)


def test_trace_json_and_explain_in_both_languages(tmp_path: Path) -> None:
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(fixture(LLAMA4)))
    doc = run_cli("trace", str(path), "--format", "json")
    assert doc.exit_code == 0, doc.output
    assert json.loads(doc.stdout)["config"]["temperature"]["offset"] == 1
    for lang, said in (("en", "grows with its position"), ("zh", "随位置增大的温度")):
        result = run_cli(
            "trace", str(path), "--stage", "Q_tuned", "--explain", "--lang", lang, "-f", "plain"
        )
        assert result.exit_code == 0, result.output
        flat = " ".join(result.stdout.split())  # the lines joined, as the text was written
        assert said in flat or said in flat.replace(" ", ""), flat


@pytest.mark.parametrize(
    "raw",
    [
        {"floor_scale": 0, "attn_scale": 0.1},
        {"floor_scale": 2},
        {"floor_scale": 2, "attn_scale": 0.1, "offset": 2},
        {"floor_scale": 2, "attn_scale": 0.1, "beta": 1},
        0.1,
        {"floor_scale": 2, "attn_scale": 0.1, "offset": -1},
    ],
)
def test_a_bad_setting_is_one_line(tmp_path: Path, raw: Any) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**fixture(LLAMA4), "temperature": raw}))
    result = run_cli("trace", str(path))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: {path}: temperature: ")
    assert len(result.stderr.splitlines()) == 1


def test_a_whole_number_past_int64_is_a_number() -> None:
    """floor_scale 10**30, an int NumPy's isfinite cannot take (a traceback before), is 1e30:
    every factor is 1 + 0.5 · ln(1 + 0) = 1, so Q_tuned is Q_rot."""
    trace = run(validate(fixture({**LLAMA4, "floor_scale": 10**30}), "huge"))
    np.testing.assert_array_equal(trace["Q_tuned"].data, trace["Q_rot"].data)


def test_backward_decode_and_flash(tmp_path: Path) -> None:
    from attn_cli.check.runs import run_decode, run_flash

    fx = fixture(LLAMA4)
    trace = run(validate(fx, "tuned"), backward=True)
    names = [s.name for s in trace]
    assert names.index("d_Q_tuned") < names.index("d_Q_rot")
    d_q = trace["d_Q_tuned"].data  # (H, T, D)
    for t in range(d_q.shape[1]):
        np.testing.assert_allclose(
            trace["d_Q_rot"].data[:, t], d_q[:, t] * factor(t, **LLAMA4), rtol=1e-10, atol=1e-12
        )
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(fx))
    want = loops(fx)["output"]
    decoded = run_decode(str(path), prefill=2)
    assert decoded.ok, decoded.worst
    for step in decoded.result.steps:
        np.testing.assert_allclose(step.output[0, :, 0], want[:, step.index], rtol=F64, atol=F64)
    flash = run_flash(str(path), block_q=2, block_k=2)
    assert flash.ok
    np.testing.assert_allclose(flash.output[0], want, rtol=F64, atol=F64)


@pytest.mark.parametrize(
    ("mistake", "how"),
    [("temperature_on_keys", {"on_keys": True}), ("temperature_off_by_one", {"offset": 0})],
)
def test_a_planted_mistake_is_named(tmp_path: Path, mistake: str, how: dict[str, Any]) -> None:
    fx = fixture(LLAMA4)
    student = loops(fx, **how)
    dump: dict[str, Any] = {n: student[n][None] for n in ("Q_tuned", "scores", "softmax")}
    if mistake == "temperature_on_keys":
        del dump["Q_tuned"]  # the queries are right: the scores are the first to differ
    np.savez(tmp_path / "dump.npz", **dump)
    path = tmp_path / "fx.json"
    path.write_text(json.dumps(fx))
    comparison = grade(trace_file(str(path)), load_dump(tmp_path / "dump.npz"))
    assert [d.name for d in comparison.diagnoses] == [mistake]
