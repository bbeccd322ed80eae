"""``attn heatmap``: only the attention weights, shaded, one table per head."""

from dataclasses import replace
from typing import Annotated

import typer

from attn_cli.cli.options import (
    PRECISION,
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
    QuietOption,
    Theme,
    ThemeOption,
    WidthOption,
    memory_budget,
)
from attn_cli.cli.output import emit, warn_rows
from attn_cli.cli.runs import render_options, show
from attn_cli.cli.trace import document
from attn_cli.core.limits import DEFAULT_MAX_ELEMENTS

HeatmapFormatOption = Annotated[
    HeatmapFormat, typer.Option("--format", "-f", help="table (coloured), plain, html or svg.")
]


def heatmap(
    fixture: FixtureArgument = None,
    fmt: HeatmapFormatOption = HeatmapFormat.table,
    output: OutputOption = None,
    precision: PrecisionOption = PRECISION,
    width: WidthOption = None,
    color: ColorOption = None,
    lang: LangOption = None,
    max_elements: MaxElementsOption = DEFAULT_MAX_ELEMENTS,
    max_memory: MaxMemoryOption = None,
    dtype: DtypeOption = Dtype.float64,
    theme: ThemeOption = Theme.dark,
    quiet: QuietOption = False,
) -> None:
    """Only the attention weights, shaded: one table per head, side by side when they fit.

    The softmax stage alone (so no --stage), with row maxima and masked cells marked.

    Examples:

      attn heatmap                                 # the bundled "The cat sat"

      attn heatmap causal_multihead --precision 2  # two heads side by side

      attn heatmap my.yaml -f svg -o weights.svg   # for slides
    """
    from attn_cli.api import trace_file

    budget = memory_budget(max_memory)
    result = trace_file(
        fixture,
        stages=("softmax",),
        shaded=True,
        dtype=dtype.value,
        max_elements=max_elements,
        max_memory=budget,
    )
    warn_rows(result, quiet=quiet)
    from attn_cli.present.render import render_heatmap

    options = replace(render_options(precision, False, False, lang), heatmap=True)
    if fmt in (HeatmapFormat.html, HeatmapFormat.svg):
        page = document(result, options, fmt, True, width, view="heatmap", theme=theme)
        emit(page, output, quiet=quiet, escape="xml")
        return
    show(render_heatmap(result, options), fmt, output, width, color, False, quiet)
