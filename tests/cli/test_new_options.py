"""``attn new`` options of issue 14: --tokens, --kv-heads, --w-o, .npz, the file's real name."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from attn_cli.io.fixture import load_fixture


def made(path: Path, *args: str) -> Path:
    result = run_cli("new", str(path), *args)
    assert result.exit_code == 0, result.output
    return path


def test_tokens_set_the_sequence(tmp_path: Path) -> None:
    target = made(tmp_path / "mine.yaml", "--tokens", "I, like,green ,tea")
    inputs = load_fixture(target)
    assert inputs.tokens == ("I", "like", "green", "tea") and inputs.seq_q == 4
    traced = run_cli("trace", str(target), "--cell", "like,tea", "-f", "plain")
    assert traced.exit_code == 0, traced.output


@pytest.mark.parametrize(
    "tokens",
    [
        ['say "hi"', "back\\slash", "new\nline", "tab\there"],
        ["\u202eevil", "zero\u200bwidth", "c1\u009bcsi", "bell\x07"],
        ["数学", "😀", "#not a comment", "- not a list", "key: value", "null"],
    ],
)
def test_any_tokens_round_trip_exactly(tmp_path: Path, tokens: list[str]) -> None:
    target = made(tmp_path / "mine.yaml", "--tokens", ",".join(tokens))
    assert load_fixture(target).tokens == tuple(t.strip() for t in tokens)
    text = target.read_text(encoding="utf-8")
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    for line in text.splitlines():  # every row comment stays one line
        assert line.startswith(("#", " ", "-")) or ":" in line, line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tokens", "a,b", "--seq", "3"], "Error: --seq: 3 given with 2 --tokens"),
        (["--tokens", "a,,b"], "Error: --tokens: token 1 is empty"),
        (["--tokens", ",".join(["t"] * 257)], "Error: --tokens: 257 tokens, expected at most 256"),
        (["--tokens", "a" + "," * 100_000], "Error: --tokens: 100,001 tokens"),
        (["--heads", "4", "--kv-heads", "3"], "Error: --kv-heads: 3 does not divide --heads 4"),
        (["--kv-heads", "0"], "Error: --kv-heads: got 0, expected an integer from 1 to 16"),
    ],
)
def test_option_errors(tmp_path: Path, args: list[str], message: str) -> None:
    result = run_cli("new", str(tmp_path / "x.yaml"), *args)
    assert result.exit_code == 2
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1
    assert not (tmp_path / "x.yaml").exists()


def test_kv_heads_and_w_o_have_the_documented_shapes(tmp_path: Path) -> None:
    target = made(
        tmp_path / "gqa.yaml",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--d-k",
        "3",
        "--d-model",
        "5",
        "--w-o",
    )
    inputs = load_fixture(target)
    assert (inputs.heads, inputs.kv_heads, inputs.d_k) == (4, 2, 3)
    assert inputs.W_Q is not None and inputs.W_Q.shape == (5, 12)
    assert inputs.W_K is not None and inputs.W_K.shape == (5, 6)
    assert inputs.W_V is not None and inputs.W_V.shape == (5, 6)
    assert inputs.W_O is not None and inputs.W_O.shape == (12, 5)  # [heads*d_v, d_model]
    text = target.read_text(encoding="utf-8")
    assert "kv head 0 owns columns 0-2, kv head 1 owns columns 3-5" in text
    assert "kv_heads: 2   # grouped-query: query head h reads key/value head h // 2" in text
    traced = run_cli("trace", str(target), "-s", "projected", "-f", "json")
    assert traced.exit_code == 0, traced.output
    assert json.loads(traced.stdout)["stages"]["projected"]["shape"] == [5, 5]  # [seq, d_model]


def test_numbers_are_the_seeded_draws(tmp_path: Path) -> None:
    """Independent of attn: the draws, in order, of numpy's default_rng(seed)."""
    inputs = load_fixture(
        made(
            tmp_path / "s.yaml",
            "--seq",
            "3",
            "--d-model",
            "4",
            "--d-k",
            "2",
            "--heads",
            "1",
            "--w-o",
            "--seed",
            "7",
        )
    )
    rng = np.random.default_rng(7)
    X = rng.normal(size=(3, 4)).round(1)
    W = [(rng.normal(size=(4, 2)) / math.sqrt(4)).round(2) for _ in range(3)]
    W_O = (rng.normal(size=(2, 4)) / math.sqrt(2)).round(2)
    assert inputs.X is not None and inputs.W_O is not None
    np.testing.assert_array_equal(inputs.X[0], X)  # rtol 0: written exactly
    for got, want in zip((inputs.W_Q, inputs.W_K, inputs.W_V), W, strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(inputs.W_O, W_O)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--tokens", "I,like,green,tea", "--kv-heads", "1", "--w-o"],
        ["--batch", "2", "--causal", "--seed", "3"],
    ],
)
def test_npz_holds_the_same_fixture_as_yaml(tmp_path: Path, args: list[str]) -> None:
    as_yaml = made(tmp_path / "f.yaml", *args)
    as_npz = made(tmp_path / "f.npz", *args)
    with np.load(as_npz, allow_pickle=False) as archive:  # plain arrays, nothing pickled
        assert "X" in archive.files and archive["X"].dtype == np.float64
    a, b = load_fixture(as_yaml), load_fixture(as_npz)
    assert (a.tokens, a.heads, a.kv_heads, a.causal) == (b.tokens, b.heads, b.kv_heads, b.causal)
    assert (a.name, a.description) == (b.name, b.description)
    traces = [run_cli("trace", str(p), "-f", "json") for p in (as_yaml, as_npz)]
    assert all(t.exit_code == 0 for t in traces)
    assert json.loads(traces[0].stdout)["stages"] == json.loads(traces[1].stdout)["stages"]


@pytest.mark.slow
def test_a_big_npz_is_written_fast(tmp_path: Path) -> None:
    start = time.perf_counter()
    target = made(
        tmp_path / "big.npz",
        "--seq",
        "256",
        "--d-model",
        "1024",
        "--d-k",
        "64",
        "--heads",
        "16",
        "-q",
    )
    seconds = time.perf_counter() - start
    assert seconds < 5, seconds  # the YAML route took 25 s (issue 14)
    assert load_fixture(target).X is not None


@pytest.mark.parametrize("name", ["mine.yaml", "my lecture.yml", "a'quote.yaml", "x.npz"])
def test_the_comment_names_the_real_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_cli("new", name)
    assert result.exit_code == 0, result.output
    import shlex

    if name.endswith(".npz"):
        assert f"attn trace {name} --explain" in result.stderr
        return
    second = (tmp_path / name).read_text(encoding="utf-8").splitlines()[1]
    assert second == f"#   attn trace {shlex.quote(name)} --explain"
    assert "THIS_FILE" not in (tmp_path / name).read_text(encoding="utf-8")


def test_force_replaces_even_a_write_protected_file(tmp_path: Path) -> None:
    target = tmp_path / "mine.yaml"
    target.write_text("keep me\n")
    os.chmod(target, 0o444)
    refused = run_cli("new", str(target))
    assert refused.exit_code == 2 and "already exists" in refused.stderr
    forced = run_cli("new", str(target), "--force")
    assert forced.exit_code == 0, forced.output
    assert load_fixture(target).seq_q == 5
