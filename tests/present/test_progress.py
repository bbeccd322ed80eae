"""The status line: drawn on a terminal only, after a delay, never in pipes, files or CI."""

from __future__ import annotations

import os
import select
import sys
import time

import pytest
from conftest import run_cli

import attn_cli.present.progress as progress
from attn_cli.present.progress import Status, wanted


class FakeTTY:
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("stream", "environ", "expected"),
    [
        (FakeTTY(), {}, True),
        (FakeTTY(), {"CI": "true"}, False),
        (FakeTTY(), {"TERM": "dumb"}, False),
        (None, {}, False),  # pytest captures stderr: not a terminal
    ],
)
def test_wanted_only_on_a_terminal_outside_ci(
    stream: FakeTTY | None, environ: dict[str, str], expected: bool
) -> None:
    tty = stream if stream is not None else sys.stderr
    assert wanted(tty, environ) is expected  # type: ignore[arg-type]  # duck-typed: isatty


def test_nothing_is_printed_to_stderr_when_it_is_not_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(progress, "DELAY", 0.0)
    monkeypatch.delenv("CI", raising=False)
    result = run_cli("trace", "--format", "json")
    assert result.exit_code == 0
    assert result.stderr == ""
    assert result.stdout.startswith("{")


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_a_terminal_gets_a_transient_status_line_after_the_delay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    leader, follower = os.openpty()
    drawn = b""
    with os.fdopen(follower, "w") as tty, Status("loading", stream=tty, delay=0.0) as status:
        status.update("computing: 50%")
        # the handshake: read the terminal until the line shows (the timer's thread draws it)
        deadline = time.monotonic() + 10
        while b"computing: 50%" not in drawn and time.monotonic() < deadline:
            if select.select([leader], [], [], 0.05)[0]:
                drawn += os.read(leader, 65536)
    os.close(leader)
    assert b"computing: 50%" in drawn
    # quick work draws nothing at all
    with Status("quick", stream=FakeTTY(), delay=10.0):  # type: ignore[arg-type]
        pass


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_the_status_line_stays_on_its_terminal_and_in_its_width(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 40: with COLUMNS=100000 and a slow run, escape codes reached stdout. The line is
    drawn on stderr's terminal only: sys.stdout is never swapped while it shows (what a run
    prints meanwhile arrives there as written), and it is as wide as the terminal really is."""
    import io

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "100000")
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    leader, follower = os.openpty()
    os.set_blocking(leader, False)
    drawn = b""
    message = "computing attention: " + "x" * 300  # longer than any terminal row
    with os.fdopen(follower, "w") as tty, Status(message, stream=tty, delay=0.0):
        deadline = time.monotonic() + 10
        while b"computing attention" not in drawn and time.monotonic() < deadline:
            if select.select([leader], [], [], 0.05)[0]:
                drawn += os.read(leader, 65536)
        assert sys.stdout is out  # not Rich's FileProxy
        print("the result")  # what a command writes to stdout while the line shows
    while select.select([leader], [], [], 0.1)[0]:  # what erasing the line wrote, if any
        try:
            drawn += os.read(leader, 65536)
        except (BlockingIOError, OSError):
            break
    os.close(leader)
    assert out.getvalue() == "the result\n"  # no escape code, nothing diverted
    assert b"computing attention" in drawn
    assert b"x" * 200 not in drawn  # cut at the terminal's real width (80 on a new pty)
    assert len(drawn) < 4000, len(drawn)  # not a line padded to 100,000 columns
