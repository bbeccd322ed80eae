"""``attn new``: a random, commented fixture to start from (tokens, X, W_Q, W_K, W_V)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

WORDS = (
    "The", "cat", "sat", "on", "my", "warm", "mat", "and", "then", "slowly",
    "fell", "fast", "asleep", "near", "an", "open", "window",
)  # fmt: skip
FIXTURE_SUFFIXES = (".yaml", ".yml")


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


def tokens_for(seq: int) -> list[str]:
    """``seq`` distinct tokens: a short sentence, then tok<i>."""
    return [WORDS[i] if i < len(WORDS) else f"tok{i}" for i in range(seq)]


def new_fixture(spec: NewFixture) -> str:
    """The YAML text of a random fixture with comments on every key and row."""
    rng = np.random.default_rng(spec.seed)
    tokens = tokens_for(spec.seq)
    width = spec.heads * spec.d_k
    x_shape = (
        (spec.seq, spec.d_model) if spec.batch is None else (spec.batch, spec.seq, spec.d_model)
    )
    X = rng.normal(size=x_shape).round(1)  # embeddings of about unit size, one decimal
    # weights of size 1/sqrt(d_model), so Q and K entries stay about unit size
    W = [
        (rng.normal(size=(spec.d_model, width)) / math.sqrt(spec.d_model)).round(2)
        for _ in range(3)
    ]
    blocks = ", ".join(
        f"head {h} owns columns {h * spec.d_k}-{(h + 1) * spec.d_k - 1}" for h in range(spec.heads)
    )
    lines = [
        f"# A random fixture made by `attn new` (seed {spec.seed}). Edit any number and run:",
        "#   attn trace THIS_FILE.yaml --explain",
        "# Every key is described in docs/fixture-format.md.",
        f"name: random fixture (seed {spec.seed})",
        "description: "
        + _quote(
            f"Random: seq {spec.seq}, d_model {spec.d_model}, {spec.heads} heads of d_k "
            f"{spec.d_k}"
            + (f", batch {spec.batch}" if spec.batch else "")
            + (", causal" if spec.causal else "")
        ),
        "# One token per position (the row and column labels of every table).",
        "tokens: [" + ", ".join(_quote(t) for t in tokens) + "]",
    ]
    if spec.batch is None:
        lines.append(f"X:   # [seq, d_model] = [{spec.seq}, {spec.d_model}]: one embedding per row")
        lines += _rows(X, tokens, "  ")
    else:
        lines.append(
            f"X:   # [batch, seq, d_model] = [{spec.batch}, {spec.seq}, {spec.d_model}]; "
            "the tokens label every item"
        )
        for b in range(spec.batch):
            lines.append(f"  # batch item {b}")
            for n, row in enumerate(_rows(X[b], tokens, "    ")):
                lines.append(("  - " + row[4:]) if n == 0 else row)
    for name, w, role in zip(
        ("W_Q", "W_K", "W_V"),
        W,
        ("queries: what each token looks for", "keys: the labels each token offers",
         "values: the content each token hands back"),
        strict=True,
    ):  # fmt: skip
        axis = "heads*d_v" if name == "W_V" else "heads*d_k"
        lines.append(
            f"{name}: # [d_model, {axis}] = [{spec.d_model}, {width}]; "
            f"{name[-1]} = X @ {name}, the {role}"
        )
        if spec.heads > 1:
            lines.append(f"  # {blocks}")
        lines += _rows(w, None, "  ")
    lines.append(f"heads: {spec.heads}")
    if spec.causal:
        lines.append("causal: true   # each token sees only itself and earlier tokens")
    lines.append(
        f"# scale omitted: 1/sqrt(d_k) = {1 / math.sqrt(spec.d_k):.6g}; `scale: 1` turns it off."
    )
    lines.append(
        "# Optional: kv_heads, W_O and b_O, mask, bias, lengths (see docs/fixture-format.md)."
    )
    return "\n".join(lines) + "\n"


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
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
