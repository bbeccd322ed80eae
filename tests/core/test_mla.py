"""Multi-head latent attention (DeepSeek V2/V3): the naive form against a loop reference written
from transformers 5.24's ``DeepseekV3Attention.forward`` (tests/reference.py), the absorbed form
equal to it (checked by attn on every run, and here over random shapes), DeepSeek's scale, the
refusals of decode, flash and the backward pass, and hostile fixtures as one-line errors."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import FIXTURES, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import random_mla_fixture, reference

from attn_cli.core.pipeline import run
from attn_cli.errors import ComputeError
from attn_cli.io.fixture import load_fixture
from attn_cli.io.validate import validate

EXAMPLE = FIXTURES / "deepseek_mla.yaml"


def trace_of(fx: dict[str, Any], **kw: Any) -> Any:
    return run(validate(fx, "m.json"), **kw)


# ---------------------------------------------------------------------------------------------
# The naive form against the loop reference; the absorbed form equal to it


@pytest.mark.parametrize("q_rank", [3, None], ids=["q LoRA", "W_Q"])
@pytest.mark.parametrize("batch", [None, 2])
def test_every_stage_matches_the_loop_reference(q_rank: int | None, batch: int | None) -> None:
    fx = random_mla_fixture(7, q_rank=q_rank, batch=batch, heads=3, seq=4, d_rope=4, W_O=True)
    expected = reference(fx)
    trace = trace_of(fx)
    assert list(trace.stages) == list(expected)
    for name, want in expected.items():
        np.testing.assert_allclose(trace[name].data, want, err_msg=name, rtol=1e-10, atol=1e-12)


def test_the_example_shows_both_forms_equal() -> None:
    trace = run(load_fixture(EXAMPLE))
    for absorbed, naive in (("scores_absorbed", "scores"), ("output_absorbed", "output")):
        np.testing.assert_allclose(trace[absorbed].data, trace[naive].data, rtol=1e-10, atol=1e-12)
    # what the cache holds per token: the latent and k_rope, not heads·(d_k + d_v)
    assert trace["c_KV"].shape[-1] + trace["k_rope_rot"].shape[-1] == 4 + 2
    assert trace["K"].shape[0] * (trace["K"].shape[-1] + trace["V"].shape[-1]) == 2 * (6 + 3)


@settings(max_examples=60, deadline=None)
@given(
    heads=st.integers(1, 3),
    seq=st.integers(1, 4),
    d_model=st.integers(1, 5),
    q_rank=st.one_of(st.none(), st.integers(1, 4)),
    rank=st.integers(1, 5),
    d_nope=st.integers(1, 3),
    d_rope=st.sampled_from([2, 4]),
    d_v=st.integers(1, 3),
    batch=st.sampled_from([None, 2]),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
    mscale=st.sampled_from([None, 0.7, 1.4]),
)
def test_naive_equals_absorbed_over_random_shapes(**kw: Any) -> None:
    fx = random_mla_fixture(kw.pop("seed"), **kw)
    trace = trace_of(fx)  # attn's own check would raise if they disagreed
    for absorbed, naive in (("scores_absorbed", "scores"), ("output_absorbed", "output")):
        np.testing.assert_allclose(trace[absorbed].data, trace[naive].data, rtol=1e-9, atol=1e-9)
    # and by the formula, with no stage of attn's: softmax·(c·W_UV) == (softmax·c)·W_UV
    c = np.array(trace["c_KV_norm"].data)
    W_UV = np.array(fx["mla"]["W_UV"]).reshape(kw["rank"], kw["heads"], kw["d_v"])
    values = np.einsum("...sr,rhv->...hsv", c, W_UV)  # (b?, H, S, Dv)
    np.testing.assert_allclose(trace["V"].data, values, rtol=1e-9, atol=1e-9)


def test_a_broken_absorbed_form_is_caught_on_every_run_that_shows_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """attn's own check: the absorbed scores without their RoPE part do not pass, whenever a
    stage of the absorbed form is shown; a run that shows none (--stage output) computes none,
    at the naive form's cost."""
    import attn_cli.core.plugins.mla as mla

    real = mla.absorbed

    def without_rope(value: Any, heads: int, arrays: Any, scale: float, cast: Any) -> Any:
        made = real(value, heads, arrays, scale, cast)
        made["scores_absorbed"] = made["q_absorbed"] @ arrays["c_KV_norm"][:, None].swapaxes(-1, -2)
        return made

    monkeypatch.setattr(mla, "absorbed", without_rope)
    with pytest.raises(ComputeError, match="scores_absorbed: differs from scores by"):
        run(load_fixture(EXAMPLE), keep={"softmax", "output_absorbed"})
    alone = run(load_fixture(EXAMPLE), keep={"output"})
    assert list(alone.stages) == ["output"]
    assert run_cli("trace", "deepseek_mla", "--stage", "output").exit_code == 0
    result = run_cli("trace", "deepseek_mla")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: deepseek_mla.yaml: scores_absorbed:")
    assert "two forms disagree" in lines[0]


# ---------------------------------------------------------------------------------------------
# DeepSeek's scale and RoPE


def test_scale_is_mscale_squared_over_the_whole_head() -> None:
    fx = random_mla_fixture(3, d_nope=3, d_rope=2, mscale=1.25)
    trace = trace_of(fx)
    assert trace.scale == pytest.approx(1.25**2 / math.sqrt(3 + 2), rel=1e-15)
    assert trace.scale_source == "mla"
    assert trace_of(fx | {"scale": 0.5}).scale == 0.5  # the fixture's scale wins


def test_rope_by_hand_at_position_one() -> None:
    """One pair at position 1, θ = 1: [x0 cos 1 − x1 sin 1, x1 cos 1 + x0 sin 1]."""
    fx = random_mla_fixture(5, seq=2, heads=1, d_rope=2)
    trace = trace_of(fx)
    x0, x1 = trace["k_rope"].data[1]
    want = [x0 * math.cos(1) - x1 * math.sin(1), x1 * math.cos(1) + x0 * math.sin(1)]
    np.testing.assert_allclose(trace["k_rope_rot"].data[1], want, rtol=1e-14)
    np.testing.assert_allclose(trace["k_rope_rot"].data[0], trace["k_rope"].data[0])  # angle 0


def test_the_example_is_written_by_its_script_and_explained() -> None:
    raw = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    assert raw["mla"]["W_DQ"] and raw["heads"] == 2
    for lang in ("en", "zh"):
        result = run_cli("trace", "deepseek_mla", "--explain", "--lang", lang, "--no-color")
        assert result.exit_code == 0, result.stderr
        assert "scores_absorbed" in result.stdout


@pytest.mark.parametrize(
    "mscales", [(1.0, 1.0), (0.9, 0.6), (None, None)], ids=["DeepSeek V3's", "both", "neither"]
)
def test_yarn_on_the_rope_dims_is_transformers_formula(mscales: tuple[Any, Any]) -> None:
    """mla.scaling: yarn's frequencies over d_rope (hf_yarn: _compute_yarn_parameters as a
    loop), cos and sin times its attention factor (DeepSeek's ratio of two mscales), the pairs
    laid out as apply_rotary_pos_emb_interleave returns them; at positions past the original."""
    from test_rope_view import hf_yarn

    mscale, all_dim = mscales
    yarn = {
        "type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 3,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    }
    yarn |= {k: v for k, v in (("mscale", mscale), ("mscale_all_dim", all_dim)) if v is not None}
    fx = random_mla_fixture(5, heads=2, seq=6, d_rope=4, mscale=1.7)
    fx["mla"]["scaling"] = yarn
    trace = trace_of(fx)

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = (
        get_mscale(8.0, mscale) / get_mscale(8.0, all_dim)
        if mscale and all_dim
        else get_mscale(8.0)
    )
    inv = hf_yarn(4, 10000.0, yarn)
    for name, raw in (("q_rope_rot", trace["q_rope"].data), ("k_rope_rot", trace["k_rope"].data)):
        got = trace[name].data
        for index in np.ndindex(raw.shape[:-1]):
            p = index[-1]  # the token's position: 0..5
            x = raw[index]
            c = [math.cos(p * f) * attention for f in inv]
            s_ = [math.sin(p * f) * attention for f in inv]
            want = [x[2 * i] * c[i] - x[2 * i + 1] * s_[i] for i in range(2)]
            want += [x[2 * i + 1] * c[i] + x[2 * i] * s_[i] for i in range(2)]
            np.testing.assert_allclose(got[index], want, rtol=1e-12, atol=1e-12)
    assert trace.scale == pytest.approx(1.7**2 / math.sqrt(2 + 4), rel=1e-15)
    assert "yarn scaling" in trace["k_rope_rot"].formula


@pytest.mark.parametrize(
    ("scaling", "named"),
    [
        ({"type": "yarn"}, "mla.scaling: misses original_max_position_embeddings"),
        ({"type": "ntk"}, "mla.scaling.type: type is the string 'ntk'"),
        ({"type": "yarn", "factor": 4, "beta": 3}, "mla.scaling.beta: has 'beta'"),
        ([1, 2], "mla.scaling: got a list"),
    ],
)
def test_a_hostile_mla_scaling_is_one_line(scaling: Any, named: str, tmp_path: Path) -> None:
    fx = random_mla_fixture(5)
    fx["mla"]["scaling"] = scaling
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(fx), "utf-8")
    result = run_cli("trace", str(path))
    assert result.exit_code == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], lines


def test_decoding_refuses_a_length_dependent_mla_scaling(tmp_path: Path) -> None:
    fx = random_mla_fixture(5, seq=4, d_rope=4)
    fx["mla"]["scaling"] = {"type": "dynamic", "factor": 2.0, "max_position_embeddings": 2}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(fx), "utf-8")
    assert run_cli("trace", str(path)).exit_code == 0
    result = run_cli("decode", str(path))
    assert result.exit_code == 2 and "mla.scaling: dynamic frequencies" in result.stderr


# ---------------------------------------------------------------------------------------------
# Decoding over the latent cache, as DeepSeek's inference runs it


def latent_decode_loop(fx: dict[str, Any], prefill: int) -> list[dict[str, np.ndarray]]:
    """Each decoding step written from the paper's absorbed form, token by token, with its own
    cache of [c_KV_norm | k_rope_rot] rows: q_abs = q_nope·W_UKᵀ, scores = q_abs·c_j +
    q_rope_rot·k_rope_j, softmax over the cached j, o = Σ w_j c_j, output = o·W_UV. The
    per-token latents come from the loop reference (tests/reference.py), not from attn."""
    ref = reference(fx)
    mla = fx["mla"]
    H = fx["heads"]
    W_UK, W_UV = np.array(mla["W_UK"]), np.array(mla["W_UV"])
    r = W_UK.shape[0]
    d_nope, d_v = W_UK.shape[1] // H, W_UV.shape[1] // H
    batched = ref["c_KV_norm"].ndim == 3
    c_kv = ref["c_KV_norm"] if batched else ref["c_KV_norm"][None]  # (B, T, r)
    k_rope = ref["k_rope_rot"] if batched else ref["k_rope_rot"][None]  # (B, T, d_rope)
    q_nope = ref["q_nope"] if batched else ref["q_nope"][None]  # (B, H, T, d_nope)
    q_rope = ref["q_rope_rot"] if batched else ref["q_rope_rot"][None]
    scale = float(mla.get("mscale", 1.0)) ** 2 / math.sqrt(d_nope + k_rope.shape[-1])
    B, T = c_kv.shape[:2]
    steps = []
    for t in range(prefill, T):
        cache = [np.concatenate([c_kv[:, j], k_rope[:, j]], axis=-1) for j in range(t + 1)]
        latent = np.zeros((B, H, r))
        output = np.zeros((B, H, d_v))
        for b in range(B):
            for h in range(H):
                uk = W_UK[:, h * d_nope : (h + 1) * d_nope]  # (r, d_nope)
                q = np.concatenate([uk @ q_nope[b, h, t], q_rope[b, h, t]])
                scores = [scale * float(q @ cache[j][b]) for j in range(t + 1)]
                m = max(scores)
                e = [math.exp(x - m) for x in scores]
                w = [x / math.fsum(e) for x in e]
                latent[b, h] = sum(w[j] * c_kv[b, j] for j in range(t + 1))
                output[b, h] = latent[b, h] @ W_UV[:, h * d_v : (h + 1) * d_v]
        steps.append({"cache": np.stack(cache, axis=1), "latent": latent, "output": output})
    return steps


@pytest.mark.parametrize("q_rank", [3, None], ids=["q LoRA", "W_Q"])
@pytest.mark.parametrize("batch", [None, 2])
@pytest.mark.parametrize("prefill", [1, 3])
def test_decode_caches_the_latent_and_matches_the_absorbed_loop(
    q_rank: int | None, batch: int | None, prefill: int, tmp_path: Path
) -> None:
    from attn_cli.check.runs import run_decode

    fx = random_mla_fixture(
        11, q_rank=q_rank, batch=batch, heads=3, seq=5, rank=4, d_rope=2, d_v=3, mscale=1.3
    )
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(fx), "utf-8")
    run = run_decode(path, prefill)
    assert run.ok and run.worst <= 1e-12
    expected = latent_decode_loop(fx, prefill)
    assert len(run.result.steps) == len(expected)
    for step, want in zip(run.result.steps, expected, strict=True):
        assert step.K_cache.shape[1] == 1  # one cache for every head
        np.testing.assert_allclose(step.K_cache[:, 0], want["cache"], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(
            step.V_cache[:, 0], want["cache"][..., :4], rtol=1e-12, atol=1e-13
        )
        assert step.latent is not None
        np.testing.assert_allclose(step.latent[:, :, 0], want["latent"], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(step.output[:, :, 0], want["output"], rtol=1e-10, atol=1e-12)
    # the ledger: kv_lora_rank + d_rope numbers a token, against heads · (d_k + d_v) for MHA
    assert run.cost.latent == 4 + 2 and run.cost.per_token == 6 * 8
    assert run.cost.per_token_mha == 3 * ((2 + 2) + 3) * 8


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    heads=st.integers(1, 3),
    seq=st.integers(2, 6),
    rank=st.integers(1, 5),
    d_rope=st.sampled_from([2, 4]),
    lora=st.booleans(),
    batch=st.sampled_from([None, 2]),
    data=st.data(),
)
def test_latent_decoding_equals_the_full_trace_over_random_shapes(
    seed: int,
    heads: int,
    seq: int,
    rank: int,
    d_rope: int,
    lora: bool,
    batch: int | None,
    data: st.DataObject,
) -> None:
    from attn_cli.check.runs import check_decode, decode_keep

    fx = random_mla_fixture(
        seed,
        heads=heads,
        seq=seq,
        rank=rank,
        d_rope=d_rope,
        q_rank=2 if lora else None,
        batch=batch,
    )
    inputs = validate(fx, "m.json")
    prefill = data.draw(st.integers(1, seq))
    result = check_decode(run(inputs, keep=decode_keep(inputs)), prefill)
    assert result.worst <= 1e-12, result.diffs
    assert all(s.K_cache.shape[-1] == rank + d_rope for s in result.result.steps)


def test_decode_of_the_bundled_example_shows_the_latent_ledger() -> None:
    fx = yaml.safe_load(EXAMPLE.read_text("utf-8"))
    mla, H = fx["mla"], fx["heads"]
    r, d_rope = len(mla["W_DKV"][0]), len(mla["W_KR"][0])
    d_k = len(mla["W_UK"][0]) // H + d_rope
    d_v = len(mla["W_UV"][0]) // H
    result = run_cli("decode", "deepseek_mla", "--no-color", "--width", "120")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    row = next(line for line in out.splitlines() if line.startswith("this model (MLA latent)"))
    assert row.split()[-4:] == [
        "1",
        f"{(r + d_rope) * 8:,}",
        f"{(r + d_rope) * 2:,}",
        f"{(r + d_rope) * 8 * 5:,}",
    ]
    mha = next(line for line in out.splitlines() if line.startswith("MHA"))
    assert f"{H * (d_k + d_v) * 8:,}" in mha.split()
    assert "cache [c_KV_norm | k_rope_rot] · one for every head" in out
    assert f"V_cache: the cache's first {r} columns" in out
    assert out.count("self-check: max |output − the full attention's row") == 4
    zh = run_cli("decode", "deepseek_mla", "--no-color", "--lang", "zh", "--explain")
    assert zh.exit_code == 0, zh.stderr
    assert "本模型（MLA 潜向量）" in zh.stdout and "W_UK 并入查询" in zh.stdout


def test_decode_json_of_mla_has_the_latent_stages(tmp_path: Path) -> None:
    import json

    out = tmp_path / "d.json"
    result = run_cli("decode", "deepseek_mla", "-f", "json", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    doc = json.loads(out.read_text("utf-8"))
    assert doc["kv_cache_bytes"]["latent"] == 6
    step = doc["steps"][-1]
    names = list(step["stages"])
    assert names.index("output_latent") == names.index("output") - 1
    latent, output = (np.array(step["stages"][n]["data"]) for n in ("output_latent", "output"))
    assert latent.shape == (2, 1, 4) and output.shape == (2, 1, 3)


# What does not run MLA yet refuses it in one line


@pytest.mark.parametrize(
    "args",
    [
        ["rope", "deepseek_mla"],
    ],
    ids=["rope"],
)
def test_rope_refuses_mla(args: list[str]) -> None:
    result = run_cli(*args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: deepseek_mla.yaml: mla: "), lines
    assert result.stdout == ""


def test_rope_layout_pairs_is_deepseek_v2s_complex_rotation() -> None:
    """DeepSeek V2's apply_rotary_emb: view_as_complex(x) · e^(i·pos·θ_j), each pair in place.
    Written with Python's complex numbers; the scores, weights and output equal the split
    layout's (the same permutation of both q's and k's rope columns)."""
    import cmath

    fx = random_mla_fixture(3, seq=4, heads=2, d_rope=4, W_O=True)
    fx["mla"]["base"] = 50.0
    split = trace_of(fx)
    pairs = trace_of(fx | {"mla": {**fx["mla"], "rope_layout": "pairs"}})
    for name in ("q_rope", "k_rope"):
        x, got = pairs[name].data, pairs[f"{name}_rot"].data
        for idx in np.ndindex(*x.shape[:-1]):
            pos = idx[-1]
            for j in range(x.shape[-1] // 2):
                turned = complex(x[idx][2 * j], x[idx][2 * j + 1]) * cmath.exp(
                    1j * pos * 50.0 ** (-2 * j / x.shape[-1])
                )
                assert got[idx][2 * j] == pytest.approx(turned.real, rel=1e-13, abs=1e-14)
                assert got[idx][2 * j + 1] == pytest.approx(turned.imag, rel=1e-13, abs=1e-14)
    order = [0, 2, 1, 3]  # split writes (x0', x2' | x1', x3')
    np.testing.assert_allclose(pairs["k_rope_rot"].data[..., order], split["k_rope_rot"].data)
    for stage in ("scores", "softmax", "output", "projected", "scores_absorbed"):
        np.testing.assert_allclose(pairs[stage].data, split[stage].data, rtol=1e-12, atol=1e-14)
    from attn_cli.core.plugins.mla import LatentAttention

    mla = LatentAttention()
    values = [mla.value(t.inputs) for t in (pairs, split)]
    said = [mla.config(v, t.inputs) for v, t in zip(values, (pairs, split), strict=True) if v]
    assert said[0]["rope_layout"] == "pairs" and "rope_layout" not in said[1]


def test_latent_decoding_of_the_pairs_layout_equals_the_full_trace() -> None:
    from attn_cli.check.runs import check_decode, decode_keep

    fx = random_mla_fixture(4, seq=5, heads=2, d_rope=4)
    inputs = validate(fx | {"mla": {**fx["mla"], "rope_layout": "pairs"}}, "m.json")
    result = check_decode(run(inputs, keep=decode_keep(inputs)), 2)
    assert result.worst <= 1e-12, result.diffs


def test_a_deepseek_v2_checkpoint_imports_with_its_pairs_layout(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    case = Path(__file__).parent.parent / "reference" / "families" / "deepseek_v2"
    out = tmp_path / "v2.npz"
    result = run_cli("import", str(case), "--text", "a b c d", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    with np.load(out) as got:
        assert str(got["mla.rope_layout"]) == "pairs"
        assert "mla.W_Q" in got and "mla.W_DQ" not in got
    traced = run_cli("trace", str(out), "--stage", "q_rope_rot")
    assert traced.exit_code == 0 and "kept in place" in traced.stdout, traced.stderr


# ---------------------------------------------------------------------------------------------
# Hostile fixtures: one line naming the field


def _with(**mla: Any) -> dict[str, Any]:
    fx = random_mla_fixture(1)
    fx["mla"] = {**fx["mla"], **mla}
    return {k: v for k, v in fx.items()} | {
        "mla": {k: v for k, v in fx["mla"].items() if v is not None}
    }


ERRORS: list[tuple[str, dict[str, Any], str]] = [
    ("not a mapping", {"mla": [1, 2]}, "mla: got a list"),
    ("unknown subkey", {"mla": _with(W_UKK=1)["mla"]}, "mla.W_UKK: unknown key"),
    ("W_KR missing", {"mla": _with(W_KR=None)["mla"]}, "mla.W_KR: missing"),
    ("odd d_rope", {"mla": _with(W_KR=[[1.0]] * 4)["mla"]}, "mla.W_KR: has 1 columns"),
    (
        "W_UK split",
        {"mla": _with(W_UK=[[1.0] * 3] * 3)["mla"]},
        "mla.W_UK: has 3 columns, not divisible by heads = 2",
    ),
    ("W_UQ width", {"mla": _with(W_UQ=[[1.0] * 6] * 3)["mla"]}, "mla.W_UQ: has 6 columns"),
    ("W_Q beside W_DQ", {"mla": _with(W_Q=[[1.0] * 8] * 4)["mla"]}, "mla.W_Q: given with W_DQ"),
    ("kv_norm length", {"mla": _with(kv_norm=[1.0])["mla"]}, "mla.kv_norm: has length 1"),
    ("nan", {"mla": _with(W_DKV=[[math.nan] * 3] * 4)["mla"]}, "mla.W_DKV[0][0]: is nan"),
    ("rows", {"mla": _with(W_DKV=[[1.0] * 3] * 5)["mla"]}, "mla.W_DKV: has 5 rows"),
    ("eps", {"mla": _with(eps=-1)["mla"]}, "mla.eps: is -1"),
    ("mscale inf", {"mla": _with(mscale=math.inf)["mla"]}, "mla.mscale: is inf"),
    (
        "rope_layout",
        {"mla": _with(rope_layout="interleaved")["mla"]},
        "mla.rope_layout: got the string 'interleaved', expected \"split\" (deepseek_v3",
    ),
    ("W_Q beside mla", {"W_Q": [[1.0]]}, "W_Q: given with mla"),
    ("rope beside mla", {"rope": True}, "rope: given with mla"),
    ("kv_heads", {"kv_heads": 1}, "kv_heads: given with mla"),
]


@pytest.mark.parametrize(
    ("change", "message"), [(c, m) for _, c, m in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_a_hostile_mla_fixture_is_one_line(
    change: dict[str, Any], message: str, tmp_path: Path
) -> None:
    fx = random_mla_fixture(1) | change
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(fx))
    result = run_cli("trace", str(tmp_path / "m.yaml"))
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), lines
    assert message in lines[0], lines[0]


@pytest.mark.parametrize(
    ("scale", "dtype", "where"),
    [
        (1e300, "float32", "mla.W_DKV[row 0, column 0]: is 1.09"),
        (1e200, "float64", "c_KV_norm[key 0, kv_lora_rank 0]: is inf (float64 overflow)"),
    ],
    ids=["float32-weight", "float64-stage"],
)
def test_huge_numbers_are_one_line(scale: float, dtype: str, where: str, tmp_path: Path) -> None:
    fx = random_mla_fixture(1)
    fx["mla"]["W_DKV"] = (np.array(fx["mla"]["W_DKV"]) * scale).tolist()
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(fx))
    result = run_cli("trace", str(tmp_path / "m.yaml"), "--dtype", dtype)
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), lines
    assert where in lines[0], lines[0]
