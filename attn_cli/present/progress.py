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
        self._shown: Any = None  # rich.status.Status once drawn
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
                self._shown.update(message)

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
        from rich.console import Console

        with self._lock:
            if self._done:
                return
            console = Console(file=self.stream, stderr=self.stream is sys.stderr)
            self._shown = console.status(self.message, spinner="dots")
            self._shown.start()
