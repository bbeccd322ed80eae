"""Every option the commands share, declared once, and the parsers of option values.

No ``from __future__ import annotations`` in the cli package: Typer reads each command's
parameters on every run, and string annotations cost it an ``eval`` apiece.
"""

import os
import re
import sys
from collections.abc import MutableMapping
from enum import Enum
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer

from attn_cli.errors import UsageError

NON_TERMINAL_WIDTH = 100
MIN_WIDTH = 40
MAX_WIDTH = 1000  # --width and COLUMNS: wider than any screen, small enough to render fast


class Format(str, Enum):
    table = "table"
    plain = "plain"
    json = "json"


class TraceFormat(str, Enum):
    """What ``attn trace`` writes: Format's three, and exports for posts, notes and slides."""

    table = "table"
    plain = "plain"
    json = "json"
    markdown = "markdown"
    latex = "latex"
    html = "html"
    svg = "svg"
    npz = "npz"
    marp = "marp"  # with --split: one SVG per stage and slides.md, a Marp deck


class HeatmapFormat(str, Enum):
    table = "table"
    plain = "plain"
    html = "html"
    svg = "svg"


class CheckFormat(str, Enum):
    """What ``attn check`` reports: for people (table, plain) and for CI systems."""

    table = "table"
    plain = "plain"
    json = "json"
    junit = "junit"
    github = "github"


class Lang(str, Enum):
    en = "en"
    zh = "zh"


class Dtype(str, Enum):
    float64 = "float64"
    float32 = "float32"


# `Optional[...]`, not `X | None`: typer reads the annotation at runtime on Python 3.10.
# Metavars, the same on every command: FIXTURE, FIXTURE..., FILE, DIR, STAGE, N, DIGITS, SIZE.
FixtureArgument = Annotated[
    Optional[str],  # noqa: UP045
    typer.Argument(
        help="Fixture file (.json, .yaml, .yml, .npz), '-' for standard input, or the name of a "
        "bundled example. Default: the_cat_sat.",
        show_default=False,
        metavar="FIXTURE",
    ),
]
OutputOption = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--output",
        "-o",
        metavar="FILE",
        help="Write to FILE (atomically) instead of standard output; a write-protected FILE "
        "is refused.",
    ),
]
StageOption = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--stage",
        "-s",
        metavar="STAGE",
        help="Only this stage (repeat for more): the others are not kept, and those it does "
        "not depend on are not computed.",
    ),
]
PRECISION = 4  # the one default of --precision, wherever tables print numbers
PrecisionOption = Annotated[
    int,
    typer.Option(
        min=0,
        max=17,
        metavar="DIGITS",
        help="Digits after the decimal point in tables.",
    ),
]
WidthOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        min=MIN_WIDTH,
        max=MAX_WIDTH,
        metavar="N",
        help=f"Output width, {MIN_WIDTH} to {MAX_WIDTH} (default: the terminal's, else "
        f"{NON_TERMINAL_WIDTH}).",
    ),
]
ColorOption = Annotated[
    Optional[bool],  # noqa: UP045
    typer.Option(
        "--color/--no-color",
        help="Force colour on or off (default: auto; NO_COLOR turns it off, FORCE_COLOR on, "
        "NO_COLOR wins).",
    ),
]
QuietOption = Annotated[
    bool,
    typer.Option(
        "--quiet",
        "-q",
        help="No notes (Wrote FILE ...) and no warnings on standard error; errors still print.",
    ),
]
ForceOption = Annotated[
    bool, typer.Option("--force", help="Overwrite FILE if it exists, even write-protected.")
]
MaxElementsOption = Annotated[
    int, typer.Option(min=1, metavar="N", help="Refuse fixtures holding more numbers than this.")
]
MaxMemoryOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        metavar="SIZE",
        help="Refuse fixtures whose trace would need more memory than this, e.g. 8G or "
        "500M (default: 4G, or half the RAM if less).",
        show_default=False,
    ),
]
DtypeOption = Annotated[
    Dtype,
    typer.Option(
        help="Compute in float64, or in float32: half the memory, faster, about 7 digits."
    ),
]
LangOption = Annotated[
    Optional[Lang],  # noqa: UP045
    typer.Option(help="Language of explanations: en or zh (default: from LANG/LC_ALL)."),
]
HeatmapOption = Annotated[
    Optional[bool],  # noqa: UP045
    typer.Option(
        "--heatmap/--no-heatmap",
        help="Shade scores..softmax, mark row maxima and masked cells, add row sums "
        "(default: on when coloured).",
    ),
]
CellOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        metavar="QUERY,KEY",
        help="Work one cell out by hand: dot product, scaling, softmax row, output. "
        "Tokens or 0-based indices.",
    ),
]
FocusOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(metavar="TOKEN", help="Follow one query (token or index) through every stage."),
]

_SIZE = re.compile(
    r"^\s*(\d{1,30}(?:\.\d{0,30})?|\.\d{1,30})\s*([kmgtp]?)(?:i?b)?\s*$", re.I | re.A
)


def parse_size(text: str, option: str = "--max-memory") -> int:
    """``8G``, ``500M``, ``1.5GiB`` or a number of bytes; K, M, G, T, P are powers of 1024."""
    match = _SIZE.match(text)
    if not match:
        raise UsageError(
            "", option, f"got {shown(text)}", "a size such as 8G, 500M or 1.5GiB (powers of 1024)"
        )
    unit = 1024 ** " kmgtp".index(match.group(2).lower() or " ")
    size = int(float(match.group(1)) * unit)
    if size < 1:
        raise UsageError("", option, f"got {shown(text)}", "a size of at least 1 byte")
    return size


def memory_budget(max_memory: Optional[str]) -> Optional[int]:  # noqa: UP045
    """--max-memory in bytes; None when it is not given (the loader's default)."""
    return None if max_memory is None else parse_size(max_memory)


def shown(text: str, limit: int = 40) -> str:
    """An option's value quoted for an error line: printable, and cut short when long."""
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def color_wanted(color: bool | None) -> bool | None:
    """--color/--no-color, else NO_COLOR (off), else FORCE_COLOR (on), else None: auto.

    NO_COLOR wins over FORCE_COLOR (no-color.org, force-color.org: set and not empty), as in
    Rich; a flag on the command line wins over both.
    """
    if color is not None:
        return color
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return None


def plain_wanted(fmt: Enum, color: bool | None) -> bool:
    """Plain text (no colour, no trailing blanks): asked for, or a table for a pipe or a file
    (--no-color too), or under NO_COLOR; not when --color or FORCE_COLOR asks for colour.
    --no-color on a terminal is the table without colour, at the terminal's width."""
    if fmt.value == "plain":
        return True
    if fmt.value != "table":
        return False
    wanted = color_wanted(color)
    if wanted is True:
        return False
    if not sys.stdout.isatty():
        return True
    return color is None and wanted is False


_SIZE_VARIABLES = {"COLUMNS": MAX_WIDTH, "LINES": MAX_WIDTH}


def tame_terminal_size(environ: MutableMapping[str, str]) -> None:
    """COLUMNS and LINES as Rich may read them: ASCII digits up to 1000, else ignored.

    Rich takes any ``str.isdigit()`` value (``'²'`` is one, and ``int('²')`` fails) and any size
    (a width of 10**9 renders for ever): garbage is dropped, a huge size is capped.
    """
    for name, most in _SIZE_VARIABLES.items():
        value = environ.get(name)
        if value is None:
            continue
        digits = value.strip()
        if not (0 < len(digits) <= 9 and digits.isascii() and digits.isdigit()) or not int(digits):
            del environ[name]
        else:
            environ[name] = str(min(int(digits), most))


class Theme(str, Enum):
    auto = "auto"
    dark = "dark"
    light = "light"

    @property
    def drawn(self) -> Literal["dark", "light"]:
        """The colours of an svg, a terminal's html and slides: auto draws dark."""
        return "light" if self is Theme.light else "dark"


ThemeOption = Annotated[
    Theme,
    typer.Option(
        help="Colours of html, svg and --split: dark (a terminal) or light (white, for "
        "projectors and print); auto: an interactive page follows the system's setting "
        "(prefers-color-scheme), the rest is dark."
    ),
]
SplitOption = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--split",
        metavar="DIR",
        file_okay=False,
        help="One file per stage into DIR (00-setup, 01-X, 02-Q, ...): --format svg (the "
        "default here), html, or marp (the SVGs and slides.md, a Marp deck).",
    ),
]
BackwardOption = Annotated[
    bool,
    typer.Option(
        "--backward",
        help="Trace the backward pass too: every gradient d_<stage> of L = sum(grad * final "
        "stage), with the fixture's grad or a gradient of ones.",
    ),
]
