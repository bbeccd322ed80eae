"""The grader's catalogue of the mistakes people make with modern attention (issue 28): each
planted in a student's own NumPy code (tests/student_catalogue.py, apart from attn's pipeline),
dumped as a user would, graded, and named by exactly its name; the student without a mistake
agrees with the loop reference (tests/reference.py); a dump of random noise is named nothing.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import FIXTURES, Tolerance, run_cli
from reference import random_fixture, reference
from student_catalogue import Array, student

from attn_cli.api import trace_file
from attn_cli.check.compare import Comparison
from attn_cli.check.dump import load_dump
from attn_cli.check.grade import MISTAKES, grade
from attn_cli.check.mistake import ZH

TOL: Tolerance = {"rtol": 1e-9, "atol": 1e-12}
OUT = (
    "Q_norm",
    "K_norm",
    "Q_rot",
    "K_rot",
    "scores",
    "scaled",
    "capped",
    "alibi",
    "masked",
    "softmax",
    "output",
)


def bundled(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((FIXTURES / f"{name}.yaml").read_text())
    return loaded


def with_eps(fx: dict[str, Any], eps: float) -> dict[str, Any]:
    out = copy.deepcopy(fx)
    out["qk_norm"]["eps"] = eps
    return out


def graded(tmp_path: Path, fx: dict[str, Any], dump: dict[str, Any]) -> Comparison:
    """Write the fixture and the dump (.npz) and grade them as ``attn check --against`` does."""
    fixture, dump_path = tmp_path / "fixture.json", tmp_path / "dump.npz"
    fixture.write_text(json.dumps(fx))
    np.savez(dump_path, **dump)
    return grade(trace_file(str(fixture)), load_dump(dump_path))


def pick(stages: dict[str, Array], wanted: tuple[str, ...]) -> dict[str, Any]:
    return {n: stages[n] for n in wanted if n in stages}


def names(comparison: Comparison) -> list[str]:
    return [d.name for d in comparison.diagnoses]


QWEN3 = bundled("qwen3_qk_norm")  # per head, GQA 4/2, causal, RoPE
# a large eps, so that where it goes shows; per head and over the whole projection
EPS_HEAD = with_eps(
    random_fixture(
        21, seq=4, heads=2, d_k=4, qk_norm="head", causal=True, rope={"dims": 4}, magnitude=0.3
    ),
    0.5,
)
EPS_WHOLE = with_eps(
    random_fixture(22, seq=4, heads=2, d_k=2, qk_norm="projection", magnitude=0.3), 0.25
)
WHOLE = random_fixture(
    23, seq=4, heads=2, kv_heads=1, d_k=4, qk_norm="projection", causal=True, rope={"dims": 4}
)
MISTRAL = bundled("mistral_sliding_window")  # causal, window 3, RoPE, GQA 2/1
SENTINEL = bundled("mask_sentinel")  # mask_value -1e4, lengths [4, 0], causal
MULTIHEAD = bundled("causal_multihead")
LOWER = random_fixture(
    31, mode="direct", seq=3, seq_k=6, heads=2, kv_heads=1, causal="lower-right", window=3
)
LOWER_PLAIN = random_fixture(32, mode="direct", seq=2, seq_k=5, causal="lower-right")
UPPER = random_fixture(33, mode="direct", seq=3, seq_k=5, heads=2, causal=True)
SQUARE_WINDOW = random_fixture(35, seq=5, heads=2, causal=True, window=3)
PADDED = random_fixture(34, mode="direct", layout=3, batch=2, seq=3, causal=True, lengths=[3, 0])
GEMMA = bundled("gemma2_softcap")  # softcap 5, window 4, causal
SINKS = bundled("gptoss_sinks")  # sinks, GQA 4/2, causal, window
LLAMA = bundled("llama_rope_gqa")  # RoPE half, GQA, causal
ALIBI = random_fixture(41, seq=5, heads=4, kv_heads=2, d_k=2, d_model=4, causal=True, alibi=True)
ALIBI6 = random_fixture(42, seq=4, heads=6, d_k=2, d_model=4, causal=True, alibi=True)
PARTIAL = random_fixture(43, seq=4, heads=2, d_k=6, causal=True, rope={"dims": 4})
LENGTHS = random_fixture(44, mode="direct", layout=3, batch=2, seq=4, heads=2, lengths=[3, 2])
BIAS = random_fixture(45, seq=4, heads=2, d_k=3, bias=(2, 4, 4))

# (variant, planted mistake, fixture, stages dumped, diagnosis, first differing stage)
CASES: list[tuple[str, str, dict[str, Any], tuple[str, ...], str, str]] = [
    ("qk_norm", "qk_eps_outside", EPS_HEAD, OUT, "qk_norm_eps_outside", "Q_norm"),
    (
        "qk_norm",
        "qk_eps_outside",
        EPS_WHOLE,
        ("softmax", "output"),
        "qk_norm_eps_outside",
        "softmax",
    ),
    ("qk_norm", "qk_eps", EPS_HEAD, ("scores", "softmax"), "qk_norm_eps", "scores"),
    ("qk_norm", "qk_extent", QWEN3, OUT, "qk_norm_extent", "Q_norm"),
    ("qk_norm", "qk_extent", WHOLE, ("softmax", "output"), "qk_norm_extent", "softmax"),
    ("qk_norm", "qk_no_weight", QWEN3, ("Q_rot", "K_rot", "softmax"), "qk_norm_weight", "Q_rot"),
    ("qk_norm", "qk_plus_one", WHOLE, OUT, "qk_norm_weight", "Q_norm"),
    ("qk_norm", "qk_layernorm", QWEN3, ("scores", "output"), "qk_norm_layernorm", "scores"),
    ("qk_norm", "qk_k_only", QWEN3, OUT, "qk_norm_one_side", "Q_norm"),
    (
        "qk_norm",
        "qk_after_rope",
        QWEN3,
        ("Q_rot", "K_rot", "softmax"),
        "qk_norm_after_rope",
        "Q_rot",
    ),
    ("qk_norm", "qk_after_rope", WHOLE, ("scores", "softmax"), "qk_norm_after_rope", "scores"),
    ("window", "window_off_by_one", LOWER, ("softmax", "output"), "window_off_by_one", "softmax"),
    ("window", "window_ignored", MISTRAL, OUT, "window_ignored", "masked"),
    ("window", "window_ignored", LOWER, ("softmax", "output"), "window_ignored", "softmax"),
    ("window", "window_two_sided", MISTRAL, ("softmax", "output"), "window_two_sided", "softmax"),
    (
        "window",
        "window_two_sided",
        SQUARE_WINDOW,
        ("masked", "output"),
        "window_two_sided",
        "masked",
    ),
    ("window", "window_last_keys", MISTRAL, OUT, "window_last_keys", "masked"),
    ("causal", "causal_upper_left", LOWER_PLAIN, ("masked", "softmax"), "causal_corner", "masked"),
    ("causal", "causal_lower_right", UPPER, ("softmax", "output"), "causal_corner", "softmax"),
    (
        "causal",
        "causal_missing",
        UPPER,
        ("scores", "masked", "softmax"),
        "causal_missing",
        "masked",
    ),
    ("causal", "causal_missing", MISTRAL, ("softmax", "output"), "causal_missing", "softmax"),
    (
        "causal",
        "mask_after_softmax",
        MULTIHEAD,
        ("masked", "softmax", "output"),
        "mask_after_softmax",
        "masked",
    ),
    (
        "causal",
        "mask_after_softmax",
        PADDED,
        ("softmax", "output"),
        "mask_after_softmax",
        "softmax",
    ),
    ("causal", "mask_zero_fill", MULTIHEAD, ("softmax", "output"), "mask_zero_fill", "softmax"),
    ("causal", "sentinel_1e9", PADDED, ("softmax", "output"), "mask_finite_sentinel", "softmax"),
    ("causal", "sentinel_1e4", MULTIHEAD, ("masked", "softmax"), "mask_finite_sentinel", "masked"),
    (
        "causal",
        "sentinel_added",
        PADDED,
        ("scaled", "masked", "softmax"),
        "mask_sentinel_added",
        "masked",
    ),
    (
        "mask_value",
        "sentinel_ignored",
        SENTINEL,
        ("masked", "softmax", "output"),
        "mask_value_ignored",
        "masked",
    ),
    (
        "mask_value",
        "sentinel_ignored",
        SENTINEL,
        ("softmax", "output"),
        "mask_value_ignored",
        "softmax",
    ),
    ("mask_value", "sentinel_1e9", SENTINEL, ("masked", "softmax"), "mask_value_other", "masked"),
    (
        "mask_value",
        "sentinel_added",
        SENTINEL,
        ("softmax", "output"),
        "mask_sentinel_added",
        "softmax",
    ),
    ("mask_value", "mask_zero_fill", SENTINEL, ("masked", "softmax"), "mask_zero_fill", "masked"),
    ("mask_value", "mask_after_softmax", SENTINEL, ("softmax",), "mask_after_softmax", "softmax"),
    ("softcap", "softcap_no_divide", GEMMA, OUT, "softcap_formula", "capped"),
    ("softcap", "softcap_no_multiply", GEMMA, ("softmax", "output"), "softcap_formula", "softmax"),
    ("softcap", "softcap_no_factor", GEMMA, OUT, "softcap_no_factor", "capped"),
    ("softcap", "softcap_no_factor", GEMMA, ("softmax", "output"), "softcap_no_factor", "softmax"),
    ("softcap", "softcap_before_scale", GEMMA, OUT, "softcap_before_scale", "capped"),
    ("softcap", "softcap_left_out", GEMMA, ("masked", "softmax"), "softcap_left_out", "masked"),
    ("softcap", "softcap_wrong_cap", GEMMA, ("softmax", "output"), "softcap_other_cap", "softmax"),
    ("sinks", "sinks_left_out", SINKS, ("softmax", "output"), "sinks_left_out", "softmax"),
    ("sinks", "sinks_scaled", SINKS, ("masked", "softmax", "output"), "sinks_scaled", "softmax"),
    ("sinks", "sinks_per_kv_head", SINKS, ("softmax", "output"), "sinks_by_kv_head", "softmax"),
    ("sinks", "sinks_unshifted", SINKS, ("output",), "sinks_unshifted", "output"),
    ("sinks", "sinks_not_exp", SINKS, ("softmax", "output"), "sinks_not_exp", "softmax"),
    (
        "alibi",
        "alibi_reversed",
        ALIBI,
        ("alibi", "masked", "softmax"),
        "alibi_slopes_reversed",
        "alibi",
    ),
    ("alibi", "alibi_from_one", ALIBI, ("softmax", "output"), "alibi_slopes_formula", "softmax"),
    ("alibi", "alibi_geometric", ALIBI6, ("alibi", "softmax"), "alibi_slopes_formula", "alibi"),
    ("alibi", "alibi_scaled", ALIBI, ("alibi", "masked", "softmax"), "alibi_scaled", "masked"),
    ("alibi", "alibi_scaled", ALIBI6, ("softmax", "output"), "alibi_scaled", "softmax"),
    ("gqa", "gqa_k_tiled", QWEN3, ("scores", "softmax", "output"), "gqa_one_tiled", "scores"),
    ("gqa", "gqa_v_tiled", QWEN3, ("scores", "softmax", "output"), "gqa_one_tiled", "output"),
    ("gqa", "gqa_single", QWEN3, ("softmax", "output"), "gqa_single_kv_head", "softmax"),
    ("gqa", "gqa_flat_repeat", LLAMA, ("K_rot", "scores", "output"), "gqa_flat_repeat", "scores"),
    ("gqa", "gqa_flat_repeat", ALIBI, ("softmax", "output"), "gqa_flat_repeat", "softmax"),
    ("rope", "rope_base", LLAMA, ("Q_rot", "K_rot", "softmax"), "rope_base", "Q_rot"),
    ("rope", "rope_exponent", QWEN3, ("scores", "output"), "rope_exponent", "scores"),
    ("rope", "rope_all_dims", PARTIAL, ("Q_rot", "K_rot", "softmax"), "rope_all_dims", "Q_rot"),
    ("rope", "rope_reversed", MISTRAL, ("softmax", "output"), "rope_reversed", "softmax"),
    ("lengths", "lengths_left", LENGTHS, ("masked", "softmax"), "lengths_padding_side", "masked"),
    ("lengths", "lengths_queries", LENGTHS, ("softmax", "output"), "lengths_on_queries", "softmax"),
    (
        "lengths",
        "lengths_off_by_one",
        LENGTHS,
        ("masked", "softmax", "output"),
        "lengths_off_by_one",
        "masked",
    ),
    ("lengths", "lengths_ignored", LENGTHS, ("softmax", "output"), "lengths_ignored", "softmax"),
    ("bias", "bias_before_scale", BIAS, ("masked", "softmax"), "bias_before_scale", "masked"),
    ("bias", "bias_ignored", BIAS, ("softmax", "output"), "bias_ignored", "softmax"),
    ("bias", "bias_transposed", BIAS, ("masked", "output"), "bias_transposed", "masked"),
    ("bias", "bias_sign", BIAS, ("softmax",), "bias_sign", "softmax"),
]


@pytest.mark.parametrize(
    ("variant", "mistake", "fx", "dumped", "diagnosis", "first"),
    CASES,
    ids=[f"{c[0]}-{c[1]}-{c[5]}" for c in CASES],
)
def test_a_planted_mistake_is_named_by_its_name_alone(
    tmp_path: Path,
    variant: str,
    mistake: str,
    fx: dict[str, Any],
    dumped: tuple[str, ...],
    diagnosis: str,
    first: str,
) -> None:
    assert variant in fx or (variant == "gqa" and fx["kv_heads"] < fx["heads"])
    comparison = graded(tmp_path, fx, pick(student(fx, mistake), dumped))
    assert comparison.first_difference is not None
    assert comparison.first_difference.name == first
    assert names(comparison) == [diagnosis]
    assert comparison.diagnoses[0].unexplained == ()


FIXTURES_USED = {id(c[2]): c[2] for c in CASES}


@pytest.mark.parametrize("fx", list(FIXTURES_USED.values()))
def test_the_student_without_a_mistake_is_the_loop_reference_and_passes(
    tmp_path: Path, fx: dict[str, Any]
) -> None:
    stages, expected = student(fx), reference(fx)
    has_batch = np.asarray(fx.get("X", fx.get("Q"))).ndim == 3
    for name, value in stages.items():
        got = value if has_batch else value[0]
        np.testing.assert_allclose(got, expected[name], **TOL, err_msg=name)
    comparison = graded(tmp_path, fx, stages)
    assert comparison.same
    assert comparison.diagnoses == ()


@pytest.mark.parametrize("fx", list(FIXTURES_USED.values()))
def test_random_noise_is_named_nothing(tmp_path: Path, fx: dict[str, Any]) -> None:
    right = student(fx)
    rng = np.random.default_rng(0)
    noise: dict[str, Any] = {n: rng.standard_normal(a.shape) for n, a in right.items()}
    comparison = graded(tmp_path, fx, noise)
    assert comparison.first_difference is not None
    assert comparison.diagnoses == ()
    assert comparison.looks or comparison.ratio or comparison.transpose  # a hint, always


# ---------------------------------------------------------------------------------------------
# Every mistake is explained in Chinese too, with its fix


def test_every_mistake_has_a_chinese_title_and_explanation_with_the_fix() -> None:
    for mistake in MISTAKES:
        title, explanation = ZH.get(mistake.name, ("", ""))
        assert title and "修正：" in explanation, mistake.name
    assert set(ZH) == {m.name for m in MISTAKES}  # no text for a mistake that is not there


def test_lang_zh_says_the_diagnosis_in_chinese_then_the_numbers(tmp_path: Path) -> None:
    (tmp_path / "fixture.json").write_text(json.dumps(QWEN3))
    np.savez(tmp_path / "dump.npz", **pick(student(QWEN3, "qk_after_rope"), ("Q_rot", "K_rot")))
    args = ("check", str(tmp_path / "fixture.json"), "--against", str(tmp_path / "dump.npz"))
    zh = run_cli(*args, "--format", "plain", "--lang", "zh")
    assert zh.exit_code == 1
    text = " ".join(zh.stdout.split())
    assert "诊断：QK-norm 放在了 RoPE 之后 [QK-norm applied after RoPE]" in text
    assert "修正：q = rope(q_norm(q))" in text
    assert "Confirmed: recomputed from attn's own earlier stages" in text  # the numbers, as ever
    en = run_cli(*args, "--format", "plain", "--lang", "en")
    assert "诊断" not in en.stdout and "diagnosis: QK-norm applied after RoPE" in en.stdout
    found = json.loads(run_cli(*args, "--format", "json").stdout)["fixtures"][0]["diagnoses"]
    assert found[0]["title_zh"] == "QK-norm 放在了 RoPE 之后"
