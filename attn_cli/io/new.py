"""``attn new``: a random, commented fixture to start from (tokens, X, W_Q, W_K, W_V)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attn_cli.core.chain import REGISTRY  # with the variants attn ships registered
from attn_cli.core.variant import NewOption, Variant, exact
from attn_cli.errors import printable

WORDS = (
    "The",
    "cat",
    "sat",
    "on",
    "my",
    "warm",
    "mat",
    "and",
    "then",
    "slowly",
    "fell",
    "fast",
    "asleep",
    "near",
    "an",
    "open",
    "window",
)
FIXTURE_SUFFIXES = (".yaml", ".yml", ".npz")
MAX_SEQ = 256
# cross-attention (X_kv, an encoder's output) is no plug-in: its flag, and its place among theirs
CROSS = NewOption(
    "cross",
    int,
    "Cross-attention: keys and values from X_kv, N encoder tokens.",
    metavar="N",
    min=1,
    max=MAX_SEQ,
)
CROSS_RANK = 70


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
    # the modern variants' flags given, by name (docs/fixture-format.md, "Modern attention
    # variants"): each variant's new_options, and "cross" (X_kv of this many tokens)
    options: Mapping[str, Any] = field(default_factory=dict)


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
    # the variants that are on, with their .npz members (their random numbers), as new_order
    # places them in the fixture
    variants: tuple[tuple[Variant, dict[str, Any]], ...] = ()


def new_variants() -> list[Variant]:
    """The variants ``attn new`` writes, in its order (``new_rank``): flags, checks, draws."""
    return sorted((v for v in REGISTRY.values() if v.new_options), key=lambda v: v.new_rank)


def listed() -> list[tuple[str, tuple[NewOption, ...]]]:
    """The fixture key and the flags of each variant ``attn new`` writes, X_kv's among them, as
    it lists them: in its help, in the comment naming the optional keys."""
    ranked = [(v.new_rank, v.name, v.new_options) for v in new_variants()]
    ranked.append((CROSS_RANK, "X_kv", (CROSS,)))
    return [(key, options) for _, key, options in sorted(ranked, key=lambda r: r[0])]


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
    cross = spec.options.get(CROSS.name)
    if cross is not None:
        X_kv = rng.normal(size=(*x_shape[:-2], cross, spec.d_model)).round(1)
        key_tokens = tuple(tokens_for(cross))
    drawn = [(v, v.new_members(spec, rng)) for v in new_variants()]  # in new_rank order
    on = sorted(((v, m) for v, m in drawn if m), key=lambda vm: vm[0].new_order)
    return NewArrays(tokens, X, W_Q, W_K, W_V, W_O, X_kv, key_tokens, tuple(on))


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
        f"description: {_quote(_description(spec, a))}",
        "# One token per position (the row and column labels of every table).",
        "tokens: [" + ", ".join(_quote(t) for t in a.tokens) + "]",
        *_x_lines(spec, a),
        *_x_kv_lines(spec, a),
    ]
    roles = (
        "queries: what each token looks for",
        "keys: the labels each token offers",
        "values: the content each token hands back",
    )
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
        "description": np.array(_description(spec, a)),
        "tokens": np.array(a.tokens, dtype=str),
        "X": a.X,
        "W_Q": a.W_Q,
        "W_K": a.W_K,
        "W_V": a.W_V,
        "heads": np.array(spec.heads),
    }
    if spec.kv_heads is not None and spec.kv_heads != spec.heads:
        out["kv_heads"] = np.array(spec.kv_heads)
    if a.W_O is not None:
        out["W_O"] = a.W_O
    if spec.causal:
        out["causal"] = np.array(True)
    out.update(_variant_members(a))
    return out


def _variant_members(a: NewArrays) -> dict[str, np.ndarray]:
    """The variants as whole-fixture .npz members: a mapping's entries as ``KEY.SUBKEY``."""
    out: dict[str, np.ndarray] = {}
    if a.X_kv is not None and a.key_tokens is not None:
        out["X_kv"] = a.X_kv
        out["key_tokens"] = np.array(a.key_tokens, dtype=str)
    for _, members in a.variants:
        out.update(members)
    return out


def _name(spec: NewFixture) -> str:
    return f"random fixture (seed {spec.seed})"


def _description(spec: NewFixture, a: NewArrays) -> str:
    kv = f" ({spec.kv_heads} key/value)" if spec.kv_heads not in (None, spec.heads) else ""
    return (
        f"Random: seq {spec.seq}, d_model {spec.d_model}, {spec.heads} heads{kv} of d_k "
        f"{spec.d_k}"
        + (f", batch {spec.batch}" if spec.batch else "")
        + (", causal" if spec.causal else "")
        + (", W_O" if spec.w_o else "")
        + "".join(f", {v}" for v in _variant_names(spec, a))
    )


def _variant_names(spec: NewFixture, a: NewArrays) -> list[str]:
    """The variants a fixture has, as the description lists them."""
    cross = spec.options.get(CROSS.name)
    names = [] if cross is None else [f"cross-attention to {cross} tokens"]
    return names + [v.new_words(spec, members) for v, members in a.variants]


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
    return lines + _batch_rows(a.X, labels)


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
    rest = ", ".join(
        k for k, on in (("kv_heads", kv_heads == spec.heads), ("W_O and b_O", a.W_O is None)) if on
    )
    variants = ", ".join(key for key, _ in listed())
    lines.append(
        f"# Optional: {rest + ', ' if rest else ''}mask, bias, lengths, and the variants "
        f"{variants} (see docs/fixture-format.md)."
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
    return lines + _batch_rows(a.X_kv, labels)


def _batch_rows(x: np.ndarray, labels: list[str]) -> list[str]:
    """A batched array's items as a YAML list, each a commented block of labelled rows."""
    lines = []
    for b, item in enumerate(x):
        lines.append(f"  # batch item {b}")
        for n, row in enumerate(_rows(item, labels, "    ")):
            lines.append(("  - " + row[4:]) if n == 0 else row)
    return lines


def _variant_lines(spec: NewFixture, a: NewArrays) -> list[str]:
    """The modern variants asked for, one key each, with a comment saying what it does."""
    return [line for v, members in a.variants for line in v.new_lines(spec, members)]


def _shell_word(name: str) -> str:
    """A file name as one word a shell reads back (quoted when needed), printable."""
    import shlex

    return shlex.quote(printable(name))


def _rows(matrix: np.ndarray, labels: Sequence[str] | None, indent: str) -> list[str]:
    out = []
    for i, row in enumerate(matrix):
        text = f"{indent}- [" + ", ".join(exact(x) for x in row) + "]"
        if labels is not None:
            text += f"   # {labels[i]}"
        out.append(text)
    return out


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
                f"\\x{code:02x}"
                if code < 0x100
                else f"\\u{code:04x}"
                if code < 0x10000
                else f"\\U{code:08x}"
            )
    return '"' + "".join(out) + '"'
