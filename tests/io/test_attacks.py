"""Attacks on every file reader, through the real ``attn`` command (issue 15).

Each hostile file is fed to every surface that reads such a file: a ``{file: x.npy}`` or
``{file: a.npz}`` reference in a fixture, a whole-fixture ``.npz``, ``attn check --against``
dumps (``.npz`` and ``.json``), golden files (``--golden``, ``--golden-dir``) and the fixture
path itself. Each run must end in exit 2 with exactly one ``Error:`` line that names the file
(or, where the file is in fact valid, in the normal result), with no traceback, no file left
behind, in bounded time; the worst run again in a subprocess under an address-space limit.
The independent reference for valid arrays is the same fixture written with plain lists.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attack_files as A
import numpy as np
import pytest
from conftest import Run, run_timed
from typer.testing import CliRunner

runner = CliRunner()
SLOW = 3.0  # seconds any single run may take
TAIL = 64 << 20  # zero bytes behind a hostile header: 64 MiB deflate to 64 KiB
INSTANT = 0.5  # seconds a FIFO or device may take to be refused
CAT_SAT = ("check", "the_cat_sat")
TRACE_FX = ["trace", "fx.yaml", "-f", "json"]


def attn(*args: str, limit: float = 10.0) -> Run:
    """Run ``attn ARGS`` in-process; a run that hangs is cut off by a timer signal."""
    return run_timed(*args, limit=limit)


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def assert_refused(run: Run, *named: str) -> None:
    """Exit 2, one ``Error:`` line naming the file and nothing else on stderr, no traceback."""
    assert run.exception is None, f"escaped: {run.exception!r}"
    assert run.exit_code == 2, (run.exit_code, run.stdout[-500:], run.stderr[-500:])
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), run.stderr[-2000:]
    assert any(name in lines[0] for name in named), (named, lines[0])
    assert "ran out of memory" not in lines[0]  # refused by a check, not by luck
    assert "Traceback" not in run.stdout + run.stderr
    assert "\x1b" not in run.stderr


def assert_result(run: Run, codes: tuple[int, ...]) -> None:
    """The command's normal result: one of ``codes``, no ``Error:`` line, no traceback."""
    assert run.exception is None, f"escaped: {run.exception!r}"
    assert run.exit_code in codes, (run.exit_code, run.stdout[-500:], run.stderr[-500:])
    assert "Error:" not in run.stderr and "Traceback" not in run.stdout + run.stderr


def assert_handled(run: Run, named: str, outcome: str, codes: tuple[int, ...]) -> None:
    """Refused naming the file; or, where the file may be valid, a result or a refusal that
    names the file or the fixture that refers to it (validation of the array it held)."""
    if outcome == A.ERROR:
        assert_refused(run, named)
    elif outcome == A.EITHER and run.exit_code == 2:
        assert_refused(run, named, "fx.yaml")
    else:
        assert_result(run, codes)


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each attack runs in its own empty folder; afterwards nothing new may be in it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "100")
    yield tmp_path


# ---------------------------------------------------------------------------------------------
# Writing the hostile files


def write(path: Path, attack: A.Attack) -> Path:
    """The attack's bytes at ``path``; a zero tail is written sparse (no disk, no time)."""
    with open(path, "wb") as f:
        f.write(attack.data)
        f.truncate(len(attack.data) + attack.tail)
    return path


def npy_of(arr: np.ndarray[Any, Any]) -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=False)
    return buf.getvalue()


@functools.cache
def deflated(attack: A.Attack) -> A.Member:
    """The attack as a deflated member (cached: a 64 MiB zero tail takes 0.2 s)."""
    payload, crc, size = A.deflate(attack.parts())
    return A.Member(b"", payload, 8, crc=crc, file_size=size, raw=True)


def member(name: str, attack: A.Attack) -> A.Member:
    """The attack as the archive member ``name``.npy: stored, or deflated when it is big."""
    if attack.tail:
        return A.Member(f"{name}.npy".encode(), **_fields(deflated(attack)))
    return A.Member(f"{name}.npy".encode(), attack.data)


def _fields(m: A.Member) -> dict[str, Any]:
    return {
        "data": m.data,
        "method": m.method,
        "crc": m.crc,
        "file_size": m.file_size,
        "raw": m.raw,
    }


WEIGHTS = {"W_Q": A.W_Q, "W_K": A.W_K, "W_V": A.W_V}


def fixture_yaml(x: str) -> str:
    rows = "\n".join(f"{k}: {json.dumps(v.tolist())}" for k, v in WEIGHTS.items())
    return f"name: attack\ntokens: [a, b, c]\nX: {x}\n{rows}\n"


@functools.cache
def reference_stages() -> dict[str, Any]:
    """The trace of the same fixture with X written as a plain list: the independent answer."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "lists.yaml"
        path.write_text(fixture_yaml(json.dumps(A.X.tolist())))
        run = attn("trace", str(path), "-f", "json")
    assert run.exit_code == 0, run.stderr
    stages: dict[str, Any] = json.loads(run.stdout)["stages"]
    return stages


# A surface puts a hostile .npy where a reader will meet it and says how to run attn on it.
# It returns the arguments, the file name the error must show, and the exit codes of success.
Surface = Callable[[Path, A.Attack], tuple[list[str], str, tuple[int, ...]]]


def ref_npy(folder: Path, attack: A.Attack) -> tuple[list[str], str, tuple[int, ...]]:
    write(folder / "x.npy", attack)
    (folder / "fx.yaml").write_text(fixture_yaml("{file: x.npy}"))
    return TRACE_FX, "x.npy", (0,)


def ref_npz(folder: Path, attack: A.Attack) -> tuple[list[str], str, tuple[int, ...]]:
    (folder / "a.npz").write_bytes(A.zip_bytes([member("X", attack)]))
    (folder / "fx.yaml").write_text(fixture_yaml("{file: a.npz, key: X}"))
    return TRACE_FX, "a.npz", (0,)


def whole_npz(folder: Path, attack: A.Attack) -> tuple[list[str], str, tuple[int, ...]]:
    weights = [A.Member(f"{k}.npy".encode(), npy_of(v)) for k, v in WEIGHTS.items()]
    (folder / "fx.npz").write_bytes(A.zip_bytes([member("X", attack), *weights]))
    return ["trace", "fx.npz", "-f", "json"], "fx.npz", (0,)


def dump_npz(folder: Path, attack: A.Attack) -> tuple[list[str], str, tuple[int, ...]]:
    (folder / "dump.npz").write_bytes(A.zip_bytes([member("softmax", attack)]))
    return [*CAT_SAT, "--against", "dump.npz"], "dump.npz", (0, 1)  # X's shape: a mismatch


NPY_SURFACES: dict[str, Surface] = {
    "ref_npy": ref_npy,
    "ref_npz": ref_npz,
    "whole_npz": whole_npz,
    "dump_npz": dump_npz,
}
NPY_ATTACKS = {a.name: a for a in A.npy_attacks()}


@pytest.mark.parametrize("surface", list(NPY_SURFACES))
@pytest.mark.parametrize("name", list(NPY_ATTACKS))
def test_npy_attack(in_tmp: Path, surface: str, name: str) -> None:
    attack = NPY_ATTACKS[name]
    args, named, codes = NPY_SURFACES[surface](in_tmp, attack)
    before = files_under(in_tmp)
    run = attn(*args)
    assert_handled(run, named, attack.outcome, codes)
    assert run.seconds < SLOW
    assert files_under(in_tmp) == before
    if attack.outcome == A.VALID and surface != "dump_npz":
        assert json.loads(run.stdout)["stages"] == reference_stages()


# ---------------------------------------------------------------------------------------------
# Hostile archives: the zip around the arrays


def archive_attacks(target: str, others: dict[str, bytes]) -> dict[str, A.Attack]:
    """Archives whose member ``target`` (or the whole zip) is hostile; ``others`` are honest."""
    good = A.npy()
    t = f"{target}.npy".encode()
    honest = [A.Member(f"{k}.npy".encode(), v) for k, v in others.items()]

    def arc(*ms: A.Member, comment: bytes = b"") -> bytes:
        return A.zip_bytes([*ms, *honest], comment)

    def tgt(**changes: Any) -> bytes:
        return arc(A.Member(t, **{"data": good, **changes}))

    valid = arc(A.Member(t, good))
    bomb_header = A.Attack("", A.npy(version=(2, 0), header_length=0xFFFFFFF0)[:12], tail=TAIL)
    cases = [
        A.Attack("valid_stored", valid, A.VALID),
        A.Attack("valid_deflated", tgt(method=8), A.VALID),
        A.Attack("comment", arc(A.Member(t, good), comment=b"PK\x05\x06 hello"), A.EITHER),
        A.Attack("junk_before", b"#!/bin/sh\nexit 0\n" + valid, A.EITHER),
        A.Attack("text", b"softmax: [[1.0]]\n"),
        A.Attack("empty_file", b""),
        A.Attack("local_header_only", valid[:30]),
        A.Attack("truncated_half", valid[: len(valid) // 2]),
        A.Attack("no_end_record", valid[:-22]),
        A.Attack("end_record_only", valid[-22:]),
        A.Attack("empty_archive", A.zip_bytes([])),
        A.Attack("encrypted", tgt(flags=0x1)),
        A.Attack("strong_encryption", tgt(flags=0x41)),
        A.Attack("patched_data", tgt(flags=0x20)),
        A.Attack("method_shrink", tgt(method=1)),
        A.Attack("method_bzip2", tgt(method=12)),
        A.Attack("method_lzma", tgt(method=14)),
        A.Attack("method_aes", tgt(method=99)),
        A.Attack("method_65535", tgt(method=0xFFFF)),
        A.Attack("corrupt_deflate", tgt(method=8, data=b"\xff" * 64, raw=True, file_size=128)),
        A.Attack("bad_crc", tgt(crc=0)),
        A.Attack("declared_size_4gib", tgt(method=8, file_size=0xFFFFFFFF), A.EITHER),
        A.Attack("declared_size_short", tgt(file_size=50)),
        A.Attack("compressed_size_beyond_file", tgt(compressed_size=0x7FFFFFFF), A.EITHER),
        A.Attack("local_header_beyond_file", tgt(offset=0x7FFFFFFF)),
        A.Attack("local_name_differs", tgt(local_name=b"Z" * len(t))),
        A.Attack(
            "zip_bomb_after_data",
            arc(A.Member(t, **_fields(deflated(A.Attack("", good, tail=TAIL))))),
            A.EITHER,
        ),
        A.Attack("zip_bomb_in_header", arc(A.Member(t, **_fields(deflated(bomb_header))))),
        A.Attack("member_not_npy", arc(A.Member(f"{target}.txt".encode(), good))),
        A.Attack("member_without_suffix", arc(A.Member(target.encode(), good)), A.EITHER),
        A.Attack("duplicate_member", arc(A.Member(t, good), A.Member(t, good))),
        A.Attack("duplicate_differing", arc(A.Member(t, good), A.Member(t, A.npy("'<f4'")))),
        A.Attack("path_traversal", arc(A.Member(b"../../" + t, good))),
        A.Attack("absolute_name", arc(A.Member(b"/tmp/" + t, good))),
        A.Attack("control_characters", arc(A.Member(b"\x1b[2J\n" + t, good))),
        A.Attack("directory_member", arc(A.Member(t + b"/", b""))),
        A.Attack("nested_zip", arc(A.Member(t, valid))),
        A.Attack("bad_utf8_name", arc(A.Member(b"\xff\xfe.npy", good, flags=0x800))),
        A.Attack("many_members", A.many_members(60_000)),
        A.Attack("huge_directory", A.many_members(300_000)),
        A.Attack("directory_count_lies", A.many_members(300_000, count=1)),
    ]
    return {a.name: a for a in cases}


ARCHIVE_SURFACES: dict[str, tuple[dict[str, A.Attack], list[str], str]] = {
    "ref_npz": (archive_attacks("X", {}), TRACE_FX, "a.npz"),
    "whole_npz": (
        archive_attacks("X", {k: npy_of(v) for k, v in WEIGHTS.items()}),
        ["trace", "fx.npz", "-f", "json"],
        "fx.npz",
    ),
    "dump_npz": (archive_attacks("softmax", {}), [*CAT_SAT, "--against", "dump.npz"], "dump.npz"),
}


@pytest.mark.parametrize("surface", list(ARCHIVE_SURFACES))
@pytest.mark.parametrize("name", list(ARCHIVE_SURFACES["ref_npz"][0]))
def test_archive_attack(in_tmp: Path, surface: str, name: str) -> None:
    attacks, args, named = ARCHIVE_SURFACES[surface]
    attack = attacks[name]
    (in_tmp / named).write_bytes(attack.data)
    if surface == "ref_npz":
        (in_tmp / "fx.yaml").write_text(fixture_yaml("{file: a.npz, key: X}"))
    before = files_under(in_tmp)
    run = attn(*args)
    assert_handled(run, named, attack.outcome, (0, 1))
    assert run.seconds < SLOW
    assert files_under(in_tmp) == before
    if attack.outcome == A.VALID and surface != "dump_npz":
        assert json.loads(run.stdout)["stages"] == reference_stages()


# ---------------------------------------------------------------------------------------------
# Hostile JSON: golden files and dumps

NUMBER = "@@NUMBER@@"


@functools.cache
def golden_text() -> str:
    run = attn("trace", "the_cat_sat", "-f", "json")
    assert run.exit_code == 0
    return run.stdout


def json_documents(surface: str) -> tuple[str, str, str]:
    """A valid document of the surface, the same with one number left as a slot, and with
    the whole softmax data left as a slot."""
    if surface == "golden":
        valid = golden_text()
        doc = json.loads(valid)
        stage = doc["stages"]["softmax"]
        whole = json.loads(valid)
        whole["stages"]["softmax"]["data"] = NUMBER
    else:
        softmax = json.loads(golden_text())["stages"]["softmax"]["data"]
        valid = json.dumps({"softmax": softmax})
        stage = {"data": json.loads(json.dumps(softmax))}
        doc = {"softmax": stage["data"]}
        whole = {"softmax": NUMBER}
    row = stage["data"]
    while isinstance(row[0], list):
        row = row[0]
    row[0] = NUMBER
    return valid, json.dumps(doc), json.dumps(whole)


def json_attacks(surface: str) -> dict[str, A.Attack]:
    valid, slotted, whole = json_documents(surface)

    def num(literal: str) -> bytes:
        return slotted.replace(f'"{NUMBER}"', literal).encode()

    def data(literal: str) -> bytes:
        return whole.replace(f'"{NUMBER}"', literal).encode()

    def key(name: str) -> bytes:
        return ('{"' + name + '": 1, ' + valid.lstrip()[1:]).encode()

    top = '"stages"' if surface == "golden" else '"softmax"'
    first = valid.index(top)
    dup = valid[:first] + valid[first:].replace(top, top + ": 1, " + top, 1)
    cases = [
        A.Attack("valid", valid.encode(), A.VALID),
        A.Attack("int_5000_digits", num("1" * 5000)),
        A.Attack("int_4301_digits", num("9" * 4301)),
        A.Attack("int_400_digits", num("7" * 400)),
        A.Attack("int_20_digits", num("1" * 20), A.VALID),
        A.Attack("float_1e400", num("1e400")),
        A.Attack("float_minus_1e400", num("-1e400")),
        A.Attack("float_rounds_to_inf", num("1.7976931348623159e308")),
        A.Attack("float_1e-400", num("1e-400"), A.VALID),
        A.Attack("float_100000_digits", num("0." + "3" * 100_000), A.VALID),
        A.Attack("minus_zero", num("-0"), A.VALID),
        A.Attack("NaN_literal", num("NaN"), A.VALID),
        A.Attack("Infinity_literal", num("Infinity"), A.VALID),
        A.Attack("minus_Infinity_literal", num("-Infinity"), A.VALID),
        A.Attack("nan_string", num('"nan"'), A.VALID),
        A.Attack("NaN_string", num('"NaN"')),
        A.Attack("true", num("true")),
        A.Attack("null", num("null")),
        A.Attack("number_as_string", num('"0.5"')),
        A.Attack("object_as_number", num("{}")),
        A.Attack("ragged_row", num("[]")),
        A.Attack("nested_70_in_a_cell", num(A.nested(70))),
        A.Attack("nested_100000_in_a_cell", num(A.nested(100_000))),
        A.Attack("nested_100000_document", A.nested(100_000).encode()),
        A.Attack("objects_nested_100000", ('{"a":' * 100_000 + "1" + "}" * 100_000).encode()),
        A.Attack("data_one_axis", data("[0.5, 0.5]"), A.EITHER),
        A.Attack("data_empty", data("[]"), A.EITHER),
        A.Attack("data_empty_rows", data("[[], [], []]"), A.EITHER),
        A.Attack("data_five_axes", data(A.nested(4, "[0.5, 0.5]")), A.EITHER),
        A.Attack("data_a_number", data("0.5")),
        A.Attack("duplicate_key", dup.encode()),
        A.Attack("empty_file", b""),
        A.Attack("whitespace_only", b" \n\t\n"),
        A.Attack("truncated", valid.encode()[: len(valid) // 2]),
        A.Attack("trailing_garbage", valid.encode() + b"}{"),
        A.Attack("comment", b"// a dump\n" + valid.encode()),
        A.Attack("single_quotes", valid.replace('"', "'").encode()),
        A.Attack("top_level_list", b"[[1.0]]"),
        A.Attack("top_level_number", b"1"),
        A.Attack("top_level_string", b'"softmax"'),
        A.Attack("not_utf8", key("caf\xe9").replace("é".encode(), b"\xe9")),
        A.Attack("utf8_bom", b"\xef\xbb\xbf" + valid.encode(), A.VALID),
        A.Attack("utf8_bom_twice", b"\xef\xbb\xbf" * 2 + valid.encode()),
        A.Attack("utf16_le_bom", valid.encode("utf-16")),
        A.Attack("utf16_be_no_bom", valid.encode("utf-16-be")),
        A.Attack("utf32_bom", valid.encode("utf-32")),
        A.Attack("nul_byte", valid.encode().replace(b"{", b"{\x00", 1)),
        A.Attack("binary", bytes(range(256)) * 4),
        A.Attack("lone_surrogate_key", key("\\ud800"), A.EITHER),
        A.Attack("escape_sequence_key", key("\\u001b[2J\\u001b]0;pwned\\u0007"), A.EITHER),
        A.Attack("bidi_override_key", key("\\u202eevil"), A.EITHER),
        A.Attack("megabyte_key", key("k" * 1_000_000), A.EITHER),
        A.Attack(
            "many_keys",
            ("{" + "".join(f'"k{i}": 0, ' for i in range(30_000)) + valid.lstrip()[1:]).encode(),
            A.EITHER,
        ),
    ]
    return {a.name: a for a in cases}


JSON_SURFACES = {
    "golden": (lambda: json_attacks("golden"), ["--golden", "g.json"], "g.json"),
    "dump_json": (lambda: json_attacks("dump"), ["--against", "dump.json"], "dump.json"),
}
JSON_ATTACKS = {s: functools.cache(make) for s, (make, _, _) in JSON_SURFACES.items()}


@pytest.mark.parametrize("surface", list(JSON_SURFACES))
@pytest.mark.parametrize("name", list(json_attacks("dump")))
def test_json_attack(in_tmp: Path, surface: str, name: str) -> None:
    attack = JSON_ATTACKS[surface]()[name]
    _, option, named = JSON_SURFACES[surface]
    (in_tmp / named).write_bytes(attack.data)
    before = files_under(in_tmp)
    run = attn(*CAT_SAT, *option)
    assert_handled(run, named, attack.outcome, (0, 1))
    if name == "valid":
        assert run.exit_code == 0, run.stdout
    assert run.seconds < SLOW
    assert files_under(in_tmp) == before
    assert "\x1b" not in run.stdout and "\u202e" not in run.stdout


# ---------------------------------------------------------------------------------------------
# What is not a regular file, or not there, or too large: on every surface

TOO_LARGE = 600 * 1024 * 1024  # beyond the 512 MiB file budget; written sparse


def make_special(kind: str, path: Path) -> None:
    """Put something at ``path`` that a reader must refuse unread."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "fifo_behind_symlink":
        os.mkfifo(path.with_name("pipe"))
        path.symlink_to("pipe")
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))
    elif kind == "symlink_loop":
        path.symlink_to(path.name)
    elif kind == "dangling_symlink":
        path.symlink_to("nowhere")
    elif kind == "too_large":
        with open(path, "wb") as f:
            f.truncate(TOO_LARGE)
    elif kind == "unreadable":
        path.write_bytes(b"{}")
        path.chmod(0)
    else:
        assert kind == "missing"


SPECIALS = [
    "fifo",
    "fifo_behind_symlink",
    "dev_zero",
    "directory",
    "socket",
    "symlink_loop",
    "dangling_symlink",
    "too_large",
    "unreadable",
    "missing",
]


def special_surface(surface: str, folder: Path) -> tuple[Path, list[str]]:
    """Where the special file goes for this surface, and the command that reads it."""
    trace = TRACE_FX
    if surface == "fixture":
        return folder / "fx.yaml", trace
    if surface in ("ref_npy", "ref_npz"):
        name = "x.npy" if surface == "ref_npy" else "a.npz"
        (folder / "fx.yaml").write_text(fixture_yaml(f"{{file: {name}}}"))
        return folder / name, trace
    if surface == "whole_npz":
        return folder / "fx.npz", ["trace", "fx.npz", "-f", "json"]
    if surface == "golden":
        return folder / "g.json", [*CAT_SAT, "--golden", "g.json"]
    if surface == "golden_dir":
        (folder / "goldens").mkdir()
        return folder / "goldens" / "the_cat_sat.json", [*CAT_SAT, "--golden-dir", "goldens"]
    name = "dump.json" if surface == "dump_json" else "dump.npz"
    return folder / name, [*CAT_SAT, "--against", name]


@pytest.mark.parametrize(
    "surface",
    ["fixture", "ref_npy", "ref_npz", "whole_npz", "golden", "golden_dir", "dump_json", "dump_npz"],
)
@pytest.mark.parametrize("kind", SPECIALS)
def test_special_file(in_tmp: Path, surface: str, kind: str) -> None:
    if kind == "unreadable" and os.geteuid() == 0:
        pytest.skip("root reads a file without read permission")
    path, args = special_surface(surface, in_tmp)
    make_special(kind, path)
    before = files_under(in_tmp)
    run = attn(*args, limit=5.0)
    assert_refused(run, path.name)
    assert run.seconds < (INSTANT if "fifo" in kind or kind == "dev_zero" else SLOW)
    assert files_under(in_tmp) == before


# ---------------------------------------------------------------------------------------------
# Bounded memory: the worst attacks again, in a process that may not grow past a limit

HEADROOM = 300 * 1024 * 1024  # bytes beyond what a plain `attn check` needs
RUN_LIMITED = """
import resource, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
sys.argv = ["attn", *sys.argv[2:]]
from attn_cli.cli.app import main
main()
"""
PEAK = """
import sys
sys.argv = ["attn", *sys.argv[1:]]
try:
    from attn_cli.cli.app import main
    main()
finally:
    status = open("/proc/self/status").read()
    peak = next(line for line in status.splitlines() if line.startswith("VmPeak"))
    print(int(peak.split()[1]) * 1024, file=sys.stderr)
"""
ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "100"}


@functools.cache
def baseline_peak() -> int:
    """The address space a plain ``attn check --against`` of a valid dump reaches."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        dump = Path(folder) / "valid_dump.npz"
        softmax = npy_of(np.full((3, 3), 1 / 3))
        dump.write_bytes(A.zip_bytes([A.Member(b"softmax.npy", softmax)]))
        done = subprocess.run(
            [sys.executable, "-c", PEAK, *CAT_SAT, "--against", str(dump)],
            capture_output=True,
            text=True,
            env=ENV,
            check=False,
        )
    return int(done.stderr.splitlines()[-1])


def many_short_strings() -> A.Attack:
    """The issue's case: 8M two-character strings, 64 MiB as numpy, ~0.5 GB as Python."""
    return A.Attack("", A.npy("'<U2'", f"({TAIL // 8},)", data=b""), tail=TAIL)


MEMORY_CASES = {
    "tokens_many_short_strings": ("whole_tokens", many_short_strings()),
    "X_many_short_strings": ("ref_npz", many_short_strings()),
    "X_one_64mib_string": (
        "whole_npz",
        A.Attack("", A.npy(f"'<U{TAIL // 4}'", "(1,)", data=b""), tail=TAIL),
    ),
    "dump_many_short_strings": ("dump_npz", many_short_strings()),
    "dump_header_bomb": (
        "dump_npz",
        A.Attack("", A.npy(version=(2, 0), header_length=0xFFFFFFF0)[:12], tail=TAIL),
    ),
    "dump_huge_directory": ("dump_zip", A.Attack("", A.many_members(1_000_000))),
}


@pytest.mark.subprocess
@pytest.mark.parametrize("case", list(MEMORY_CASES))
def test_memory_is_bounded(tmp_path: Path, case: str) -> None:
    surface, attack = MEMORY_CASES[case]
    if surface == "whole_tokens":
        weights = [A.Member(f"{k}.npy".encode(), npy_of(v)) for k, v in WEIGHTS.items()]
        members = [member("X", A.Attack("", npy_of(A.X))), member("tokens", attack), *weights]
        (tmp_path / "fx.npz").write_bytes(A.zip_bytes(members))
        args, named = ["trace", "fx.npz", "-f", "json"], "fx.npz"
    elif surface == "dump_zip":
        (tmp_path / "dump.npz").write_bytes(attack.data)
        args, named = [*CAT_SAT, "--against", "dump.npz"], "dump.npz"
    else:
        args, named, _ = NPY_SURFACES[surface](tmp_path, attack)
    limit = baseline_peak() + HEADROOM
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", RUN_LIMITED, str(limit), *args],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=tmp_path,
        timeout=30,
        check=False,
    )
    run = Run(done.returncode, done.stdout, done.stderr, None, time.perf_counter() - start)
    assert_refused(run, named)
    assert run.seconds < 2 * SLOW
