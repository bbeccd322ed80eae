"""Click's usage errors as one ``Error:`` line, and the Typer classes that catch them.

Typer prints a usage error (``--format pdf``, a missing argument, an unknown option, a value out
of range) as a 5-line Rich panel. Here, at the boundary, every such error becomes one line in
the house form, ``Error: <option>: <what>, expected <what>``, on stderr with exit code 2;
``--help`` is left as Typer draws it.
"""

import os
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import typer
import typer.core

from attn_cli.errors import did_you_mean, printable

_VALUE = re.compile(r"^(?P<value>.+?) is not (?:one of|in the range|a valid)\b", re.S)
_METAVARS = {  # what a value of each metavar is, in words
    "STAGE": "a stage name such as softmax",
    "FILE": "a file name",
    "DIR": "a folder",
    "SIZE": "a size such as 8G or 500M",
    "TOKEN": "a token or a 0-based index",
    "QUERY,KEY": "QUERY,KEY (tokens or 0-based indices)",
    "NAME": "a name",
}
_ARGUMENTS = {  # what a missing argument should have been
    "FIXTURE...": "one or more fixture files or bundled example names",
    "FIXTURE": "a fixture file or a bundled example name",
    "FILE": "the file to write",
}


def _click() -> ModuleType:
    """The Click that Typer runs on: vendored as typer._click since 0.28, else click."""
    click: ModuleType = getattr(typer.core, "_click", None) or getattr(typer.core, "click")  # noqa: B009
    return click


@contextmanager
def usage_errors() -> Iterator[None]:
    """Turn Click's usage errors into one ``Error:`` line on stderr and exit code 2."""
    exceptions = _click().exceptions
    try:
        yield
    except exceptions.UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # bare ``attn``: the help, as Typer shows it
            raise
        typer.echo(f"Error: {usage_line(e)}", err=True)
        raise typer.Exit(2) from None


def usage_line(e: Any) -> str:
    """A Click usage error as ``<option>: <what>, expected <what>``: printable, one line."""
    exceptions = _click().exceptions
    ctx = getattr(e, "ctx", None)
    command = _command_name(ctx)
    message = str(getattr(e, "message", "") or e).strip().rstrip(".")
    if isinstance(e, exceptions.NoSuchOption):
        known = _option_names(ctx)
        text = (
            f"{_cut(e.option_name)}: no such option for {command}"
            f"{did_you_mean(e.option_name, known)}, expected one of the options of {command} -h"
        )
    elif isinstance(e, exceptions.MissingParameter) and e.param is not None:
        name = _param_name(e.param)
        text = f"{name}: missing, expected {_ARGUMENTS.get(name) or _expected(e.param)}"
    elif isinstance(e, exceptions.BadParameter) and e.param is not None:
        text = _bad_value(e.param, message)
    elif isinstance(e, exceptions.BadOptionUsage) and "requires an argument" in message:
        param = _find_param(ctx, e.option_name)
        wanted = _expected(param) if param is not None else "a value"
        text = f"{_cut(e.option_name)}: needs a value, expected {wanted}"
    elif message.startswith("No such command"):
        quoted = _FIRST_QUOTED.search(message)
        given = quoted.group(1) if quoted else message
        listed = getattr(ctx.command, "list_commands", None) if ctx else None
        commands = sorted(listed(ctx) if listed else ())
        text = (
            f"{_cut(given)}: no such command{did_you_mean(given, commands)}, "
            f"expected one of {', '.join(commands)}"
        )
    else:
        text = f"{command}: {message[:1].lower()}{message[1:]}, expected {_usage(ctx, command)}"
    return " ".join(printable(line) for line in text.splitlines())


_FIRST_QUOTED = re.compile(r"'([^']*)'")


def _bad_value(param: Any, message: str) -> str:
    """``--format: got 'pdf', expected one of table, plain, json``."""
    found = _VALUE.match(message)
    name = _param_name(param)
    if found is None:
        return f"{name}: {message[:1].lower()}{message[1:]}, expected {_expected(param)}"
    value = found.group("value")
    hint = ""
    choices = getattr(param.type, "choices", None)
    if choices and value[:1] in "'\"":
        hint = did_you_mean(value[1:-1], [_choice(c) for c in choices])
    return f"{name}: got {_cut(value)}{hint}, expected {_expected(param)}"


def _expected(param: Any) -> str:
    """What a parameter takes, in words: its choices, its range, its kind."""
    kind = param.type
    choices = getattr(kind, "choices", None)
    if choices:
        return "one of " + ", ".join(_choice(c) for c in choices)
    low, high = getattr(kind, "min", None), getattr(kind, "max", None)
    number = "an integer" if str(getattr(kind, "name", "")).startswith("int") else "a number"
    if low is not None and high is not None:
        return f"{number} from {low} to {high}"
    if low is not None:
        return f"{number} of at least {low}" if not kind.min_open else f"{number} above {low}"
    if high is not None:
        return f"{number} of at most {high}" if not kind.max_open else f"{number} below {high}"
    if getattr(kind, "name", "") in ("int", "integer", "float"):
        return number
    metavar = str(getattr(param, "metavar", None) or "")
    return _METAVARS.get(metavar, f"a value ({metavar})" if metavar else "a value")


def _choice(choice: Any) -> str:
    return str(getattr(choice, "value", choice))


def _param_name(param: Any) -> str:
    """``--format`` for an option (its long name), ``FIXTURE...`` for an argument."""
    opts: Sequence[str] = getattr(param, "opts", ())
    if getattr(param, "param_type_name", "") == "argument":
        return str(param.metavar or (param.name or "ARGUMENT").upper())
    long = [o for o in opts if o.startswith("--")]
    return (long or list(opts) or [str(param.name)])[0]


def _find_param(ctx: Any, option: str) -> Any:
    if ctx is None:
        return None
    return next((p for p in ctx.command.params if option in getattr(p, "opts", ())), None)


def _option_names(ctx: Any) -> list[str]:
    if ctx is None:
        return []
    return [o for p in ctx.command.params for o in getattr(p, "opts", ()) if o.startswith("--")]


def _usage(ctx: Any, command: str) -> str:
    """``attn trace [OPTIONS] [FIXTURE]``: how the command is called (see its -h)."""
    if ctx is None:
        return f"{command} -h for the usage"
    return " ".join([command, *ctx.command.collect_usage_pieces(ctx)])


def _command_name(ctx: Any) -> str:
    """``attn trace``: the command as the user knows it, whatever the program was called."""
    names: list[str] = []
    while ctx is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["attn", *reversed(names[:-1])])


def _cut(text: str, limit: int = 40) -> str:
    """A value from the command line, cut short enough for a one-line error."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _AsciiDigits(_click().types.ParamType):  # type: ignore[misc]
    """An integer type that refuses a value with characters beyond ASCII: Python's ``int``
    reads ``'٣'`` or ``'３'`` as 3, which a person did not mean as a number. The refusal is
    Click's own, so it prints as the usage line of any value that is not an integer."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and not value.isascii():
            self.fail(f"{value!r} is not a valid {self.name}.", param, ctx)
        return super().convert(value, param, ctx)


class _AsciiInt(_AsciiDigits, _click().types.IntParamType):  # type: ignore[misc]
    """An integer option: ASCII digits only."""


class _AsciiIntRange(_AsciiDigits, _click().types.IntRange):  # type: ignore[misc]
    """An integer option with a range (``min=1``): ASCII digits only."""


def ascii_digits(kind: Any) -> Any:
    """Click's type of a parameter, made to refuse non-ASCII digits when it is an integer."""
    types = _click().types
    if isinstance(kind, types.IntRange):
        return _AsciiIntRange(kind.min, kind.max, kind.min_open, kind.max_open, kind.clamp)
    if isinstance(kind, types.IntParamType):
        return _AsciiInt()
    return kind


class AttnCommand(typer.core.TyperCommand):
    """A command whose usage line shows its arguments as its help does (``FIXTURE...``), whose
    usage errors know the command they come from, and whose integer options take ASCII digits
    only (:func:`ascii_digits`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            param.type = ascii_digits(param.type)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return list(super().parse_args(ctx, args))
        except _click().exceptions.UsageError as e:
            if e.ctx is None:  # Click's parser raises some without one (``--format`` alone)
                e.ctx = ctx
            raise
        except ValueError as e:  # Click's Path conversion: "embedded null byte"
            if "null" not in str(e):
                raise
            raise _click().exceptions.UsageError("a value holds a NUL character", ctx) from None

    def get_help(self, ctx: Any) -> str:
        return help_as_written(super().get_help(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [
            p[1:-1] if p.startswith("{") and p.endswith("}") else p
            for p in super().collect_usage_pieces(ctx)
        ]


class AttnGroup(typer.core.TyperGroup):
    """The ``attn`` group: usage errors as one line; the environment made safe to read first."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        from attn_cli.cli.options import tame_terminal_size

        tame_terminal_size(os.environ)
        tolerant_streams()
        return super().main(*args, **kwargs)

    def get_help(self, ctx: Any) -> str:
        return help_as_written(super().get_help(ctx))

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with usage_errors():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with usage_errors():
            return super().invoke(ctx)


def help_as_written(text: str) -> str:
    """Help as standard output's encoding can show it (ASCII stand-ins in a C locale)."""
    from attn_cli.cli.output import writable

    return writable(text, sys.stdout)


def tolerant_streams() -> None:
    """Standard output and error that write what their encoding cannot hold as ASCII.

    With ``PYTHONIOENCODING=ascii`` or ``LC_ALL=C`` (errors ``surrogateescape``), ``√`` would
    be a UnicodeEncodeError; :func:`attn_cli.cli.output.tolerant` keeps the run going.
    """
    from attn_cli.cli.output import tolerant

    for stream in (sys.stdout, sys.stderr):
        tolerant(stream)
