"""``attn trace --step`` in a real terminal: a pty from the tests (and tmux when installed).

The child runs with the pty as its terminal; the test types keys into the pty's master side and
reads the screen from it. After the child exits, the pty's settings must be what they were.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import shutil
import subprocess
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ROOT, attn_command, clean_env, ctrl_c_as_a_terminal_sends_it, run_attn, run_cli

from attn_cli.present.step import KEYS, split_keys

ANSI = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|[()][0-9A-Za-z]|[=>78])")
TIMEOUT = 20.0  # seconds; generous for a loaded CI machine, never reached when all is well


# ---------------------------------------------------------------------------------------------
# Keys and moves


def test_split_keys() -> None:
    assert split_keys(b"\x1b[C") == [b"\x1b[C"]
    assert split_keys(b"\x1b[Cq") == [b"\x1b[C", b"q"]
    assert split_keys(b" \r\x1b[D\x1bOC") == [b" ", b"\r", b"\x1b[D", b"\x1bOC"]
    assert split_keys(b"\x1b[6~b") == [b"\x1b[6~", b"b"]
    assert split_keys(b"\x1b") == [b"\x1b"]
    assert split_keys("g软q".encode()) == [b"g", "软".encode(), b"q"]  # a character is a key
    assert split_keys(b"\x1b[H\x1b[4~") == [b"\x1b[H", b"\x1b[4~"]


def test_keys_mean_what_the_help_says() -> None:
    expected = {
        "next": (b"\r", b" ", b"\x1b[C"),
        "back": (b"\x1b[D", b"b"),
        "down": (b"\x1b[B", b"j"),
        "up": (b"\x1b[A", b"k"),
        "pgdn": (b"\x1b[6~",),
        "pgup": (b"\x1b[5~",),
        "home": (b"\x1b[H", b"\x1b[1~"),
        "end": (b"\x1b[F", b"\x1b[4~"),
        "goto": (b"g",),
        "help": (b"?",),
        "quit": (b"q", b"\x1b"),
    }
    for action, keys in expected.items():
        for key in keys:
            assert KEYS[key] == action, key


def test_step_without_a_terminal_says_so_and_exits_2() -> None:
    result = run_cli("trace", "--step", input="")
    assert result.exit_code == 2
    assert result.stderr.startswith(
        "Error: <stdin>: --step: standard input is not a terminal, so no keys can be read"
    )


@pytest.mark.subprocess
def test_step_with_a_pipe_on_stdin_exits_2_without_hanging() -> None:
    run = run_attn("trace", "--step", input="", timeout=TIMEOUT, cwd=ROOT)
    assert run.returncode == 2
    assert "standard input is not a terminal" in run.stderr


# ---------------------------------------------------------------------------------------------
# A real terminal: a pty


def _controlling_terminal() -> None:
    """In the child, after setsid: make the pty its controlling terminal, as a login does, with
    Ctrl-C and Ctrl-\\ as a terminal's shell leaves them (not ignored, whoever started pytest)."""
    import fcntl

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    ctrl_c_as_a_terminal_sends_it()


class Terminal:
    """A child process on a fresh pty; ``expect`` reads the screen until a pattern shows."""

    def __init__(self, *args: str, lang: str = "C.UTF-8") -> None:
        self.master, self.slave = os.openpty()
        import fcntl
        import struct

        rows, columns = 40, 110
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        self.before = termios.tcgetattr(self.slave)
        env = clean_env(TERM="xterm-256color", LANG=lang, LC_ALL=lang)
        env.pop("NO_COLOR")  # colour on, as in a terminal
        self.proc = subprocess.Popen(
            attn_command("trace", "--step", *args),
            stdin=self.slave,
            stdout=self.slave,
            stderr=self.slave,
            cwd=ROOT,
            env=env,
            start_new_session=True,
            preexec_fn=_controlling_terminal,
        )
        self.seen = ""

    def expect(self, pattern: str) -> str:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            text = ANSI.sub("", self.seen)
            match = re.search(pattern, text)
            if match:
                self.seen = text[match.end() :]
                return text[: match.end()]
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    self.seen += os.read(self.master, 65536).decode("utf-8", "replace")
                except OSError:
                    break
        raise AssertionError(
            f"{pattern!r} never appeared; the screen ends with {self.seen[-500:]!r}"
        )

    def send(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def wait(self) -> int:
        """The exit code, reading the screen meanwhile: a child never blocks on a full pty."""
        deadline = time.monotonic() + TIMEOUT
        while self.proc.poll() is None and time.monotonic() < deadline:
            if select.select([self.master], [], [], 0.05)[0]:
                try:
                    self.seen += os.read(self.master, 65536).decode("utf-8", "replace")
                except OSError:
                    break
        try:
            return self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            self.drain()

    def drain(self) -> None:
        while select.select([self.master], [], [], 0)[0]:
            try:
                if not os.read(self.master, 65536):
                    break
            except OSError:
                break

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)
        os.close(self.slave)


@pytest.fixture
def terminal() -> Iterator[Callable[..., Terminal]]:
    opened: list[Terminal] = []

    def start(*args: str, lang: str = "C.UTF-8") -> Terminal:
        term = Terminal(*args, lang=lang)
        opened.append(term)
        return term

    yield start
    for term in opened:
        term.close()


def restored(term: Terminal) -> bool:
    after = termios.tcgetattr(term.slave)
    return bool(
        after[3] & (termios.ECHO | termios.ICANON)
        == term.before[3] & (termios.ECHO | termios.ICANON)
        and after[3] & (termios.ECHO | termios.ICANON) != 0
    )


@pytest.mark.subprocess
def test_step_forward_back_and_quit_in_a_pty(terminal: Callable[..., Terminal]) -> None:
    term = terminal("--lang", "en")
    term.expect(r"stage 1 of 8\s+X")
    term.expect(r"The cat sat")  # the configuration comes with the first page
    term.expect(r"what this step does")
    term.expect(r"Enter/Space/→ next · ←/b back · q/Esc quit")
    term.send(b"\r")
    term.expect(r"stage 2 of 8\s+Q")
    term.expect(r"Query: what am I looking for\?")
    term.send(b" ")
    term.expect(r"stage 3 of 8\s+K")
    term.send(b"\x1b[C")  # →
    term.expect(r"stage 4 of 8\s+V")
    term.send(b"b")
    term.expect(r"stage 3 of 8\s+K")
    term.send(b"\x1b[D")  # ←
    term.expect(r"stage 2 of 8\s+Q")
    term.send(b"q")
    assert term.wait() == 0
    assert restored(term)


@pytest.mark.subprocess
def test_step_goes_to_the_last_stage_and_holds(terminal: Callable[..., Terminal]) -> None:
    term = terminal("--lang", "en", "--stage", "softmax", "--stage", "output", "--cell", "The,cat")
    term.expect(r"stage 1 of 2\s+softmax")
    term.expect(r"Σ e\^\(x − m\) = 1\.0626")  # the worked cell comes along
    term.send(b"\r")
    term.expect(r"stage 2 of 2\s+output")
    term.expect(r"last stage · ←/b back · q/Esc quit")
    term.send(b"\r")  # nothing after the last stage: stays
    term.expect(r"stage 2 of 2\s+output")
    term.send(b"\x1b")  # Esc on its own quits
    assert term.wait() == 0
    assert restored(term)


@pytest.mark.subprocess
def test_step_in_chinese(terminal: Callable[..., Terminal]) -> None:
    term = terminal(lang="zh_CN.UTF-8")
    term.expect(r"第 1 步，共 8 步\s+X")
    term.expect(r"这一步在做什么")
    term.send(b"q")
    assert term.wait() == 0


@pytest.mark.subprocess
@pytest.mark.parametrize(("key", "code"), [(b"\x03", 130), (b"\x1c", 131)], ids=["C-c", "C-\\"])
def test_ctrl_c_restores_the_terminal(
    terminal: Callable[..., Terminal], key: bytes, code: int
) -> None:
    term = terminal("--lang", "en")
    term.expect(r"stage 1 of 8")
    term.expect(r"q/Esc quit")  # the handshake: the page is drawn, the keys are read next
    term.send(key)  # the terminal turns it into SIGINT (SIGQUIT)
    assert term.wait() == code
    assert restored(term)


# ---------------------------------------------------------------------------------------------
# tmux, when installed: the terminal a teacher may well use, at a projector's sizes

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Tmux:
    """``attn trace --step ARGS`` in a detached tmux window of a fixed size; its screen as text.

    After attn exits, the window's shell writes the exit code and ``stty -a`` (what the
    terminal was left in) to files."""

    def __init__(self, tmp_path: Path, width: int, height: int, *args: str) -> None:
        self.done, self.stty = tmp_path / "exit-code", tmp_path / "stty"
        self.tmux = ["tmux", "-L", f"attn-test-{os.getpid()}-{width}", "-f", "/dev/null"]
        command = (
            f"cd {shlex.quote(str(ROOT))} && LANG=C.UTF-8 "
            f"{shlex.join(attn_command('trace', '--step', *args))}; echo $? > {self.done}.tmp; "
            f"stty -a > {self.stty}; mv {self.done}.tmp {self.done}; sleep 60"
        )
        subprocess.run(
            [
                *self.tmux,
                "new-session",
                "-d",
                "-s",
                "t",
                "-x",
                str(width),
                "-y",
                str(height),
                command,
            ],
            check=True,
            env=clean_env(),  # no COLUMNS or LINES of pytest's
        )

    def screen(self) -> list[str]:
        return subprocess.run(
            [*self.tmux, "capture-pane", "-p", "-t", "t"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()

    def wait_for(self, pattern: str, line: int | None = None) -> list[str]:
        """The screen once ``pattern`` shows (on row ``line`` if given)."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            screen = self.screen()
            text = "\n".join(screen) if line is None else (screen[line : line + 1] or [""])[0]
            if re.search(pattern, text):
                return screen
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} never appeared in tmux:\n" + "\n".join(self.screen()))

    def send(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", "t", *keys], check=True)

    def exit_code(self) -> int:
        deadline = time.monotonic() + TIMEOUT
        while not self.done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return int(self.done.read_text())

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True, check=False)


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Callable[..., Tmux]]:
    opened: list[Tmux] = []

    def start(width: int, height: int, *args: str) -> Tmux:
        opened.append(Tmux(tmp_path, width, height, *args))
        return opened[-1]

    yield start
    for window in opened:
        window.close()


def is_rule(line: str) -> bool:
    return bool(line.strip()) and set(line.strip()) == {"─"}


def shows_column_headers(screen: list[str]) -> bool:
    """A table's header row under the title: a line, then a rule of ``─`` under it."""
    return any(is_rule(screen[n]) and screen[n - 1].strip() for n in range(2, len(screen)))


def last_line_of_page(k: int, width: int, *args: str) -> str:
    """The page's last line as Rich prints the whole page (independent of the pager)."""
    from io import StringIO

    from rich.console import Console

    from attn_cli.api import trace_file
    from attn_cli.present.options import RenderOptions
    from attn_cli.present.render import render_step_page
    from attn_cli.present.worked import parse_cell

    trace = trace_file(args[0], keep_all=True)
    cell = parse_cell(args[args.index("--cell") + 1], trace.query_labels, trace.key_labels)
    file = StringIO()
    out = Console(width=width, color_system=None, file=file)
    out.print(render_step_page(trace, k, RenderOptions(explain=True, cell=cell)))
    lines = [line.rstrip() for line in file.getvalue().splitlines() if line.strip()]
    return lines[-2]  # the last is the key hint, which the status line replaces


STAGES = [
    "X",
    "Q",
    "K",
    "V",
    "scores",
    "scaled",
    "masked",
    "softmax",
    "output",
    "concat",
    "projected",
]
TWO_HEADS = ("causal_multihead", "--cell", "1,0", "--lang", "en")


@needs_tmux
@pytest.mark.subprocess
@pytest.mark.parametrize(("width", "height"), [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_every_page_keeps_its_title_and_headers_in_tmux(
    tmux: Callable[..., Tmux], width: int, height: int
) -> None:
    window = tmux(width, height, *TWO_HEADS)
    for k, name in enumerate(STAGES):
        if k:
            window.send("Enter")
        title = rf"^stage {k + 1} of 11\s+{name}\s*$"
        screen = window.wait_for(title, line=0)
        assert len(screen) == height and shows_column_headers(screen), screen
        window.send(*["Down"] * 5)  # scrolled (where there is anything to scroll)
        screen = window.wait_for(r"·", line=height - 1)
        assert re.search(title, screen[0]) and shows_column_headers(screen), screen
        window.send("End")
        last = last_line_of_page(k, width, *TWO_HEADS)
        screen = window.wait_for(re.escape(last))
        assert re.search(title, screen[0]), screen
    window.send("q")
    assert window.exit_code() == 0


@needs_tmux
@pytest.mark.subprocess
def test_jump_help_and_ctrl_c_in_tmux(tmux: Callable[..., Tmux]) -> None:
    window = tmux(80, 24, *TWO_HEADS)
    window.wait_for(r"stage 1 of 11\s+X", line=0)
    window.send("g", "s", "o", "f", "t", "Enter")
    window.wait_for(r"stage 8 of 11\s+softmax", line=0)
    window.send("3")
    window.wait_for(r"stage 3 of 11\s+K", line=0)
    window.send("1", "1")
    window.wait_for(r"stage 11 of 11\s+projected", line=0)
    window.send("Home", "Left")
    window.wait_for(r"stage 10 of 11\s+concat", line=0)
    window.send("?")
    window.wait_for(r"PgDn  PgUp")
    window.send("x")  # any key closes the help
    window.wait_for(r"stage 10 of 11\s+concat", line=0)
    window.send("C-c")
    assert window.exit_code() == 130
    stty = window.stty.read_text()
    assert re.search(r"(?<!-)\becho\b", stty) and re.search(r"(?<!-)\bicanon\b", stty), stty
