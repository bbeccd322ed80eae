"""A checkpoint's files: the folder, its config.json and shard index, and each safetensors file's
tensors, read lazily with NumPy (``Reader``).

Each safetensors header is first read and checked here (8-byte little-endian length, a JSON
header of bounded size, every tensor's offsets inside the file and sized for its dtype and
shape). F32, F64 and F16 tensors are then read with the ``safetensors`` package's NumPy API
(``safe_open(..., framework="numpy")``), F16 widened to float32. BF16, which that API cannot
read, is read from the file at the header's offsets: a bfloat16 is the upper half of a float32,
so widening is exact (``uint16 << 16`` viewed as float32). No ``ml_dtypes`` is needed. A Rust
panic in the safetensors package is one InputError.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from attn_cli.errors import AttnError, InputError
from attn_cli.io import gate
from attn_cli.io.examples import model_paths
from attn_cli.io.families import LayerPlan, Tensor
from attn_cli.io.jsonfmt import JSONSyntaxError, load_plain_json

FloatArray = np.ndarray[Any, np.dtype[np.floating[Any]]]

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors package's own limit


MAX_JSON_BYTES = 64 * 1024 * 1024  # config.json, model.safetensors.index.json, tokenizer.json


MAX_CHECKPOINT_BYTES = 1 << 40  # one safetensors file (only the layer's tensors are read)


_SAFETENSORS = "a .safetensors file"


INSTALL_HINT = "pip install 'attn-cli[models]'"


# A Rust panic inside a PyO3 extension (tokenizers, safetensors): a BaseException, so that
# ``except Exception`` misses it; each extension has its own class of this module and name.
_PANIC = ("pyo3_runtime", "PanicException")


# Bytes per element of every safetensors dtype (for the header's size check); the float ones
# this module can read are the keys of _READABLE.
ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
}


_READABLE = ("F64", "F32", "F16", "BF16")


def locate(checkpoint: Path, config: Path | None) -> tuple[Path, dict[str, Path] | Path, Path]:
    """The folder, the weight files (an index's name -> shard map, or one file) and config.json."""
    kind = gate.kind_of(checkpoint)
    if kind == "dir":
        folder = checkpoint
        files = _weights_in(folder)
    elif kind == "file":
        folder = checkpoint.parent
        is_index = checkpoint.name.endswith(".index.json")
        files = _shards(checkpoint, folder) if is_index else checkpoint
    else:
        there = gate.not_a_file(checkpoint) or "no such file"
        raise InputError(
            str(checkpoint),
            "",
            "no such file or folder" if there == "no such file" else there,
            "a model folder or .safetensors file, or a bundled one: " + ", ".join(model_paths()),
        )
    config_path = config if config is not None else folder / "config.json"
    problem = gate.not_a_file(config_path)
    if problem is not None:
        expected = "the model's config.json (give it with --config)"
        raise InputError(str(config_path), "", problem, expected)
    return folder, files, config_path


def _weights_in(folder: Path) -> dict[str, Path] | Path:
    """The shard index of a model folder, else its one model.safetensors; the first of them
    that is there but is no regular file (a folder, a FIFO, a symlink loop) is named."""
    index, single = folder / "model.safetensors.index.json", folder / "model.safetensors"
    if gate.kind_of(index) == "file":
        return _shards(index, folder)
    if gate.kind_of(single) == "file":
        return single
    for path, expected in ((index, "the shard index, a JSON file"), (single, _SAFETENSORS)):
        what = gate.not_a_file(path)
        if what is not None and what != "no such file":
            raise InputError(str(path), "", what, expected)
    raise InputError(
        str(folder),
        "",
        "holds neither model.safetensors nor model.safetensors.index.json",
        "a Hugging Face model folder",
    )


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A small JSON object from a regular file, or an InputError naming the file."""
    source = str(path)
    raw = gate.read_bytes(path, source, what, max_bytes=MAX_JSON_BYTES)
    data = load_plain_json(raw, source, what)
    if not isinstance(data, dict):
        raise InputError(source, "", f"holds {type(data).__name__}", f"a JSON object ({what})")
    return data


def _shards(index: Path, folder: Path) -> dict[str, Path]:
    """The index's tensor name -> shard file, every shard a plain file name inside ``folder``."""
    data = read_json(index, "model.safetensors.index.json")
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict):
        raise InputError(str(index), "weight_map", "missing", "a mapping of tensor name to shard")
    out: dict[str, Path] = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            raise InputError(
                str(index),
                f"weight_map.{name}",
                f"got {shard!r}",
                "a shard file name in the folder",
            )
        out[name] = folder / shard
    return out


@dataclass(frozen=True)
class Entry:
    dtype: str
    shape: tuple[int, ...]
    begin: int  # offset from the file's start
    end: int


def read_header(path: Path) -> dict[str, Entry]:
    """The tensors a safetensors file holds, its header checked against the file's size."""
    source = str(path)
    try:
        with gate.open_regular(path, source, _SAFETENSORS, max_bytes=MAX_CHECKPOINT_BYTES) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 0 or n > MAX_HEADER_BYTES or 8 + n > size:
                raise InputError(
                    source,
                    "header",
                    f"is truncated or corrupt (file of {size:,} bytes, "
                    f"header length {n if n >= 0 else 'missing'})",
                    "an 8-byte little-endian length and a JSON header inside the file",
                )
            raw = f.read(n)
    except OSError as e:
        raise InputError(
            source, "", f"cannot read ({e.strerror or e})", "a safetensors file"
        ) from None
    try:
        header = load_plain_json(raw, source, "a safetensors header", "header")
    except JSONSyntaxError:
        header = None
    if not isinstance(header, dict):
        raise InputError(source, "header", "is not a JSON object", "a safetensors header")
    return {
        name: _entry(source, name, value, 8 + n, size)
        for name, value in header.items()
        if name != "__metadata__"
    }


def _entry(source: str, name: str, value: Any, start: int, size: int) -> Entry:
    """One header entry, checked: its bytes lie inside the file and fit its dtype and shape."""

    def bad(what: str) -> InputError:
        return InputError(source, name, what, "a header entry {dtype, shape, data_offsets}")

    if not isinstance(value, dict):
        raise bad(f"header entry is {type(value).__name__}")
    dtype, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
    if not isinstance(dtype, str):
        raise bad(f"dtype is {dtype!r}")
    if not isinstance(shape, list) or any(type(s) is not int or s < 0 for s in shape):
        raise bad(f"shape is {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or any(type(o) is not int for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise bad(f"data_offsets is {offsets!r}")
    if start + offsets[1] > size:
        raise InputError(
            source,
            name,
            f"data ends at byte {start + offsets[1]:,} of a {size:,}-byte file",
            "a complete file (it is truncated)",
        )
    itemsize = ITEMSIZE.get(dtype)
    if itemsize is not None and offsets[1] - offsets[0] != math.prod(shape) * itemsize:
        raise bad(f"holds {offsets[1] - offsets[0]} bytes for shape {shape} of {dtype}")
    return Entry(dtype, tuple(shape), start + offsets[0], start + offsets[1])


class Reader:
    """The tensors of one checkpoint, read lazily: a shard's header only when a tensor needs it."""

    def __init__(self, files: dict[str, Path] | Path) -> None:
        self.safetensors = require("safetensors")
        if isinstance(files, Path):
            self.source = str(files)
            self.headers = {files: read_header(files)}
            self.where = dict.fromkeys(self.headers[files], files)
        else:
            self.source = str(next(iter(files.values()), Path(".")).parent)
            self.headers = {}
            self.where = files
        self.names = sorted(self.where)
        self.widened: set[str] = set()
        self.stack = ExitStack()
        self.handles: dict[Path, Any] = {}

    def __enter__(self) -> Reader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stack.close()

    def entry(self, prefix: str, t: Tensor, plan: LayerPlan) -> tuple[str, Path, Entry]:
        """The full name, file and header entry of ``t``, its presence, dtype and shape checked."""
        name = prefix + t.name
        path = self.where.get(name)
        if path is None:
            raise InputError(
                self.source,
                name,
                "missing tensor",
                f"the {plan.family} layout's {t.role} tensor of layer {plan.layer}",
            )
        if path not in self.headers:
            what = gate.not_a_file(path)
            if what is not None:
                raise InputError(str(path), name, what, "the safetensors shard holding it")
            self.headers[path] = read_header(path)
        entry = self.headers[path].get(name)
        if entry is None:
            raise InputError(str(path), name, "missing tensor (the index places it here)", "it")
        if entry.dtype not in _READABLE:
            raise InputError(
                str(path),
                name,
                f"has dtype {entry.dtype}, which is not supported",
                "F32, F16, BF16 or F64",
            )
        if entry.shape != t.shape:
            raise InputError(
                str(path),
                name,
                f"has shape {list(entry.shape)}",
                f"{list(t.shape)} from the config ({_sizes(plan)})",
            )
        return name, path, entry

    def read(self, prefix: str, t: Tensor, plan: LayerPlan) -> FloatArray:
        """Tensor ``t`` whole, as float32 (float64 if stored so), every value finite."""
        name, path, entry = self.entry(prefix, t, plan)
        if entry.dtype == "BF16":
            arr = self.bf16(path, entry, 0, entry.shape[0] if entry.shape else 1, name)
        else:
            stored = self.guarded(path, lambda: self.handle(path).get_tensor(name))
            arr = self.widen(entry.dtype, stored)
        if not np.isfinite(arr).all():
            raise InputError(str(path), name, "holds inf or NaN", "finite weights")
        return arr

    def rows(self, prefix: str, t: Tensor, plan: LayerPlan, ids: Sequence[int]) -> FloatArray:
        """Rows ``ids`` of the 2-axis tensor ``t`` (an embedding table), reading no other rows."""
        name, path, entry = self.entry(prefix, t, plan)
        out = np.empty((len(ids), entry.shape[1]), np.float64)
        sl = None
        if entry.dtype != "BF16":
            sl = self.guarded(path, lambda: self.handle(path).get_slice(name))
        for i, r in enumerate(ids):
            row = self.bf16(path, entry, r, 1, name) if sl is None else sl[r : r + 1]
            out[i] = self.widen(entry.dtype, row)[0]
            if not np.isfinite(out[i]).all():
                raise InputError(str(path), name, f"row {r} holds inf or NaN", "finite embeddings")
        return out

    def bf16(self, path: Path, entry: Entry, row: int, n: int, name: str) -> FloatArray:
        """``n`` rows from ``row`` of a BF16 tensor, read at the header's offsets and widened."""
        per_row = math.prod(entry.shape[1:]) * 2
        with gate.open_regular(path, str(path), _SAFETENSORS, max_bytes=MAX_CHECKPOINT_BYTES) as f:
            f.seek(entry.begin + row * per_row)
            raw = f.read(n * per_row)
        if len(raw) != n * per_row:
            raise InputError(str(path), name, "data is cut short", "a complete file")
        self.widened.add("BF16")
        bits = np.empty(len(raw) // 2, np.uint32)  # bfloat16 = top half: one pass, one array
        np.left_shift(np.frombuffer(raw, dtype="<u2"), 16, out=bits, dtype=np.uint32)
        return bits.view(np.float32).reshape((n, *entry.shape[1:]) if entry.shape else ())

    def widen(self, dtype: str, arr: Any) -> FloatArray:
        if dtype == "F16":
            self.widened.add("F16")
        return np.asarray(arr, dtype=np.float64 if dtype == "F64" else np.float32)

    def handle(self, path: Path) -> Any:
        """The ``safe_open`` handle of one file, opened once."""
        if path not in self.handles:
            st = self.safetensors
            handle = self.guarded(path, lambda: st.safe_open(str(path), framework="numpy"))
            self.handles[path] = self.stack.enter_context(handle)
        return self.handles[path]

    def guarded(self, path: Path, work: Callable[[], Any]) -> Any:
        """``work()``: what the safetensors package raises or panics with is the file's own
        fault, said in one line."""
        try:
            return work()
        except AttnError:
            raise
        except BaseException as e:  # SafetensorError, or a Rust panic (a BaseException)
            if not (isinstance(e, Exception) or is_panic(e)):
                raise  # KeyboardInterrupt, SystemExit
            raise InputError(
                str(path), "", f"unreadable ({first_line(e)})", "a safetensors file"
            ) from None


def require(module: str) -> Any:
    """Import an optional dependency, or say in one line how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise InputError("", "", f"needs the Python package {module!r}: {INSTALL_HINT}") from None


def is_panic(e: BaseException) -> bool:
    """Whether ``e`` is PyO3's PanicException, which derives from BaseException only."""
    kind = type(e)
    return (kind.__module__, kind.__name__) == _PANIC


def first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def _sizes(plan: LayerPlan) -> str:
    own = plan.front_end.sizes(plan.hidden) if plan.front_end is not None else None
    if own is not None:  # a Gated DeltaNet layer: its own sizes
        return own
    return (
        f"hidden {plan.hidden}, heads {plan.heads}, kv_heads {plan.kv_heads}, "
        f"head_dim {plan.head_dim}"
    )
