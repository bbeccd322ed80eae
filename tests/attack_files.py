"""Hostile input files for tests/io/test_attacks.py, built byte by byte.

``.npy`` streams with any header, zip archives with any flag, method, size or name (a small
writer of its own, since :mod:`zipfile` refuses to write most of them), and JSON texts.
Each attack is a named case: the bytes, and whether a careful reader may accept them.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

MAGIC = b"\x93NUMPY"
ERROR = "error"  # the reader must refuse it: exit 2, one Error: line
EITHER = "either"  # valid or not, depending on the surface: a correct result or one Error: line
VALID = "valid"  # a valid file: the command must give its normal result

# The arrays of a small projection fixture (T=3 tokens, d_model=4, d_k=2), as in the_cat_sat.
X = np.array([[1.0, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]])
W_Q = np.array([[1.0, 0], [0, 1], [1, 0], [0, 1]])
W_K = np.array([[0.0, 1], [1, 0], [0, 0], [1, 1]])
W_V = np.array([[1.0, 0], [0, 1], [1, 1], [0, 0]])


# ---------------------------------------------------------------------------------------------
# .npy


def npy(
    descr: str = "'<f8'",
    shape: str = "(3, 4)",
    fortran: str = "False",
    data: bytes | None = None,
    *,
    version: tuple[int, int] = (1, 0),
    header: str | None = None,
    header_length: int | None = None,
    magic: bytes = MAGIC,
) -> bytes:
    """A ``.npy`` stream with the header written as given (default data: X, C order)."""
    text = (
        header
        if header is not None
        else (f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, }}")
    )
    size_format = "<H" if version == (1, 0) else "<I"
    lead = len(magic) + 2 + struct.calcsize(size_format)
    pad = (-(lead + len(text) + 1)) % 64
    body = (text + " " * pad + "\n").encode("utf-8" if version >= (3, 0) else "latin1")
    length = len(body) if header_length is None else header_length
    raw = X.tobytes() if data is None else data
    return magic + bytes(version) + struct.pack(size_format, length) + body + raw


@dataclass(frozen=True)
class Attack:
    """One hostile file: its id, its bytes, a tail of zeros, and what the reader may do."""

    name: str
    data: bytes
    outcome: str = ERROR
    tail: int = 0  # zero bytes after ``data`` (written sparse, or deflated in an archive)

    def parts(self) -> Iterable[bytes]:
        """The whole stream, in chunks."""
        yield self.data
        yield from filler(self.tail)


_EXTRA_KEY = "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 4), 'evil': 1}"


def npy_attacks() -> list[Attack]:
    """Malformed, odd and valid ``.npy`` streams, each meant as the fixture's X (3 x 4)."""
    good = npy()
    return [
        Attack("valid", good, VALID),
        Attack("fortran_order", npy(fortran="True", data=X.T.copy().tobytes()), VALID),
        Attack("big_endian", npy("'>f8'", data=X.astype(">f8").tobytes()), VALID),
        Attack("float32", npy("'<f4'", data=X.astype("<f4").tobytes()), VALID),
        Attack("float16", npy("'<f2'", data=X.astype("<f2").tobytes()), VALID),
        Attack("int64", npy("'<i8'", data=X.astype("<i8").tobytes()), VALID),
        Attack("uint8", npy("'|u1'", data=X.astype("u1").tobytes()), VALID),
        Attack("version_2", npy(version=(2, 0)), VALID),
        Attack("version_3", npy(version=(3, 0)), VALID),
        Attack("trailing_bytes", good + b"\x00" * 64, EITHER),
        Attack("bool", npy("'|b1'", data=(X > 0).tobytes()), EITHER),
        Attack("longdouble", npy("'<f16'", data=b"\x00" * 16 * 12), EITHER),
        Attack("bool_dimension", npy(shape="(True, 4)", data=X[:1].tobytes()), EITHER),
        Attack("scalar", npy(shape="()", data=X[0, :1].tobytes()), EITHER),
        Attack("zero_size_huge_axis", npy(shape="(0, 1000000000000)", data=b""), EITHER),
        Attack("empty_file", b""),
        Attack("bad_magic", b"\x93NUMPX" + good[6:]),
        Attack("text_file", b"X = [[1, 0, 1, 0]]\n"),
        Attack("magic_only", MAGIC),
        Attack("magic_and_version", MAGIC + b"\x01\x00"),
        Attack("version_4", npy(version=(4, 0))),
        Attack("version_1_1", npy(version=(1, 1))),
        Attack("truncated_header", good[:30]),
        Attack("header_length_too_long", npy(header_length=60000)),
        Attack("header_length_4gib", npy(version=(2, 0), header_length=0xFFFFFFF0)),
        Attack("header_length_zero", npy(header_length=0)),
        Attack("header_not_a_dict", npy(header="[3, 4]")),
        Attack("header_missing_shape", npy(header="{'descr': '<f8', 'fortran_order': False}")),
        Attack("header_extra_key", npy(header=_EXTRA_KEY)),
        Attack("header_code", npy(header="__import__('os').system('touch pwned')")),
        Attack("header_call_in_shape", npy(shape="(len('abc'), 4)")),
        Attack("header_deep_parens", npy(header="(" * 3000 + ")" * 3000)),
        Attack("header_not_latin1_v3", npy(version=(3, 0))[:12] + b"\xff\xfe" + npy()[12:]),
        Attack("fortran_order_not_bool", npy(fortran="'yes'")),
        Attack("negative_dimension", npy(shape="(-3, 4)")),
        Attack("negative_times_zero", npy(shape="(0, -5)", data=b"")),
        Attack("negative_pair", npy(shape="(-1, -12)")),
        Attack("dimension_2_63", npy(shape="(9223372036854775807, 2)")),
        Attack("product_wraps_int64", npy(shape="(4294967296, 4294967296)")),
        Attack("dimension_beyond_int64", npy(shape="(1180591620717411303424,)")),
        Attack("float_dimension", npy(shape="(3.0, 4)")),
        Attack("string_dimension", npy(shape="('3', 4)")),
        Attack("none_dimension", npy(shape="(None, 4)")),
        Attack("shape_is_a_list", npy(shape="[3, 4]")),
        Attack("shape_is_an_int", npy(shape="12")),
        Attack("65_axes", npy(shape="(1,) * 65")),
        Attack("65_axes_written", npy(shape="(" + "1, " * 65 + ")", data=X.tobytes()[:8])),
        Attack("data_truncated", npy(data=X.tobytes()[:40])),
        Attack("data_missing", npy(data=b"")),
        Attack("too_many_elements", npy(shape="(100000000,)", data=b"")),
        Attack("too_many_elements_2d", npy(shape="(20000, 20000)", data=b"")),
        Attack("object", npy("'|O'", data=b"\x80\x04N.")),
        Attack("object_in_struct", npy("[('a', '<f8'), ('b', '|O')]")),
        Attack("void", npy("'|V8'")),
        Attack("structured", npy("[('a', '<f8'), ('b', '<f8')]", "(3, 2)")),
        Attack("subarray", npy("('<f8', (4,))", "(3,)")),
        Attack("datetime", npy("'<M8[D]'")),
        Attack("timedelta", npy("'<m8[s]'")),
        Attack("complex", npy("'<c16'", data=X.astype("<c16").tobytes())),
        Attack("bytes", npy("'|S8'")),
        Attack("unicode_small", npy("'<U2'", data=X.astype("<U2").tobytes()), EITHER),
        Attack("unknown_descr", npy("'<q9'")),
        Attack("descr_not_a_string", npy("42")),
        Attack("string_of_64mib", npy("'<U16777216'", "(1,)", data=b""), tail=64 << 20),
        Attack("string_array_64mib", npy("'<U1000'", "(16777,)", data=b""), tail=64 << 20),
        Attack("unicode_itemsize_overflow", npy("'<U4611686018427387904'", "(1,)", data=b"")),
    ]


def filler(n: int) -> Iterable[bytes]:
    """``n`` zero bytes, in chunks: the tail of an array whose data is all zeros."""
    chunk = b"\x00" * (1 << 20)
    for start in range(0, n, len(chunk)):
        yield chunk[: min(len(chunk), n - start)]


# ---------------------------------------------------------------------------------------------
# zip archives


@dataclass(frozen=True)
class Member:
    """One zip member as written; ``None`` fields take their honest value."""

    name: bytes
    data: bytes | Iterable[bytes] = b""
    method: int = 0
    flags: int = 0
    crc: int | None = None
    compressed_size: int | None = None
    file_size: int | None = None
    raw: bool = False  # ``data`` is already compressed (give ``crc`` and ``file_size``)
    offset: int | None = None  # where the directory says the local header is
    local_name: bytes | None = None  # the name in the local header, if not ``name``


def deflate(parts: Iterable[bytes]) -> tuple[bytes, int, int]:
    """Raw deflate of the parts: (compressed bytes, CRC-32, uncompressed size)."""
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    out, crc, size = [], 0, 0
    for part in parts:
        out.append(z.compress(part))
        crc = zlib.crc32(part, crc)
        size += len(part)
    out.append(z.flush())
    return b"".join(out), crc, size


def zip_bytes(members: list[Member], comment: bytes = b"") -> bytes:
    """A zip archive holding the members exactly as described, honest where not told."""
    local, central = [], []
    offset = 0
    for m in members:
        payload, crc, size = _payload(m)
        crc = crc if m.crc is None else m.crc
        csize = len(payload) if m.compressed_size is None else m.compressed_size
        usize = size if m.file_size is None else m.file_size
        fields = (20, m.flags, m.method, 0, 0x21, crc, csize, usize)
        name = m.name if m.local_name is None else m.local_name
        head = struct.pack("<IHHHHHIIIHH", 0x04034B50, *fields, len(name), 0) + name
        local.append(head + payload)
        at = offset if m.offset is None else m.offset
        central.append(
            struct.pack("<IH", 0x02014B50, 20)
            + struct.pack("<HHHHHIIIHH", *fields, len(m.name), 0)
            + struct.pack("<HHHII", 0, 0, 0, 0, at)
            + m.name
        )
        offset += len(head) + len(payload)
    directory = b"".join(central)
    n = min(len(members), 0xFFFF)
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, len(directory), offset, len(comment))
    return b"".join(local) + directory + end + comment


def _payload(m: Member) -> tuple[bytes, int, int]:
    """The member's bytes as stored, their CRC-32 and uncompressed size."""
    data = m.data if isinstance(m.data, bytes) else b"".join(m.data)
    if m.raw:
        return data, m.crc or 0, m.file_size or 0
    if m.method == 8:
        return deflate([data])
    return data, zlib.crc32(data), len(data)


def many_members(n: int, name: bytes = b"m", count: int | None = None) -> bytes:
    """An archive whose central directory lists ``n`` entries, all of one tiny stored member;
    its end record claims ``count`` of them (default: the truth, as far as 16 bits go)."""
    data = b"x"
    crc = zlib.crc32(data)
    fields = (20, 0, 0, 0, 0x21, crc, 1, 1, len(name), 0)
    head = struct.pack("<IHHHHHIIIHH", 0x04034B50, *fields) + name + data
    entry = (
        struct.pack("<IH", 0x02014B50, 20)
        + struct.pack("<HHHHHIIIHH", *fields)
        + struct.pack("<HHHII", 0, 0, 0, 0, 0)
        + name
    )
    directory = entry * n
    claimed = min(n, 0xFFFF) if count is None else count
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, claimed, claimed, len(directory), len(head), 0)
    return head + directory + end


# ---------------------------------------------------------------------------------------------
# JSON


def nested(depth: int, leaf: str = "1") -> str:
    """A list nested ``depth`` deep around ``leaf``."""
    return "[" * depth + leaf + "]" * depth
