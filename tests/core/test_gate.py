"""Gated attention (Qwen3-Next, HF ``Qwen3NextAttention``): each head's output times σ(X·W_G + b_G),
per head and dimension, before the heads are joined and W_O projects them.

The independent source here is the formula as a slow loop over (batch, head, token, dimension),
from the fixture's own lists and the trace's ``output`` (attention itself is checked against the
loop reference in test_variants_pipeline.py); the backward pass through the gate against central
finite differences of the loss and the chain rule by loop; then the whole command: stages,
formulas, JSON, decoding (each step gated), and flash, which refuses a gate in one line.
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


@pytest.mark.parametrize("batch", [None, 2])
@pytest.mark.parametrize("prefill", [1, 3])
def test_decode_gates_each_step_as_the_loop_does(
    tmp_path: Path, batch: int | None, prefill: int
) -> None:
    """Each step's gate and gated against the formula by loop over the loop reference's
    output (tests/reference.py), and the self-check made on gated."""
    from reference import reference

    from attn_cli.check.runs import run_decode

    fx = gated_fixture(seed=8, seq=5, batch=batch)
    gate, gated = loop_gate(fx, reference(fx)["output"])
    gate, gated = (a if batch else a[None] for a in (gate, gated))  # (B, H, T, Dv)
    run = run_decode(write(tmp_path, fx), prefill)
    assert run.ok and run.checked == "gated"
    assert len(run.result.steps) == 5 - prefill
    for step in run.result.steps:
        t = step.index
        np.testing.assert_allclose(step.outs["gate"][:, :, 0], gate[:, :, t], **F64)
        np.testing.assert_allclose(step.outs["gated"][:, :, 0], gated[:, :, t], **F64)
    np.testing.assert_allclose(run.result.prefill_outs["gated"], gated[:, :, :prefill], **F64)


def test_decode_shows_and_dumps_the_gated_steps(tmp_path: Path) -> None:
    path = write(tmp_path, gated_fixture())
    shown = run_cli("decode", path, "--no-color", "--explain")
    assert shown.exit_code == 0, shown.stderr
    assert "gate = X·W_G + b_G: one row per head" in shown.stdout
    assert shown.stdout.count("self-check: max |gated − the full attention's row") == 3
    assert "squeezed dimension by dimension" in shown.stdout
    out = tmp_path / "d.json"
    dumped = run_cli("decode", path, "-f", "json", "-o", str(out))
    assert dumped.exit_code == 0, dumped.stderr
    step = json.loads(out.read_text("utf-8"))["steps"][0]
    assert list(step["stages"])[-3:] == ["output", "gate", "gated"]


@pytest.mark.parametrize("args", [("flash",)], ids=["flash"])
def test_commands_that_stop_at_softmax_v_refuse_the_gate_in_one_line(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    path = write(tmp_path, gated_fixture())
    result = run_cli(args[0], path, *args[1:])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith(f"Error: {path}: gate: "), result.stderr
    assert len(result.stderr.splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# The backward pass through the gate, against central finite differences of the loss


def loss(fx: dict[str, Any], grad: np.ndarray) -> float:
    """L = Σ grad ∘ projected, the forward pass run by attn (float64)."""
    return float((run(validate(fx, "fd.json"))["projected"].data * grad).sum())


def finite_difference(fx: dict[str, Any], grad: np.ndarray, key: str, sub: str | None) -> Any:
    """dL/d(every number of fx[key] (or fx[key][sub])), by central differences of step 1e-6."""
    base = np.array(fx[key] if sub is None else fx[key][sub], dtype=float)
    out = np.zeros_like(base)
    for i in np.ndindex(*base.shape):
        values = []
        for step in (1e-6, -1e-6):
            moved = base.copy()
            moved[i] += step
            changed = {**fx[key], sub: moved.tolist()} if sub is not None else moved.tolist()
            values.append(loss({**fx, key: changed}, grad))
        out[i] = (values[0] - values[1]) / 2e-6
    return out


@pytest.mark.parametrize(
    "kw", [{}, {"batch": 2, "heads": 1, "kv_heads": 1}], ids=["GQA, bias", "batch, one head"]
)
def test_the_gradients_through_the_gate_are_finite_differences(kw: dict[str, Any]) -> None:
    fx = gated_fixture(seq=3, d_model=3, d_k=2, **kw)
    grad = np.random.default_rng(5).standard_normal(run(validate(fx, "g.json"))["projected"].shape)
    trace = run(validate(fx | {"grad": grad.tolist()}, "g.json"), backward=True)
    for stage, key, sub in (
        ("d_W_G", "gate", "W_G"),
        ("d_b_G", "gate", "b_G"),
        ("d_X", "X", None),
        ("d_W_Q", "W_Q", None),
        ("d_W_V", "W_V", None),
        ("d_W_O", "W_O", None),
    ):
        want = finite_difference(fx, grad, key, sub)
        np.testing.assert_allclose(trace[stage].data, want, rtol=1e-6, atol=1e-7, err_msg=stage)


def test_d_gated_d_gate_and_d_output_are_the_chain_rule_by_loop() -> None:
    fx = gated_fixture()
    trace = run(validate(fx, "g.json"), backward=True)  # L = Σ projected
    W_O, (H, T, Dv) = np.array(fx["W_O"]), trace["output"].shape
    gate, out = trace["gate"].data, trace["output"].data
    for h in range(H):
        for i in range(T):
            for c in range(Dv):
                d_gated = math.fsum(W_O[h * Dv + c])  # d projected / d concat = the row sum
                s = 1.0 / (1.0 + math.exp(-gate[h, i, c]))
                for name, want in (
                    ("d_gated", d_gated),
                    ("d_output", d_gated * s),
                    ("d_gate", d_gated * out[h, i, c] * s * (1 - s)),
                ):
                    assert math.isclose(
                        trace[name].data[h, i, c], want, rel_tol=1e-12, abs_tol=1e-14
                    ), (name, h, i, c)
    assert trace.loss == "L = Σ projected"
    assert trace["d_X"].formula.endswith(" + d_gate·W_Gᵀ")
    assert trace["d_output"].formula == "d_output = d_gated ⊙ σ(gate)"


def test_without_w_o_the_loss_is_taken_over_gated() -> None:
    fx = gated_fixture(W_O=False, b_O=False)
    trace = run(validate(fx, "g.json"), backward=True)
    assert trace.loss == "L = Σ gated" and trace["d_gated"].formula == "d_gated = 1, L = Σ gated"
    np.testing.assert_array_equal(trace["d_gated"].data, np.ones(trace["gated"].shape))
    s = 1.0 / (1.0 + np.exp(-trace["gate"].data))
    np.testing.assert_allclose(trace["d_output"].data, s, **F64)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_attn_trace_backward_shows_and_explains_the_gate_gradients(
    tmp_path: Path, lang: str
) -> None:
    path = write(tmp_path, gated_fixture())
    result = run_cli(
        "trace",
        path,
        "--backward",
        "--explain",
        "--lang",
        lang,
        *(a for s in ("d_gated", "d_gate", "d_W_G", "d_b_G") for a in ("--stage", s)),
    )
    assert result.exit_code == 0, result.output
    assert "No explanation is registered" not in result.stdout
    assert "没有登记说明" not in result.stdout
    for formula in ("d_gate = d_gated ⊙ output ⊙ σ(gate) ⊙ (1 − σ(gate))", "d_W_G = Xᵀ·d_gate"):
        assert formula in result.stdout
    doc = json.loads(run_cli("trace", path, "--backward", "-f", "json").stdout)
    names = list(doc["stages"])
    assert names[names.index("d_concat") + 1 : names.index("d_output")] == [
        "d_gated",
        "d_gate",
        "d_W_G",
        "d_b_G",
    ]


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


def test_attn_check_grades_the_gate_gradients_of_a_dump(tmp_path: Path) -> None:
    made = run_cli(
        "trace", "qwen3_next_gate", "--backward", "-f", "npz", "-o", str(tmp_path / "right.npz")
    )
    assert made.exit_code == 0, made.output
    with np.load(tmp_path / "right.npz") as z:
        stages = {k: z[k] for k in z.files}
    assert {"d_gated", "d_gate", "d_W_G"} <= set(stages)
    same = run_cli("check", "qwen3_next_gate", "--against", str(tmp_path / "right.npz"))
    assert same.exit_code == 0, same.output
    np.savez(tmp_path / "off.npz", **{**stages, "d_W_G": stages["d_W_G"] * 1.01})
    off = run_cli("check", "qwen3_next_gate", "--against", str(tmp_path / "off.npz"), "-f", "json")
    assert off.exit_code == 1, off.output
    assert json.loads(off.stdout)["fixtures"][0]["first_difference"] == "d_W_G"
