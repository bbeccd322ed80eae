"""Writing output files atomically: a temporary file beside the target, then a rename.

Every file attn writes goes through here, under one policy: the old file or the new, never
half; no temporary left behind, whatever ends the write (an error, Ctrl-C, SIGTERM, SIGHUP);
a write-protected file is not replaced (as ``cp`` and the shell's ``>`` refuse), unless forced.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import IO, Any

from attn_cli.errors import UsageError, printable

# Signals that end a run: while a file is written, they raise instead, so that the cleanup of
# the write runs; then the process dies of the same signal, as it would have.
FATAL_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)
TEMP_NAME_BYTES = 100  # of the target's name kept in the temporary's: well under NAME_MAX (255)


class Killed(BaseException):
    """A fatal signal arrived while a file was being written (a BaseException, as Ctrl-C is)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def write_atomic(path: Path, text: str, *, option: str = "--output", force: bool = False) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new, never half.

    On any failure (full disk, no permission, Ctrl-C, SIGTERM, SIGHUP) the target is untouched
    and no temporary file is left behind. A device or FIFO (``-o /dev/stdout``) is written to
    directly: renaming a file over it would replace the device. A write-protected file is
    refused unless ``force`` (``cp -f`` replaces it too).
    """
    data = text.encode("utf-8", errors="backslashreplace")
    write_atomic_with(path, lambda f: f.write(data), option=option, force=force)


def write_atomic_with(
    path: Path,
    write: Callable[[IO[bytes]], object],
    *,
    option: str = "--output",
    force: bool = False,
) -> None:
    """As :func:`write_atomic`, for binary output that ``write`` streams into the open file."""
    source = printable(str(path))
    try:
        mode = _existing_mode(path)  # through symlinks: /dev/stdout is a pipe or a terminal
        if mode is not None and stat.S_ISDIR(mode):
            raise UsageError(source, option, "is a directory", "a file path to write")
        if mode is not None and not stat.S_ISREG(mode):
            with fatal_signals_raise(), _open_special(path, source, option) as f:
                write(f)
            return
        target = Path(os.path.realpath(path))  # through a symlink: replace its target, keep it
        if not target.parent.is_dir():
            shown = printable(str(Path(path).parent))
            raise UsageError(
                source, option, f"folder {shown!r} does not exist", "an existing folder"
            )
        if mode is not None and not force and _write_protected(target, mode):
            raise UsageError(
                source,
                option,
                "is write-protected (attn does not replace it, as cp does not)",
                "a writable file: make it writable (chmod u+w) or choose another name",
            )
        with fatal_signals_raise():
            _replace(target, write, mode)
    except PermissionError:
        raise UsageError(source, option, "permission denied", "a writable place") from None
    except OSError as e:
        what = "the disk is full" if e.errno == errno.ENOSPC else f"cannot write ({e.strerror})"
        raise UsageError(source, option, what, "a writable place with free space") from None


@contextlib.contextmanager
def folders_for(path: Path, *, option: str = "--output") -> Iterator[None]:
    """The folders ``path`` is to be written in, made as ``mkdir -p`` would for the body of the
    ``with`` (which writes it with :func:`write_atomic`); if the body fails, the folders it made
    are removed again, when still empty. A file (or a FIFO, a device) where a folder should be
    is refused by name, and nothing is made."""
    made = _make_folders(path, option)
    try:
        yield
    except BaseException:
        for folder in made:  # the deepest first
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        raise


def _make_folders(path: Path, option: str) -> list[Path]:
    """Make the missing folders above ``path``; the ones made, the deepest first."""
    source = printable(str(path))
    folder = Path(path).parent
    missing: list[Path] = []
    for above in (folder, *folder.parents):
        try:
            mode = os.stat(above).st_mode
        except (FileNotFoundError, NotADirectoryError):
            missing.append(above)  # not there (yet), or under a file found further up
            continue
        except (OSError, ValueError) as e:
            what = f"cannot use the folder {printable(str(above))!r} ({_reason(e)})"
            raise UsageError(source, option, what, "a usable path") from None
        if not stat.S_ISDIR(mode):
            raise UsageError(
                source,
                option,
                f"{printable(str(above))!r} is not a folder",
                "a path whose folders are folders, or do not exist yet (attn makes them)",
            )
        break
    try:
        os.makedirs(folder, exist_ok=True)
    except (OSError, ValueError) as e:
        what = f"cannot make the folder {printable(str(folder))!r} ({_reason(e)})"
        raise UsageError(source, option, what, "a writable place") from None
    return missing


def _reason(e: BaseException) -> str:
    return str(getattr(e, "strerror", None) or e)


def _open_special(path: Path, source: str, option: str) -> IO[bytes]:
    """A FIFO or device opened for writing without waiting: a FIFO nobody reads is an error.

    A blocking open of a FIFO waits for a reader, forever if none comes; opened non-blocking
    it fails at once (ENXIO), and once open the writes block again, as ``>`` would.
    """
    flags = os.O_WRONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno != errno.ENXIO:
            raise
        raise UsageError(
            source,
            option,
            "no reader on the named pipe (FIFO)",
            "a named pipe that a program is reading (start the reader first), or a file",
        ) from None
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "wb")


def _write_protected(target: Path, mode: int) -> bool:
    """No write permission for us, or (for root, who may write anything) none for anyone."""
    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        return True
    return not os.access(target, os.W_OK)


@contextlib.contextmanager
def fatal_signals_raise() -> Iterator[None]:
    """While writing: SIGTERM and SIGHUP raise :class:`Killed`, so the cleanup runs; then the
    process dies of that signal. Signals that were ignored stay ignored (``nohup``)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; its writes are the ones signals end
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Killed(signum)

    previous: dict[int, Any] = {}
    for signum in FATAL_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    except Killed as e:
        _restore(previous)
        die_of(e.signum)
    finally:
        _restore(previous)


def _restore(previous: dict[int, Any]) -> None:
    for signum, old in previous.items():
        signal.signal(signum, old)
    previous.clear()


def die_of(signum: int) -> None:
    """End the process by ``signum`` with its default action, as if it had not been caught."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    raise SystemExit(128 + signum)  # not reached where the signal's default is to end


def _existing_mode(path: Path) -> int | None:
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return None


def _replace(target: Path, write: Callable[[IO[bytes]], object], mode: int | None) -> None:
    """Write a temporary file in the target's folder, flush it to disk, rename it over."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{_short(target.name)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            if hasattr(os, "fchmod"):  # mkstemp makes it private (0600); give it a file's mode
                os.fchmod(f.fileno(), stat.S_IMODE(mode) if mode is not None else _new_file_mode())
        os.replace(tmp, target)
    except BaseException:  # including Ctrl-C: never leave the temporary behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _short(name: str, most: int = TEMP_NAME_BYTES) -> str:
    """The start of ``name`` that fits in ``most`` bytes on disk, cut between characters."""
    if len(os.fsencode(name)) <= most:
        return name
    size = 0
    for i, char in enumerate(name):
        size += len(os.fsencode(char))
        if size > most:
            return name[:i]
    return name


def _new_file_mode() -> int:
    """0o666 less the umask, the mode ``open()`` would give a new file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
