"""A status line on stderr for work that takes a while, shown only to a person at a terminal.

Nothing is shown when stderr is not a terminal (a pipe, a file, a CI log), when ``CI`` is set,
or when ``TERM`` is ``dumb``; nor before ``DELAY`` seconds have passed, so quick commands never
flicker. The line is transient: it is erased when the work ends. Rich is imported only when
the line may be shown.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import IO, Any

DELAY = 0.5  # seconds of work before a status line appears


def wanted(stream: IO[str] | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a status line may be drawn on ``stream`` (default: stderr)."""
    stream = sys.stderr if stream is None else stream
    env = os.environ if environ is None else environ
    if env.get("CI") or env.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


class Status:
    """``with Status("loading") as status: ...``; ``status.update(...)`` changes the text."""

    def __init__(
        self, message: str, *, stream: IO[str] | None = None, delay: float = DELAY
    ) -> None:
        self.message = message
        self.stream = sys.stderr if stream is None else stream
        self.delay = delay
        self.enabled = wanted(self.stream)
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._shown: Any = None  # rich.live.Live once drawn
        self._spinner: Any = None  # rich.spinner.Spinner, what it draws
        self._done = False

    def __enter__(self) -> Status:
        if self.enabled:
            import rich.console  # noqa: F401 (here, not in the timer's thread)

            self._timer = threading.Timer(self.delay, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def update(self, message: str) -> None:
        """Change the text (cheap when nothing is shown)."""
        if message == self.message:
            return
        with self._lock:
            self.message = message
            if self._shown is not None:
                self._spinner.update(text=_line(message))

    def progress(self, what: str) -> Any:
        """A ``(done, total)`` callback that shows ``what: N%``."""

        def report(done: int, total: int) -> None:
            self.update(f"{what}: {100 * done // max(total, 1)}%")

        return report

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        with self._lock:
            self._done = True
            if self._timer is not None:
                self._timer.cancel()
            if self._shown is not None:
                self._shown.stop()
                self._shown = None

    def _show(self) -> None:
        """Draw the line on ``self.stream`` alone: a Live that leaves sys.stdout and sys.stderr
        as they are (Rich's ``console.status`` redirects both while it is shown, so a write to
        stdout would pass through the status's console), as wide as the terminal really is
        (COLUMNS=100000 would pad the line into a thousand wrapped rows), cropped to one row."""
        from rich.console import Console
        from rich.live import Live
        from rich.spinner import Spinner

        with self._lock:
            if self._done:
                return
            console = Console(file=self.stream, width=_columns(self.stream), highlight=False)
            self._spinner = Spinner("dots", text=_line(self.message))
            self._shown = Live(
                self._spinner,
                console=console,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
                refresh_per_second=12.5,
            )
            self._shown.start()


def _columns(stream: IO[str], fallback: int = 80) -> int:
    """The width of the terminal ``stream`` is (not $COLUMNS), within 20 .. 500."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        columns = fallback
    return max(20, min(columns or fallback, 500))


def _line(message: str) -> Any:
    """The status text on one row, cut with an ellipsis where the terminal ends."""
    from rich.text import Text

    return Text(message, no_wrap=True, overflow="ellipsis")
