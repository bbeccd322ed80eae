"""Attacks on every option and every output (issue 15, round two).

Options: every option and argument of every command, found by introspecting the Typer app, is
fed Unicode digits, 400-digit and negative numbers, the empty string, NUL, a 100,000-character
string and terminal escapes. Each run ends in exit 2 with one ``Error:`` line (escaped), or in a
correct result: a number Python reads from Unicode digits gives the same output as its ASCII
spelling. No traceback, bounded time.

Outputs: every output format (table, plain, json, markdown, latex, html, svg, npz, marp slides,
decode and flash json, check's json, junit and github) is fed every dangerous character class in
the fixture's name, description and tokens (and, for check, in file names): ESC sequences, C0
and C1 controls, bidi overrides, zero-width characters, line separators, lone surrogates (only a
file name lets them through) and each format's markup. Nothing may come out raw: data formats
give the text back exactly (JSON, YAML and npz readers are the independent judges), text formats
show the escape, markup formats escape the markup (the raw ``q<q`` never appears).

Also here: writes onto a FIFO, the colour scale of a stage wider than float64, and float32 bias
overflow.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
import unicodedata
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer.main
from conftest import GOLDEN, Run, run_timed
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from attn_cli.cli.app import app

runner = CliRunner()
LIMIT = 10.0  # seconds after which a run counts as hung (cut off by a timer signal)
SLOW = 3.0  # seconds any single run may take


def attn(*args: str, limit: float = LIMIT) -> Run:
    """Run ``attn ARGS`` in-process; a run that hangs is cut off by a timer signal."""
    return run_timed(*args, limit=limit)


def raw_controls(text: str, allowed: str = "\n") -> list[str]:
    """The characters of ``text`` a terminal or viewer could act on or hide, as written."""
    return sorted({f"U+{ord(c):04X}" for c in text if not c.isprintable() and c not in allowed})


def assert_error(run: Run) -> None:
    """Exit 2 with exactly one ``Error:`` line, printable, and no traceback, in bounded time."""
    assert run.exception is None, f"escaped: {run.exception!r}"
    assert run.exit_code == 2, (run.exit_code, run.stdout[-300:], run.stderr[-300:])
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), run.stderr[-1000:]
    assert not raw_controls(run.stderr), raw_controls(run.stderr)
    assert "Traceback" not in run.stdout + run.stderr
    assert run.seconds < SLOW, run.seconds


def assert_fine(run: Run, codes: tuple[int, ...] = (0,)) -> None:
    """A normal result: one of ``codes``, no ``Error:`` line, no traceback, bounded time."""
    assert run.exception is None, f"escaped: {run.exception!r}"
    assert run.exit_code in codes, (run.exit_code, run.stdout[-300:], run.stderr[-300:])
    assert "Error:" not in run.stderr and "Traceback" not in run.stdout + run.stderr
    assert not raw_controls(run.stderr), raw_controls(run.stderr)
    assert run.seconds < SLOW, run.seconds


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each attack runs in its own empty folder, at a fixed width."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "100")
    yield tmp_path


# ---------------------------------------------------------------------------------------------
# Every option of every command


HOSTILE = {
    "arabic-digits": "١٢",
    "superscript-two": "²",
    "arabic-three": "٣",
    "400-digits": "9" * 400,
    "negative": "-1",
    "huge-negative": "-" + "9" * 400,
    "empty": "",
    "nul": "1\x002",
    "100k-chars": "x" * 100_000,
    "escapes": "\x1b]8;;http:x\x07\x9b2J\u202e",
}
# Python's int() and float() read these; attn's own index and size parsers must not.
UNICODE_NUMBERS = ("arabic-digits", "arabic-three")
ATTN_PARSED = {
    ("trace", "--focus"),
    ("trace", "--cell"),
    ("trace", "--max-memory"),
    ("heatmap", "--max-memory"),
    ("decode", "--max-memory"),
    ("flash", "--max-memory"),
}


@dataclass(frozen=True)
class Param:
    """One parameter that takes a value: an option (``--focus``) or an argument (``fixture``)."""

    command: str
    name: str
    argument: bool
    kind: str  # Click's name of its type: "integer range", "path", "text", ...

    @property
    def number(self) -> bool:
        return self.kind in ("integer", "float", "integer range", "float range")


def _value_params() -> list[Param]:
    """Every parameter that takes a value, of every command, read from the app itself: a new
    option is attacked without a word here."""
    group = typer.main.get_command(app)
    ctx = typer.Context(group)
    out = []
    for name in group.list_commands(ctx):  # type: ignore[attr-defined]
        for p in group.get_command(ctx, name).params:  # type: ignore[attr-defined]
            argument = p.param_type_name == "argument"
            if not argument and (p.is_flag or p.count):
                continue
            label = str(p.name) if argument else p.opts[0]
            out.append(Param(name, label, argument, p.type.name))
    return out


VALUE_PARAMS = _value_params()


def known_gap(param: Param, kind: str) -> str | None:
    """Why this attack still ends in a traceback, or None."""
    return None


def option_attacks() -> Iterator[Any]:
    for param in VALUE_PARAMS:
        for kind in HOSTILE:
            gap = known_gap(param, kind)
            marks = [pytest.mark.xfail(strict=True, reason=gap)] if gap else []
            yield pytest.param(param, kind, id=f"{param.command}-{param.name}-{kind}", marks=marks)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny GPT-2 style checkpoint folder, written by hand (8-byte length, JSON, data), and a
    hidden-state .npy for it: what `attn import` needs to get past its arguments."""
    import struct

    folder = tmp_path_factory.mktemp("ckpt")
    rng = np.random.default_rng(0)
    C, p = 4, "transformer.h.0."
    shapes = {
        "transformer.wte.weight": (5, C),
        "transformer.wpe.weight": (8, C),
        p + "attn.c_attn.weight": (C, 3 * C),
        p + "attn.c_attn.bias": (3 * C,),
        p + "attn.c_proj.weight": (C, C),
        p + "attn.c_proj.bias": (C,),
        p + "ln_1.weight": (C,),
        p + "ln_1.bias": (C,),
    }
    header, chunks, at = {}, [], 0
    for key, shape in shapes.items():
        data = rng.standard_normal(shape).astype("<f4").tobytes()
        header[key] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, at + len(data)]}
        chunks.append(data)
        at += len(data)
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(chunks))
    config = {
        "model_type": "gpt2",
        "n_embd": C,
        "n_head": 2,
        "n_layer": 1,
        "n_positions": 8,
        "vocab_size": 5,
        "layer_norm_epsilon": 1e-5,
    }
    (folder / "config.json").write_text(json.dumps(config))
    np.save(folder / "h.npy", rng.standard_normal((3, C)))
    return folder, folder / "h.npy"


def base_call(command: str, ckpt: tuple[Path, Path]) -> tuple[list[str], dict[str, str]]:
    """A call of ``command`` that works: its arguments and its options (flags with "")."""
    golden = str(GOLDEN / "the_cat_sat.json")
    calls: dict[str, tuple[list[str], dict[str, str]]] = {
        "trace": (["the_cat_sat"], {"--stage": "softmax"}),
        "check": (["the_cat_sat"], {"--golden": golden}),
        "examples": (["copy.yaml"], {"--copy": "the_cat_sat", "--force": ""}),
        "heatmap": (["the_cat_sat"], {}),
        "new": (["new.yaml"], {"--force": ""}),
        "decode": (["causal_multihead"], {}),
        "flash": (["the_cat_sat"], {}),
        "rope": (["llama31_rope_scaling"], {}),
        "probe": (["attn_cli.check.probe:reference"], {}),  # attn's reference, probed: matches
        "import": (
            [str(ckpt[0])],
            {"--hidden": str(ckpt[1]), "--output": "imp.npz", "--force": ""},
        ),
    }
    return calls[command]


# Options that make no sense beside one of the base call's: left out when attacking these.
CONFLICTS = {
    ("check", "--golden-dir"): "--golden",
    ("check", "--against"): "--golden",
    ("check", "--root"): "--golden",
    ("import", "--text"): "--hidden",
}


def hostile_call(param: Param, value: str, ckpt: tuple[Path, Path]) -> list[str]:
    """The base call of the command with ``value`` in place of ``param``."""
    positional, options = base_call(param.command, ckpt)
    options = {k: v for k, v in options.items() if k != CONFLICTS.get((param.command, param.name))}
    if param.argument:
        positional = [value]
    else:
        options[param.name] = value
    if (param.command, param.name) == ("check", "--root"):
        options["--golden-dir"] = "."
    flat = [x for k, v in options.items() for x in ((k,) if v == "" and k == "--force" else (k, v))]
    return [param.command, *flat, *positional]


@pytest.mark.parametrize(("param", "kind"), list(option_attacks()))
def test_every_option_fed_hostile_values(
    param: Param, kind: str, checkpoint: tuple[Path, Path]
) -> None:
    """One line and exit 2, or a correct result; never a traceback, a hang or a raw escape."""
    run = attn(*hostile_call(param, HOSTILE[kind], checkpoint))
    if run.exit_code == 2:
        assert_error(run)
        return
    assert_fine(run, (0, 1) if param.command in ("check", "probe") else (0,))
    if kind in UNICODE_NUMBERS:
        assert (param.command, param.name) not in ATTN_PARSED, "Unicode digits are not digits"
        if param.number:  # Python reads '١٢' as 12: then the result is that of '12'
            ascii_digits = "".join(str(unicodedata.decimal(c)) for c in HOSTILE[kind])
            same = attn(*hostile_call(param, ascii_digits, checkpoint))
            assert (same.exit_code, same.stdout) == (run.exit_code, run.stdout)


# ---------------------------------------------------------------------------------------------
# Every output format fed every dangerous character class

CLASSES = {
    "esc-csi": "\x1b[31m",
    "esc-osc8-link": "\x1b]8;;http:evil\x1b\\",
    "bel-bs-cr": "\x07\b\r",
    "newline-tab": "\n\t",
    "nul": "\x00",
    "del": "\x7f",
    "c1-csi": "\x9b",
    "c1-nel": "\x85",
    "bidi-override": "\u202e",
    "bidi-isolate": "\u2066\u2069",
    "rtl-mark": "\u200f",
    "zero-width-space": "\u200b",
    "bom": "\ufeff",
    "word-joiner": "\u2060",
    "line-separator": "\u2028",
    "markup": "Z<Z Z>Z Z&Z Z\\Z Z$Z Z%Z Z{Z Z}Z Z|Z Z#Z Z_Z Z^Z Z~Z Z`Z Z*Z Z[Z Z]Z Z\"Z Z'Z",
    "rich-markup": "[bold red]x[/] [link=http:evil]y[/link]",
}
# Raw in each format, these would be markup: "Z<Z" must come out as "Z\<Z", "Z&lt;Z", ...
MARKUP = {
    "markdown": "<>&\\$|`*_[]#",
    "latex": "<>&\\$%{}#_^~",
    "html": "<&",
    "svg": "<&",
}
TRACE_FORMATS = ["table", "plain", "json", "markdown", "latex", "html", "svg", "npz", "marp"]


def hostile_fixture(folder: Path, chars: str) -> tuple[Path, dict[str, Any]]:
    """A causal fixture whose name, description and tokens hold ``chars``."""
    fx: dict[str, Any] = {
        "name": f"N{chars}N",
        "description": f"D{chars}D",
        "tokens": [f"a{chars}a", f"b{chars}"],
        "X": [[1, 0], [0, 2]],
        "W_Q": [[1, 0], [0, 1]],
        "W_K": [[1, 0], [0, 1]],
        "W_V": [[1, 0], [0, 1]],
        "causal": True,
    }
    path = folder / "fx.json"
    path.write_text(json.dumps(fx), encoding="utf-8")
    return path, fx


def shown_escapes(c: str) -> tuple[str, ...]:
    r"""How a text output may show a character it must not print: Python's escape (``\x1b``,
    ``\r``, ``\u202e``), its backslash as LaTeX or HTML writes one."""
    escape = c.encode("unicode_escape").decode("ascii")
    return escape, escape.replace("\\", "\\textbackslash{}"), escape.replace("\\", "&#92;")


def trace_output(fmt: str, fixture: Path, out: Path) -> tuple[Run, str]:
    """``attn trace`` in ``fmt`` with explanations; the text written (all slides for marp)."""
    if fmt == "marp":
        run = attn("trace", str(fixture), "--explain", "-f", "marp", "--split", str(out))
        files = sorted(out.iterdir()) if out.is_dir() else []
        return run, "".join(p.read_text(encoding="utf-8") for p in files)
    extra = ["--explain", "--width", "1000"] if fmt != "npz" else []
    run = attn("trace", str(fixture), "-f", fmt, "-o", str(out), *extra)
    if fmt == "npz" or run.exit_code != 0:
        return run, ""
    return run, out.read_text(encoding="utf-8")


@pytest.mark.parametrize("cls", list(CLASSES))
@pytest.mark.parametrize("fmt", TRACE_FORMATS)
def test_trace_output_escapes_every_class(fmt: str, cls: str, tmp_path: Path) -> None:
    chars = CLASSES[cls]
    fixture, fx = hostile_fixture(tmp_path, chars)
    run, text = trace_output(fmt, fixture, tmp_path / f"out.{fmt}")
    assert_fine(run)
    allowed = "\n\xa0" if fmt in ("svg", "html", "marp") else "\n"  # Rich's SVG text has NBSP
    assert not raw_controls(text, allowed), raw_controls(text, allowed)
    if fmt == "json":  # the reader gives back exactly what was written
        doc = json.loads(text)
        assert (doc["name"], doc["tokens"]) == (fx["name"], fx["tokens"])
    elif fmt == "npz":  # numbers only: no text of the fixture is stored, so none can harm
        with np.load(tmp_path / "out.npz", allow_pickle=False) as z:
            assert all(z[k].dtype == np.float64 and k.isidentifier() for k in z.files)
    elif fmt == "marp":
        import yaml

        front = yaml.safe_load(text.split("---\n")[1])
        assert front["title"] == fx["name"]
    elif fmt == "svg":
        ET.fromstring(text)  # well-formed XML: nothing in a token broke out of its text node
    for c in set(chars) - set(" "):
        if not c.isprintable() and fmt in ("table", "plain", "markdown", "latex", "html", "svg"):
            assert any(form in text for form in shown_escapes(c)), (c, shown_escapes(c))
    if cls == "markup":
        for c in MARKUP.get(fmt, ""):
            assert f"Z{c}Z" not in text, f"raw {c!r} in {fmt}"
    if cls == "rich-markup" and fmt in ("table", "plain"):
        assert "[bold red]x[/]" in text  # shown as written, not applied


@pytest.mark.parametrize("cls", list(CLASSES))
@pytest.mark.parametrize("command", ["decode", "flash", "heatmap-svg", "rope", "rope-table"])
def test_other_outputs_escape_every_class(command: str, cls: str, tmp_path: Path) -> None:
    fixture, fx = hostile_fixture(tmp_path, CLASSES[cls])
    if command.startswith("rope"):
        fx["rope"] = True
        fixture.write_text(json.dumps(fx), encoding="utf-8")
    if command == "heatmap-svg":
        run = attn("heatmap", str(fixture), "-f", "svg", "-o", "out")
    elif command == "rope-table":
        run = attn("rope", str(fixture), "-o", "out")
    else:
        run = attn(command, str(fixture), "-f", "json", "-o", "out")
    assert_fine(run)
    text = (tmp_path / "out").read_text(encoding="utf-8")
    allowed = "\n\xa0" if command == "heatmap-svg" else "\n"
    assert not raw_controls(text, allowed), raw_controls(text, allowed)
    if command == "heatmap-svg":
        ET.fromstring(text)
    elif command == "rope":
        assert json.loads(text)["name"] == fx["name"]
    elif command == "rope-table":
        assert any(form in text for c in CLASSES[cls] for form in shown_escapes(c)) or (
            f"N{CLASSES[cls]}N" in text  # printable: shown as written
        )
    else:
        assert json.loads(text)["tokens"] == fx["tokens"]


# Check reports name the fixture by its path: a file name may hold anything but "/" and NUL,
# and a name that is not UTF-8 reaches attn as lone surrogates (os.fsdecode: b"\xff" -> \udcff).
NAME_CLASSES = {k: v for k, v in CLASSES.items() if "\x00" not in v and "/" not in v}
NAME_CLASSES["lone-surrogate"] = os.fsdecode(b"\xff\xfe")
NAME_CLASSES["github-separators"] = "q,q q:q q%q q::q"


def check_setup(folder: Path, chars: str) -> list[str]:
    """A fixture named with ``chars`` whose golden differs, and one that is missing."""
    readable = "" if any(0xD800 <= ord(c) < 0xE000 for c in chars) else chars  # see below
    fixture, _ = hostile_fixture(folder, readable)
    named = folder / f"fx{chars}.json"
    fixture.rename(named)
    golden = folder / "g"
    golden.mkdir()
    assert attn("check", str(named), "--golden-dir", str(golden), "--update").exit_code == 0
    [path] = golden.rglob("*.json")
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["stages"]["softmax"]["data"][0][1][0] = 0.25  # the golden differs in one weight
    path.write_text(json.dumps(doc), encoding="utf-8")
    return [str(named), str(folder / f"missing{chars}.json"), "--golden-dir", str(golden)]


@pytest.mark.parametrize("cls", list(NAME_CLASSES))
@pytest.mark.parametrize("fmt", ["json", "junit", "github"])
def test_check_reports_escape_every_class(fmt: str, cls: str, tmp_path: Path) -> None:
    chars = NAME_CLASSES[cls]
    args = check_setup(tmp_path, chars)
    run = attn("check", *args, "-f", fmt)
    assert run.exception is None and run.exit_code == 2, (run.exit_code, run.stderr[-300:])
    assert "Traceback" not in run.stdout + run.stderr
    assert not raw_controls(run.stdout + run.stderr), raw_controls(run.stdout + run.stderr)
    if fmt == "json":
        doc = json.loads(run.stdout)
        assert [f["fixture"] for f in doc["fixtures"]] == args[:2]
        assert [f["status"] for f in doc["fixtures"]] == ["different", "error"]
    elif fmt == "junit":
        ET.fromstring(run.stdout)
    else:
        commands = [line for line in run.stdout.splitlines() if line.startswith("::")]
        assert len(commands) == 2, run.stdout
        for line in commands:
            props = line[len("::error ") :].split("::", 1)[0]
            assert all(p.split("=", 1)[0] in ("file", "title") for p in props.split(","))
            assert "q,q" not in props and "q:q" not in props and "q%q" not in line


def test_lone_surrogates_are_refused_by_the_readers(tmp_path: Path) -> None:
    """In a fixture's text, a lone surrogate never gets through: nothing could print it."""
    (tmp_path / "s.json").write_text('{"name": "\\ud800", "Q": [[1]], "K": [[1]], "V": [[1]]}')
    np.savez(
        tmp_path / "s.npz",
        Q=np.ones((1, 1)),
        K=np.ones((1, 1)),
        V=np.ones((1, 1)),
        tokens=np.array(["a\ud800"]),
    )
    for name in ("s.json", "s.npz"):
        run = attn("trace", str(tmp_path / name))
        assert_error(run)
        assert "surrogate" in run.stderr


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_json_escaper_round_trips_and_prints_nothing_raw(text: str) -> None:
    """Any text, lone surrogates included: JSON's own reader gives it back, and every
    character written is printable (the escapes are ASCII)."""
    from attn_cli.io.trace_json import json_text

    written = json_text({"k": text})
    assert json.loads(written) == {"k": text}
    assert not raw_controls(written, "")


# ---------------------------------------------------------------------------------------------
# Writing onto a FIFO


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes here")
    os.mkfifo(tmp_path / "pipe")
    return tmp_path / "pipe"


FIFO_WRITES = {
    "trace-o": ["trace", "the_cat_sat", "-f", "json", "-o", "{fifo}"],
    "heatmap-o": ["heatmap", "the_cat_sat", "-o", "{fifo}"],
    "decode-o": ["decode", "causal_multihead", "-f", "json", "-o", "{fifo}"],
    "golden-update": ["check", "the_cat_sat", "--update", "--golden", "{fifo}"],
}


@pytest.mark.parametrize("name", list(FIFO_WRITES))
def test_write_to_a_fifo_without_reader_is_one_line_at_once(name: str, fifo: Path) -> None:
    run = attn(*(a.replace("{fifo}", str(fifo)) for a in FIFO_WRITES[name]), limit=5)
    assert_error(run)
    assert run.seconds < 1.0
    assert ("no reader" in run.stderr) or ("named pipe" in run.stderr)


def test_golden_dir_fifo_is_refused_at_once(tmp_path: Path) -> None:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes here")
    (tmp_path / "g").mkdir()
    os.mkfifo(tmp_path / "g" / "the_cat_sat.json")
    run = attn("check", "the_cat_sat", "--update", "--golden-dir", str(tmp_path / "g"), limit=5)
    assert_error(run)
    assert "--golden-dir: is a named pipe (FIFO), not a regular file" in run.stderr


@pytest.mark.subprocess
@pytest.mark.parametrize("name", ["trace-o", "golden-update"])
def test_fifo_without_reader_in_a_real_process(name: str, fifo: Path) -> None:
    """As a user runs it (the hang was reported as `timeout 5 attn ...` returning 124)."""
    from conftest import run_attn

    done = run_attn(*(a.replace("{fifo}", str(fifo)) for a in FIFO_WRITES[name]), timeout=5)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr


def test_write_to_a_fifo_with_a_reader_delivers_every_byte(fifo: Path) -> None:
    got: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 5
    run = attn("trace", "the_cat_sat", "-f", "json", "-o", str(fifo), limit=5)
    while run.exit_code == 2 and "no reader" in run.stderr and time.monotonic() < deadline:
        run = attn("trace", "the_cat_sat", "-f", "json", "-o", str(fifo), limit=5)  # not yet open
    assert_fine(run)
    reader.join(5)
    expected = attn("trace", "the_cat_sat", "-f", "json").stdout
    assert got and got[0].decode("utf-8") == expected


# ---------------------------------------------------------------------------------------------
# Numbers: the colour scale, float32 inputs


@settings(max_examples=300, deadline=None)
@given(
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(0, 1),
)
def test_scale_position_matches_exact_rational_arithmetic(a: float, b: float, u: float) -> None:
    """Any range, from subnormals to ±1.8e308 (where hi - lo is inf in float64), against the
    exact position of the same x computed with fractions; 2e-15 of slack for rounding."""
    from attn_cli.present.palette import scale_position

    lo, hi = min(a, b), max(a, b)
    x = lo + (hi - lo) * u if math.isfinite(hi - lo) else lo * (1 - u) + hi * u
    t = scale_position(x, lo, hi)
    assert 0.0 <= t <= 1.0
    if lo == hi:
        assert t == 0.5
        return
    exact = (Fraction(x) - Fraction(lo)) / (Fraction(hi) - Fraction(lo))
    assert abs(t - float(exact)) <= 2e-15


@pytest.mark.parametrize(
    ("x", "lo", "hi", "t"),
    [
        (0.0, -1.7e308, 1.7e308, 0.5),
        (1.7e308, -1.7e308, 1.7e308, 1.0),
        (-1.7e308, -1.7e308, 1.7e308, 0.0),
        (1e-320, 0.0, 2e-320, 0.5),
        (math.inf, 0.0, 1.0, 1.0),
        (-math.inf, 0.0, 1.0, 0.0),
        (math.nan, 0.0, 1.0, 0.5),
        (5.0, 5.0, 5.0, 0.5),
        (2e308 / 10, 0.0, 1.0, 1.0),
    ],
)
def test_scale_position_worked_by_hand(x: float, lo: float, hi: float, t: float) -> None:
    from attn_cli.present.palette import scale_position

    assert scale_position(x, lo, hi) == pytest.approx(t, abs=1e-12)


SPAN = """name: span
tokens: [a, b]
X: [[1, 0], [0, 1]]
W_Q: [[1.0e+154, 0], [0, 1.0e+154]]
W_K: [[1.5e+154, 0], [0, -1.5e+154]]
W_V: [[1, 0], [0, 1]]
scale: 1
"""  # scores [[1.5e308, 0], [0, -1.5e308]]: the range is 3e308, beyond float64


@pytest.mark.parametrize("fmt", ["html", "svg"])
def test_shading_a_stage_wider_than_float64(fmt: str, tmp_path: Path) -> None:
    """-1.5e308 takes viridis' first colour, 0 its middle, 1.5e308 its last (matplotlib's
    samples at 0, 0.5 and 1), though hi - lo is beyond float64."""
    (tmp_path / "span.yaml").write_text(SPAN)
    run = attn("trace", "span.yaml", "--stage", "scores", "-f", fmt, "-o", "out")
    assert_fine(run)
    text = (tmp_path / "out").read_text(encoding="utf-8").lower()
    assert all(colour in text for colour in ("#440154", "#21908c", "#fde725"))


@pytest.mark.parametrize("term", ["xterm-256color", "xterm"])
def test_stepped_palettes_shade_a_stage_wider_than_float64(
    term: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "span.yaml").write_text(SPAN)
    monkeypatch.setenv("TERM", term)
    monkeypatch.delenv("COLORTERM", raising=False)
    background = r"48;5;\d+m" if term.endswith("256color") else r"\x1b\[[\d;]*(4[0-7]|10[0-7])m"
    for heatmap in ([], ["--heatmap"]):
        run = attn("trace", "span.yaml", "--stage", "scores", "--color", *heatmap)
        assert_fine(run)
        assert re.search(background, run.stdout), run.stdout[:300]  # shaded, in its colours


BIAS = """name: b
tokens: [a, b]
X: [[1, 0], [0, 1]]
W_Q: [[1, 0], [0, 1]]
W_K: [[1, 0], [0, 1]]
W_V: [[1, 0], [0, 1]]
bias: {bias}
"""


@pytest.mark.parametrize(
    ("bias", "where"),
    [
        ("[[1.0e+300, 0], [0, 1]]", "bias[query 0 'a', key 0 'a']: is 1e+300"),
        ("[[0, -1.0e+300]]", "bias[every query, key 1 'b']: is -1e+300"),
        ("[0, 1.0e+300]", "bias[key 1 'b']: is 1e+300"),
        ("[[[0, 0], [1.0e+300, 0]]]", "bias[head 0, query 1 'b', key 0 'a']: is 1e+300"),
        ("[[[[0, 0], [0, 1.0e+300]]]]", "bias[head 0, query 1 'b', key 1 'b']: is 1e+300"),
    ],
    ids=["2-axes", "broadcast-row", "1-axis", "3-axes", "4-axes"],
)
def test_float32_bias_beyond_range_is_one_line(bias: str, where: str, tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(BIAS.format(bias=bias))
    run = attn("trace", "b.yaml", "--dtype", "float32")
    assert_error(run)
    assert f"Error: b.yaml: {where} (float32 overflow)" in run.stderr
    assert_fine(attn("trace", "b.yaml", "-f", "json"))  # float64 holds it


GATE = """name: g
tokens: [a, b]
X: [[1, 1], [0, 1]]
W_Q: [[1, 0], [0, 1]]
W_K: [[1, 0], [0, 1]]
W_V: [[1, 0], [0, 1]]
gate:
  W_G: {w_g}
"""


@pytest.mark.parametrize(
    ("w_g", "dtype", "where"),
    [
        (
            "[[1.0e+300, 0], [0, 1]]",
            "float32",
            "gate.W_G[row 0, column 0]: is 1e+300 (float32 overflow)",
        ),
        (
            "[[1.0e+308, 0], [1.0e+308, 1]]",
            "float64",
            "gate[head 0, query 0 'a', d_v 0]: is inf (float64 overflow)",
        ),
        ("[[.nan, 0], [0, 1]]", "float64", "gate.W_G[0][0]: is nan (not a number)"),
        ("[[-.inf, 0], [0, 1]]", "float64", "gate.W_G[0][0]: is -inf"),
        (
            "[[1, 0, 0], [0, 1, 0]]",
            "float64",
            "gate.W_G: has shape [2, 3], expected [d_model, heads*d_v] = [2, 1*2]",
        ),
    ],
    ids=["float32-weight", "float64-stage", "nan", "inf", "shape"],
)
def test_a_hostile_gate_is_one_line(w_g: str, dtype: str, where: str, tmp_path: Path) -> None:
    (tmp_path / "g.yaml").write_text(GATE.format(w_g=w_g))
    run = attn("trace", "g.yaml", "--dtype", dtype)
    assert_error(run)
    assert f"Error: g.yaml: {where}" in run.stderr, run.stderr


MLA = """name: m
tokens: [a, b]
X: [[1, 1], [0, 1]]
heads: 1
mla:
  W_Q: [[1, 0, 0, 1], [0, 1, 1, 0]]
  W_DKV: {w_dkv}
  kv_norm: [1, 1]
  W_UK: [[1, 0], [0, 1]]
  W_UV: [[1, 0], [0, 1]]
  W_KR: [[1, 0], [0, 1]]
"""


@pytest.mark.parametrize(
    ("w_dkv", "dtype", "where"),
    [
        (
            "[[1.0e+300, 0], [0, 1]]",
            "float32",
            "mla.W_DKV[row 0, column 0]: is 1e+300 (float32 overflow)",
        ),
        (
            "[[1.0e+300, 0], [1.0e+300, 1]]",
            "float64",
            "c_KV_norm[key 0 'a', kv_lora_rank 0]: is inf (float64 overflow)",
        ),
        ("[[.nan, 0], [0, 1]]", "float64", "mla.W_DKV[0][0]: is nan (not a number)"),
        ("[[-.inf, 0], [0, 1]]", "float64", "mla.W_DKV[0][0]: is -inf"),
        ("[[1, 0, 0], [0, 1, 0]]", "float64", "mla.kv_norm: has length 2, expected a vector of 3"),
        ("[[1, 0]]", "float64", "mla.W_DKV: has 1 rows"),
        ("[]", "float64", "mla.W_DKV: "),
    ],
    ids=["float32-weight", "float64-stage", "nan", "inf", "shape", "rows", "empty"],
)
def test_a_hostile_mla_is_one_line(w_dkv: str, dtype: str, where: str, tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(MLA.format(w_dkv=w_dkv))
    run = attn("trace", "m.yaml", "--dtype", dtype)
    assert_error(run)
    assert f"Error: m.yaml: {where}" in run.stderr, run.stderr
