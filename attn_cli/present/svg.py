"""SVG and HTML of the terminal rendering that look the same in every renderer, in two themes.

HTML: the page takes the theme's background and foreground (Rich's default export is a white
page, whatever the theme), names its language on ``<html>``, and puts every wide (CJK)
character in a box exactly two cells (``2ch``) wide: a CJK glyph is one em, not the two cells
of a monospace font the tables are laid out in, so the borders of a Chinese page were ragged.

Rich's ``export_svg`` places each styled run of text at its first cell and stretches it with
``textLength`` to as many cells as it has *characters*: a Chinese character takes two cells, so
``公式`` was squeezed into the width of two cells instead of four (Chromium honours textLength).
Its runs also begin with the padding of right-aligned numbers as ``&#160;``, which librsvg drops,
so the numbers of a column lost their alignment. :func:`place_text_runs` rewrites every run as
pieces without leading or trailing blanks, each wide (CJK) or narrow stretch on its own, each
placed at its own cell with the width of its cells: the layout no longer depends on the font,
on textLength support or on how a renderer treats blanks.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import Literal

from rich.cells import cell_len
from rich.console import Console
from rich.terminal_theme import SVG_EXPORT_THEME, TerminalTheme

Theme = Literal["dark", "light"]
THEMES: tuple[Theme, ...] = ("dark", "light")
HTML_LANG = {"en": "en", "zh": "zh-Hans"}  # attn's --lang -> the page's language tag

# For projectors and paper: white background, near-black text, ANSI colours dark enough to read
# on white (GitHub's light terminal palette; yellow and white darkened to amber and grey).
LIGHT_THEME = TerminalTheme(
    (255, 255, 255),
    (31, 35, 40),
    [
        (36, 41, 47),
        (207, 34, 46),
        (17, 99, 41),
        (125, 78, 0),
        (9, 105, 218),
        (130, 80, 223),
        (27, 124, 131),
        (110, 119, 129),
    ],
    [
        (87, 96, 106),
        (164, 14, 38),
        (26, 127, 55),
        (99, 60, 1),
        (33, 139, 255),
        (162, 112, 245),
        (49, 146, 170),
        (140, 149, 159),
    ],
)

FONT_SIZE = 20  # px, as Rich's SVG sets it
CHAR_WIDTH = FONT_SIZE * 0.61  # Rich's cell: as high as the font, aspect ratio 0.61
LINE_HEIGHT = FONT_SIZE * 1.22  # Rich's line: its box from 0.925 em above the baseline
ABOVE = FONT_SIZE * 0.925
MIDDLE = FONT_SIZE * 0.3  # a box-drawing glyph's horizontal stroke, above the baseline
STROKE = FONT_SIZE * 0.075
# A box-drawing character's vertical stroke, from the line's top (0), its middle (1) or bottom
# (2) to where: a glyph is as high as the font, not the line, so a border of │ drawn as text
# came out as a broken line; each stroke is drawn as a bar the height of the line instead.
VERTICAL = {
    "│": (0, 2),
    "┃": (0, 2),
    "├": (0, 2),
    "┤": (0, 2),
    "┼": (0, 2),
    "╭": (1, 2),
    "╮": (1, 2),
    "┌": (1, 2),
    "┐": (1, 2),
    "┬": (1, 2),
    "╰": (0, 1),
    "╯": (0, 1),
    "└": (0, 1),
    "┘": (0, 1),
    "┴": (0, 1),
}

# One text run as Rich writes it (the title bar's, centred, has no textLength and is left be).
_RUN = re.compile(
    r'<text class="(?P<cls>[^"]*)" x="(?P<x>[^"]*)" y="(?P<y>[^"]*)" '
    r'textLength="[^"]*" clip-path="(?P<clip>[^"]*)">(?P<text>.*?)</text>',
    re.S,
)


def terminal_theme(theme: Theme) -> TerminalTheme:
    """The Rich terminal theme of ``theme``: Rich's own dark one, or the light one."""
    return LIGHT_THEME if theme == "light" else SVG_EXPORT_THEME


def place_text_runs(svg: str, char_width: float = CHAR_WIDTH) -> str:
    """Rich's SVG with every text run split into pieces placed and sized by their cells."""

    wide_spacing = 2 * char_width - FONT_SIZE

    def rewrite(run: re.Match[str]) -> str:
        start = round(float(run["x"]) / char_width)
        tags = []
        for offset, piece in pieces(html.unescape(run["text"])):
            tags += _bars(run, start + offset, piece, char_width)
            if set(piece) <= {"│", "┃"}:
                continue  # the bars are the whole of it
            x = _number((start + offset) * char_width)
            length = _number(cell_len(piece) * char_width)
            content = html.escape(piece).replace(" ", "&#160;")
            # librsvg ignores textLength: a wide piece is spaced out to two cells a character
            # (CJK glyphs are one em wide), which other renderers' textLength agrees with.
            spacing = f' letter-spacing="{_number(wide_spacing)}"' if _wide(piece) else ""
            tags.append(
                f'<text class="{run["cls"]}" x="{x}" y="{run["y"]}" textLength="{length}"'
                f'{spacing} clip-path="{run["clip"]}">{content}</text>'
            )
        return "".join(tags)

    return _RUN.sub(rewrite, svg)


def _bars(run: re.Match[str], cell: int, piece: str, char_width: float) -> list[str]:
    """The vertical strokes of the box-drawing characters of ``piece`` (at ``cell``), each a
    bar in the run's colour from its line's top, middle or bottom to another."""
    baseline = float(run["y"])
    ys = (baseline - ABOVE, baseline - MIDDLE, baseline - ABOVE + LINE_HEIGHT)
    out = []
    for i, ch in enumerate(piece):
        if ch not in VERTICAL:
            continue
        top, bottom = (ys[k] for k in VERTICAL[ch])
        if ch in "╭╮":  # a rounded corner's arc turns down half a cell below its middle
            top += char_width / 2
        elif ch in "╰╯":
            bottom -= char_width / 2
        x = (cell + i + 0.5) * char_width - STROKE / 2
        out.append(
            f'<rect class="{run["cls"]}" x="{_number(round(x, 2))}" y="{_number(round(top, 2))}" '
            f'width="{_number(STROKE)}" height="{_number(round(bottom - top, 2))}" '
            f'clip-path="{run["clip"]}"/>'
        )
    return out


def pieces(text: str) -> Iterator[tuple[int, str]]:
    """(first cell, text) of each piece: a stretch of wide or of narrow characters, single
    blanks between narrow ones kept (words stay words), other blanks left out."""
    cells = 0
    piece, piece_start, kind = "", 0, ""
    for i, ch in enumerate(text):
        width = cell_len(ch)
        here = "blank" if ch.isspace() else ("wide" if width == 2 else "narrow")
        if here == "blank" and kind == "narrow" and _narrow_next(text, i):
            here = "narrow"  # one blank inside a run of narrow characters
        if width == 0 and piece:
            here = kind  # a combining mark stays with its character
        if here != kind:
            if piece and kind != "blank":
                yield piece_start, piece
            piece, piece_start, kind = "", cells, here
        piece += ch
        cells += width
    if piece and kind != "blank":
        yield piece_start, piece


def _narrow_next(text: str, i: int) -> bool:
    """Whether the character after ``text[i]`` is a narrow non-blank one."""
    after = text[i + 1 : i + 2]
    return bool(after) and not after.isspace() and cell_len(after) == 1


def _wide(piece: str) -> bool:
    return cell_len(piece[0]) == 2


def _number(value: float) -> str:
    """A coordinate as Rich writes it."""
    return format(value, "g")


# Rich's page template, with the page's language and title, a font stack whose CJK fallbacks
# are monospace, and the box of a wide character; Rich fills in the {placeholders}.
_FONTS = (
    "Menlo,'DejaVu Sans Mono',Consolas,'Noto Sans Mono CJK SC','Sarasa Mono SC',"
    "'Courier New',monospace"
)
_HTML_PAGE = """<!DOCTYPE html>
<html lang="@LANG@">
<head>
<meta charset="UTF-8">
<title>@TITLE@</title>
<style>
{stylesheet}
body {{
    color: {foreground};
    background-color: {background};
}}
.w {{ display: inline-block; width: 2ch; text-align: center; }}
</style>
</head>
<body>
    <pre style="font-family:@FONTS@"><code style="font-family:inherit">{code}</code></pre>
</body>
</html>
"""
_TAG = re.compile(r"(<[^>]*>)")


def html_page(console: Console, title: str, theme: Theme, lang: str) -> str:
    """The recorded ``console`` as a standalone HTML page in ``theme``'s colours."""
    title = html.escape(title).replace("{", "{{").replace("}", "}}")  # Rich formats the page
    page = _HTML_PAGE.replace("@LANG@", HTML_LANG.get(lang, "en")).replace("@FONTS@", _FONTS)
    exported = console.export_html(
        theme=terminal_theme(theme), code_format=page.replace("@TITLE@", title), inline_styles=True
    )
    head, code = exported.split("<code", 1)
    return head + "<code" + "".join(_boxed(part) for part in _TAG.split(code))


def _boxed(part: str) -> str:
    """Text between tags with each wide character in a box two cells wide (a tag as it is)."""
    if part.startswith("<"):
        return part
    return "".join(f'<span class="w">{ch}</span>' if cell_len(ch) == 2 else ch for ch in part)
