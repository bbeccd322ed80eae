"""The ``attn`` command: parse options, call the library, print. Nothing else lives here.

NumPy, YAML and the renderers are imported inside the commands, so ``attn --help`` and
``attn --version`` stay light.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from attn_cli import __version__
from attn_cli.constants import DEFAULT_MAX_ELEMENTS, STAGE_NAMES
from attn_cli.errors import AttnError, UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from attn_cli.fixture import Inputs
    from attn_cli.pipeline import Trace

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
        from attn_cli.render import safe

        message = " ".join(safe(line) for line in str(e).splitlines())
        typer.echo(f"Error: {message}", err=True)
        raise typer.Exit(2) from None


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
        Format,
        typer.Option(
            "--format", "-f", help="table (Rich, coloured on a terminal), plain (no colour), json."
        ),
    ] = Format.table,
    output: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--output", "-o", help="Write to this file (atomically) instead of stdout."),
    ] = None,
    stage: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--stage", "-s", help="Show only this stage; repeat for more."),
    ] = None,
    precision: Annotated[
        int, typer.Option(min=0, max=17, help="Digits after the decimal point in tables.")
    ] = 4,
    full: Annotated[
        bool, typer.Option(help="Show every row, column and table; no elision.")
    ] = False,
    width: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            min=40, help=f"Output width (default: the terminal's, else {NON_TERMINAL_WIDTH})."
        ),
    ] = None,
    color: Annotated[
        Optional[bool],  # noqa: UP045
        typer.Option(
            "--color/--no-color", help="Force colour on or off (default: auto, NO_COLOR)."
        ),
    ] = None,
    max_elements: Annotated[
        int, typer.Option(min=1, help="Refuse fixtures holding more numbers than this.")
    ] = DEFAULT_MAX_ELEMENTS,
) -> None:
    """Trace one fixture through every stage of attention and print each as a table.

    Examples:

      attn trace                                  # the bundled "The cat sat"

      attn trace article_example_2 --stage softmax

      attn trace my.yaml --format json -o trace.json

      cat my.json | attn trace -
    """
    with _user_errors():
        stages = _check_stages(stage)
        result = _run(fixture, max_elements)
        if stages is not None:
            missing = [s for s in stages if s not in result]
            if missing:
                raise UsageError(
                    "", f"--stage {missing[0]}", "this fixture has no such stage",
                    "one of " + ", ".join(result.stages),
                )  # fmt: skip
        _warn_empty_rows(result)
        if fmt is Format.json:
            from attn_cli.export import dumps

            _emit(dumps(result, stages), output)
            return
        from attn_cli.render import RenderOptions, render_trace

        renderable = render_trace(result, RenderOptions(precision, stages, full))
        if output is not None or fmt is Format.plain:
            # Plain text: no colour, fixed width, no trailing blanks; stable enough for diffs.
            if width is None and (output is not None or not sys.stdout.isatty()):
                width = NON_TERMINAL_WIDTH
            console = _console(width, plain=True, color=False)
            with console.capture() as capture:
                console.print(renderable)
            text = "\n".join(line.rstrip() for line in capture.get().splitlines()) + "\n"
            _emit(text, output)
        else:
            _console(width, plain=False, color=color).print(renderable)


@app.command()
def examples() -> None:
    """List the bundled examples: name, description and shapes.

    Trace one with:  attn trace NAME
    """
    with _user_errors():
        from rich.table import Table
        from rich.text import Text

        from attn_cli.examples import DEFAULT_EXAMPLE, example_paths
        from attn_cli.fixture import parse_fixture
        from attn_cli.render import safe

        table = Table(title="Bundled examples (attn trace NAME)", title_justify="left")
        table.add_column("name", style="bold", no_wrap=True)
        table.add_column("description")
        table.add_column("shapes", no_wrap=True)
        for name, path in example_paths().items():
            inputs = parse_fixture(path.read_bytes(), path.name)
            label = name + (" (default)" if name == DEFAULT_EXAMPLE else "")
            table.add_row(label, Text(safe(inputs.description)), _shape_summary(inputs))
        _console(None, plain=False, color=None).print(table)


def _shape_summary(inputs: Inputs) -> str:
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
            close = difflib.get_close_matches(name, STAGE_NAMES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UsageError(
                "", f"--stage {name}", f"unknown stage{hint}", "one of " + ", ".join(STAGE_NAMES)
            )
    return tuple(dict.fromkeys(stage))


def _run(fixture: str | None, max_elements: int) -> Trace:
    from attn_cli.pipeline import run

    return run(_load(fixture, max_elements))


def _load(fixture: str | None, max_elements: int) -> Inputs:
    """A fixture from a path, standard input ('-') or a bundled example's name."""
    from attn_cli.examples import DEFAULT_EXAMPLE, example_paths, find_example
    from attn_cli.fixture import load_fixture, parse_fixture

    if fixture == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError(
                "<stdin>", "", "standard input is a terminal",
                "a fixture piped in, e.g. attn trace - < fixture.yaml",
            )  # fmt: skip
        return load_fixture("-", max_elements=max_elements)
    name = DEFAULT_EXAMPLE if fixture is None else fixture
    path = Path(name)
    if fixture is not None and (path.exists() or path.suffix or "/" in name or "\\" in name):
        return load_fixture(path, max_elements=max_elements)
    bundled = find_example(name)
    if bundled is None:
        names = ", ".join(example_paths()) or "none installed"
        raise UsageError(
            name, "", "no such file or bundled example",
            f"a fixture path or an example name ({names})",
        )  # fmt: skip
    return parse_fixture(bundled.read_bytes(), bundled.name, max_elements=max_elements)


def _warn_empty_rows(result: Trace, most: int = 5) -> None:
    from attn_cli.render import safe

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
) -> Console:
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
    from attn_cli.files import write_atomic

    write_atomic(output, text)
    typer.echo(f"Wrote {output} ({len(text.encode('utf-8')):,} bytes)", err=True)


def main() -> None:
    """Entry point of the ``attn`` console script."""
    app()
