"""The backward pass of differential attention: both softmax maps, the difference with λ, λ's
re-parameterisation down to λ_q1 … λ_k2, the per-head RMSNorm (its weight) and the (1 − λ_init)
scale, into Q, K, V (each half of Q and K from its own map), X and the weights. Against
torch.autograd through the paper's reference code in float64 (tests/reference/
torch_diff_backward.json, rtol 1e-10), and against central finite differences of L computed by
attn's forward."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import FIXTURES, Tolerance, run_cli

from attn_cli.core.pipeline import run
from attn_cli.errors import UsageError
from attn_cli.io.fixture import load_fixture
from attn_cli.io.validate import validate

DOC = json.loads(
    (Path(__file__).parent.parent / "reference" / "torch_diff_backward.json").read_text()
)
CASES = DOC["cases"]
TIGHT: Tolerance = {"rtol": 1e-10, "atol": 1e-12}
VECTORS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def fixture_of(case: dict[str, Any]) -> dict[str, Any]:
    fx: dict[str, Any] = {n: np.array(case[n]) for n in ("X", "W_Q", "W_K", "W_V", "W_O")}
    if fx["X"].shape[0] == 1:  # one batch item: a fixture without the batch axis
        fx["X"] = fx["X"][0]
    fx |= {
        "heads": case["heads"],
        "causal": True,
        "diff": {**{n: case[n] for n in VECTORS}, "depth": case["depth"], "norm": case["norm"]},
    }
    if case["grad"] is not None:
        fx["grad"] = np.array(case["grad"])
    return fx


def torch_gradients(case: dict[str, Any]) -> dict[str, Any]:
    """torch's gradients named and laid out as attn's stages, with the batch axis."""
    g = {k: np.array(v) for k, v in case["d_stage"].items()}
    H = case["heads"]

    def heads(flat: Any) -> Any:  # (b, T, H*d) -> (b, H, T, d)
        return flat.reshape(*flat.shape[:2], H, -1).transpose(0, 2, 1, 3)

    w = {k: np.array(v) for k, v in case["d_W"].items()}
    return {
        "d_Q": heads(g["Q"]),
        "d_K": heads(g["K"]),
        "d_V": heads(g["V"]),
        "d_softmax": g["maps"][:, 0::2],
        "d_softmax_2": g["maps"][:, 1::2],
        "d_diff": g["diff"],
        "d_diff_output": g["diff_output"],
        "d_diff_norm": g["diff_norm"],
        "d_diff_scaled": g["diff_scaled"],
        "d_X": np.array(case["d_X"]),
        "d_W_Q": w["q_proj.weight"],
        "d_W_K": w["k_proj.weight"],
        "d_W_V": w["v_proj.weight"],
        "d_W_O": w["out_proj.weight"],
        "d_norm": w["subln.weight"],
        **{f"d_{n}": w[n] for n in VECTORS},
    }


BATCHED = {
    "d_Q",
    "d_K",
    "d_V",
    "d_softmax",
    "d_softmax_2",
    "d_diff",
    "d_diff_output",
    "d_diff_norm",
    "d_diff_scaled",
    "d_X",
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_gradient_is_what_torch_autograd_gives(name: str) -> None:
    case = CASES[name]
    trace = run(validate(fixture_of(case), "torch_diff_backward.json"), backward=True)
    batch = np.array(case["X"]).shape[0] > 1
    projected = np.array(case["projected"])
    np.testing.assert_allclose(
        trace["projected"].data, projected if batch else projected[0], **TIGHT
    )
    for stage, want in torch_gradients(case).items():
        if stage in BATCHED and not batch:
            want = want[0]
        np.testing.assert_allclose(trace[stage].data, want, err_msg=stage, **TIGHT)
    # λ is one number shared by the heads in the reference: its gradient is every head's sum
    d_lambda = np.array(case["d_stage"]["lambda"])
    assert trace["d_lambda"].data.sum() == pytest.approx(float(d_lambda), rel=1e-10)


def test_the_torch_cases_are_the_example_and_a_batch_with_a_gradient() -> None:
    fx = load_fixture(FIXTURES / "diff_transformer.yaml")
    example = CASES["example"]
    assert fx.X is not None and fx.W_Q is not None
    np.testing.assert_array_equal(np.array(example["X"]), fx.X)  # both (1, T, d_model)
    np.testing.assert_array_equal(np.array(example["W_Q"]), fx.W_Q)
    assert example["grad"] is None and CASES["3 heads, batch 2"]["grad"] is not None


# ---------------------------------------------------------------------------------------------
# Central finite differences of L = Σ grad ∘ projected, one number of an input at a time


def loss(fx: dict[str, Any]) -> float:
    trace = run(validate(fx, "d.json"))
    return float(np.sum(np.asarray(fx["grad"]) * trace["projected"].data))


def numeric(fx: dict[str, Any], where: tuple[str, ...], index: tuple[int, ...]) -> float:
    h = 1e-6

    def at(delta: float) -> float:
        changed = json.loads(json.dumps(fx, default=lambda a: np.asarray(a).tolist()))
        target = changed
        for key in where[:-1]:
            target = target[key]
        arr = np.array(target[where[-1]], dtype=float)
        arr[index] += delta
        target[where[-1]] = arr.tolist()
        return loss(changed)

    return (at(h) - at(-h)) / (2 * h)


def random_fixture(seed: int, per_head: bool, mask: str) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    H, T, C, D = 2, 4, 6, 4
    lam_shape = (H, D // 2) if per_head else (D // 2,)
    fx: dict[str, Any] = {
        "X": rng.standard_normal((T, C)).tolist(),
        **{w: (rng.standard_normal((C, H * D)) * 0.6).tolist() for w in ("W_Q", "W_K", "W_V")},
        "W_O": rng.standard_normal((H * D, 3)).tolist(),
        "heads": H,
        "diff": {
            **{n: (rng.standard_normal(lam_shape) * 0.5).tolist() for n in VECTORS},
            "lambda_init": 0.35,
            "norm": rng.uniform(0.5, 1.5, D).tolist(),
        },
        "grad": rng.standard_normal((T, 3)).tolist(),
    }
    if mask == "causal":
        fx["causal"] = True
    elif mask == "window":
        fx |= {"causal": True, "window": 2}
    return fx


@pytest.mark.parametrize(
    ("per_head", "mask"), [(False, "causal"), (True, "none"), (False, "window")]
)
def test_every_input_gradient_matches_finite_differences(per_head: bool, mask: str) -> None:
    fx = random_fixture(3, per_head, mask)
    trace = run(validate(fx, "d.json"), backward=True)
    rng = np.random.default_rng(1)
    wheres = [
        ("X",),
        ("W_Q",),
        ("W_K",),
        ("W_V",),
        ("W_O",),
        *(("diff", n) for n in (*VECTORS, "norm")),
    ]
    for where in wheres:
        shape = np.shape(fx[where[0]] if len(where) == 1 else fx["diff"][where[1]])
        name = "d_norm" if where[-1] == "norm" else f"d_{where[-1]}"
        for _ in range(3):
            index = tuple(int(rng.integers(n)) for n in shape)
            want = numeric(fx, where, index)
            assert trace[name].data[index] == pytest.approx(want, rel=1e-6, abs=1e-8), (
                where,
                index,
            )


def test_a_softcap_on_the_second_map_is_refused_in_one_line() -> None:
    fx = random_fixture(3, False, "causal") | {"softcap": 2.0}
    with pytest.raises(UsageError, match="diff: the backward pass does not yet run"):
        run(validate(fx, "d.json"), backward=True)


# ---------------------------------------------------------------------------------------------
# The command line


def test_trace_backward_of_the_example_shows_lambda_and_both_maps() -> None:
    result = run_cli(
        "trace",
        "diff_transformer",
        "--backward",
        "-s",
        "d_lambda_q1",
        "-s",
        "d_V",
        "-s",
        "d_scores_2",
    )
    assert result.exit_code == 0, result.stderr
    assert "d_λ_q1 = d_λ·exp(λ_q1·λ_k1)·λ_k1" in result.stdout
    assert "d_V = softmaxᵀ·d_output − λ·softmax_2ᵀ·d_diff_output" in result.stdout


def test_the_differential_gradients_are_explained_in_chinese() -> None:
    stages = ("d_lambda", "d_lambda_k2", "d_softmax_2", "d_diff_norm", "d_norm", "d_Q_1")
    args = [a for s in stages for a in ("-s", s)]
    result = run_cli("trace", "diff_transformer", "--backward", "--explain", "--lang", "zh", *args)
    assert result.exit_code == 0, result.stderr
    for text in ("λ 是所有头", "第二张图", "（1 − λ_init）"):
        assert text in result.stdout, text
