"""Where command output goes: the console, standard output, or a file written atomically."""

import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import typer

from attn_cli.cli.options import NON_TERMINAL_WIDTH, color_wanted
from attn_cli.errors import printable

if TYPE_CHECKING:
    from rich.console import Console

    from attn_cli.core.pipeline import Trace


def console(width: int | None, *, plain: bool, color: bool | None) -> "Console":
    """A Rich console: plain (no colour, no markup), or coloured as the terminal allows.

    ``color`` is --color/--no-color; unset, NO_COLOR and FORCE_COLOR decide (color_wanted).
    """
    from rich.console import Console

    if width is None and not sys.stdout.isatty():
        width = NON_TERMINAL_WIDTH
    wanted = None if plain else color_wanted(color)
    no_color = plain or wanted is False
    return Console(
        width=width,
        color_system=None if no_color else "auto",
        force_terminal=True if wanted else None,
        no_color=no_color,
        highlight=False,
        emoji=False,
        markup=False,
    )


def plain_text(renderable: Any, width: int | None, *, crop: bool = True) -> str:
    """A renderable as plain text: no colour, fixed width, no trailing blanks; diffs cleanly."""
    out = console(width or NON_TERMINAL_WIDTH, plain=True, color=False)
    with out.capture() as capture:
        out.print(renderable, crop=crop)
    return "\n".join(line.rstrip() for line in capture.get().splitlines()) + "\n"


def note(text: str, *, quiet: bool) -> None:
    """A note or warning on standard error, unless --quiet (errors are never notes)."""
    if not quiet:
        typer.echo(text, err=True)


def emit(text: str, output: Path | None, *, quiet: bool = False) -> None:
    """Text to standard output, or atomically to ``output`` with a note on stderr."""
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from attn_cli.io.files import write_atomic
    from attn_cli.present.progress import Status

    with Status(f"writing {output}"):
        write_atomic(output, text)
    size = len(text.encode("utf-8", errors="backslashreplace"))
    note(f"Wrote {printable(str(output))} ({size:,} bytes)", quiet=quiet)


def emit_binary(write: Callable[[IO[bytes]], object], output: Path, *, quiet: bool = False) -> None:
    """Binary output streamed atomically into ``output``, with a note on stderr."""
    from attn_cli.io.files import write_atomic_with
    from attn_cli.present.progress import Status

    with Status(f"writing {output}"):
        write_atomic_with(output, write)
    size = output.stat().st_size if output.is_file() else 0
    note(f"Wrote {printable(str(output))} ({size:,} bytes)", quiet=quiet)


def warn_empty_rows(result: "Trace", most: int = 5, *, quiet: bool = False) -> None:
    """A warning on stderr for each query row that had nothing to attend to (none if quiet)."""
    rows = result.empty_rows
    if quiet:
        return
    for b, h, t in rows[:most]:
        where = [f"batch {b}"] if result.inputs.has_batch else []
        where += [f"head {h}", f"query {t} {printable(result.query_labels[t])!r}"]
        typer.echo(
            f"Warning: {printable(result.inputs.source)}: softmax[{', '.join(where)}]: no key "
            "may be attended, so all its weights are 0 (as torch SDPA >= 2.5 does)",
            err=True,
        )
    if len(rows) > most:
        typer.echo(
            f"Warning: ... and {len(rows) - most} more rows with nothing to attend to", err=True
        )


def warn_sentinel_rows(result: "Trace", most: int = 5, *, quiet: bool = False) -> None:
    """A warning on stderr for each row a finite mask_value let weight leak into (none if quiet).

    At most ``most`` rows, then a count: a leaking sentinel is usually a whole-fixture matter.
    """
    rows = result.sentinel_rows
    if quiet or not rows:
        return
    source = printable(result.inputs.source)
    value = f"{result.inputs.mask_value:g}"
    for row in rows[:most]:
        where = [f"batch {row.batch}"] if result.inputs.has_batch else []
        label = printable(result.query_labels[row.query])
        where += [f"head {row.head}", f"query {row.query} {label!r}"]
        what = (
            f"no key may be attended, but mask_value {value} made the row uniform "
            "(with -inf its weights would be 0)"
            if row.uniform
            else f"mask_value {value} let {row.leaked:.4g} of the weight through to keys it "
            "should hide (with -inf they would get 0)"
        )
        typer.echo(f"Warning: {source}: softmax[{', '.join(where)}]: {what}", err=True)
    if len(rows) > most:
        typer.echo(
            f"Warning: ... and {len(rows) - most} more rows where mask_value {value} let weight "
            "through",
            err=True,
        )
