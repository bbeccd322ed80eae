"""The one input gate: every file attn reads goes through here.

Fixtures, ``{file: ...}`` references, whole-fixture ``.npz``, golden files, ``--against`` dumps
and standard input. The gate promises, for each of them:

- only regular files are read: a FIFO, device, socket or directory is refused unread, and the
  open itself never blocks (``O_NONBLOCK``), so nothing hangs;
- at most ``max_bytes`` are read, whatever the file's size claims to be (``/proc``, growth);
- ``.npy`` data is read only after its header is checked: no Python objects (nothing is ever
  unpickled), real numbers or strings only, and an element budget shared by all arrays of
  one input;
- every way of failing is an :class:`InputError` naming the file and what was expected.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO

from attn_cli.errors import InputError

if TYPE_CHECKING:
    import zipfile

    import numpy as np

_CHUNK = 1 << 20
_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def open_input(path: Path, *, buffered: bool = False) -> BinaryIO:
    """Open a file for reading without blocking, even on a FIFO (callers still fstat it)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    return os.fdopen(os.open(path, flags), "rb", buffering=-1 if buffered else 0)


def require_regular(
    mode: int, source: str, expected: str, field: str = "", special_hint: str = ""
) -> None:
    """Refuse what is not a regular file: reading it could hang (FIFO) or never end."""
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise InputError(source, field, "is a directory", expected)
    kind = next((name for test, name in _KINDS if test(mode)), "a special file")
    raise InputError(source, field, f"is {kind}, not a regular file", expected + special_hint)


@contextmanager
def open_regular(
    path: Path,
    source: str,
    expected: str,
    *,
    max_bytes: int,
    field: str = "",
    special_hint: str = "",
) -> Iterator[BinaryIO]:
    """A regular file of at most ``max_bytes``, opened for reading; all else an InputError.

    ``special_hint`` is added to what is expected when the path is a FIFO or a device.
    """
    try:
        mode = os.stat(path).st_mode  # stat never blocks, even on a FIFO
        require_regular(mode, source, expected, field, special_hint)
        f = open_input(path, buffered=True)
    except InputError:
        raise
    except (OSError, ValueError) as e:
        raise _os_error(e, path, source, expected, field) from None
    with f:
        info = os.fstat(f.fileno())  # the path may have been swapped since the stat
        require_regular(info.st_mode, source, expected, field, special_hint)
        if info.st_size > max_bytes:
            what = f"file is {info.st_size:,} bytes"
            raise InputError(source, field, what, f"at most {max_bytes:,} bytes")
        yield f


def read_bytes(
    path: Path,
    source: str,
    expected: str,
    *,
    max_bytes: int,
    field: str = "",
    special_hint: str = "",
) -> bytes:
    """The bytes of a regular file, read through :func:`open_regular`."""
    hint = special_hint
    with open_regular(
        path, source, expected, max_bytes=max_bytes, field=field, special_hint=hint
    ) as f:
        try:
            return read_limited(f, source, max_bytes, expected)
        except OSError as e:
            raise _os_error(e, path, source, expected, field) from None


def read_stdin(max_bytes: int, expected: str = "a fixture piped in") -> bytes:
    """Standard input, at most ``max_bytes`` of it."""
    source = "<stdin>"
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:
        raise InputError(source, "", "standard input is closed", expected)
    try:
        return read_limited(stream, source, max_bytes, expected)
    except OSError as e:
        raise InputError(source, "", f"cannot read ({e.strerror or e})", expected) from None


def read_limited(stream: Any, source: str, max_bytes: int, expected: str) -> bytes:
    """Read to the end, but never more than ``max_bytes``: a stat size can lie."""
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = stream.read(min(_CHUNK, max_bytes + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > max_bytes:
            what = f"is larger than the limit of {max_bytes:,} bytes"
            raise InputError(source, "", what, f"a smaller file ({expected})")
        if b"\x00" in chunk:
            break  # text never holds NUL: enough is read to say why (binary, UTF-16 or UTF-32)
    return b"".join(chunks)


def _os_error(
    e: OSError | ValueError, path: Path, source: str, expected: str, field: str
) -> InputError:
    """The InputError for a failed stat, open or read."""
    if isinstance(e, ValueError):  # os.stat refuses a path holding a NUL character
        return InputError(source, field, "the path holds a NUL character", "a file path")
    if isinstance(e, FileNotFoundError):
        return InputError(source, field, "no such file", expected)
    if isinstance(e, NotADirectoryError):
        what = "no such file (a part of the path is not a folder)"
        return InputError(source, field, what, expected)
    if isinstance(e, IsADirectoryError) or (isinstance(e, PermissionError) and path.is_dir()):
        return InputError(source, field, "is a directory", expected)  # Windows: permission
    if isinstance(e, PermissionError):
        return InputError(source, field, "permission denied (no read permission)", expected)
    if e.errno == errno.ELOOP:
        return InputError(source, field, "the path is a loop of symbolic links", expected)
    return InputError(source, field, f"cannot read file ({e.strerror or e})", expected)


class ArrayReader:
    """Reads ``.npy`` arrays and ``.npz`` archives through the gate, under one element budget."""

    def __init__(self, max_elements: int, max_bytes: int) -> None:
        self.max_elements = max_elements
        self.max_bytes = max_bytes
        self.count = 0

    @contextmanager
    def archive(self, f: IO[bytes], where: str) -> Iterator[zipfile.ZipFile]:
        """An open ``.npz`` (zip) archive over the regular file ``f``."""
        import zipfile  # here: only .npz files need it, and it costs start-up

        try:
            archive = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError):
            raise InputError(where, "", "not a readable .npz archive", "numpy.savez") from None
        with archive:
            yield archive

    def read_member(
        self, archive: zipfile.ZipFile, member: str, field: str, where: str
    ) -> np.ndarray[Any, Any]:
        """One ``.npy`` member of an archive; encrypted or oddly compressed ones are refused."""
        import zipfile

        info = archive.getinfo(member)
        if info.flag_bits & 0x1:
            raise InputError(where, field, "the array is encrypted", "numpy.savez (no password)")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            what = f"the array uses zip compression method {info.compress_type}"
            raise InputError(where, field, what, "numpy.savez or numpy.savez_compressed")
        try:
            with archive.open(member) as f:
                return self.read_array(f, field, where)
        except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError) as e:
            raise InputError(where, field, f"unreadable array ({e})", "numpy.savez") from None

    def read_array(self, f: IO[bytes], field: str, where: str) -> np.ndarray[Any, Any]:
        """One .npy array: its header is checked before any of its data is read."""
        import numpy as np

        shape, dtype = self._header(f, where)
        size = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if dtype.kind == "U":
            size *= max(1, dtype.itemsize // 4)  # strings count by characters, not arrays
        self.count += size
        if self.count > self.max_elements:
            raise InputError(
                where, "", f"holds {size:,} numbers, too many for one fixture",
                f"at most {self.max_elements:,} (see --max-elements)",
            )  # fmt: skip
        f.seek(0)
        try:
            arr: np.ndarray[Any, Any] = np.lib.format.read_array(f, allow_pickle=False)
        except (ValueError, OSError, EOFError, MemoryError) as e:
            raise InputError(where, "", f"unreadable array ({e})", "numpy.save") from None
        if arr.dtype.kind == "f" and arr.dtype != np.float64:
            return arr.astype(np.float64)  # float16/32, or the other byte order
        return arr

    def _header(self, f: IO[bytes], where: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
        """The shape and dtype of a ``.npy`` stream, refused when they are not plain data."""
        import numpy as np

        fmt = np.lib.format
        try:
            version = fmt.read_magic(f)
            header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _fortran, dtype = header(f)
        except (ValueError, OSError, EOFError, TypeError, SyntaxError):
            raise InputError(
                where, "", "not a .npy array", "a file written by numpy.save"
            ) from None
        if any(not isinstance(n, int) or n < 0 for n in shape):
            raise InputError(where, "", f"has the shape {shape}", "whole dimensions >= 0")
        if dtype.hasobject:
            raise InputError(
                where, "", "holds Python objects (reading them would unpickle)",
                "an array of numbers (or booleans)",
            )  # fmt: skip
        if dtype.kind not in "biufU":
            raise InputError(where, "", f"has dtype {dtype}", "real numbers")
        return tuple(shape), dtype
