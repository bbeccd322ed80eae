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
