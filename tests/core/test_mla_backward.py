"""The backward pass and FlashAttention of multi-head latent attention: every gradient from
projected back through the softmax, the concatenated [q_nope | q_rope_rot]·[K_nope | k_rope_rot]
with DeepSeek's scale, the decoupled RoPE key every head shares, the latent c_KV and its norm,
W_UK and W_UV, the query path (q LoRA or W_Q) to X and every weight. Against torch.autograd
through transformers' own DeepseekV3Attention (tests/reference/torch_mla_backward.json, float64,
rtol 1e-10), and against central finite differences of L computed by attn's forward.
FlashAttention's tiles against the loop reference of tests/reference.py for any tile sizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import FIXTURES, Tolerance, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import mla_from_torch, random_mla_fixture, reference

from attn_cli.check.runs import check_flash
from attn_cli.core.pipeline import run
from attn_cli.io.fixture import load_fixture
from attn_cli.io.validate import validate

DOC = json.loads(
    (Path(__file__).parent.parent / "reference" / "torch_mla_backward.json").read_text()
)
CASES = DOC["cases"]
TIGHT: Tolerance = {"rtol": 1e-10, "atol": 1e-12}


def fixture_of(case: dict[str, Any]) -> dict[str, Any]:
    spec, w = case["spec"], {k: np.array(v) for k, v in case["weights"].items()}
    mla, W_O = mla_from_torch(w, spec["heads"], spec["rank"], spec["d_nope"], spec["d_v"])
    fx = {
        "X": np.array(case["X"]),
        "heads": spec["heads"],
        "causal": True,
        "mla": mla | {"base": 10000.0, "eps": 1e-6},
        "W_O": W_O,
    }
    if case["grad"] is not None:
        fx["grad"] = np.array(case["grad"])
    return fx


def heads_of(flat: Any, heads: int) -> Any:
    """(T, H*d) -> (H, T, d), as attn lays a head's stage out."""
    a = np.asarray(flat)
    return a.reshape(a.shape[0], heads, -1).transpose(1, 0, 2)


def torch_stages(case: dict[str, Any]) -> dict[str, Any]:
    """The torch gradients, named and laid out as attn's gradient stages."""
    spec, g = case["spec"], {k: np.array(v) for k, v in case["stage_grads"].items()}
    H, r, nope = spec["heads"], spec["rank"], spec["d_nope"]
    q = heads_of(g["q"], H)  # (H, T, d_nope + d_rope)
    kv_b = g["kv_b"][0].reshape(-1, H, nope + spec["d_v"]).transpose(1, 0, 2)  # (H, S, ·)
    out = {
        "d_concat": g["concat"],
        "d_softmax": g["softmax"],
        "d_Q": g["Q"],
        "d_K": g["K"],
        "d_V": g["V"],
        "d_q_nope": q[..., :nope],
        "d_q_rope": q[..., nope:],
        "d_c_KV": g["c_KV|k_rope"][:, :r],
        "d_k_rope": g["c_KV|k_rope"][:, r:],
        "d_c_KV_norm": g["c_KV_norm"],
        "d_K_nope": kv_b[..., :nope],
        "d_X": case["d_X"],
    }
    if "c_Q" in g:
        out |= {"d_c_Q": g["c_Q"], "d_c_Q_norm": g["c_Q_norm"]}
    weights = {k: np.array(v) for k, v in case["param_grads"].items()}
    mla, out["d_W_O"] = mla_from_torch(weights, H, r, nope, spec["d_v"])
    out |= {"d_" + k: v for k, v in mla.items()}
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_every_gradient_is_what_torch_autograd_gives(name: str) -> None:
    case = CASES[name]
    trace = run(validate(fixture_of(case), "torch_mla_backward.json"), backward=True)
    assert trace.scale == pytest.approx(case["scaling"], rel=1e-14)
    np.testing.assert_allclose(trace["projected"].data, case["forward"]["projected"], **TIGHT)
    want = torch_stages(case)
    assert len(want) >= 16
    for stage, expected in want.items():
        np.testing.assert_allclose(trace[stage].data, expected, err_msg=stage, **TIGHT)


def test_the_torch_cases_are_the_bundled_example_and_the_query_without_lora() -> None:
    example = CASES["example"]
    fx = load_fixture(FIXTURES / "deepseek_mla.yaml")
    assert fx.X is not None
    np.testing.assert_array_equal(np.array(example["X"]), fx.X[0])
    mine = fixture_of(example)["mla"]
    for name in ("W_DQ", "q_norm", "W_UQ", "W_DKV", "kv_norm", "W_UK", "W_UV", "W_KR"):
        np.testing.assert_array_equal(mine[name], getattr(fx.extra["mla"], name), err_msg=name)
    assert example["grad"] is None and "q_a_proj.weight" in example["weights"]
    assert "q_proj.weight" in CASES["no q LoRA"]["weights"]
    assert DOC["generator"].endswith("transformers 5.24.0")


# ---------------------------------------------------------------------------------------------
# Central finite differences of L = Σ grad ∘ projected, attn's forward perturbed one number


def loss(fx: dict[str, Any]) -> float:
    trace = run(validate(fx, "m.json"))
    return float(np.sum(np.asarray(fx["grad"]) * trace["projected"].data))


def numeric(fx: dict[str, Any], where: tuple[str, ...], index: tuple[int, ...]) -> float:
    """∂L/∂(one number of the input ``where``), by a central difference."""
    h = 1e-6

    def at(delta: float) -> float:
        changed = json.loads(json.dumps(fx))  # a deep copy of lists and numbers
        target = changed
        for key in where[:-1]:
            target = target[key]
        arr = np.array(target[where[-1]], dtype=float)
        arr[index] += delta
        target[where[-1]] = arr.tolist()
        return loss(changed)

    return (at(h) - at(-h)) / (2 * h)


@pytest.mark.parametrize(
    ("q_rank", "batch"), [(3, None), (None, None), (3, 2)], ids=["q LoRA", "W_Q", "batch of 2"]
)
def test_every_input_gradient_matches_finite_differences(
    q_rank: int | None, batch: int | None
) -> None:
    fx = random_mla_fixture(
        11, q_rank=q_rank, heads=2, seq=4, d_rope=4, W_O=True, mscale=1.3, batch=batch
    )
    lead = (batch,) if batch else ()
    fx["grad"] = np.random.default_rng(5).standard_normal((*lead, 4, 3)).tolist()
    trace = run(validate(fx, "m.json"), backward=True)
    names = ["W_DKV", "kv_norm", "W_UK", "W_UV", "W_KR"]
    names += ["W_DQ", "q_norm", "W_UQ"] if q_rank else ["W_Q"]
    rng = np.random.default_rng(0)
    checked = 0
    for where in [("X",), ("W_O",), *(("mla", n) for n in names)]:
        shape = np.shape(fx[where[0]] if len(where) == 1 else fx["mla"][where[1]])
        grad = trace[f"d_{where[-1]}"].data
        for _ in range(3):
            index = tuple(int(rng.integers(n)) for n in shape)
            assert grad[index] == pytest.approx(numeric(fx, where, index), rel=1e-6, abs=1e-7), (
                where,
                index,
            )
            checked += 1
    assert checked == 3 * (len(names) + 2)


def test_a_gate_after_the_latent_adds_its_path_into_d_X() -> None:
    fx = random_mla_fixture(4, heads=2, seq=3, W_O=True)
    fx["gate"] = {"W_G": np.random.default_rng(2).standard_normal((4, 4)).tolist()}
    fx["grad"] = np.random.default_rng(3).standard_normal((3, 3)).tolist()
    trace = run(validate(fx, "m.json"), backward=True)
    for index in [(0, 1), (2, 3)]:
        assert trace["d_X"].data[index] == pytest.approx(numeric(fx, ("X",), index), rel=1e-6)
    assert trace["d_W_G"].data[1, 2] == pytest.approx(
        numeric(fx, ("gate", "W_G"), (1, 2)), rel=1e-6
    )


# ---------------------------------------------------------------------------------------------
# The command line


def test_trace_backward_of_the_example_shows_the_latent_gradients() -> None:
    result = run_cli("trace", "deepseek_mla", "--backward", "-s", "d_X", "-s", "d_k_rope_rot")
    assert result.exit_code == 0, result.stderr
    assert "d_X = d_c_Q·W_DQᵀ + d_c_KV·W_DKVᵀ + d_k_rope·W_KRᵀ" in result.stdout
    assert "d_k_rope_rot = Σ_h d_K[h][:, d_nope:] (one key for all heads)" in result.stdout


def test_the_latent_gradients_are_explained_in_chinese() -> None:
    stages = ("d_c_KV_norm", "d_k_rope_rot", "d_q_rope", "d_W_UK", "d_kv_norm")
    args = [a for s in stages for a in ("-s", s)]
    result = run_cli("trace", "deepseek_mla", "--backward", "--explain", "--lang", "zh", *args)
    assert result.exit_code == 0, result.stderr
    for text in (
        "潜向量产生了每个头的 K_nope 和 V",
        "所有头 d_K 后 d_rope 列之和",
        "转回去",
        "（所有头共用一个键）",
        "（各头并排）",
    ):
        assert text in result.stdout, text


def test_backward_json_has_every_latent_gradient(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    result = run_cli("trace", "deepseek_mla", "--backward", "-f", "json", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    stages = json.loads(out.read_text())["stages"]
    for name in ("d_q_nope", "d_c_Q", "d_W_DQ", "d_c_KV", "d_kv_norm", "d_W_KR", "d_X"):
        assert name in stages, name
    assert "d_W_K" not in stages and "d_W_Q" not in stages


# ---------------------------------------------------------------------------------------------
# FlashAttention over the naive form's concatenated Q = [q_nope | q_rope_rot] and K = [K_nope |
# k_rope_rot], as prefill and training kernels run MLA (d_qk = d_nope + d_rope, d_v apart)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    heads=st.integers(1, 3),
    seq=st.integers(1, 7),
    q_rank=st.sampled_from([None, 3]),
    causal=st.booleans(),
    batch=st.sampled_from([None, 2]),
    bq=st.integers(1, 8),
    bk=st.integers(1, 8),
)
def test_flash_equals_the_loop_reference_for_any_tiles(
    seed: int,
    heads: int,
    seq: int,
    q_rank: int | None,
    causal: bool,
    batch: int | None,
    bq: int,
    bk: int,
) -> None:
    fx = random_mla_fixture(
        seed, heads=heads, seq=seq, q_rank=q_rank, causal=causal, batch=batch, d_rope=4, mscale=1.2
    )
    want = reference(fx, lse=True)  # the loop reference: output (B?, H, T, Dv), lse (B?, H, T)
    flash = check_flash(run(validate(fx, "m.json")), bq, bk, False, 0)
    got_o, got_L = (flash.output, flash.lse) if batch else (flash.output[0], flash.lse[0])
    np.testing.assert_allclose(got_o, want["output"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_L, want["lse"], rtol=1e-10, atol=1e-12)
    assert all(c.ok for c in flash.checks)


def test_flash_of_the_example_checks_itself_against_the_trace(tmp_path: Path) -> None:
    out = tmp_path / "f.json"
    result = run_cli(
        "flash", "deepseek_mla", "--block-q", "2", "--block-k", "3", "-f", "json", "-o", str(out)
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(out.read_text())
    assert [c["name"] for c in doc["checks"]] == ["output", "lse", "softmax"]
    assert all(c["ok"] for c in doc["checks"])
    trace = run(load_fixture(FIXTURES / "deepseek_mla.yaml"))
    np.testing.assert_allclose(
        doc["stages"]["output"]["data"], trace["output"].data, rtol=1e-12, atol=1e-14
    )
    assert doc["tiles_total"] == 2 * 3 * 2  # heads × query blocks × key blocks


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000), n=st.integers(1, 6), half=st.integers(1, 4), pairs=st.booleans()
)
def test_the_rope_backward_is_the_forwards_transpose_in_either_layout(
    seed: int, n: int, half: int, pairs: bool
) -> None:
    """⟨RoPE(x), y⟩ = ⟨x, RoPE⁻¹(y)⟩: the backward is the rotation's transpose, in V3's split
    layout and in V2's pairs kept in place (the split output interleaved back, written here)."""
    from attn_cli.core.plugins.mla import rope_interleaved, rope_interleaved_backward

    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((2, n, 2 * half))
    pos = np.arange(n) * 3
    out = rope_interleaved(x, pos, 10000.0)  # [first numbers | second numbers]
    if pairs:
        out = np.stack([out[:, :half], out[:, half:]], axis=-1).reshape(out.shape)
    back = rope_interleaved_backward(y, pos, 10000.0, None, "pairs" if pairs else "split")
    assert float(np.sum(out * y)) == pytest.approx(float(np.sum(x * back)), rel=1e-12, abs=1e-12)


def test_the_pairs_layout_backward_matches_finite_differences() -> None:
    """DeepSeek V2's RoPE layout (mla.rope_layout pairs): the rope gradient turned back in it."""
    fx = random_mla_fixture(12, q_rank=None, heads=2, seq=3, d_rope=4, W_O=True)
    fx["mla"] = {**fx["mla"], "rope_layout": "pairs"}
    fx["grad"] = np.random.default_rng(6).standard_normal((3, 3)).tolist()
    trace = run(validate(fx, "m.json"), backward=True)
    for where, index in ((("X",), (1, 2)), (("mla", "W_KR"), (3, 1)), (("mla", "W_Q"), (0, 5))):
        grad = trace[f"d_{where[-1]}"].data[index]
        assert grad == pytest.approx(numeric(fx, where, index), rel=1e-6, abs=1e-8), where
