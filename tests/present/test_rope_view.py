"""``attn rope`` (issue 23's position view) and the grader's RoPE-scaling mistakes.

The view's frequencies are checked against transformers' own (the inv_freq its eager attention
rotated by, in tests/reference/rope_scaling/), its bands and shares against the formulas of
transformers' ``modeling_rope_utils.py`` written here as loops, and the grader against a student
who computes RoPE scaling as that file does, with one planted mistake.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import FIXTURES, run_cli

from attn_cli.api import rope_file, trace_file
from attn_cli.check.dump import load_dump
from attn_cli.check.grade import grade
from attn_cli.core.inputs import Rope
from attn_cli.core.rope_scaling import RopeScaling
from attn_cli.core.rope_table import rope_table

Array = np.ndarray[Any, np.dtype[np.float64]]
REFERENCE = Path(__file__).parent.parent / "reference" / "rope_scaling"
TWO_PI = 2 * math.pi


# ---------------------------------------------------------------------------------------------
# transformers' modeling_rope_utils.py (5.24.0), one pair at a time


def hf_plain(dims: int, base: float) -> list[float]:
    return [1.0 / base ** (2 * i / dims) for i in range(dims // 2)]


def hf_llama3(dims: int, base: float, s: dict[str, Any], mistake: str = "") -> list[float]:
    """``_compute_llama3_parameters``; ``mistake``: "unsmoothed" skips the smoothing step,
    "swapped" divides the short wavelengths and mixes the middle the other way round."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    out = []
    for f in hf_plain(dims, base):
        wavelen = TWO_PI / f
        smooth = (old / wavelen - low) / (high - low)
        long_, short = wavelen > old / low, wavelen < old / high
        if mistake == "swapped":
            long_, short, smooth = short, long_, 1 - smooth
        if long_:
            out.append(f / factor)
        elif short or mistake == "unsmoothed":
            out.append(f)
        else:
            out.append((1 - smooth) * f / factor + smooth * f)
    return out


def hf_yarn_ramp(dims: int, base: float, s: dict[str, Any]) -> list[float]:
    """``_compute_yarn_parameters``' find_correction_range and linear_ramp_factor."""
    old = s["original_max_position_embeddings"]

    def correction(rotations: float) -> float:
        return (dims * math.log(old / (rotations * TWO_PI))) / (2 * math.log(base))

    low, high = correction(s.get("beta_fast", 32)), correction(s.get("beta_slow", 1))
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high:
        high += 0.001
    return [min(max((i - low) / (high - low), 0.0), 1.0) for i in range(dims // 2)]


def hf_yarn(dims: int, base: float, s: dict[str, Any], mistake: str = "") -> list[float]:
    """inv_freq = interpolation·(1 − extrapolation_factor) + extrapolation·extrapolation_factor
    with extrapolation_factor = 1 − ramp; "reversed" takes the ramp as that factor."""
    out = []
    for f, ramp in zip(hf_plain(dims, base), hf_yarn_ramp(dims, base, s), strict=True):
        extrapolation = ramp if mistake == "reversed" else 1 - ramp
        out.append(f / s["factor"] * (1 - extrapolation) + f * extrapolation)
    return out


def hf_yarn_attention(s: dict[str, Any]) -> float:
    return 0.1 * math.log(s["factor"]) + 1.0


def hf_longrope(dims: int, base: float, s: dict[str, Any], length: int, mistake: str = "") -> Any:
    long_ = length > s["original_max_position_embeddings"]
    if mistake == "other_list":
        long_ = not long_
    ext = s["long_factor" if long_ else "short_factor"]
    inv = [f / e for f, e in zip(hf_plain(dims, base), ext, strict=True)]
    factor = s["max_position_embeddings"] / s["original_max_position_embeddings"]
    return inv, math.sqrt(1 + math.log(factor) / math.log(s["original_max_position_embeddings"]))


# ---------------------------------------------------------------------------------------------
# The view's numbers


def test_the_bundled_llama3_example_by_hand() -> None:
    """d_k 16, base 500000: wavelengths 2π·500000^(i/8) = 6.28, 32.4, 167, 862, 4443, 22915, ...;
    trained on 8192 with high 4, low 1: below 2048 kept (pairs 0-3), above 8192 ÷ 8 (5-7),
    pair 4 smoothed with s = (8192/4443 − 1)/3 = 0.2813, so θ/θ' = 1/(0.2813 + 0.7187/8)."""
    _, table = rope_file("llama31_rope_scaling")
    assert table.band == ("kept",) * 4 + ("smooth",) + ("scaled",) * 3
    assert table.length == 8195 and table.position == 8194 and table.trained == 8192
    wave4 = TWO_PI * 500000 ** (4 / 8)
    assert table.wavelength[4] == pytest.approx(wave4)
    s = (8192 / wave4 - 1) / 3
    assert s == pytest.approx(0.2813, abs=1e-4)
    assert table.mix[4] == pytest.approx(1 - s)
    assert table.divisor[4] == pytest.approx(1 / (s + (1 - s) / 8))
    assert list(table.divisor[:4]) == [1.0] * 4 and list(table.divisor[5:]) == pytest.approx(
        [8] * 3
    )
    assert table.over_trained[7] == pytest.approx(TWO_PI * 500000 ** (7 / 8) / 8192)
    np.testing.assert_allclose(table.angle, 8194 * table.scaled, rtol=1e-15)
    np.testing.assert_allclose(table.cos, np.cos(8194 * table.scaled), rtol=1e-15)
    assert (list(table.first), list(table.second)) == (list(range(8)), list(range(8, 16)))


SCALINGS = [
    {
        "type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    {
        "type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 2.0,
        "high_freq_factor": 3.0,
        "original_max_position_embeddings": 1000,
    },
    {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096},
    {
        "type": "yarn",
        "factor": 4.0,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
        "truncate": False,
        "original_max_position_embeddings": 256,
    },
]


@pytest.mark.parametrize("spec", SCALINGS, ids=lambda s: f"{s['type']}-{s['factor']:g}")
@pytest.mark.parametrize(("dims", "base"), [(16, 500000.0), (64, 10000.0), (128, 150000.0)])
def test_bands_and_frequencies_are_transformers_loop(
    spec: dict[str, Any], dims: int, base: float
) -> None:
    params = {k: v for k, v in spec.items() if k != "type"}
    scaling = RopeScaling(spec["type"], tuple(params.items()))
    table = rope_table(Rope(base, "half", dims, scaling), dims, 10, 9)
    plain = hf_plain(dims, base)
    if spec["type"] == "llama3":
        expected = hf_llama3(dims, base, params)
        old = params["original_max_position_embeddings"]
        for i, f in enumerate(plain):
            wavelen = TWO_PI / f
            band = (
                "scaled"
                if wavelen > old / params["low_freq_factor"]
                else "kept"
                if wavelen < old / params["high_freq_factor"]
                else "smooth"
            )
            assert table.band[i] == band, i
    else:
        expected = hf_yarn(dims, base, params)
        ramp = hf_yarn_ramp(dims, base, params)
        np.testing.assert_allclose(table.mix, ramp, rtol=1e-12)
        names = ["kept" if r == 0 else "scaled" if r == 1 else "ramp" for r in ramp]
        assert list(table.band) == names
        assert table.attention == pytest.approx(hf_yarn_attention(params))
    np.testing.assert_allclose(table.scaled, expected, rtol=1e-12)
    np.testing.assert_allclose(table.divisor, np.array(plain) / np.array(expected), rtol=1e-12)
    np.testing.assert_allclose(table.inv_freq, plain, rtol=1e-12)


def test_longrope_and_dynamic_follow_the_length() -> None:
    short = tuple(1.0 + i / 10 for i in range(4))
    long_ = tuple(2.0 + i for i in range(4))
    params = (
        ("short_factor", short),
        ("long_factor", long_),
        ("original_max_position_embeddings", 100),
        ("max_position_embeddings", 400),
    )
    rope = Rope(10000.0, "half", 8, RopeScaling("longrope", params))
    s = dict(params)
    for length, band in ((100, "short"), (101, "long")):
        table = rope_table(rope, 8, length, 3)
        inv, attention = hf_longrope(8, 10000.0, s, length)
        assert table.band == (band,) * 4
        np.testing.assert_allclose(table.scaled, inv, rtol=1e-12)
        assert (
            table.attention
            == pytest.approx(attention)
            == pytest.approx(math.sqrt(1 + math.log(4) / math.log(100)))
        )
    ntk = RopeScaling("dynamic", (("factor", 2.0), ("max_position_embeddings", 4)))
    dynamic = Rope(10000.0, "half", 8, ntk)
    kept, grown = rope_table(dynamic, 8, 4, 0), rope_table(dynamic, 8, 7, 6)
    assert kept.band == ("unchanged",) * 4 and kept.base == 10000.0
    assert grown.band == ("grown",) * 4
    assert grown.base == pytest.approx(10000 * (2 * 7 / 4 - 1) ** (8 / 6))  # transformers' NTK


def _imported(tmp_path: Path, case: str) -> tuple[Path, dict[str, Any]]:
    pytest.importorskip("safetensors", reason="attn import needs safetensors")
    ref = json.loads((REFERENCE / case / "reference.json").read_text())
    run_ = ref["runs"][0]
    np.save(tmp_path / "h.npy", np.array(run_["h"], dtype=np.float64))
    out = tmp_path / f"{case}.npz"
    result = run_cli(
        "import", str(REFERENCE / case), "--hidden", str(tmp_path / "h.npy"), "-o", str(out)
    )
    assert result.exit_code == 0, result.stderr
    return out, run_


@pytest.mark.parametrize("case", sorted(p.name for p in REFERENCE.iterdir() if p.is_dir()))
def test_the_json_view_of_an_imported_checkpoint_is_what_transformers_rotated_by(
    tmp_path: Path, case: str
) -> None:
    fixture, run_ = _imported(tmp_path, case)
    result = run_cli("rope", str(fixture), "-f", "json")
    assert result.exit_code == 0, result.stderr
    view = json.loads(result.stdout)
    assert view["format"] == "attn-rope" and view["length"] == run_["T"]
    pairs = view["pairs"]
    np.testing.assert_allclose(pairs["scaled_inv_freq"], run_["inv_freq"], rtol=2e-6)
    assert view["attention_factor"] == pytest.approx(run_["attention_scaling"], rel=1e-6)
    last = run_["T"] - 1
    np.testing.assert_allclose(pairs["angle"], np.array(run_["inv_freq"]) * last, rtol=2e-6)
    assert len(pairs["band"]) == len(run_["inv_freq"])


# ---------------------------------------------------------------------------------------------
# The command


def test_the_table_in_both_languages() -> None:
    en = run_cli("rope", "llama31_rope_scaling", "--explain", "--lang", "en")
    assert en.exit_code == 0, en.stderr
    assert "smooth 0.72" in en.stdout and "÷ factor" in en.stdout
    assert "trained context" in en.stdout and "8,192" in en.stdout
    assert "high_freq_factor" in en.stdout  # the llama3 paragraph of --explain
    zh = run_cli("rope", "llama31_rope_scaling", "--explain", "--lang", "zh")
    assert zh.exit_code == 0, zh.stderr
    assert "平滑 0.72" in zh.stdout and "保持" in zh.stdout and "训练上下文" in zh.stdout
    for line in en.stdout.splitlines() + zh.stdout.splitlines():
        assert "…" not in line  # every number fits the 100 columns of a pipe


def test_position_and_length(tmp_path: Path) -> None:
    result = run_cli("rope", "llama31_rope_scaling", "-p", "100000", "-f", "json")
    view = json.loads(result.stdout)
    assert view["position"] == 100000 and view["length"] == 100001
    angle = np.array(view["pairs"]["scaled_inv_freq"]) * 100000
    np.testing.assert_allclose(view["pairs"]["angle"], angle, rtol=1e-15)
    result = run_cli("rope", "llama31_rope_scaling", "--length", "3", "-f", "json")
    assert json.loads(result.stdout)["position"] == 2


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("llama31_rope_scaling", "-p", "10", "--length", "5"), "--position"),
        (("llama31_rope_scaling", "-p", "-1"), "-1"),
        (("llama31_rope_scaling", "-p", str(2**60)), "2**53"),
        (("llama31_rope_scaling", "--length", "0"), "0"),
        (("the_cat_sat",), "rope"),
        (("no_such_example",), "no such file"),
    ],
)
def test_bad_requests_are_one_line(args: tuple[str, ...], words: str, tmp_path: Path) -> None:
    result = run_cli("rope", *args, "-o", str(tmp_path / "out.txt"))
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and words in result.stderr
    assert not (tmp_path / "out.txt").exists()


# ---------------------------------------------------------------------------------------------
# The grader: a student's RoPE scaling with one planted mistake, named


def _fixture(scaling: dict[str, Any] | None, tmp_path: Path) -> tuple[dict[str, Any], Path]:
    fx = yaml.safe_load((FIXTURES / "llama31_rope_scaling.yaml").read_text())
    if scaling is not None:
        fx["rope"] = {"base": 10000.0, "scaling": scaling}
    path = tmp_path / "fixture.yaml"
    path.write_text(yaml.safe_dump(fx))
    return fx, path


def _student(fx: dict[str, Any], inv: list[float], attention: float) -> dict[str, Array]:
    """Q_rot, K_rot, softmax and output as a student computes them, rotating by ``inv``."""
    X, W_Q, W_K, W_V = (np.array(fx[n], dtype=np.float64) for n in ("X", "W_Q", "W_K", "W_V"))
    heads, d = fx["heads"], W_K.shape[1]
    pos = np.array(fx["positions"], dtype=np.float64)

    assert fx["key_positions"] == fx["positions"]

    def rotate(x: Array) -> Array:  # HF: x·cos + rotate_half(x)·sin, cos and sin × attention
        freqs = np.outer(pos, inv)
        cos, sin = np.cos(freqs) * attention, np.sin(freqs) * attention
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        out: Array = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        return out

    q = rotate((X @ W_Q).reshape(len(X), heads, d).transpose(1, 0, 2))  # (H, T, d)
    k = rotate((X @ W_K)[None])  # (1, T, d): one kv head
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)
    scores = np.where(np.tril(np.ones((len(X), len(X)), bool)), scores, -np.inf)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return {"Q_rot": q, "K_rot": k, "softmax": w, "output": w @ (X @ W_V)[None]}


LLAMA3 = {
    "type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
YARN = {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096}
LONGROPE = {
    "type": "longrope",
    "original_max_position_embeddings": 4096,
    "max_position_embeddings": 131072,
    "short_factor": [1.0, 1.0, 1.1, 1.2, 1.5, 2.0, 3.0, 4.0],
    "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0],
}


def _planted(scaling: dict[str, Any] | None, mistake: str) -> tuple[list[float], float]:
    """The frequencies and attention factor a student uses, with ``mistake`` planted."""
    spec = {k: v for k, v in (scaling or LLAMA3).items() if k != "type"}
    base = 500000.0 if scaling is None else 10000.0
    kind = (scaling or LLAMA3)["type"]
    if mistake == "ignored":
        return hf_plain(16, base), 1.0
    if kind == "llama3":
        return hf_llama3(16, base, spec, mistake), 1.0
    if kind == "yarn":
        attention = 1.0 if mistake == "mscale" else hf_yarn_attention(spec)
        return hf_yarn(16, base, spec, mistake), attention
    inv, attention = hf_longrope(16, base, spec, 8195, mistake)
    return inv, 1.0 if mistake == "mscale" else attention


GRADED = [
    (None, "", None),  # llama31_rope_scaling as it is: no mistake
    (None, "ignored", "rope_scaling_ignored"),
    (None, "unsmoothed", "rope_wrong_band"),
    (None, "swapped", "rope_wrong_band"),
    (YARN, "", None),
    (YARN, "ignored", "rope_scaling_ignored"),
    (YARN, "reversed", "rope_wrong_band"),
    (YARN, "mscale", "rope_mscale_missing"),
    (LONGROPE, "", None),
    (LONGROPE, "other_list", "rope_wrong_band"),
    (LONGROPE, "mscale", "rope_mscale_missing"),
    (LONGROPE, "ignored", "rope_scaling_ignored"),
]


GRADED_IDS = [f"{(s or LLAMA3)['type']}-{m or 'right'}" for s, m, _ in GRADED]


@pytest.mark.parametrize(("scaling", "mistake", "name"), GRADED, ids=GRADED_IDS)
@pytest.mark.parametrize("dumped", [("Q_rot", "K_rot", "softmax", "output"), ("softmax",)])
def test_a_planted_rope_scaling_mistake_is_named(
    tmp_path: Path,
    scaling: dict[str, Any] | None,
    mistake: str,
    name: str | None,
    dumped: tuple[str, ...],
) -> None:
    fx, path = _fixture(scaling, tmp_path)
    stages = _student(fx, *_planted(scaling, mistake))
    np.savez(tmp_path / "dump.npz", **{n: stages[n] for n in dumped})  # type: ignore[arg-type]
    comparison = grade(trace_file(path), load_dump(tmp_path / "dump.npz"))
    if name is None:
        assert comparison.first_difference is None  # the student's right: the reference agrees
        return
    assert comparison.first_difference is not None
    assert comparison.first_difference.name == dumped[0]
    assert [d.name for d in comparison.diagnoses] == [name]


def test_check_names_the_mistake_on_the_command_line(tmp_path: Path) -> None:
    fx, path = _fixture(YARN, tmp_path)
    stages = _student(fx, *_planted(YARN, "mscale"))
    np.savez(tmp_path / "mine.npz", **stages)  # type: ignore[arg-type]
    result = run_cli("check", str(path), "--against", str(tmp_path / "mine.npz"))
    assert result.exit_code == 1, result.stderr
    assert "mscale missing" in result.stdout
