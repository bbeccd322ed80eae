"""``attn trace --step`` in a real terminal: a pty from the tests (and tmux when installed).

The child runs with the pty as its terminal; the test types keys into the pty's master side and
reads the screen from it. After the child exits, the pty's settings must be what they were.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attn_cli.cli.app import app
from attn_cli.present.step import KEYS, advance, split_keys

ROOT = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|[()][0-9A-Za-z]|[=>78])")
TIMEOUT = 20.0  # seconds; generous for a loaded CI machine, never reached when all is well


# ---------------------------------------------------------------------------------------------
# Keys and moves


def test_split_keys():
    assert split_keys(b"\x1b[C") == [b"\x1b[C"]
    assert split_keys(b"\x1b[Cq") == [b"\x1b[C", b"q"]
    assert split_keys(b" \r\x1b[D\x1bOC") == [b" ", b"\r", b"\x1b[D", b"\x1bOC"]
    assert split_keys(b"\x1b[6~b") == [b"\x1b[6~", b"b"]
    assert split_keys(b"\x1b") == [b"\x1b"]


def test_keys_mean_what_the_help_says():
    for key in (b"\r", b" ", b"\x1b[C"):
        assert KEYS[key] == "next"
    for key in (b"\x1b[D", b"b"):
        assert KEYS[key] == "back"
    for key in (b"q", b"\x1b"):
        assert KEYS[key] == "quit"


@pytest.mark.parametrize(
    ("k", "action", "expected"),
    [(0, "next", 1), (7, "next", 7), (3, "back", 2), (0, "back", 0), (4, "quit", 4)],
)
def test_advance_holds_at_both_ends(k, action, expected):
    assert advance(k, 8, action) == expected


def test_step_without_a_terminal_says_so_and_exits_2():
    result = CliRunner().invoke(app, ["trace", "--step"], input="")
    assert result.exit_code == 2
    assert result.stderr.startswith(
        "Error: <stdin>: --step: standard input is not a terminal, so no keys can be read"
    )


def test_step_with_a_pipe_on_stdin_exits_2_without_hanging():
    run = subprocess.run(
        [sys.executable, "-m", "attn_cli", "trace", "--step"],
        input="", capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT, check=False,
    )  # fmt: skip
    assert run.returncode == 2
    assert "standard input is not a terminal" in run.stderr


# ---------------------------------------------------------------------------------------------
# A real terminal: a pty


def _controlling_terminal() -> None:
    """In the child, after setsid: make the pty its controlling terminal, as a login does."""
    import fcntl

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """A child process on a fresh pty; ``expect`` reads the screen until a pattern shows."""

    def __init__(self, *args: str, lang: str = "C.UTF-8") -> None:
        self.master, self.slave = os.openpty()
        import fcntl
        import struct

        rows, columns = 40, 110
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        self.before = termios.tcgetattr(self.slave)
        env = {**os.environ, "TERM": "xterm-256color", "LANG": lang, "LC_ALL": lang}
        env.pop("NO_COLOR", None)
        env.pop("COLUMNS", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "attn_cli", "trace", "--step", *args],
            stdin=self.slave, stdout=self.slave, stderr=self.slave,
            cwd=ROOT, env=env, start_new_session=True, preexec_fn=_controlling_terminal,
        )  # fmt: skip
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
        try:
            return self.proc.wait(timeout=TIMEOUT)
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
def terminal():
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
    return (
        after[3] & (termios.ECHO | termios.ICANON)
        == term.before[3] & (termios.ECHO | termios.ICANON)
        and after[3] & (termios.ECHO | termios.ICANON) != 0
    )


def test_step_forward_back_and_quit_in_a_pty(terminal):
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


def test_step_goes_to_the_last_stage_and_holds(terminal):
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


def test_step_in_chinese(terminal):
    term = terminal(lang="zh_CN.UTF-8")
    term.expect(r"第 1 步，共 8 步\s+X")
    term.expect(r"这一步在做什么")
    term.send(b"q")
    assert term.wait() == 0


def test_ctrl_c_restores_the_terminal(terminal):
    term = terminal("--lang", "en")
    term.expect(r"stage 1 of 8")
    term.send(b"\x03")  # the terminal turns it into SIGINT
    assert term.wait() == 130
    assert restored(term)


# ---------------------------------------------------------------------------------------------
# tmux, when installed: the terminal a teacher may well use


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_step_in_tmux(tmp_path):
    socket = f"attn-test-{os.getpid()}"
    done = tmp_path / "exit-code"
    command = (
        f"cd {ROOT} && LANG=C.UTF-8 {sys.executable} -m attn_cli trace --step --lang en; "
        f"echo $? > {done}"
    )
    tmux = ["tmux", "-L", socket, "-f", "/dev/null"]

    def screen() -> str:
        return subprocess.run(
            [*tmux, "capture-pane", "-p", "-t", "t"], capture_output=True, text=True, check=True
        ).stdout

    def wait_for(pattern: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            if re.search(pattern, screen()):
                return
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} never appeared in tmux:\n{screen()}")

    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "t", "-x", "110", "-y", "45", command], check=True
    )
    try:
        wait_for(r"stage 1 of 8")
        subprocess.run([*tmux, "send-keys", "-t", "t", "Enter"], check=True)
        wait_for(r"stage 2 of 8")
        subprocess.run([*tmux, "send-keys", "-t", "t", "Right"], check=True)
        wait_for(r"stage 3 of 8")
        subprocess.run([*tmux, "send-keys", "-t", "t", "Left"], check=True)
        wait_for(r"stage 2 of 8")
        subprocess.run([*tmux, "send-keys", "-t", "t", "q"], check=True)
        deadline = time.monotonic() + TIMEOUT
        while not (done.exists() and done.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert done.read_text().strip() == "0"
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, check=False)
