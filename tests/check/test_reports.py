"""What ``attn check`` reports, for people and for CI: names, numbers, goldens, JUnit, GitHub.

Issue 14 ("Command-line conventions": ``attn check -``, plural agreement, worst-cell digits,
``--golden-dir`` collisions; "CI reports the way CI systems read them": JUnit and GitHub).
"""

from __future__ import annotations

import json
import math
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, ROOT, run_cli

from attn_cli.present.report import fmt_pair, plural

CAT = FIXTURES / "the_cat_sat.yaml"
# One query, one key, d = 1, scale 1: scores = 1.1 * 1.1 = 1.2100000000000002 in float64.
TINY = {
    "tokens": ["t"],
    "Q": [[1.1]],
    "K": [[1.1]],
    "V": [[1.0]],
    "scale": 1,
    "expected": {"scores": [[1.3]]},
}
SAME = {**TINY, "expected": {"scores": [[1.1 * 1.1]]}}


def write(path: Path, fixture: dict[str, Any]) -> Path:
    path.write_text(json.dumps(fixture), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# People's report: names, plurals, digits


def test_check_from_stdin_is_named_stdin_as_trace_names_it() -> None:
    result = run_cli("check", "-", input=json.dumps(SAME))
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "same: <stdin> matches its expected section (1 stage, rtol 1e-09, atol 1e-12)\n"
    )
    differs = run_cli("check", "-", "-f", "json", input=json.dumps(TINY))
    assert differs.exit_code == 1
    assert json.loads(differs.stdout)["fixtures"][0]["fixture"] == "<stdin>"


def test_counts_agree_with_their_nouns(tmp_path: Path) -> None:
    assert (plural(1, "stage"), plural(2, "stage"), plural(1_000, "cell")) == (
        "1 stage",
        "2 stages",
        "1,000 cells",
    )
    result = run_cli("check", str(write(tmp_path / "tiny.json", TINY)), "-f", "plain")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-1].endswith(
        "tiny.json: 1 of 1 stage differs from its expected section; first: scores"
    )
    assert "1 stages" not in result.stdout


def test_worst_cells_show_6_significant_digits_and_json_keeps_them_all(tmp_path: Path) -> None:
    fixture = str(write(tmp_path / "tiny.json", TINY))
    table = run_cli("check", fixture, "-f", "plain")
    assert table.exit_code == 1
    assert re.search(r"^0\s+0 t\s+0 t\s+1\.3\s+1\.21\s+9\.000e-02", table.stdout, re.M)
    assert "1.2100000000000002" not in table.stdout
    report = json.loads(run_cli("check", fixture, "-f", "json").stdout)
    cell = report["fixtures"][0]["stages"][0]["worst"][0]
    assert cell["actual"] == 1.1 * 1.1 and cell["expected"] == 1.3  # full float64


@pytest.mark.parametrize(
    ("expected", "actual", "shown"),
    [
        (-0.96, -0.9600000000000001, ("-0.96", "-0.9600000000000001")),  # apart only at 16
        (-0.96, -0.95, ("-0.96", "-0.95")),
        (2.0, 2.001, ("2", "2.001")),
        (2.0, 2.000000001, ("2", "2.000000001")),  # more digits only as needed
        (123456.789, 123457.0, ("123456.8", "123457")),
        (1e-7, 1.5e-7, ("1e-07", "1.5e-07")),
        (-0.0, 1.0, ("0", "1")),  # never -0
        (math.inf, -math.inf, ("inf", "-inf")),
        (math.nan, 1.0, ("nan", "1")),
    ],
)
def test_fmt_pair(expected: float, actual: float, shown: tuple[str, str]) -> None:
    assert fmt_pair(expected, actual) == shown


def test_json_syntax_errors_are_whole_sentences(tmp_path: Path) -> None:
    broken = tmp_path / "ctl.json"
    broken.write_text('{"tokens": ["a\tb"], "Q": [[1]]}')
    result = run_cli("trace", str(broken))
    assert result.exit_code == 2
    assert " at)" not in result.stderr and "(Invalid control character at" not in result.stderr


# ---------------------------------------------------------------------------------------------
# --golden-dir: keyed on the path under --root


@pytest.fixture
def course(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """week1/example.yaml and week2/example.yaml, different fixtures with one file name."""
    for week, source in (("week1", "the_cat_sat.yaml"), ("week2", "causal_multihead.yaml")):
        (tmp_path / week).mkdir()
        (tmp_path / week / "example.yaml").write_bytes((FIXTURES / source).read_bytes())
    (tmp_path / "golden").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_same_file_name_in_two_folders_gets_two_goldens(course: Path) -> None:
    fixtures = ["week1/example.yaml", "week2/example.yaml", "the_cat_sat"]
    made = run_cli("check", *fixtures, "--golden-dir", "golden", "--update")
    assert made.exit_code == 0, made.output
    found = sorted(str(p.relative_to(course)) for p in (course / "golden").rglob("*.json"))
    assert found == [
        "golden/the_cat_sat.json",
        "golden/week1/example.json",
        "golden/week2/example.json",
    ]
    week2 = json.loads((course / "golden/week2/example.json").read_text())
    assert week2["stages"]["softmax"]["shape"][0] == 2  # causal_multihead's, not the cat's
    same = run_cli("check", *fixtures, "--golden-dir", "golden", "-f", "plain")
    assert same.exit_code == 0, same.output
    assert "same: week2/example.yaml matches golden/week2/example.json" in same.stdout


def test_root_chooses_what_paths_are_relative_to(course: Path) -> None:
    made = run_cli(
        "check",
        str(course / "week1/example.yaml"),
        "--golden-dir",
        "golden",
        "--root",
        "week1",
        "--update",
    )
    assert made.exit_code == 0, made.output
    assert (course / "golden" / "example.json").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["/etc/hostname.yaml", "--golden-dir", "golden"],
            "/etc/hostname.yaml: --golden-dir: is outside the root folder",
        ),
        (
            ["-", "--golden-dir", "golden"],
            "<stdin>: --golden-dir: standard input has no name to give a golden file",
        ),
        (["week1/example.yaml", "--root", "week1"], "--root: given without --golden-dir"),
        (
            ["week1/example.yaml", "--golden-dir", "golden", "--root", "nope"],
            "nope: --root: is not a directory",
        ),
    ],
)
def test_golden_dir_refusals(course: Path, args: list[str], message: str) -> None:
    result = run_cli("check", *args)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: {message}")


def test_a_golden_where_attn_0_1_kept_it_is_named(course: Path) -> None:
    old = course / "golden" / "example.json"
    made = run_cli("check", "week1/example.yaml", "--golden", str(old), "--update")
    assert made.exit_code == 0
    result = run_cli("check", "week1/example.yaml", "--golden-dir", "golden")
    assert result.exit_code == 2
    assert "golden/week1/example.json: --golden-dir: no such golden file, but" in result.stderr
    assert "'golden/example.json' is where attn 0.1 kept it" in result.stderr


def test_check_help_says_how_goldens_are_keyed() -> None:
    result = run_cli("check", "--help", env={"COLUMNS": "200"})
    assert result.exit_code == 0
    unwrapped = " ".join(result.stdout.split())  # Click wraps help at the terminal's width
    assert "week1/cat.yaml -> DIR/week1/cat.json" in unwrapped
    assert "--root" in result.stdout


# ---------------------------------------------------------------------------------------------
# JUnit XML


HOSTILE_TOKENS = ["]]>", "\u202e", "<b>&amp;\x1b[31m"]


def hostile_fixture(folder: Path) -> Path:
    """A fixture whose file name and tokens hold XML's and terminals' special characters."""
    fixture = {
        "tokens": HOSTILE_TOKENS,
        "Q": [[1, 0], [0, 1], [1, 1]],
        "K": [[1, 0], [0, 1], [1, 1]],
        "V": [[1, 0], [0, 1], [0, 0]],
        "scale": 1,
        "expected": {"scores": [[1, 0, 1], [0, 1, 1], [1, 1, 3]]},  # [2][2] is 2
    }
    return write(folder / 'we<ird>&"\x1b,na:me%.json', fixture)


def junit(*args: str) -> ET.Element:
    result = run_cli("check", *args, "--format", "junit")
    assert result.exit_code in (0, 1, 2), result.output
    assert result.stdout.startswith('<?xml version="1.0" encoding="UTF-8"?>\n')
    return ET.fromstring(result.stdout.encode("utf-8"))


def test_junit_one_suite_one_case_per_fixture_and_stage(tmp_path: Path) -> None:
    golden = tmp_path / "golden"
    golden.mkdir()
    paths = [str(FIXTURES / "the_cat_sat.yaml"), str(FIXTURES / "causal_multihead.yaml")]
    where = ("--golden-dir", str(golden), "--root", str(FIXTURES))
    assert run_cli("check", *paths, *where, "--update").exit_code == 0
    doc = json.loads((golden / "causal_multihead.json").read_text())
    doc["stages"]["Q"]["data"][0][0][0] += 1e-3
    doc["stages"]["scores"]["data"][1][2][0] += 0.5
    (golden / "causal_multihead.json").write_text(json.dumps(doc))
    root = junit(*paths, *where)
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 1
    cases = suites[0].findall("testcase")
    names = [(c.get("classname"), c.get("name")) for c in cases]
    assert names[:8] == [
        (paths[0], s) for s in ("X", "Q", "K", "V", "scores", "scaled", "softmax", "output")
    ]
    assert len(cases) == 8 + 11 and all(c.get("file") in paths for c in cases)
    failures = [c for c in cases if c.find("failure") is not None]
    assert suites[0].get("tests") == "19" and suites[0].get("failures") == str(len(failures))
    assert failures[0].get("name") == "Q"
    first = failures[0].find("failure")
    assert first is not None and (first.get("message") or "").startswith("Q differs first: ")
    assert "worst cells (head, query, d_k):" in (first.text or "")
    assert "[head 0, query 0 I, d_k 0]: golden 2.001, trace 2" in (first.text or "")
    later = failures[1].find("failure")
    assert later is not None and "(the first stage that differs is Q)" in later.get("message", "")


def test_junit_survives_hostile_names_and_tokens(tmp_path: Path) -> None:
    fixture = hostile_fixture(tmp_path)
    root = junit(str(fixture))
    case = next(c for c in root.iter("testcase") if c.find("failure") is not None)
    assert case.get("classname") == str(fixture).replace("\x1b", "\\x1b")  # printable
    text = case.find("failure").text or ""  # type: ignore[union-attr]
    assert "query 2 <b>&amp;\\x1b[31m, key 2 <b>&amp;\\x1b[31m]" in text  # read back as written
    assert "\x1b" not in ET.tostring(root, "unicode")


def test_junit_reports_a_fixture_that_cannot_be_checked(tmp_path: Path) -> None:
    root = junit(str(tmp_path / "missing.yaml"))
    (case,) = root.iter("testcase")
    error = case.find("error")
    assert error is not None and "no such file" in error.get("message", "")
    assert root.get("errors") == "1"


# ---------------------------------------------------------------------------------------------
# GitHub Actions annotations


def unescape_data(text: str) -> str:
    return text.replace("%0A", "\n").replace("%0D", "\r").replace("%25", "%")


def unescape_property(text: str) -> str:
    return unescape_data(text.replace("%3A", ":").replace("%2C", ","))


def workflow_commands(stdout: str) -> list[tuple[dict[str, str], str]]:
    """Each ``::error k=v,...::message`` line as (properties, message), unescaped."""
    out = []
    for line in stdout.splitlines():
        if not line.startswith("::"):
            continue
        match = re.fullmatch(r"::error(?: ([^:]*))?::(.*)", line)
        assert match, line
        props = dict(p.split("=", 1) for p in (match.group(1) or "").split(",") if p)
        out.append(
            ({k: unescape_property(v) for k, v in props.items()}, unescape_data(match.group(2)))
        )
    return out


def test_github_annotations_escaped_as_the_toolkit_escapes(tmp_path: Path) -> None:
    fixture = hostile_fixture(tmp_path)
    result = run_cli("check", str(fixture), str(CAT), "-f", "github")
    assert result.exit_code == 2  # the cat has no expected section: an error
    found = workflow_commands(result.stdout)
    assert len(found) == 2
    (props, message), (cat_props, cat_message) = found
    assert props["file"] == str(fixture).replace("\x1b", "\\x1b")  # , : % survive the trip
    assert props["title"].endswith(": scores differs first")
    assert message.startswith("DIFFERENT: ") and "\n" in message  # several lines, one command
    assert "[head 0, query 2 <b>&amp;\\x1b[31m, key 2 <b>&amp;\\x1b[31m]: expected 3, trace 2" in (
        message
    )
    assert cat_props == {"file": str(CAT), "title": f"attn check: {CAT}: error"}
    assert "no expected section" in cat_message
    # no other line can be taken for a workflow command
    others = [line for line in result.stdout.splitlines() if not line.startswith("::error")]
    assert others and not any(line.startswith("::") for line in others)


def test_github_annotations_for_a_bundled_name_have_no_file() -> None:
    result = run_cli("check", "the_cat_sat", "-f", "github")
    assert result.exit_code == 2
    ((props, _),) = workflow_commands(result.stdout)
    assert "file" not in props


def test_no_annotation_when_all_is_the_same(tmp_path: Path) -> None:
    result = run_cli("check", str(write(tmp_path / "same.json", SAME)), "-f", "github")
    assert result.exit_code == 0
    assert result.stdout.startswith("same: ") and "::" not in result.stdout
    assert os.path.exists(tmp_path / "same.json")


def test_the_fixture_format_says_check_compares_expected() -> None:
    text = (ROOT / "docs" / "fixture-format.md").read_text(encoding="utf-8")
    section = text.split("\n## expected\n", 1)[1].split("\n## ", 1)[0]
    assert "later feature" not in text
    assert "`attn check FIXTURE`" in section and "compares the trace with it" in section
