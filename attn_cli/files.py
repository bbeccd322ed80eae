"""Writing output files atomically: a temporary file beside the target, then a rename."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

from attn_cli.errors import UsageError


def write_atomic(path: Path, text: str, *, option: str = "--output") -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new, never half."""
    source = str(path)
    if path.is_dir():
        raise UsageError(source, option, "is a directory", "a file path to write")
    folder = path.parent
    if not folder.is_dir():
        raise UsageError(
            source, option, f"folder {str(folder)!r} does not exist", "an existing folder"
        )
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except PermissionError:
        raise UsageError(source, option, "permission denied", "a writable place") from None
    except OSError as e:
        what = "the disk is full" if e.errno == errno.ENOSPC else f"cannot write ({e.strerror})"
        raise UsageError(source, option, what, "a writable place with free space") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
