"""``attn import``: one attention layer of a real checkpoint, read with NumPy, as an attn fixture.

A checkpoint is a Hugging Face model folder (``config.json`` plus ``model.safetensors``, or shards
listed in ``model.safetensors.index.json``) or one ``.safetensors`` file with its config.json.
Only layer L's tensors are read (and, for ``text``, the embedding rows of its tokens), so a
multi-GB checkpoint costs what one layer costs.

Reading: io/weights.py (the files, each safetensors header checked, BF16 widened exactly);
the text's tokens: io/tokens.py.

The fixture's ``X`` is what the projections consume: the layer's input (``hidden``, the residual
stream as ``output_hidden_states[L]`` gives it) after the pre-attention norm of pre-norm
families, or for layer 0 the embedded ``text``. X is computed in float64 from the stored weights;
weights keep their float32 values (the fixture loader reads them as float64).

Bounds, whatever the files claim: the memory the layer takes is counted from the headers before
a tensor is read (``max_memory``); config.json, the shard index and each header are JSON nested
at most 64 levels; the text is tokenised within TOKENIZE_SECONDS (tokenizer.json's regexes may
backtrack), and a Rust panic in the tokenizers or safetensors package is one InputError.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from attn_cli.core import ops
from attn_cli.core.limits import DEFAULT_MAX_BYTES, DEFAULT_MAX_ELEMENTS
from attn_cli.core.memory import default_max_memory, format_bytes
from attn_cli.errors import InputError, UsageError
from attn_cli.io import gate
from attn_cli.io.families import (
    Config,
    FromTensors,
    LayerPlan,
    Norm,
    check_keys,
    check_tensors,
    plan_layer,
    prefix_of,
    resolve_family,
)
from attn_cli.io.files import write_atomic_with
from attn_cli.io.tokens import MAX_TEXT_CHARS, encode_text
from attn_cli.io.weights import Reader, locate, read_json

FloatArray = np.ndarray[Any, np.dtype[np.floating[Any]]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]


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
    max_memory: int | None = None,
) -> ImportedLayer:
    """Layer ``layer``'s attention of ``checkpoint`` as a fixture, X from ``hidden`` or ``text``.

    ``max_memory`` bounds what the import holds (None: the default budget of a trace); it is
    counted from the file's claims before a tensor is read.
    """
    check_inputs(layer, hidden, text)
    folder, files, config_path = locate(Path(checkpoint), config)
    cfg = Config(read_json(config_path, "config.json"), str(config_path))
    family, overridden = resolve_family(cfg, arch)
    ignored = check_keys(cfg, family)  # every key read, inert or neutral: none left unread
    plan = plan_layer(cfg, family, layer)
    tokens: list[str] | None = None
    if text is not None:  # the inputs are checked before any weight is read
        ids, tokens, types = encode_text(folder / "tokenizer.json", text)
        rows = len(ids)
    else:
        assert hidden is not None
        X = _load_hidden(Path(hidden), plan.hidden)
        rows = math.prod(X.shape[:-1])
    with Reader(files) as reader:
        prefix = prefix_of(reader.names, plan, reader.source)
        check_tensors(reader.names, prefix, plan, reader.source)
        check_budget(reader, prefix, plan, rows, hidden, max_memory)
        found = {t.role: reader.read(prefix, t, plan) for t in plan.tensors}
        if text is not None:
            X = embed_tokens(reader, prefix, plan, ids, types)
        widened = sorted(reader.widened)
    if plan.pre_norm is not None:
        X = normalize_rows(X, plan.pre_norm, found)
        require_finite(X, str(checkpoint))
    fixture = layer_fixture(plan, found, X, tokens, Path(checkpoint), text, hidden)
    check_fixture(fixture, str(config_path))  # what config.json gave must make a fixture
    notes = [*overridden, *ignored, *plan.notes, _x_note(plan, text is not None)]
    if widened:
        notes.append(f"{', '.join(widened)} tensors widened to float32 (exact)")
    return ImportedLayer(fixture=fixture, family=family, notes=tuple(notes))


def check_inputs(layer: int, hidden: Path | None, text: str | None) -> None:
    """Exactly one of hidden and text; text only for layer 0, in UTF-8, of a bounded length."""
    if (hidden is None) == (text is None):
        raise UsageError(
            "",
            "hidden",
            "give exactly one of hidden and text",
            "hidden states (.npy) entering the layer, or a text to embed for layer 0",
            option="hidden",
        )
    if text is None:
        return
    if layer != 0:
        raise UsageError(
            "",
            "text",
            f"embeds the input of layer 0, not of layer {layer}",
            f"hidden states (the residual stream entering layer {layer})",
            option="text",
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate: an argv byte that is not UTF-8
        code = ord(text[e.start])
        bad = f"the byte {code - 0xDC00:#04x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise UsageError(
            "",
            "text",
            f"holds {bad} at character {e.start}, which is not UTF-8",
            "text in UTF-8",
            option="text",
        ) from None
    if len(text) > MAX_TEXT_CHARS:
        raise UsageError(
            "",
            "text",
            f"is {len(text):,} characters long",
            f"at most {MAX_TEXT_CHARS:,} characters",
            option="text",
        )


def require_finite(X: FloatArray, source: str) -> None:
    """The normalised X is finite: a float64 norm weight near float64's limit could overflow it."""
    if not np.isfinite(X).all():
        raise InputError(
            source,
            "X",
            "the layer's norm weight times the normalised input overflows float64",
            "norm weights of an ordinary size",
        )


# The hidden axis of each array a layer's size makes big: cut to one for check_fixture.
# W_DQ, W_DKV, W_KR: mla's; W_q ... W_a: gated_deltanet's
_HIDDEN_AXIS = {
    "X": -1,
    "W_Q": 0,
    "W_K": 0,
    "W_V": 0,
    "W_O": -1,
    "b_O": 0,
    "W_G": 0,
    "W_DQ": 0,
    "W_DKV": 0,
    "W_KR": 0,
    "W_q": 0,
    "W_k": 0,
    "W_v": 0,
    "W_z": 0,
    "W_b": 0,
    "W_a": 0,
}


def check_fixture(fixture: Mapping[str, Any], source: str) -> None:
    """The fixture as attn will read it back from the .npz, validated now: a value config.json
    gave that no fixture may hold (a factor of inf, a factor list of the wrong length) is one
    line naming config.json and the fixture key, and no file is written.

    Validated in miniature: one token and a hidden size of one, every other size (heads,
    head_dim, RoPE dims) as imported, so that checking costs no copy of the layer's weights.
    """
    from attn_cli.io.arrays import plain_value
    from attn_cli.io.validate import validate

    def read_back(key: str, value: Any) -> Any:
        arr = np.asarray(value)
        if key in ("X", "positions", "tokens"):  # the first token
            arr = arr[..., :1, :] if key == "X" else arr[:1]
        if key in _HIDDEN_AXIS:
            arr = np.take(arr, [0], axis=_HIDDEN_AXIS[key])
        return arr.tolist() if key == "tokens" else plain_value(arr)

    obj = {
        key: {sub: read_back(sub, v) for sub, v in value.items()}
        if isinstance(value, Mapping)
        else read_back(key, value)
        for key, value in fixture.items()
    }
    validate(obj, f"{source} (imported as the fixture)")


def write_npz_fixture(fixture: Mapping[str, Any], path: Path) -> None:
    """Write a fixture as a whole-fixture ``.npz``: one array per key, nothing pickled.

    Strings (``name``) and scalars (``heads``, ``scale``, ``causal``) become 0-d arrays and
    ``tokens`` an array of strings, as ``arrays.load_npz_fixture`` reads them. A mapping key
    (``rope``) is stored one entry per array, named ``rope.base``, ``rope.layout``:
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


# ---------------------------------------------------------------------------------------------
# Reading safetensors


# Bytes a number of the tensor being read takes besides the float32 (float64) array it becomes:
# the bytes the safetensors package hands over, and for BF16 the uint32 copy being shifted.
_READING = {"F64": 8, "F32": 4, "F16": 2, "BF16": 6}
_X_COPIES = 4  # float64 copies of X at once: embedding rows, their sum, the norm's scaled rows


def check_budget(
    reader: Reader,
    prefix: str,
    plan: LayerPlan,
    x_rows: int,
    hidden: Path | None,
    budget: int | None,
) -> None:
    """Refuse, before a tensor is read, an import that would hold more than ``budget`` bytes.

    Counted from the headers' claims: each tensor read whole, held as float32 (float64 if
    stored so), what reading the largest one takes on top, and X: ``x_rows`` x hidden float64
    numbers (tokens of the text, or rows of ``hidden``), a few copies at once.
    """
    limit = default_max_memory() if budget is None else budget
    whole = list(plan.tensors)
    if hidden is None and plan.embedding.norm is not None:  # BERT's embedding LayerNorm
        whole += [t for t in plan.embed_tensors if t.role.startswith("embed.norm.")]
    entries = [reader.entry(prefix, t, plan)[1:] for t in whole]
    sizes = [math.prod(e.shape) for _, e in entries]
    held = sum(n * (8 if e.dtype == "F64" else 4) for n, (_, e) in zip(sizes, entries, strict=True))
    reading = [n * _READING[e.dtype] for n, (_, e) in zip(sizes, entries, strict=True)]
    x_bytes = _X_COPIES * 8 * x_rows * plan.hidden
    need = held + max(reading, default=0) + x_bytes
    if need <= limit:
        return
    if x_bytes > held:  # a long input, not a big layer
        source, field = ("", "text") if hidden is None else (str(hidden), "")
        rows = "tokens" if hidden is None else "rows"
        why = f"X holds {x_rows:,} x {plan.hidden:,} numbers: {rows} x hidden"
    else:
        at = max(range(len(sizes)), key=sizes.__getitem__)
        path, entry = entries[at]
        source = str(path)
        field = prefix + whole[at].name
        why = f"the largest tensor, {list(entry.shape)} of {entry.dtype}"
    raise InputError(
        source,
        field,
        f"importing layer {plan.layer} would need about {format_bytes(need)} of memory ({why})",
        f"at most {format_bytes(limit)}",
        option="max-memory",
    )


# ---------------------------------------------------------------------------------------------
# The layer's input X


def embed_tokens(
    reader: Reader, prefix: str, plan: LayerPlan, ids: list[int], types: list[int]
) -> FloatArray:
    """Layer 0's input: token (+ position + type) embeddings, BERT's LayerNorm, Gemma's scale."""
    e = plan.embedding
    spec = {t.role: t for t in plan.embed_tensors}

    def table(role: str, rows: list[int], what: str) -> FloatArray:
        t = spec[role]
        if max(rows) >= t.shape[0]:
            raise InputError(
                reader.source,
                prefix + t.name,
                f"the text gives {len(ids)} tokens; {what} {max(rows)} is past this table's "
                f"{t.shape[0]} rows",
                f"at most {t.shape[0]} {what}s",
            )
        return reader.rows(prefix, t, plan, rows)

    x = table(e.tokens, ids, "token id")  # (T, C)
    if (
        e.scale is not None
    ):  # Gemma: sqrt(hidden), rounded to the table's dtype as transformers does
        dtype = reader.entry(prefix, spec[e.tokens], plan)[2].dtype
        x = x * _round_to(e.scale, dtype)
    if e.multiplier is not None:  # Granite: embeddings * embedding_multiplier
        x = x * e.multiplier
    if e.positions is not None:
        x = x + table(e.positions, _positions(ids, e.position_offset), "position")
    if e.types is not None:
        x = x + table(e.types, types, "token type")
    if e.norm is not None:
        norm = {r: reader.read(prefix, spec[r], plan) for r in (e.norm.weight, e.norm.bias) if r}
        x = normalize_rows(x, e.norm, norm)
    return x


def _positions(ids: list[int], pad: int | None) -> list[int]:
    """0..T-1; RoBERTa's from its padding_idx: pad + 1, pad + 2, ... over the tokens that are not
    pad, pad itself for a pad token (transformers' create_position_ids_from_input_ids)."""
    if pad is None:
        return list(range(len(ids)))
    out, seen = [], 0
    for i in ids:
        seen += i != pad
        out.append(pad + seen if i != pad else pad)
    return out


def _round_to(x: float, dtype: str) -> float:
    """``x`` as the stored dtype holds it (round to nearest even), for BF16 and F16."""
    if dtype == "F16":
        return float(np.float16(x))
    if dtype == "BF16":
        bits = int(np.array(x, np.float32).view(np.uint32))
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return float(np.array(bits, np.uint32).view(np.float32))
    return x


def normalize_rows(x: FloatArray, norm: Norm, tensors: Mapping[str, FloatArray]) -> FloatArray:
    """LayerNorm, RMSNorm or Gemma's RMSNorm (1 + weight) over the last axis, in float64 and
    overflow-safe (core.ops): rows of 1e200 or 1e-200 normalise as rows of 1 would."""
    weight = tensors[norm.weight] if norm.weight else None
    if norm.kind == "layer":
        bias = tensors[norm.bias] if norm.bias else None
        return ops.layer_norm(np.asarray(x, dtype=np.float64), weight, bias, norm.eps)
    x64 = np.asarray(x, dtype=np.float64)
    return ops.rms_norm(x64, weight, norm.eps, plus_one=norm.kind == "rms1p", safe=True)


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
            source,
            "",
            f"has shape {list(arr.shape)}",
            f"[seq, {hidden}] or [batch, seq, {hidden}] (hidden size {hidden})",
        )
    if 0 in arr.shape or not np.isfinite(arr).all():
        raise InputError(source, "", "is empty or holds inf or NaN", "finite hidden states")
    return arr.astype(np.float64)


def _x_note(plan: LayerPlan, from_text: bool) -> str:
    if from_text:
        e = plan.embedding
        parts = ["token"] + (["position"] if e.positions else []) + (["type"] if e.types else [])
        made = " + ".join(parts) + " embeddings"
        made += " * sqrt(hidden)" if e.scale else ""
        made += f" * embedding_multiplier {e.multiplier:g}" if e.multiplier is not None else ""
        if e.position_offset is not None:
            made += f" (positions from {e.position_offset + 1})"
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
    """W_Q, b_Q, ..., W_O, b_O (and an output gate's W_G, b_G) in the fixture's ``X @ W`` layout
    ([in, out])."""
    if plan.layout == "conv1d":  # GPT-2's Conv1D is already [in, out]; c_attn is Q | K | V
        C = plan.hidden
        W, b = t["qkv.weight"], t["qkv.bias"]  # (C, 3C), (3C,)
        return {
            "W_Q": W[:, :C],
            "b_Q": b[:C],
            "W_K": W[:, C : 2 * C],
            "b_K": b[C : 2 * C],
            "W_V": W[:, 2 * C :],
            "b_V": b[2 * C :],
            "W_O": t["o.weight"],
            "b_O": t["o.bias"],
        }
    out: dict[str, FloatArray] = {}
    if plan.layout in ("qkv_rows", "qkv_heads"):  # nn.Linear [out, in] of Q, K, V together
        t = {**t, **_split_qkv(plan, t)}
    if plan.q_gate_rows:  # Qwen3-Next's q_proj: per head, head_dim query rows then gate rows
        t = {**t, **_split_gate(plan, t)}
    for x in ("Q", "K", "V", "O", "G"):
        if f"{x.lower()}.weight" not in t:
            continue
        out[f"W_{x}"] = t[f"{x.lower()}.weight"].T  # nn.Linear [out, in] -> (in, out)
        if f"{x.lower()}.bias" in t:
            out[f"b_{x}"] = t[f"{x.lower()}.bias"]
    return out


def _split_gate(plan: LayerPlan, t: Mapping[str, FloatArray]) -> dict[str, FloatArray]:
    """q_proj's rows as the query's and the output gate's: transformers views them as
    [heads, 2·head_dim] and chunks each head's in two (``torch.chunk(..., 2, dim=-1)``)."""
    H, D = plan.heads, plan.head_dim
    out: dict[str, FloatArray] = {}
    for part in ("weight", "bias"):
        both = t.get(f"q.{part}")
        if both is None:
            continue
        per_head = both.reshape(H, 2, D, *both.shape[1:])  # (heads, query | gate, D, in?)
        out[f"q.{part}"] = per_head[:, 0].reshape(H * D, *both.shape[1:])
        out[f"g.{part}"] = per_head[:, 1].reshape(H * D, *both.shape[1:])
    return out


def _split_qkv(plan: LayerPlan, t: Mapping[str, FloatArray]) -> dict[str, FloatArray]:
    """A fused qkv nn.Linear's rows as q, k and v: Phi-3's Q | K | V blocks, or GPT-NeoX's
    rows per head [heads, 3, head_dim] (q_h, k_h, v_h side by side)."""
    H, Hkv, D = plan.heads, plan.kv_heads, plan.head_dim
    out: dict[str, FloatArray] = {}
    for part in ("weight", "bias"):
        fused = t.get(f"qkv.{part}")
        if fused is None:
            continue
        if plan.layout == "qkv_rows":
            q, k, v = np.split(fused, [H * D, (H + Hkv) * D], axis=0)
        else:
            per_head = fused.reshape(H, 3, D, *fused.shape[1:])
            q, k, v = (per_head[:, i].reshape(H * D, *fused.shape[1:]) for i in range(3))
        out.update({f"q.{part}": q, f"k.{part}": k, f"v.{part}": v})
    return out


def _front_end(
    f: dict[str, Any],
    plan: LayerPlan,
    t: Mapping[str, FloatArray],
    X: FloatArray,
    names: tuple[str, Path, str],
) -> dict[str, Any]:
    """A layer whose variant makes Q, K and V itself (its plan's front_end: Qwen3-Next's
    linear_attention, the gated_deltanet key; DeepSeek's multi-head latent attention, the mla
    key); ``names`` the checkpoint's label, its path and what X came from."""
    front = plan.front_end
    assert front is not None
    f["X"] = X
    f["heads"] = plan.heads
    label, checkpoint, given = names
    described = front.describe(plan, label, str(checkpoint), given)
    if described is not None:
        f["name"], f["description"] = described
    f[front.variant], f["W_O"] = front.fixture(plan.heads, t)
    if front.scaled:
        f["scale"] = float(plan.scale)
    f["causal"] = plan.causal
    return f


def layer_fixture(
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
    if plan.front_end is not None:
        return _front_end(f, plan, t, X, (label, checkpoint, given))
    weights = _weights(plan, t)
    f["X"] = X
    f.update((k, weights[k]) for k in ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V") if k in weights)
    f["heads"], f["kv_heads"] = plan.heads, plan.kv_heads
    f.update((k, weights[k]) for k in ("W_O", "b_O") if k in weights)
    f["scale"] = float(plan.scale)
    f["causal"] = plan.causal
    if plan.positions:
        f["positions"] = np.arange(X.shape[-2], dtype=np.int64)  # 0..seq-1, as the model's
    for name, setting in plan.variants.items():  # each variant's, as the fixture takes it
        f[name] = setting.make(t, weights) if isinstance(setting, FromTensors) else setting
    return f


def _short(text: str, limit: int = 60) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: limit - 1] + "…"
