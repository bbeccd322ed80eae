"""The ``attn`` command as a user meets it: exit code first, then what was printed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import BUNDLED, FIXTURES, LINEAR, run_attn, run_cli

from attn_cli import __version__

ANSI = re.compile(r"\x1b\[")


def test_version() -> None:
    result = run_cli("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"attn {__version__}"


@pytest.mark.parametrize("args", [["--help"], ["trace", "--help"], ["examples", "--help"]])
def test_help_has_examples(args: list[str]) -> None:
    result = run_cli(*args)
    assert result.exit_code == 0
    assert "attn trace" in result.stdout


def test_no_arguments_shows_help() -> None:
    result = run_cli()
    assert "Usage" in result.output
    assert "trace" in result.output


def test_trace_default_is_the_cat_sat_with_every_stage() -> None:
    result = run_cli("trace", "--format", "plain")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "The cat sat" in out
    for stage in ("X", "Q", "K", "V", "scores", "scaled", "softmax", "output"):
        assert re.search(rf"^{stage} ─", out, re.M), stage
    # rows and columns are labelled with the tokens
    assert re.search(r"^The\s", out, re.M) and re.search(r"^cat\s", out, re.M)
    assert re.search(r"query\s+The\s+cat\s+sat", out)
    # scores worked by hand: Q = [[2,0],[0,4],[2,2]], K = [[0,1],[4,2],[2,2]]
    assert re.search(r"^sat\s+2\.0000\s+12\.0000\s+8\.0000", out, re.M)
    assert "masked" not in out  # no mask in this fixture: the stage is absent
    assert "1/√d_k" in out
    assert not ANSI.search(out)


def test_trace_by_bundled_name_and_by_path_agree() -> None:
    by_name = run_cli("trace", "article_example_2", "--format", "json")
    by_path = run_cli("trace", str(FIXTURES / "article_example_2.yaml"), "--format", "json")
    assert by_name.exit_code == 0 and by_path.exit_code == 0
    assert json.loads(by_name.stdout)["stages"] == json.loads(by_path.stdout)["stages"]


def test_article_example_2_softmax_row_2_is_the_corrected_one() -> None:
    result = run_cli("trace", "article_example_2", "--stage", "softmax", "--format", "plain")
    assert result.exit_code == 0
    # softmax([0, 1, 1]) = [1, e, e] / (1 + 2e) = [0.1554, 0.4223, 0.4223]; the article says 0.21
    assert re.search(r"0\.1554\s+0\.4223\s+0\.4223", result.stdout)
    assert "0.21 " not in result.stdout


@pytest.mark.parametrize("name", BUNDLED)
def test_json_trace_of_every_bundled_example_is_valid_and_laid_out(name: str) -> None:
    result = run_cli("trace", name, "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["format"] == "attn-trace" and doc["version"] == 1
    assert set(doc) >= {"name", "config", "tokens", "stages"}
    cfg, stages = doc["config"], doc["stages"]
    batch = [cfg["batch"]] if cfg["batch"] is not None else []
    H, Hkv, T, S = cfg["heads"], cfg["kv_heads"], cfg["seq_q"], cfg["seq_k"]
    expected_shapes = {
        "Q": [*batch, H, T, cfg["d_k"]],
        "K": [*batch, Hkv, S, cfg["d_k"]],
        "V": [*batch, Hkv, S, cfg["d_v"]],
        "scores": [*batch, H, T, S],
        "softmax": [*batch, H, T, S],
        "output": [*batch, H, T, cfg["d_v"]],
    }
    if name in LINEAR:  # no softmax: the weights the recurrence amounts to instead
        del expected_shapes["scores"], expected_shapes["softmax"]
        expected_shapes["implicit_weights"] = [*batch, H, T, S]
    for stage, shape in expected_shapes.items():
        assert stages[stage]["shape"] == shape, stage
        assert _shape_of(stages[stage]["data"]) == shape, stage
    if "concat" in stages:
        assert stages["concat"]["shape"] == [*batch, T, H * cfg["d_v"]]
    if "projected" in stages:
        assert stages["projected"]["shape"] == [*batch, T, cfg["d_out"]]
    # standard JSON: no NaN/Infinity literals, which json.loads would otherwise accept
    json.loads(result.stdout, parse_constant=_not_standard_json)


def _not_standard_json(literal: str) -> Any:
    raise AssertionError(f"{literal} is not standard JSON")


def _shape_of(data: Any) -> list[int]:
    shape: list[int] = []
    while isinstance(data, list):
        shape.append(len(data))
        data = data[0]
    return shape


def test_json_trace_is_byte_identical_across_runs() -> None:
    first = run_cli("trace", "causal_multihead", "--format", "json").stdout
    second = run_cli("trace", "causal_multihead", "--format", "json").stdout
    assert first == second


def test_json_writes_minus_inf_as_a_string() -> None:
    result = run_cli("trace", "causal_multihead", "--format", "json", "--stage", "masked")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert list(doc["stages"]) == ["masked"]
    # causal: query 0 may not see key 1
    assert doc["stages"]["masked"]["data"][0][0][1] == "-inf"


def test_stage_option_limits_tables() -> None:
    result = run_cli("trace", "--stage", "scores", "--stage", "softmax", "--format", "plain")
    assert result.exit_code == 0
    headings = re.findall(r"^(\w+) ─", result.stdout, re.M)
    assert headings == ["scores", "softmax"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["trace", "--stage", "sofmax"], "--stage sofmax: unknown stage (did you mean 'softmax'?)"),
        (["trace", "--stage", "masked"], "--stage masked: this fixture has no such stage"),
        (["trace", "no_such_example"], "no_such_example: no such file or bundled example"),
        (
            ["trace", "missing.yaml"],
            "missing.yaml: no such file, expected a .json, .yaml or .yml fixture file",
        ),
    ],
)
def test_usage_errors_are_one_line_exit_2(args: list[str], message: str) -> None:
    result = run_cli(*args)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("Error: ")
    assert message in result.stderr
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_fixture_error_names_file_field_and_expectation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("Q: [[1, 0]]\nK: [[1, 0]]\nV: [[1, 0]]\ncausual: true\n")
    result = run_cli("trace", str(bad))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: {bad}: causual: unknown key (did you mean 'causal'?)")
    assert "expected" in result.stderr


def test_stdin_json_and_yaml() -> None:
    text = (FIXTURES / "article_example_2.yaml").read_text()
    from_yaml = run_cli("trace", "-", "--format", "json", input=text)
    assert from_yaml.exit_code == 0, from_yaml.output
    doc = json.loads(from_yaml.stdout)
    as_json = json.dumps(
        {"Q": [[1, 0], [0, 1], [1, 1]], "K": [[1, 0], [0, 1], [1, 1]], "V": [[1], [2], [3]]}
    )
    from_json = run_cli("trace", "-", "--format", "json", input=as_json)
    assert from_json.exit_code == 0, from_json.output
    assert json.loads(from_json.stdout)["stages"]["scores"] == doc["stages"]["scores"]


def test_output_file_is_written_whole(tmp_path: Path) -> None:
    target = tmp_path / "trace.json"
    result = run_cli("trace", "--format", "json", "-o", str(target))
    assert result.exit_code == 0
    assert result.stdout == ""
    assert json.loads(target.read_text())["name"] == "The cat sat"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]  # no temporary left


def test_output_to_a_directory_is_an_error(tmp_path: Path) -> None:
    result = run_cli("trace", "--format", "json", "-o", str(tmp_path))
    assert result.exit_code == 2
    assert "is a directory" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_table_to_file_is_plain_text(tmp_path: Path) -> None:
    target = tmp_path / "trace.txt"
    result = run_cli("trace", "-o", str(target), "--color")
    assert result.exit_code == 0
    text = target.read_text()
    assert "softmax" in text and not ANSI.search(text)


def test_precision(tmp_path: Path) -> None:
    result = run_cli("trace", "--stage", "softmax", "--precision", "2", "--format", "plain")
    assert result.exit_code == 0
    # row "cat": scaled [2.8284, 5.6569, 5.6569] -> softmax [0.0287, 0.4856, 0.4856]
    assert re.search(r"^cat\s+0\.03\s+0\.49\s+0\.49\s*$", result.stdout, re.M)


def test_elides_big_matrices_and_full_shows_all() -> None:
    elided = run_cli(
        "trace", "pytorch_snippet", "--stage", "Q", "--format", "plain", "--width", "200"
    )
    assert elided.exit_code == 0
    assert "…" in elided.stdout
    assert not re.search(r"^ *query( +\S+){20}", elided.stdout, re.M)
    full = run_cli(
        "trace", "pytorch_snippet", "--stage", "Q", "--full", "--format", "plain", "--width", "1000"
    )
    assert full.exit_code == 0
    assert "…" not in full.stdout
    assert re.search(r"^ *query +0 +1 +2( +\d+){61} *$", full.stdout, re.M)


NUMBER_CROPPED = re.compile(r"[\d.-]…|…[\d.]")  # "0.1…" or "…57": a number Rich cut short


def wide_numbers_fixture(tmp_path: Path) -> Path:
    """12 keys whose scores are about 123456.789: ten wide columns per table at precision 4."""
    seq = 12
    Q = [[1000.0 + i, 123.456789] for i in range(seq)]
    K = [[123.456789 + j, 0.5 * j] for j in range(seq)]
    V = [[float(j), -float(j)] for j in range(seq)]
    path = tmp_path / "wide.json"
    tokens = [f"t{i}" for i in range(seq)]
    path.write_text(json.dumps({"tokens": tokens, "Q": Q, "K": K, "V": V, "scale": 1}))
    return path


@pytest.mark.parametrize("width", [40, 60, 80])
@pytest.mark.parametrize("heatmap", [False, True])
@pytest.mark.parametrize("fixture", ["pytorch_snippet", "wide numbers"])
def test_narrow_width_elides_columns_instead_of_cropping_numbers(
    tmp_path: Path, width: int, heatmap: bool, fixture: str
) -> None:
    path = str(wide_numbers_fixture(tmp_path)) if fixture == "wide numbers" else fixture
    shade = ["--heatmap"] if heatmap else []
    result = run_cli("trace", path, "--format", "plain", "--width", str(width), *shade)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= width
    tables = [line for line in lines if not line.startswith(("│", "╭", "╰"))]  # not the header
    assert not [line for line in tables if NUMBER_CROPPED.search(line)]
    if fixture == "wide numbers":
        # the first and the last key are kept; the middle ones give way to one "…" column
        assert re.search(r"^query +t0 .*….* t11 *$", result.stdout, re.M)
        assert re.search(r"^t0 +123456\.7890 ", result.stdout, re.M)


def test_full_at_a_narrow_width_shows_every_column_uncropped(tmp_path: Path) -> None:
    """Every column, none cut: in blocks of columns that fit the width (as NumPy wraps)."""
    result = run_cli(
        "trace",
        str(wide_numbers_fixture(tmp_path)),
        "--stage",
        "scores",
        "--full",
        "--format",
        "plain",
        "--width",
        "60",
    )
    assert result.exit_code == 0, result.output
    table = result.stdout.split("scores = Q·Kᵀ")[1]  # below the header (its path may be cut)
    assert "…" not in table
    shown = [
        j for header in re.findall(r"^ *query((?: +t\d+)+) *$", table, re.M) for j in header.split()
    ]
    assert shown == [f"t{j}" for j in range(12)]
    assert max(len(line) for line in result.stdout.splitlines()) <= 60


def test_hostile_token_text_prints_literally(tmp_path: Path) -> None:
    fixture = {
        "tokens": ["[bold red]x[/]", "\x1b]8;;http://evil\x1b\\link"],
        "Q": [[1.0], [0.0]],
        "K": [[1.0], [0.0]],
        "V": [[1.0], [2.0]],
    }
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(fixture))
    result = run_cli("trace", str(path), "--color", "--stage", "scores")
    assert result.exit_code == 0, result.output
    assert "[bold red]x[/]" in result.stdout
    assert "\x1b]8" not in result.stdout
    assert "\\x1b]8" in result.stdout


def test_fully_masked_row_warns_on_stderr(tmp_path: Path) -> None:
    fixture = {
        "tokens": ["a", "b"],
        "Q": [[1.0], [1.0]],
        "K": [[1.0], [1.0]],
        "V": [[1.0], [2.0]],
        "mask": [[False, False], [True, True]],
    }
    path = tmp_path / "empty_row.json"
    path.write_text(json.dumps(fixture))
    result = run_cli("trace", str(path), "--format", "json")
    assert result.exit_code == 0
    assert "Warning:" in result.stderr and "query 0 'a'" in result.stderr
    weights = json.loads(result.stdout)["stages"]["softmax"]["data"]
    assert weights[0][0] == [0.0, 0.0]  # exactly zero, never NaN
    assert weights[0][1] == [0.5, 0.5]


def test_examples_lists_every_bundled_fixture() -> None:
    result = run_cli("examples", env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for name in BUNDLED:
        assert name in result.stdout
    assert "(default)" in result.stdout


@pytest.mark.subprocess
def test_help_does_not_import_numpy_or_yaml() -> None:
    code = (
        "import sys\n"
        "from attn_cli.cli.app import main\n"
        "sys.argv = ['attn', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "bad = [m for m in ('numpy', 'yaml') if m in sys.modules]\n"
        "print('LOADED', bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "LOADED []" in out.stdout


@pytest.mark.subprocess
def test_python_dash_m_runs() -> None:
    out = run_attn("trace", "--stage", "softmax")
    assert out.returncode == 0, out.stderr
    assert "softmax" in out.stdout
    assert not ANSI.search(out.stdout)
