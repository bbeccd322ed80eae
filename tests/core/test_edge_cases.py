"""Issue 22, the core's part: the opt-in ``lse`` stage, a standard output that cannot encode,
windows past int64, non-finite block sizes in dumps, and report lines a token cannot start.

Numbers come from loops written here (math.exp/math.log for lse), or from the same fixture
without the window (a window at least as wide as the positions reach is plain causal attention).
"""

from __future__ import annotations

import codecs
import html
import io
import json
import math
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import FIXTURES, clean_env, run_attn, run_cli
from typer.testing import CliRunner

NEG = -math.inf
ATOL = 1e-12  # float64: the order of summation moves the last bits only


def close(actual: Any, desired: Any) -> None:
    """assert_allclose to ATOL (-inf equals -inf)."""
    np.testing.assert_allclose(np.asarray(actual, float), np.asarray(desired, float), 0.0, ATOL)


# ---------------------------------------------------------------------------------------------
# 1) lse, asked for by name: tables, JSON and npz, against log Σ exp written as loops

# batch 2, heads 2, seq 3, d_k 2; row 2 of batch 0 allows no key (mask), bias holds a -inf
Q = [
    [[[0.5, 1.0], [1.5, -0.5], [0.2, 0.3]], [[-1.0, 0.4], [0.7, 0.9], [1.1, -1.2]]],
    [[[0.3, -0.8], [2.0, 0.1], [-0.6, 0.6]], [[0.9, 0.9], [-0.2, 1.3], [0.4, -0.4]]],
]
K = [
    [[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [[0.5, -0.5], [-1.0, 2.0], [0.3, 0.3]]],
    [[[0.1, 0.2], [1.2, -0.3], [-0.7, 0.8]], [[2.0, 0.0], [0.0, -1.0], [1.0, 0.5]]],
]
ROWS = [[True, True, True], [True, False, True], [False, False, False]]
MASK = [[ROWS, ROWS], [[[True, False, False], [True, True, False], [True, True, True]]] * 2]
BIAS: list[list[Any]] = [[0, 0.5, "-inf"], [0.25, 0, 0], [0, 0, 0]]
SCALE = 0.5


def lse_fixture(sinks: list[float] | None = None) -> dict[str, Any]:
    fixture: dict[str, Any] = {
        "tokens": ["x", "y", "z"],
        "Q": Q,
        "K": K,
        "V": K,
        "mask": MASK,
        "bias": BIAS,
        "scale": SCALE,
    }
    if sinks is not None:
        fixture["sinks"] = sinks
    return fixture


def loop_lse(sinks: list[float] | None = None) -> list[list[list[float]]]:
    """lse[b][h][t] = log(Σ_s exp(masked[t, s]) + exp(sink_h)); -inf when nothing is allowed."""
    out = []
    for b in range(2):
        heads = []
        for h in range(2):
            rows = []
            for t in range(3):
                xs = []
                for s in range(3):
                    bias = NEG if BIAS[t][s] == "-inf" else float(BIAS[t][s])
                    if MASK[b][h][t][s] and bias != NEG:
                        dot = sum(Q[b][h][t][d] * K[b][h][s][d] for d in range(2))
                        xs.append(dot * SCALE + bias)
                if sinks is not None:
                    xs.append(sinks[h])  # the sink joins the row's sum
                if not xs:
                    rows.append(NEG)
                    continue
                m = max(xs)
                rows.append(m + math.log(sum(math.exp(x - m) for x in xs)))
            heads.append(rows)
        out.append(heads)
    return out


def _number(x: Any) -> float:
    return {"-inf": NEG, "inf": math.inf, "nan": math.nan}[x] if isinstance(x, str) else float(x)


def write_json(path: Path, fixture: dict[str, Any]) -> Path:
    path.write_text(json.dumps(fixture), encoding="utf-8")
    return path


@pytest.mark.parametrize("sinks", [None, [0.3, -1.5]])
def test_lse_in_json_is_log_sum_exp_of_the_masked_row(tmp_path: Path, sinks: Any) -> None:
    path = write_json(tmp_path / "lse.json", lse_fixture(sinks))
    result = run_cli("trace", str(path), "--stage", "lse", "-f", "json", "-q")
    assert result.exit_code == 0, result.output
    stage = json.loads(result.stdout)["stages"]["lse"]
    assert list(json.loads(result.stdout)["stages"]) == ["lse"]
    assert stage["axes"] == ["batch", "head", "query"] and stage["shape"] == [2, 2, 3]
    got = np.vectorize(_number)(np.array(stage["data"], dtype=object)).astype(float)
    close(got, loop_lse(sinks))
    if sinks is None:
        assert stage["data"][0][0][2] == stage["data"][0][1][2] == "-inf"  # nothing allowed
    else:
        close(got[0, :, 2], sinks)  # all of it to the sink


def test_lse_in_npz_is_log_sum_exp_of_the_masked_row(tmp_path: Path) -> None:
    path = write_json(tmp_path / "lse.json", lse_fixture())
    out = tmp_path / "out.npz"
    result = run_cli(
        "trace", str(path), "-s", "lse", "-s", "softmax", "-f", "npz", "-o", str(out), "-q"
    )
    assert result.exit_code == 0, result.output
    with np.load(out) as arrays:
        assert sorted(arrays.files) == ["lse", "softmax"]
        lse = arrays["lse"]
    close(lse, loop_lse())
    assert np.isneginf(lse[0, :, 2]).all()


def test_lse_as_a_table_shows_the_loop_numbers(tmp_path: Path) -> None:
    path = write_json(tmp_path / "lse.json", lse_fixture())
    result = run_cli("trace", str(path), "--stage", "lse", "-f", "plain", "-q")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "lse = log(Σ_keys exp(masked))" in text
    expected = loop_lse()
    for b in range(2):
        for h in range(2):
            shown = [f"{x:.4f}" for x in expected[b][h] if math.isfinite(x)]
            lines = [line for line in text.splitlines() if line.split()[:1] == [str(h)]]
            row = next(line for line in lines if all(s in line for s in shown))
            assert row.count("inf") == (3 - len(shown))


@pytest.mark.parametrize("fmt", ["markdown", "latex", "html"])
def test_lse_in_every_text_format_and_explained(tmp_path: Path, fmt: str) -> None:
    path = write_json(tmp_path / "lse.json", lse_fixture())
    result = run_cli("trace", str(path), "-s", "lse", "-f", fmt, "--explain", "-q")
    assert result.exit_code == 0, result.output
    assert f"{loop_lse()[1][0][1]:.4f}" in result.stdout


def test_lse_explained_keeps_lse_and_a_default_trace_leaves_it_out() -> None:
    from attn_cli.api import trace_file

    explained = run_cli("trace", "the_cat_sat", "-s", "lse", "--explain", "-f", "plain")
    assert explained.exit_code == 0, explained.output
    assert "lse ─" in explained.stdout and "what this step does" in explained.stdout
    assert "lse" not in trace_file("the_cat_sat").stages  # opt-in: unchanged by default
    assert "lse" in trace_file("the_cat_sat", stages=["lse"]).stages
    assert "lse" in trace_file("the_cat_sat", stages=["lse"], keep_all=True).stages


@pytest.mark.parametrize("example", ["the_cat_sat", "gptoss_sinks", "mistral_sliding_window"])
def test_every_fixture_has_lse_by_name(example: str) -> None:
    result = run_cli("trace", example, "--stage", "lse", "-f", "json", "-q")
    assert result.exit_code == 0, result.output
    assert list(json.loads(result.stdout)["stages"]) == ["lse"]


# ---------------------------------------------------------------------------------------------
# 2) A standard output that cannot encode attn's text: ASCII, never a traceback


def ascii_stream(errors: str = "surrogateescape") -> io.TextIOWrapper:
    """Standard output as ``LC_ALL=C PYTHONUTF8=0`` makes it."""
    return io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors=errors)


def written(stream: io.TextIOWrapper) -> bytes:
    stream.flush()
    raw = stream.buffer
    assert isinstance(raw, io.BytesIO)
    return raw.getvalue()


@pytest.mark.parametrize("errors", ["strict", "surrogateescape", "backslashreplace"])
def test_emit_writes_ascii_to_an_ascii_stdout(monkeypatch: pytest.MonkeyPatch, errors: str) -> None:
    from attn_cli.cli.output import emit

    stream = ascii_stream(errors)
    monkeypatch.setattr(sys, "stdout", stream)
    emit("masked = −∞ · √d_k → ╭─╮ │ é\n", None)
    assert written(stream) == b"masked = -inf * sqrtd_k -> +-+ | \\u00e9\n"


def test_the_fallback_is_readable_and_json_can_read_what_it_cannot_translate() -> None:
    from attn_cli.cli.output import ASCII_FALLBACK, JSON_FALLBACK

    text = '["−∞", "é", "中", "😀"]'
    readable = text.encode("ascii", errors=ASCII_FALLBACK).decode("ascii")
    assert readable == '["-inf", "\\u00e9", "\\u4e2d", "\\ud83d\\ude00"]'
    exact = text.encode("ascii", errors=JSON_FALLBACK).decode("ascii")
    assert json.loads(exact) == ["−∞", "é", "中", "😀"]
    assert codecs.lookup_error(JSON_FALLBACK) is not codecs.lookup_error(ASCII_FALLBACK)


def test_the_json_trace_to_an_ascii_stdout_keeps_every_token(tmp_path: Path) -> None:
    fixture = {
        "tokens": ["é−∞", "中", "😀"],
        "Q": [[1, 0], [0, 1], [1, 1]],
        "K": [[1, 0], [0, 1], [1, 1]],
        "V": [[1, 2], [3, 4], [5, 6]],
    }
    path = write_json(tmp_path / "t.json", fixture)
    result = CliRunner(charset="ascii").invoke(_app(), ["trace", str(path), "-f", "json"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stdout_bytes.isascii()
    doc = json.loads(result.stdout)
    assert doc["tokens"] == fixture["tokens"]
    assert doc["stages"]["Q"]["formula"] == "Q (given)"


TOKENS = ["é−∞", "中", "😀"]


@pytest.mark.parametrize(
    ("args", "read_back"),
    [
        (["decode", "FIXTURE", "-f", "json"], lambda out: json.loads(out)["tokens"]),
        (["flash", "FIXTURE", "-f", "json"], lambda out: json.loads(out)["tokens"]),
        (["trace", "FIXTURE", "-f", "html"], html.unescape),
        (["trace", "FIXTURE", "-f", "svg"], html.unescape),
        (["heatmap", "FIXTURE", "-f", "html"], html.unescape),
    ],
    ids=["decode-json", "flash-json", "trace-html", "trace-svg", "heatmap-html"],
)
def test_data_formats_to_an_ascii_stdout_keep_every_token_exactly(
    tmp_path: Path, args: list[str], read_back: Callable[[str], Any]
) -> None:
    """JSON gets \\uXXXX and HTML/SVG &#NNNN;: both read back as written, where the readable
    text fallback would turn − into - (a token changed)."""
    fixture = {
        "tokens": TOKENS,
        "causal": True,
        "Q": [[1, 0], [0, 1], [1, 1]],
        "K": [[1, 0], [0, 1], [1, 1]],
        "V": [[1, 2], [3, 4], [5, 6]],
    }
    path = write_json(tmp_path / "t.json", fixture)
    argv = [str(path) if a == "FIXTURE" else a for a in args]
    result = CliRunner(charset="ascii").invoke(_app(), argv)
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stdout_bytes.isascii()
    shown = read_back(result.stdout)
    for token in TOKENS:
        assert token in shown


@pytest.mark.parametrize(
    "args", [["trace"], ["trace", "--explain", "--lang", "zh"], ["check", "--help"], ["--help"]]
)
def test_an_ascii_stdout_in_process(args: list[str]) -> None:
    result = CliRunner(charset="ascii").invoke(_app(), args)
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stdout_bytes.isascii() and result.stdout.strip()


def _app() -> Any:
    from attn_cli.cli.app import app

    return app


def _golden_fixture(tmp_path: Path) -> tuple[Path, Path]:
    golden = tmp_path / "cat.json"
    made = run_cli("check", "the_cat_sat", "--golden", str(golden), "--update", "-q")
    assert made.exit_code == 0, made.output
    return FIXTURES / "the_cat_sat.yaml", golden


ASCII_RUNS = [
    ["trace"],
    ["trace", "-f", "json"],
    ["trace", "--explain", "--lang", "zh"],
    ["decode", "mistral_sliding_window"],
    ["decode", "gptoss_sinks", "-f", "json"],
    ["flash", "--explain"],
    ["check", "GOLDEN"],
    ["check", "GOLDEN", "-f", "junit"],
    ["--help"],
    ["trace", "--help"],
    ["decode", "--help"],
    ["flash", "--help"],
    ["check", "--help"],
]


@pytest.mark.subprocess
@pytest.mark.parametrize("args", ASCII_RUNS, ids=" ".join)
def test_lc_all_c_without_utf8_mode_is_no_traceback(tmp_path: Path, args: list[str]) -> None:
    if "GOLDEN" in args:
        fixture, golden = _golden_fixture(tmp_path)
        args = [a if a != "GOLDEN" else str(fixture) for a in args] + ["--golden", str(golden)]
    env = clean_env(LC_ALL="C", PYTHONUTF8="0")
    env.pop("PYTHONIOENCODING", None)  # the locale alone decides: ASCII, surrogateescape
    result = run_attn(*args, env=env)
    assert "Traceback" not in result.stderr and "Error" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr
    assert result.stdout.isascii() and result.stdout.strip()
    if "json" in args:
        json.loads(result.stdout)  # still JSON


# ---------------------------------------------------------------------------------------------
# 3) A window at least as wide as the positions reach is plain causal attention, even 2^64

HUGE = [2**63, 2**64, 10**30]
WINDOW_BASE = {
    "tokens": ["a", "b", "c", "d", "e"],
    "heads": 2,
    "kv_heads": 1,
    "causal": True,
    "Q": [
        [0.1, 0.9, -0.3, 0.4],
        [1.2, -0.7, 0.5, 0.2],
        [-0.4, 0.3, 0.8, -1.1],
        [0.6, 0.6, -0.2, 0.9],
        [-1.0, 0.2, 0.4, 0.1],
    ],
    "K": [[0.5, -0.2], [0.3, 0.8], [-0.9, 0.1], [0.2, 0.2], [1.1, -0.6]],
    "V": [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [-1.0, 2.0], [0.3, -0.3]],
    "rope": True,
    "sinks": [0.2, -0.5],
}


def window_fixtures(tmp_path: Path, window: int, suffix: str) -> tuple[Path, Path]:
    """The same fixture with ``window`` and without one (JSON text is YAML too)."""
    wide = tmp_path / f"wide{suffix}"
    plain = tmp_path / f"plain{suffix}"
    wide.write_text(json.dumps({**WINDOW_BASE, "window": window}), encoding="utf-8")
    plain.write_text(json.dumps(WINDOW_BASE), encoding="utf-8")
    assert str(window) in wide.read_text(encoding="utf-8")
    return wide, plain


def numbers(doc: Any) -> Any:
    """The numeric data of a JSON trace, dump or run, without formulas and configs."""
    if isinstance(doc, dict):
        return {k: numbers(v) for k, v in doc.items() if k not in ("formula", "config", "source")}
    if isinstance(doc, list):
        return [numbers(v) for v in doc]
    return _number(doc) if isinstance(doc, (int, float)) or doc in ("-inf", "inf") else doc


def json_of(*args: str) -> Any:
    result = run_cli(*args, "-f", "json", "-q")
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
@pytest.mark.parametrize("window", HUGE, ids=str)
def test_a_huge_window_traces_as_plain_causal(tmp_path: Path, window: int, suffix: str) -> None:
    wide, plain = window_fixtures(tmp_path, window, suffix)
    for extra in ([], ["--backward"]):
        a, b = json_of("trace", str(wide), *extra), json_of("trace", str(plain), *extra)
        assert a["config"]["window"] == window  # shown as given
        assert numbers(a["stages"]) == numbers(b["stages"])


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
@pytest.mark.parametrize("window", HUGE, ids=str)
def test_a_huge_window_decodes_and_flashes_as_plain_causal(
    tmp_path: Path, window: int, suffix: str
) -> None:
    wide, plain = window_fixtures(tmp_path, window, suffix)
    for prefill in ("1", "3"):
        a = json_of("decode", str(wide), "--prefill", prefill)
        b = json_of("decode", str(plain), "--prefill", prefill)
        for x, y in zip(a["steps"], b["steps"], strict=True):
            close(x["stages"]["output"]["data"], y["stages"]["output"]["data"])
        assert a["max_abs_diff"] <= 1e-12
    a, b = json_of("flash", str(wide)), json_of("flash", str(plain))
    for name in ("output", "lse"):
        close(a["stages"][name]["data"], b["stages"][name]["data"])


@pytest.mark.parametrize("window", HUGE, ids=str)
def test_a_huge_window_grades_a_plain_causal_dump(tmp_path: Path, window: int) -> None:
    wide, plain = window_fixtures(tmp_path, window, ".json")
    for command in ("decode", "flash"):
        dump = tmp_path / f"{command}.json"
        dump.write_text(run_cli(command, str(plain), "-f", "json", "-q").stdout, encoding="utf-8")
        result = run_cli("check", str(wide), "--against", str(dump))
        assert result.exit_code == 0, (result.output, result.exception)
    result = run_cli("check", str(wide), "--against", str(tmp_path / "flash.json"), "-f", "json")
    assert json.loads(result.stdout)["fixtures"][0]["status"] == "same"


def test_window_reach_is_exact_at_int64_extremes() -> None:
    from attn_cli.core.plugins.allowed import window_reach

    pos = np.array([0, 2**62, 2**63 - 1], dtype=np.int64)
    assert window_reach(10**30, pos, pos) == 2**63  # one more than the widest gap: no wrap
    assert window_reach(3, pos, pos) == 3
    assert window_reach(2**64, np.array([0]), np.array([5])) == 1  # keys after the query


# ---------------------------------------------------------------------------------------------
# 4) prefill, block_q, block_k and base2 in a decode or flash dump: one line, exit 2


@pytest.fixture(scope="module")
def dumps() -> dict[str, Any]:
    return {
        c: json.loads(run_cli(c, "mistral_sliding_window", "-f", "json", "-q").stdout)
        for c in ("decode", "flash")
    }


WHOLE_BAD = [math.nan, math.inf, -math.inf, -1, 0, 1e300, 2**70, -(2**70), 2.5, True, False, "3"]


def _check_refused(path: Path, field: str) -> None:
    result = run_cli("check", "mistral_sliding_window", "--against", str(path))
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {path}: {field}"), lines
    assert "expected" in lines[0] and "Traceback" not in result.output


DUMP_FIELDS = [("decode", "prefill"), ("flash", "block_q"), ("flash", "block_k")]


@pytest.mark.parametrize("value", WHOLE_BAD, ids=repr)
@pytest.mark.parametrize(("command", "field"), DUMP_FIELDS)
def test_a_bad_block_or_prefill_in_a_json_dump_is_one_line(
    tmp_path: Path, dumps: dict[str, Any], command: str, field: str, value: Any
) -> None:
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({**dumps[command], field: value}), encoding="utf-8")
    _check_refused(path, field)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0.0, -3.0, 0.5, 1e300, 2.0**70])
@pytest.mark.parametrize("field", ["prefill", "block_q", "block_k", "base2"])
def test_a_bad_block_or_prefill_in_an_npz_dump_is_one_line(
    tmp_path: Path, dumps: dict[str, Any], field: str, value: float
) -> None:
    if field == "prefill":
        steps = dumps["decode"]["steps"]
        arrays = {"decode_output": np.array([s["stages"]["output"]["data"] for s in steps])}
    else:
        stages = dumps["flash"]["stages"]
        arrays = {n: np.array(stages[n]["data"], dtype=float) for n in ("output", "lse")}
    if field == "base2" and value in (0.0,):
        return  # false: a valid flag
    path = tmp_path / "dump.npz"
    savez: Any = np.savez
    savez(path, **arrays, **{field: np.array(value)})
    _check_refused(path, field)


@pytest.mark.parametrize("value", [math.nan, 2, "false", [True]])
def test_base2_must_be_a_flag(tmp_path: Path, dumps: dict[str, Any], value: Any) -> None:
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({**dumps["flash"], "base2": value}), encoding="utf-8")
    _check_refused(path, "base2")


TILE_BAD = [
    ("head", math.nan),
    ("batch", -1),
    ("head", 2**80),
    ("q_block", [0, math.inf]),
    ("k_block", [0.5, 2]),
]


@pytest.mark.parametrize(("key", "value"), TILE_BAD)
def test_a_bad_tile_place_is_one_line(
    tmp_path: Path, dumps: dict[str, Any], key: str, value: Any
) -> None:
    doc = json.loads(json.dumps(dumps["flash"]))
    doc["tiles"][0][key] = value
    path = tmp_path / "dump.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    _check_refused(path, f"tiles[0].{key}")


def test_good_dump_values_still_grade(tmp_path: Path, dumps: dict[str, Any]) -> None:
    for command, extra in (("decode", {"prefill": 1.0}), ("flash", {"block_q": 2.0})):
        path = tmp_path / f"{command}.json"
        path.write_text(json.dumps({**dumps[command], **extra}), encoding="utf-8")
        result = run_cli("check", "mistral_sliding_window", "--against", str(path))
        assert result.exit_code == 0, result.output


# ---------------------------------------------------------------------------------------------
# 5) No token starts a line of a report: JUnit, GitHub annotations, text and JSON

HOSTILE_TOKENS = ["a\n::warning::x", "b\r::error::y", "c\x1b[31m\x07\u2028\x85z"]


def hostile(tmp_path: Path) -> Path:
    fixture = {
        "tokens": HOSTILE_TOKENS,
        "Q": [[1, 0], [0, 1], [1, 1]],
        "K": [[1, 0], [0, 1], [1, 1]],
        "V": [[1, 2], [3, 4], [5, 6]],
        "expected": {"output": [[9, 9], [9, 9], [9, 9]]},
    }
    return write_json(tmp_path / "tok\n::warning::f.json", fixture)


def report(path: Path, fmt: str) -> str:
    result = run_cli("check", str(path), "-f", fmt, "--worst", "6")
    assert result.exit_code == 1, (result.output, result.exception)
    return result.stdout


def assert_no_line_is_a_token(text: str) -> None:
    assert "\r" not in text and "\x1b" not in text and "\u2028" not in text
    assert "\x85" not in text and "\x07" not in text
    for line in text.split("\n"):
        assert not line.lstrip().startswith(("::warning", "::error::y")), line


@pytest.mark.parametrize("fmt", ["junit", "github", "plain", "table"])
def test_a_token_starts_no_line_of_a_report(tmp_path: Path, fmt: str) -> None:
    text = report(hostile(tmp_path), fmt)
    assert_no_line_is_a_token(text)
    assert "a\\n::warning::x" in text  # escaped, still readable


def test_junit_failure_text_has_one_line_per_cell(tmp_path: Path) -> None:
    root = ET.fromstring(report(hostile(tmp_path), "junit"))
    failure = root.find("testsuite/testcase/failure")
    assert failure is not None and failure.text is not None
    cells = [line for line in failure.text.split("\n") if line.startswith("  [")]
    assert len(cells) == 6  # 6 worst cells, each on a line of its own
    assert "\n" not in failure.attrib["message"]
    case = root.find("testsuite/testcase")
    assert case is not None and "\n" not in case.attrib["classname"]


def test_github_annotations_are_one_command_each(tmp_path: Path) -> None:
    lines = report(hostile(tmp_path), "github").splitlines()
    commands = [line for line in lines if line.startswith("::")]
    assert len(commands) == 1 and commands[0].startswith("::error file=")
    assert all(line.startswith(("::error ", "DIFFERENT")) for line in lines), lines


def test_the_json_report_keeps_the_tokens_exactly(tmp_path: Path) -> None:
    doc = json.loads(report(hostile(tmp_path), "json"))
    worst = doc["fixtures"][0]["stages"][0]["worst"]
    assert {w["position"]["query"].split(" ", 1)[1] for w in worst} == set(HOSTILE_TOKENS)
