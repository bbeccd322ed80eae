"""The model view: every layer × head of a checkpoint as a small map of its attention weights.

One glyph per cell (query rows, key columns), shaded by the weight; a map wider than the room
for it is pooled (a cell is the mean over its queries of the weight summed over its keys, so a
cell still holds a share of a row's attention, 0 to 1). Each head is named by the kind its
weights show (``core/headtypes.py``), in English or Chinese. Plain text: no Rich, no colour.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attn_cli.core.headtypes import KINDS, THRESHOLD, HeadType, head_types
from attn_cli.present.i18n import Lang

SHADES = " ░▒▓█"
BOUNDS = (0.05, 0.2, 0.45, 0.7)  # a weight below BOUNDS[i] gets SHADES[i]; above all, █
MIN_SIDE = 4  # a map of fewer cells a side says nothing; heads wrap to more rows instead
MAX_SIDE = 24

HINTS: dict[Lang, dict[str, str]] = {
    "en": {"previous": "prev", "first": "first", "self": "self", "mixed": ""},
    "zh": {"previous": "前词", "first": "首词", "self": "自身", "mixed": ""},
}
TEXTS: dict[Lang, dict[str, str]] = {
    "en": {
        "title": "model view: {family}, {layers} layers × {heads} heads, {T} tokens "
        "(each map: query rows × key columns{pooled})",
        "pooled": ", pooled to {side} × {side}",
        "tokens": "tokens",
        "layer": "L",
        "head": "h",
        "legend": "prev = previous-token head (each token attends to the one before it); "
        "first = first-token / sink head (attention parked on token 0); "
        "self = diagonal head (each token attends to itself); unnamed: no kind "
        "reaches {t:g} of the weight on average.",
        "shades": "shade: ' ' < 0.05 ≤ ░ < 0.2 ≤ ▒ < 0.45 ≤ ▓ < 0.7 ≤ █",
        "no_map": "linear attention: no softmax map",
    },
    "zh": {
        "title": "模型总览：{family}，{layers} 层 × {heads} 个头，{T} 个词元"
        "（每幅图：行为查询，列为键{pooled}）",
        "pooled": "，汇聚为 {side} × {side}",
        "tokens": "词元",
        "layer": "L",
        "head": "h",
        "legend": "前词 = 前一词元头（每个词元关注它前面的一个）；首词 = 首词元 / 汇聚头"
        "（注意力停在第 0 个词元）；自身 = 对角头（每个词元关注自己）；"
        "未命名：没有哪种模式平均达到 {t:g} 的权重。",
        "shades": "深浅：' ' < 0.05 ≤ ░ < 0.2 ≤ ▒ < 0.45 ≤ ▓ < 0.7 ≤ █",
        "no_map": "线性注意力：没有 softmax 权重图",
    },
}


@dataclass(frozen=True)
class ModelView:
    """What the view shows: the tokens and each layer's weights [heads, T, T] and head kinds."""

    family: str
    tokens: tuple[str, ...]
    weights: tuple[np.ndarray[Any, Any], ...]
    types: tuple[tuple[HeadType, ...], ...]

    @classmethod
    def of(cls, family: str, tokens: Sequence[str], weights: Sequence[Any]) -> ModelView:
        arrays = tuple(np.asarray(w, dtype=np.float64) for w in weights)
        return cls(family, tuple(tokens), arrays, tuple(tuple(head_types(w)) for w in arrays))


def width_of(text: str) -> int:
    """Columns a text takes in a terminal (a CJK character takes two)."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _pad(text: str, width: int) -> str:
    while width_of(text) > width:
        text = text[:-1]
    return text + " " * (width - width_of(text))


def shade(w: float) -> str:
    for glyph, bound in zip(SHADES, BOUNDS, strict=False):
        if w < bound:
            return glyph
    return SHADES[-1]


def pooled(A: np.ndarray[Any, Any], side: int) -> np.ndarray[Any, Any]:
    """[T, T] -> [side, side]: mean over each block of queries of the sum over its keys."""
    T = A.shape[0]
    if side >= T:
        return A
    edges = np.linspace(0, T, side + 1).round().astype(int)
    out = np.empty((side, side))
    for r in range(side):
        rows = A[edges[r] : edges[r + 1]]  # (block of queries, T)
        for c in range(side):
            out[r, c] = rows[:, edges[c] : edges[c + 1]].sum(axis=1).mean()
    return out


def _heads(view: ModelView) -> int:
    """Heads of a softmax layer (a linear-attention layer has none: no map to draw)."""
    return max((w.shape[0] for w in view.weights), default=0)


def _layout(view: ModelView, width: int) -> tuple[int, int, int]:
    """(side of a map, heads per band, label width) for ``width`` columns."""
    T = len(view.tokens)
    heads = _heads(view)
    label = len(f"L{len(view.weights) - 1}") + 1
    room = max(width - label, MIN_SIDE + 1)
    side = min(T, MAX_SIDE, max(MIN_SIDE, room // max(heads, 1) - 1))
    column = max(side, 5) + 1  # a hint label ("first", 前词) fits under the map
    return side, max(1, min(heads, room // column)), label


def render_text(view: ModelView, width: int, lang: Lang = "en") -> str:
    """The model view at ``width`` columns: one band of maps per layer (more if heads wrap)."""
    text, hints = TEXTS[lang], HINTS[lang]
    side, per_band, label = _layout(view, width)
    T, heads = len(view.tokens), _heads(view)
    column = max(side, 5) + 1
    pooled_note = text["pooled"].format(side=side) if side < T else ""
    title = text["title"].format(
        family=view.family, layers=len(view.weights), heads=heads, T=T, pooled=pooled_note
    )
    lines = _wrap(title, width)
    lines.append(_pad(f"{text['tokens']}: " + " ".join(view.tokens), width).rstrip())
    for start in range(0, heads, per_band):
        band = range(start, min(heads, start + per_band))
        lines.append(" " * label + "".join(_pad(f"{text['head']}{h}", column) for h in band))
        for layer, (weights, types) in enumerate(zip(view.weights, view.types, strict=True)):
            if weights.shape[0] == 0:  # Qwen3-Next's Gated DeltaNet layers
                no_map = _pad(f"{text['layer']}{layer}", label) + f"({text['no_map']})"
                lines.append(no_map if start == 0 else _pad(f"{text['layer']}{layer}", label))
                continue
            maps = [pooled(weights[h], side) for h in band]
            for r in range(min(side, T)):
                head = _pad(f"{text['layer']}{layer}", label) if r == 0 else " " * label
                row = "".join(_pad("".join(shade(w) for w in m[r]), column) for m in maps)
                lines.append((head + row).rstrip())
            named = "".join(_pad(hints[types[h].kind], column) for h in band)
            if named.strip():
                lines.append((" " * label + named).rstrip())
    lines += _wrap(text["legend"].format(t=THRESHOLD), width)
    lines.append(text["shades"])
    return "\n".join(lines) + "\n"


def _wrap(text: str, width: int) -> list[str]:
    """Words to lines of at most ``width`` columns; a word wider than that (a run of Chinese)
    is cut between characters."""
    lines: list[str] = []
    line = ""
    for word in text.split(" "):
        pieces = [word] if width_of(word) <= width else list(word)
        for n, piece in enumerate(pieces):
            joint = " " if line and n == 0 else ""
            if line and width_of(line + joint + piece) > width:
                lines.append(line)
                line, joint = "", ""
            line += joint + piece
    return [*lines, line] if line else lines


def render_json(
    view: ModelView, digits: int = 6, next_tokens: list[tuple[str, int, float]] | None = None
) -> str:
    """The model view as JSON: tokens, and per layer and head its kind, scores and weights;
    with ``next_tokens`` (token, id, probability) also the top next tokens."""
    doc: dict[str, Any] = {
        "family": view.family,
        "tokens": list(view.tokens),
        "threshold": THRESHOLD,
        "kinds": [*KINDS, "mixed"],
        "layers": [
            {
                "layer": i,
                "heads": [
                    {
                        "head": h,
                        "kind": t.kind,
                        "scores": {k: round(v, digits) for k, v in t.scores.items()},
                        "weights": np.round(w[h], digits).tolist(),
                    }
                    for h, t in enumerate(types)
                ],
            }
            for i, (w, types) in enumerate(zip(view.weights, view.types, strict=True))
        ],
    }
    if next_tokens is not None:
        doc["next_tokens"] = [
            {"token": t, "id": i, "p": round(p, digits)} for t, i, p in next_tokens
        ]
    return json.dumps(doc, ensure_ascii=False) + "\n"
