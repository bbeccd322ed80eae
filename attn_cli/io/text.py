"""Bytes to text: UTF-8 only, with a one-line reason for anything else (UTF-16, binary)."""

from __future__ import annotations

from attn_cli.errors import InputError

_BOMS = (
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe\x00\x00", "UTF-32"),  # before UTF-16: it starts with UTF-16's mark
    (b"\xfe\xff", "UTF-16"),
    (b"\xff\xfe", "UTF-16"),
)


def decode_text(data: bytes, source: str) -> str:
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            raise InputError(source, "", f"the file is {encoding} encoded", _UTF8)
    if b"\x00" in data:
        head = data[:64]
        even, odd = head[0::2], head[1::2]
        if len(head) >= 4 and ((not any(even) and all(odd)) or (all(even) and not any(odd))):
            raise InputError(
                source, "", "the file looks UTF-16 encoded (a NUL byte beside every letter)", _UTF8
            )
        at = data.index(b"\x00")
        raise InputError(
            source, "", f"the file is binary (it holds NUL bytes, the first at offset {at})", _UTF8
        )
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark is harmless: drop it
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            source, "", f"byte 0x{data[e.start]:02x} at offset {e.start} is not UTF-8", _UTF8
        ) from None


_UTF8 = "UTF-8 text (save the file as UTF-8)"
