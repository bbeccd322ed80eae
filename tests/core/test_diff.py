"""Differential attention (Ye et al. 2024, "Differential Transformer"), as the paper's reference
code computes it: microsoft/unilm ``Diff-Transformer/multihead_diffattn.py``,
``MultiheadDiffAttn.forward``. The formula, per query head h::

    A1 = softmax(Q1·K1ᵀ·s + mask), A2 = softmax(Q2·K2ᵀ·s + mask), s = (d_k/2)^(−1/2)
    λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init, λ_init = 0.8 − 0.6·exp(−0.3·depth)
    out = RMSNorm((A1 − λ·A2)·V) · (1 − λ_init), heads joined, W_O

Independent sources: the formula written as a loop below (and loop by loop for every stage in
tests/reference.py, run on several combinations in test_variants_pipeline.py); numbers recorded
once from a torch transcription of ``MultiheadDiffAttn.forward`` (tests/reference/torch_diff.py);
hypothesis laws (λ = 0 is ordinary attention of the first halves, normed; every row of both maps
sums to 1 and the difference's to 1 − λ; a batch is its items traced one by one). Then the
command: the example, heatmaps, explanations, refusals and hostile fixtures in one line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import FIXTURES, Tolerance, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import random_fixture

from attn_cli.core.pipeline import run
from attn_cli.io.fixture import load_fixture
from attn_cli.io.validate import validate

EXAMPLE = FIXTURES / "diff_transformer.yaml"
RECORDED = json.loads((Path(__file__).parent.parent / "reference" / "torch_diff.json").read_text())
# the reference rounds its softmax, λ and the norm's input to float32 (``.float()``); the rest
# of its module ran in float64
TORCH: Tolerance = {"rtol": 2e-6, "atol": 2e-7}
F64: Tolerance = {"rtol": 1e-10, "atol": 1e-12}
VECTORS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def trace_of(fx: dict[str, Any], **kw: Any) -> Any:
    return run(validate(fx, "d.json"), **kw)


# ---------------------------------------------------------------------------------------------
# The paper's formula as a loop


def loop_diff(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, d: dict[str, Any], causal: bool
) -> dict[str, Any]:
    """Q, K (H, T, d_k), V (H, T, d_v) of one batch item: the formula, one number at a time."""
    H, T, D = Q.shape
    half, s = D // 2, 1.0 / math.sqrt(D // 2)
    init = 0.8 - 0.6 * math.exp(-0.3 * d["depth"]) if "depth" in d else d["lambda_init"]

    def dot(a: Any, b: Any) -> float:
        return math.fsum(x * y for x, y in zip(a, b, strict=True))

    lam = (
        math.exp(dot(d["lambda_q1"], d["lambda_k1"]))
        - math.exp(dot(d["lambda_q2"], d["lambda_k2"]))
        + init
    )
    w = d.get("norm", [1.0] * V.shape[2])
    out = np.zeros(V.shape)  # (H, T, d_v)
    maps = np.zeros((2, H, T, T))
    for h in range(H):
        for i in range(T):
            for m, part in enumerate((slice(0, half), slice(half, D))):
                keys = range(i + 1) if causal else range(T)
                logits = {j: dot(Q[h, i, part], K[h, j, part]) * s for j in keys}
                top = max(logits.values())
                total = math.fsum(math.exp(x - top) for x in logits.values())
                for j, x in logits.items():
                    maps[m, h, i, j] = math.exp(x - top) / total
            row = [maps[0, h, i, j] - lam * maps[1, h, i, j] for j in range(T)]
            o = [math.fsum(row[j] * V[h, j, c] for j in range(T)) for c in range(V.shape[2])]
            r = math.sqrt(math.fsum(x * x for x in o) / len(o) + d.get("eps", 1e-5))
            out[h, i] = [o[c] / r * w[c] * (1.0 - init) for c in range(len(o))]
    return {"A1": maps[0], "A2": maps[1], "lambda": lam, "diff_scaled": out}


def test_the_example_is_the_formula_by_loop() -> None:
    raw = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    trace = run(load_fixture(EXAMPLE))
    Q, K, V = (trace[n].data for n in "QKV")
    want = loop_diff(Q, K, V, raw["diff"], causal=True)
    np.testing.assert_allclose(trace["softmax"].data, want["A1"], **F64)
    np.testing.assert_allclose(trace["softmax_2"].data, want["A2"], **F64)
    np.testing.assert_allclose(trace["lambda"].data, [want["lambda"]] * 2, **F64)
    np.testing.assert_allclose(trace["diff_scaled"].data, want["diff_scaled"], **F64)
    assert math.isclose(raw["diff"]["depth"], 2) and trace.scale == 1 / math.sqrt(2)
    assert trace.inputs.extra["diff"].lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.6))


# ---------------------------------------------------------------------------------------------
# Against the reference code (torch, recorded once)


def fixture_of(case: dict[str, Any]) -> dict[str, Any]:
    """The attn fixture of one recorded MultiheadDiffAttn: its Linear weights transposed (q_proj's
    2·heads halves of head_dim are per head [Q1 | Q2], as attn's heads*d_k columns are)."""
    spec = case["spec"]
    fx: dict[str, Any] = {
        "X": case["X"],
        "W_Q": case["W_Q"],
        "W_K": case["W_K"],
        "W_V": case["W_V"],
        "W_O": case["W_O"],
        "heads": spec["heads"],
        "diff": {**{n: case[n] for n in VECTORS}, "depth": spec["depth"], "norm": case["norm"]},
    }
    if spec["mask"] is None:
        fx["causal"] = True  # the reference's default mask: triu(-inf, 1)
    elif spec["mask"] == "padding":
        fx["lengths"] = [int(sum(row)) for row in case["keys_allowed"]]
    return fx


@pytest.mark.parametrize("name", list(RECORDED))
def test_every_stage_matches_the_reference_code(name: str) -> None:
    case = RECORDED[name]
    trace = trace_of(fixture_of(case))
    weights = np.array(case["weights"])  # (B, 2·heads, T, S): A1 and A2 of each head in turn
    np.testing.assert_allclose(trace["softmax"].data, weights[:, 0::2], **TORCH)
    np.testing.assert_allclose(trace["softmax_2"].data, weights[:, 1::2], **TORCH)
    np.testing.assert_allclose(trace["lambda"].data, case["lambda_full"], **TORCH)
    assert trace.inputs.extra["diff"].lambda_init == pytest.approx(case["lambda_init"], abs=1e-15)
    for stage in ("diff", "diff_output", "diff_norm", "diff_scaled"):
        np.testing.assert_allclose(trace[stage].data, case[stage], **TORCH, err_msg=stage)
    np.testing.assert_allclose(trace["projected"].data, case["out"], **TORCH)


def test_the_recorded_cases_are_not_trivial() -> None:
    """λ far from λ_init and from 0, masks of three kinds: a wrong λ or mask cannot pass."""
    lams = [case["lambda_full"] - case["lambda_init"] for case in RECORDED.values()]
    assert min(abs(x) for x in lams) > 0.01
    assert {case["spec"]["mask"] for case in RECORDED.values()} == {None, "zeros", "padding"}


# ---------------------------------------------------------------------------------------------
# Laws (hypothesis)

shapes = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 10_000),
        "seq": st.integers(1, 5),
        "heads": st.integers(1, 3),
        "half": st.integers(1, 3),
        "batch": st.sampled_from([None, 2]),
        "causal": st.sampled_from([None, True]),
    }
)


def _random(p: dict[str, Any], diff: Any = True) -> dict[str, Any]:
    return random_fixture(
        p["seed"],
        seq=p["seq"],
        heads=p["heads"],
        d_k=2 * p["half"],
        batch=p["batch"],
        causal=p["causal"],
        diff=diff,
        W_O=True,
    )


@settings(max_examples=25, deadline=None)
@given(shapes)
def test_lambda_zero_is_ordinary_attention_of_the_first_halves_normed(p: dict[str, Any]) -> None:
    fx = _random(p)
    zero = [0.0] * p["half"]  # exp(0) − exp(0) + 0 = 0
    fx["diff"] = {**{n: zero for n in VECTORS}, "lambda_init": 0.0}
    trace = trace_of(fx)
    np.testing.assert_allclose(trace["lambda"].data, 0.0, atol=0)
    plain_fx = {k: v for k, v in fx.items() if k != "diff"}
    plain_fx["scale"] = 1 / math.sqrt(p["half"])
    W_Q, W_K = (np.array(fx[n]).reshape(-1, p["heads"], 2, p["half"]) for n in ("W_Q", "W_K"))
    plain_fx["W_Q"] = W_Q[:, :, 0].reshape(len(W_Q), -1).tolist()  # each head's first half
    plain_fx["W_K"] = W_K[:, :, 0].reshape(len(W_K), -1).tolist()
    plain = trace_of(plain_fx)
    np.testing.assert_allclose(trace["diff"].data, plain["softmax"].data, **F64)
    out = plain["output"].data
    normed = out / np.sqrt(np.mean(out * out, axis=-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(trace["diff_scaled"].data, normed, **F64)


@settings(max_examples=25, deadline=None)
@given(shapes, st.sampled_from([True, "init"]))
def test_both_maps_are_distributions_and_the_difference_sums_to_one_minus_lambda(
    p: dict[str, Any], diff: Any
) -> None:
    trace = trace_of(_random(p, diff))
    for stage in ("softmax", "softmax_2"):
        assert np.all(trace[stage].data >= 0)
        np.testing.assert_allclose(trace[stage].data.sum(-1), 1.0, rtol=1e-12)
    rows = trace["diff"].data.sum(-1)  # (B?, H, T)
    lam = np.broadcast_to(trace["lambda"].data[:, None], rows.shape)  # every row of head h
    np.testing.assert_allclose(rows, 1.0 - lam, rtol=1e-10, atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(shapes.filter(lambda p: p["batch"] is not None))
def test_a_batch_is_its_items_traced_one_by_one(p: dict[str, Any]) -> None:
    fx = _random(p, "init")
    whole = trace_of(fx)
    for b in range(2):
        one = trace_of(fx | {"X": fx["X"][b]})
        for stage in ("softmax_2", "diff", "diff_scaled", "projected"):
            np.testing.assert_allclose(whole[stage].data[b], one[stage].data, **F64)


def test_float32_agrees_with_float64() -> None:
    inputs = load_fixture(EXAMPLE)
    f64, f32 = run(inputs), run(inputs, dtype="float32")
    for stage in ("softmax_2", "lambda", "diff", "diff_scaled", "projected"):
        assert f32[stage].data.dtype == np.float32
        np.testing.assert_allclose(f32[stage].data, f64[stage].data, rtol=1e-4, atol=1e-5)


def test_a_subset_of_stages_is_the_same_numbers() -> None:
    inputs = load_fixture(EXAMPLE)
    full = run(inputs)
    for keep in ({"projected"}, {"diff"}, {"diff_scaled", "softmax_2"}):
        part = run(inputs, keep=keep)
        assert set(part.stages) == keep
        for stage in keep:
            np.testing.assert_array_equal(part[stage].data, full[stage].data)


# ---------------------------------------------------------------------------------------------
# The command: the example, its heatmaps and explanations; what refuses it


def test_the_example_shows_both_maps_and_their_difference_as_heatmaps() -> None:
    result = run_cli("trace", "diff_transformer", "--heatmap", "--no-color", "--width", "100")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for stage in ("softmax", "softmax_2", "diff"):
        assert f"\n{stage} ─" in out, stage
    assert "diff = softmax − λ·softmax_2" in out
    assert "λ_init = 0.8 − 0.6·exp(−0.3·2) = 0.470713" in out
    assert "scale     0.707107 = 1/√(d_k/2)" in out


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_stage_is_explained(lang: str) -> None:
    result = run_cli("trace", "diff_transformer", "--explain", "--lang", lang, "--no-color")
    assert result.exit_code == 0, result.stderr
    words = {"en": "difference map", "zh": "差分图"}[lang]
    assert words in result.stdout
    for stage in ("Q_1", "scores_2", "softmax_2", "lambda", "diff_norm", "diff_scaled"):
        assert stage in result.stdout


def test_json_has_every_stage_and_the_config() -> None:
    result = run_cli("trace", "diff_transformer", "-f", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["config"]["diff"]["depth"] == 2 and doc["config"]["scale_source"] == "diff"
    names = list(doc["stages"])
    want = [
        "Q_1",
        "K_1",
        "scores",
        "softmax",
        "output",
        "scores_2",
        "softmax_2",
        "lambda",
        "diff",
        "diff_output",
        "diff_norm",
        "diff_scaled",
        "concat",
        "projected",
    ]
    assert [n for n in names if n in want] == want
    trace = run(load_fixture(EXAMPLE))  # the JSON writer streams: the same numbers
    for name in ("scores", "scores_2", "softmax_2", "diff", "lambda", "projected"):
        np.testing.assert_allclose(
            doc["stages"][name]["data"], trace[name].data, rtol=1e-6, err_msg=name
        )


@pytest.mark.parametrize(
    "args",
    [["rope", "diff_transformer"]],
    ids=["rope"],
)
def test_rope_refuses_it_in_one_line(args: list[str]) -> None:
    result = run_cli(*args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: diff_transformer.yaml: diff: "), lines
    assert result.stdout == ""


def _hostile() -> dict[str, Any]:
    return random_fixture(1, heads=2, d_k=4, causal=True, diff=True)


ERRORS: list[tuple[str, dict[str, Any], str]] = [
    ("not a mapping", {"diff": [1, 2]}, "diff: got a list, expected a mapping"),
    ("typo", {"diff": {"lambda_q": [0.0, 0.0]}}, "diff.lambda_q: unknown key (did you mean"),
    ("vector missing", {"diff": {"lambda_k1": None}}, "diff.lambda_k1: missing"),
    ("vector length", {"diff": {"lambda_q1": [0.0] * 3}}, "diff.lambda_q1: has shape [3]"),
    (
        "per-head rows",
        {"diff": {"lambda_q1": [[0.0, 0.0]] * 3}},
        "diff.lambda_q1: has shape [3, 2]",
    ),
    ("nan", {"diff": {"lambda_k2": [0.0, float("nan")]}}, "diff.lambda_k2[1]: is nan"),
    ("inf", {"diff": {"lambda_k2": [float("inf"), 0.0]}}, "diff.lambda_k2[0]: is inf"),
    (
        "both inits",
        {"diff": {"lambda_init": 0.2}},
        "diff.lambda_init: lambda_init and depth given both",
    ),
    ("no init", {"diff": {"depth": None}}, "diff.lambda_init: lambda_init and depth missing"),
    ("depth negative", {"diff": {"depth": -1}}, "diff.depth: got the number -1"),
    ("depth float", {"diff": {"depth": 1.5}}, "diff.depth: got the number 1.5"),
    (
        "norm length",
        {"diff": {"norm": [1.0]}},
        "diff.norm: has length 1, expected a vector of d_v = 4",
    ),
    ("eps", {"diff": {"eps": 0}}, "diff.eps: is 0"),
    ("odd d_k", {"W_Q": None}, "diff: given with d_k = 3"),
    ("GQA", {"kv_heads": 1}, "diff: given with kv_heads = 1 < heads = 2"),
    ("rope", {"rope": True}, "rope: given with diff, expected diff without rope"),
    ("sinks", {"sinks": [0.0, 0.0]}, "sinks: given with diff"),
    ("gate", {"gate": {"W_G": [[0.0]]}}, "gate: given with diff"),
]


@pytest.mark.parametrize(
    ("change", "message"), [(c, m) for _, c, m in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_a_hostile_diff_fixture_is_one_line(
    change: dict[str, Any], message: str, tmp_path: Path
) -> None:
    fx = _hostile()
    for key, value in change.items():
        if key == "diff":
            fx["diff"] = value if not isinstance(value, dict) else {**fx["diff"], **value}
            fx["diff"] = (
                {k: v for k, v in fx["diff"].items() if v is not None}
                if isinstance(fx["diff"], dict)
                else fx["diff"]
            )
        elif key == "W_Q":  # d_k 3: W_Q, W_K and W_V of 2 heads × 3
            fx = random_fixture(1, heads=2, d_k=3, causal=True)
            fx["diff"] = {**{n: [0.0] for n in VECTORS}, "depth": 1}
        elif key == "kv_heads":
            fx = random_fixture(1, heads=2, kv_heads=1, d_k=4, causal=True, diff=True)
        else:
            fx[key] = value
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(fx))
    result = run_cli("trace", str(tmp_path / "d.yaml"))
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), lines
    assert message in lines[0], lines[0]


def test_attn_new_writes_a_differential_fixture(tmp_path: Path) -> None:
    out = tmp_path / "n.yaml"
    result = run_cli("new", str(out), "--diff", "--causal", "--heads", "2", "--d-k", "4")
    assert result.exit_code == 0, result.stderr
    raw = yaml.safe_load(out.read_text(encoding="utf-8"))
    assert set(raw["diff"]) == {*VECTORS, "depth"} and len(raw["diff"]["lambda_q1"]) == 2
    traced = run_cli("trace", str(out), "--stage", "diff")
    assert traced.exit_code == 0, traced.stderr
    odd = run_cli("new", str(tmp_path / "o.yaml"), "--diff", "--d-k", "3")
    assert odd.exit_code == 2 and "d_k" in odd.stderr


@pytest.mark.parametrize(
    ("change", "dtype", "where"),
    [
        (
            {"lambda_q1": [100.0, 100.0], "lambda_k1": [100.0, 100.0]},
            "float64",
            "lambda[head 0]: is inf (float64 overflow)",
        ),
        ({"lambda_q1": [1e300, 1.0]}, "float32", "diff.lambda_q1[column 0]: is 1e+300 (float32"),
        ({"norm": [1e300, 1.0, 1.0, 1.0]}, "float32", "diff.norm[column 0]: is 1e+300 (float32"),
    ],
    ids=["exp overflows", "float32 vector", "float32 norm"],
)
def test_huge_numbers_are_one_line(
    change: dict[str, Any], dtype: str, where: str, tmp_path: Path
) -> None:
    raw = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    raw["diff"] |= change
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(raw))
    result = run_cli("trace", str(tmp_path / "d.yaml"), "--dtype", dtype)
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and where in lines[0], lines
