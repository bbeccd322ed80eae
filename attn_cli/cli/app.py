"""The ``attn`` command: the Typer app, its commands, and the error boundary.

Every command lives in a module of its own (trace.py, check.py, heatmap.py, ...) and only
parses options, calls the library and prints. :data:`COMMANDS` names them; a command's module
is imported only when that command runs or shows its help, so ``attn trace`` does not build
the other seven. Here, and only here, a user's mistake (:class:`AttnError`) becomes one
``Error:`` line on stderr and exit code 2. NumPy, YAML and Rich are imported inside the
commands, so ``attn --help`` stays light.
"""

import contextlib
import functools
import importlib
import io
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, NamedTuple

import typer

from attn_cli._version import __version__
from attn_cli.cli.usage import AttnCommand, AttnGroup
from attn_cli.errors import AttnError, UsageError, printable


class Entry(NamedTuple):
    """A command: its line in ``attn --help`` (the first paragraph of its function's docstring;
    a test keeps the two the same), and the module and function that implement it, when they
    are not named as the command is."""

    summary: str
    module: str = ""
    function: str = ""


COMMANDS: dict[str, Entry] = {
    "trace": Entry("Trace one fixture through every stage of attention and print each as a table."),
    "check": Entry(
        "Compare a fixture's trace with a golden file, its `expected` section, or your own code."
    ),
    "examples": Entry("List the bundled examples: name, description and shapes."),
    "heatmap": Entry(
        "Only the attention weights, shaded: one table per head, side by side when they fit."
    ),
    "new": Entry("Write a random, commented fixture to edit (tokens included), then trace it."),
    "decode": Entry(
        "Decode a causal fixture token by token against a KV cache, checking every step."
    ),
    "flash": Entry(
        "Run the FlashAttention-2 forward tile by tile: S, the running max m, alpha, "
        "P, the running sum l and the accumulator, then O = acc / l and "
        "L = m + log l."
    ),
    "rope": Entry(
        "Show a fixture's RoPE pair by pair: base and scaled frequency, wavelength "
        "against the trained context, the band of its scaling, and the angle at a "
        "position."
    ),
    "probe": Entry(
        "Call your attention function with crafted inputs: which conventions it "
        "follows, and where it differs from PyTorch SDPA."
    ),
    "import": Entry(
        "Import one attention layer of a real checkpoint (safetensors, no torch) as a fixture.",
        module="importer",
        function="import_",
    ),
}


def implementation(name: str) -> tuple[str, str]:
    """The module (under attn_cli.cli) and function of command ``name``."""
    entry = COMMANDS[name]
    return entry.module or name, entry.function or name


class _HelpGroup(AttnGroup):
    """The ``attn`` group: its commands built from :data:`COMMANDS` when asked for."""

    listing = False  # drawing ``attn --help``: the list needs names and summaries only

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self.listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self.listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        if self.listing:
            return typer.core.TyperCommand(cmd_name, short_help=entry.summary)
        return _built(cmd_name)


def examples_kept(text: str) -> str:
    """A docstring for Click's help: prose paragraphs wrap at the terminal's width, an indented
    paragraph (an example) is marked to keep its lines as written (Click's ``\\b``)."""
    import inspect

    return "\n\n".join(
        "\b\n" + p if p.startswith(" ") else p for p in inspect.cleandoc(text).split("\n\n")
    )


app = typer.Typer(
    name="attn",
    cls=_HelpGroup,  # usage errors as one `Error:` line (cli/usage.py), a lighter --help
    help=examples_kept(
        "Trace Transformer self-attention step by step: every stage (X, Q, K, V, scores, scaled, "
        "masked, softmax, output, concat, projected) as a table of real numbers.\n\n"
        "Each command has its own help: attn COMMAND -h.\n\n"
        "Examples:\n\n"
        '  attn trace                    # the bundled "The cat sat"\n\n'
        "  attn trace my.yaml --explain  # your own inputs, explained\n\n"
        "  attn examples                 # the bundled examples"
    ),
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, pwsh)
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    # Click's help, wrapped at the terminal's width up to 120 columns (80 by default)
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"attn {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", callback=_version, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    """Trace Transformer self-attention step by step."""


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a user's mistake into one line on stderr and exit code 2."""
    try:
        yield
    except AttnError as e:
        typer.echo(f"Error: {one_line(e)}", err=True)
        raise typer.Exit(2) from None
    except MemoryError:
        typer.echo(f"Error: {_OUT_OF_MEMORY}", err=True)
        raise typer.Exit(2) from None


_OUT_OF_MEMORY = (
    "ran out of memory, expected a fixture whose trace fits "
    "(lower --max-memory so that such fixtures are refused up front)"
)


def one_line(error: AttnError) -> str:
    """The error as one printable line, its setting named as the command-line flag."""
    field = error.field
    hint = ""
    if error.option is not None:
        flag = f"--{error.option}"
        if field.split(" ", 1)[0] == error.option:
            field = "--" + field  # "stage masked" -> "--stage masked"
        else:
            hint = f" (see {flag})"
    parts = [p for p in (error.source, field) if p]
    what = error.what if error.expected is None else f"{error.what}, expected {error.expected}"
    text = ": ".join([*parts, what]) + hint
    return " ".join(printable(line) for line in text.splitlines())


@functools.cache
def _built(name: str) -> Any:
    """The Click command ``name``: its module imported, its user errors ending as one line
    and exit code 2. Typer builds it as it would a command of ``app``."""
    module, function = implementation(name)
    func = getattr(importlib.import_module(f"attn_cli.cli.{module}"), function)

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> None:
        with user_errors():
            func(*args, **kwargs)

    one = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    help_text = examples_kept(func.__doc__ or "")
    one.command(name=name, cls=AttnCommand, help=help_text, short_help=COMMANDS[name].summary)(
        guarded
    )
    return typer.main.get_command(one)


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
        _fail(one_line(e))
    except MemoryError:
        _fail(_OUT_OF_MEMORY)
    except OSError as e:  # writing to stdout or stderr failed: /dev/full, a broken terminal
        _fail(
            f"{printable(str(e.filename)) if e.filename else '<stdout>'}: cannot write "
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
            "<stdout>",
            "",
            "standard output is closed",
            "an open standard output, or -o FILE to write to a file",
        )

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
