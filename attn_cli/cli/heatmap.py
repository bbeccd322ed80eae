"""``attn heatmap``: only the attention weights, shaded, one table per head."""

import sys
from dataclasses import replace
from typing import Annotated

import typer

from attn_cli.cli.options import (
    NON_TERMINAL_WIDTH,
    ColorOption,
    Dtype,
    DtypeOption,
    FixtureArgument,
    HeatmapFormat,
    LangOption,
    MaxElementsOption,
    MaxMemoryOption,
    OutputOption,
    PrecisionOption,
    WidthOption,
    parse_size,
    plain_wanted,
)
from attn_cli.cli.output import console, emit, plain_text, warn_empty_rows
from attn_cli.cli.trace import classroom_options, document
from attn_cli.core.limits import DEFAULT_MAX_ELEMENTS

HeatmapFormatOption = Annotated[
    HeatmapFormat, typer.Option("--format", "-f", help="table (coloured), plain, html or svg.")
]


def heatmap(
    fixture: FixtureArgument = None,
    fmt: HeatmapFormatOption = HeatmapFormat.table,
    output: OutputOption = None,
    precision: PrecisionOption = 2,
    width: WidthOption = None,
    color: ColorOption = None,
    lang: LangOption = None,
    max_elements: MaxElementsOption = DEFAULT_MAX_ELEMENTS,
    max_memory: MaxMemoryOption = None,
    dtype: DtypeOption = Dtype.float64,
) -> None:
    """Only the attention weights, shaded: one table per head, side by side when they fit.

    Examples:

      attn heatmap                        # "The cat sat"

      attn heatmap causal_multihead       # two heads side by side

      attn heatmap my.yaml -f svg -o weights.svg
    """
    from attn_cli.api import trace_file

    budget = None if max_memory is None else parse_size(max_memory)
    result = trace_file(
        fixture, stages=("softmax",), shaded=True, dtype=dtype.value,
        max_elements=max_elements, max_memory=budget,
    )  # fmt: skip
    warn_empty_rows(result)
    from attn_cli.present.render import render_heatmap

    options = classroom_options(result, precision, None, False, False, lang, None, None)
    options = replace(options, heatmap=True)
    if fmt in (HeatmapFormat.html, HeatmapFormat.svg):
        emit(document(result, options, fmt, True, width, view="heatmap"), output)
        return
    renderable = render_heatmap(result, options)
    if output is not None or plain_wanted(fmt, color):
        if width is None and (output is not None or not sys.stdout.isatty()):
            width = NON_TERMINAL_WIDTH
        emit(plain_text(renderable, width), output)
    else:
        console(width, plain=False, color=color).print(renderable)
