"""Every option the commands share, declared once, and the parsers of option values.

No ``from __future__ import annotations`` in the cli package: Typer reads each command's
parameters on every run, and string annotations cost it an ``eval`` apiece.
"""

import os
import re
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from attn_cli.errors import UsageError

NON_TERMINAL_WIDTH = 100


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


class HeatmapFormat(str, Enum):
    table = "table"
    plain = "plain"
    html = "html"
    svg = "svg"


class Lang(str, Enum):
    en = "en"
    zh = "zh"


class Dtype(str, Enum):
    float64 = "float64"
    float32 = "float32"


# `Optional[...]`, not `X | None`: typer reads the annotation at runtime on Python 3.10.
FixtureArgument = Annotated[
    Optional[str],  # noqa: UP045
    typer.Argument(
        help="Fixture file (.json, .yaml, .yml, .npz), '-' for standard input, or the name of a "
        "bundled example. Default: the_cat_sat.",
        show_default=False,
        metavar="[FIXTURE]",
    ),
]
OutputOption = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option("--output", "-o", help="Write to this file (atomically) instead of stdout."),
]
StageOption = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--stage",
        "-s",
        help="Only this stage (repeat for more): the others are not kept, and those it does "
        "not depend on are not computed.",
    ),
]
PrecisionOption = Annotated[
    int, typer.Option(min=0, max=17, help="Digits after the decimal point in tables.")
]
WidthOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        min=40, help=f"Output width (default: the terminal's, else {NON_TERMINAL_WIDTH})."
    ),
]
ColorOption = Annotated[
    Optional[bool],  # noqa: UP045
    typer.Option("--color/--no-color", help="Force colour on or off (default: auto, NO_COLOR)."),
]
MaxElementsOption = Annotated[
    int, typer.Option(min=1, help="Refuse fixtures holding more numbers than this.")
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
            "", option, f"got {text[:40]!r}", "a size such as 8G, 500M or 1.5GiB (powers of 1024)"
        )
    unit = 1024 ** " kmgtp".index(match.group(2).lower() or " ")
    size = int(float(match.group(1)) * unit)
    if size < 1:
        raise UsageError("", option, f"got {text!r}", "a size of at least 1 byte")
    return size


def plain_wanted(fmt: Enum, color: bool | None) -> bool:
    """Plain text: asked for, or a table for a pipe or under NO_COLOR, unless --color."""
    if fmt.value == "plain":
        return True
    if fmt.value != "table" or color:
        return False
    return bool(os.environ.get("NO_COLOR")) or not sys.stdout.isatty()
