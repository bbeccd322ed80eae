"""What ``attn decode`` and ``attn flash`` share: their view options, step mode, and where a
run's tables or JSON go.
"""

import sys
from collections.abc import Iterable, Sequence
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple, Optional

import typer

from attn_cli.cli.options import NON_TERMINAL_WIDTH, Format, Lang, plain_wanted
from attn_cli.cli.output import console, emit, plain_text
from attn_cli.errors import AttnError, UsageError

if TYPE_CHECKING:
    from attn_cli.present.options import RenderOptions

FormatOption = Annotated[
    Format,
    typer.Option("--format", "-f", help="table (Rich), plain (no colour) or json (every step)."),
]


class RunFormat(str, Enum):
    """What ``attn decode`` and ``attn flash`` write: Format's three and the interactive page."""

    table = "table"
    plain = "plain"
    json = "json"
    html = "html"


RunFormatOption = Annotated[
    RunFormat,
    typer.Option(
        "--format",
        "-f",
        help="table (Rich), plain (no colour), json (every step) or html (one interactive page, "
        "step by step: docs/html.md).",
    ),
]
FullOption = Annotated[bool, typer.Option(help="Show every step, row and column; no elision.")]
ExplainOption = Annotated[
    bool, typer.Option("--explain", help="Explain every quantity: the query, the cache, ...")
]
StepOption = Annotated[
    bool,
    typer.Option(
        "--step", help="One step at a time, explained: Enter/Space/→ next, ←/b back, q quit."
    ),
]


class RunView(NamedTuple):  # built at import on every decode and flash run: no dataclass
    """A run's views by name, imported only when shown: pages, titles, tables, JSON."""

    module: str  # the present module with the pages, titles and tables
    pages: str
    titles: str
    render: str
    dumps: str  # in attn_cli.io.decode_json, or "module:function"
    page: str = ""  # the interactive page (-f html): in html_steps, or "module:function"


class RunOutput(NamedTuple):
    """How a run is shown: the view options of attn decode and attn flash."""

    fmt: Format | RunFormat
    output: Optional[Path]  # noqa: UP045
    precision: int
    full: bool
    width: Optional[int]  # noqa: UP045
    color: Optional[bool]  # noqa: UP045
    explain: bool
    lang: Optional[Lang]  # noqa: UP045
    quiet: bool
    step: bool


def show_run(
    run: Any,
    view: RunView,
    out: RunOutput,
    failure: Optional[AttnError],  # noqa: UP045
) -> None:
    """Step mode (exits, raising ``failure`` first if any), else JSON or tables."""
    from importlib import import_module

    if out.step:
        module = import_module(view.module)
        options = render_options(out.precision, out.full, True, out.lang)
        pages = getattr(module, view.pages)(run, options)
        titles = getattr(module, view.titles)(run, options.lang)
        code = step_through(pages, titles, options, out.fmt, out.width, out.color)
        if failure is not None:
            raise failure
        raise typer.Exit(code)
    if out.fmt.value == "html" and view.page:
        where, _, name = view.page.rpartition(":")
        page = getattr(import_module(where or "attn_cli.present.html_steps"), name)
        options = render_options(out.precision, out.full, True, out.lang)
        emit(page(run, options), out.output, quiet=out.quiet, escape="xml")
    elif out.fmt.value == "json":
        where, _, name = view.dumps.rpartition(":")
        dumps = getattr(import_module(where or "attn_cli.io.decode_json"), name)
        emit(dumps(run), out.output, quiet=out.quiet, escape="json")
    else:
        render = getattr(import_module(view.module), view.render)
        options = render_options(out.precision, out.full, out.explain, out.lang)
        show(render(run, options), out.fmt, out.output, out.width, out.color, out.full, out.quiet)


def refuse_step(step: bool, fmt: Format | RunFormat, output: Optional[Path]) -> None:  # noqa: UP045
    """--step pages through the terminal: refused, as attn trace does, with -o or --format json
    (or html)."""
    if step and (output is not None or fmt.value in ("json", "html")):
        what = "html" if fmt.value == "html" else "json"
        raise UsageError("", "--step", "works only in the terminal", f"no --format {what}/-o")


def step_through(
    pages: Iterable[Any],
    titles: Sequence[str],
    options: "RenderOptions",
    fmt: Format | RunFormat,
    width: Optional[int],  # noqa: UP045
    color: Optional[bool],  # noqa: UP045
) -> int:
    """Page through ``pages`` in attn trace's step-mode pager; the exit code."""
    from attn_cli.cli import collect_as_usual
    from attn_cli.present.step import run_pages

    collect_as_usual()  # a person pages through it, for as long as they like

    plain = plain_wanted(fmt, color)
    out = console(width, plain=plain, color=False if plain else color)
    return run_pages(pages, titles, options.lang, out)


def render_options(
    precision: int,
    full: bool,
    explain: bool,
    lang: Optional[Lang],  # noqa: UP045
    stages: tuple[str, ...] | None = None,
) -> "RenderOptions":
    """Render options with the language resolved (LANG/LC_ALL when --lang is not given)."""
    import os

    from attn_cli.present.i18n import default_lang
    from attn_cli.present.options import RenderOptions

    language = default_lang(os.environ) if lang is None else lang.value
    return RenderOptions(precision, stages, full, explain=explain, lang=language)


def show(
    renderable: Any,
    fmt: Enum,
    output: Optional[Path],  # noqa: UP045
    width: Optional[int],  # noqa: UP045
    color: Optional[bool],  # noqa: UP045
    full: bool,
    quiet: bool,
) -> None:
    """Tables as plain text (a file, a pipe, --format plain) or coloured on the terminal."""
    if output is not None or plain_wanted(fmt, color):
        write_plain(renderable, output, width, full=full, quiet=quiet)
        return
    console(width, plain=False, color=color).print(renderable, crop=not full)


def write_plain(
    renderable: Any,
    output: Optional[Path],  # noqa: UP045
    width: Optional[int],  # noqa: UP045
    *,
    full: bool,
    quiet: bool,
) -> None:
    """Tables as plain text to ``output`` or standard output: at a fixed width (stable for
    diffs) when written to a file or a pipe and no --width is given."""
    if width is None and (output is not None or not sys.stdout.isatty()):
        width = NON_TERMINAL_WIDTH
    emit(plain_text(renderable, width, crop=not full), output, quiet=quiet)
