"""The model view as one self-contained page: ``attn import DIR --text ... --layer all -f html``
(issues 25 and 26; docs/html.md "The model view").

Every layer × head is a thumbnail: a small table of its attention weights (query rows, key
columns; pooled as the terminal's model view pools when the sentence is long), shaded viridis
from 0 to 1, with its head-type hint (present/modelview.py, core/headtypes.py) in English and
Chinese. Clicking one opens that layer's whole trace page (``trace_page``, the same page.js) in
an ``<iframe srcdoc sandbox="allow-scripts">`` at its softmax stage with the head chosen. Each
layer's page is made while the walk runs (io/forward.py ``each_trace``) and kept gzipped, up to
a byte cap; the page says which layers it left out and which thumbnails it pooled or elided.

The template is the trace page's (page.html: its Content-Security-Policy, themes, language
switch); the policy admits this page's script and page.js by hash, since a srcdoc frame keeps
its parent's policy beside its own.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli._version import __version__
from attn_cli.errors import printable
from attn_cli.present.html_page import (
    CHROME,
    LANG_TAGS,
    MAX_ENTRIES,
    MAX_WORKED,
    asset,
    bilingual,
    chrome_buttons,
    esc,
    page_theme,
    script_json,
    split,
    trace_page,
)
from attn_cli.present.i18n import Lang
from attn_cli.present.modelview import HINTS, MAX_SIDE, MIN_SIDE, TEXTS, ModelView, pooled
from attn_cli.present.options import RenderOptions
from attn_cli.present.text import format_number, short_label

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace

MODEL_CELLS = 100_000  # thumbnail cells in all: past it maps pool smaller, then layers elide
LAYER_BYTES = 16_000_000  # the layers' trace pages in all, gzipped; past it, left out (said)
LAYER_WORKED = MAX_WORKED  # derivations a layer's page embeds: every head's worked cells ...
LAYER_ENTRIES = MAX_ENTRIES  # ... and Q, K, V, concat, projected entries, as a trace page
PRECISION = 4
OPEN_STAGE = "softmax"

WORDS: dict[Lang, dict[str, Any]] = {
    "en": {
        **CHROME["en"],
        "back": "← model view",
        "open": "open its trace",
        "hint": "Hover a map to read its weights; click it to open that layer's whole trace "
        "at its softmax, with the head chosen (→ / ← step its stages); ← model view comes back.",
        "layer_title": "layer {layer} · head {head}",
        "status": "layer {layer} · head {head} · query {q} → key {k}: {w}",
        "pooled_status": "layer {layer} · head {head} · queries {q} → keys {k}: {w} "
        "(mean over the queries of the weight summed over the keys)",
        "kind": {
            "previous": "previous-token head",
            "first": "first-token / sink head",
            "self": "diagonal head",
            "mixed": "no single kind",
        },
        "elided_layers": "{shown} of {n} layers shown (layers {first}–{last} elided: "
        "{cells:,} cells would pass the page's cap of {cap:,}); "
        "attn import --layer all prints every one.",
        "left_out": "Layers {layers} have no trace on this page (its cap of {cap} MB for the "
        "layers' pages); open one with: attn import {ckpt} --text … --layer L -o L.npz, "
        "then attn trace L.npz -f html.",
        "no_trace": "Layer {layer}'s trace is not on this page (the cap of {cap} MB): "
        "attn import {ckpt} --text … --layer {layer} -o layer{layer}.npz, then "
        "attn trace layer{layer}.npz -f html.",
    },
    "zh": {
        **CHROME["zh"],
        "back": "← 模型总览",
        "open": "打开它的追踪",
        "hint": "鼠标悬停在一幅图上可读出权重；点击它，打开这一层完整的追踪，"
        "停在 softmax 这一步，并选中这个头（→ / ← 切换步骤）；点 ← 模型总览返回。",
        "layer_title": "第 {layer} 层 · 头 {head}",
        "status": "第 {layer} 层 · 头 {head} · 查询 {q} → 键 {k}：{w}",
        "pooled_status": "第 {layer} 层 · 头 {head} · 查询 {q} → 键 {k}：{w}"
        "（对这些键的权重求和，再对这些查询取平均）",
        "kind": {
            "previous": "前一词元头",
            "first": "首词元 / 汇聚头",
            "self": "对角头",
            "mixed": "没有单一的模式",
        },
        "elided_layers": "显示 {n} 层中的 {shown} 层（省略了第 {first}–{last} 层：{cells:,} "
        "个单元格会超过页面上限 {cap:,}）；attn import --layer all 会全部打印。",
        "left_out": "第 {layers} 层的追踪不在这个页面上（各层页面合计上限 {cap} MB）；"
        "要打开其中一层：attn import {ckpt} --text … --layer L -o L.npz，"
        "再 attn trace L.npz -f html。",
        "no_trace": "第 {layer} 层的追踪不在这个页面上（上限 {cap} MB）："
        "attn import {ckpt} --text … --layer {layer} -o layer{layer}.npz，再 "
        "attn trace layer{layer}.npz -f html。",
    },
}

_BODY_TAG = re.compile(r"<body [^>]*>")


@dataclass
class LayerPages:
    """The walk's ``each_trace`` hook: each layer's trace page, made as its trace is, kept
    gzipped in base64 (a page of numbers shrinks about fourfold; the model page's script unzips
    it with the browser's DecompressionStream), with its ``<body>`` tag, which the script writes
    anew (the language, the theme, the stage and head to open at); up to ``cap`` bytes in all."""

    options: RenderOptions = field(default_factory=RenderOptions)
    theme: str = "auto"
    cap: int = LAYER_BYTES
    pages: dict[int, tuple[str, str]] = field(default_factory=dict)  # (gzip base64, body tag)
    left_out: list[int] = field(default_factory=list)
    size: int = 0

    def __call__(self, layer: int, trace: Trace) -> None:
        if self.left_out:  # once one did not fit, the later ones (as large) do not either
            self.left_out.append(layer)
            return
        page = trace_page(
            trace, self.options, self.theme, max_worked=LAYER_WORKED, max_entries=LAYER_ENTRIES
        )
        tag = _BODY_TAG.search(page)
        assert tag is not None  # page.html's own, the first <body (token text is escaped)
        packed = base64.b64encode(gzip.compress(page.encode("utf-8"), 6, mtime=0)).decode()
        if self.size + len(packed) > self.cap:
            self.left_out.append(layer)
            return
        self.pages[layer] = (packed, tag.group(0))
        self.size += len(packed)


def layout(layers: int, heads: int, T: int, cap: int | None = None) -> tuple[int, list[int]]:
    """(side of a map, the layers shown): maps pooled to fit ``cap`` cells (MODEL_CELLS), down
    to MIN_SIDE; past that the middle layers are elided (the first and last kept)."""
    cap = MODEL_CELLS if cap is None else cap
    side = min(T, MAX_SIDE, max(MIN_SIDE, math.isqrt(cap // max(1, layers * heads))))
    fit = max(2, cap // max(1, heads * side * side))
    if fit >= layers:
        return side, list(range(layers))
    first = (fit + 1) // 2
    return side, [*range(first), *range(layers - (fit - first), layers)]


def model_page(
    view: ModelView,
    pages: LayerPages,
    checkpoint: str,
    lang: Lang = "en",
    theme: str = "auto",
    cells: int = MODEL_CELLS,
) -> str:
    """The whole page: the template filled with the thumbnails (at most ``cells`` cells), the
    layers' pages and the texts."""
    script = asset("model.js")
    hashes = [_digest(script), _digest(asset("page.js"))]
    from attn_cli.present.palette import VIRIDIS

    fill = {
        "LANG_TAG": LANG_TAGS[lang],
        "LANG": lang,
        "THEME": page_theme(theme),
        "SCRIPT_HASH": "' '".join(hashes),  # inside the slot's quotes: 'sha256-A' 'sha256-B'
        "GENERATOR": f"attn {__version__}",
        "TITLE": esc(f"{view.family}: model view"),
        "VIRIDIS": ", ".join(VIRIDIS),
        "BODY": _Body(view, pages, checkpoint, lang, cells).markup(),
        "DATA": _data(view, pages, checkpoint, cells),
        "SCRIPT": script,
    }
    return "".join(fill.get(part, part) for part in split(asset("page.html")))


def _digest(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode()


def _note(text: Any) -> str:
    return f'<p class="note">{bilingual(text)}</p>'


STYLE = """<style>
.model { padding: .6em 1.2em 2em; }
.model .grid { display: grid; gap: .5em .6em; align-items: start; justify-content: start;
  margin: .8em 0; }
.model .lh { font: 600 13px ui-monospace, monospace; color: var(--dim); align-self: center; }
.model .hh { font: 13px ui-monospace, monospace; color: var(--dim); text-align: center; }
figure.thumb { margin: 0; cursor: pointer; text-align: center; border: 2px solid transparent;
  border-radius: 3px; padding: 1px; }
figure.thumb:hover, figure.thumb:focus { border-color: var(--sel); outline: none; }
figure.thumb table { border-collapse: collapse; margin: 0 auto; }
figure.thumb td { padding: 0; border: 0; width: var(--px); height: var(--px); }
figure.thumb figcaption { font: 11px ui-monospace, monospace; color: var(--dim);
  min-height: 1.3em; }
.model button.nomap { justify-self: start; align-self: center; }
.model .status { font-family: ui-monospace, monospace; min-height: 1.5em; color: var(--accent); }
.model .legend .bar { display: inline-block; width: 10em; height: .8em; vertical-align: middle;
  background: linear-gradient(to right, {{VIRIDIS}}); }
.layer-view { padding: .4em 1em; }
.layer-view iframe { width: 100%; height: calc(100vh - 7em); border: 1px solid var(--line);
  background: var(--bg); }
.layer-view h2 { display: inline-block; margin: 0 1em; font: 600 1.2em ui-monospace, monospace;
  color: var(--accent); }
</style>"""


@dataclass
class _Body:
    """The page's markup: the bar, the notes, the grid of thumbnails, the layer panel."""

    view: ModelView
    pages: LayerPages
    checkpoint: str
    lang: Lang
    cap: int = MODEL_CELLS

    def markup(self) -> str:
        from attn_cli.core.headtypes import THRESHOLD
        from attn_cli.present.palette import VIRIDIS

        v = self.view
        heads = _heads(v)
        T = len(v.tokens)
        side, shown = layout(len(v.weights), heads, T, self.cap)
        out = [STYLE.replace("{{VIRIDIS}}", ", ".join(VIRIDIS)), '<header class="top">']
        out.append(f'<h1>{esc(v.family)}</h1><div class="controls">')
        out += chrome_buttons(self.lang)
        out.append('</div></header><div class="model" data-role="model">')

        def pooled_note(lang: Lang) -> str:
            return TEXTS[lang]["pooled"].format(side=side) if side < T else ""

        out.append(
            "<h2>"
            + bilingual(
                lambda lang: TEXTS[lang]["title"].format(
                    family=v.family,
                    layers=len(v.weights),
                    heads=heads,
                    T=T,
                    pooled=pooled_note(lang),
                )
            )
            + "</h2>"
        )
        tokens = " ".join(f"<code>{esc(short_label(t))}</code>" for t in v.tokens)  # data: full
        out.append(f"<p>{bilingual(lambda lang: TEXTS[lang]['tokens'] + ':')} {tokens}</p>")
        out.append(f'<p class="hint">{bilingual(_word("hint"))}</p>')
        out += self._notes(shown, heads, side)
        out.append(self._grid(shown, heads, side))
        out.append('<p class="status" data-role="status"></p>')
        out.append(
            '<p class="legend"><span class="bar"></span> 0 → 1 · '
            + bilingual(lambda lang: TEXTS[lang]["legend"].format(t=THRESHOLD))
            + "</p></div>"
        )
        out.append('<section class="layer-view" data-role="layer" hidden>')
        out.append(f'<button type="button" data-role="back">{bilingual(_word("back"))}</button>')
        out.append('<h2 data-role="layer-title"></h2>')
        out.append('<p class="note" data-role="no-trace" hidden></p>')
        out.append('<div data-role="frame"></div></section>')
        return "\n".join(out)

    def _notes(self, shown: list[int], heads: int, side: int) -> list[str]:
        out = []
        n = len(self.view.weights)
        if len(shown) < n:
            gone = sorted(set(range(n)) - set(shown))
            out.append(
                _note(
                    lambda lang: WORDS[lang]["elided_layers"].format(
                        shown=len(shown),
                        n=n,
                        first=gone[0],
                        last=gone[-1],
                        cells=n * heads * side * side,
                        cap=self.cap,
                    )
                )
            )
        left = self.pages.left_out
        if left:
            layers = f"{left[0]}–{left[-1]}" if len(left) > 1 else str(left[0])
            out.append(
                _note(
                    lambda lang: WORDS[lang]["left_out"].format(
                        layers=layers, cap=f"{self.pages.cap / 1e6:g}", ckpt=self.checkpoint
                    )
                )
            )
        return out

    def _grid(self, shown: list[int], heads: int, side: int) -> str:
        columns = f"auto repeat({heads}, max-content)"
        out = [f'<div class="grid" style="grid-template-columns: {columns}">']
        out.append("<div></div>")
        out += [f'<div class="hh">h{h}</div>' for h in range(heads)]
        previous = -1
        for layer in shown:
            if layer != previous + 1:
                out.append(f'<div class="lh">⋮</div><div style="grid-column: span {heads}"></div>')
            previous = layer
            out.append(f'<div class="lh">L{layer}</div>')
            if self.view.weights[layer].shape[0] == 0:  # linear attention (Gated DeltaNet)
                words = bilingual(lambda lang: TEXTS[lang]["no_map"] + " · " + WORDS[lang]["open"])
                out.append(
                    f'<button type="button" class="nomap" data-open-layer="{layer}" '
                    f'style="grid-column: span {heads}">{words}</button>'
                )
                continue
            for h in range(heads):
                out.append(self._thumb(layer, h, side))
        out.append("</div>")
        return "".join(out)

    def _thumb(self, layer: int, h: int, side: int) -> str:
        """One head's map: a cell a (pooled) query × key, its weight in ``data-shown``."""
        from attn_cli.present.palette import viridis

        m = pooled(self.view.weights[layer][h], side)  # (side, side) or (T, T)
        px = max(3, min(12, 96 // max(1, m.shape[0])))
        kind = self.view.types[layer][h].kind
        rows = []
        for i, row in enumerate(m):
            cells = "".join(
                f'<td data-index="{i},{j}" data-shown="{format_number(float(w), PRECISION)}" '
                f'style="background:{viridis(min(1.0, max(0.0, float(w))))}"></td>'
                for j, w in enumerate(row)
            )
            rows.append(f"<tr>{cells}</tr>")
        hint = bilingual(lambda lang: HINTS[lang][kind])
        return (
            f'<figure class="thumb" data-layer="{layer}" data-head="{h}" data-kind="{kind}" '
            f'tabindex="0" role="button"><table style="--px:{px}px">{"".join(rows)}</table>'
            f"<figcaption>{hint}</figcaption></figure>"
        )


def _heads(view: ModelView) -> int:
    """Heads of a softmax layer (a linear-attention layer has none: no map to draw)."""
    return max((w.shape[0] for w in view.weights), default=0)


def _word(key: str) -> Any:
    return lambda lang: WORDS[lang][key]


def _data(view: ModelView, pages: LayerPages, checkpoint: str, cells: int) -> str:
    """The page's JSON: tokens, the pooling edges, the layers' pages and the words."""
    from attn_cli.io.trace_json import json_text

    T = len(view.tokens)
    heads = _heads(view)
    side, _ = layout(len(view.weights), heads, T, cells)
    edges = np.linspace(0, T, side + 1).round().astype(int).tolist() if side < T else None
    doc = {
        "tokens": [printable(t) for t in view.tokens],
        "edges": edges,
        "open_stage": OPEN_STAGE,
        "pages": {str(k): list(v) for k, v in pages.pages.items()},
        "cap_mb": f"{pages.cap / 1e6:g}",
        "checkpoint": checkpoint,
        "words": WORDS,
        "lang_tags": LANG_TAGS,
    }
    return script_json(json_text(doc))
