"""The one input gate: every file attn reads goes through here.

Fixtures, ``{file: ...}`` references, whole-fixture ``.npz``, golden files, ``--against`` dumps
and standard input. The gate promises, for each of them:

- only regular files are read: a FIFO, device, socket or directory is refused unread, and the
  open itself never blocks (``O_NONBLOCK``), so nothing hangs;
- at most ``max_bytes`` are read, whatever the file's size claims to be (``/proc``, growth);
- ``.npy`` data is read only after its header is checked: a header of at most 10,000 bytes,
  whole dimensions, no Python objects (nothing is ever unpickled), real numbers (or strings
  where a caller asks for them), and budgets shared by all arrays of one input: elements
  counted exactly, and strings counted by the bytes they take as Python text, not by number;
- a ``.npz`` is sized before it is opened (its zip directory, its member count), and members
  that are encrypted, oddly compressed, corrupt or named twice are refused;
- every way of failing is an :class:`InputError` naming the file and what was expected.
"""

from __future__ import annotations

import errno
import math
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


def kind_of(path: Path) -> str | None:
    """``file``, ``dir``, ``other`` or None (nothing there, or a name the system rejects)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # missing, too long (ENAMETOOLONG), a NUL, a loop
        return None
    return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "other"


def not_a_file(path: Path) -> str | None:
    """What is at ``path`` when it is no regular file ("no such file", "is a directory", "is a
    named pipe (FIFO), ...", a symlink loop), as an error line says it; None for a file."""
    try:
        mode = os.stat(path).st_mode  # stat never blocks, even on a FIFO
    except (OSError, ValueError) as e:
        return _os_error(e, path, "", "", "").what
    return _not_regular(mode)


def _not_regular(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory"
    kind = next((name for test, name in _KINDS if test(mode)), "a special file")
    return f"is {kind}, not a regular file"


def require_regular(
    mode: int, source: str, expected: str, field: str = "", special_hint: str = ""
) -> None:
    """Refuse what is not a regular file: reading it could hang (FIFO) or never end."""
    problem = _not_regular(mode)
    if problem is not None:
        hint = "" if stat.S_ISDIR(mode) else special_hint
        raise InputError(source, field, problem, expected + hint)


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
    path: Path, source: str, expected: str, *, max_bytes: int, special_hint: str = ""
) -> bytes:
    """The bytes of a regular file, read through :func:`open_regular`."""
    with open_regular(path, source, expected, max_bytes=max_bytes, special_hint=special_hint) as f:
        try:
            return read_limited(f, source, max_bytes, expected)
        except OSError as e:
            raise _os_error(e, path, source, expected, "") from None


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


# Limits of the array reader that no honest file comes near.
MAX_HEADER_BYTES = 10_000  # a .npy header (numpy's own default limit)
MAX_MEMBERS = 4096  # arrays in one .npz
MAX_DIRECTORY_BYTES = 1 << 20  # its zip directory: zipfile holds ~300 bytes per entry
MAX_TEXT_BYTES = 64 << 20  # strings of one input (tokens, names), counted as Python holds them
_STR_OVERHEAD = 64  # bytes a Python str takes beyond its characters (4 bytes each at most)
_NPY_VERSIONS = ((1, 0), (2, 0), (3, 0))
NUMBERS = "biuf"  # dtype kinds of booleans, integers, floats: a stage, weight or mask
NUMBERS_OR_TEXT = NUMBERS + "U"  # and strings: a whole-fixture .npz holds tokens and a name


class ArrayReader:
    """Reads ``.npy`` arrays and ``.npz`` archives through the gate, under one element budget
    and one budget of text shared by all arrays of one input."""

    def __init__(self, max_elements: int, max_bytes: int) -> None:
        self.max_elements = max_elements
        self.max_bytes = max_bytes
        self.count = 0
        self.text_bytes = 0

    @contextmanager
    def archive(self, f: IO[bytes], where: str) -> Iterator[zipfile.ZipFile]:
        """An open ``.npz`` (zip) archive over the regular file ``f``; its directory is sized
        before :mod:`zipfile` reads it, and two members of one name are refused."""
        import zipfile  # here: only .npz files need it, and it costs start-up

        _check_directory(f, where)
        try:
            archive = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError):
            raise InputError(where, "", "not a readable .npz archive", "numpy.savez") from None
        with archive:
            names = archive.namelist()
            if len(names) > MAX_MEMBERS:
                what = f"holds {len(names):,} members"
                raise InputError(where, "", what, f"at most {MAX_MEMBERS:,} arrays")
            if len(set(names)) < len(names):
                twice = next(n for n in names if names.count(n) > 1)
                what = f"holds two members named {twice!r}"
                raise InputError(where, "", what, "each array once (numpy.savez)")
            yield archive

    def read_member(
        self, archive: zipfile.ZipFile, member: str, field: str, where: str, kinds: str = NUMBERS
    ) -> np.ndarray[Any, Any]:
        """One ``.npy`` member of an archive; encrypted or oddly compressed ones are refused."""
        import zipfile
        import zlib

        info = archive.getinfo(member)
        if info.flag_bits & 0x1:
            raise InputError(where, field, "the array is encrypted", "numpy.savez (no password)")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            what = f"the array uses zip compression method {info.compress_type}"
            raise InputError(where, field, what, "numpy.savez or numpy.savez_compressed")
        try:
            with archive.open(member) as f:
                return self.read_array(f, field, where, kinds)
        except (
            zipfile.BadZipFile,
            zlib.error,
            OSError,
            EOFError,
            NotImplementedError,
            RuntimeError,
        ) as e:
            raise InputError(where, field, f"unreadable array ({e})", "numpy.savez") from None

    def read_array(
        self, f: IO[bytes], field: str, where: str, kinds: str = NUMBERS
    ) -> np.ndarray[Any, Any]:
        """One .npy array: its header is checked and its size counted before data is read.

        ``kinds`` are the dtype kinds wanted: ``NUMBERS``, or ``NUMBERS_OR_TEXT``.
        """
        import numpy as np

        shape, dtype = self._header(f, field, where, kinds)
        self._count(shape, dtype, field, where)
        f.seek(0)
        try:
            arr: np.ndarray[Any, Any] = np.lib.format.read_array(f, allow_pickle=False)
        except (ValueError, OSError, EOFError, OverflowError, MemoryError) as e:
            raise InputError(where, field, f"unreadable array ({e})", "numpy.save") from None
        if arr.dtype.kind == "f" and arr.dtype != np.float64:
            return arr.astype(np.float64)  # float16/32, or the other byte order
        return arr

    def _count(self, shape: tuple[int, ...], dtype: np.dtype[Any], field: str, where: str) -> None:
        """Charge the array to the budgets: numbers by count, strings by the bytes they take."""
        size = math.prod(shape)  # Python ints: exact, never wraps
        self.count += size
        if self.count > self.max_elements:
            raise InputError(
                where,
                field,
                f"holds {size:,} numbers, too many for one fixture",
                f"at most {self.max_elements:,}",
                option="max-elements",
            )
        if dtype.kind == "U":  # 8 million two-letter strings: 64 MiB here, 500 MiB as Python
            self.text_bytes += size * (dtype.itemsize + _STR_OVERHEAD)
            if self.text_bytes > MAX_TEXT_BYTES:
                what = f"holds {size:,} string(s) of up to {dtype.itemsize // 4:,} characters"
                expected = f"at most {MAX_TEXT_BYTES >> 20} MiB of text (tokens, names)"
                raise InputError(where, field, what, expected)

    def _header(
        self, f: IO[bytes], field: str, where: str, kinds: str
    ) -> tuple[tuple[int, ...], np.dtype[Any]]:
        """The shape and dtype of a ``.npy`` stream, refused when they are not plain data."""
        version = _npy_version(f, field, where)
        shape, dtype = _parse_header(f, version, field, where)
        if any(type(n) is not int or n < 0 for n in shape):  # True is an int, not a size
            raise InputError(where, field, f"has the shape {_shorten(shape)}", "whole sizes >= 0")
        if dtype.hasobject:
            raise InputError(
                where,
                field,
                "holds Python objects (reading them would unpickle)",
                "an array of numbers (or booleans)",
            )
        if dtype.kind not in kinds:
            wanted = "real numbers" + (" or strings" if "U" in kinds else " (or booleans)")
            raise InputError(where, field, f"has dtype {_shorten(dtype)}", wanted)
        return tuple(shape), dtype


def _npy_version(f: IO[bytes], field: str, where: str) -> tuple[int, int]:
    """The format version of a ``.npy`` stream, its header length checked, rewound."""
    import struct

    lead = f.read(12)  # magic (6), version (2), header length (2 or 4)
    if len(lead) < 10 or lead[:6] != b"\x93NUMPY":
        raise InputError(where, field, "not a .npy array", "a file written by numpy.save")
    version = (lead[6], lead[7])
    if version not in _NPY_VERSIONS:
        what = f"is .npy format version {version[0]}.{version[1]}"
        raise InputError(where, field, what, "1.0, 2.0 or 3.0 (numpy.save)")
    if version == (1, 0):
        length = struct.unpack("<H", lead[8:10])[0]
    else:
        length = struct.unpack("<I", lead[8:12].ljust(4, b"\0"))[0]
    if length > MAX_HEADER_BYTES:  # numpy would read all of it before it refused it
        what = f"has a header of {length:,} bytes"
        raise InputError(where, field, what, f"at most {MAX_HEADER_BYTES:,} (numpy.save)")
    f.seek(0)
    return version


def _parse_header(
    f: IO[bytes], version: tuple[int, int], field: str, where: str
) -> tuple[Any, np.dtype[Any]]:
    """numpy's own header parser; whatever it raises on a hostile header is an InputError."""
    import tokenize

    import numpy as np

    fmt = np.lib.format
    try:
        fmt.read_magic(f)
        header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, _fortran, dtype = header(f)
    except (ValueError, TypeError, SyntaxError, OverflowError, RecursionError, tokenize.TokenError):
        raise InputError(where, field, "not a .npy array", "a file written by numpy.save") from None
    return shape, dtype


def _shorten(value: object, limit: int = 60) -> str:
    """``str(value)``, cut to ``limit`` characters: a header may hold 10,000 of them."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_directory(f: IO[bytes], where: str) -> None:
    """Refuse a zip whose directory is huge before :mod:`zipfile` builds an object per entry.

    The end record is found as :mod:`zipfile` finds it (at the very end, else the last one in
    the final 64 KiB); a zip without one is left for :mod:`zipfile` to refuse.
    """
    end = _end_record(f)
    if end is None:
        return
    entries, size = end
    if entries > MAX_MEMBERS or size > MAX_DIRECTORY_BYTES:
        raise InputError(
            where,
            "",
            f"its zip directory lists {entries:,} members in {size:,} bytes",
            f"at most {MAX_MEMBERS:,} arrays (numpy.savez)",
        )


def _end_record(f: IO[bytes]) -> tuple[int, int] | None:
    """(entries, directory size) from a zip's end record (zip64 if it has one), or None."""
    import struct

    f.seek(0, os.SEEK_END)
    file_size = f.tell()
    start = max(0, file_size - (1 << 16) - 22)
    f.seek(start)
    tail = f.read()
    at = len(tail) - 22
    if not (tail[at : at + 4] == b"PK\x05\x06" and tail[-2:] == b"\0\0"):
        at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        f.seek(0)
        return None
    entries, size = struct.unpack("<HI", tail[at + 10 : at + 16])
    locator = start + at - 20  # a zip64 end record sits before its locator, before this one
    if locator >= 56:
        f.seek(locator)
        loc = f.read(20)
        if loc[:4] == b"PK\x06\x07":
            f.seek(locator - 56)
            record = f.read(56)
            if record[:4] == b"PK\x06\x06":
                entries, size = struct.unpack("<QQ", record[32:48])
    f.seek(0)
    return entries, size
