"""The status line: drawn on a terminal only, after a delay, never in pipes, files or CI."""

from __future__ import annotations

import os
import sys
import time

import pytest
from typer.testing import CliRunner

import attn_cli.present.progress as progress
from attn_cli.cli.app import app
from attn_cli.present.progress import Status, wanted

runner = CliRunner()


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
def test_wanted_only_on_a_terminal_outside_ci(stream, environ, expected):
    assert wanted(stream if stream is not None else sys.stderr, environ) is expected


def test_nothing_is_printed_to_stderr_when_it_is_not_a_terminal(monkeypatch):
    monkeypatch.setattr(progress, "DELAY", 0.0)
    monkeypatch.delenv("CI", raising=False)
    result = runner.invoke(app, ["trace", "--format", "json"])
    assert result.exit_code == 0
    assert result.stderr == ""
    assert result.stdout.startswith("{")


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_a_terminal_gets_a_transient_status_line_after_the_delay(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as tty:
        os.set_blocking(leader, False)
        with Status("loading", stream=tty, delay=0.0) as status:
            status.update("computing: 50%")
            time.sleep(0.3)
        tty.flush()
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            drawn += chunk
    os.close(leader)
    assert b"computing: 50%" in drawn
    # quick work draws nothing at all
    with Status("quick", stream=FakeTTY(), delay=10.0):  # type: ignore[arg-type]
        pass
