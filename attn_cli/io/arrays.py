"""NumPy files in and out: ``{file: x.npy}`` references, whole-fixture ``.npz``, ``.npz`` traces.

A fixture key that holds an array may instead hold a reference to a NumPy file beside the
fixture: ``{file: x.npy}`` or ``{file: arrays.npz, key: W_Q}`` (``key`` defaults to the fixture
key). Paths are relative to the fixture's folder and may not leave it, not even through a
symbolic link. Nothing is ever unpickled: an array of Python objects is refused before it is
read, and so is one holding more numbers than the fixture may.

Arrays loaded here are handed to the loader's validation like any list from JSON or YAML.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from attn_cli.core.chain import REGISTRY  # with the variants attn ships registered
from attn_cli.core.stages import STAGE_NAMES
from attn_cli.errors import InputError
from attn_cli.io import gate
from attn_cli.io.validate import INPUT_KEYS

if TYPE_CHECKING:
    import zipfile

    from attn_cli.core.pipeline import Deferred, Stage, Streamed, Trace

# Fixture keys whose value is an array, and so may be a file reference; a variant's are its own
# (``Variant.array_parts``, read at call time: a variant registered from outside counts too).
_ARRAY_KEYS = (
    *INPUT_KEYS,
    "W_O",
    "b_O",
    "mask",
    "bias",
    "lengths",
    "X_kv",
    "positions",
    "key_positions",
)


def array_keys() -> tuple[str, ...]:
    """The fixture keys whose whole value is an array (a variant's too), ``grad`` last."""
    plugged = (v.name for v in REGISTRY.values() if "" in v.array_parts)
    return (*_ARRAY_KEYS, *(k for k in plugged if k not in _ARRAY_KEYS), "grad")


def nested_array_keys() -> dict[str, tuple[str, ...]]:
    """Per variant whose setting is a mapping, the subkeys that hold arrays."""
    return {
        v.name: v.array_parts
        for v in REGISTRY.values()
        if v.array_parts and "" not in v.array_parts
    }


def nested_keys() -> tuple[str, ...]:
    """The mappings a whole-fixture .npz spells as ``KEY.SUBKEY`` members (``expected.softmax``)."""
    return ("expected", *(v.name for v in REGISTRY.values() if v.subkeys))


REFERENCE_KEYS = ("file", "key")
REFERENCE_DOC = "{file: NAME.npy} or {file: NAME.npz, key: ARRAY}, relative to the fixture"


def has_references(obj: Any) -> bool:
    """Whether a parsed fixture mapping holds any ``{file: ...}`` reference."""
    if not isinstance(obj, Mapping):
        return False
    values = [obj.get(k) for k in array_keys()]
    expected = obj.get("expected")
    if isinstance(expected, Mapping):
        values += list(expected.values())
    for key, subkeys in nested_array_keys().items():
        nested = obj.get(key)
        if isinstance(nested, Mapping):
            values += [nested.get(k) for k in subkeys]
    return any(_is_reference(v) for v in values)


def resolve_references(
    obj: Mapping[str, Any],
    source: str,
    base: Path,
    *,
    max_elements: int,
    max_bytes: int,
) -> dict[str, Any]:
    """The fixture mapping with every ``{file: ...}`` reference replaced by its array."""
    reader = _Reader(source, base, max_elements, max_bytes)
    out = dict(obj)
    for key in array_keys():
        if _is_reference(out.get(key)):
            out[key] = reader.load(out[key], key, default_key=key)
    expected = out.get("expected")
    if isinstance(expected, Mapping) and any(_is_reference(v) for v in expected.values()):
        out["expected"] = {
            stage: reader.load(v, f"expected.{stage}", default_key=str(stage))
            if _is_reference(v)
            else v
            for stage, v in expected.items()
        }
    for key, subkeys in nested_array_keys().items():
        nested = out.get(key)
        if isinstance(nested, Mapping) and any(_is_reference(nested.get(k)) for k in subkeys):
            out[key] = {
                sub: reader.load(v, f"{key}.{sub}", default_key=f"{key}.{sub}")
                if sub in subkeys and _is_reference(v)
                else v
                for sub, v in nested.items()
            }
    return out


def load_npz_fixture(
    path: Path, source: str, *, max_elements: int, max_bytes: int
) -> dict[str, Any]:
    """A whole fixture stored as ``.npz``: one array per key, a mapping's entries as
    ``KEY.SUBKEY`` members (``expected.softmax``, and the entries of a variant's mapping).

    Scalars (``heads``, ``scale``, ``causal``, ``name``, a variant's ``true``) are 0-d arrays;
    ``tokens`` an array of strings. Arrays of numbers stay arrays; the rest becomes plain
    Python values.
    """
    reader = _Reader(source, path.parent, max_elements, max_bytes)
    out: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    with reader.archive(path, source, "") as archive:
        for member in archive.namelist():
            if not member.endswith(".npy"):
                raise InputError(
                    source, member, "is not a .npy array", "an .npz made by numpy.savez"
                )
            name = member[: -len(".npy")]
            arr = reader.read_member(archive, member, name, source, gate.NUMBERS_OR_TEXT)
            value = plain_value(arr)
            key, dot, sub = name.partition(".")
            if dot and key in nested_keys():
                nested.setdefault(key, {})[sub] = value
            else:
                out[name] = value
    for key, entries in nested.items():
        if key in out:
            raise InputError(
                source,
                key,
                f"given both as {key} and as {key}.NAME members",
                f"either {key} or {key}.NAME members, not both",
            )
        out[key] = entries
    return out


def plain_value(arr: np.ndarray[Any, Any]) -> Any:
    """Numbers stay an array (validated by shape); strings, booleans, scalars become Python."""
    if arr.ndim == 0 or arr.dtype.kind not in "iuf":
        return arr.tolist()
    return arr


def _is_reference(value: Any) -> bool:
    return isinstance(value, Mapping) and "file" in value


class _Reader:
    """Loads referenced arrays, each archive opened once, every path confined to ``base``."""

    def __init__(self, source: str, base: Path, max_elements: int, max_bytes: int) -> None:
        self.source = source
        self.base = base.resolve()
        self.max_elements = max_elements
        self.max_bytes = max_bytes
        self.arrays = gate.ArrayReader(max_elements, max_bytes)

    def load(self, ref: Mapping[str, Any], field: str, default_key: str) -> np.ndarray[Any, Any]:
        for k in ref:
            if k not in REFERENCE_KEYS:
                import difflib

                close = difflib.get_close_matches(str(k), REFERENCE_KEYS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise InputError(
                    self.source,
                    f"{field}.{k}",
                    f"unknown key in a file reference{hint}",
                    REFERENCE_DOC,
                )
        name = ref["file"]
        if not isinstance(name, str) or not name.strip():
            raise InputError(self.source, f"{field}.file", f"got {name!r}", "a file name")
        path = self.confined(name, f"{field}.file")
        suffix = path.suffix.lower()
        where = f"{self.source}: {field}.file {name!r}"
        if suffix == ".npy":
            if "key" in ref:
                raise InputError(
                    self.source, f"{field}.key", "given for a .npy file", "key only for a .npz"
                )
            with self.open(path, f"{field}.file") as f:
                return self.read_array(f, "", where)  # where names the field already
        if suffix == ".npz":
            key = ref.get("key", default_key)
            if not isinstance(key, str):
                raise InputError(self.source, f"{field}.key", f"got {key!r}", "an array name")
            with self.archive(path, where, f"{field}.file") as archive:
                member = f"{key}.npy"
                if member not in archive.namelist():
                    import difflib

                    names = [m.removesuffix(".npy") for m in archive.namelist()]
                    close = difflib.get_close_matches(key, names, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise InputError(
                        self.source,
                        f"{field}.key",
                        f"{name} has no array {key!r}{hint}",
                        "one of " + (", ".join(names) or "(the archive is empty)"),
                    )
                return self.read_member(archive, member, "", where)
        raise InputError(
            self.source, f"{field}.file", f"{name!r} is neither .npy nor .npz", REFERENCE_DOC
        )

    def confined(self, name: str, field: str) -> Path:
        """The referenced path, refused if it leaves the fixture's folder (links resolved)."""
        if "\x00" in name:
            raise InputError(self.source, field, "the path holds a NUL character", "a file name")
        given = Path(name)
        if given.is_absolute() or given.drive:
            raise InputError(
                self.source,
                field,
                f"{name!r} is an absolute path",
                "a path relative to the fixture's folder",
            )
        try:
            path = (self.base / given).resolve()
        except (OSError, RuntimeError):  # a loop of symbolic links (RuntimeError before 3.13)
            what = f"{name!r} is a loop of symbolic links"
            raise InputError(self.source, field, what, "a file name") from None
        if not path.is_relative_to(self.base):
            raise InputError(
                self.source,
                field,
                f"{name!r} leads outside the fixture's folder",
                f"a file inside {self.base}",
            )
        return path

    @contextmanager
    def open(self, path: Path, field: str) -> Iterator[IO[bytes]]:
        """A regular file, through the input gate; FIFOs and devices are refused unread."""
        where = f"{self.source}: {field} {path.name!r}"
        with gate.open_regular(path, where, "a .npy or .npz file", max_bytes=self.max_bytes) as f:
            yield f

    @contextmanager
    def archive(self, path: Path, where: str, field: str) -> Iterator[zipfile.ZipFile]:
        with self.open(path, field) as f, self.arrays.archive(f, where) as archive:
            yield archive

    def read_member(
        self,
        archive: zipfile.ZipFile,
        member: str,
        field: str,
        where: str,
        kinds: str = gate.NUMBERS,
    ) -> np.ndarray[Any, Any]:
        return self.arrays.read_member(archive, member, field, where, kinds)

    def read_array(self, f: IO[bytes], field: str, where: str) -> np.ndarray[Any, Any]:
        return self.arrays.read_array(f, field, where)


# ---------------------------------------------------------------------------------------------
# Writing a trace as .npz


def npz_writer(
    trace: Trace | Streamed, stages: tuple[str, ...] | None = None
) -> Callable[[IO[bytes]], None]:
    """A function that writes the trace's stages (all, or ``stages``) to a binary stream.

    One array per stage, named after it, in the layout of the JSON trace and in the trace's
    dtype; uncompressed (the numbers of a trace hardly compress), so writing runs at disk speed.
    Each stage is one ``.npy`` member written into the zip stream as it comes: a deferred stage
    of a :class:`Streamed` trace a block of rows at a time, so the file is never held whole.
    ``numpy.load(FILE)`` reads it back and ``attn check --against FILE`` compares it.
    """
    from attn_cli.core.pipeline import Streamed

    held = trace.trace if isinstance(trace, Streamed) else trace
    selected = [s for s in trace if stages is None or s.name in stages]
    assert {s.name for s in selected} <= set(STAGE_NAMES)
    dtype = np.dtype(held.dtype)

    def write(f: IO[bytes]) -> None:
        import zipfile

        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for stage in selected:  # as numpy.savez writes each member
                with archive.open(f"{stage.name}.npy", "w", force_zip64=True) as member:
                    _write_npy(member, stage, dtype)

    return write


def _write_npy(f: IO[bytes], stage: Stage | Deferred, dtype: np.dtype[Any]) -> None:
    """One ``.npy`` file: a held stage's array whole, a deferred one's blocks as they come."""
    from attn_cli.core.pipeline import Stage

    if isinstance(stage, Stage):
        np.lib.format.write_array(f, stage.data, allow_pickle=False)
        return
    header = {
        "descr": np.lib.format.dtype_to_descr(dtype),
        "fortran_order": False,
        "shape": stage.shape,
    }
    np.lib.format.write_array_header_1_0(f, header)
    for block in stage.row_blocks():  # (R, S), C order
        f.write(np.ascontiguousarray(block, dtype=dtype).data)
