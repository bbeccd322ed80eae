"""``attn import``: one attention layer of a real checkpoint, read with NumPy, as an attn fixture.

A checkpoint is a Hugging Face model folder (``config.json`` plus ``model.safetensors``, or shards
listed in ``model.safetensors.index.json``) or one ``.safetensors`` file with its config.json.
Only layer L's tensors are read (and, for ``text``, the embedding rows of its tokens), so a
multi-GB checkpoint costs what one layer costs.

Reading: each safetensors header is first read and checked here (8-byte little-endian length,
a JSON header of bounded size, every tensor's offsets inside the file and sized for its dtype
and shape). F32, F64 and F16 tensors are then read with the ``safetensors`` package's NumPy API
(``safe_open(..., framework="numpy")``), F16 widened to float32. BF16, which that API cannot
read, is read from the file at the header's offsets: a bfloat16 is the upper half of a float32,
so widening is exact (``uint16 << 16`` viewed as float32). No ``ml_dtypes`` is needed.

The fixture's ``X`` is what the projections consume: the layer's input (``hidden``, the residual
stream as ``output_hidden_states[L]`` gives it) after the pre-attention norm of pre-norm
families, or for layer 0 the embedded ``text``. X is computed in float64 from the stored weights;
weights keep their float32 values (the fixture loader reads them as float64).
"""

from __future__ import annotations

import importlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import numpy as np

from attn_cli.core.limits import DEFAULT_MAX_BYTES, DEFAULT_MAX_ELEMENTS
from attn_cli.errors import InputError, UsageError
from attn_cli.io import gate
from attn_cli.io.families import (
    Config,
    LayerPlan,
    Norm,
    Tensor,
    family_of,
    plan_layer,
    prefix_of,
)
from attn_cli.io.files import write_atomic_with

FloatArray = np.ndarray[Any, np.dtype[np.floating[Any]]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors package's own limit
MAX_JSON_BYTES = 64 * 1024 * 1024  # config.json, model.safetensors.index.json, tokenizer.json
MAX_CHECKPOINT_BYTES = 1 << 40  # one safetensors file (only the layer's tensors are read)
_SAFETENSORS = "a .safetensors file"
INSTALL_HINT = "pip install 'attn-cli[models]'"

# Bytes per element of every safetensors dtype (for the header's size check); the float ones
# this module can read are the keys of _READABLE.
_ITEMSIZE = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
}  # fmt: skip
_READABLE = ("F64", "F32", "F16", "BF16")


@dataclass(frozen=True, eq=False)
class ImportedLayer:
    """One imported layer: the fixture mapping (ready to write), its family, and what was done."""

    fixture: dict[str, Any]
    family: str
    notes: tuple[str, ...]


def import_layer(
    checkpoint: Path,
    *,
    layer: int,
    hidden: Path | None = None,
    text: str | None = None,
    config: Path | None = None,
    arch: str | None = None,
) -> ImportedLayer:
    """Layer ``layer``'s attention of ``checkpoint`` as a fixture, X from ``hidden`` or ``text``."""
    if (hidden is None) == (text is None):
        raise UsageError(
            "", "hidden", "give exactly one of hidden and text",
            "hidden states (.npy) entering the layer, or a text to embed for layer 0",
            option="hidden",
        )  # fmt: skip
    if text is not None and layer != 0:
        raise UsageError(
            "", "text", f"embeds the input of layer 0, not of layer {layer}",
            f"hidden states (the residual stream entering layer {layer})", option="text",
        )  # fmt: skip
    folder, files, config_path = _locate(Path(checkpoint), config)
    cfg = Config(_read_json(config_path, "config.json"), str(config_path))
    family = family_of(cfg, arch)
    plan = plan_layer(cfg, family, layer)
    tokens: list[str] | None = None
    if text is not None:  # the inputs are checked before any weight is read
        ids, tokens, types = _encode(folder / "tokenizer.json", text)
    else:
        assert hidden is not None
        X = _load_hidden(Path(hidden), plan.hidden)
    with _Reader(files) as reader:
        prefix = prefix_of(reader.names, plan, reader.source)
        found = {t.role: reader.read(prefix, t, plan) for t in plan.tensors}
        if text is not None:
            X = _embed(reader, prefix, plan, ids, types)
        widened = sorted(reader.widened)
    if plan.pre_norm is not None:
        X = _normalize(X, plan.pre_norm, found)
    fixture = _fixture(plan, found, X, tokens, Path(checkpoint), text, hidden)
    notes = [*plan.notes, _x_note(plan, text is not None)]
    if widened:
        notes.append(f"{', '.join(widened)} tensors widened to float32 (exact)")
    return ImportedLayer(fixture=fixture, family=family, notes=tuple(notes))


def write_npz_fixture(fixture: Mapping[str, Any], path: Path) -> None:
    """Write a fixture as a whole-fixture ``.npz``: one array per key, nothing pickled.

    Strings (``name``) and scalars (``heads``, ``scale``, ``causal``) become 0-d arrays and
    ``tokens`` an array of strings, as ``arrays.load_npz_fixture`` reads them. A mapping key
    (``rope``, ``qk_norm``) is stored one entry per array, named ``rope.base``, ``qk_norm.eps``:
    the ``expected.NAME`` convention of that loader, which must nest these keys the same way.
    """
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    for key, value in fixture.items():
        items = value.items() if isinstance(value, Mapping) else [(None, value)]
        for sub, v in items:
            arr = np.array(v, dtype=str) if key == "tokens" else np.asarray(v)
            assert not arr.dtype.hasobject, f"{key} would need pickling"
            arrays[key if sub is None else f"{key}.{sub}"] = arr

    def write(f: IO[bytes]) -> None:  # a file object: numpy.savez adds no ".npz" to the name
        np.savez(f, **arrays)  # type: ignore[arg-type]  # (the stub fears a key "allow_pickle")

    write_atomic_with(path, write)


# ---------------------------------------------------------------------------------------------
# Finding the files


def _locate(checkpoint: Path, config: Path | None) -> tuple[Path, dict[str, Path] | Path, Path]:
    """The folder, the weight files (an index's name -> shard map, or one file) and config.json."""
    source = str(checkpoint)
    if gate.kind_of(checkpoint) == "dir":
        folder = checkpoint
        index, single = folder / "model.safetensors.index.json", folder / "model.safetensors"
        if gate.kind_of(index) == "file":
            files: dict[str, Path] | Path = _shards(index, folder)
        elif gate.kind_of(single) == "file":
            files = single
        else:
            raise InputError(
                source, "", "holds neither model.safetensors nor model.safetensors.index.json",
                "a Hugging Face model folder",
            )  # fmt: skip
    elif gate.kind_of(checkpoint) == "file":
        folder = checkpoint.parent
        is_index = checkpoint.name.endswith(".index.json")
        files = _shards(checkpoint, folder) if is_index else checkpoint
    else:
        raise InputError(
            source, "", "no such file or folder", "a model folder or .safetensors file"
        )
    config_path = config if config is not None else folder / "config.json"
    if gate.kind_of(config_path) != "file":
        raise InputError(
            str(config_path), "", "no such file", "the model's config.json (give it with --config)"
        )
    return folder, files, config_path


def _read_json(path: Path, what: str) -> dict[str, Any]:
    """A small JSON object from a regular file, or an InputError naming the file."""
    source = str(path)
    raw = gate.read_bytes(path, source, what, max_bytes=MAX_JSON_BYTES)
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        raise InputError(source, "", f"is not valid JSON ({e})", what) from None
    if not isinstance(data, dict):
        raise InputError(source, "", f"holds {type(data).__name__}", f"a JSON object ({what})")
    return data


def _shards(index: Path, folder: Path) -> dict[str, Path]:
    """The index's tensor name -> shard file, every shard a plain file name inside ``folder``."""
    data = _read_json(index, "model.safetensors.index.json")
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


# ---------------------------------------------------------------------------------------------
# Reading safetensors


@dataclass(frozen=True)
class _Entry:
    dtype: str
    shape: tuple[int, ...]
    begin: int  # offset from the file's start
    end: int


def read_header(path: Path) -> dict[str, _Entry]:
    """The tensors a safetensors file holds, its header checked against the file's size."""
    source = str(path)
    try:
        with gate.open_regular(path, source, _SAFETENSORS, max_bytes=MAX_CHECKPOINT_BYTES) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 0 or n > MAX_HEADER_BYTES or 8 + n > size:
                raise InputError(
                    source, "header", f"is truncated or corrupt (file of {size:,} bytes, "
                    f"header length {n if n >= 0 else 'missing'})",
                    "an 8-byte little-endian length and a JSON header inside the file",
                )  # fmt: skip
            raw = f.read(n)
    except OSError as e:
        raise InputError(
            source, "", f"cannot read ({e.strerror or e})", "a safetensors file"
        ) from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        header = None
    if not isinstance(header, dict):
        raise InputError(source, "header", "is not a JSON object", "a safetensors header")
    return {
        name: _entry(source, name, value, 8 + n, size)
        for name, value in header.items()
        if name != "__metadata__"
    }


def _entry(source: str, name: str, value: Any, start: int, size: int) -> _Entry:
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
            source, name, f"data ends at byte {start + offsets[1]:,} of a {size:,}-byte file",
            "a complete file (it is truncated)",
        )  # fmt: skip
    itemsize = _ITEMSIZE.get(dtype)
    if itemsize is not None and offsets[1] - offsets[0] != math.prod(shape) * itemsize:
        raise bad(f"holds {offsets[1] - offsets[0]} bytes for shape {shape} of {dtype}")
    return _Entry(dtype, tuple(shape), start + offsets[0], start + offsets[1])


class _Reader:
    """The tensors of one checkpoint, read lazily: a shard's header only when a tensor needs it."""

    def __init__(self, files: dict[str, Path] | Path) -> None:
        self.safetensors = _require("safetensors")
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

    def __enter__(self) -> _Reader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stack.close()

    def entry(self, prefix: str, t: Tensor, plan: LayerPlan) -> tuple[str, Path, _Entry]:
        """The full name, file and header entry of ``t``, its presence, dtype and shape checked."""
        name = prefix + t.name
        path = self.where.get(name)
        if path is None:
            raise InputError(
                self.source, name, "missing tensor",
                f"the {plan.family} layout's {t.role} tensor of layer {plan.layer}",
            )  # fmt: skip
        if path not in self.headers:
            if gate.kind_of(path) != "file":
                raise InputError(str(path), name, "the shard holding it does not exist", "a file")
            self.headers[path] = read_header(path)
        entry = self.headers[path].get(name)
        if entry is None:
            raise InputError(str(path), name, "missing tensor (the index places it here)", "it")
        if entry.dtype not in _READABLE:
            raise InputError(
                str(path), name, f"has dtype {entry.dtype}, which is not supported",
                "F32, F16, BF16 or F64",
            )  # fmt: skip
        if entry.shape != t.shape:
            raise InputError(
                str(path), name, f"has shape {list(entry.shape)}",
                f"{list(t.shape)} from the config ({_sizes(plan)})",
            )  # fmt: skip
        return name, path, entry

    def read(self, prefix: str, t: Tensor, plan: LayerPlan) -> FloatArray:
        """Tensor ``t`` whole, as float32 (float64 if stored so)."""
        name, path, entry = self.entry(prefix, t, plan)
        if entry.dtype == "BF16":
            return self.bf16(path, entry, 0, entry.shape[0] if entry.shape else 1, name)
        return self.widen(entry.dtype, self.handle(path).get_tensor(name))

    def rows(self, prefix: str, t: Tensor, plan: LayerPlan, ids: Sequence[int]) -> FloatArray:
        """Rows ``ids`` of the 2-axis tensor ``t`` (an embedding table), reading no other rows."""
        name, path, entry = self.entry(prefix, t, plan)
        out = np.empty((len(ids), entry.shape[1]), np.float64)
        sl = None if entry.dtype == "BF16" else self.handle(path).get_slice(name)
        for i, r in enumerate(ids):
            row = self.bf16(path, entry, r, 1, name) if sl is None else sl[r : r + 1]
            out[i] = self.widen(entry.dtype, row)[0]
        return out

    def bf16(self, path: Path, entry: _Entry, row: int, n: int, name: str) -> FloatArray:
        """``n`` rows from ``row`` of a BF16 tensor, read at the header's offsets and widened."""
        per_row = math.prod(entry.shape[1:]) * 2
        with gate.open_regular(path, str(path), _SAFETENSORS, max_bytes=MAX_CHECKPOINT_BYTES) as f:
            f.seek(entry.begin + row * per_row)
            raw = f.read(n * per_row)
        if len(raw) != n * per_row:
            raise InputError(str(path), name, "data is cut short", "a complete file")
        self.widened.add("BF16")
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16  # bfloat16 = top half
        return bits.view(np.float32).reshape((n, *entry.shape[1:]) if entry.shape else ())

    def widen(self, dtype: str, arr: Any) -> FloatArray:
        if dtype == "F16":
            self.widened.add("F16")
        return np.asarray(arr, dtype=np.float64 if dtype == "F64" else np.float32)

    def handle(self, path: Path) -> Any:
        """The ``safe_open`` handle of one file, opened once."""
        if path not in self.handles:
            try:
                handle = self.safetensors.safe_open(str(path), framework="numpy")
                self.handles[path] = self.stack.enter_context(handle)
            except Exception as e:  # SafetensorError and the like: the file's own fault
                raise InputError(str(path), "", f"unreadable ({e})", "a safetensors file") from None
        return self.handles[path]


def _sizes(plan: LayerPlan) -> str:
    return (
        f"hidden {plan.hidden}, heads {plan.heads}, kv_heads {plan.kv_heads}, "
        f"head_dim {plan.head_dim}"
    )


def _require(module: str) -> Any:
    """Import an optional dependency, or say in one line how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise InputError("", "", f"needs the Python package {module!r}: {INSTALL_HINT}") from None


# ---------------------------------------------------------------------------------------------
# The layer's input X


def _encode(path: Path, text: str) -> tuple[list[int], list[str], list[int]]:
    """Token ids, strings and type ids of ``text`` from the checkpoint's own tokenizer.json."""
    tokenizers = _require("tokenizers")
    what = "the checkpoint's tokenizer.json (for the text)"
    raw = gate.read_bytes(path, str(path), what, max_bytes=MAX_JSON_BYTES)
    try:
        tokenizer = tokenizers.Tokenizer.from_str(raw.decode("utf-8"))
        tokenizer.no_padding()  # tokenizer.json may pad to a fixed length (MiniLM pads to 128)
        tokenizer.no_truncation()  # too many tokens is an error below, not a silent cut
        encoding = tokenizer.encode(text)  # special tokens as the model's post-processor adds them
    except Exception as e:  # the tokenizers package raises plain Exception
        raise InputError(str(path), "", f"unreadable tokenizer ({e})", "a tokenizer.json") from None
    if not encoding.ids:
        raise InputError(str(path), "text", "the text gives no tokens", "some text", option="text")
    return list(encoding.ids), list(encoding.tokens), list(encoding.type_ids)


def _embed(
    reader: _Reader, prefix: str, plan: LayerPlan, ids: list[int], types: list[int]
) -> FloatArray:
    """Layer 0's input: token (+ position + type) embeddings, BERT's LayerNorm, Gemma's scale."""
    e = plan.embedding
    spec = {t.role: t for t in plan.embed_tensors}

    def table(role: str, rows: list[int], what: str) -> FloatArray:
        t = spec[role]
        if max(rows) >= t.shape[0]:
            raise InputError(
                reader.source, prefix + t.name,
                f"the text gives {len(ids)} tokens; {what} {max(rows)} is past this table's "
                f"{t.shape[0]} rows", f"at most {t.shape[0]} {what}s",
            )  # fmt: skip
        return reader.rows(prefix, t, plan, rows)

    x = table(e.tokens, ids, "token id")  # (T, C)
    if (
        e.scale is not None
    ):  # Gemma: sqrt(hidden), rounded to the table's dtype as transformers does
        dtype = reader.entry(prefix, spec[e.tokens], plan)[2].dtype
        x = x * _round_to(e.scale, dtype)
    if e.positions is not None:
        x = x + table(e.positions, list(range(len(ids))), "position")
    if e.types is not None:
        x = x + table(e.types, types, "token type")
    if e.norm is not None:
        norm = {r: reader.read(prefix, spec[r], plan) for r in (e.norm.weight, e.norm.bias) if r}
        x = _normalize(x, e.norm, norm)
    return x


def _round_to(x: float, dtype: str) -> float:
    """``x`` as the stored dtype holds it (round to nearest even), for BF16 and F16."""
    if dtype == "F16":
        return float(np.float16(x))
    if dtype == "BF16":
        bits = int(np.array(x, np.float32).view(np.uint32))
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return float(np.array(bits, np.uint32).view(np.float32))
    return x


def _normalize(x: FloatArray, norm: Norm, tensors: Mapping[str, FloatArray]) -> FloatArray:
    """LayerNorm, RMSNorm or Gemma's RMSNorm (1 + weight) over the last axis, in float64."""
    x = x.astype(np.float64)
    w = tensors[norm.weight].astype(np.float64)
    if norm.kind == "layer":
        mu = x.mean(axis=-1, keepdims=True)  # (..., 1)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)  # biased, as torch's LayerNorm
        b = tensors[norm.bias].astype(np.float64) if norm.bias else 0.0
        layer: FloatArray = (x - mu) / np.sqrt(var + norm.eps) * w + b
        return layer
    rms = np.sqrt((x * x).mean(axis=-1, keepdims=True) + norm.eps)  # (..., 1)
    out: FloatArray = x / rms * (1.0 + w if norm.kind == "rms1p" else w)
    return out


def _load_hidden(path: Path, hidden: int) -> FloatArray:
    """The residual stream entering the layer, [seq, hidden] or [batch, seq, hidden], from .npy."""
    source = str(path)
    reader = gate.ArrayReader(DEFAULT_MAX_ELEMENTS, DEFAULT_MAX_BYTES)
    with gate.open_regular(path, source, "numpy.save's .npy", max_bytes=DEFAULT_MAX_BYTES) as f:
        arr = reader.read_array(f, "", source)
    if arr.dtype.kind != "f":
        raise InputError(source, "", f"has dtype {arr.dtype}", "float16, float32 or float64")
    if arr.ndim not in (2, 3) or arr.shape[-1] != hidden:
        raise InputError(
            source, "", f"has shape {list(arr.shape)}",
            f"[seq, {hidden}] or [batch, seq, {hidden}] (hidden size {hidden})",
        )  # fmt: skip
    if 0 in arr.shape or not np.isfinite(arr).all():
        raise InputError(source, "", "is empty or holds inf or NaN", "finite hidden states")
    return arr.astype(np.float64)


def _x_note(plan: LayerPlan, from_text: bool) -> str:
    if from_text:
        e = plan.embedding
        parts = ["token"] + (["position"] if e.positions else []) + (["type"] if e.types else [])
        made = " + ".join(parts) + " embeddings"
        made += " * sqrt(hidden)" if e.scale else ""
        made += ", then the embedding LayerNorm" if e.norm else ""
    elif plan.pre_norm is None:
        made = "the given hidden states as they are (post-norm: the layer consumes them so)"
    else:
        made = "the given hidden states"
    norm = {"layer": "LayerNorm", "rms": "RMSNorm", "rms1p": "RMSNorm (1 + weight)"}
    after = f", then the layer's {norm[plan.pre_norm.kind]}" if plan.pre_norm else ""
    return f"X = {made}{after} (computed in float64)"


# ---------------------------------------------------------------------------------------------
# The fixture


def _weights(plan: LayerPlan, t: Mapping[str, FloatArray]) -> dict[str, FloatArray]:
    """W_Q, b_Q, ..., W_O, b_O in the fixture's ``X @ W`` layout ([in, out])."""
    if plan.layout == "conv1d":  # GPT-2's Conv1D is already [in, out]; c_attn is Q | K | V
        C = plan.hidden
        W, b = t["qkv.weight"], t["qkv.bias"]  # (C, 3C), (3C,)
        return {
            "W_Q": W[:, :C], "b_Q": b[:C], "W_K": W[:, C : 2 * C], "b_K": b[C : 2 * C],
            "W_V": W[:, 2 * C :], "b_V": b[2 * C :], "W_O": t["o.weight"], "b_O": t["o.bias"],
        }  # fmt: skip
    out: dict[str, FloatArray] = {}
    for x in ("Q", "K", "V", "O"):
        out[f"W_{x}"] = t[f"{x.lower()}.weight"].T  # nn.Linear [out, in] -> (in, out)
        if f"{x.lower()}.bias" in t:
            out[f"b_{x}"] = t[f"{x.lower()}.bias"]
    return out


def _fixture(
    plan: LayerPlan,
    t: Mapping[str, FloatArray],
    X: FloatArray,
    tokens: list[str] | None,
    checkpoint: Path,
    text: str | None,
    hidden: Path | None,
) -> dict[str, Any]:
    """The fixture mapping: labels, X and weights, then the conventions of the layer."""
    generic = checkpoint.name in ("model", "model.safetensors", "")
    label = f"{checkpoint.parent.name}/{checkpoint.name}" if generic else checkpoint.name
    given = f"text {_short(text)!r}" if text is not None else f"hidden states {hidden}"
    f: dict[str, Any] = {
        "name": f"{label}: layer {plan.layer} attention ({plan.family})",
        "description": (
            f"Layer {plan.layer} of {plan.layers} of {checkpoint} ({plan.family}: {plan.heads} "
            f"heads, {plan.kv_heads} kv heads, head_dim {plan.head_dim}), X from the {given}"
        ),
    }
    if tokens is not None:
        f["tokens"] = tokens
    weights = _weights(plan, t)
    f["X"] = X
    f.update((k, weights[k]) for k in ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V") if k in weights)
    f["heads"], f["kv_heads"] = plan.heads, plan.kv_heads
    f.update((k, weights[k]) for k in ("W_O", "b_O") if k in weights)
    f["scale"] = float(plan.scale)
    f["causal"] = plan.causal
    if plan.rope is not None or plan.window is not None:
        f["positions"] = np.arange(X.shape[-2], dtype=np.int64)  # 0..seq-1, as the model's
    if plan.rope is not None:
        f["rope"] = {"base": plan.rope.base, "layout": plan.rope.layout, "dims": plan.rope.dims}
    if plan.window is not None:
        f["window"] = plan.window
    if plan.softcap is not None:
        f["softcap"] = plan.softcap
    if plan.sinks:
        f["sinks"] = t["sinks"]
    if plan.qk_norm_eps is not None:
        f["qk_norm"] = {"q_weight": t["q_norm.weight"], "k_weight": t["k_norm.weight"],
                        "eps": plan.qk_norm_eps}  # fmt: skip
    return f


def _short(text: str, limit: int = 60) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: limit - 1] + "…"
