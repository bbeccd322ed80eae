"""``attn new`` writes a random commented fixture that loads and traces; ``attn examples --copy``
copies a bundled one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import FIXTURES, run_cli

from attn_cli.io.fixture import load_fixture
from attn_cli.io.new import WORDS, tokens_for


def test_new_writes_a_fixture_of_the_asked_shape_that_traces(tmp_path: Path) -> None:
    target = tmp_path / "mine.yaml"
    result = run_cli(
        "new",
        str(target),
        "--seq",
        "5",
        "--d-model",
        "8",
        "--d-k",
        "4",
        "--heads",
        "2",
        "--batch",
        "2",
        "--causal",
        "--seed",
        "0",
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert f"Wrote {target}" in result.stderr
    inputs = load_fixture(target)
    assert (inputs.batch, inputs.seq_q, inputs.d_model) == (2, 5, 8)
    assert (inputs.heads, inputs.d_k, inputs.d_v) == (2, 4, 4)
    assert inputs.causal == "upper-left" and inputs.has_batch
    assert inputs.tokens == ("The", "cat", "sat", "on", "my")
    text = target.read_text(encoding="utf-8")
    assert text.startswith("# A random fixture made by `attn new` (seed 0).")
    assert "   # cat" in text  # each row of X names its token
    assert "head 0 owns columns 0-3, head 1 owns columns 4-7" in text
    traced = run_cli("trace", str(target), "--format", "plain", "--explain")
    assert traced.exit_code == 0, traced.output
    assert "concat" in traced.stdout


def test_new_defaults_and_seeds(tmp_path: Path) -> None:
    # the same name in two folders: the file's own name is in its first comment
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    a, b, c = tmp_path / "one" / "a.yaml", tmp_path / "two" / "a.yaml", tmp_path / "c.yml"
    assert run_cli("new", str(a)).exit_code == 0
    assert run_cli("new", str(b), "--seed", "0").exit_code == 0
    assert run_cli("new", str(c), "--seed", "1").exit_code == 0
    assert a.read_bytes() == b.read_bytes()  # same seed, same fixture
    assert a.read_bytes() != c.read_bytes()
    inputs = load_fixture(a)
    assert (inputs.seq_q, inputs.d_model, inputs.heads, inputs.d_k) == (5, 8, 2, 4)
    assert not inputs.has_batch and inputs.causal is None
    data = yaml.safe_load(a.read_text(encoding="utf-8"))
    assert len(data["W_Q"]) == 8 and len(data["W_Q"][0]) == 8  # [d_model, heads*d_k]


def test_tokens_are_distinct_so_cells_can_be_named() -> None:
    tokens = tokens_for(len(WORDS) + 3)
    assert len(set(tokens)) == len(tokens)
    assert tokens[-1] == f"tok{len(WORDS) + 2}"


def test_new_refuses_to_overwrite_unless_forced(tmp_path: Path) -> None:
    target = tmp_path / "mine.yaml"
    target.write_text("keep me\n")
    result = run_cli("new", str(target))
    assert result.exit_code == 2
    assert (
        result.stderr == f"Error: {target}: already exists, expected a new file name, or --force\n"
    )
    assert target.read_text() == "keep me\n"
    assert run_cli("new", str(target), "--force").exit_code == 0
    assert load_fixture(target).seq_q == 5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["x.json"], "Error: x.json: FILE: is not a .yaml, .yml or .npz file, expected FILE.yaml"),
        (["no/such/dir/x.yaml"], "folder 'no/such/dir' does not exist"),
        (["x.yaml", "--heads", "0"], "Error: --heads: got 0, expected an integer from 1 to 16\n"),
    ],
)
def test_new_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_cli("new", *args)
    assert result.exit_code == 2
    assert message in result.stderr


def test_examples_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "copy.yaml"
    result = run_cli("examples", "--copy", "causal_multihead", str(target))
    assert result.exit_code == 0, result.output
    assert target.read_bytes() == (FIXTURES / "causal_multihead.yaml").read_bytes()
    assert run_cli("trace", str(target), "--format", "plain").exit_code == 0
    again = run_cli("examples", "--copy", "causal_multihead", str(target))
    assert again.exit_code == 2 and "already exists" in again.stderr
    monkeypatch.chdir(tmp_path)
    default = run_cli("examples", "--copy", "the_cat_sat")
    assert default.exit_code == 0
    assert (tmp_path / "the_cat_sat.yaml").read_bytes() == (
        FIXTURES / "the_cat_sat.yaml"
    ).read_bytes()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--copy", "nope", "x.yaml"],
            "Error: --copy nope: no such bundled example, expected one of",
        ),
        (["x.yaml"], "Error: x.yaml: FILE: given without --copy"),
    ],
)
def test_examples_copy_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_cli("examples", *args)
    assert result.exit_code == 2
    assert result.stderr.startswith(message)


def test_examples_still_lists_without_arguments() -> None:
    result = run_cli("examples")
    assert result.exit_code == 0
    assert "the_cat_sat" in result.stdout
