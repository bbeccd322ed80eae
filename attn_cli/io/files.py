"""Writing output files atomically: a temporary file beside the target, then a rename."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from attn_cli.errors import UsageError, printable


def write_atomic(path: Path, text: str, *, option: str = "--output") -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new, never half.

    On any failure (full disk, no permission, Ctrl-C) the target is untouched and no temporary
    file is left behind. A device or FIFO (``-o /dev/stdout``) is written to directly: renaming
    a file over it would replace the device.
    """
    data = text.encode("utf-8", errors="backslashreplace")
    write_atomic_with(path, lambda f: f.write(data), option=option)


def write_atomic_with(
    path: Path, write: Callable[[IO[bytes]], object], *, option: str = "--output"
) -> None:
    """As :func:`write_atomic`, for binary output that ``write`` streams into the open file."""
    source = printable(str(path))
    try:
        mode = _existing_mode(path)  # through symlinks: /dev/stdout is a pipe or a terminal
        if mode is not None and stat.S_ISDIR(mode):
            raise UsageError(source, option, "is a directory", "a file path to write")
        if mode is not None and not stat.S_ISREG(mode):
            with open(path, "wb") as f:
                write(f)
            return
        target = Path(os.path.realpath(path))  # through a symlink: replace its target, keep it
        if not target.parent.is_dir():
            shown = printable(str(Path(path).parent))
            raise UsageError(
                source, option, f"folder {shown!r} does not exist", "an existing folder"
            )
        _replace(target, write, mode)
    except PermissionError:
        raise UsageError(source, option, "permission denied", "a writable place") from None
    except OSError as e:
        what = "the disk is full" if e.errno == errno.ENOSPC else f"cannot write ({e.strerror})"
        raise UsageError(source, option, what, "a writable place with free space") from None


def _existing_mode(path: Path) -> int | None:
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return None


def _replace(target: Path, write: Callable[[IO[bytes]], object], mode: int | None) -> None:
    """Write a temporary file in the target's folder, flush it to disk, rename it over."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name[:64]}.", suffix=".tmp")
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


def _new_file_mode() -> int:
    """0o666 less the umask, the mode ``open()`` would give a new file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
