"""One strict JSON reader (io/jsonfmt.parse_json) behind fixtures, JSON traces and dumps: a key
given twice, a huge integer and a syntax error read the same in each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from attn_cli.check.dump import load_dump
from attn_cli.errors import InputError
from attn_cli.io.fixture import parse_fixture
from attn_cli.io.trace_json import loads


def _fixture(text: str, tmp_path: Path) -> object:
    return parse_fixture(text, "in.json", fmt="json")


def _trace(text: str, tmp_path: Path) -> object:
    return loads(text, "in.json")


def _dump(text: str, tmp_path: Path) -> object:
    path = tmp_path / "in.json"
    path.write_text(text)
    return load_dump(path)


READERS = [_fixture, _trace, _dump]


@pytest.mark.parametrize("read", READERS, ids=["fixture", "trace", "dump"])
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"Q": [[1]], "Q": [[2]]}', "in.json: Q: duplicate key, expected each key once"),
        ('{"Q": [[' + "9" * 400 + "]]}", "in.json: an integer with 400 digits, expected at most"),
        ('{"Q": [[1]],}', "in.json: line 1 column 13: invalid JSON (Expecting property name"),
        ("[" * 100_000 + "]" * 100_000, "in.json: nesting is too deep, expected "),
    ],
    ids=["duplicate", "digits", "syntax", "deep"],
)
def test_every_reader_words_a_strict_refusal_alike(
    read: Callable[[str, Path], object], text: str, message: str, tmp_path: Path
) -> None:
    with pytest.raises(InputError) as caught:
        read(text, tmp_path)
    assert message in str(caught.value), str(caught.value)


def test_literals_are_kept_for_validation_in_a_fixture_and_read_as_floats_in_a_trace(
    tmp_path: Path,
) -> None:
    with pytest.raises(InputError, match=r"Q\[0\]\[0\]: got the JSON literal NaN"):
        parse_fixture('{"Q": [[NaN]], "K": [[1]], "V": [[1]]}', "in.json", fmt="json")
    with pytest.raises(InputError, match=r"in\.json: the number 1e400 is beyond float64"):
        loads('{"format": "attn-trace", "version": 1, "stages": {"Q": 1e400}}', "in.json")
