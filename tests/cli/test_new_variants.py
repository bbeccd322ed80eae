"""``attn new`` flags for the modern variants (issue 10): each writes a commented key that loads
and traces, the .npz holds the same fixture, and nonsense is a one-line error naming the flag.

The random numbers are checked against numpy's default_rng draws made here, in the documented
order (the variants draw after X and the weights, so adding one changes nothing else).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from attn_cli.io.fixture import load_fixture


def made(path: Path, *args: str) -> Path:
    result = run_cli("new", str(path), *args)
    assert result.exit_code == 0, result.output
    return path


def traced_stages(path: Path, *args: str) -> list[str]:
    result = run_cli("trace", str(path), "-f", "json", *args)
    assert result.exit_code == 0, result.output
    return list(json.loads(result.stdout)["stages"])


# flags, the YAML line (start) that must be there with its comment, the stages the trace gains
CASES = [
    (
        ["--rope", "half"],
        "  layout: half   # dimension i pairs with i + dims/2",
        ["Q_rot", "K_rot"],
    ),
    (
        ["--rope", "interleaved", "--rope-base", "500000", "--rope-dims", "2"],
        "  dims: 2   # the first 2 of d_k = 4 dimensions rotate; the other 2 pass through",
        ["Q_rot", "K_rot"],
    ),
    (
        ["--causal", "--window", "3"],
        "window: 3   # sliding window: a query sees keys with 0 <= pos_q - pos_k < 3",
        ["masked"],
    ),
    (
        ["--softcap", "50"],
        "softcap: 50.0   # capped = 50 * tanh(scaled / 50), before the mask",
        ["capped"],
    ),
    (["--sinks"], "sinks: [", []),
    (["--qk-norm"], "qk_norm:   # RMSNorm of Q and K before RoPE", ["Q_norm", "K_norm"]),
    (["--alibi"], "alibi: true   # ALiBi: bias -slope_h * |pos_q - pos_k|", ["alibi", "masked"]),
    (["--cross", "7"], "X_kv:   # [seq_k, d_model_kv] = [7, 8]", ["X_kv"]),
    (
        ["--causal", "--mask-value", "-1e4"],
        "mask_value: -10000.0   # fills where a key",
        ["masked"],
    ),
]


@pytest.mark.parametrize(("args", "line", "stages"), CASES, ids=lambda x: " ".join(x)[:30])
def test_each_flag_writes_a_commented_key_that_traces(
    tmp_path: Path, args: list[str], line: str, stages: list[str]
) -> None:
    target = made(tmp_path / "v.yaml", *args)
    text = target.read_text(encoding="utf-8")
    assert any(row.startswith(line) for row in text.splitlines()), text
    got = traced_stages(target)
    assert set(stages) <= set(got)
    cell = run_cli("trace", str(target), "--cell", "1,0", "--explain", "-f", "plain", "-q")
    assert cell.exit_code == 0, cell.output


def test_the_keys_hold_what_the_flags_asked(tmp_path: Path) -> None:
    inputs = load_fixture(
        made(
            tmp_path / "all.yaml",
            "--heads",
            "4",
            "--kv-heads",
            "2",
            "--causal",
            "--window",
            "2",
            "--rope",
            "interleaved",
            "--rope-base",
            "500",
            "--rope-dims",
            "2",
            "--softcap",
            "30",
            "--sinks",
            "--qk-norm",
            "--alibi",
            "--cross",
            "6",
            "--mask-value",
            "-1e9",
            "--batch",
            "2",
        )
    )
    assert inputs.rope is not None
    assert (inputs.rope.layout, inputs.rope.base, inputs.rope.dims) == ("interleaved", 500.0, 2)
    assert (inputs.window, inputs.setting("softcap"), inputs.mask_value) == (2, 30.0, -1e9)
    assert inputs.setting("sinks") is not None and inputs.setting("sinks").shape == (4,)
    qk_norm = inputs.setting("qk_norm")
    assert qk_norm is not None and qk_norm.q_weight.shape == (4,)
    assert qk_norm.k_weight.shape == (4,) and qk_norm.eps == 1e-6
    assert inputs.setting("alibi") is not None
    np.testing.assert_array_equal(
        inputs.setting("alibi"), [2**-2, 2**-4, 2**-6, 2**-8]
    )  # Press et al.
    assert inputs.X_kv is not None and inputs.X_kv.shape == (2, 6, 8)
    assert inputs.key_tokens is not None and len(inputs.key_tokens) == 6
    assert (inputs.seq_q, inputs.seq_k) == (5, 6)


def test_variant_numbers_are_the_seeded_draws_after_the_rest(tmp_path: Path) -> None:
    """Independent of attn: default_rng(seed) draws X, W_Q, W_K, W_V, then X_kv, sinks, weights."""
    plain = load_fixture(
        made(
            tmp_path / "p.yaml",
            "--seed",
            "5",
            "--heads",
            "1",
            "--d-k",
            "2",
            "--d-model",
            "3",
            "--seq",
            "2",
        )
    )
    args = ["--seed", "5", "--heads", "1", "--d-k", "2", "--d-model", "3", "--seq", "2"]
    rich = load_fixture(made(tmp_path / "r.yaml", *args, "--cross", "3", "--sinks", "--qk-norm"))
    rng = np.random.default_rng(5)
    X = rng.normal(size=(2, 3)).round(1)
    W = [(rng.normal(size=(3, 2)) / math.sqrt(3)).round(2) for _ in range(3)]
    X_kv = rng.normal(size=(3, 3)).round(1)
    sinks = rng.normal(size=1).round(2)
    q_weight, k_weight = ((1 + 0.1 * rng.normal(size=2)).round(2) for _ in "qk")
    for fixture in (plain, rich):
        assert fixture.X is not None
        np.testing.assert_array_equal(fixture.X[0], X)  # rtol 0: written exactly
        for got, want in zip((fixture.W_Q, fixture.W_K, fixture.W_V), W, strict=True):
            np.testing.assert_array_equal(got, want)
    assert (
        rich.X_kv is not None
        and rich.setting("sinks") is not None
        and rich.setting("qk_norm") is not None
    )
    np.testing.assert_array_equal(rich.X_kv[0], X_kv)
    np.testing.assert_array_equal(rich.setting("sinks"), sinks)
    np.testing.assert_array_equal(rich.setting("qk_norm").q_weight, q_weight)
    np.testing.assert_array_equal(rich.setting("qk_norm").k_weight, k_weight)


@pytest.mark.parametrize(
    "args",
    [
        [
            "--rope",
            "half",
            "--causal",
            "--window",
            "2",
            "--sinks",
            "--heads",
            "4",
            "--kv-heads",
            "2",
        ],  # gpt-oss
        ["--rope", "interleaved", "--rope-base", "1000", "--rope-dims", "2", "--qk-norm"],
        ["--cross", "3", "--batch", "2", "--alibi", "--softcap", "20", "--w-o"],
        ["--causal", "--mask-value", "-1e4", "--tokens", "a,b,c"],
    ],
)
def test_npz_holds_the_same_variants_as_yaml(tmp_path: Path, args: list[str]) -> None:
    as_yaml = made(tmp_path / "f.yaml", *args)
    as_npz = made(tmp_path / "f.npz", *args)
    with np.load(as_npz, allow_pickle=False) as archive:  # plain arrays, nothing pickled
        assert all(archive[k].dtype != object for k in archive.files)
    a, b = load_fixture(as_yaml), load_fixture(as_npz)
    for key in ("rope", "window", "mask_value", "key_tokens", "description"):
        assert getattr(a, key) == getattr(b, key), key
    assert a.setting("softcap") == b.setting("softcap")
    np.testing.assert_array_equal(a.X_kv, b.X_kv)
    for key in ("sinks", "alibi"):
        np.testing.assert_array_equal(a.setting(key), b.setting(key))
    traces = [run_cli("trace", str(p), "-f", "json", "-q") for p in (as_yaml, as_npz)]
    assert all(t.exit_code == 0 for t in traces)
    assert json.loads(traces[0].stdout)["stages"] == json.loads(traces[1].stdout)["stages"]


def test_a_finite_mask_value_warns_when_traced(tmp_path: Path) -> None:
    target = made(tmp_path / "m.yaml", "--causal", "--mask-value", "-1", "--d-k", "8")
    result = run_cli("trace", str(target), "-f", "json")
    assert result.exit_code == 0
    assert "Warning: " in result.stderr and "mask_value -1 let" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--window", "3"],
            "Error: --window: given without --causal, expected --causal "
            "alongside --window (a sliding window looks back only)",
        ),
        (["--mask-value", "-1e4"], "Error: --mask-value: given but nothing is masked"),
        (["--rope-dims", "2"], "Error: --rope-dims: given without --rope"),
        (["--rope-base", "500"], "Error: --rope-base: given without --rope"),
        (
            ["--rope", "half", "--rope-dims", "3"],
            "Error: --rope-dims: is 3, expected an even whole number between 2 and d_k = 4",
        ),
        (["--rope", "half", "--rope-dims", "6"], "Error: --rope-dims: is 6"),
        (
            ["--rope", "half", "--rope-base", "0"],
            "Error: --rope-base: is 0.0, expected a finite number > 0",
        ),
        (["--rope", "half", "--rope-base", "inf"], "Error: --rope-base: is inf"),
        (
            ["--rope", "sideways"],
            "Error: --rope: got 'sideways', expected one of half, interleaved",
        ),
        (["--softcap", "0"], "Error: --softcap: is 0.0, expected a finite number > 0"),
        (["--softcap", "nan"], "Error: --softcap: is nan"),
        (["--causal", "--mask-value", "5"], "Error: --mask-value: is 5.0, expected -inf"),
        (
            ["--causal", "--window", "0"],
            "Error: --window: got 0, expected an integer of at least 1",
        ),
        (["--cross", "0"], "Error: --cross: got 0, expected an integer from 1 to 256"),
    ],
)
def test_variant_option_errors(tmp_path: Path, args: list[str], message: str) -> None:
    result = run_cli("new", str(tmp_path / "x.yaml"), *args)
    assert result.exit_code == 2
    assert result.stderr.startswith(message), result.stderr
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "x.yaml").exists()


def test_without_variant_flags_the_fixture_is_unchanged(tmp_path: Path) -> None:
    text = made(tmp_path / "p.yaml").read_text(encoding="utf-8")
    for key in ("rope", "alibi", "window", "softcap", "sinks", "qk_norm", "X_kv", "mask_value"):
        assert not any(line.startswith(f"{key}:") for line in text.splitlines()), key
