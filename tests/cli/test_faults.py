"""Faults around the computation: output files, pipes, signals, closed streams, terminals, limits.

Nothing is lost (a failed write leaves the old file and no temporary), nothing hangs (FIFOs,
devices, Ctrl-C), nothing escapes as a traceback, and no input text reaches the terminal as
markup or escape sequences. Subprocess tests run the real ``python -m attn_cli``.
"""

from __future__ import annotations

import errno
import io
import json
import os
import select
import signal
import stat
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import IO, Any

import pytest
from conftest import (
    CORPUS_DIR,
    attn_command,
    clean_env,
    ctrl_c_as_a_terminal_sends_it,
    run_attn,
    run_cli,
)

from attn_cli.cli.options import parse_size
from attn_cli.core.memory import check_memory, format_bytes, memory_needed
from attn_cli.core.pipeline import run
from attn_cli.errors import InputError, UsageError, printable
from attn_cli.io import files
from attn_cli.io.fixture import load_fixture, parse_fixture, validate

POSIX = pytest.mark.skipif(os.name != "posix", reason="POSIX signals, pipes and devices")

SMALL = {"Q": [[1, 0], [0, 1]], "K": [[1, 0], [0, 1]], "V": [[1, 2], [3, 4]]}


def big_fixture(tmp_path: Path, seq: int = 400) -> Path:
    """A fixture whose JSON trace is megabytes long: more than any pipe buffer holds."""
    path = tmp_path / "big.json"
    rows = [[(i % 7) / 7, (i % 5) / 5] for i in range(seq)]
    path.write_text(json.dumps({"Q": rows, "K": rows, "V": rows}), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# Atomic writes


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_write_atomic_writes_and_keeps_the_mode(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    files.write_atomic(target, "first")
    assert target.read_text(encoding="utf-8") == "first"
    if os.name == "posix":
        umask = os.umask(0)
        os.umask(umask)
        assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600
        target.chmod(0o640)
    files.write_atomic(target, "second")
    assert target.read_text(encoding="utf-8") == "second"
    if os.name == "posix":
        assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert listing(tmp_path) == ["out.json"]


@pytest.mark.parametrize(
    ("where", "error", "fragment"),
    [
        ("fsync", OSError(errno.ENOSPC, "No space left on device"), "the disk is full"),
        ("write", OSError(errno.ENOSPC, "No space left on device"), "the disk is full"),
        ("replace", OSError(errno.EXDEV, "Invalid cross-device link"), "cannot write"),
        ("mkstemp", PermissionError(errno.EACCES, "Permission denied"), "permission denied"),
        ("mkstemp", OSError(errno.EROFS, "Read-only file system"), "(Read-only file system)"),
    ],
)
def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, error: OSError, fragment: str
) -> None:
    target = tmp_path / "trace.json"
    target.write_text("old", encoding="utf-8")

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    if where == "write":
        real_fdopen = os.fdopen

        class Full(io.RawIOBase):
            def __init__(self, fd: int) -> None:
                self.f = real_fdopen(fd, "wb")

            def write(self, b: Any) -> int:
                self.f.write(bytes(b)[: len(b) // 2])  # half of it reaches the disk, then
                raise error

            def close(self) -> None:
                self.f.close()

        monkeypatch.setattr(os, "fdopen", lambda fd, mode: Full(fd))
    else:
        module = tempfile if where == "mkstemp" else os  # files.py calls tempfile.mkstemp
        monkeypatch.setattr(module, where, fail)
    with pytest.raises(UsageError) as info:
        files.write_atomic(target, "new " * 1000)
    assert str(info.value).startswith(f"{target}: --output: ")
    assert fragment in str(info.value)
    assert target.read_text(encoding="utf-8") == "old"
    assert listing(tmp_path) == ["trace.json"]


def test_ctrl_c_while_writing_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "trace.json"

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        files.write_atomic(target, "text")
    assert listing(tmp_path) == []


def test_write_atomic_refuses_a_directory_and_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r": --output: is a directory, expected a file path"):
        files.write_atomic(tmp_path, "x")
    with pytest.raises(UsageError, match=r"folder '.*nope' does not exist, expected an existing"):
        files.write_atomic(tmp_path / "nope" / "out.txt", "x")
    assert listing(tmp_path) == []


@POSIX
@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_write_atomic_refuses_a_read_only_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(UsageError, match="permission denied, expected a writable place"):
            files.write_atomic(folder / "out.txt", "x")
        assert listing(folder) == []
    finally:
        folder.chmod(0o755)


@POSIX
def test_write_atomic_through_a_symlink_keeps_the_link(tmp_path: Path) -> None:
    real = tmp_path / "real.txt"
    real.write_text("old", encoding="utf-8")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    files.write_atomic(link, "new")
    assert link.is_symlink() and real.read_text(encoding="utf-8") == "new"


@POSIX
def test_write_atomic_to_a_device_writes_into_it() -> None:
    before = os.stat("/dev/null")
    files.write_atomic(Path("/dev/null"), "discarded")  # never renamed over the device
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino


@POSIX
@pytest.mark.subprocess
def test_output_to_dev_stdout_through_a_pipe() -> None:
    result = run_attn("trace", "--format", "json", "-o", "/dev/stdout")  # stdout is a pipe here
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["format"] == "attn-trace"


def test_cli_output_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run_cli("trace", "-o", str(tmp_path))
    assert result.exit_code == 2
    assert (
        result.stderr
        == f"Error: {tmp_path}: --output: is a directory, expected a file path to write\n"
    )
    result = run_cli("trace", "-o", str(tmp_path / "no" / "such.txt"))
    assert result.exit_code == 2
    assert "does not exist, expected an existing folder" in result.stderr
    target = tmp_path / "trace.json"
    target.write_text("old", encoding="utf-8")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    result = run_cli("trace", "--format", "json", "-o", str(target))
    assert result.exit_code == 2
    assert result.stderr == (
        f"Error: {target}: --output: the disk is full, expected a writable place with free space\n"
    )
    assert target.read_text(encoding="utf-8") == "old"
    assert listing(tmp_path) == ["trace.json"]


# ---------------------------------------------------------------------------------------------
# Pipes, signals and closed streams (real processes)


@POSIX
@pytest.mark.subprocess
def test_a_reader_that_goes_away_ends_it_quietly(tmp_path: Path) -> None:
    args = ["trace", str(big_fixture(tmp_path)), "--format", "json"]  # megabytes of JSON
    proc = subprocess.Popen(
        attn_command(*args),
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    with proc.stdout, proc.stderr:
        assert proc.stdout.readline()  # like `head -1`: one line, then the pipe closes
        proc.stdout.close()
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=30) == -signal.SIGPIPE  # as `cat` ends: shells show 141
    assert err == ""


def feed(stream: IO[bytes], data: bytes, timeout: float = 15) -> None:
    """Write all of ``data`` into a pipe, failing after ``timeout`` seconds instead of blocking."""
    fd = stream.fileno()
    os.set_blocking(fd, False)
    view = memoryview(data)
    deadline = time.monotonic() + timeout
    while view:
        if not select.select([], [fd], [], max(0.0, deadline - time.monotonic()))[1]:
            raise AssertionError(f"the child stopped reading with {len(view):,} bytes unread")
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            continue


@POSIX
@pytest.mark.subprocess
def test_ctrl_c_while_reading_stdin_exits_130_without_traceback() -> None:
    proc = subprocess.Popen(
        attn_command("trace", "-"),
        env=clean_env(),
        stdin=subprocess.PIPE,  # stays open: attn blocks reading it
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=ctrl_c_as_a_terminal_sends_it,
    )
    assert proc.stdin is not None
    try:
        # The handshake: 1 MiB of YAML comments is more than a pipe holds, so the write ends only
        # once attn has read most of it: it is in its read loop, Python's Ctrl-C handler set.
        feed(proc.stdin, b"# waiting for the rest of the fixture\n" * (1 << 15))
        proc.send_signal(signal.SIGINT)
        # Then the end of input (communicate closes stdin): a read that was blocked when the
        # signal came was interrupted by it; one under way returns, and the Ctrl-C is raised.
        out, err = proc.communicate(timeout=15)
        code = proc.returncode
    finally:
        proc.kill()
        proc.wait()
    assert code == 130, err
    assert b"Traceback" not in err and b"KeyboardInterrupt" not in err
    assert out == b""


@POSIX
@pytest.mark.parametrize("args", [["trace"], ["trace", "--format", "json"], ["--version"]])
@pytest.mark.subprocess
def test_closed_stdout_is_an_error_not_silence(args: list[str]) -> None:
    result = run_attn(*args, preexec_fn=lambda: os.close(1))  # attn ... >&-
    assert result.returncode == 2
    assert result.stderr == (
        "Error: <stdout>: standard output is closed, expected an open standard output, "
        "or -o FILE to write to a file\n"
    )


@POSIX
@pytest.mark.subprocess
def test_closed_stdout_with_an_output_file_works(tmp_path: Path) -> None:
    target = tmp_path / "trace.txt"
    result = run_attn("trace", "-o", str(target), preexec_fn=lambda: os.close(1))
    assert result.returncode == 0, result.stderr
    assert "The cat sat" in target.read_text(encoding="utf-8")
    assert listing(tmp_path) == ["trace.txt"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
@pytest.mark.parametrize("fmt", ["table", "json"])
@pytest.mark.subprocess
def test_a_full_disk_on_stdout_is_one_line(fmt: str) -> None:
    with open("/dev/full", "w") as full:
        result = run_attn("trace", "--format", fmt, stdout=full)
    assert result.returncode == 2
    assert result.stderr == (
        "Error: <stdout>: cannot write (No space left on device), expected a writable "
        "standard output (or -o FILE)\n"
    )


@POSIX
@pytest.mark.subprocess
def test_closed_stdin_is_named() -> None:
    result = run_attn("trace", "-", preexec_fn=lambda: os.close(0))
    assert result.returncode == 2
    assert result.stderr.startswith("Error: <stdin>: standard input is closed, expected")


@POSIX
@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
@pytest.mark.subprocess
def test_endless_binary_stdin_stops_at_once() -> None:
    start = time.monotonic()
    with open("/dev/zero", "rb") as zero:
        result = run_attn("trace", "-", stdin=zero)
    assert result.returncode == 2
    assert result.stderr.startswith("Error: <stdin>: the file is binary (it holds NUL bytes")
    assert time.monotonic() - start < 10


def test_endless_text_stdin_stops_at_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    class Endless(io.RawIOBase):
        def readinto(self, b: Any) -> int:
            b[:] = b"a" * len(b)
            return len(b)

        def readable(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(Endless())))
    with pytest.raises(InputError) as info:
        load_fixture("-", max_bytes=10_000)
    assert str(info.value) == (
        "<stdin>: is larger than the limit of 10,000 bytes, expected a smaller file "
        "(a fixture piped in)"
    )


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="no /proc")
def test_a_file_larger_than_its_stat_size_is_cut_off() -> None:
    assert os.stat("/proc/self/status").st_size == 0  # /proc lies about its size
    with pytest.raises(InputError, match=r"is larger than the limit of 100 bytes"):
        load_fixture("/proc/self/status", max_bytes=100)


def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "secret.yaml"
    path.write_text("Q: [[1]]\n", encoding="utf-8")

    def denied(*args: Any, **kwargs: Any) -> int:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "open", denied)  # root ignores chmod 000, so deny it here
    with pytest.raises(InputError) as info:
        load_fixture(path)
    assert str(info.value) == (
        f"{path}: permission denied (no read permission), expected a .json, .yaml or .yml "
        "fixture file"
    )


# ---------------------------------------------------------------------------------------------
# Terminal output: input text is printed as text

HOSTILE = [
    "\x1b]8;;http://evil.example\x07click\x1b]8;;\x07",  # OSC 8 hyperlink
    "\x1b[2J\x1b[H",  # clear the screen
    "[link=http://evil.example]click[/link]",  # Rich markup
    "[bold red]loud[/bold red]",
    "\u202eevil",  # right-to-left override
    "a\rb",  # carriage return: overwrite the line
]
RAW = ("\x1b]", "\x1b[2J", "\x1b[H", "\u202e", "\r", "\x07")


def hostile_fixture(tmp_path: Path) -> Path:
    fixture = {
        "name": HOSTILE[0] + HOSTILE[2],
        "description": HOSTILE[1] + HOSTILE[3],
        "tokens": HOSTILE[:3],
        "key_tokens": HOSTILE[3:],
        "Q": [[1, 0], [0, 1], [1, 1]],
        "K": [[1, 0], [0, 1], [1, 1]],
        "V": [[1, 2], [3, 4], [5, 6]],
        "mask": [[1, 1, 1], [1, 1, 1], [0, 0, 0]],  # query 2 sees nothing: a warning names it
    }
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(fixture), encoding="utf-8")
    return path


@pytest.mark.parametrize("fmt", [["--format", "table", "--color"], ["--format", "plain"]])
def test_input_text_never_reaches_the_terminal_raw(tmp_path: Path, fmt: list[str]) -> None:
    result = run_cli("trace", str(hostile_fixture(tmp_path)), *fmt, "--width", "200")
    assert result.exit_code == 0, result.output
    for raw in RAW:
        assert raw not in result.stdout, repr(raw)
        assert raw not in result.stderr, repr(raw)
    assert "[link=http://evil.example]click[/link]" in result.stdout  # markup shown as text
    assert "[bold red]loud[/bold red]" in result.stdout
    assert "\\x1b]8;;http://evil.example\\x07click" in result.stdout  # escapes shown escaped
    assert "\\u202eevil" in result.stdout
    assert "Warning:" in result.stderr


def test_json_output_escapes_control_characters(tmp_path: Path) -> None:
    result = run_cli("trace", str(hostile_fixture(tmp_path)), "--format", "json")
    assert result.exit_code == 0
    assert not any(raw in result.stdout for raw in ("\x1b", "\x07", "\r"))
    assert json.loads(result.stdout)["tokens"][0] == HOSTILE[0]  # and it round-trips


@pytest.mark.parametrize(
    "args",
    [
        ["trace", "\x1b]0;title\x07\x1b[31mred.yaml"],  # a file name
        ["trace", "--stage", "[link=http://evil]\x1b[5m"],  # an option value
        ["trace", str(CORPUS_DIR / "json_key_with_escape.json")],  # a key in the file
        ["trace", "--max-memory", "\x1b[2J"],
    ],
)
def test_error_messages_escape_what_the_user_gave(args: list[str]) -> None:
    result = run_cli(*args)
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ")
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr
    assert "\\x1b" in result.stderr


def test_printable_escapes_only_what_cannot_be_printed() -> None:
    assert printable("cat [bold] ü 猫") == "cat [bold] ü 猫"
    assert printable("a\x1b[2Jb\nc\u202e\ud800") == "a\\x1b[2Jb\\nc\\u202e\\ud800"


# ---------------------------------------------------------------------------------------------
# Limits: memory, aliases, sizes


@pytest.mark.slow  # validates 200,000 rows
def test_a_200000_token_sequence_is_refused_before_any_stage() -> None:
    inputs = validate(
        {"X": [[0.5]] * 200_000, "W_Q": [[1]], "W_K": [[1]], "W_V": [[1]]}, "long.json"
    )
    start = time.perf_counter()
    with pytest.raises(InputError) as info:
        check_memory(inputs, 4 * 1024**3)
    assert time.perf_counter() - start < 0.1
    assert str(info.value) == (
        "long.json: tracing it would need about 894.2 GiB of memory (3 score stages each hold "
        "40,000,000,000 numbers: batch 1 x heads 1 x seq_q 200000 x seq_k 200000), expected at "
        "most 4.0 GiB"
    )


def test_requested_stages_that_fit_pass() -> None:
    inputs = validate({"X": [[0.5]] * 20_000, "W_Q": [[1]], "W_K": [[1]], "W_V": [[1]]}, "x")
    every = memory_needed(inputs)
    only_output = memory_needed(inputs, keep={"output"})
    assert only_output < every / 50  # no score stage kept: a few blocks of rows at a time
    check_memory(inputs, only_output, keep={"output"})
    with pytest.raises(InputError, match="3 score stages"):
        check_memory(inputs, only_output)


@pytest.mark.parametrize(
    "fixture",
    [
        {"X": [[0.5, 1.0]] * 300, "W_Q": [[1], [2]], "W_K": [[1], [0]], "W_V": [[1], [1]]},
        {
            "Q": [[[1.0, 2.0, 3.0, 4.0]] * 200] * 2,
            "K": [[[1.0, 2.0]] * 150] * 2,
            "V": [[[1.0, 0.0]] * 150] * 2,
            "heads": 4,
            "kv_heads": 2,
            "causal": "lower-right",
            "bias": [0.0] * 150,
            "W_O": [[1.0]] * 4,
        },
    ],
)
def test_the_estimate_bounds_what_a_trace_takes(fixture: dict[str, Any]) -> None:
    inputs = validate(fixture, "x")
    tracemalloc.start()
    try:
        run(inputs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    need = memory_needed(inputs)
    assert peak <= need, (format_bytes(peak), format_bytes(need))


@pytest.mark.slow  # traces a 1000 x 1000 fixture
def test_max_memory_option(tmp_path: Path) -> None:
    path = tmp_path / "long.json"
    path.write_text(json.dumps({"Q": [[1.0]] * 1000, "K": [[1.0]] * 1000, "V": [[1.0]] * 1000}))
    result = run_cli("trace", str(path), "--max-memory", "30M")
    assert result.exit_code == 2
    assert result.stderr == (
        f"Error: {path}: tracing it would need about 45.8 MiB of memory (3 score stages each "
        "hold 1,000,000 numbers: batch 1 x heads 1 x seq_q 1000 x seq_k 1000), expected at most "
        "30.0 MiB (see --max-memory)\n"
    )
    result = run_cli("trace", str(path), "--max-memory", "30M", "--stage", "output")
    assert result.exit_code == 0, result.stderr  # the requested stages fit
    result = run_cli("trace", str(path), "--max-memory", "1G")
    assert result.exit_code == 0, result.stderr
    result = run_cli("trace", str(path), "--max-memory", "lots")
    assert result.exit_code == 2
    assert result.stderr == (
        "Error: --max-memory: got 'lots', expected a size such as 8G, 500M or 1.5GiB "
        "(powers of 1024)\n"
    )


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1", 1),
        ("4096", 4096),
        ("2K", 2048),
        ("500M", 500 << 20),
        ("8g", 8 << 30),
        ("1.5GiB", 3 << 29),
        ("2 TB", 2 << 40),
        (".5k", 512),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "G", "-1G", "1X", "0", "0.1", "1e9"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(UsageError, match="--max-memory: got"):
        parse_size(text)


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (0, 1023, 1024, 1536, 4 << 30, 5 << 50)] == [
        "0 bytes",
        "1023 bytes",
        "1.0 KiB",
        "1.5 KiB",
        "4.0 GiB",
        "5.0 PiB",
    ]


def test_billion_laughs_is_sized_without_being_built() -> None:
    text = (CORPUS_DIR / "billion_laughs.yaml").read_text(encoding="utf-8")
    with pytest.raises(InputError):  # warm up: import yaml and NumPy outside the measurement
        parse_fixture("x: [*a]", "w.yaml")
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(InputError, match="11,111,111,120"):
            parse_fixture(text, "billion_laughs.yaml")
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 0.1, elapsed
    assert peak < 1 << 20, format_bytes(peak)


def test_alias_amplification_is_bounded_but_reuse_works() -> None:
    row = "[" + ", ".join(["1"] * 100) + "]"
    reuse = f"W_Q: &w [{', '.join([row] * 100)}]\nW_K: *w\nW_V: *w\nX: [{row}]\n"
    assert parse_fixture(reuse, "x.yaml").W_V is not None  # 10,000 values written, 30,000 read
    many = f"X: &x [&r {row}, {', '.join(['*r'] * 999)}]\nW_Q: [{', '.join(['[1]'] * 100)}]\n"
    many += "W_K: *x\nW_V: *x\n"  # W_K reads 100,000 values from an anchor: under 1,000,000
    with pytest.raises(InputError, match="W_K: has 1000 rows"):
        parse_fixture(many, "x.yaml")
    boom = f"X: [&m [&r {row}, {', '.join(['*r'] * 999)}], {', '.join(['*m'] * 10)}]\n"
    with pytest.raises(InputError, match=r"turn 101 values written into 1,100,001\), expected "):
        parse_fixture(boom, "x.yaml")


def test_yaml_is_read_by_the_safe_c_loader_when_there_is_one() -> None:
    import yaml

    from attn_cli.io.yamlfmt import _yaml_loader

    loader = _yaml_loader("x.yaml", 10)
    assert issubclass(loader, yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)
    assert not issubclass(loader, (yaml.FullLoader, yaml.UnsafeLoader))
