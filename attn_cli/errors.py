"""The one place where user-facing error types live; the CLI turns them into ``Error: ...``."""

from __future__ import annotations

from collections.abc import Collection


class AttnError(Exception):
    """Something the user can fix: the CLI prints it as one line and exits 2."""

    def __init__(
        self,
        source: str,
        field: str,
        what: str,
        expected: str | None = None,
        *,
        option: str | None = None,
    ) -> None:
        self.source = source
        self.field = field
        self.what = what
        self.expected = expected
        self.option = option  # the setting it concerns, named as a CLI flag only by the CLI
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = [p for p in (self.source, self.field) if p]
        msg = self.what if self.expected is None else f"{self.what}, expected {self.expected}"
        return ": ".join([*parts, msg])


class InputError(AttnError):
    """A fixture (or another input file) is unreadable or breaks the fixture format."""


class ComputeError(AttnError):
    """A stage produced a value that is not finite (overflow), named by stage and position."""


class UsageError(AttnError):
    """A command-line option or argument does not make sense."""


class ProbeError(AttnError):
    """The function under ``attn probe`` cannot be asked: it raised, hung or returned no array."""


def printable(text: str) -> str:
    r"""``text`` with each non-printable character escaped (ESC becomes ``\x1b``): safe to print."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def did_you_mean(name: str, choices: Collection[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or nothing: the one such hint."""
    import difflib

    options = [str(c) for c in choices]
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    if not close:
        close = [c for c in options if c.lower() == name.lower()]
    return f" (did you mean {close[0]!r}?)" if close else ""


def field_name(key: object) -> str:
    """A fixture key as it may appear in a one-line message: short, printable, else repr."""
    shown = str(key) if len(str(key)) <= 40 else str(key)[:37] + "..."
    return shown if shown.isprintable() and shown.strip() == shown != "" else repr(shown)
