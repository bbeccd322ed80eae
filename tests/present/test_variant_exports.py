"""The variant stages in every export format, in slides, in Chinese and in step mode, and the
warning a finite mask sentinel earns.

For each bundled variant example: every format writes, parses as its format (JSON, npz, XML for
SVG, HTML tags balanced) and names every stage the stage table says applies; step mode renders
every stage's page at projector size with the title pinned. The sentinel warnings are checked
against the leaked weights of a softmax written here with ``math.exp``.
"""

from __future__ import annotations

import io
import json
import math
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES, run_cli
from rich.console import Console
from test_exports import parse_html

from attn_cli.api import trace_file
from attn_cli.core.pipeline import Trace
from attn_cli.core.stages import applicable_stages
from attn_cli.io.fixture import load_fixture
from attn_cli.present.options import RenderOptions
from attn_cli.present.pager import Deck, State, frame, press
from attn_cli.present.worked import CellRef

VARIANTS = [
    "llama_rope_gqa",
    "llama_rope_interleaved",
    "mistral_sliding_window",
    "gemma2_softcap",
    "gptoss_sinks",
    "qwen3_qk_norm",
    "cross_attention",
    "mask_sentinel",
    "llama4_chunked",
    "llama4_temperature",
    "olmo_clip_qkv",
]
NEW_STAGES = {"X_kv", "Q_norm", "K_norm", "Q_rot", "K_rot", "capped", "alibi"}
SLOW = pytest.mark.slow  # over 0.3 s each: Rich's SVG and HTML exports, whole slide sets
FORMATS = [
    "markdown",
    "latex",
    "json",
    "npz",
    pytest.param("html", marks=SLOW),
    pytest.param("svg", marks=SLOW),
]


@cache
def stages_of(name: str) -> tuple[str, ...]:
    return applicable_stages(load_fixture(FIXTURES / f"{name}.yaml"))


def test_the_examples_cover_the_new_stages() -> None:
    covered = {s for name in VARIANTS for s in stages_of(name)}
    assert covered >= NEW_STAGES - {"alibi"}  # no bundled example uses ALiBi


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", VARIANTS)
def test_every_format_holds_every_stage(tmp_path: Path, name: str, fmt: str) -> None:
    target = tmp_path / f"out.{fmt}"
    extra = [] if fmt in ("json", "npz") else ["--explain", "--cell", "1,0"]
    result = run_cli("trace", name, "-f", fmt, "-o", str(target), "-q", "--lang", "en", *extra)
    assert result.exit_code == 0, result.output
    stages = stages_of(name)
    if fmt == "npz":
        with np.load(target, allow_pickle=False) as archive:
            assert set(stages) <= set(archive.files), archive.files
        return
    text = target.read_text(encoding="utf-8")
    if fmt == "json":
        assert list(json.loads(text)["stages"]) == list(stages)
        return
    if fmt == "svg":
        ET.fromstring(text)  # well-formed XML
        text = re.sub(r"<[^>]+>", "", text).replace("&#160;", " ").replace("\xa0", " ")
    if fmt == "html":
        parse_html(text)  # tags balanced
    for stage in stages:
        shown = stage.replace("_", r"\_") if fmt == "latex" else stage
        assert shown in text, stage
    assert "worked cell" in text
    assert "what this step does" in text


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("name", VARIANTS)
def test_latex_of_every_variant_compiles(tmp_path: Path, name: str) -> None:
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed (apt-get install texlive-latex-base)")
    tex = tmp_path / "doc.tex"
    result = run_cli(
        "trace",
        name,
        "-f",
        "latex",
        "-o",
        str(tex),
        "-q",
        "--explain",
        "--cell",
        "1,0",
        "--lang",
        "en",
    )
    assert result.exit_code == 0, result.output
    done = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "-no-shell-escape", "doc.tex"],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:]


@SLOW
@pytest.mark.parametrize("name", VARIANTS)
def test_split_writes_a_slide_per_stage(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "slides"
    result = run_cli("trace", name, "--split", str(folder), "--explain", "--cell", "1,0", "-q")
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in folder.iterdir())
    expected = ["00-setup.svg", *(f"{k:02d}-{s}.svg" for k, s in enumerate(stages_of(name), 1))]
    assert names == expected
    for path in folder.iterdir():
        ET.fromstring(path.read_text(encoding="utf-8"))


@SLOW
@pytest.mark.parametrize("name", VARIANTS)
def test_explained_in_chinese(name: str) -> None:
    result = run_cli("trace", name, "--explain", "--lang", "zh", "-f", "plain", "--cell", "1,0")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.count("这一步在做什么") == len(stages_of(name))
    assert "what this step does" not in out and "worked cell" not in out
    assert "单元格演算" in out


# ---------------------------------------------------------------------------------------------
# Step mode: every stage's page, in this process


@cache
def full_trace(name: str) -> Trace:
    return trace_file(name, keep_all=True)


def screen_text(d: Deck, state: State, width: int, height: int) -> list[str]:
    return ["".join(s.text for s in line).rstrip() for line in frame(d, state, width, height)]


@SLOW
@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("name", VARIANTS)
def test_step_mode_pages_every_variant_stage(name: str, lang: str) -> None:
    trace = full_trace(name)
    options = RenderOptions(explain=True, cell=CellRef(1, 0), lang=lang)  # type: ignore[arg-type]
    d = Deck(trace, options, Console(width=80, color_system=None, file=io.StringIO()))
    assert list(stages_of(name)) == [n for n in d.names if n in stages_of(name)]
    for k, stage in enumerate(d.names):
        top = screen_text(d, State(k), 80, 24)
        assert len(top) == 24 and stage in top[0]
        end = press(d, State(k), "end", 80, 24)
        bottom = screen_text(d, end, 80, 24)
        assert stage in bottom[0]  # the title stays pinned when scrolled to the end


# ---------------------------------------------------------------------------------------------
# The sentinel warning


def leaked_by_hand() -> list[tuple[int, int, float, bool]]:
    """mask_sentinel, recomputed with loops: causal, lengths [4, 0], mask_value -1e4, scale 1."""
    fx = load_fixture(FIXTURES / "mask_sentinel.yaml")
    assert fx.Q is not None and fx.K is not None
    rows = []
    for b, length in enumerate((4, 0)):
        for i in range(4):
            allowed = [j <= i and j < length for j in range(4)]
            x = [
                sum(fx.Q[b, 0, i, d] * fx.K[b, 0, j, d] for d in range(2)) if allowed[j] else -1e4
                for j in range(4)
            ]
            m = max(x)
            e = [math.exp(v - m) for v in x]
            leaked = sum(w for w, ok in zip(e, allowed, strict=True) if not ok) / sum(e)
            if leaked > 0:
                rows.append((b, i, leaked, not any(allowed)))
    return rows


def test_trace_warns_once_per_leaking_row_then_counts() -> None:
    rows = leaked_by_hand()
    assert len(rows) == 7  # batch 0 queries a, b, c leak; all four of batch 1 are uniform
    result = run_cli("trace", "mask_sentinel", "-f", "json")
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 6 and all(line.startswith("Warning: ") for line in lines)
    tokens = "abcd"
    for line, (b, i, leaked, uniform) in zip(lines, rows[:5], strict=False):
        assert f"softmax[batch {b}, head 0, query {i} '{tokens[i]}']" in line
        if uniform:
            assert "no key may be attended, but mask_value -10000 made the row uniform" in line
        else:
            got = float(re.search(r"let (\S+) of the weight", line).group(1))  # type: ignore[union-attr]
            assert math.isclose(got, leaked, rel_tol=1e-3)  # printed to 4 digits
    assert lines[-1] == "Warning: ... and 2 more rows where mask_value -10000 let weight through"


def test_heatmap_warns_too_and_quiet_silences_both() -> None:
    heat = run_cli("heatmap", "mask_sentinel", "-f", "plain")
    assert heat.exit_code == 0, heat.output
    assert heat.stderr.count("Warning: ") == 6
    for command in ("trace", "heatmap"):
        quiet = run_cli(command, "mask_sentinel", "-f", "plain", "-q")
        assert quiet.exit_code == 0 and quiet.stderr == ""


def test_no_sentinel_warning_with_minus_infinity(tmp_path: Path) -> None:
    text = (FIXTURES / "mask_sentinel.yaml").read_text(encoding="utf-8")
    fixture = tmp_path / "inf.yaml"
    fixture.write_text(re.sub(r"^mask_value:.*$", "", text, flags=re.M), encoding="utf-8")
    result = run_cli("trace", str(fixture), "-f", "json")
    assert result.exit_code == 0
    assert "mask_value" not in result.stderr
    # -inf leaves batch 1 with nothing to attend to: the zero-row warnings, not sentinel ones
    assert result.stderr.count("no key may be attended, so all its weights are 0") == 4
