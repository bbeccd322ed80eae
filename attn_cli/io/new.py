"""``attn new``: a random, commented fixture to start from (tokens, X, W_Q, W_K, W_V)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attn_cli.errors import printable

WORDS = (
    "The", "cat", "sat", "on", "my", "warm", "mat", "and", "then", "slowly",
    "fell", "fast", "asleep", "near", "an", "open", "window",
)  # fmt: skip
FIXTURE_SUFFIXES = (".yaml", ".yml", ".npz")


@dataclass(frozen=True)
class NewFixture:
    """The shape of the fixture to write."""

    seq: int = 5
    d_model: int = 8
    d_k: int = 4
    heads: int = 2
    batch: int | None = None
    causal: bool = False
    seed: int = 0
    tokens: tuple[str, ...] | None = None  # None: a short sentence, then tok<i>
    kv_heads: int | None = None  # None: as many as heads
    w_o: bool = False  # add an output projection W_O [heads*d_k, d_model]
    # the modern variants (docs/fixture-format.md, "Modern attention variants"); None/False: off
    rope: str | None = None  # RoPE layout: "half" or "interleaved"
    rope_base: float | None = None  # None: 10000
    rope_dims: int | None = None  # None: d_k
    window: int | None = None  # sliding window (needs causal)
    softcap: float | None = None
    sinks: bool = False  # one random sink logit per query head
    qk_norm: bool = False  # random per-head RMSNorm weights for Q and K
    alibi: bool = False  # ALiBi with the paper's slopes
    cross: int | None = None  # cross-attention: X_kv of this many tokens
    mask_value: float | None = None  # a finite sentinel instead of -inf


@dataclass(frozen=True, eq=False)
class NewArrays:
    """The numbers of a new fixture: drawn once, written as YAML or as ``.npz``."""

    tokens: tuple[str, ...]
    X: np.ndarray  # (seq, d_model) or (batch, seq, d_model)
    W_Q: np.ndarray  # (d_model, heads*d_k)
    W_K: np.ndarray  # (d_model, kv_heads*d_k)
    W_V: np.ndarray  # (d_model, kv_heads*d_k)
    W_O: np.ndarray | None  # (heads*d_k, d_model)
    X_kv: np.ndarray | None = None  # (cross, d_model) or (batch, cross, d_model)
    key_tokens: tuple[str, ...] | None = None  # with X_kv: one per key
    sinks: np.ndarray | None = None  # (heads,)
    q_weight: np.ndarray | None = None  # (d_k,)
    k_weight: np.ndarray | None = None  # (d_k,)


def tokens_for(seq: int) -> list[str]:
    """``seq`` distinct tokens: a short sentence, then tok<i>."""
    return [WORDS[i] if i < len(WORDS) else f"tok{i}" for i in range(seq)]


def new_arrays(spec: NewFixture) -> NewArrays:
    """Random inputs of unit size, rounded to read easily; the same seed gives the same ones."""
    rng = np.random.default_rng(spec.seed)
    kv_heads = spec.kv_heads or spec.heads
    x_shape = (
        (spec.seq, spec.d_model) if spec.batch is None else (spec.batch, spec.seq, spec.d_model)
    )
    X = rng.normal(size=x_shape).round(1)  # embeddings of about unit size, one decimal
    # weights of size 1/sqrt(d_model), so Q and K entries stay about unit size
    W_Q, W_K, W_V = (
        (rng.normal(size=(spec.d_model, n * spec.d_k)) / math.sqrt(spec.d_model)).round(2)
        for n in (spec.heads, kv_heads, kv_heads)
    )
    width = spec.heads * spec.d_k
    W_O = (rng.normal(size=(width, spec.d_model)) / math.sqrt(width)).round(2) if spec.w_o else None
    tokens = spec.tokens if spec.tokens is not None else tuple(tokens_for(spec.seq))
    # the variants draw after the rest, so a seed gives the same X and W with or without them
    X_kv = key_tokens = None
    if spec.cross is not None:
        X_kv = rng.normal(size=(*x_shape[:-2], spec.cross, spec.d_model)).round(1)
        key_tokens = tuple(tokens_for(spec.cross))
    sinks = rng.normal(size=spec.heads).round(2) if spec.sinks else None
    q_weight = k_weight = None
    if spec.qk_norm:  # learned RMSNorm weights start at 1; these are near it
        q_weight, k_weight = ((1 + 0.1 * rng.normal(size=spec.d_k)).round(2) for _ in "qk")
    return NewArrays(tokens, X, W_Q, W_K, W_V, W_O, X_kv, key_tokens, sinks, q_weight, k_weight)


def new_fixture(spec: NewFixture, file_name: str = "FILE.yaml") -> str:
    """The YAML text of a random fixture with comments on every key and row.

    ``file_name`` is the file it is written to, named in the comment that says how to trace it.
    """
    a = new_arrays(spec)
    kv_heads = spec.kv_heads or spec.heads
    lines = [
        f"# A random fixture made by `attn new` (seed {spec.seed}). Edit any number and run:",
        f"#   attn trace {_shell_word(file_name)} --explain",
        "# Every key is described in docs/fixture-format.md.",
        f"name: {_name(spec)}",
        f"description: {_quote(_description(spec))}",
        "# One token per position (the row and column labels of every table).",
        "tokens: [" + ", ".join(_quote(t) for t in a.tokens) + "]",
        *_x_lines(spec, a),
        *_x_kv_lines(spec, a),
    ]
    roles = ("queries: what each token looks for", "keys: the labels each token offers",
             "values: the content each token hands back")  # fmt: skip
    for name, w, role in zip(("W_Q", "W_K", "W_V"), (a.W_Q, a.W_K, a.W_V), roles, strict=True):
        n = spec.heads if name == "W_Q" else kv_heads
        axis = ("heads" if n == spec.heads else "kv_heads") + ("*d_v" if name == "W_V" else "*d_k")
        source = "X_kv" if a.X_kv is not None and name != "W_Q" else "X"
        rows = "d_model_kv" if source == "X_kv" else "d_model"
        lines.append(
            f"{name}: # [{rows}, {axis}] = [{spec.d_model}, {n * spec.d_k}]; "
            f"{name[-1]} = {source} @ {name}, the {role}"
        )
        if n > 1:
            lines.append(f"  # {_blocks(n, spec.d_k, 'head' if n == spec.heads else 'kv head')}")
        lines += _rows(w, None, "  ")
    lines += _tail_lines(spec, a)
    lines += _variant_lines(spec, a)
    return "\n".join(lines) + "\n"


def new_fixture_npz(spec: NewFixture) -> dict[str, np.ndarray]:
    """The same fixture as whole-fixture ``.npz`` members (one array per key, scalars 0-d),
    the layout attn_cli.io.arrays.load_npz_fixture reads; written with ``numpy.savez``."""
    a = new_arrays(spec)
    out: dict[str, np.ndarray] = {
        "name": np.array(_name(spec)),
        "description": np.array(_description(spec)),
        "tokens": np.array(a.tokens, dtype=str),
        "X": a.X, "W_Q": a.W_Q, "W_K": a.W_K, "W_V": a.W_V,
        "heads": np.array(spec.heads),
    }  # fmt: skip
    if spec.kv_heads is not None and spec.kv_heads != spec.heads:
        out["kv_heads"] = np.array(spec.kv_heads)
    if a.W_O is not None:
        out["W_O"] = a.W_O
    if spec.causal:
        out["causal"] = np.array(True)
    out.update(_variant_members(spec, a))
    return out


def _variant_members(spec: NewFixture, a: NewArrays) -> dict[str, np.ndarray]:
    """The variants as whole-fixture .npz members: a mapping's entries as ``KEY.SUBKEY``."""
    out: dict[str, np.ndarray] = {}
    if a.X_kv is not None and a.key_tokens is not None:
        out["X_kv"] = a.X_kv
        out["key_tokens"] = np.array(a.key_tokens, dtype=str)
    if spec.rope is not None:
        out["rope.layout"] = np.array(spec.rope)
        if spec.rope_base is not None:
            out["rope.base"] = np.array(float(spec.rope_base))
        if spec.rope_dims is not None:
            out["rope.dims"] = np.array(spec.rope_dims)
    scalars = (("window", spec.window), ("softcap", spec.softcap), ("mask_value", spec.mask_value))
    out.update({key: np.array(value) for key, value in scalars if value is not None})
    if spec.alibi:
        out["alibi"] = np.array(True)
    if a.sinks is not None:
        out["sinks"] = a.sinks
    if a.q_weight is not None and a.k_weight is not None:
        out["qk_norm.q_weight"], out["qk_norm.k_weight"] = a.q_weight, a.k_weight
        out["qk_norm.eps"] = np.array(1e-6)
    return out


def _name(spec: NewFixture) -> str:
    return f"random fixture (seed {spec.seed})"


def _description(spec: NewFixture) -> str:
    kv = f" ({spec.kv_heads} key/value)" if spec.kv_heads not in (None, spec.heads) else ""
    return (
        f"Random: seq {spec.seq}, d_model {spec.d_model}, {spec.heads} heads{kv} of d_k "
        f"{spec.d_k}"
        + (f", batch {spec.batch}" if spec.batch else "")
        + (", causal" if spec.causal else "")
        + (", W_O" if spec.w_o else "")
        + "".join(f", {v}" for v in _variant_names(spec))
    )


def _variant_names(spec: NewFixture) -> list[str]:
    """The variants a fixture has, as the description lists them."""
    named = [
        (f"cross-attention to {spec.cross} tokens", spec.cross is not None),
        (f"RoPE ({spec.rope})", spec.rope is not None),
        ("QK-norm", spec.qk_norm),
        ("ALiBi", spec.alibi),
        (f"window {spec.window}", spec.window is not None),
        (f"softcap {spec.softcap:g}" if spec.softcap else "", spec.softcap is not None),
        ("sinks", spec.sinks),
        (f"mask_value {spec.mask_value:g}" if spec.mask_value else "", spec.mask_value is not None),
    ]
    return [text for text, on in named if on]


def _blocks(n: int, d_k: int, what: str) -> str:
    return ", ".join(f"{what} {h} owns columns {h * d_k}-{(h + 1) * d_k - 1}" for h in range(n))


def _x_lines(spec: NewFixture, a: NewArrays) -> list[str]:
    labels = [printable(t) for t in a.tokens]  # a comment ends at a newline: escape it
    if spec.batch is None:
        head = f"X:   # [seq, d_model] = [{spec.seq}, {spec.d_model}]: one embedding per row"
        return [head, *_rows(a.X, labels, "  ")]
    lines = [
        f"X:   # [batch, seq, d_model] = [{spec.batch}, {spec.seq}, {spec.d_model}]; "
        "the tokens label every item"
    ]
    for b in range(spec.batch):
        lines.append(f"  # batch item {b}")
        for n, row in enumerate(_rows(a.X[b], labels, "    ")):
            lines.append(("  - " + row[4:]) if n == 0 else row)
    return lines


def _tail_lines(spec: NewFixture, a: NewArrays) -> list[str]:
    lines = [f"heads: {spec.heads}"]
    kv_heads = spec.kv_heads or spec.heads
    if kv_heads != spec.heads:
        groups = spec.heads // kv_heads
        lines.append(
            f"kv_heads: {kv_heads}   # grouped-query: query head h reads key/value head "
            f"h // {groups}"
        )
    if a.W_O is not None:
        width = spec.heads * spec.d_k
        lines.append(
            f"W_O: # [heads*d_v, d_out] = [{width}, {spec.d_model}]; "
            "projected = concat @ W_O, the heads mixed back into one vector"
        )
        lines += _rows(a.W_O, None, "  ")
    if spec.causal:
        lines.append("causal: true   # each token sees only itself and earlier tokens")
    lines.append(
        f"# scale omitted: 1/sqrt(d_k) = {1 / math.sqrt(spec.d_k):.6g}; `scale: 1` turns it off."
    )
    rest = ", ".join(k for k, on in (("kv_heads", kv_heads == spec.heads),
                                     ("W_O and b_O", a.W_O is None)) if on)  # fmt: skip
    lines.append(
        f"# Optional: {rest + ', ' if rest else ''}mask, bias, lengths, and the variants rope, "
        "alibi, window, softcap, sinks, qk_norm, X_kv, mask_value (see docs/fixture-format.md)."
    )
    return lines


def _x_kv_lines(spec: NewFixture, a: NewArrays) -> list[str]:
    """With --cross: the key tokens and X_kv, the states K and V are projected from."""
    if a.X_kv is None or a.key_tokens is None:
        return []
    n = a.X_kv.shape[-2]
    lines = [
        "# Cross-attention: queries come from X, keys and values from X_kv (an encoder's output).",
        "key_tokens: [" + ", ".join(_quote(t) for t in a.key_tokens) + "]   # one per key",
    ]
    labels = [printable(t) for t in a.key_tokens]
    if spec.batch is None:
        lines.append(
            f"X_kv:   # [seq_k, d_model_kv] = [{n}, {spec.d_model}]: one encoder state per row"
        )
        return lines + _rows(a.X_kv, labels, "  ")
    lines.append(f"X_kv:   # [batch, seq_k, d_model_kv] = [{spec.batch}, {n}, {spec.d_model}]")
    for b in range(spec.batch):
        lines.append(f"  # batch item {b}")
        for k, row in enumerate(_rows(a.X_kv[b], labels, "    ")):
            lines.append(("  - " + row[4:]) if k == 0 else row)
    return lines


def _variant_lines(spec: NewFixture, a: NewArrays) -> list[str]:
    """The modern variants asked for, one key each, with a comment saying what it does."""
    lines: list[str] = []
    if spec.rope is not None:
        lines += _rope_lines(spec)
    if a.q_weight is not None and a.k_weight is not None:
        lines += [
            "qk_norm:   # RMSNorm of Q and K before RoPE: x / sqrt(mean(x^2) + eps) * weight",
            "  # weights of length d_k: each head is normalised on its own (Qwen3, Gemma 3)",
            "  q_weight: [" + ", ".join(_number(x) for x in a.q_weight) + "]",
            "  k_weight: [" + ", ".join(_number(x) for x in a.k_weight) + "]",
            "  eps: 1.0e-06",
        ]
    if spec.alibi:
        lines.append(
            "alibi: true   # ALiBi: bias -slope_h * |pos_q - pos_k| added to the scores, slopes "
            "of Press et al."
        )
    if spec.window is not None:
        lines.append(
            f"window: {spec.window}   # sliding window: a query sees keys with 0 <= pos_q - pos_k "
            f"< {spec.window}, itself included (HF/Mistral; FlashAttention window_size="
            f"({spec.window - 1}, 0))"
        )
    if spec.softcap is not None:
        cap = f"{spec.softcap:g}"
        lines.append(
            f"softcap: {_number(spec.softcap)}   # capped = {cap} * tanh(scaled / {cap}), "
            "before the mask (Gemma 2)"
        )
    if a.sinks is not None:
        lines.append(
            "sinks: [" + ", ".join(_number(x) for x in a.sinks) + "]   # one logit per query "
            "head, joined to each softmax row and dropped (gpt-oss): rows sum to less than 1"
        )
    if spec.mask_value is not None:
        what = (
            "the default: -inf where a key may not be attended"
            if spec.mask_value == -math.inf
            else "fills where a key may not be attended, instead of -inf: a finite sentinel "
            "can leak weight (attn warns)"
        )
        lines.append(f"mask_value: {_number(spec.mask_value)}   # {what}")
    return lines


def _rope_lines(spec: NewFixture) -> list[str]:
    pairs = ("dimension i pairs with i + dims/2 (HF rotate_half, GPT-NeoX)" if spec.rope == "half"
             else "dimension 2i pairs with 2i+1 (Meta's llama, GPT-J)")  # fmt: skip
    lines = [
        "rope:   # rotary position embedding of Q and K (not V), after the projection",
        f"  layout: {spec.rope}   # {pairs}",
        f"  base: {_number(10000.0 if spec.rope_base is None else spec.rope_base)}"
        "   # angle = position * base^(-2i/dims)",
    ]
    dims = spec.d_k if spec.rope_dims is None else spec.rope_dims
    rest = "" if dims == spec.d_k else f"; the other {spec.d_k - dims} pass through"
    lines.append(f"  dims: {dims}   # the first {dims} of d_k = {spec.d_k} dimensions rotate{rest}")
    return lines


def _shell_word(name: str) -> str:
    """A file name as one word a shell reads back (quoted when needed), printable."""
    import shlex

    return shlex.quote(printable(name))


def _rows(matrix: np.ndarray, labels: Sequence[str] | None, indent: str) -> list[str]:
    out = []
    for i, row in enumerate(matrix):
        text = f"{indent}- [" + ", ".join(_number(x) for x in row) + "]"
        if labels is not None:
            text += f"   # {labels[i]}"
        out.append(text)
    return out


def _number(x: float) -> str:
    return repr(float(x) + 0.0)  # + 0.0 turns -0.0 into 0.0


def _quote(text: str) -> str:
    """A YAML double-quoted scalar: what is not printable as YAML escapes (``\\x07``)."""
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        else:
            code = ord(c)
            out.append(
                f"\\x{code:02x}" if code < 0x100
                else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
            )  # fmt: skip
    return '"' + "".join(out) + '"'
