"""Gated attention (Qwen3-Next, HF ``Qwen3NextAttention``): each head's output times σ(X·W_G + b_G),
per head and dimension, before the heads are joined and W_O projects them.

The independent source here is the formula as a slow loop over (batch, head, token, dimension),
from the fixture's own lists and the trace's ``output`` (attention itself is checked against the
loop reference in test_variants_pipeline.py); then the whole command: stages, formulas, JSON,
and the commands that refuse a gate in one line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import Tolerance, run_cli
from reference import random_fixture

from attn_cli.core.pipeline import run
from attn_cli.io.fixture import validate

F64: Tolerance = {"rtol": 1e-12, "atol": 1e-12}


def gated_fixture(seed: int = 3, **kw: Any) -> dict[str, Any]:
    """2 heads of d_v 3 (GQA over 1 kv head), causal, W_O, a gate with a bias."""
    args: dict[str, Any] = {"seq": 4, "heads": 2, "kv_heads": 1, "d_k": 3, "d_model": 5}
    args |= {"W_O": True, "b_O": True, "causal": True, "gate": "bias"} | kw
    return random_fixture(seed, **args)


def loop_gate(fx: dict[str, Any], output: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """gate[b][h][i][c] = Σ_m X[b][i][m]·W_G[m][h·d_v + c] + b_G[h·d_v + c] and gated =
    output · 1 / (1 + e^(−gate)), one number at a time; output (B?, H, T, Dv)."""
    X = np.asarray(fx["X"], float)
    X = X if X.ndim == 3 else X[None]
    out = output if output.ndim == 4 else output[None]
    W_G, b_G = fx["gate"]["W_G"], fx["gate"].get("b_G")
    B, H, T, Dv = out.shape
    gate, gated = np.zeros(out.shape), np.zeros(out.shape)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                for c in range(Dv):
                    col = h * Dv + c
                    g = math.fsum(X[b, i, m] * W_G[m][col] for m in range(X.shape[2]))
                    g += 0.0 if b_G is None else b_G[col]
                    gate[b, h, i, c] = g
                    gated[b, h, i, c] = out[b, h, i, c] / (1.0 + math.exp(-g))
    shape = output.shape
    return gate.reshape(shape), gated.reshape(shape)


def loop_projected(fx: dict[str, Any], gated: np.ndarray) -> np.ndarray:
    """projected[b][i][e] = Σ_(h, c) gated[b][h][i][c]·W_O[h·d_v + c][e] + b_O[e]."""
    g = gated if gated.ndim == 4 else gated[None]
    B, H, T, Dv = g.shape
    W_O, b_O = fx["W_O"], fx.get("b_O")
    E = len(W_O[0])
    out = np.zeros((B, T, E))
    for b in range(B):
        for i in range(T):
            for e in range(E):
                terms = [g[b, h, i, c] * W_O[h * Dv + c][e] for h in range(H) for c in range(Dv)]
                out[b, i, e] = math.fsum(terms) + (0.0 if b_O is None else b_O[e])
    return out if gated.ndim == 4 else out[0]


@pytest.mark.parametrize(
    "kw",
    [{}, {"batch": 2}, {"gate": True}, {"heads": 1, "kv_heads": 1, "W_O": False}],
    ids=["bias", "batch", "no bias", "one head, no W_O"],
)
def test_gate_and_gated_are_the_loop(kw: dict[str, Any]) -> None:
    fx = gated_fixture(**kw)
    trace = run(validate(fx, "gated.json"))
    gate, gated = loop_gate(fx, trace["output"].data)
    np.testing.assert_allclose(trace["gate"].data, gate, **F64)
    np.testing.assert_allclose(trace["gated"].data, gated, **F64)
    if "concat" in trace:
        H = trace.inputs.heads
        joined = np.concatenate([gated[..., h, :, :] for h in range(H)], axis=-1)
        np.testing.assert_allclose(trace["concat"].data, joined, **F64)
    if "projected" in trace:
        np.testing.assert_allclose(trace["projected"].data, loop_projected(fx, gated), **F64)


def test_the_gate_sits_between_output_and_concat_and_changes_nothing_before() -> None:
    fx = gated_fixture()
    plain = {k: v for k, v in fx.items() if k != "gate"}
    mine, theirs = run(validate(fx, "g.json")), run(validate(plain, "p.json"))
    names = list(mine.stages)
    assert names[names.index("output") + 1 : names.index("concat")] == ["gate", "gated"]
    for stage in theirs:
        if names.index(stage.name) <= names.index("output"):
            np.testing.assert_array_equal(mine[stage.name].data, stage.data)
    assert mine["gate"].axes == mine["gated"].axes == mine["output"].axes


def test_float32_is_the_float64_trace_to_single_precision() -> None:
    fx = gated_fixture(batch=2)
    f32 = run(validate(fx, "g.json"), dtype="float32")
    f64 = run(validate(fx, "g.json"))
    for name in ("gate", "gated", "projected"):
        assert f32[name].data.dtype == np.float32
        np.testing.assert_allclose(f32[name].data, f64[name].data, rtol=1e-5, atol=1e-5)


def write(tmp_path: Path, fx: dict[str, Any], name: str = "gated.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(fx))
    return str(path)


def test_attn_trace_shows_the_stages_with_formula_and_shape(tmp_path: Path) -> None:
    path = write(tmp_path, gated_fixture())
    result = run_cli("trace", path, "--stage", "gate", "--stage", "gated", "--format", "plain")
    assert result.exit_code == 0, result.output
    assert "gate = X·W_G + b_G   [head=2, query=4, d_v=3]" in result.stdout
    assert "gated = output ⊙ σ(gate), σ(x) = 1 / (1 + e^(−x))   [head=2, query=4, d_v=3]" in (
        result.stdout
    )
    doc = json.loads(run_cli("trace", path, "-f", "json").stdout)
    assert doc["config"]["gate"] == {"bias": True}
    stages = list(doc["stages"])
    assert stages[stages.index("output") :] == ["output", "gate", "gated", "concat", "projected"]
    assert doc["stages"]["concat"]["formula"].endswith(", each head gated")
    fx = gated_fixture()
    want = loop_gate(fx, np.array(doc["stages"]["output"]["data"]))[1]
    np.testing.assert_allclose(doc["stages"]["gated"]["data"], want, **F64)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_explanations_say_what_the_gate_does(tmp_path: Path, lang: str) -> None:
    path = write(tmp_path, gated_fixture())
    result = run_cli("trace", path, "--stage", "gated", "--explain", "--lang", lang)
    assert result.exit_code == 0, result.output
    words = {"en": ("between 0 and 1", "Qwen3-Next"), "zh": ("0 到 1 之间", "Qwen3-Next")}[lang]
    for word in words:
        assert word in result.stdout


def test_attn_examples_lists_the_bundled_example() -> None:
    result = run_cli("examples")
    assert result.exit_code == 0 and "qwen3_next_gate" in result.stdout


@pytest.mark.parametrize(
    "args",
    [("decode",), ("flash",), ("trace", "--backward"), ("trace", "--backward", "-f", "json")],
    ids=["decode", "flash", "backward", "backward json"],
)
def test_commands_that_stop_at_softmax_v_refuse_the_gate_in_one_line(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    path = write(tmp_path, gated_fixture())
    result = run_cli(args[0], path, *args[1:])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith(f"Error: {path}: gate: "), result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_the_library_refuses_the_backward_pass_too() -> None:
    from attn_cli.errors import UsageError

    with pytest.raises(UsageError, match="gate: the backward pass does not yet go through"):
        run(validate(gated_fixture(), "g.json"), backward=True)


def test_attn_new_writes_a_gate_that_traces(tmp_path: Path) -> None:
    out = tmp_path / "new.yaml"
    made = run_cli("new", str(out), "--gate", "--w-o", "--heads", "2")
    assert made.exit_code == 0, made.output
    text = out.read_text()
    assert "gate:" in text and "W_G:" in text
    traced = run_cli("trace", str(out), "-f", "json")
    assert traced.exit_code == 0, traced.output
    assert "gated" in json.loads(traced.stdout)["stages"]


def test_an_overflowing_gate_is_one_line_naming_the_stage(tmp_path: Path) -> None:
    fx = gated_fixture() | {"gate": {"W_G": [[1e308] * 6] * 5}}
    fx["X"] = [[2.0] * 5 for _ in fx["X"]]  # X·W_G = 1e309 per term: past float64
    result = run_cli("trace", write(tmp_path, fx))
    assert result.exit_code == 2, result.output
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("Error: ") and ": gate" in result.stderr, result.stderr
