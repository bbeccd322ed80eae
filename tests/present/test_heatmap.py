"""Heatmaps: the colour scale, shaded cells, marked maxima and masked cells, row sums, and
``attn heatmap``; the default plain rendering stays exactly as it was."""

from __future__ import annotations

import itertools
import re
from io import StringIO
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES, run_cli
from rich.console import Console, RenderableType

from attn_cli.core.pipeline import run
from attn_cli.io.fixture import load_fixture
from attn_cli.present.options import RenderOptions
from attn_cli.present.palette import VIRIDIS, viridis
from attn_cli.present.render import render_heatmap, render_trace
from attn_cli.present.worked import row_max_positions_for_display, row_sums_for_display


def backgrounds(renderable: RenderableType, width: int = 100) -> set[str]:
    """The background colours a renderable paints, read from its styled segments.

    (Not from ANSI text: Rich caches a combined style's escape codes for the first colour
    system it meets, so a test that renders in 8 colours would change another's codes.)
    """
    console = Console(file=StringIO(), width=width, color_system="truecolor", force_terminal=True)
    found = set()
    for segment in console.render(renderable):
        if segment.style is not None and segment.style.bgcolor is not None:
            found.add(segment.style.bgcolor.get_truecolor().hex)
    return found


# ---------------------------------------------------------------------------------------------
# The colour scale


def test_viridis_ends_and_middle_are_matplotlibs() -> None:
    assert viridis(0.0) == "#440154"
    assert viridis(0.5) == "#21908c"
    assert viridis(1.0) == "#fde725"
    assert viridis(-3) == "#440154" and viridis(7) == "#fde725"  # clamped
    assert len(VIRIDIS) == 11


def test_viridis_is_perceptually_ordered_lightness_rises() -> None:
    def luminance(hex_colour: str) -> float:
        rgb = [int(hex_colour[k : k + 2], 16) / 255 for k in (1, 3, 5)]
        lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    values = [luminance(viridis(t / 100)) for t in range(101)]
    assert all(b > a for a, b in itertools.pairwise(values)), "lightness must rise with the value"


# ---------------------------------------------------------------------------------------------
# Display helpers, by hand


def test_row_sums_and_maxima_for_display() -> None:
    m = np.array([[0.25, 0.75, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 0.0]])
    assert row_sums_for_display(m) == (1.0, 1.0, 0.0)
    assert row_max_positions_for_display(m) == {(0, 1), (1, 0), (1, 1)}  # ties both marked


# ---------------------------------------------------------------------------------------------
# Plain text: unchanged by default, marks only when asked


def test_default_plain_rendering_is_unchanged_by_the_heatmap() -> None:
    default = run_cli("trace", "causal_multihead", "--format", "plain")
    off = run_cli("trace", "causal_multihead", "--format", "plain", "--no-heatmap")
    assert default.exit_code == 0 and off.exit_code == 0
    assert default.stdout == off.stdout
    assert "row sum" not in default.stdout and not re.search(r"\d\*", default.stdout)
    assert re.search(r"^I\s+0\.0000\s+-inf\s+-inf\s+-inf$", default.stdout, re.M)


def test_heatmap_in_plain_text_marks_maxima_masks_and_row_sums() -> None:
    result = run_cli("trace", "causal_multihead", "--format", "plain", "--heatmap", "--lang", "en")
    assert result.exit_code == 0, result.output
    out = result.stdout
    # causal head 0, by hand: row "like" sees I and like only; scaled [3/√2·√2... ] -> the
    # weights are the pipeline's; what matters here is how they are marked
    assert re.search(r"^I\s+1\.0000\*\s+0\.0000·\s+0\.0000·\s+0\.0000·\s+1\.0000$", out, re.M)
    assert re.search(r"^query\s+I\s+like\s+green\s+tea\s+row sum$", out, re.M)
    assert re.search(r"^I\s+0\.0000\s+−∞\s+−∞\s+−∞$", out, re.M)  # the masked stage
    assert "* row maximum" in out and "· masked" in out
    # every softmax row sums to 1 (or 0 for an empty row), and the column says so
    assert len(re.findall(r"\s1\.0000$", out, re.M)) >= 8


def test_article_softmax_row_two_maxima_are_both_marked() -> None:
    # softmax([0, 1, 1]) = [0.1554, 0.4223, 0.4223]: a tie, so both maxima are marked
    result = run_cli("trace", "article_example_2", "-s", "softmax", "-f", "plain", "--heatmap")
    assert result.exit_code == 0
    assert re.search(r"^chase\s+0\.1554\s+0\.4223\*\s+0\.4223\*\s+1\.0000$", result.stdout, re.M)


# ---------------------------------------------------------------------------------------------
# Colour


def test_heatmap_shades_cells_by_value_in_colour() -> None:
    trace = run(load_fixture(FIXTURES / "the_cat_sat.yaml"))
    shaded = backgrounds(render_trace(trace, RenderOptions(heatmap=True, stages=("scores",))))
    # scores of "The cat sat" are 0, 2, 4, 8 and 12: 0 is the bottom of the scale, 12 the top
    assert shaded == {viridis(x / 12) for x in (0, 2, 4, 8, 12)}
    plain = backgrounds(render_trace(trace, RenderOptions(heatmap=False, stages=("scores",))))
    assert plain == set()


def test_masked_cells_are_grey_not_on_the_scale() -> None:
    trace = run(load_fixture(FIXTURES / "causal_multihead.yaml"))
    assert "#585858" in backgrounds(
        render_trace(trace, RenderOptions(heatmap=True, stages=("masked",)))
    )


def test_cli_colour_default_is_heatmap_on_and_no_heatmap_turns_it_off() -> None:
    on = run_cli("trace", "--color", "--stage", "softmax")
    off = run_cli("trace", "--color", "--stage", "softmax", "--no-heatmap")
    assert on.exit_code == 0 and off.exit_code == 0
    assert "\x1b[" in on.stdout and "\x1b[" in off.stdout  # coloured, both
    assert "row sum" in on.stdout and re.search(r"0\.9411\*", on.stdout)
    assert "row sum" not in off.stdout and not re.search(r"\d\*", off.stdout)


# ---------------------------------------------------------------------------------------------
# attn heatmap


def test_heatmap_command_puts_heads_side_by_side_when_they_fit() -> None:
    wide = run_cli(
        "heatmap", "causal_multihead", "--format", "plain", "--width", "120", "--precision", "2"
    )
    assert wide.exit_code == 0, wide.output
    assert re.search(r"^head 0\s+head 1$", wide.stdout, re.M)
    assert "scores" not in wide.stdout and "─ V" not in wide.stdout  # only the weights
    assert re.search(r"^like\s+0\.99\*\s+0\.01\s+0\.00·\s+0\.00·\s+1\.00\s+like", wide.stdout, re.M)
    narrow = run_cli("heatmap", "causal_multihead", "--format", "plain", "--width", "40")
    assert narrow.exit_code == 0
    assert re.search(r"^head 0$", narrow.stdout, re.M)
    assert re.search(r"^head 1$", narrow.stdout, re.M)


def test_heatmap_command_batches_and_chinese_legend() -> None:
    result = run_cli("heatmap", "padding_batch", "--format", "plain", "--lang", "zh")
    assert result.exit_code == 0
    assert "批 0 · 头 0" in result.stdout and "批 1 · 头 0" in result.stdout
    assert "行内最大值" in result.stdout and "被遮盖" in result.stdout


def test_heatmap_renderable_in_colour() -> None:
    trace = run(load_fixture(FIXTURES / "the_cat_sat.yaml"))
    shaded = backgrounds(render_heatmap(trace, RenderOptions(precision=2, heatmap=True)))
    # softmax[The, cat] = 1 / (1 + e^(-4√2) + e^(-2√2)) = 0.9410886 (worked in test_explain.py)
    assert viridis(0.9410886) in shaded


@pytest.mark.parametrize("fmt", ["html", "svg"])
def test_heatmap_command_exports(tmp_path: Path, fmt: str) -> None:
    target = tmp_path / f"w.{fmt}"
    result = run_cli("heatmap", "causal_multihead", "--format", fmt, "-o", str(target))
    assert result.exit_code == 0, result.output
    text = target.read_text(encoding="utf-8")
    assert "#585858" in text.lower() or "88,88,88" in text  # masked cells


# ---------------------------------------------------------------------------------------------
# 256 and 16 colours (tmux without COLORTERM): the colours the terminal really shows

SGR = re.compile(r"\x1b\[([0-9;]*)m|([^\x1b]+)")


def shown_backgrounds(values: list[float], system: str) -> dict[float, str]:
    """The background escape code each value's cell gets in a terminal of ``system`` colours."""
    from attn_cli.present.heat import SliceHeat
    from attn_cli.present.render import render_matrix

    heat = SliceHeat(lo=0.0, hi=1.0, lang="en", blocked=None, maxima=None, row_sums=None)
    table = render_matrix(
        np.array([values]),
        row_labels=["q"],
        col_labels=[str(i) for i in range(len(values))],
        row_axis="query",
        title=None,
        options=RenderOptions(precision=4),
        heat=heat,
    )
    out = StringIO()
    Console(file=out, width=200, color_system=system, force_terminal=True).print(table)  # type: ignore[arg-type]
    found: dict[float, str] = {}
    params: list[str] = []
    for m in SGR.finditer(out.getvalue().splitlines()[-1]):
        if m.group(1) is not None:
            codes = m.group(1).split(";") if m.group(1) else ["0"]
            params = [] if codes == ["0"] else params + codes
            continue
        for number in re.findall(r"\d\.\d{4}", m.group(2)):
            found[float(number)] = _background(params)
    assert len(found) == len(set(values)), found
    return found


def _background(params: list[str]) -> str:
    """The last background set in a list of SGR parameters: ``5;60`` (256) or ``44`` (16)."""
    bg = ""
    i = 0
    while i < len(params):
        p = params[i]
        if p == "48":
            bg = ";".join(params[i + 1 : i + 3] if params[i + 1] == "5" else params[i + 1 : i + 5])
            i += 3 if params[i + 1] == "5" else 5
            continue
        if p.isdigit() and (40 <= int(p) <= 47 or 100 <= int(p) <= 107):
            bg = p
        i += 1
    return bg


ISSUE_VALUES = [0.14, 0.16, 0.17, 0.30, 0.32]  # one colour for all of them before (xterm 60)


def test_256_colours_keep_values_a_tenth_apart_apart() -> None:
    shown = shown_backgrounds(ISSUE_VALUES, "256")
    for a, b in itertools.combinations(ISSUE_VALUES, 2):
        if abs(a - b) >= 0.1:
            assert shown[a] != shown[b], (a, b, shown)
    assert all(code.startswith("5;") for code in shown.values())  # the terminal's own colours


def test_256_colours_give_every_tenth_its_own_colour() -> None:
    tenths = [round(0.05 + k / 10, 2) for k in range(10)]
    shown = shown_backgrounds(tenths, "256")
    assert len(set(shown.values())) == 10, shown


def test_16_colours_tell_neighbouring_tenths_apart() -> None:
    tenths = [round(0.05 + k / 10, 2) for k in range(10)]
    shown = shown_backgrounds(tenths, "standard")
    for a, b in itertools.pairwise(tenths):
        assert shown[a] != shown[b], (a, b, shown)
    issue = shown_backgrounds(ISSUE_VALUES, "standard")
    assert issue[0.14] != issue[0.30]  # neighbouring tenths (1 and 3 are not, but 2 apart)


def test_truecolour_keeps_continuous_viridis() -> None:
    trace = run(load_fixture(FIXTURES / "the_cat_sat.yaml"))
    shaded = backgrounds(render_heatmap(trace, RenderOptions(precision=2, heatmap=True)))
    assert viridis(0.9410886) in shaded  # unchanged by the stepped palettes


def test_legend_shows_the_steps_the_terminal_has() -> None:
    trace = run(load_fixture(FIXTURES / "the_cat_sat.yaml"))
    out = StringIO()
    console = Console(file=out, width=120, color_system="256", force_terminal=True)
    console.print(render_heatmap(trace, RenderOptions(heatmap=True)))
    legend = next(line for line in out.getvalue().splitlines() if "█" in line)
    colours = re.findall(r"\x1b\[[0-9;]*38;5;(\d+)[0-9;]*m█", legend)
    assert len(colours) == len(set(colours)) == 10, legend
