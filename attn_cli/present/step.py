"""Step mode: one stage per screen, explained; keys move back and forth.

Keys are read one at a time with the terminal in cbreak mode (no echo, no line buffering,
Ctrl-C still interrupts); the terminal's settings are restored on every way out, including
Ctrl-C, SIGTERM and SIGHUP. Without a terminal on standard input there is nothing to read keys
from, so step mode refuses to start instead of hanging.
"""

from __future__ import annotations

import os
import select
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Literal

from rich.console import Console

from attn_cli.core.pipeline import Trace
from attn_cli.errors import UsageError
from attn_cli.present.options import RenderOptions
from attn_cli.present.render import render_step_page, step_names

Action = Literal["next", "back", "quit"]

KEYS: dict[bytes, Action] = {
    b"\r": "next",
    b"\n": "next",
    b" ": "next",
    b"\x1b[C": "next",  # →
    b"\x1bOC": "next",  # → in application cursor mode
    b"\x1b[B": "next",  # ↓
    b"\x1b[6~": "next",  # Page Down (a presenter's clicker sends it)
    b"n": "next",
    b"l": "next",
    b"\x1b[D": "back",  # ←
    b"\x1bOD": "back",
    b"\x1b[A": "back",  # ↑
    b"\x1b[5~": "back",  # Page Up
    b"b": "back",
    b"p": "back",
    b"h": "back",
    b"\x7f": "back",  # Backspace
    b"q": "quit",
    b"Q": "quit",
    b"\x1b": "quit",  # Esc on its own
    b"\x03": "quit",  # Ctrl-C when it arrives as a byte
    b"\x04": "quit",  # Ctrl-D
}
ESC_WAIT = 0.05  # seconds to wait for the rest of an escape sequence after ESC


def split_keys(data: bytes) -> list[bytes]:
    """Bytes read from the terminal as separate keys: ``b"\\x1b[Cq"`` -> ``[b"\\x1b[C", b"q"]``."""
    keys: list[bytes] = []
    i = 0
    while i < len(data):
        if data[i : i + 1] == b"\x1b" and i + 1 < len(data) and data[i + 1 : i + 2] in b"[O":
            j = i + 2
            while j < len(data) and not (0x40 <= data[j] <= 0x7E):  # parameters, then final
                j += 1
            keys.append(data[i : j + 1])
            i = j + 1
        else:
            keys.append(data[i : i + 1])
            i += 1
    return keys


def advance(k: int, n: int, action: Action) -> int:
    """The page after ``action`` on page ``k`` of ``n``; the first and last pages hold."""
    if action == "next":
        return min(k + 1, n - 1)
    if action == "back":
        return max(k - 1, 0)
    return k


def stdin_terminal() -> int | None:
    """The file descriptor of standard input if it is a terminal, else None."""
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return fd if os.isatty(fd) else None


@contextmanager
def cbreak(fd: int) -> Iterator[Callable[[], bytes]]:
    """The terminal in cbreak mode, with a function that reads what the next keypress sent."""
    import termios
    import tty

    saved = termios.tcgetattr(fd)

    def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)  # unwinds through the finally below

    handlers = {s: signal.signal(s, _exit_on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}

    def read() -> bytes:
        data = os.read(fd, 32)
        if data == b"\x1b":  # Esc alone, or the start of an arrow key's sequence?
            ready, _, _ = select.select([fd], [], [], ESC_WAIT)
            if ready:
                data += os.read(fd, 32)
        return data

    try:
        tty.setcbreak(fd, termios.TCSANOW)
        yield read
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def run_steps(trace: Trace, options: RenderOptions, console: Console) -> int:
    """Show the trace one explained stage at a time until q/Esc; the exit code."""
    fd = stdin_terminal()
    if fd is None:
        raise UsageError(
            "<stdin>", "--step", "standard input is not a terminal, so no keys can be read",
            "an interactive terminal (leave out --step to print every stage at once)",
        )  # fmt: skip
    from dataclasses import replace

    options = replace(options, explain=True)
    n = len(step_names(trace, options))
    k = 0
    try:
        with cbreak(fd) as read, console.screen(hide_cursor=True):
            while True:
                console.clear()
                console.print(render_step_page(trace, k, options))
                data = read()
                if not data:  # end of input: the terminal went away
                    return 0
                for key in split_keys(data):
                    action = KEYS.get(key)
                    if action == "quit":
                        return 0
                    if action is not None:
                        k = advance(k, n, action)
    except KeyboardInterrupt:
        return 130
