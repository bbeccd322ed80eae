"""The ``attn`` command: parse options, call the library, print. Nothing else lives here.

NumPy, YAML and the renderers are imported inside the commands, so ``attn --help`` and
``attn --version`` stay light. No ``from __future__ import annotations`` here: Typer reads every
command's parameters on each run, and string annotations cost it an ``eval`` apiece (about 10 ms
for these commands); names imported only for type checking are quoted instead.
"""

import contextlib
import io
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any, Optional

import typer

from attn_cli import __version__
from attn_cli.core.limits import DEFAULT_MAX_ELEMENTS
from attn_cli.core.stages import STAGE_NAMES
from attn_cli.errors import AttnError, UsageError, printable

if TYPE_CHECKING:
    from rich.console import Console

    from attn_cli.check.compare import Outcome, Tolerance
    from attn_cli.core.inputs import Inputs
    from attn_cli.core.pipeline import Trace
    from attn_cli.present.progress import Status
    from attn_cli.present.render import RenderOptions

NON_TERMINAL_WIDTH = 100

app = typer.Typer(
    name="attn",
    help=(
        "Trace Transformer self-attention step by step: every stage (X, Q, K, V, scores, scaled, "
        "masked, softmax, output, concat, projected) as a table of real numbers.\n\n"
        "Examples:\n\n"
        "  attn trace                      # the bundled 'The cat sat' example\n\n"
        "  attn trace my_fixture.yaml      # your own embeddings and weights\n\n"
        "  attn examples                   # list the bundled examples"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


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


# Options that several commands share, declared once.
WidthOption = Annotated[
    Optional[int],  # noqa: UP045 (typer reads the annotation at runtime on Python 3.10)
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


def _version(value: bool) -> None:
    if value:
        typer.echo(f"attn {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """Trace Transformer self-attention step by step."""


@contextmanager
def _user_errors() -> Iterator[None]:
    """Turn a user's mistake into one line on stderr and exit code 2."""
    try:
        yield
    except AttnError as e:
        typer.echo(f"Error: {_one_line(e)}", err=True)
        raise typer.Exit(2) from None
    except MemoryError:
        typer.echo(f"Error: {_OUT_OF_MEMORY}", err=True)
        raise typer.Exit(2) from None


_OUT_OF_MEMORY = (
    "ran out of memory, expected a fixture whose trace fits "
    "(lower --max-memory so that such fixtures are refused up front)"
)


def _one_line(error: AttnError) -> str:
    # errors.printable, not render.safe: reporting an error must not import the renderers
    from attn_cli.errors import printable

    return " ".join(printable(line) for line in str(error).splitlines())


@app.command()
def trace(
    fixture: Annotated[
        Optional[str],  # noqa: UP045 (typer reads the annotation at runtime on Python 3.10)
        typer.Argument(
            help="Fixture file (.json, .yaml, .yml), '-' for standard input, or the name of a "
            "bundled example. Default: the_cat_sat.",
            show_default=False,
        ),
    ] = None,
    fmt: Annotated[
        TraceFormat,
        typer.Option(
            "--format",
            "-f",
            help="table (Rich, coloured on a terminal), plain (no colour), json, markdown "
            "(GitHub tables), latex (pdflatex), html or svg (the coloured rendering), npz "
            "(NumPy arrays named after stages; needs -o).",
        ),
    ] = TraceFormat.table,
    output: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--output", "-o", help="Write to this file (atomically) instead of stdout."),
    ] = None,
    stage: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--stage",
            "-s",
            help="Only this stage (repeat for more): the others are not kept, and those it does "
            "not depend on are not computed.",
        ),
    ] = None,
    precision: Annotated[
        int, typer.Option(min=0, max=17, help="Digits after the decimal point in tables.")
    ] = 4,
    full: Annotated[
        bool, typer.Option(help="Show every row, column and table; no elision.")
    ] = False,
    width: WidthOption = None,
    color: ColorOption = None,
    max_elements: MaxElementsOption = DEFAULT_MAX_ELEMENTS,
    max_memory: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            metavar="SIZE",
            help="Refuse fixtures whose trace would need more memory than this, e.g. 8G or "
            "500M (default: 4G, or half the RAM if less).",
            show_default=False,
        ),
    ] = None,
    dtype: Annotated[
        Dtype,
        typer.Option(
            help="Compute in float64, or in float32: half the memory, faster, about 7 digits.",
        ),
    ] = Dtype.float64,
    explain: Annotated[
        bool,
        typer.Option(
            "--explain", help="Under each stage: its formula, shapes in and out, and meaning."
        ),
    ] = False,
    lang: Annotated[
        Optional[Lang],  # noqa: UP045
        typer.Option(help="Language of explanations: en or zh (default: from LANG/LC_ALL)."),
    ] = None,
    cell: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            metavar="QUERY,KEY",
            help="Work one cell out by hand: dot product, scaling, softmax row, output. "
            "Tokens or 0-based indices.",
        ),
    ] = None,
    heatmap: Annotated[
        Optional[bool],  # noqa: UP045
        typer.Option(
            "--heatmap/--no-heatmap",
            help="Shade scores..softmax, mark row maxima and masked cells, add row sums "
            "(default: on when coloured).",
        ),
    ] = None,
    focus: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            metavar="TOKEN", help="Follow one query (token or index) through every stage."
        ),
    ] = None,
    step: Annotated[
        bool,
        typer.Option(
            "--step", help="One stage at a time, explained: Enter/Space/→ next, ←/b back, q quit."
        ),
    ] = False,
) -> None:
    """Trace one fixture through every stage of attention and print each as a table.

    Examples:

      attn trace                                  # the bundled "The cat sat"

      attn trace article_example_2 --stage softmax

      attn trace my.yaml --format json -o trace.json

      attn trace big.npz --stage output --format npz -o out.npz   # big inputs

      cat my.json | attn trace -

      attn trace --explain --lang zh --cell The,cat   # classroom: explained, one cell worked

      attn trace --step                           # one stage at a time

      attn trace --explain --format svg -o slides.svg
    """
    with _user_errors():
        from attn_cli.present.progress import Status

        stages = _check_stages(stage)
        if fmt is TraceFormat.npz and output is None:
            raise UsageError("", "--format npz", "needs a file", "-o FILE.npz")
        shade = heatmap is True or (
            heatmap is None
            and (
                fmt in (TraceFormat.html, TraceFormat.svg)
                or (fmt is TraceFormat.table and output is None and not _plain(Format.table, color))
            )
        )
        keep = _kept(stages, shade, explain or step or cell is not None or focus is not None)
        with Status("loading the fixture") as status:
            result = _run(fixture, max_elements, max_memory, keep, dtype.value, status)
        if stages is not None:
            missing = [s for s in stages if s not in result]
            if missing:
                raise UsageError(
                    "", f"--stage {missing[0]}", "this fixture has no such stage",
                    "one of " + ", ".join(result.applicable),
                )  # fmt: skip
        _warn_empty_rows(result)
        if step and (output is not None or fmt not in (TraceFormat.table, TraceFormat.plain)):
            raise UsageError("", "--step", "works only in the terminal", "no --format/-o")
        if fmt is TraceFormat.npz:
            assert output is not None
            from attn_cli.io.arrays import npz_writer

            _emit_binary(npz_writer(result, stages), output)
            return
        if fmt is TraceFormat.json:
            from attn_cli.io.trace_json import dumps

            _emit(dumps(result, stages), output)
            return
        from attn_cli.present.render import render_trace

        options = _classroom_options(result, precision, stages, full, explain, lang, cell, focus)
        if fmt not in (TraceFormat.table, TraceFormat.plain):
            _emit(_document(result, options, fmt, heatmap, width), output)
            return
        plain = output is not None or fmt is TraceFormat.plain or _plain(Format.table, color)
        if step:
            from attn_cli.present.step import run_steps

            console = _console(width, plain=plain, color=False if plain else color)
            heat = heatmap if heatmap is not None else console.color_system is not None
            raise typer.Exit(run_steps(result, replace(options, heatmap=heat), console))
        if plain:
            # Plain text: no colour, fixed width, no trailing blanks; stable enough for diffs.
            if width is None and (output is not None or not sys.stdout.isatty()):
                width = NON_TERMINAL_WIDTH
            renderable = render_trace(result, replace(options, heatmap=bool(heatmap)))
            console = _console(width, plain=True, color=False)
            with console.capture() as capture:
                console.print(renderable, crop=not full)  # --full: tables wider than the width
            text = "\n".join(line.rstrip() for line in capture.get().splitlines()) + "\n"
            _emit(text, output)
        else:
            console = _console(width, plain=False, color=color)
            heat = heatmap if heatmap is not None else console.color_system is not None
            console.print(render_trace(result, replace(options, heatmap=heat)), crop=not full)


def _classroom_options(
    result: "Trace",
    precision: int,
    stages: tuple[str, ...] | None,
    full: bool,
    explain: bool,
    lang: Lang | None,
    cell: str | None,
    focus: str | None,
) -> "RenderOptions":
    """Render options with the language resolved and --cell/--focus turned into positions."""
    from attn_cli.present.i18n import default_lang
    from attn_cli.present.render import RenderOptions

    options = RenderOptions(
        precision,
        stages,
        full,
        explain=explain,
        lang=default_lang(os.environ) if lang is None else lang.value,
    )
    if cell is None and focus is None:
        return options
    from attn_cli.present.worked import parse_cell, resolve_position  # only these options need it

    return replace(
        options,
        cell=None if cell is None else parse_cell(cell, result.query_labels, result.key_labels),
        focus=(
            None
            if focus is None
            else resolve_position(focus, result.query_labels, "--focus", "query")
        ),
    )


def _document(
    result: "Trace",
    options: "RenderOptions",
    fmt: TraceFormat | HeatmapFormat,
    heatmap: bool | None,
    width: int | None,
    view: str = "trace",
) -> str:
    """The trace as a Markdown, LaTeX, HTML or SVG document."""
    title = result.inputs.name or "attention trace"
    if fmt.value in ("markdown", "latex"):
        from attn_cli.present.export_text import to_latex, to_markdown

        options = replace(options, heatmap=bool(heatmap))
        return (to_markdown if fmt.value == "markdown" else to_latex)(result, options)
    from attn_cli.present.render import render_heatmap, render_trace, to_html, to_svg

    options = replace(options, heatmap=heatmap is not False)  # coloured: on unless --no-heatmap
    renderable = (render_heatmap if view == "heatmap" else render_trace)(result, options)
    export = to_html if fmt.value == "html" else to_svg
    return export(renderable, width or NON_TERMINAL_WIDTH, title)


@app.command()
def check(
    fixtures: Annotated[
        list[str],
        typer.Argument(
            help="Fixture files or bundled example names (several need --golden-dir).",
            show_default=False,
        ),
    ],
    golden: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--golden", "-g", help="Compare with this golden JSON trace."),
    ] = None,
    golden_dir: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Golden files named after each fixture: DIR/<name>.json."),
    ] = None,
    against: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            help="Grade your own implementation: a .json (stage -> nested list, or a JSON "
            "trace) or .npz (arrays named after stages) that your code wrote."
        ),
    ] = None,
    update: Annotated[
        bool,
        typer.Option(help="(Re)write the golden file(s) from the current trace, atomically."),
    ] = False,
    rtol: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            min=0,
            help="Relative tolerance (default 1e-9; 1e-4 with --against).",
            show_default=False,
        ),
    ] = None,
    atol: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            min=0,
            help="Absolute tolerance (default 1e-12; 1e-5 with --against).",
            show_default=False,
        ),
    ] = None,
    stage: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--stage", "-s", help="Compare only this stage; repeat for more."),
    ] = None,
    worst: Annotated[
        int, typer.Option(min=1, help="Worst cells listed for the first stage that differs.")
    ] = 5,
    fmt: Annotated[
        Format,
        typer.Option("--format", "-f", help="table (coloured on a terminal), plain, json."),
    ] = Format.table,
    width: WidthOption = None,
    color: ColorOption = None,
    max_elements: MaxElementsOption = DEFAULT_MAX_ELEMENTS,
) -> None:
    """Compare a fixture's trace with a golden file, its `expected` section, or your own code.

    A cell passes when |actual - expected| <= atol + rtol*|expected|; nan, inf and -inf
    equal only themselves. Exit code as diff: 0 same, 1 different, 2 trouble.

    Examples:

      attn check my.yaml --golden golden/my.json --update   # write the golden

      attn check my.yaml --golden golden/my.json            # compare with it

      attn check fixtures/*.yaml --golden-dir golden/       # several at once

      attn check my.yaml                                    # its own `expected` section

      attn check the_cat_sat --against my_dump.npz          # grade your implementation
    """
    with _user_errors():
        from attn_cli.check.compare import (
            GOLDEN_TOLERANCE,
            GRADER_TOLERANCE,
            Outcome,
            Tolerance,
            exit_code,
            render_outcomes,
            report_json,
            summary_lines,
        )

        stages = _check_stages(stage)
        _check_plan(fixtures, golden, golden_dir, against, update, stages)
        default = GRADER_TOLERANCE if against is not None else GOLDEN_TOLERANCE
        tolerance = Tolerance(
            default.rtol if rtol is None else rtol, default.atol if atol is None else atol
        )
        goldens = [_golden_path(f, golden, golden_dir) for f in fixtures]
        outcomes: list[Outcome] = []
        for fixture, path in zip(fixtures, goldens, strict=True):
            try:
                outcomes.append(
                    _check_one(fixture, path, against, update, tolerance, stages, worst,
                               max_elements)
                )  # fmt: skip
            except AttnError as e:
                if len(fixtures) == 1:
                    raise
                message = _one_line(e)
                typer.echo(f"Error: {message}", err=True)
                outcomes.append(Outcome(fixture, error=message))
        if fmt is Format.json:
            _emit(report_json(outcomes), None)
        else:
            details = render_outcomes(outcomes, worst=worst)
            if details is not None and _plain(fmt, color):
                _emit(_plain_text(details, width), None)
            elif details is not None:
                _console(width, plain=False, color=color).print(details)
            _emit("".join(line + "\n" for line in summary_lines(outcomes)), None)
    raise typer.Exit(exit_code(outcomes))


def _check_plan(
    fixtures: list[str],
    golden: Path | None,
    golden_dir: Path | None,
    against: Path | None,
    update: bool,
    stages: tuple[str, ...] | None,
) -> None:
    """Refuse option combinations that have no meaning, naming what would."""
    given = [n for n, v in (("--golden", golden), ("--golden-dir", golden_dir),
                            ("--against", against)) if v is not None]  # fmt: skip
    if len(given) > 1:
        raise UsageError("", " and ".join(given), "given together", "one of them")
    if golden is not None and len(fixtures) > 1:
        raise UsageError(
            "", "--golden", f"one golden file for {len(fixtures)} fixtures",
            "--golden-dir DIR (a golden per fixture, DIR/<name>.json)",
        )  # fmt: skip
    if against is not None and len(fixtures) > 1:
        raise UsageError("", "--against", f"one dump for {len(fixtures)} fixtures", "one fixture")
    if update and golden is None and golden_dir is None:
        raise UsageError("", "--update", "nothing to update", "--golden FILE or --golden-dir DIR")
    if update and stages is not None:
        raise UsageError("", "--update", "given with --stage", "--update alone (goldens hold "
                         "every stage)")  # fmt: skip
    if golden_dir is not None and not golden_dir.is_dir():
        raise UsageError(str(golden_dir), "--golden-dir", "is not a directory", "a directory")
    if golden_dir is not None:
        stems = [_fixture_stem(f) for f in fixtures]
        twice = sorted({s for s in stems if stems.count(s) > 1})
        if twice:
            raise UsageError(
                "", "--golden-dir", f"two fixtures are both named {twice[0]!r}",
                "fixtures with distinct names (each golden is named after its fixture)",
            )  # fmt: skip


def _fixture_stem(fixture: str) -> str:
    if fixture == "-":
        raise UsageError(
            "<stdin>", "--golden-dir", "standard input has no name to give a golden file",
            "a fixture path or example name",
        )  # fmt: skip
    return Path(fixture).stem


def _golden_path(fixture: str, golden: Path | None, golden_dir: Path | None) -> Path | None:
    if golden_dir is not None:
        return golden_dir / f"{_fixture_stem(fixture)}.json"
    return golden


def _check_one(
    fixture: str,
    golden: Path | None,
    against: Path | None,
    update: bool,
    tolerance: "Tolerance",
    stages: tuple[str, ...] | None,
    worst: int,
    max_elements: int,
) -> "Outcome":
    from attn_cli.check.compare import Outcome, check_expected, check_golden, write_golden

    result = _run(fixture, max_elements)
    if update:
        assert golden is not None
        return Outcome(fixture, written=write_golden(result, golden))
    if against is not None:
        from attn_cli.check.grade import grade, load_dump

        return Outcome(fixture, grade(result, load_dump(against), tolerance, stages, worst))
    if golden is not None:
        return Outcome(fixture, check_golden(result, golden, tolerance, stages, worst))
    return Outcome(fixture, check_expected(result, tolerance, stages, worst))


def _plain(fmt: Format, color: bool | None) -> bool:
    """Plain text: asked for, or a table for a pipe or under NO_COLOR, unless --color."""
    if fmt is Format.plain:
        return True
    if fmt is not Format.table or color:
        return False
    return bool(os.environ.get("NO_COLOR")) or not sys.stdout.isatty()


def _plain_text(renderable: Any, width: int | None) -> str:
    """A renderable as plain text: no colour, fixed width, no trailing blanks."""
    console = _console(width or NON_TERMINAL_WIDTH, plain=True, color=False)
    with console.capture() as capture:
        console.print(renderable)
    return "\n".join(line.rstrip() for line in capture.get().splitlines()) + "\n"


@app.command()
def examples(
    copy: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--copy", metavar="NAME", help="Copy the bundled example NAME to FILE."),
    ] = None,
    file: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Argument(help="Where --copy writes (default: NAME.yaml here).", show_default=False),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite FILE if it exists.")] = False,
) -> None:
    """List the bundled examples: name, description and shapes.

    Trace one with:  attn trace NAME

    Copy one to edit:  attn examples --copy the_cat_sat my.yaml
    """
    with _user_errors():
        if copy is not None or file is not None:
            _copy_example(copy, file, force)
            return
        from rich.table import Table
        from rich.text import Text

        from attn_cli.io.examples import DEFAULT_EXAMPLE, example_paths
        from attn_cli.io.fixture import parse_fixture
        from attn_cli.present.render import safe

        table = Table(title="Bundled examples (attn trace NAME)", title_justify="left")
        table.add_column("name", style="bold", no_wrap=True)
        table.add_column("description", ratio=3)
        table.add_column("shapes", ratio=2)
        for name, path in example_paths().items():
            inputs = parse_fixture(path.read_bytes(), path.name)
            label = name + (" (default)" if name == DEFAULT_EXAMPLE else "")
            table.add_row(label, Text(safe(inputs.description)), _shape_summary(inputs))
        _console(None, plain=False, color=None).print(table)


def _copy_example(name: str | None, file: Path | None, force: bool) -> None:
    from attn_cli.io.examples import example_paths, find_example

    if name is None:
        raise UsageError(
            str(file), "FILE", "given without --copy", "attn examples --copy NAME FILE"
        )
    bundled = find_example(name)
    if bundled is None:
        names = ", ".join(example_paths()) or "none installed"
        raise UsageError("", f"--copy {name}", "no such bundled example", f"one of {names}")
    target = file if file is not None else Path(name + bundled.suffix)
    _refuse_overwrite(target, force)
    from attn_cli.io.files import write_atomic

    text = bundled.read_text(encoding="utf-8")
    write_atomic(target, text, option="FILE")
    typer.echo(
        f"Wrote {printable(str(target))} (a copy of {name}; trace it with: "
        f"attn trace {printable(str(target))})",
        err=True,
    )


def _refuse_overwrite(target: Path, force: bool) -> None:
    if target.exists() and not target.is_dir() and not force:
        raise UsageError(str(target), "", "already exists", "a new file name, or --force")


@app.command()
def heatmap(
    fixture: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(
            help="Fixture file, '-' for standard input, or a bundled example's name. "
            "Default: the_cat_sat.",
            show_default=False,
        ),
    ] = None,
    fmt: Annotated[
        HeatmapFormat,
        typer.Option("--format", "-f", help="table (coloured), plain, html or svg."),
    ] = HeatmapFormat.table,
    output: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--output", "-o", help="Write to this file (atomically) instead of stdout."),
    ] = None,
    precision: Annotated[int, typer.Option(min=0, max=17, help="Digits after the point.")] = 2,
    width: WidthOption = None,
    color: ColorOption = None,
    lang: Annotated[
        Optional[Lang],  # noqa: UP045
        typer.Option(help="Language of the legend: en or zh (default: from LANG/LC_ALL)."),
    ] = None,
    max_elements: MaxElementsOption = DEFAULT_MAX_ELEMENTS,
) -> None:
    """Only the attention weights, shaded: one table per head, side by side when they fit.

    Examples:

      attn heatmap                        # "The cat sat"

      attn heatmap causal_multihead       # two heads side by side

      attn heatmap my.yaml -f svg -o weights.svg
    """
    with _user_errors():
        result = _run(fixture, max_elements)
        _warn_empty_rows(result)
        from attn_cli.present.render import render_heatmap

        options = _classroom_options(result, precision, None, False, False, lang, None, None)
        options = replace(options, heatmap=True)
        if fmt in (HeatmapFormat.html, HeatmapFormat.svg):
            _emit(_document(result, options, fmt, True, width, view="heatmap"), output)
            return
        renderable = render_heatmap(result, options)
        if output is not None or fmt is HeatmapFormat.plain or _plain(Format.table, color):
            if width is None and (output is not None or not sys.stdout.isatty()):
                width = NON_TERMINAL_WIDTH
            _emit(_plain_text(renderable, width), output)
        else:
            _console(width, plain=False, color=color).print(renderable)


@app.command()
def new(
    file: Annotated[Path, typer.Argument(help="The fixture to write (.yaml or .yml).")],
    seq: Annotated[int, typer.Option(min=1, max=256, help="Tokens (positions).")] = 5,
    d_model: Annotated[int, typer.Option(min=1, max=1024, help="Embedding size.")] = 8,
    d_k: Annotated[int, typer.Option(min=1, max=256, help="Query/key/value size per head.")] = 4,
    heads: Annotated[int, typer.Option(min=1, max=16, help="Attention heads.")] = 2,
    batch: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(min=1, max=16, help="Add a batch axis of this size."),
    ] = None,
    causal: Annotated[bool, typer.Option("--causal", help="Causal (decoder) masking.")] = False,
    seed: Annotated[int, typer.Option(min=0, help="Random seed: same seed, same fixture.")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Overwrite FILE if it exists.")] = False,
) -> None:
    """Write a random, commented fixture to edit (tokens included), then trace it.

    Examples:

      attn new mine.yaml                                  # seq 5, d_model 8, 2 heads of d_k 4

      attn new mine.yaml --seq 4 --d-model 6 --d-k 3 --heads 1 --causal --seed 7
    """
    with _user_errors():
        from attn_cli.io.new import FIXTURE_SUFFIXES, NewFixture, new_fixture

        if file.suffix.lower() not in FIXTURE_SUFFIXES:
            raise UsageError(str(file), "FILE", "is not a .yaml or .yml file", "FILE.yaml")
        _refuse_overwrite(file, force)
        text = new_fixture(NewFixture(seq, d_model, d_k, heads, batch, causal, seed))
        from attn_cli.io.fixture import parse_fixture

        parse_fixture(text, str(file), fmt="yaml")  # what we write must load
        from attn_cli.io.files import write_atomic

        write_atomic(file, text, option="FILE")
        typer.echo(
            f"Wrote {printable(str(file))}; trace it with: "
            f"attn trace {printable(str(file))} --explain",
            err=True,
        )


def _shape_summary(inputs: "Inputs") -> str:
    parts: list[str] = [inputs.mode]
    if inputs.has_batch:
        parts.append(f"batch {inputs.batch}")
    if inputs.seq_q == inputs.seq_k:
        parts.append(f"seq {inputs.seq_q}")
    else:
        parts.append(f"seq {inputs.seq_q}x{inputs.seq_k}")
    if inputs.d_model is not None:
        parts.append(f"d_model {inputs.d_model}")
    heads = f"heads {inputs.heads}"
    if inputs.kv_heads != inputs.heads:
        heads += f"/{inputs.kv_heads} kv"
    parts += [heads, f"d_k {inputs.d_k}"]
    if inputs.causal:
        parts.append("causal")
    if inputs.W_O is not None:
        parts.append("W_O")
    return ", ".join(parts)


def _check_stages(stage: list[str] | None) -> tuple[str, ...] | None:
    if not stage:
        return None
    for name in stage:
        if name not in STAGE_NAMES:
            import difflib

            close = difflib.get_close_matches(name, STAGE_NAMES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UsageError(
                "", f"--stage {name}", f"unknown stage{hint}", "one of " + ", ".join(STAGE_NAMES)
            )
    return tuple(dict.fromkeys(stage))


def _run(
    fixture: str | None,
    max_elements: int,
    max_memory: str | None = None,
    keep: tuple[str, ...] | None = None,
    dtype: str = "float64",
    status: "Status | None" = None,
) -> "Trace":
    from attn_cli.core.memory import check_memory, parse_size
    from attn_cli.core.pipeline import DTYPES, run

    budget = None if max_memory is None else parse_size(max_memory)
    inputs = _load(fixture, max_elements)
    itemsize = 4 if dtype == "float32" else 8
    check_memory(inputs, budget, keep, itemsize)  # refused before any stage is computed
    assert dtype in DTYPES
    progress = None if status is None else status.progress("computing attention")
    return run(inputs, keep=keep, dtype=dtype, progress=progress)


def _kept(stages: tuple[str, ...] | None, shade: bool, needs_all: bool) -> tuple[str, ...] | None:
    """The stages to keep for --stage: all when explaining or stepping (they read others)."""
    if stages is None or needs_all:
        return None
    if "softmax" in stages and shade:
        return (*stages, "masked")  # a heatmap of softmax marks the masked cells
    return stages


def _load(fixture: str | None, max_elements: int) -> "Inputs":
    """A fixture from a path, standard input ('-') or a bundled example's name."""
    from attn_cli.io.examples import DEFAULT_EXAMPLE, example_paths, find_example
    from attn_cli.io.fixture import load_fixture, parse_fixture

    if fixture == "-":
        if sys.stdin is None:
            raise UsageError(
                "<stdin>", "", "standard input is closed",
                "a fixture piped in, e.g. attn trace - < fixture.yaml",
            )  # fmt: skip
        if sys.stdin.isatty():
            raise UsageError(
                "<stdin>", "", "standard input is a terminal",
                "a fixture piped in, e.g. attn trace - < fixture.yaml",
            )  # fmt: skip
        return load_fixture("-", max_elements=max_elements)
    name = DEFAULT_EXAMPLE if fixture is None else fixture
    path = Path(name)
    if fixture is not None and (_exists(path) or path.suffix or "/" in name or "\\" in name):
        return load_fixture(path, max_elements=max_elements)
    bundled = find_example(name)
    if bundled is None:
        names = ", ".join(example_paths()) or "none installed"
        raise UsageError(
            name, "", "no such file or bundled example",
            f"a fixture path or an example name ({names})",
        )  # fmt: skip
    return parse_fixture(bundled.read_bytes(), bundled.name, max_elements=max_elements)


def _exists(path: Path) -> bool:
    """Whether something is at ``path``; a name too long for the system is a file name too."""
    try:
        return os.path.lexists(path)
    except (OSError, ValueError):
        return True  # let the loader name the problem


def _warn_empty_rows(result: "Trace", most: int = 5) -> None:
    from attn_cli.present.render import safe

    rows = result.empty_rows
    for b, h, t in rows[:most]:
        where = [f"batch {b}"] if result.inputs.has_batch else []
        where += [f"head {h}", f"query {t} {safe(result.query_labels[t])!r}"]
        typer.echo(
            f"Warning: {safe(result.inputs.source)}: softmax[{', '.join(where)}]: no key may be "
            "attended, so all its weights are 0 (as torch SDPA >= 2.5 does)",
            err=True,
        )
    if len(rows) > most:
        typer.echo(
            f"Warning: ... and {len(rows) - most} more rows with nothing to attend to", err=True
        )


def _console(
    width: int | None, *, plain: bool, color: bool | None, record: bool = False
) -> "Console":
    from rich.console import Console

    if width is None and not sys.stdout.isatty():
        width = NON_TERMINAL_WIDTH
    no_color = plain or color is False
    return Console(
        width=width,
        color_system=None if no_color else "auto",
        force_terminal=True if color and not plain else None,
        no_color=no_color or None,
        highlight=False,
        emoji=False,
        markup=False,
    )


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from attn_cli.io.files import write_atomic
    from attn_cli.present.progress import Status

    with Status(f"writing {output}"):
        write_atomic(output, text)
    typer.echo(f"Wrote {printable(str(output))} ({len(text.encode('utf-8')):,} bytes)", err=True)


def _emit_binary(write: Callable[[IO[bytes]], object], output: Path) -> None:
    from attn_cli.io.files import write_atomic_with
    from attn_cli.present.progress import Status

    with Status(f"writing {output}"):
        write_atomic_with(output, write)
    size = output.stat().st_size if output.is_file() else 0
    typer.echo(f"Wrote {printable(str(output))} ({size:,} bytes)", err=True)


def main() -> None:
    """Entry point of the ``attn`` console script: every ending is an exit code, no traceback.

    0 done, 1 a check found a difference, 2 an error (one ``Error:`` line on stderr), 130 Ctrl-C;
    a reader that goes away (``attn trace | head -1``) ends it quietly, as SIGPIPE ends ``cat``.
    """
    _guard_closed_streams()
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        try:
            app()
        finally:
            sys.stdout.flush()  # a full disk shows here, not as a warning at interpreter exit
    except KeyboardInterrupt:  # typer gives 130 inside a command; this covers the rest
        sys.exit(130)
    except AttnError as e:  # standard output closed, found outside a command
        _fail(_one_line(e))
    except MemoryError:
        _fail(_OUT_OF_MEMORY)
    except OSError as e:  # writing to stdout or stderr failed: /dev/full, a broken terminal
        _fail(
            f"{_printable(e.filename) if e.filename else '<stdout>'}: cannot write "
            f"({e.strerror or e}), expected a writable standard output (or -o FILE)"
        )


def _fail(message: str) -> None:
    """Report a failure that escaped the commands, then exit 2 without flushing again."""
    with contextlib.suppress(OSError, ValueError):
        # output that could not be written stays in the buffer: drop it, or exit warns
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if sys.stderr is not None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"Error: {message}\n")
            sys.stderr.flush()
    sys.exit(2)


def _printable(text: object) -> str:
    from attn_cli.errors import printable

    return printable(str(text))


class _ClosedStdout(io.TextIOBase):
    """Stands in for standard output when it is closed (``attn trace >&-``): writing is an error."""

    encoding = "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, s: str) -> int:
        if not s:
            return 0  # Rich flushes an empty buffer after capturing to a string
        raise UsageError(
            "<stdout>", "", "standard output is closed",
            "an open standard output, or -o FILE to write to a file",
        )  # fmt: skip

    def flush(self) -> None:
        pass


def _guard_closed_streams() -> None:
    """Give closed standard streams a stand-in, so that no output is lost without a word."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            # hold the number with /dev/null (read-only), so that no file we open takes it
            with contextlib.suppress(OSError):
                os.open(os.devnull, os.O_RDONLY)
    if sys.stdout is None:
        sys.stdout = _ClosedStdout()
