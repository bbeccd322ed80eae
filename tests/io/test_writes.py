"""One policy for every write (io/files.py), attacked as issue 15 found it: signals during ``-o``,
a write-protected target, a long UTF-8 file name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import IO

import pytest
from conftest import CORPUS_DIR, FIXTURES, PROCESS_TIMEOUT, clean_env, run_cli

from attn_cli.errors import UsageError
from attn_cli.io import files

POSIX = pytest.mark.skipif(os.name != "posix", reason="POSIX signals and modes")
CAT = str(FIXTURES / "the_cat_sat.yaml")
assert CORPUS_DIR.is_dir()


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ---------------------------------------------------------------------------------------------
# Signals: the handlers raise, the cleanup runs, the process dies of the signal


class Died(BaseException):
    """Stands in for the process dying of a signal, so that the test process lives on."""


@POSIX
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_writing_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int
) -> None:
    target = tmp_path / "trace.json"
    target.write_text("old", encoding="utf-8")
    died: list[int] = []

    def die_of(number: int) -> None:
        died.append(number)
        raise Died

    monkeypatch.setattr(files, "die_of", die_of)
    # as a process started from a shell: under `nohup pytest` SIGHUP arrives ignored, and an
    # ignored signal stays ignored (test_an_ignored_signal_stays_ignored)
    previous = signal.signal(signum, signal.SIG_DFL)
    before = signal.getsignal(signum)

    def write(f: IO[bytes]) -> None:
        f.write(b"half of the new")
        os.kill(os.getpid(), signum)  # delivered here, between two bytecodes of this write
        f.write(b" file")

    try:
        with pytest.raises(Died):
            files.write_atomic_with(target, write)
        assert signal.getsignal(signum) == before  # the handler is ours only while writing
    finally:
        signal.signal(signum, previous)
    assert died == [signum]
    assert target.read_text(encoding="utf-8") == "old"
    assert listing(tmp_path) == ["trace.json"]


@POSIX
def test_an_ignored_signal_stays_ignored(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:

        def write(f: IO[bytes]) -> None:
            f.write(b"new")
            os.kill(os.getpid(), signal.SIGHUP)

        files.write_atomic_with(target, write)
    finally:
        signal.signal(signal.SIGHUP, before)
    assert target.read_text() == "new"


_SLOW_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from attn_cli.io.files import write_atomic_with

    target, ready = Path(sys.argv[1]), Path(sys.argv[2])

    def write(f):
        f.write(b"part of the new file")
        f.flush()
        ready.write_text("writing")
        time.sleep(30)

    write_atomic_with(target, write)
    """
)


@POSIX
@pytest.mark.subprocess
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_real_process_killed_while_writing(tmp_path: Path, signum: int) -> None:
    out = tmp_path / "out"
    out.mkdir()
    target, ready = out / "trace.json", tmp_path / "ready"
    target.write_text("old", encoding="utf-8")
    process = subprocess.Popen(
        [sys.executable, "-c", _SLOW_WRITER, str(target), str(ready)],
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signum, signal.SIG_DFL),  # not ignored, even under nohup
    )
    deadline = time.monotonic() + PROCESS_TIMEOUT
    while not ready.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.02)
    assert ready.exists(), process.communicate()[1]
    assert len(listing(out)) == 2  # the temporary is there while writing
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=PROCESS_TIMEOUT)
    assert process.returncode == -signum, stderr  # died of it, as if not caught
    assert "Traceback" not in stderr
    assert listing(out) == ["trace.json"]
    assert target.read_text(encoding="utf-8") == "old"


# ---------------------------------------------------------------------------------------------
# Write-protected targets: refused as cp refuses (even for root), replaced with --force


@POSIX
@pytest.mark.parametrize("mode", [0o444, 0o400, 0o000])
def test_a_write_protected_output_is_refused(tmp_path: Path, mode: int) -> None:
    target = tmp_path / "keep.json"
    target.write_text("precious", encoding="utf-8")
    target.chmod(mode)
    try:
        result = run_cli("trace", CAT, "-f", "json", "-o", str(target))
        assert result.exit_code == 2
        assert result.stderr == (
            f"Error: {target}: --output: is write-protected (attn does not replace it, as cp "
            "does not), expected a writable file: make it writable (chmod u+w) or choose "
            "another name\n"
        )
        target.chmod(0o600)
        assert target.read_text(encoding="utf-8") == "precious"
        assert listing(tmp_path) == ["keep.json"]
    finally:
        target.chmod(0o600)


@POSIX
def test_a_write_protected_file_behind_a_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("precious", encoding="utf-8")
    real.chmod(0o444)
    (tmp_path / "link.json").symlink_to(real)
    result = run_cli("trace", CAT, "-f", "json", "-o", str(tmp_path / "link.json"))
    assert result.exit_code == 2 and "is write-protected" in result.stderr
    assert real.read_text(encoding="utf-8") == "precious"


@POSIX
def test_write_protected_goldens_are_kept_and_force_replaces(tmp_path: Path) -> None:
    golden = tmp_path / "g.json"
    golden.write_text("{}", encoding="utf-8")
    golden.chmod(0o444)
    result = run_cli("check", CAT, "--golden", str(golden), "--update")
    assert result.exit_code == 2 and "--golden: is write-protected" in result.stderr
    assert golden.read_text(encoding="utf-8") == "{}"
    files.write_atomic(golden, "forced", force=True)  # cp -f: attn new/examples --force
    assert golden.read_text(encoding="utf-8") == "forced"
    assert golden.stat().st_mode & 0o777 == 0o444  # the old mode is kept


def test_a_writable_file_is_still_replaced(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_text("old", encoding="utf-8")
    result = run_cli("trace", CAT, "-f", "json", "-o", str(target))
    assert result.exit_code == 0, result.output
    assert target.read_text(encoding="utf-8").startswith("{")


# ---------------------------------------------------------------------------------------------
# Long UTF-8 names: the temporary's name stays under NAME_MAX bytes


@pytest.mark.parametrize(
    "name",
    [
        "😀" * 62 + ".json",  # 253 bytes, 67 characters
        "é" * 125 + ".json",  # 255 bytes
        "数" * 83 + ".json",  # 254 bytes
        "a" * 250 + ".json",  # 255 bytes, ASCII
    ],
)
def test_a_long_utf8_file_name_is_written(tmp_path: Path, name: str) -> None:
    assert len(os.fsencode(name)) <= 255
    target = tmp_path / name
    result = run_cli("trace", CAT, "-f", "json", "-o", str(target), "-q")
    assert result.exit_code == 0, result.output
    assert listing(tmp_path) == [name]
    assert target.read_text(encoding="utf-8").startswith("{")


def test_the_temporary_name_is_cut_between_characters() -> None:
    cut = files._short("😀" * 62 + ".json")
    assert len(os.fsencode(cut)) <= files.TEMP_NAME_BYTES and cut == "😀" * 25
    assert files._short("short.json") == "short.json"


def test_usage_error_still_for_a_name_over_the_limit(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot write"):
        files.write_atomic(tmp_path / ("a" * 300), "x")
    assert listing(tmp_path) == []
