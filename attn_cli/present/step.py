"""Step mode: one stage per screen, explained; keys move between stages and scroll within one.

Each page fits the terminal (see ``pager.py``): the title and the table's column headers stay on
screen while the body scrolls. Keys are read one at a time with the terminal in cbreak mode (no
echo, no line buffering, Ctrl-C still interrupts); the terminal's settings are restored on every
way out: q/Esc, Ctrl-C, Ctrl-\\, SIGTERM, SIGHUP, and while suspended by Ctrl-Z. A resize redraws
the page at the new size. Without a terminal on standard input there is nothing to read keys
from, so step mode refuses to start instead of hanging.
"""

from __future__ import annotations

import os
import select
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import replace
from types import FrameType
from typing import TYPE_CHECKING

from rich.console import Console, Group, RenderableType, ScreenContext
from rich.control import Control
from rich.segment import SegmentLines
from rich.text import Text

from attn_cli.errors import UsageError
from attn_cli.present.i18n import Lang, label
from attn_cli.present.options import RenderOptions
from attn_cli.present.pager import Action, Deck, Pages, State, frame, press, type_key

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace

KEYS: dict[bytes, Action] = {
    b"\r": "next",
    b"\n": "next",
    b" ": "next",
    b"\x1b[C": "next",  # →
    b"\x1bOC": "next",  # → in application cursor mode
    b"n": "next",
    b"l": "next",
    b"\x1b[D": "back",  # ←
    b"\x1bOD": "back",
    b"b": "back",
    b"p": "back",
    b"h": "back",
    b"\x7f": "back",  # Backspace
    b"\x08": "back",
    b"\x1b[B": "down",  # ↓
    b"\x1bOB": "down",
    b"j": "down",
    b"\x1b[A": "up",  # ↑
    b"\x1bOA": "up",
    b"k": "up",
    b"\x1b[6~": "pgdn",  # Page Down (a presenter's clicker sends it)
    b"\x1b[5~": "pgup",
    b"\x1b[H": "home",
    b"\x1bOH": "home",
    b"\x1b[1~": "home",
    b"\x1b[7~": "home",  # rxvt
    b"\x1b[F": "end",
    b"\x1bOF": "end",
    b"\x1b[4~": "end",
    b"\x1b[8~": "end",
    b"g": "goto",
    b"?": "help",
    b"q": "quit",
    b"Q": "quit",
    b"\x1b": "quit",  # Esc on its own
    b"\x03": "quit",  # Ctrl-C when it arrives as a byte
    b"\x04": "quit",  # Ctrl-D
}
ESC_WAIT = 0.05  # seconds to wait for the rest of an escape sequence after ESC
Read = Callable[[], "bytes | None"]  # the next keypress's bytes; b"" at end; None: resized


def split_keys(data: bytes) -> list[bytes]:
    """Bytes read from the terminal as separate keys: ``b"\\x1b[Cq"`` -> ``[b"\\x1b[C", b"q"]``.

    A UTF-8 character is one key (typed at the go-to prompt)."""
    keys: list[bytes] = []
    i = 0
    while i < len(data):
        if data[i : i + 1] == b"\x1b" and i + 1 < len(data) and data[i + 1 : i + 2] in b"[O":
            j = i + 2
            while j < len(data) and not (0x40 <= data[j] <= 0x7E):  # parameters, then final
                j += 1
        else:  # one character: a UTF-8 lead byte says how many bytes follow
            lead = data[i]
            j = i + (3 if lead >= 0xF0 else 2 if lead >= 0xE0 else 1 if lead >= 0xC0 else 0)
        keys.append(data[i : j + 1])
        i = j + 1
    return keys


def on_key(deck: Pages, state: State, key: bytes, width: int, height: int) -> State | None:
    """The state after one key on a ``width`` x ``height`` screen; None to quit."""
    if state.help:
        return replace(state, help=False)  # any key closes the help
    state = replace(state, note="")
    if state.typed is not None:
        return type_key(deck, state, key.decode("utf-8", "replace"))
    if key.isdigit():
        return type_key(deck, replace(state, typed=""), key.decode())
    action = KEYS.get(key)
    if action == "quit":
        return None
    return state if action is None else press(deck, state, action, width, height)


def stdin_terminal() -> int | None:
    """The file descriptor of standard input if it is a terminal, else None."""
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return fd if os.isatty(fd) else None


@contextmanager
def keyboard(fd: int, console: Console) -> Iterator[tuple[Read, ScreenContext]]:
    """The terminal in cbreak mode on the alternate screen; a function that reads keys."""
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    wake_r, wake_w = os.pipe()  # a resize or a resume writes here; read() returns None
    os.set_blocking(wake_w, False)

    def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)  # unwinds through the finally below

    def _wake(signum: int, frame: FrameType | None) -> None:
        with suppress(BlockingIOError):  # a wake-up is already pending
            os.write(wake_w, b"!")

    def _suspend(signum: int, frame: FrameType | None) -> None:
        """Ctrl-Z: give the shell its terminal back, stop, and take it again on fg."""
        console.set_alt_screen(False)
        console.show_cursor(True)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # stops here until continued
        signal.signal(signal.SIGTSTP, _suspend)
        tty.setcbreak(fd, termios.TCSANOW)
        console.set_alt_screen(True)
        console.show_cursor(False)
        _wake(signum, frame)

    handlers = {
        s: signal.signal(s, h)
        for s, h in (
            (signal.SIGTERM, _exit_on_signal),
            (signal.SIGHUP, _exit_on_signal),
            (signal.SIGQUIT, _exit_on_signal),  # Ctrl-\
            (signal.SIGWINCH, _wake),
            (signal.SIGTSTP, _suspend),
        )
    }

    try:
        tty.setcbreak(fd, termios.TCSANOW)
        with console.screen(hide_cursor=True) as screen:
            yield _key_reader(fd, wake_r), screen
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        os.close(wake_r)
        os.close(wake_w)


def _key_reader(fd: int, wake_r: int) -> Read:
    """A function that reads a key from ``fd``, or None when ``wake_r`` is written first."""

    def read() -> bytes | None:
        ready, _, _ = select.select([fd, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 64)
            return None
        data = os.read(fd, 64)
        if data == b"\x1b":  # Esc alone, or the start of an arrow key's sequence?
            ready, _, _ = select.select([fd], [], [], ESC_WAIT)
            if ready:
                data += os.read(fd, 64)
        return data

    return read


def draw(console: Console, screen: ScreenContext, deck: Pages, state: State) -> None:
    """The screen for ``state`` at the terminal's current size."""
    width, height = console.size
    lines = frame(deck, state, width, height)
    with console:  # one write: no flicker
        console.control(Control.home())
        screen.update(SegmentLines(lines, new_lines=True))


def run_steps(trace: Trace, options: RenderOptions, console: Console) -> int:
    """Show the trace one explained stage at a time until q/Esc; the exit code."""
    return walk(Deck(trace, replace(options, explain=True), console), console)


def run_pages(
    pages: Iterable[RenderableType], titles: Sequence[str], lang: Lang, console: Console
) -> int:
    """Show ``pages`` one at a time (``titles[k]`` pinned above page k) until q/Esc; the exit
    code. The pages are taken from the iterable as they are first shown."""
    return walk(page_deck(pages, titles, lang, console), console)


def page_deck(
    pages: Iterable[RenderableType], titles: Sequence[str], lang: Lang, console: Console
) -> Pages:
    """The pager's deck of ``pages``: each under a pinned "stage k of n  title" line, with the
    key hint below it (the pager's status line takes its place)."""
    source = iter(pages)
    seen: list[RenderableType] = []
    n = len(titles)

    def render(k: int) -> Group:
        while len(seen) <= k:
            seen.append(next(source))
        position = label(lang, "step_position", k=k + 1, n=n)
        keys = label(lang, "step_last" if k == n - 1 else "step_keys")
        return Group(
            Text.assemble((position, "bold reverse"), "  ", (titles[k], "bold cyan")),
            seen[k],
            Text.assemble((position, "bold"), "   ", (keys, "dim")),
        )

    return Pages(list(titles), render, lang, console)


def walk(deck: Pages, console: Console) -> int:
    """Draw the deck's pages and follow the keys until q/Esc; the exit code."""
    fd = stdin_terminal()
    if fd is None:
        raise UsageError(
            "<stdin>",
            "--step",
            "standard input is not a terminal, so no keys can be read",
            "an interactive terminal (leave out --step to print every stage at once)",
        )
    state: State | None = State()
    try:
        with keyboard(fd, console) as (read, screen):
            while state is not None:
                draw(console, screen, deck, state)
                data = read()
                if data == b"":  # end of input: the terminal went away
                    return 0
                for key in split_keys(data or b""):
                    width, height = console.size
                    state = on_key(deck, state, key, width, height)
                    if state is None:
                        break
        return 0
    except KeyboardInterrupt:
        return 130
