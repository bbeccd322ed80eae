"""Where command output goes: the console, standard output, or a file written atomically.

A standard stream whose encoding cannot hold attn's text (``LC_ALL=C``, ``PYTHONIOENCODING=ascii``)
gets an ASCII rendering of what it cannot encode instead of a UnicodeEncodeError: ``−∞`` becomes
``-inf``, ``·`` ``*``, box drawing ``-|+``, and any other character a JSON-style ``\\u00e9``
escape, so that JSON written to such a stream stays valid (see :func:`tolerant`).
"""

import codecs
import contextlib
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


ASCII_FALLBACK = "attn-ascii"  # codec error handlers: readable ASCII, or exact JSON escapes
JSON_FALLBACK = "attn-json"
_REPLACEABLE = frozenset({"strict", "surrogateescape", "backslashreplace"})
_ASCII = {
    "−": "-",
    "–": "-",
    "—": "-",
    "∞": "inf",
    "·": "*",
    "×": "x",
    "÷": "/",
    "±": "+-",
    "√": "sqrt",
    "Σ": "sum",
    "∘": "o",
    "∂": "d",
    "∈": "in",
    "≤": "<=",
    "≥": ">=",
    "…": "...",
    "→": "->",
    "←": "<-",
    "↑": "^",
    "↓": "v",
    "◀": "<",
    "▶": ">",
    "ᵀ": "^T",
    "²": "^2",
    "⁻": "^-",
    "¹": "1",
    "₂": "2",
    "“": '"',
    "”": '"',
    "‘": "'",
    "’": "'",
    "✓": "ok",
    "✗": "x",
    "α": "alpha",
    "δ": "delta",
    "θ": "theta",
    "\u0302": "^",
    "\u00a0": " ",
}


def ascii_char(ch: str, exact: bool = False) -> str:
    """One character as ASCII: a readable stand-in (``−`` -> ``-``), else ``\\uXXXX`` (as JSON
    writes it, a surrogate pair above U+FFFF); ``exact`` gives the escape always."""
    if not exact:
        if ch in _ASCII:
            return _ASCII[ch]
        if "\u2500" <= ch <= "\u257f":  # box drawing: ─ │ ┼ as Rich's ASCII boxes draw them
            import unicodedata

            name = unicodedata.name(ch, "")
            if " AND " in name or ("HORIZONTAL" not in name and "VERTICAL" not in name):
                return "+"  # a corner, a junction or an arc
            return "-" if "HORIZONTAL" in name else "|"
        if "\u2580" <= ch <= "\u259f":  # block elements (heatmap cells)
            return "#"
    code = ord(ch)
    if code > 0xFFFF:
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def _fallback(exact: bool) -> "Callable[[UnicodeError], tuple[str, int]]":
    def handler(error: UnicodeError) -> tuple[str, int]:
        if not isinstance(error, UnicodeEncodeError):
            raise error
        bad = error.object[error.start : error.end]
        return "".join(ascii_char(ch, exact) for ch in bad), error.end

    return handler


codecs.register_error(ASCII_FALLBACK, _fallback(exact=False))
codecs.register_error(JSON_FALLBACK, _fallback(exact=True))


def writable(text: str, stream: object) -> str:
    """``text`` as ``stream``'s encoding holds it, the rest as readable ASCII (``→`` -> ``->``).

    For help, which Click prints through a UTF-8 stream of its own when standard output is ASCII
    (``LC_ALL=C``): what reaches the terminal is what the locale can show.
    """
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        return text.encode(encoding, ASCII_FALLBACK).decode(encoding)
    except LookupError:  # an encoding Python does not know: Click's stream decides
        return text


# What a stream that cannot encode a character writes instead: readable ASCII for text (``-inf``
# for ``−∞``), ``\uXXXX`` for JSON and ``&#8722;`` for HTML and SVG, both read back exactly.
ESCAPES = {"text": ASCII_FALLBACK, "json": JSON_FALLBACK, "xml": "xmlcharrefreplace"}


def tolerant(stream: object, *, escape: str = "text") -> None:
    """Make a text stream write what its encoding cannot hold as :data:`ESCAPES` says for
    ``escape`` ("text", "json" or "xml") instead of raising UnicodeEncodeError.

    A stream with ``strict`` or ``surrogateescape`` errors (stdout in an ASCII locale) fails on
    ``√``; ``backslashreplace`` (stderr) writes ``\xb7``, which JSON cannot read. A stream
    without ``reconfigure``, or with an error handler of its caller's choosing, is left alone.
    """
    reconfigure = getattr(stream, "reconfigure", None)
    errors = getattr(stream, "errors", None)
    if reconfigure is None or errors not in _REPLACEABLE | set(ESCAPES.values()):
        return
    wanted = ESCAPES[escape]
    if errors != wanted:
        with contextlib.suppress(ValueError, OSError):  # closed or detached: nothing to do
            reconfigure(errors=wanted)


def console(width: int | None, *, plain: bool, color: bool | None) -> "Console":
    """A Rich console: plain (no colour, no markup), or coloured as the terminal allows.

    ``color`` is --color/--no-color; unset, NO_COLOR and FORCE_COLOR decide (color_wanted).
    """
    from rich.console import Console

    tolerant(sys.stdout)  # Rich writes to it as it prints
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
    """A renderable as plain text: no colour, fixed width, no trailing blanks (at the end of a
    line or of the text); diffs cleanly."""
    out = console(width or NON_TERMINAL_WIDTH, plain=True, color=False)
    with out.capture() as capture:
        out.print(renderable, crop=crop)
    return "\n".join(line.rstrip() for line in capture.get().splitlines()).rstrip("\n") + "\n"


def note(text: str, *, quiet: bool) -> None:
    """A note or warning on standard error, unless --quiet (errors are never notes)."""
    if not quiet:
        typer.echo(text, err=True)


def emit(text: str, output: Path | None, *, quiet: bool = False, escape: str = "text") -> None:
    """Text to standard output, or atomically to ``output`` with a note on stderr; ``escape``
    ("json", "xml") keeps a data format exact on a stdout that cannot encode it (tolerant)."""
    if output is None:
        tolerant(sys.stdout, escape=escape)
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


def warn_rows(result: "Trace", *, quiet: bool = False) -> None:
    """The warnings on a trace's softmax rows: those with nothing to attend to, then those a
    finite mask_value let weight leak into (none if quiet)."""
    warn_empty_rows(result, quiet=quiet)
    warn_sentinel_rows(result, quiet=quiet)


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
