"""``attn rope``: a fixture's rotary position embedding pair by pair."""

from typing import Annotated, Optional

import typer

from attn_cli.cli.options import (
    PRECISION,
    ColorOption,
    FixtureArgument,
    Format,
    LangOption,
    MaxElementsOption,
    OutputOption,
    PrecisionOption,
    QuietOption,
    WidthOption,
)
from attn_cli.cli.output import emit
from attn_cli.cli.runs import ExplainOption, FormatOption, FullOption, render_options, show
from attn_cli.core.limits import DEFAULT_MAX_ELEMENTS

PositionOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--position",
        "-p",
        min=0,
        metavar="P",
        show_default=False,
        help="The position the angle, cos and sin columns are at (default: the fixture's last).",
    ),
]
LengthOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--length",
        min=1,
        metavar="L",
        show_default=False,
        help="The frequencies of a sequence of L positions (dynamic and longrope depend on it; "
        "default: the fixture's, or up to --position).",
    ),
]


def rope(
    fixture: FixtureArgument = None,
    position: PositionOption = None,
    length: LengthOption = None,
    fmt: FormatOption = Format.table,
    output: OutputOption = None,
    precision: PrecisionOption = PRECISION,
    full: FullOption = False,
    width: WidthOption = None,
    color: ColorOption = None,
    explain: ExplainOption = False,
    lang: LangOption = None,
    max_elements: MaxElementsOption = DEFAULT_MAX_ELEMENTS,
    quiet: QuietOption = False,
) -> None:
    """Show a fixture's RoPE pair by pair: base and scaled frequency, wavelength against the
    trained context, the band of its scaling, and the angle at a position.

    The numbers are the ones attn trace rotates Q and K by (llama3, yarn, longrope, linear and
    dynamic scaling as transformers computes them).

    Examples:

      attn rope llama31_rope_scaling                  # llama3's kept, smoothed and scaled bands

      attn rope llama31_rope_scaling -p 100000 --explain

      attn rope my_import.yaml --length 131072 -f json -o rope.json
    """
    from attn_cli.api import rope_file

    inputs, table = rope_file(fixture, position=position, length=length, max_elements=max_elements)
    if fmt is Format.json:
        from attn_cli.io.rope_json import rope_dumps

        emit(rope_dumps(inputs, table), output, quiet=quiet, escape="json")
        return
    from attn_cli.present.rope_view import render_rope

    options = render_options(precision, full, explain, lang)
    show(render_rope(inputs, table, options), fmt, output, width, color, full, quiet)
