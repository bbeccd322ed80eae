"""``attn trace``: one fixture through every stage, as tables, plain text, JSON or exports."""

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from attn_cli.cli.options import (
    NON_TERMINAL_WIDTH,
    PRECISION,
    BackwardOption,
    CellOption,
    ColorOption,
    Dtype,
    DtypeOption,
    FixtureArgument,
    FocusOption,
    HeatmapFormat,
    HeatmapOption,
    Lang,
    LangOption,
    MaxElementsOption,
    MaxMemoryOption,
    OutputOption,
    PrecisionOption,
    QuietOption,
    SplitOption,
    StageOption,
    Theme,
    ThemeOption,
    TraceFormat,
    WidthOption,
    memory_budget,
    plain_wanted,
)
from attn_cli.cli.output import (
    console,
    emit,
    emit_binary,
    note,
    tolerant,
    warn_rows,
)
from attn_cli.cli.runs import render_options, write_plain
from attn_cli.core.limits import DEFAULT_MAX_ELEMENTS
from attn_cli.errors import UsageError, printable

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace
    from attn_cli.present.options import RenderOptions

TraceFormatOption = Annotated[
    TraceFormat,
    typer.Option(
        "--format",
        "-f",
        help="table (Rich, coloured on a terminal), plain (no colour), json, markdown "
        "(GitHub tables), latex (pdflatex), html or svg (the coloured rendering), npz "
        "(NumPy arrays named after stages; needs -o).",
    ),
]
FullOption = Annotated[bool, typer.Option(help="Show every row, column and table; no elision.")]
ExplainOption = Annotated[
    bool,
    typer.Option("--explain", help="Under each stage: its formula, shapes in and out, meaning."),
]
StepOption = Annotated[
    bool,
    typer.Option(
        "--step", help="One stage at a time, explained: Enter/Space/→ next, ←/b back, q quit."
    ),
]


def trace(
    fixture: FixtureArgument = None,
    fmt: TraceFormatOption = TraceFormat.table,
    output: OutputOption = None,
    stage: StageOption = None,
    precision: PrecisionOption = PRECISION,
    full: FullOption = False,
    width: WidthOption = None,
    color: ColorOption = None,
    max_elements: MaxElementsOption = DEFAULT_MAX_ELEMENTS,
    max_memory: MaxMemoryOption = None,
    dtype: DtypeOption = Dtype.float64,
    explain: ExplainOption = False,
    lang: LangOption = None,
    cell: CellOption = None,
    heatmap: HeatmapOption = None,
    focus: FocusOption = None,
    step: StepOption = False,
    backward: BackwardOption = False,
    split: SplitOption = None,
    theme: ThemeOption = Theme.auto,
    quiet: QuietOption = False,
) -> None:
    """Trace one fixture through every stage of attention and print each as a table.

    Stages: X, Q, K, V, scores, scaled, masked, softmax, output, concat, projected.

    Examples:

      attn trace                                      # the bundled "The cat sat"

      attn trace article_example_2 --stage softmax    # one stage

      attn trace my.yaml --format json -o trace.json  # every number, for scripts

      attn trace big.npz -s output -f npz -o out.npz  # big inputs, NumPy out

      cat my.json | attn trace -                      # from standard input

      attn trace --explain --lang zh --cell The,cat   # explained, one cell worked

      attn trace --step                               # one stage at a time

      attn trace --explain -f svg -o slides.svg       # one image

      attn trace --explain --split slides/            # a slide per stage

      attn trace --backward -s d_scaled -s d_Q        # the backward pass
    """
    asked = _Asked(
        fixture,
        fmt,
        output,
        stage,
        precision,
        full,
        width,
        color,
        max_elements,
        max_memory,
        dtype,
        explain,
        lang,
        cell,
        heatmap,
        focus,
        step,
        backward,
        split,
        theme,
        quiet,
    )
    _refuse(asked)  # 1) what cannot work, before anything is read or computed
    if fmt in (TraceFormat.json, TraceFormat.npz):
        _write_data(asked)  # 2) computed as it is written
        return
    _present(asked, _traced(asked))  # 2) trace, 3) show


@dataclass(frozen=True)
class _Asked:
    """The options of one ``attn trace``, as given."""

    fixture: Optional[str]  # noqa: UP045
    fmt: TraceFormat
    output: Optional[Path]  # noqa: UP045
    stage: Optional[list[str]]  # noqa: UP045
    precision: int
    full: bool
    width: Optional[int]  # noqa: UP045
    color: Optional[bool]  # noqa: UP045
    max_elements: int
    max_memory: Optional[str]  # noqa: UP045
    dtype: Dtype
    explain: bool
    lang: Optional[Lang]  # noqa: UP045
    cell: Optional[str]  # noqa: UP045
    heatmap: Optional[bool]  # noqa: UP045
    focus: Optional[str]  # noqa: UP045
    step: bool
    backward: bool
    split: Optional[Path]  # noqa: UP045
    theme: Theme
    quiet: bool

    @property
    def budget(self) -> Optional[int]:  # noqa: UP045
        return memory_budget(self.max_memory)

    @property
    def stages(self) -> Optional[tuple[str, ...]]:  # noqa: UP045
        """The stages asked for, once each, in the order given; None for all."""
        return None if not self.stage else tuple(dict.fromkeys(self.stage))

    @property
    def shaded(self) -> bool:
        """Whether a heatmap will be drawn (it greys masked cells, so ``masked`` is kept)."""
        if self.heatmap is not None:
            return self.heatmap
        fmt = self.fmt
        colored = fmt is TraceFormat.table and self.output is None
        return fmt in (TraceFormat.html, TraceFormat.svg) or (
            colored and not plain_wanted(fmt, self.color)
        )


def _refuse(asked: _Asked) -> None:
    """Refuse what cannot work before anything is read or computed."""
    fmt, output = asked.fmt, asked.output
    if fmt is TraceFormat.npz and output is None:
        raise UsageError("", "--format npz", "needs a file", "-o FILE.npz")
    if asked.step and (output is not None or fmt not in (TraceFormat.table, TraceFormat.plain)):
        raise UsageError("", "--step", "works only in the terminal", "no --format/-o")
    _check_split(asked.split, fmt, output)
    asked.budget  # noqa: B018  (a size that does not parse is refused here)


def _traced(asked: _Asked) -> "Trace":
    """The trace, every stage kept when explaining or stepping (they read every stage)."""
    from attn_cli.api import trace_file
    from attn_cli.present.progress import Status

    keep_all = asked.explain or asked.step or asked.cell is not None or asked.focus is not None
    keep_all = keep_all or _page(asked)  # the page's derivations read every stage
    with Status("loading the fixture") as status:
        result = trace_file(
            asked.fixture,
            stages=asked.stage,
            dtype=asked.dtype.value,
            shaded=asked.shaded,
            keep_all=keep_all,
            max_elements=asked.max_elements,
            max_memory=asked.budget,
            backward=asked.backward,
            progress=status.progress("computing attention"),
        )
    warn_rows(result, quiet=asked.quiet)
    return result


def _present(asked: _Asked, result: "Trace") -> None:
    """The trace shown: slides, a document, step mode or the tables."""
    a = asked
    options = classroom_options(
        result, a.precision, a.stages, a.full, a.explain, a.lang, a.cell, a.focus
    )
    if a.split is not None:
        _write_slides(result, options, a.split, a.fmt, a.heatmap, a.width, a.theme, a.quiet)
        return
    if _page(a):
        from attn_cli.present.html_page import trace_page

        page = trace_page(result, options, theme=a.theme.value)
        emit(page, a.output, quiet=a.quiet, escape="xml")
        return
    if a.fmt not in (TraceFormat.table, TraceFormat.plain):
        text = document(result, options, a.fmt, a.heatmap, a.width, theme=a.theme)
        xml = a.fmt in (TraceFormat.html, TraceFormat.svg)
        emit(text, a.output, quiet=a.quiet, escape="xml" if xml else "text")
        return
    plain = a.output is not None or plain_wanted(a.fmt, a.color)
    if a.step:
        _step(result, options, a.width, plain, a.color, a.heatmap)
    _show(result, options, a.output, a.width, plain, a.color, a.heatmap, a.quiet)


def _page(asked: _Asked) -> bool:
    """Whether the interactive page is asked for (``-f html``; with --split, a slide each)."""
    return asked.fmt is TraceFormat.html and asked.split is None


def _write_data(asked: _Asked) -> None:
    """The JSON or npz trace, written as it is computed: the score stages a block at a time
    (api.stream_file), so memory holds a block, not the file. No Rich is imported here."""
    from attn_cli.api import stream_file
    from attn_cli.present.progress import Status

    with Status("loading the fixture") as status:
        result = stream_file(
            asked.fixture,
            written="npz" if asked.fmt is TraceFormat.npz else "json",
            stages=asked.stage,
            dtype=asked.dtype.value,
            max_elements=asked.max_elements,
            max_memory=asked.budget,
            backward=asked.backward,
            progress=status.progress("computing attention"),
        )
    stages, output = asked.stages, asked.output
    if asked.fmt is TraceFormat.npz:
        from attn_cli.io.arrays import npz_writer

        assert output is not None
        emit_binary(npz_writer(result, stages), output, quiet=asked.quiet)
    else:
        from attn_cli.io.trace_json import write_trace_json  # each writer where it is needed

        if output is None:
            tolerant(sys.stdout, escape="json")  # an ASCII stdout gets \uXXXX, still JSON
            write_trace_json(result, sys.stdout, stages)
            sys.stdout.flush()
        else:
            emit_binary(lambda f: write_trace_json(result, f, stages), output, quiet=asked.quiet)
    # rows found empty by a softmax computed only as it was written are known only now
    warn_rows(result.finished(), quiet=asked.quiet)


def _step(
    result: "Trace",
    options: "RenderOptions",
    width: int | None,
    plain: bool,
    color: bool | None,
    heatmap: bool | None,
) -> None:
    from attn_cli.cli import collect_as_usual
    from attn_cli.present.step import run_steps

    collect_as_usual()  # a person pages through it, for as long as they like

    out = console(width, plain=plain, color=False if plain else color)
    heat = heatmap if heatmap is not None else out.color_system is not None
    raise typer.Exit(run_steps(result, replace(options, heatmap=heat), out))


def _show(
    result: "Trace",
    options: "RenderOptions",
    output: Path | None,
    width: int | None,
    plain: bool,
    color: bool | None,
    heatmap: bool | None,
    quiet: bool,
) -> None:
    """The tables: plain text at a fixed width (stable for diffs), or coloured on a terminal."""
    from attn_cli.present.render import render_trace

    if plain:
        renderable = render_trace(result, replace(options, heatmap=bool(heatmap)))
        write_plain(renderable, output, width, full=options.full, quiet=quiet)
        return
    out = console(width, plain=False, color=color)
    heat = heatmap if heatmap is not None else out.color_system is not None
    out.print(render_trace(result, replace(options, heatmap=heat)), crop=not options.full)


def classroom_options(
    result: "Trace",
    precision: int,
    stages: tuple[str, ...] | None,
    full: bool,
    explain: bool,
    lang: Optional[Lang],  # noqa: UP045
    cell: Optional[str],  # noqa: UP045
    focus: Optional[str],  # noqa: UP045
) -> "RenderOptions":
    """Render options with the language resolved and --cell/--focus turned into positions."""
    options = render_options(precision, full, explain, lang, stages)
    if cell is None and focus is None:
        return options
    from attn_cli.present.worked import parse_cell, resolve_position

    return replace(
        options,
        cell=None if cell is None else parse_cell(cell, result.query_labels, result.key_labels),
        focus=None
        if focus is None
        else resolve_position(focus, result.query_labels, "--focus", "query"),
    )


def _check_split(split: Optional[Path], fmt: TraceFormat, output: Optional[Path]) -> None:  # noqa: UP045
    """--split writes a folder of svg, html or marp slides; marp needs it."""
    if split is None:
        if fmt is TraceFormat.marp:
            raise UsageError("", "--format marp", "needs a folder", "--split DIR")
        return
    if output is not None:
        raise UsageError("", "--split", "given with -o", "one of them")
    if fmt not in (TraceFormat.table, TraceFormat.svg, TraceFormat.html, TraceFormat.marp):
        raise UsageError("", "--split", f"given with --format {fmt.value}", "svg, html or marp")


def _write_slides(
    result: "Trace",
    options: "RenderOptions",
    folder: Path,
    fmt: TraceFormat,
    heatmap: Optional[bool],  # noqa: UP045
    width: Optional[int],  # noqa: UP045
    theme: Theme,
    quiet: bool,
) -> None:
    from attn_cli.present.slides import SLIDE_WIDTH, write_slides

    kind = "svg" if fmt is TraceFormat.table else fmt.value
    shaded = replace(options, heatmap=heatmap is not False)
    written = write_slides(
        result,
        shaded,
        folder,
        kind,  # type: ignore[arg-type]
        width=width or SLIDE_WIDTH,
        theme=theme.drawn,
    )
    note(f"Wrote {len(written)} slides into {printable(str(folder))}", quiet=quiet)


def document(
    result: "Trace",
    options: "RenderOptions",
    fmt: TraceFormat | HeatmapFormat,
    heatmap: Optional[bool],  # noqa: UP045
    width: Optional[int],  # noqa: UP045
    view: str = "trace",
    theme: Theme = Theme.dark,
) -> str:
    """The trace as a Markdown, LaTeX, HTML or SVG document."""
    from attn_cli.present.i18n import label

    title = result.inputs.name or label(options.lang, "trace_title")
    if fmt.value in ("markdown", "latex"):
        from attn_cli.present.export_text import to_latex, to_markdown

        options = replace(options, heatmap=bool(heatmap))
        return (to_markdown if fmt.value == "markdown" else to_latex)(result, options)
    from attn_cli.present.render import render_heatmap, render_trace, to_html, to_svg

    options = replace(options, heatmap=heatmap is not False)  # coloured: on unless --no-heatmap
    renderable = (render_heatmap if view == "heatmap" else render_trace)(result, options)
    export = to_html if fmt.value == "html" else to_svg
    return export(renderable, width or NON_TERMINAL_WIDTH, title, theme.drawn, options.lang)
