"""SVG that renders alike everywhere (Chinese widths, column alignment), slides per stage, the
light theme and the Marp deck.

The geometry is checked against the cell grid worked out here with ``rich.cells.cell_len`` (two
cells for a CJK character, one for Latin), not against the exporter's own arithmetic; the PNG
rendering is checked with librsvg (``rsvg-convert``) or cairosvg where installed.
"""

from __future__ import annotations

import html
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from conftest import FIXTURES
from rich.cells import cell_len
from rich.console import Group
from rich.text import Text

from attn_cli.core.pipeline import Trace, run
from attn_cli.errors import UsageError
from attn_cli.io.fixture import load_fixture
from attn_cli.present.options import RenderOptions
from attn_cli.present.render import render_trace, to_svg
from attn_cli.present.slides import slides, write_slides
from attn_cli.present.svg import pieces

CELL = 20 * 0.61  # px: Rich's SVG cell, 20 px font at aspect ratio 0.61
TOL = 1e-6  # px; coordinates are printed with 6 significant digits, so compare loosely there
RUN = re.compile(r"<text ([^>]*textLength[^>]*)>(.*?)</text>", re.S)


def cat_sat() -> Trace:
    return run(load_fixture(FIXTURES / "the_cat_sat.yaml"))


def runs(svg: str) -> list[tuple[float, float, float, str]]:
    """(x, y, textLength, text) of each text run of the terminal's content."""
    out = []
    for attrs, content in RUN.findall(svg):
        a = dict(re.findall(r'([\w-]+)="([^"]*)"', attrs))
        out.append((float(a["x"]), float(a["y"]), float(a["textLength"]), html.unescape(content)))
    return out


def chinese_svg() -> str:
    options = RenderOptions(explain=True, heatmap=True, lang="zh", stages=("scores", "softmax"))
    return to_svg(render_trace(cat_sat(), options), 100, "The cat sat")


# ---------------------------------------------------------------------------------------------
# Widths and positions


def test_every_run_is_as_wide_as_its_cells_chinese_included() -> None:
    found = runs(chinese_svg())
    assert any(cell_len(text) > len(text) for *_, text in found), "no wide text in the SVG"
    for x, _, length, text in found:
        # textLength counts cells, so 公式 (two characters) is four cells wide, not two
        assert abs(length - cell_len(text) * CELL) < 0.01, (text, length)
        assert abs(x / CELL - round(x / CELL)) < 1e-3, (text, x)  # on the grid


def test_no_run_starts_or_ends_with_a_blank() -> None:
    # librsvg drops leading &#160;: padding becomes a position instead
    for *_, text in runs(chinese_svg()):
        assert text == text.strip() and text, repr(text)


def test_right_aligned_numbers_end_in_the_same_cell() -> None:
    svg = to_svg(render_trace(cat_sat(), RenderOptions(stages=("scores",))), 80, "t")
    numbers = [(x, length, t) for x, _, length, t in runs(svg) if re.fullmatch(r"\d+\.\d+", t)]
    # scores of The cat sat: one column holds 8.0000, 8.0000 and 12.0000 (different widths)
    by_column: dict[int, set[int]] = {}
    for x, length, _ in numbers:
        end = round((x + length) / CELL)
        by_column.setdefault(end, set()).add(round(x / CELL))
    starts = [s for s in by_column.values() if len(s) > 1]
    assert starts, "no column with numbers of different widths"
    assert len(by_column) == 3, by_column  # three columns, each ending in one cell


def test_pieces_keep_the_cell_of_each_stretch() -> None:
    # by hand: "公式" is cells 0-3, two blanks, "X" at cell 6, "：输入" from cell 7
    assert list(pieces("公式  X：输入 ")) == [(0, "公式"), (6, "X"), (7, "：输入")]
    assert list(pieces("  8.0000")) == [(2, "8.0000")]
    assert list(pieces("what this step does")) == [(0, "what this step does")]
    assert list(pieces("a  b")) == [(0, "a"), (3, "b")]


def test_wide_pieces_are_spaced_to_two_cells_for_librsvg() -> None:
    svg = to_svg(Group(Text("公式 abc")), 20, "t")
    tag = next(m for m in re.findall(r"<text [^>]*>公式</text>", svg))
    assert 'letter-spacing="4.4"' in tag  # 2 cells = 24.4 px = a 20 px glyph + 4.4 px
    assert "letter-spacing" not in next(m for m in re.findall(r"<text [^>]*>abc</text>", svg))


# ---------------------------------------------------------------------------------------------
# Rendered to PNG


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def png_rows(data: bytes) -> list[bytes]:
    """The raw scanlines of an 8-bit RGBA PNG (filters undone)."""
    width, height = png_size(data)
    chunks, pos = b"", 8
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        if kind == b"IDAT":
            chunks += data[pos + 8 : pos + 8 + n]
        pos += 12 + n
    raw = zlib.decompress(chunks)
    stride, bpp = width * 4, 4
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return rows


def render_png(svg: str, tmp_path: Path) -> bytes:
    """The SVG as PNG with rsvg-convert, else cairosvg; skipped when neither is installed."""
    source = tmp_path / "slide.svg"
    source.write_text(svg, encoding="utf-8")
    if shutil.which("rsvg-convert"):
        target = tmp_path / "slide.png"
        subprocess.run(["rsvg-convert", str(source), "-o", str(target)], check=True, timeout=60)
        return target.read_bytes()
    cairosvg = pytest.importorskip(
        "cairosvg", reason="neither rsvg-convert (librsvg2-bin) nor cairosvg is installed"
    )
    return bytes(cairosvg.svg2png(url=str(source)))


@pytest.mark.subprocess
def test_chinese_svg_renders_to_png_at_its_size(tmp_path: Path) -> None:
    svg = chinese_svg()
    view = re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg)
    assert view is not None
    width, height = png_size(render_png(svg, tmp_path))
    assert (width, height) == (round(float(view[1])), round(float(view[2])))


@pytest.mark.subprocess
def test_chinese_text_fills_its_cells_in_the_png(tmp_path: Path) -> None:
    # Light theme, one line of ten CJK characters then "|": the ink of the Chinese must reach
    # into the tenth pair of cells (cells 18-19), i.e. the glyphs are spread over 20 cells,
    # not squeezed into 10 nor drawn at their natural 1 em.
    svg = to_svg(Group(Text("一二三四五六七八九十|")), 30, "t", theme="light")
    rows = png_rows(render_png(svg, tmp_path))
    left = 8 + 1  # Rich's padding and margin, px
    dark_columns = {
        x
        for row in rows[40:80]
        for x in range(len(row) // 4)
        if row[4 * x + 3] > 0 and max(row[4 * x : 4 * x + 3]) < 128
    }
    in_cells = {round((x - left) // CELL) for x in dark_columns}
    assert 18 in in_cells or 19 in in_cells, sorted(in_cells)
    assert 20 in in_cells  # the bar after them, at cell 20


# ---------------------------------------------------------------------------------------------
# Slides and themes


def test_slides_are_one_file_per_stage_numbered_in_order() -> None:
    trace = cat_sat()
    files = slides(trace, RenderOptions(heatmap=True))
    names = [s.name for s in files]
    assert names == [
        "00-setup.svg",
        "01-X.svg",
        "02-Q.svg",
        "03-K.svg",
        "04-V.svg",
        "05-scores.svg",
        "06-scaled.svg",
        "07-softmax.svg",
        "08-output.svg",
    ]
    scores = files[5].text
    assert "Q·Kᵀ" in "".join(t for *_, t in runs(scores))
    assert "W_Q" not in "".join(t for *_, t in runs(scores))  # only its own stage


def test_write_slides_writes_the_folder(tmp_path: Path) -> None:
    trace = cat_sat()
    written = write_slides(trace, RenderOptions(stages=("scores",)), tmp_path / "deck")
    assert [p.name for p in written] == ["00-setup.svg", "01-scores.svg"]
    assert all(p.read_text(encoding="utf-8").startswith("<svg") for p in written)
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    with pytest.raises(UsageError, match="is not a folder"):
        write_slides(trace, RenderOptions(), not_a_folder)


def test_light_theme_is_white_with_dark_text() -> None:
    svg = slides(cat_sat(), RenderOptions(stages=("X",)), theme="light")[1].text
    assert 'fill="#ffffff"' in svg  # the window
    number = re.search(r'<text class="(attn-r\d+)"[^>]*>1\.0000</text>', svg)  # X[The, 0]
    assert number is not None
    fill = re.search(rf"\.{number[1]} {{ fill: (#[0-9a-f]{{6}})", svg)
    assert fill is not None
    assert max(int(fill[1][k : k + 2], 16) for k in (1, 3, 5)) < 80  # near-black text
    dark = slides(cat_sat(), RenderOptions(stages=("X",)))[1].text
    assert 'fill="#292929"' in dark  # Rich's dark theme stays the default


def test_marp_deck_shows_each_image_with_notes() -> None:
    files = slides(cat_sat(), RenderOptions(lang="zh"), "marp")
    deck = files[-1]
    assert deck.name == "slides.md"
    assert deck.text.startswith("---\nmarp: true\n")
    images = re.findall(r"!\[bg contain\]\(([^)]+)\)", deck.text)
    assert images == [f.name for f in files[:-1]]
    assert "<!--\nscores = Q·Kᵀ" in deck.text and "点积" in deck.text  # explanation as notes
    assert deck.text.count("<!--") == deck.text.count("-->") == 8  # every stage but setup


def test_html_slides() -> None:
    files = slides(cat_sat(), RenderOptions(stages=("X",)), "html", theme="light")
    assert [f.name for f in files] == ["00-setup.html", "01-X.html"]
    assert "<!DOCTYPE html>" in files[1].text and "#ffffff" in files[1].text.lower()
