"""``attn check`` against golden files and ``expected`` sections: exit code first, then output.

Numbers are worked by hand from the fixtures written here, never taken from the code under test.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import BUNDLED_PATHS, FIXTURES, run_cli

from attn_cli.check.compare import GOLDEN_TOLERANCE, Tolerance, cell_errors, write_golden
from attn_cli.cli import options as cli
from attn_cli.present.report import fmt_error, fmt_value

ANSI = re.compile(r"\x1b\[")


# "The cat sat" in projection mode: Q = X·W_Q = [[2, 0], [0, 4], [2, 2]] by hand.
CAT = {
    "tokens": ["The", "cat", "sat"],
    "X": [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]],
    "W_Q": [[1, 0], [0, 1], [1, 0], [0, 1]],
    "W_K": [[0, 1], [1, 0], [0, 0], [1, 1]],
    "W_V": [[1, 0], [0, 1], [1, 1], [0, 0]],
}


def write(path: Path, fixture: dict[str, Any]) -> Path:
    path.write_text(json.dumps(fixture))
    return path


def row(text: str, *cells: str) -> bool:
    """A line of a plain table holding these cells in order, separated by blanks."""
    return re.search(r"^\s*" + r"\s+".join(map(re.escape, cells)) + r"\s*$", text, re.M) is not None


# ---------------------------------------------------------------------------------------------
# The rule


def test_tolerance_rule_is_atol_plus_rtol_times_expected() -> None:
    tol = Tolerance(rtol=1e-3, atol=1e-6)
    expected = np.array([100.0, 100.0, 0.0, 0.0])
    actual = np.array([100.05, 100.2, 5e-7, 5e-6])  # allowed: 0.100001, 0.100001, 1e-6, 1e-6
    bad, abs_err, rel_err = cell_errors(actual, expected, tol)
    assert bad.tolist() == [False, True, False, True]
    np.testing.assert_allclose(abs_err, [0.05, 0.2, 5e-7, 5e-6], rtol=1e-9)
    np.testing.assert_allclose(rel_err[:2], [5e-4, 2e-3], rtol=1e-9)
    assert rel_err[2] == math.inf  # relative to an expected 0


def test_report_numbers_never_show_negative_zero() -> None:
    assert (fmt_value(-0.0), fmt_value(-1e-300 * 1e-300), fmt_value(-0.5)) == ("0.0", "0.0", "-0.5")
    assert (fmt_value(-math.inf), fmt_value(math.nan), fmt_error(0.0)) == ("-inf", "nan", "0")


@pytest.mark.parametrize(
    ("actual", "expected", "differs"),
    [
        (math.inf, math.inf, False),
        (-math.inf, -math.inf, False),
        (math.nan, math.nan, False),
        (-math.inf, math.inf, True),
        (math.nan, 0.0, True),
        (0.0, math.nan, True),
        (-1e308, -math.inf, True),
        (math.inf, math.nan, True),
    ],
)
def test_non_finite_equals_only_the_same_non_finite(
    actual: float, expected: float, differs: bool
) -> None:
    bad, abs_err, _ = cell_errors(np.array([actual]), np.array([expected]), GOLDEN_TOLERANCE)
    assert bool(bad[0]) is differs
    assert abs_err[0] == (math.inf if differs else 0.0)


# ---------------------------------------------------------------------------------------------
# Golden files


def test_update_writes_a_golden_that_then_matches(tmp_path: Path) -> None:
    fixture = write(tmp_path / "cat.json", CAT)
    golden = tmp_path / "cat.golden.json"
    made = run_cli("check", str(fixture), "--golden", str(golden), "--update")
    assert made.exit_code == 0, made.output
    assert f"wrote {golden} (new; 8 stages" in made.stdout
    doc = json.loads(golden.read_text())
    assert doc["format"] == "attn-trace"
    assert doc["stages"]["Q"]["data"] == [[[2.0, 0.0], [0.0, 4.0], [2.0, 2.0]]]
    same = run_cli("check", str(fixture), "--golden", str(golden))
    assert same.exit_code == 0, same.output
    assert same.stdout == f"same: {fixture} matches {golden} (8 stages, rtol 1e-09, atol 1e-12)\n"
    again = run_cli("check", str(fixture), "--golden", str(golden), "--update")
    assert again.exit_code == 0
    assert "(unchanged;" in again.stdout


def test_a_weight_moved_by_1e_3_names_q_first_and_restoring_passes(tmp_path: Path) -> None:
    fixture = write(tmp_path / "cat.json", CAT)
    golden = tmp_path / "golden.json"
    assert run_cli("check", str(fixture), "--golden", str(golden), "--update").exit_code == 0

    nudged = json.loads(json.dumps(CAT))
    nudged["W_Q"][0][0] = 1.001  # Q[:, 0] moves by 1e-3 * X[:, 0] = [1e-3, 0, 1e-3]
    write(fixture, nudged)
    result = run_cli("check", str(fixture), "--golden", str(golden), "--format", "plain")
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert row(out, "X", "same", "0 of 12", "0", "0")
    # Q[0][0] = 2 -> 2.001: abs 1e-3, rel 5e-4; two of the six cells moved
    assert row(out, "Q", "different", "2 of 6", "1.000e-03", "5.000e-04")
    assert row(out, "K", "same", "0 of 6", "0", "0")
    assert row(out, "V", "same", "0 of 6", "0", "0")
    assert "Q differs first; its worst cells:" in out
    assert row(out, "head", "query", "d_k", "golden", "trace", "abs error", "rel error")
    # 6 significant digits in the table (2 and 2.001), full precision in the JSON report
    assert row(out, "0", "0 The", "0", "2", "2.001", "1.000e-03", "5.000e-04")
    assert out.rstrip().endswith("of 8 stages differ from " + str(golden) + "; first: Q")

    write(fixture, CAT)
    restored = run_cli("check", str(fixture), "--golden", str(golden))
    assert restored.exit_code == 0, restored.output


def test_missing_golden_is_trouble(tmp_path: Path) -> None:
    result = run_cli("check", "the_cat_sat", "--golden", str(tmp_path / "none.json"))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: {tmp_path / 'none.json'}: no such golden file")
    assert "--update" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "invalid JSON"),
        ('{"tokens": []}', "format: not a JSON trace"),
        ('{"format": "attn-trace", "version": 7, "stages": {}}', "version: is 7"),
        (
            '{"format": "attn-trace", "version": 1, "stages": {"scroes": {"data": [1]}}}',
            "stages.scroes: unknown stage",
        ),
        (
            '{"format": "attn-trace", "version": 1, "stages": {"X": {"data": [[1], [1, 2]]}}}',
            "rows of different lengths",
        ),
        (
            '{"format": "attn-trace", "version": 1, "stages": {"X": {"data": [["x"]]}}}',
            "stages.X.data: holds 'x'",
        ),
        (
            '{"format": "attn-trace", "version": 1, "stages": {"X": {"shape": [2], "data": [1]}}}',
            "is [2] but the data has shape [1]",
        ),
    ],
)
def test_unreadable_golden_is_trouble(tmp_path: Path, text: str, message: str) -> None:
    golden = tmp_path / "bad.json"
    golden.write_text(text)
    result = run_cli("check", "the_cat_sat", "--golden", str(golden))
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stderr.count("\n") == 1


def test_stage_missing_on_either_side_and_shape_differences_are_named(tmp_path: Path) -> None:
    golden = tmp_path / "golden.json"
    assert run_cli("check", "the_cat_sat", "--golden", str(golden), "--update").exit_code == 0
    doc = json.loads(golden.read_text())
    del doc["stages"]["V"]
    doc["stages"]["X"] = {"data": [[1.0, 0.0], [0.0, 2.0]]}  # [2, 2] where the trace has [3, 4]
    doc["stages"]["masked"] = {"data": doc["stages"]["scaled"]["data"]}  # no mask here
    golden.write_text(json.dumps(doc))
    result = run_cli("check", "the_cat_sat", "--golden", str(golden), "--format", "plain")
    assert result.exit_code == 1, result.output
    assert row(result.stdout, "X", "shape differs", "golden [2, 2], trace [3, 4]")
    assert row(result.stdout, "V", "not in golden")
    assert row(result.stdout, "masked", "not in trace")
    assert "3 of 9 stages differ" in result.stdout and "first: X" in result.stdout


def test_stage_option_limits_the_comparison(tmp_path: Path) -> None:
    fixture = write(tmp_path / "cat.json", CAT)
    golden = tmp_path / "golden.json"
    assert run_cli("check", str(fixture), "--golden", str(golden), "--update").exit_code == 0
    nudged = json.loads(json.dumps(CAT))
    nudged["W_Q"][0][0] = 1.001  # moves Q and what follows, never K or V
    write(fixture, nudged)
    result = run_cli("check", str(fixture), "--golden", str(golden), "-s", "K", "-s", "V")
    assert result.exit_code == 0, result.output
    assert "(2 stages," in result.stdout
    assert run_cli("check", str(fixture), "--golden", str(golden), "-s", "Q").exit_code == 1


def test_worst_cells_are_labelled_batch_head_query_key(tmp_path: Path) -> None:
    # 2 batch items x 2 heads, d = 1, two tokens: every stage is small enough to follow by hand
    fixture = write(
        tmp_path / "bh.json",
        {
            "tokens": ["a", "b"],
            "Q": [[[[1.0], [0.0]], [[2.0], [1.0]]], [[[0.0], [1.0]], [[1.0], [1.0]]]],
            "K": [[[[1.0], [0.0]], [[1.0], [2.0]]], [[[1.0], [1.0]], [[0.0], [3.0]]]],
            "V": [[[[1.0], [2.0]], [[3.0], [4.0]]], [[[5.0], [6.0]], [[7.0], [8.0]]]],
        },
    )
    golden = tmp_path / "golden.json"
    assert run_cli("check", str(fixture), "--golden", str(golden), "--update").exit_code == 0
    doc = json.loads(golden.read_text())
    cell = doc["stages"]["softmax"]["data"][1][1]  # batch 1, head 1: scores [[0, 3], [0, 3]]
    cell[0][1] += 0.01  # query 0 'a', key 1 'b'
    golden.write_text(json.dumps(doc))
    result = run_cli("check", str(fixture), "--golden", str(golden), "--format", "plain")
    assert result.exit_code == 1, result.output
    # golden e³/(1 + e³) + 0.01 = 0.962574 against 0.952574: rel error 0.01 / 0.962574
    assert row(result.stdout, "softmax", "different", "1 of 16", "1.000e-02", "1.039e-02")
    assert row(
        result.stdout, "batch", "head", "query", "key", "golden", "trace", "abs error", "rel error"
    )
    assert re.search(r"^1\s+1\s+0 a\s+1 b\s", result.stdout, re.M)

    report = json.loads(
        run_cli("check", str(fixture), "--golden", str(golden), "-f", "json").stdout
    )
    (softmax,) = [s for s in report["fixtures"][0]["stages"] if s["name"] == "softmax"]
    worst = softmax["worst"][0]
    assert worst["position"] == {"batch": "1", "head": "1", "query": "0 a", "key": "1 b"}
    assert worst["index"] == [1, 1, 0, 1]
    # softmax([0, 3 / √1]) = [1, e³] / (1 + e³)
    np.testing.assert_allclose(worst["actual"], math.exp(3) / (1 + math.exp(3)), rtol=1e-12)


def test_json_report_is_machine_readable(tmp_path: Path) -> None:
    fixture = write(tmp_path / "cat.json", CAT)
    golden = tmp_path / "golden.json"
    assert run_cli("check", str(fixture), "--golden", str(golden), "--update").exit_code == 0
    nudged = json.loads(json.dumps(CAT))
    nudged["W_V"][2][0] = 1.001  # V[:, 0] moves by 1e-3 * X[:, 2] = [1e-3, 0, 1e-3]
    write(fixture, nudged)
    result = run_cli("check", str(fixture), "--golden", str(golden), "--format", "json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["format"] == "attn-check" and report["exit_code"] == 1
    assert report["total"] == {"same": 0, "different": 1, "written": 0, "error": 0}
    (one,) = report["fixtures"]
    assert one["status"] == "different" and one["first_difference"] == "V"
    assert one["sides"] == {"expected": "golden", "actual": "trace"}
    assert (one["rtol"], one["atol"]) == (1e-9, 1e-12)
    by_name = {s["name"]: s for s in one["stages"]}
    assert [by_name[n]["status"] for n in ("X", "Q", "K", "V", "output")] == [
        "same",
        "same",
        "same",
        "different",
        "different",
    ]
    v = by_name["V"]
    assert (v["differing"], v["cells"]) == (2, 6)
    np.testing.assert_allclose(v["max_abs_error"], 1e-3, rtol=1e-9)
    assert by_name["scores"]["status"] == "same"  # V does not reach the scores


# ---------------------------------------------------------------------------------------------
# The fixture's own expected section

# Article example 2, unscaled: scores = Q·Kᵀ with Q = K = [[1,0],[0,1],[1,1]]; softmax row 0 is
# [e, 1, e] / (2e + 1) and row 2 is [1, 1, e] / (2 + e), rounded to 4 digits by hand.
EXPECTED = {
    "tokens": ["a", "b", "c"],
    "Q": [[1, 0], [0, 1], [1, 1]],
    "K": [[1, 0], [0, 1], [1, 1]],
    "V": [[1, 0], [0, 1], [0, 0]],
    "scale": 1,
    "expected": {
        "scores": [[1, 0, 1], [0, 1, 1], [1, 1, 2]],
        "softmax": [[[0.4223, 0.1554, 0.4223], [0.1554, 0.4223, 0.4223], [0.2119, 0.2119, 0.5761]]],
    },
}


def test_expected_section_with_and_without_the_head_axis(tmp_path: Path) -> None:
    fixture = write(tmp_path / "ex.json", EXPECTED)
    rounded = run_cli("check", str(fixture), "--format", "plain")
    assert rounded.exit_code == 1  # 4-digit values fail the float64-tight default
    assert row(rounded.stdout, "scores", "same", "0 of 9", "0", "0")
    assert "first: softmax" in rounded.stdout
    loose = run_cli("check", str(fixture), "--atol", "5e-5")
    assert loose.exit_code == 0, loose.output
    assert "matches its expected section (2 stages, rtol 1e-09, atol 5e-05)" in loose.stdout


def test_expected_section_non_finite_values(tmp_path: Path) -> None:
    causal = {"Q": [[1], [1]], "K": [[1], [1]], "V": [[1], [2]], "scale": 1, "causal": True}
    good = write(tmp_path / "good.json", {**causal, "expected": {"masked": [[1, "-inf"], [1, 1]]}})
    result = run_cli("check", str(good))
    assert result.exit_code == 0, result.output
    bad = write(tmp_path / "bad.json", {**causal, "expected": {"masked": [[1, "inf"], [1, 1]]}})
    result = run_cli("check", str(bad), "--format", "plain")
    assert result.exit_code == 1
    assert re.search(r"^0\s+0\s+1\s+inf\s+-inf\s+inf\s+inf\s*$", result.stdout, re.M)


def test_no_expected_section_and_no_golden_is_trouble() -> None:
    result = run_cli("check", "the_cat_sat")
    assert result.exit_code == 2
    assert "the_cat_sat.yaml: expected: the fixture has no expected section" in result.stderr


def test_expected_stage_the_trace_lacks_is_a_mismatch(tmp_path: Path) -> None:
    fixture = write(tmp_path / "ex.json", {**EXPECTED, "expected": {"concat": [[1, 0]]}})
    result = run_cli("check", str(fixture), "--format", "plain")
    assert result.exit_code == 1
    assert row(result.stdout, "concat", "not in trace")


# ---------------------------------------------------------------------------------------------
# Several fixtures


@pytest.mark.slow  # every bundled example traced twice (update, then check)
def test_golden_dir_checks_every_fixture_with_a_summary(tmp_path: Path) -> None:
    goldens = tmp_path / "golden"
    goldens.mkdir()
    paths = [str(p) for p in BUNDLED_PATHS]
    root = ("--root", str(FIXTURES))  # fixtures/x.yaml -> golden/x.json
    made = run_cli("check", *paths, "--golden-dir", str(goldens), *root, "--update")
    assert made.exit_code == 0, made.output
    assert sorted(p.name for p in goldens.iterdir()) == sorted(
        f"{p.stem}.json" for p in BUNDLED_PATHS
    )

    same = run_cli("check", *paths, "--golden-dir", str(goldens), *root, "--format", "plain")
    assert same.exit_code == 0, same.output
    lines = same.stdout.splitlines()
    assert len(lines) == len(BUNDLED_PATHS) + 1
    assert all(line.startswith("same: ") for line in lines[:-1])
    assert lines[-1] == f"{len(BUNDLED_PATHS)} fixtures: {len(BUNDLED_PATHS)} same, 0 different"

    doc = json.loads((goldens / "the_cat_sat.json").read_text())
    doc["stages"]["output"]["data"][0][0][0] += 1.0
    (goldens / "the_cat_sat.json").write_text(json.dumps(doc))
    one_differs = run_cli("check", *paths, "--golden-dir", str(goldens), *root, "--format", "plain")
    assert one_differs.exit_code == 1
    assert re.search(
        r"^DIFFERENT: .*the_cat_sat\.yaml: 1 of 8 stages differs .*first: output$",
        one_differs.stdout,
        re.M,
    )
    n = len(BUNDLED_PATHS)
    assert one_differs.stdout.rstrip().endswith(f"fixtures: {n - 1} same, 1 different")

    (goldens / "grouped_query.json").unlink()
    trouble = run_cli("check", *paths, "--golden-dir", str(goldens), *root, "--format", "plain")
    assert trouble.exit_code == 2  # trouble outranks a difference
    assert "grouped_query.json: no such golden file" in trouble.stderr
    assert re.search(r"^error: .*grouped_query\.yaml: ", trouble.stdout, re.M)
    assert trouble.stdout.rstrip().endswith(f"{n - 2} same, 1 different, 1 error")


def test_golden_dir_json_report_lists_each_fixture(tmp_path: Path) -> None:
    paths = [str(FIXTURES / "the_cat_sat.yaml"), str(FIXTURES / "causal_multihead.yaml")]
    where = ("--golden-dir", str(tmp_path), "--root", str(FIXTURES))
    assert run_cli("check", *paths, *where, "--update").exit_code == 0
    result = run_cli("check", *paths, *where, "-f", "json")
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert [f["status"] for f in report["fixtures"]] == ["same", "same"]
    assert [f["against"] for f in report["fixtures"]] == [
        str(tmp_path / "the_cat_sat.json"),
        str(tmp_path / "causal_multihead.json"),
    ]


# ---------------------------------------------------------------------------------------------
# Atomic update


def test_a_failed_update_leaves_the_old_golden_byte_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fixture = write(tmp_path / "cat.json", CAT)
    golden = tmp_path / "golden.json"
    assert run_cli("check", str(fixture), "--golden", str(golden), "--update").exit_code == 0
    before = golden.read_bytes()
    nudged = json.loads(json.dumps(CAT))
    nudged["W_Q"][0][0] = 5
    write(fixture, nudged)

    def fail(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "replace", fail)
    result = run_cli("check", str(fixture), "--golden", str(golden), "--update")
    assert result.exit_code == 2
    assert "--golden: cannot write (Input/output error)" in result.stderr
    assert golden.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cat.json", "golden.json"]


def test_an_update_interrupted_mid_write_leaves_the_old_golden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attn_cli import load_fixture, run

    golden = tmp_path / "golden.json"
    golden.write_text("the old golden\n")

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt  # as if killed between writing and renaming

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_golden(run(load_fixture(FIXTURES / "the_cat_sat.yaml")), golden)
    assert golden.read_text() == "the old golden\n"
    assert [p.name for p in tmp_path.iterdir()] == ["golden.json"]


# ---------------------------------------------------------------------------------------------
# Usage


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["a.json", "--golden", "g.json", "--against", "d.json"], "--golden and --against: given"),
        (["a.json", "b.json", "--golden", "g.json"], "one golden file for 2 fixtures"),
        (["a.json", "b.json", "--against", "d.json"], "one dump for 2 fixtures"),
        (["a.json", "--update"], "--update: nothing to update"),
        (["a.json", "--golden", "g.json", "--update", "-s", "Q"], "--update: given with --stage"),
        (["a.json", "--golden-dir", "no/such/dir"], "--golden-dir: is not a directory"),
        (["a.json", "--golden", "g.json", "-s", "sofmax"], "did you mean 'softmax'?"),
    ],
)
def test_usage_errors_are_one_line_exit_2(args: list[str], message: str) -> None:
    result = run_cli("check", *args)
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ")
    assert message in result.stderr
    assert result.stderr.count("\n") == 1


def test_golden_dir_keys_on_the_path_so_one_name_in_two_folders_does_not_collide(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "golden").mkdir()
    first = write(tmp_path / "cat.json", CAT)
    second = write(tmp_path / "a" / "cat.json", CAT)
    monkeypatch.chdir(tmp_path)
    made = run_cli("check", "cat.json", "a/cat.json", "--golden-dir", "golden", "--update")
    assert made.exit_code == 0, made.output
    assert sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "golden").rglob("*.json")) == [
        "golden/a/cat.json",
        "golden/cat.json",
    ]
    same = run_cli("check", str(first), str(second), "--golden-dir", "golden")
    assert same.exit_code == 0, same.output


def test_golden_dir_refuses_two_fixtures_with_one_golden(tmp_path: Path) -> None:
    first = write(tmp_path / "cat.json", CAT)
    second = tmp_path / "cat.yaml"
    second.write_text(json.dumps(CAT))
    result = run_cli(
        "check", str(first), str(second), "--golden-dir", str(tmp_path), "--root", str(tmp_path)
    )
    assert result.exit_code == 2
    assert "would share the golden" in result.stderr and "cat.json'" in result.stderr


def test_check_help_has_examples() -> None:
    result = run_cli("check", "--help")
    assert result.exit_code == 0
    assert "--golden-dir" in result.stdout and "--against" in result.stdout
    assert "attn check my.yaml -g golden/my.json --update" in result.stdout


# ---------------------------------------------------------------------------------------------
# Plain output: automatic off a terminal and under NO_COLOR, unless --color


def test_check_report_is_plain_when_piped_and_coloured_with_color(tmp_path: Path) -> None:
    fixture = write(tmp_path / "ex.json", EXPECTED)
    piped = run_cli("check", str(fixture))
    assert piped.exit_code == 1
    assert not ANSI.search(piped.stdout)
    *details, summary = piped.stdout.splitlines()
    assert all(line == line.rstrip() for line in details)
    assert max(len(line) for line in details) <= 100  # the summary line never wraps
    assert summary.startswith("DIFFERENT: ")
    forced = run_cli("check", str(fixture), "--color")
    assert forced.exit_code == 1
    assert ANSI.search(forced.stdout)


def test_trace_table_is_plain_when_piped_unless_color() -> None:
    piped = run_cli("trace")
    assert piped.exit_code == 0
    assert not ANSI.search(piped.stdout)
    assert all(line == line.rstrip() for line in piped.stdout.splitlines())
    assert piped.stdout == run_cli("trace", "--format", "plain").stdout
    forced = run_cli("trace", "--color")
    assert forced.exit_code == 0
    assert ANSI.search(forced.stdout)


class _Terminal:
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("no_color", "color", "plain"),
    [("", None, False), ("1", None, True), ("1", True, False), ("", False, False)],
)
def test_plain_on_a_terminal_follows_no_color_unless_color(
    monkeypatch: pytest.MonkeyPatch, no_color: str, color: bool | None, plain: bool
) -> None:
    monkeypatch.setattr(sys, "stdout", _Terminal())  # the one sys that cli reads
    monkeypatch.setenv("NO_COLOR", no_color)
    assert cli.plain_wanted(cli.Format.table, color) is plain
    assert cli.plain_wanted(cli.Format.plain, color) is True
