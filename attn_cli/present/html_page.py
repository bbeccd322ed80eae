"""The trace as one self-contained interactive page: ``attn trace --format html``, and a
``Trace`` in a notebook (issue 26; the contract is docs/html.md).

One template (``page.html``, with ``page.js``, shipped as package data) and the data as JSON in
a ``<script type="application/json">``, as altair and vega-embed write standalone pages: no
network, no build step. Python makes every text and number shown: the tables (formatted by
``format_number``, shaded as the terminal heatmaps shade, elided with the terminal's bounds),
the explanations (``explain_stage``) and each number's derivation (the worked cell's texts,
``cell_text``) in English and Chinese; the script only navigates and shows them.

Each number cell is ``<td data-stage=NAME data-index=I,J,...>``, the indices into that stage's
array of the JSON trace (batch and head axes included). Token text is escaped twice over: in
the markup by ``html.escape(printable(...))``, in the JSON by ``json_text`` (every
non-printable character as ``\\uXXXX``) plus ``<``, ``>``, ``&`` as ``\\u003c`` ..., and the
page's Content-Security-Policy lets only its own script (by hash) run and load nothing.
"""

from __future__ import annotations

import base64
import hashlib
import html
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli._version import __version__
from attn_cli.core.stages import SCORE_STAGES
from attn_cli.errors import printable
from attn_cli.present.i18n import Lang, axis_name, axis_title, dims_text, formula_text, label
from attn_cli.present.options import RenderOptions
from attn_cli.present.text import (
    COL_EDGE,
    COL_LIMIT,
    ELLIPSIS,
    ROW_EDGE,
    ROW_LIMIT,
    TABLE_EDGE,
    TABLE_LIMIT,
    axis_labels,
    format_number,
    header_lines,
    pick,
    pick_cols,
    pick_rows,
    shown_slices,
    slices_of,
    with_short_labels,
)

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Stage, Trace
    from attn_cli.present.explain_registry import CellText
    from attn_cli.present.worked import WorkedCell

LANGS: tuple[Lang, ...] = ("en", "zh")
LANG_TAGS = {"en": "en", "zh": "zh-Hans"}
# The page's bounds, beside the terminal's (present/text.py ROW_LIMIT ...):
PAGE_NUMBERS = 300_000  # numbers of the JSON trace embedded whole up to this many (~6 MB)
STAGE_WHOLE = 50_000  # past PAGE_NUMBERS, a stage this small is still embedded whole
ROW_WHOLE = 1_024  # past it, a bigger stage keeps its shown rows, whole up to this length
MAX_WORKED = 1_500  # worked cells (batch, head, query, key) whose derivations are embedded
MAX_CELLS = 100_000  # table cells with --full; more, and the tables elide as the terminal does
MAX_ENTRIES = 1_500  # Q, K, V, concat, projected entries whose derivations are embedded

# the projector's larger type (page.js; also the L key and the URL's #large)
LARGE_BUTTON = '<button type="button" data-role="large" aria-pressed="false">A+</button>'
# the words of the bar's buttons every page has (a trace's, a model's)
CHROME: dict[Lang, dict[str, str]] = {
    "en": {"lang_name": "English", "theme": "light / dark"},
    "zh": {"lang_name": "中文", "theme": "浅色 / 深色"},
}
WORDS: dict[Lang, dict[str, str]] = {
    "en": {
        **CHROME["en"],
        "all": "all",
        "stages": "stages",
        "about": "configuration",
        "hint": "Click or hover a number to see where it comes from. "
        "→ / Space: next stage, ← / Backspace: previous.",
        "shown": "shown:",
        "full": "full precision:",
        "no_cell": "No worked derivation for this stage's cells; its formula:",
        "elided_rows": "{shown} of {n} rows and {cols} of {m} columns shown, as in the terminal "
        "(attn trace --full shows all).",
        "elided_tables": "{shown} of {n} tables shown (attn trace --full shows all).",
        "capped_full": "--full would draw {n:,} cells, more than the page's cap of {cap:,}: "
        "elided as in the terminal.",
        "kept": "The page embeds {kept:,} of the trace's {total:,} numbers (a cap of {cap:,}): "
        "stages {names} keep only the rows shown. attn trace -f json writes them all.",
        "worked_cap": "Derivations are embedded for the first {cap:,} worked cells; "
        "the others show their stage's formula.",
        "entries_cap": "Derivations are embedded for the first {cap:,} entries of Q, K, V, "
        "concat and projected; the others show their stage's formula.",
        "legend": "low {lo} → high {hi}",
        "legend_masked": "grey: masked (may not be attended)",
        "legend_max": "*: the row's maximum",
    },
    "zh": {
        **CHROME["zh"],
        "all": "全部",
        "stages": "步骤",
        "about": "配置",
        "hint": "点击或悬停在一个数字上，查看它是怎么算出来的。"
        "→ / 空格：下一步，← / 退格：上一步。",
        "shown": "显示：",
        "full": "完整精度：",
        "no_cell": "这一步的单元格没有逐项演算；它的公式：",
        "elided_rows": "显示 {n} 行中的 {shown} 行、{m} 列中的 {cols} 列，与终端相同"
        "（attn trace --full 显示全部）。",
        "elided_tables": "显示 {n} 个表中的 {shown} 个（attn trace --full 显示全部）。",
        "capped_full": "--full 要画 {n:,} 个单元格，超过页面上限 {cap:,}：按终端的方式省略。",
        "kept": "页面嵌入了这次追踪 {total:,} 个数中的 {kept:,} 个（上限 {cap:,}）：步骤 {names} "
        "只保留显示出来的行。attn trace -f json 会写出全部数字。",
        "worked_cap": "只为前 {cap:,} 个演算单元格嵌入了推导；其余的显示这一步的公式。",
        "entries_cap": "只为 Q、K、V、concat 和 projected 的前 {cap:,} 个数嵌入了推导；"
        "其余的显示这一步的公式。",
        "legend": "低 {lo} → 高 {hi}",
        "legend_masked": "灰色：被遮盖（不允许看）",
        "legend_max": "*：这一行的最大值",
    },
}


def page_theme(theme: str) -> str:
    """The page's first theme: light, dark, or auto (the system's, prefers-color-scheme)."""
    return theme if theme in ("light", "dark") else "auto"


def trace_page(
    trace: Trace,
    options: RenderOptions | None = None,
    theme: str = "auto",
    *,
    max_worked: int = MAX_WORKED,
    max_entries: int = MAX_ENTRIES,
) -> str:
    """The whole page: the template filled with the tables, the texts and the data
    (derivations embedded for up to ``max_worked`` worked cells and ``max_entries`` entries)."""
    options = options or RenderOptions()
    page = Page(
        with_short_labels(trace),
        options,
        max_worked=max_worked,
        max_entries=max_entries,
        whole_text=trace,
    )
    page.plan()
    body = page.body()
    data = page.data_text()
    title = esc(trace.inputs.name or label(options.lang, "trace_title"))
    return filled(options.lang, theme, title, body, data)


def filled(lang: Lang, theme: str, title: str, body: str, data: str) -> str:
    """The template filled: its CSS, its script (by hash), a page's ``title`` (escaped), body
    and data (``<script type="application/json">``'s text)."""
    from attn_cli.present.palette import VIRIDIS

    script = asset("page.js")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    fill = {
        "LANG_TAG": LANG_TAGS[lang],
        "LANG": lang,
        "THEME": page_theme(theme),
        "SCRIPT_HASH": f"sha256-{digest}",
        "GENERATOR": f"attn {__version__}",
        "TITLE": title,
        "VIRIDIS": ", ".join(VIRIDIS),
        "BODY": body,
        "DATA": data,
        "SCRIPT": script,
    }
    return "".join(fill.get(part, part) for part in split(asset("page.html")))


def notebook_html(trace: Trace, height: int = 640) -> str:
    """The page in an ``<iframe srcdoc>``: a notebook cell's view, its ids and script apart
    from every other cell's (two traces in one notebook do not collide)."""
    page = trace_page(trace, RenderOptions(), theme="light")
    return in_iframe(page, trace.inputs.name or "attn trace", height)


def in_iframe(page: str, name: str, height: int = 640) -> str:
    """A page in an ``<iframe srcdoc>``, named ``name``: a notebook cell's view."""
    return (
        f'<iframe srcdoc="{html.escape(page, quote=True)}" sandbox="allow-scripts" '
        f'style="width: 100%; height: {height}px; border: 1px solid #ccc" '
        f'title="{esc(name)}"></iframe>'
    )


def _register() -> None:
    """A Trace in a notebook shows this page (core/pipeline.py HTML_VIEWS)."""
    from attn_cli.core.pipeline import HTML_VIEWS

    if notebook_html not in HTML_VIEWS:
        HTML_VIEWS.append(notebook_html)


def asset(name: str) -> str:
    return resources.files("attn_cli.present").joinpath(name).read_text(encoding="utf-8")


def split(template: str) -> Iterator[str]:
    """The template's text and its ``{{NAME}}`` slots, in order (filled once, never rescanned:
    a slot's text that holds ``{{...}}`` stays as it is)."""
    rest = template
    while "{{" in rest:
        before, _, after = rest.partition("{{")
        name, _, rest = after.partition("}}")
        yield before
        yield name
    yield rest


def esc(text: str) -> str:
    """Token or fixture text for the markup: printable characters, HTML-escaped."""
    return html.escape(printable(text), quote=True)


def script_json(text: str) -> str:
    """JSON text (already free of non-printable characters, ``json_text``) made safe inside
    ``<script>``: no ``</script>``, no ``<!--``, no ``&`` entity (outside strings JSON has none
    of these characters, so only strings change, and ``JSON.parse`` reads the same values)."""
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def bilingual(make: Any) -> str:
    """One text in both languages, the one not chosen hidden by the page's CSS."""
    return "".join(f'<span class="{lang}">{esc(make(lang))}</span>' for lang in LANGS)


def chrome_buttons(lang: Lang) -> list[str]:
    """The bar's buttons every page has: the other language, light / dark, larger type."""
    other: Lang = "zh" if lang == "en" else "en"
    theme = bilingual(lambda g: CHROME[g]["theme"])
    return [
        f'<button type="button" data-role="lang">{CHROME[other]["lang_name"]}</button>',
        f'<button type="button" data-role="theme">{theme}</button>',
        LARGE_BUTTON,
    ]


@dataclass
class Page:
    """One page being made: the derivations found while the tables are drawn."""

    trace: Trace
    options: RenderOptions
    derivations: list[dict[str, Any]] = field(default_factory=list)
    ids: dict[tuple[tuple[int, int, int, int], str], int | None] = field(default_factory=dict)
    cells: dict[tuple[int, int, int, int], WorkedCell] = field(default_factory=dict)
    worked_capped: bool = False
    notes: list[str] = field(default_factory=list)
    kept: dict[str, list[list[int] | None]] = field(default_factory=dict)  # stages cut
    max_worked: int = MAX_WORKED
    max_entries: int = MAX_ENTRIES
    entries: int = 0  # entry derivations made (present/entries.py)
    entries_capped: bool = False
    whole_text: Trace | None = None  # the trace with its tokens' full text, for the page's data

    @cached_property
    def applicable(self) -> tuple[str, ...]:
        return self.trace.applicable

    @property
    def shown(self) -> list[Stage]:
        stages = self.options.stages
        return [s for s in self.trace if stages is None or s.name in stages]

    @cached_property
    def whole(self) -> bool:
        """Whether every stage was kept, as worked cells need (trace_file(stages=...) keeps
        fewer: then the page has no derivations)."""
        return all(name in self.trace for name in self.applicable)

    @property
    def full(self) -> bool:
        """--full, unless it would draw more than MAX_CELLS cells (then elided, and said)."""
        if not self.options.full:
            return False
        return sum(s.data.size for s in self.shown) <= MAX_CELLS

    def body(self) -> str:
        """The page's markup: the bar, the stage list, the stages, the derivation panel."""
        t = self.trace
        names = [esc(stage.name) for stage in self.shown]
        out = self.top(t.inputs.name or "attn trace", names)
        if self.options.full and not self.full:
            n = sum(s.data.size for s in self.shown)
            out.append(self._note("capped_full", n=n, cap=MAX_CELLS))
        sections = [self._section(k, s) for k, s in enumerate(self.shown)]
        out += self.notes
        if self.worked_capped:
            out.append(self._note("worked_cap", cap=self.max_worked))
        if self.entries_capped:
            out.append(self._note("entries_cap", cap=self.max_entries))
        out += sections
        out.append('</main><aside class="derivation" data-role="derivation" aria-live="polite">')
        out.append(f'<p class="hint">{bilingual(_word("hint"))}</p></aside></div>')
        return "\n".join(out)

    def top(self, title: str, names: list[str]) -> list[str]:
        """The bar (title, language, theme, larger type, batch and head filters), the list of
        the sections ``names`` (markup) and the configuration: a trace's page, a run's page."""
        inp = self.trace.inputs
        out = ['<header class="top">', f"<h1>{esc(title)}</h1>", '<div class="controls">']
        out += chrome_buttons(self.options.lang)
        if inp.has_batch:
            out.append(self._select("batch", inp.batch))
        if inp.heads > 1:
            out.append(self._select("head", inp.heads))
        out.append("</div></header>")
        out.append('<div class="layout"><nav class="stages" data-role="stages">')
        for k, name in enumerate(names):
            out.append(f'<button type="button" data-go="{k}">{name}</button>')
        out.append('</nav><main><h2 class="stage-title" data-role="stage-title"></h2>')
        out.append(self._about())
        return out

    def _select(self, role: str, n: int) -> str:
        en, zh, first = WORDS["en"]["all"], WORDS["zh"]["all"], WORDS[self.options.lang]["all"]
        every = f'<option value="all" data-text-en="{en}" data-text-zh="{zh}">{first}</option>'
        opts = [every] + [f'<option value="{i}">{i}</option>' for i in range(n)]
        name = bilingual(lambda lang: label(lang, role))
        return f'<label>{name} <select data-role="{role}">{"".join(opts)}</select></label>'

    def _note(self, key: str, **values: Any) -> str:
        return f'<p class="note">{bilingual(lambda lang: WORDS[lang][key].format(**values))}</p>'

    def _about(self) -> str:
        """The configuration header (the terminal's panel), in both languages."""
        out = []
        for lang in LANGS:
            rows = "".join(
                f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in header_lines(self.trace, lang)
            )
            out.append(
                f'<details class="about {lang}"><summary>{WORDS[lang]["about"]}</summary>'
                f"<dl>{rows}</dl></details>"
            )
        return "".join(out)

    # -- one stage ------------------------------------------------------------------------

    def _section(self, k: int, stage: Stage) -> str:
        name = esc(stage.name)
        out = [f'<section class="stage" id="stage-{k}" data-stage-name="{name}">']
        out.append(f'<h2 class="print-title">{name}</h2>')
        out.append(self._heading(stage))
        out += self._tables(stage)
        if self.whole:  # explanations read the stages around it
            out.append(self._explanation(stage))
        out.append("</section>")
        return "\n".join(out)

    def _heading(self, stage: Stage) -> str:
        def formula(lang: Lang) -> str:
            text = formula_text(lang, stage.formula)
            if stage.name == "scaled":
                text += label(lang, "scale_note", scale=f"{self.trace.scale:.6g}")
            return text

        parts = "".join(
            f'<span class="formula {lang}">{esc(formula(lang))}</span>'
            f'<span class="shape {lang}">   [{esc(dims_text(lang, stage.axes, stage.shape))}]'
            "</span>"
            for lang in LANGS
        )
        return f"<p>{parts}</p>"

    def _explanation(self, stage: Stage) -> str:
        from attn_cli.present.explain import explain_stage

        out = []
        for lang in LANGS:
            e = explain_stage(self.trace, stage.name, lang, self.options.precision)
            sep = label(lang, "sep")
            lines = [
                f"<h3>{esc(label(lang, 'explain_title'))}</h3>",
                f"<p><b>{esc(label(lang, 'formula'))}</b> "
                f"{'<br>'.join(esc(f) for f in e.formula)}</p>",
                f"<p><b>{esc(label(lang, 'shapes'))}</b> {esc(label(lang, 'in'))} "
                f"{esc(sep.join(e.inputs))} → {esc(label(lang, 'out'))} {esc(e.output)}</p>",
                *(f"<p>{esc(m)}</p>" for m in e.meaning),
            ]
            out.append(f'<div class="explain {lang}">{"".join(lines)}</div>')
        return "".join(out)

    def _tables(self, stage: Stage) -> list[str]:
        """A table per slice (batch item, head), the middle ones elided as in the terminal."""
        from attn_cli.present.heat import stage_heat

        full = self.full
        data, axes = stage.table  # (..., rows, cols); a vector as one row
        lead = axes[:-2]
        slices, shown = slices_of(data.shape), shown_slices(data.shape, full)
        focus = self.options.focus if axes[-2] in ("query", "seq") else None
        shading = RenderOptions(self.options.precision, full=full, focus=focus)
        heat = stage_heat(self.trace, stage, shading)  # the terminal's range: over the rows shown
        rows = pick_rows(data.shape[-2], full) if focus is None else [focus]
        cols = pick_cols(data.shape[-1], full)
        out = []
        for index in shown:
            if index is None:
                out.append(f'<p class="e">{ELLIPSIS}</p>')
                continue
            out.append(self._table(stage, data, lead, index, rows, cols, heat, len(slices)))
        if None in shown:
            n_shown = len(shown) - 1
            out.append(self._note("elided_tables", shown=n_shown, n=len(slices)))
        if None in rows or None in cols:
            out.append(
                self._note(
                    "elided_rows",
                    shown=sum(i is not None for i in rows),
                    n=data.shape[-2],
                    cols=sum(j is not None for j in cols),
                    m=data.shape[-1],
                ),
            )
        if heat is not None:
            out.append(self._legend(heat))
        return out

    def _table(
        self,
        stage: Stage,
        data: Any,
        lead: tuple[str, ...],
        index: tuple[int, ...],
        rows: Sequence[int | None],
        cols: Sequence[int | None],
        heat: Any,
        n_slices: int,
    ) -> str:
        trace = self.trace
        matrix = data[index] if index else data
        row_axis, col_axis = stage.table[1][-2], stage.table[1][-1]
        row_labels = axis_labels(trace, row_axis, matrix.shape[0])
        col_labels = axis_labels(trace, col_axis, matrix.shape[1])
        attrs = "".join(
            f' data-{a.replace("_", "-")}="{i}"' for a, i in zip(lead, index, strict=True)
        )
        out = [f'<table class="m"{attrs}>']
        if n_slices > 1:
            cap = "".join(
                f'<span class="{lang}">'
                + esc(" · ".join(f"{axis_title(lang, a)} {i}" for a, i in zip(lead, index)))  # noqa: B905
                + "</span>"
                for lang in LANGS
            )
            out.append(f"<caption>{cap}</caption>")
        head = "".join(
            f"<th>{ELLIPSIS}</th>" if j is None else f"<th>{esc(col_labels[j])}</th>" for j in cols
        )
        out.append(f"<tr><th>{bilingual(lambda lang: axis_name(lang, row_axis))}</th>{head}</tr>")
        blocked = None
        if heat is not None and heat.masked:
            source = trace["masked"].data
            blocked = source[index] if index else source
        for i in rows:
            if i is None:
                out.append(
                    f"<tr><th>{ELLIPSIS}</th>" + '<td class="e">⋮</td>' * len(cols) + "</tr>"
                )
                continue
            maxima = self._maxima(matrix, i, heat)
            cells = "".join(
                '<td class="e">…</td>'
                if j is None
                else self._cell(stage, matrix, index, i, j, heat, blocked, maxima)
                for j in cols
            )
            out.append(f"<tr><th>{esc(row_labels[i])}</th>{cells}</tr>")
        out.append("</table>")
        return "".join(out)

    @staticmethod
    def _maxima(matrix: Any, i: int, heat: Any) -> frozenset[int]:
        if heat is None or heat.stage != "softmax":
            return frozenset()
        from attn_cli.present.worked import row_max_positions_for_display

        return frozenset(j for _, j in row_max_positions_for_display(matrix[i : i + 1]))

    def _cell(
        self,
        stage: Stage,
        matrix: Any,
        index: tuple[int, ...],
        i: int,
        j: int,
        heat: Any,
        blocked: Any,
        maxima: frozenset[int],
    ) -> str:
        """One number: its place in the JSON trace, its text, its shading and marks."""
        x = float(matrix[i, j])
        at = (*index, i, j) if stage.data.ndim >= 2 else (j,)
        shown = format_number(x, self.options.precision)
        attrs = f' data-stage="{esc(stage.name)}" data-index="{",".join(map(str, at))}"'
        attrs += f' data-shown="{shown}"'
        w = self._derivation(stage, at)
        if w is not None:
            attrs += f' data-w="{w}"'
        if self._opens_with(stage, at):
            attrs += ' data-start="1"'
        if heat is None:
            return f"<td{attrs}>{shown}</td>"
        from attn_cli.present.palette import scale_position, viridis

        mark = ""
        if heat.stage == "softmax":
            mark = "*" if j in maxima else ""
        if blocked is not None and bool(blocked[i, j] == -math.inf):
            mark += "" if x == -math.inf else "·"
            return f'<td class="masked"{attrs}>{shown}<span class="mk">{mark}</span></td>'
        t = scale_position(x, heat.lo, heat.hi)
        ink = "#000000" if t >= 0.55 else "#ffffff"
        cls = ' class="mx"' if mark == "*" else ""
        style = f' style="background:{viridis(t)};color:{ink}"'
        return f'<td{cls}{attrs}{style}>{shown}<span class="mk">{mark}</span></td>'

    def _opens_with(self, stage: Stage, at: tuple[int, ...]) -> bool:
        """Whether this is --cell's softmax weight (the first batch item and head), which the
        page opens with, derived."""
        cell = self.options.cell
        if cell is None or stage.name != "softmax":
            return False
        return at[-2:] == (cell.query, cell.key) and not any(at[:-2])

    def _legend(self, heat: Any) -> str:
        p = self.options.precision
        lo, hi = format_number(heat.lo, p), format_number(heat.hi, p)
        parts = [bilingual(lambda lang: WORDS[lang]["legend"].format(lo=lo, hi=hi))]
        if heat.masked:
            parts.append(bilingual(_word("legend_masked")))
        if heat.stage == "softmax":
            parts.append(bilingual(_word("legend_max")))
        return f'<p class="legend"><span class="bar"></span> {" · ".join(parts)}</p>'

    # -- derivations ----------------------------------------------------------------------

    def _derivation(self, stage: Stage, at: tuple[int, ...]) -> int | None:
        """The id of the derivation of the number at ``at`` (a worked cell's text under this
        stage, en and zh), made once per worked cell and stage; None where there is none."""
        from attn_cli.present.entries import ENTRY_STAGES
        from attn_cli.present.explain_registry import cell_part

        if stage.name in ENTRY_STAGES:
            return self._entry(stage, at)
        if cell_part(stage.name) is None or "softmax" not in self.applicable:
            return None  # a worked cell is a softmax row's (linear attention has none)
        key = self._worked_key(stage, at)
        if key is None:
            return None
        if (key, stage.name) in self.ids:
            return self.ids[(key, stage.name)]
        if key not in self.cells and len(self.cells) >= self.max_worked:
            self.worked_capped = True
            return None
        texts = self._texts(key, stage.name)
        w = None
        if texts is not None:
            w = len(self.derivations)
            self.derivations.append(texts)
        self.ids[(key, stage.name)] = w
        return w

    def _entry(self, stage: Stage, at: tuple[int, ...]) -> int | None:
        """The id of the derivation of a Q, K, V, concat or projected entry (its own, one an
        entry), up to ``max_entries`` of them; None where there is none."""
        from attn_cli.present.entries import entry_text

        if not self.whole:
            return None
        if self.entries >= self.max_entries:
            self.entries_capped = True
            return None
        texts: dict[str, Any] = {}
        for lang in LANGS:
            part = entry_text(self.trace, stage.name, at, lang, self.options.precision)
            if part is None:
                return None
            texts[lang] = _cell_json(part)
        self.entries += 1
        self.derivations.append(texts)
        return len(self.derivations) - 1

    def _worked_key(self, stage: Stage, at: tuple[int, ...]) -> tuple[int, int, int, int] | None:
        """(batch, head, query, key) of the worked cell whose text derives this number."""
        inp = self.trace.inputs
        b = h = q = k = 0
        for axis, i in zip(stage.axes, at, strict=True):
            if axis == "batch":
                b = i
            elif axis == "head":
                h = i
            elif axis == "kv_head":
                h = i * (inp.heads // inp.kv_heads)
            elif axis == "query":
                q = i
            elif axis == "key":
                k = i
        if stage.name not in SCORE_STAGES and "query" not in stage.axes and "key" not in stage.axes:
            return None
        return (b, h, q, k)

    def _texts(self, key: tuple[int, int, int, int], name: str) -> dict[str, Any] | None:
        from attn_cli.present.explain import cell_text
        from attn_cli.present.worked import CellRef, worked_cell

        b, h, q, k = key
        if not self.whole:
            return None
        if key not in self.cells:
            self.cells[key] = worked_cell(self.trace, CellRef(q, k), b, h)
        cell = self.cells[key]
        inp = self.trace.inputs
        full = max(inp.seq_k, inp.d_k, inp.d_v or 0) <= 16
        out: dict[str, Any] = {}
        for lang in LANGS:
            part = cell_text(self.trace, cell, name, lang, self.options.precision, full)
            if part is None:
                return None
            out[lang] = _cell_json(part)
        return out

    # -- the data -------------------------------------------------------------------------

    def plan(self) -> None:
        """Which stages the page's JSON cuts to their shown rows (past PAGE_NUMBERS), said
        on the page."""
        total = sum(s.data.size for s in self.shown)
        if total <= PAGE_NUMBERS:
            return
        for s in self.shown:
            if s.data.size > STAGE_WHOLE:
                self.kept[s.name] = _keep(s.shape)
        dropped = sum(
            self.trace[n].data.size - _kept_size(self.trace[n].shape, k)
            for n, k in self.kept.items()
        )
        names = ", ".join(self.kept)
        self.notes.append(
            self._note("kept", kept=total - dropped, total=total, cap=PAGE_NUMBERS, names=names)
        )

    def data_text(self) -> str:
        """The page's JSON: the JSON trace (``attn trace -f json``'s text, its biggest stages
        cut to the shown rows past the cap), the derivations and the page's words."""
        from attn_cli.io.trace_json import dumps, json_text

        names = tuple(s.name for s in self.shown)
        whole = self.whole_text or self.trace  # the tokens' full text, once (the labels are cut)
        trace_text = dumps(whole, names) if not self.kept else self._cut_trace(names)
        inp = self.trace.inputs
        extra = {
            "kept": self.kept,
            "derivations": self.derivations,
            "words": WORDS,
            "lang_tags": LANG_TAGS,
            "groups": inp.heads // inp.kv_heads,
            "precision": self.options.precision,
        }
        return script_json('{"trace": ' + trace_text + ", " + json_text(extra)[1:])

    def _cut_trace(self, names: tuple[str, ...]) -> str:
        """The JSON trace with each stage of ``kept`` cut to the indices it keeps along each
        axis: a 4,096-token trace gives a page of a few MB, not hundreds."""
        from attn_cli.io.trace_json import dumps, json_text

        head = dumps(self.whole_text or self.trace, ())
        opening = '"stages": {'
        pieces = []
        for name in names:
            stage = self.trace[name]
            keep = self.kept.get(name) or [None] * stage.data.ndim
            axes = (range(n) if k is None else k for n, k in zip(stage.shape, keep, strict=True))
            sub = stage.data[np.ix_(*axes)] if stage.data.ndim else stage.data
            meta = {
                "shape": list(stage.shape),
                "axes": list(stage.axes),
                "formula": stage.formula,
                "data": listed(sub),
            }
            pieces.append(f"    {json_text(name)}: {json_text(meta)}")
        start = head[: head.rindex(opening) + len(opening)]
        return start + "\n" + ",\n".join(pieces) + "\n  }\n}"


def _word(key: str) -> Any:
    return lambda lang: WORDS[lang][key]


def _keep(shape: tuple[int, ...]) -> list[list[int] | None]:
    """Which indices of each axis a cut stage keeps: the shown ones, and a last axis whole
    up to ROW_WHOLE (so a shown row's derivation has its terms)."""
    keep: list[list[int] | None] = []
    for a, n in enumerate(shape):
        last = a == len(shape) - 1
        limit, edge = (COL_LIMIT, COL_EDGE) if last else (ROW_LIMIT, ROW_EDGE)
        if a < len(shape) - 2:
            limit, edge = TABLE_LIMIT, TABLE_EDGE
        if last and n <= ROW_WHOLE:
            keep.append(None)
            continue
        picked = [i for i in pick(n, limit, edge, False) if i is not None]
        keep.append(None if len(picked) == n else picked)
    return keep


def _kept_size(shape: tuple[int, ...], keep: Sequence[list[int] | None]) -> int:
    return math.prod(n if k is None else len(k) for n, k in zip(shape, keep, strict=True))


def listed(a: Any) -> Any:
    """Nested lists, non-finite values as the JSON trace writes them ("-inf", "inf", "nan")."""
    if a.ndim == 0:
        x = float(a)
        if math.isfinite(x):
            return x
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if np.isfinite(a).all():
        return a.tolist()
    return [listed(x) for x in a]


def _cell_json(part: CellText) -> dict[str, Any]:
    return {
        "title": part.title,
        "lines": list(part.lines),
        "header": list(part.header),
        "rows": [list(r) for r in part.rows],
        "footer": list(part.footer),
    }


_register()
