"""``attn decode`` and ``attn flash`` as the interactive page of ``attn trace -f html`` (issue 26;
the contract is docs/html.md): the same template (``page.html``), the same script (``page.js``),
a section per decoding step or per tile instead of one per stage.

A decode page steps token by token: each step's query, its cache (growing, or the ring buffer
of a window with its slot indices, or MLA's latent cache), the scores to the output, and the
step's row against the full attention (the self-check). A flash page steps tile by tile: S, the
running max m, alpha, P, the running sum l, the accumulator, skipped tiles, then O and L.

Each number cell is ``<td data-stage=NAME data-index=I,J,...>`` with ``data-step=K`` (the index
into the decode JSON's ``steps``) or ``data-tile=K`` (into the flash JSON's ``tiles``), or
``data-source="run"`` (the flash JSON's ``stages``), or ``data-source="trace"`` (the full
attention's row: the JSON trace's stage). The numbers and their derivations are made here from
what the run holds (its steps, tiles and trace); the script only shows them.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli._version import __version__
from attn_cli.present.explain_registry import pick_terms, sum_terms
from attn_cli.present.html_maps import MAP_ROWS, map_part
from attn_cli.present.html_page import (
    LANG_TAGS,
    LANGS,
    LARGE_BUTTON,
    PAGE_NUMBERS,
    WORDS,
    Page,
    asset,
    bilingual,
    esc,
    listed,
    page_theme,
    script_json,
    split,
)
from attn_cli.present.i18n import Lang, axis_title, label
from attn_cli.present.options import RenderOptions
from attn_cli.present.text import (
    COL_EDGE,
    COL_LIMIT,
    ELLIPSIS,
    ROW_EDGE,
    ROW_LIMIT,
    TABLE_EDGE,
    TABLE_LIMIT,
    factor,
    format_number,
    pick,
    safe,
    short_number,
    with_short_labels,
)
from attn_cli.present.variants import extra_logit

if TYPE_CHECKING:
    from attn_cli.check.runs import DecodeRun, FlashRun
    from attn_cli.core.decode import DecodeStep
    from attn_cli.core.flash import Tile

MAX_STEPS = 64  # decode steps drawn with --full; past it (and past 16 without) the middle elides
MAX_TILES = 64  # flash tiles drawn; past it the middle elides (--max-tiles keeps more in JSON)
TILE_EDGE = 8
MAX_DERIVED = 3_000  # derivations embedded; past it a cell shows its formula
SCORE_ROWS = ("scores", "scaled", "capped", "masked", "softmax")  # a step's rows over the cache
CACHES = ("K_cache", "V_cache")
NONE_CELL = '<td class="none">—</td>'  # an empty cache slot's: no number (decode_view's —)
BEFORE = ("Q", "Q_rot")  # a step's stages shown before its rows over the cache
DECODE_EXPLAINED = (
    "Q",
    "Q_rot",
    "K_cache",
    "V_cache",
    "scores",
    "masked",
    "softmax",
    "output",
    "check",
    "cost",
)
FLASH_EXPLAINED = ("loop", "skipped", "S", "m", "alpha", "P", "l", "acc", "O", "L", "check")

STEP_WORDS: dict[Lang, dict[str, str]] = {
    "en": {
        "hint": "Click or hover a number to see where it comes from. "
        "→ / Space: next step, ← / Backspace: previous.",
        "hint_tile": "Click or hover a number to see where it comes from. "
        "→ / Space: next tile, ← / Backspace: previous.",
        "elided_steps": "{shown} of {n} steps shown (attn decode --full shows up to {cap}; "
        "attn decode -f json writes them all).",
        "elided_tiles": "{shown} of {n} tiles shown here (attn flash -f json writes them all).",
        "cut_data": "The page embeds the numbers of {kept} of the {n} {what} shown (a cap of "
        "{cap:,} numbers); the others show their derivations but not their full precision.",
        "derived_cap": "Derivations are embedded for the first {cap:,} cells; the others show "
        "their formula.",
        "steps": "steps",
        "tiles": "tiles",
        "no_cell": "This number is taken as it is (the query, a projection, a gate), or past the "
        "page's cap of derivations; the overview explains its formula.",
        "q_dot": "q = {q}[{where}], k = K_cache[{kv}slot {slot}] ({held})",
        "dot": "{name} = q·k = {terms} = {products} = {value}",
        "scaled": "scaled = scores × scale = {score} × {scale} = {value}",
        "masked_open": "masked = {src} = {value}: this slot may be attended",
        "masked_bias": "masked = {src} + bias = {a} + {b} = {value}",
        "masked_shut": "masked = −∞: slot {slot} is empty, or its key may not be attended",
        "row": "softmax over the cache's slots: m = the row maximum = {m}",
        "row_sink": "softmax over the cache's slots and the sink {sink}: m = {m}",
        "row_empty": "nothing may be attended: every weight is 0",
        "exp_sum": "Σ e^(x − m) = {total}; weight of slot {slot} = {e} / {total} = {w}",
        "col_slot": "slot",
        "col_weight": "weight",
        "sink": "sink",
        "out": "{name}[head {h}, {j}] = Σ weight × V_cache[slot, {j}] over the slots:",
        "out_line": "= {terms} = {products} = {value}",
        "cache_cell": "slot {slot} holds {held}: written once, when that token arrived "
        "(slot = {rule})",
        "ring_rule": "position mod {w}",
        "grow_rule": "its index",
        "paged_rule": "page {page}, slot {slot} of the pool: block_table[{index} // {b}], "
        "{index} mod {b}",
        "paged_empty": "page {page}, slot {slot} of the pool, not written yet",
        "empty": "(empty)",
        "ref": "the full attention's row of {token} ({name}[{where}] of attn trace -f json): "
        "plain softmax attention over every key the token may see, with no cache",
        "ref_step": "this step's {name}[head {h}, {j}] = {value}",
        "ref_diff": "max |this step's row − the full row| = {diff} {mark} (≤ {tol})",
        "self_check": "self-check: this step against the full attention's row",
        "this_step": "head {h} · this step",
        "full_row": "head {h} · full row",
        "overview": "overview",
        "checks": "self-check",
        "at_step": "step {n}",
        "at_tile": "tile {n}",
        "result": "O, L",
        "S_dot": "q = {q}[{qw}], k = {k}[{kw}]",
        "S_value": "S = q·k × scale{base} = {dot} × {scale}{base_n} = {value}",
        "S_after": "(then the fixture's score modifiers, biases and masks: attn trace shows them)",
        "S_shut": "S = −∞: key {kt} may not be attended by query {qt}",
        "m_line": "m = max(m_old, max_j S[{i}, j]) = max({old}, {row}) = {value}",
        "alpha_line": "α = {exp}(m_old − m) = {exp}({old} − {new}) = {value}",
        "P_line": "P = {exp}(S − m) = {exp}({s} − {m}) = {value}",
        "l_line": "l = α·l_old + Σ_j P[{i}, j] = {a}×{old} + {terms} = {value}",
        "acc_line": "acc[{i}, {j}] = α·acc_old + Σ_k P[{i}, k]·V[k, {j}] = {a}×{old} + {terms} "
        "= {value}",
        "skipped_line": "tile skipped (above the causal diagonal): {name} carries over = {value}",
        "O_line": "O[{t}, {j}] = acc / l = {acc} / {l} = {value} (the last tile of its block)",
        "L_line": "L[{t}] = m + {log}(l) = {m} + {log}({l}) = {value}",
        "start": "the start value",
        "no_last": "its block's last tile is not among the tiles shown: the formula",
    },
    "zh": {
        "hint": "点击或悬停在一个数字上，查看它是怎么算出来的。"
        "→ / 空格：下一步，← / 退格：上一步。",
        "hint_tile": "点击或悬停在一个数字上，查看它是怎么算出来的。"
        "→ / 空格：下一块，← / 退格：上一块。",
        "elided_steps": "显示 {n} 步中的 {shown} 步（attn decode --full 最多显示 {cap} 步；"
        "attn decode -f json 写出全部）。",
        "elided_tiles": "这里显示 {n} 块中的 {shown} 块（attn flash -f json 写出全部）。",
        "cut_data": "页面只嵌入了所显示的 {n} 个{what}中 {kept} 个的数字（上限 {cap:,} 个数）；"
        "其余的仍有推导，但没有完整精度。",
        "derived_cap": "只为前 {cap:,} 个单元格嵌入了推导；其余的显示公式。",
        "steps": "步",
        "tiles": "块",
        "no_cell": "这个数直接取来（查询、投影、门控），或超出了页面的推导上限；"
        "概览中说明了它的公式。",
        "q_dot": "q = {q}[{where}]，k = K_cache[{kv}槽 {slot}]（{held}）",
        "dot": "{name} = q·k = {terms} = {products} = {value}",
        "scaled": "scaled = scores × scale = {score} × {scale} = {value}",
        "masked_open": "masked = {src} = {value}：这个槽可以被看",
        "masked_bias": "masked = {src} + bias = {a} + {b} = {value}",
        "masked_shut": "masked = −∞：槽 {slot} 是空的，或者它的键不允许看",
        "row": "对缓存各槽做 softmax：m = 这一行的最大值 = {m}",
        "row_sink": "对缓存各槽和汇点 {sink} 做 softmax：m = {m}",
        "row_empty": "没有可以看的键：所有权重都是 0",
        "exp_sum": "Σ e^(x − m) = {total}；槽 {slot} 的权重 = {e} / {total} = {w}",
        "col_slot": "槽",
        "col_weight": "权重",
        "sink": "汇点",
        "out": "{name}[头 {h}, {j}] = Σ 权重 × V_cache[槽, {j}]，对各槽求和：",
        "out_line": "= {terms} = {products} = {value}",
        "cache_cell": "槽 {slot} 存放 {held}：那个词到来时写入一次（槽 = {rule}）",
        "ring_rule": "位置 mod {w}",
        "grow_rule": "它的序号",
        "paged_rule": "页池中的页 {page}、槽 {slot}：块表[{index} // {b}]，{index} mod {b}",
        "paged_empty": "页池中的页 {page}、槽 {slot}，尚未写入",
        "empty": "（空）",
        "ref": "完整注意力中 {token} 那一行（attn trace -f json 的 {name}[{where}]）："
        "对该词能看到的所有键做普通 softmax 注意力，不用缓存",
        "ref_step": "这一步的 {name}[头 {h}, {j}] = {value}",
        "ref_diff": "max |这一步的行 − 完整的行| = {diff} {mark}（≤ {tol}）",
        "self_check": "自检：这一步与完整注意力的那一行对比",
        "this_step": "头 {h} · 这一步",
        "full_row": "头 {h} · 完整的行",
        "overview": "概览",
        "checks": "自检",
        "at_step": "第 {n} 步",
        "at_tile": "块 {n}",
        "result": "O、L",
        "S_dot": "q = {q}[{qw}]，k = {k}[{kw}]",
        "S_value": "S = q·k × scale{base} = {dot} × {scale}{base_n} = {value}",
        "S_after": "（之后还有配置文件的分数修饰、偏置和遮盖：attn trace 会显示）",
        "S_shut": "S = −∞：查询 {qt} 不允许看键 {kt}",
        "m_line": "m = max(m_old, max_j S[{i}, j]) = max({old}, {row}) = {value}",
        "alpha_line": "α = {exp}(m_old − m) = {exp}({old} − {new}) = {value}",
        "P_line": "P = {exp}(S − m) = {exp}({s} − {m}) = {value}",
        "l_line": "l = α·l_old + Σ_j P[{i}, j] = {a}×{old} + {terms} = {value}",
        "acc_line": "acc[{i}, {j}] = α·acc_old + Σ_k P[{i}, k]·V[k, {j}] = {a}×{old} + {terms} "
        "= {value}",
        "skipped_line": "跳过的块（在因果对角线之上）：{name} 保持不变 = {value}",
        "O_line": "O[{t}, {j}] = acc / l = {acc} / {l} = {value}（所在块的最后一块）",
        "L_line": "L[{t}] = m + {log}(l) = {m} + {log}({l}) = {value}",
        "start": "初始值",
        "no_last": "它所在块的最后一块不在显示的块中：见公式",
    },
}


def word(lang: Lang, key: str, **values: Any) -> str:
    text = STEP_WORDS[lang][key]
    return text.format(**values) if values else text


Derived = dict[str, Any]  # {"en": part, "zh": part}, each part as page.js's cellText reads it


def part_of(
    title: str,
    lines: Sequence[str],
    header: Sequence[str] = (),
    rows: Sequence[Sequence[str]] = (),
    footer: Sequence[str] = (),
) -> dict[str, Any]:
    return {
        "title": title,
        "lines": list(lines),
        "header": list(header),
        "rows": [list(r) for r in rows],
        "footer": list(footer),
    }


def _plain_words(lang: Lang, hint: str) -> dict[str, str]:
    """The trace page's words (page.js reads ``shown``, ``full``, ``no_cell``, ``hint``), the
    hint about steps or tiles."""
    return {
        **WORDS[lang],
        "hint": word(lang, hint),
        "no_cell": word(lang, "no_cell"),
        "at_step": word(lang, "at_step"),
        "at_tile": word(lang, "at_tile"),
    }


@dataclass
class Steps:
    """One decode or flash page being made: sections, the derivations, the embedded numbers."""

    run: Any
    options: RenderOptions
    kind: str  # "decode" or "flash"
    derivations: list[Derived] = field(default_factory=list)
    capped: bool = False
    budget: int = PAGE_NUMBERS
    cut: int = 0  # steps or tiles whose numbers were left out of the page's data
    notes: list[str] = field(default_factory=list)
    arrays: dict[int, dict[str, Any]] = field(default_factory=dict)  # a step's, by step
    tokens: tuple[str, ...] | None = None  # the tokens' full text, once in the page's data

    @property
    def lang(self) -> Lang:
        return self.options.lang

    @property
    def trace(self) -> Any:
        return self.run.trace

    def n(self, x: float) -> str:
        return short_number(float(x), self.options.precision)

    def f(self, x: float) -> str:
        return factor(float(x), self.options.precision)

    def derive(self, make: Callable[[Lang], dict[str, Any] | None]) -> int | None:
        """The id of a derivation made in both languages, None past the cap or where none."""
        if len(self.derivations) >= MAX_DERIVED:
            self.capped = True
            return None
        parts: dict[str, Any] = {lang: make(lang) for lang in LANGS}
        if parts["en"] is None:
            return None
        self.derivations.append(dict(parts))
        return len(self.derivations) - 1

    def note(self, key: str, **values: Any) -> str:
        return f'<p class="note">{bilingual(lambda lang: word(lang, key, **values))}</p>'

    def keep(self, arrays: Sequence[Any]) -> bool:
        """Whether a step's or tile's numbers still fit the page's cap (counted when kept)."""
        size = sum(int(np.asarray(a).size) for a in arrays if a is not None)
        if size > self.budget:
            self.cut += 1
            return False
        self.budget -= size
        return True

    # -- markup -------------------------------------------------------------------------

    def cell(
        self, x: float, stage: str, index: Sequence[int], where: str, w: int | None, at: str
    ) -> str:
        """One number: ``where`` is its holder's attributes (``data-step="3"`` ...)."""
        shown = format_number(float(x), self.options.precision)
        attrs = f' data-stage="{esc(stage)}" data-index="{",".join(map(str, index))}"'
        attrs += f' {where} data-at="{esc(at)}" data-shown="{shown}"'
        if w is not None:
            attrs += f' data-w="{w}"'
        cls = ' class="masked"' if math.isinf(float(x)) and float(x) < 0 else ""
        return f"<td{cls}{attrs}>{shown}</td>"

    def table(
        self,
        caption: str,
        attrs: str,
        row_labels: Sequence[str],
        col_labels: Sequence[str],
        cell: Callable[[int, int], str],
        full_rows: bool = False,
        marked_rows: bool = False,
    ) -> str:
        """A table of ``cell(i, j)``, its rows and columns elided as the terminal's; the
        caption is markup, and so are the row labels when ``marked_rows``."""
        full = self.options.full
        rows = pick(len(row_labels), ROW_LIMIT, ROW_EDGE, full or full_rows)
        cols = pick(len(col_labels), COL_LIMIT, COL_EDGE, full)
        out = [f'<table class="m"{attrs}><caption>{caption}</caption><tr><th></th>']
        out += [
            f"<th>{ELLIPSIS}</th>" if j is None else f"<th>{esc(col_labels[j])}</th>" for j in cols
        ]
        out.append("</tr>")
        for i in rows:
            if i is None:
                out.append(
                    f"<tr><th>{ELLIPSIS}</th>" + '<td class="e">⋮</td>' * len(cols) + "</tr>"
                )
                continue
            tds = "".join('<td class="e">…</td>' if j is None else cell(i, j) for j in cols)
            th = row_labels[i] if marked_rows else esc(row_labels[i])
            out.append(f"<tr><th>{th}</th>{tds}</tr>")
        out.append("</table>")
        return "".join(out)


def _fill(run: Any, options: RenderOptions, theme: str, body: str, data: dict[str, Any]) -> str:
    """The trace page's template filled: its CSS, its script (by hash), this page's body."""
    import base64
    import hashlib

    from attn_cli.io.trace_json import json_text
    from attn_cli.present.palette import VIRIDIS

    script = asset("page.js")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    fill = {
        "LANG_TAG": LANG_TAGS[options.lang],
        "LANG": options.lang,
        "THEME": page_theme(theme),
        "SCRIPT_HASH": f"sha256-{digest}",
        "GENERATOR": f"attn {__version__}",
        "TITLE": esc(run.trace.inputs.name or "attn"),
        "VIRIDIS": ", ".join(VIRIDIS),
        "BODY": body,
        "DATA": script_json(json_text(data)),
        "SCRIPT": script,
    }
    return "".join(fill.get(part, part) for part in split(asset("page.html")))


def in_iframe(page: str, name: str, height: int = 640) -> str:
    """A page in an ``<iframe srcdoc>``, as a Trace's notebook view (html_page.notebook_html)."""
    return (
        f'<iframe srcdoc="{html.escape(page, quote=True)}" sandbox="allow-scripts" '
        f'style="width: 100%; height: {height}px; border: 1px solid #ccc" '
        f'title="{esc(name)}"></iframe>'
    )


def _top(p: Steps, title: str, sections: list[tuple[str, str]]) -> list[str]:
    """The bar (title, language, theme, head and batch filters) and the section list."""
    inp = p.trace.inputs
    other: Lang = "zh" if p.lang == "en" else "en"
    out = ['<header class="top">', f"<h1>{esc(title)}</h1>", '<div class="controls">']
    out.append(f'<button type="button" data-role="lang">{WORDS[other]["lang_name"]}</button>')
    out.append(
        f'<button type="button" data-role="theme">{bilingual(lambda g: WORDS[g]["theme"])}</button>'
    )
    out.append(LARGE_BUTTON)
    page = Page(p.trace, p.options)
    if inp.has_batch:
        out.append(page._select("batch", inp.batch))
    if inp.heads > 1:
        out.append(page._select("head", inp.heads))
    out.append("</div></header>")
    out.append('<div class="layout"><nav class="stages" data-role="stages">')
    out += [
        f'<button type="button" data-go="{k}">{_named(name)}</button>'
        for k, (name, _) in enumerate(sections)
    ]
    out.append('</nav><main><h2 class="stage-title" data-role="stage-title"></h2>')
    out.append(page._about())
    return out


# the sections named in words, not by a step's token or a tile's cells: their Chinese names
_SECTION_ZH = {STEP_WORDS["en"][k]: STEP_WORDS["zh"][k] for k in ("overview", "checks", "result")}


def _named(name: str) -> str:
    """A section's name as markup, in both languages where it is words."""
    zh = _SECTION_ZH.get(name)
    return bilingual(lambda lang: zh if lang == "zh" and zh else name) if zh else esc(name)


def steps_page(
    p: Steps,
    title: str,
    sections: list[tuple[str, str]],
    data: dict[str, Any],
    hint: str,
    theme: str,
) -> str:
    """The whole page: bar, notes, sections (name, markup), the derivation panel, the data."""
    out = _top(p, title, sections)
    out += p.notes
    if p.cut:
        n = len(sections) - 2  # the steps or tiles: the sections but the first and the last
        what = "steps" if p.kind == "decode" else "tiles"

        def cut(lang: Lang) -> str:
            return word(
                lang, "cut_data", kept=n - p.cut, n=n, what=word(lang, what), cap=PAGE_NUMBERS
            )

        out.append(f'<p class="note">{bilingual(cut)}</p>')
    if p.capped:
        out.append(p.note("derived_cap", cap=MAX_DERIVED))
    for k, (name, markup) in enumerate(sections):
        zh = _SECTION_ZH.get(name)
        attrs = f' data-name-zh="{esc(zh)}"' if zh else ""
        out.append(f'<section class="stage" id="stage-{k}" data-stage-name="{esc(name)}"{attrs}>')
        out.append(f'<h2 class="print-title">{_named(name)}</h2>{markup}</section>')
    out.append('</main><aside class="derivation" data-role="derivation" aria-live="polite">')
    out.append(f'<p class="hint">{bilingual(lambda lang: word(lang, hint))}</p></aside></div>')
    inp = p.trace.inputs
    data |= {
        "tokens": p.tokens,  # the labels are cut (with_short_labels): the full text, once
        "derivations": p.derivations,
        "words": {lang: _plain_words(lang, hint) for lang in LANGS},
        "lang_tags": LANG_TAGS,
        "groups": inp.heads // inp.kv_heads,
        "precision": p.options.precision,
    }
    return _fill(p.run, p.options, theme, "\n".join(out), data)


def short_run(run: Any) -> tuple[Any, tuple[str, ...] | None]:
    """A decode, flash or state run whose trace labels its tokens cut (present/text.py
    ``with_short_labels``), as every page draws them, and the tokens' full text."""
    from dataclasses import replace

    return replace(run, trace=with_short_labels(run.trace)), run.trace.inputs.tokens


def explained(run: Any, explain: Callable[[Any, str, Lang], Any], key: str) -> str:
    """A quantity's explanation (decode_view's, flash_view's ``explain``): its formula and
    meaning in both languages."""
    out = []
    for lang in LANGS:
        e = explain(run, key, lang)
        formula, meaning = " · ".join(e.formula), " ".join(e.meaning)
        out.append(
            f'<div class="explain {lang}"><p><b>{esc(formula)}</b></p><p>{esc(meaning)}</p></div>'
        )
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# attn decode


def picked_steps(p: Steps, n: int) -> list[int | None]:
    """The steps a decode page shows (None: the elided middle), with the page's note when some
    are elided: every step with --full up to MAX_STEPS, else the first and last few."""
    picked = pick(n, TABLE_LIMIT, TABLE_EDGE, p.options.full and n <= MAX_STEPS)
    if None in picked:
        shown = sum(k is not None for k in picked)
        p.notes.append(p.note("elided_steps", shown=shown, n=n, cap=MAX_STEPS))
    return picked


def decode_page(run: DecodeRun, options: RenderOptions | None = None, theme: str = "auto") -> str:
    """The decode as one page: the overview, a section per step shown, the self-check."""
    from attn_cli.present.decode_view import LABELS as DECODE_LABELS

    options = options or RenderOptions()
    run, tokens = short_run(run)
    p = Steps(run, options, "decode", tokens=tokens)
    steps = run.result.steps
    picked = picked_steps(p, len(steps))
    sections = [(word("en", "overview"), _decode_overview(run, DECODE_LABELS))]
    kept: dict[str, Any] = {}
    for k in picked:
        if k is None:
            continue
        step = steps[k]
        name = f"{k + 1}: {safe(run.label(step.index))}@{step.position} → {step.slot}"
        sections.append((name, _decode_step(p, k, kept, DECODE_LABELS)))
    sections.append((word("en", "checks"), _decode_checks(run, DECODE_LABELS)))
    title = f"{run.trace.inputs.name or 'attn'} · attn decode"
    data = {"format": "attn-decode", "steps": kept}
    return steps_page(p, title, sections, data, "hint", theme)


def _decode_overview(run: DecodeRun, labels: Any) -> str:
    """What the prefill covered, how many steps, the cache's cost per token."""
    from attn_cli.present.decode_view import explain

    P = run.result.prefill
    tokens = ", ".join(safe(run.label(i)) for i in range(P))
    n = len(run.result.steps)
    c = run.cost
    lines = bilingual(lambda lang: labels[lang]["overview"].format(p=P, tokens=tokens))
    more = bilingual(lambda lang: labels[lang]["steps"].format(n=n))
    keys = [key for key in DECODE_EXPLAINED if key != "Q_rot" or run.trace.inputs.rope]
    box = "".join(explained(run, explain, key) for key in keys)
    inp = run.trace.inputs

    def formula(lang: Lang) -> str:
        if c.latent is not None:
            return str(
                labels[lang]["latent_formula"].format(
                    parts=run.cache_parts, n=c.latent, b=c.per_token
                )
            )
        return str(
            labels[lang]["cost_formula"].format(
                kv=c.kv_heads, dk=inp.d_k, dv=inp.d_v, n=c.per_token
            )
        )

    cost = f"<p>{bilingual(formula)}</p>"
    if run.paged is not None:
        cost += _pool(run, labels)
    return f"<p>{lines}</p><p>{more}</p>{cost}{box}"


def _pool(run: DecodeRun, labels: Any) -> str:
    """The paged pool's bytes beside a contiguous cache's, the prefill's block table."""
    from attn_cli.present.decode_view import block_table, explain, pool_rows

    assert run.paged is not None and run.result.prefill_pages is not None
    table = run.result.prefill_pages.table
    rows = {lang: pool_rows(run, lang) for lang in ("en", "zh")}
    out = [f"<p><b>{_label(labels, 'pool_title')}</b></p>", '<table class="m"><tr>']
    out += [f"<th>{_label(labels, h)}</th>" for h in ("col_layout", "col_slots_pool", "col_bytes")]
    out.append("</tr>")
    for n, (_, slots, size) in enumerate(rows["en"]):
        name = bilingual(lambda lang, n=n: rows[lang][n][0])
        out.append(f"<tr><td>{name}</td><td>{slots:,}</td><td>{size:,}</td></tr>")
    out.append("</table>")
    pre = bilingual(
        lambda lang: labels[lang]["prefill_table"].format(table=block_table(table, lang))
    )
    keys = ("pool", "block_table", "gather")
    return "".join(out) + f"<p>{pre}</p>" + "".join(explained(run, explain, k) for k in keys)


def _decode_step(p: Steps, k: int, kept: dict[str, Any], labels: Any) -> str:
    """One step: where the token goes, its stages as tables, the self-check."""
    from attn_cli.io.decode_json import decode_stages
    from attn_cli.present.decode_view import shown_slots
    from attn_cli.present.variants import ring_slots

    run = p.run
    step = run.result.steps[k]
    inp = run.trace.inputs
    stages = dict(decode_stages(run.trace, step))
    if p.keep(list(stages.values())):
        kept[str(k)] = {
            "index": step.index,
            "stages": {
                name: {"shape": list(np.shape(a)), "data": listed(np.asarray(a))}
                for name, a in stages.items()
            },
        }
    slots = shown_slots(run, step)
    ring = ring_slots(inp)
    token = repr(safe(run.label(step.index)))
    n_steps = len(run.result.steps)

    def where(lang: Lang) -> str:
        pos, slot = step.position, step.slot
        return str(labels[lang]["step"].format(k=k + 1, n=n_steps, token=token, pos=pos, slot=slot))

    def how(lang: Lang) -> str:
        return str(labels[lang]["ring"].format(w=ring) if ring else labels[lang]["grow"])

    out = [f"<p>{bilingual(where)}</p>"]
    if step.pages is None:
        out.append(f'<p class="note">{bilingual(how)}</p>')
    else:  # a paged cache: the pool, where the token went, the block table, the gather
        from attn_cli.present.decode_view import paged_lines

        lines = {lang: paged_lines(run, step, lang) for lang in ("en", "zh")}
        out += [
            f'<p class="note">{bilingual(lambda lang, n=n: lines[lang][n])}</p>'
            for n in range(len(lines["en"]))
        ]
    held = _held(run, step)
    if any(not held[s] for s in slots):
        out.append(f'<p class="note">{bilingual(lambda lang: labels[lang]["none"])}</p>')
    batch = range(inp.batch)
    for b in batch:
        lead = (b,) if inp.has_batch else ()
        rows = [n for n in (*SCORE_ROWS, *MAP_ROWS) if n in stages]  # a second map's too
        after = False  # the query and the cache, the rows over the cache, then the outputs
        for name, data in stages.items():
            if name in rows:
                continue
            a = np.asarray(data) if inp.has_batch else np.asarray(data)[None]
            if not after and name not in CACHES and name not in BEFORE:
                heads = range(inp.heads)
                out += [_score_table(p, k, stages, rows, lead, h, slots, held) for h in heads]
                after = True
            if name in CACHES:
                out += [
                    _cache_table(p, k, name, a, lead, g, slots, held, _rule(run, step, ring))
                    for g in range(a.shape[1])
                ]
            else:
                out.append(_head_table(p, k, name, a, lead))
        out.append(_check_table(p, k, lead))
    return "\n".join(out)


def _rule(run: DecodeRun, step: DecodeStep, ring: int | None) -> Callable[[Lang, int], str]:
    """How a slot of ``step``'s cache was chosen, in words: the ring's, the growing cache's, or
    the page and slot of the pool the gather read it from."""
    paging, where = run.result.paging, step.cache.where
    if paging is None or where is None:
        return lambda lang, s: word(lang, "ring_rule", w=ring) if ring else word(lang, "grow_rule")
    b, held = paging.block_size, step.cache.held

    def paged(lang: Lang, s: int) -> str:
        page, at = divmod(int(where[s]), b)
        if held[s] < 0:
            return word(lang, "paged_empty", page=page, slot=at)
        return word(lang, "paged_rule", page=page, slot=at, index=int(held[s]), b=b)

    return paged


def _held(run: DecodeRun, step: DecodeStep) -> list[str]:
    """``token@position`` of each slot (``(empty)`` while empty), by slot."""
    pos_of = {int(x): i for i, x in enumerate(run.trace.inputs.token_positions()[0])}
    return [
        ("" if at < 0 else f"{safe(run.label(pos_of[at]))}@{at}") for at in step.cache_positions
    ]


def where_at(lead: tuple[int, ...], name: str = "", **axes: int) -> str:
    """A table's caption in both languages: ``batch 1 · head 0`` (after ``name``)."""

    def text(lang: Lang) -> str:
        parts = [name] if name else []
        parts += [f"{axis_title(lang, 'batch')} {lead[0]}"] if lead else []
        parts += [f"{axis_title(lang, a)} {i}" for a, i in axes.items()]
        return " · ".join(parts)

    return bilingual(text)


def attrs_of(lead: tuple[int, ...], **heads: int) -> str:
    out = f' data-batch="{lead[0]}"' if lead else ""
    return out + "".join(f' data-{k.replace("_", "-")}="{v}"' for k, v in heads.items())


def _head_table(p: Steps, k: int, name: str, a: Any, lead: tuple[int, ...]) -> str:
    """A stage of one row per head (Q, Q_rot, output, a gate's): (B, H, 1, n)."""
    b = lead[0] if lead else 0
    m = a[b, :, 0]  # (H, n)
    heads = [
        bilingual(lambda lang, h=h: f"{axis_title(lang, 'head')} {h}") for h in range(m.shape[0])
    ]
    cols = [str(j) for j in range(m.shape[1])]

    def cell(h: int, j: int) -> str:
        w = p.derive(lambda lang: _decode_output(p, k, name, lead, h, j, lang))
        return p.cell(m[h, j], name, (*lead, h, 0, j), f'data-step="{k}"', w, f"step {k + 1}")

    return p.table(where_at(lead, name), attrs_of(lead), heads, cols, cell, marked_rows=True)


def _cache_table(
    p: Steps,
    k: int,
    name: str,
    a: Any,
    lead: tuple[int, ...],
    g: int,
    slots: list[int],
    held: list[str],
    rule: Callable[[Lang, int], str],
) -> str:
    """A cache of one kv head: a row per slot (the slots filled in this run), its index and the
    token@position it holds."""
    b = lead[0] if lead else 0
    m = a[b, g]  # (C, n)
    labels = [f"{s}: {held[s] or '—'}" for s in slots]
    cols = [str(j) for j in range(m.shape[1])]

    def cell(i: int, j: int) -> str:
        s = slots[i]
        if not held[s]:
            return NONE_CELL  # an empty slot: no key, no value

        def make(lang: Lang) -> dict[str, Any]:
            held_s = held[s] or word(lang, "empty")
            line = word(lang, "cache_cell", slot=s, held=held_s, rule=rule(lang, s))
            return part_of(f"{name}[{g}, {s}, {j}]", [line])

        w = p.derive(make)
        return p.cell(m[s, j], name, (*lead, g, s, j), f'data-step="{k}"', w, f"step {k + 1}")

    return p.table(where_at(lead, name, kv_head=g), attrs_of(lead, kv_head=g), labels, cols, cell)


def _score_table(
    p: Steps,
    k: int,
    stages: dict[str, Any],
    rows: list[str],
    lead: tuple[int, ...],
    h: int,
    slots: list[int],
    held: list[str],
) -> str:
    """A head's scores to softmax over the cache's slots (a row a stage)."""
    inp = p.trace.inputs
    b = lead[0] if lead else 0
    data = {
        n: (np.asarray(stages[n]) if inp.has_batch else np.asarray(stages[n])[None]) for n in rows
    }
    cols = [f"{s}: {held[s] or '—'}" for s in slots]

    def cell(i: int, j: int) -> str:
        name, s = rows[i], slots[j]
        if not held[s] and not name.startswith("masked"):
            return NONE_CELL  # an empty slot: nothing computed (masked: −∞, as the chain fills)
        w = p.derive(lambda lang: _decode_score(p, k, name, lead, h, s, lang))
        x = data[name][b, h, 0, s]
        return p.cell(x, name, (*lead, h, 0, s), f'data-step="{k}"', w, f"step {k + 1}")

    return p.table(where_at(lead, head=h), attrs_of(lead, head=h), rows, cols, cell, full_rows=True)


def _step_arrays(p: Steps, k: int) -> dict[str, Any]:
    """A step's stages with the batch axis (B, ...), as decode_stages names them."""
    from attn_cli.io.decode_json import decode_stages

    if k not in p.arrays:
        step = p.run.result.steps[k]
        has_batch = p.trace.inputs.has_batch
        p.arrays = {
            k: {
                n: (np.asarray(a) if has_batch else np.asarray(a)[None])
                for n, a in decode_stages(p.trace, step)
            }
        }
    return p.arrays[k]


def _decode_score(
    p: Steps, k: int, name: str, lead: tuple[int, ...], h: int, s: int, lang: Lang
) -> dict[str, Any] | None:
    """A score as its q·k terms, scaled as the division, masked, a weight as exp(x − m)/Σ."""
    st = _step_arrays(p, k)
    if name in MAP_ROWS:  # a second map's row, the difference (differential attention)
        return map_part(p, k, st, name, lead, (h, 0, s), lang)
    b = lead[0] if lead else 0
    at = f"{name}[{', '.join(map(str, (*lead, h, 0, s)))}]"
    held = _held(p.run, p.run.result.steps[k])
    n = p.n
    if name not in st or "K_cache" not in st or "scores" not in st:
        return None  # a decode of other stages than these (a variant's own): its formula
    if name == "scores":
        qn = "Q_rot" if "Q_rot" in st else "Q"
        q, K = st[qn][b, h, 0], st["K_cache"][b]
        g = h // max(1, st["Q"].shape[1] // K.shape[0])
        kv = K[g, s]
        terms = [f"{p.f(x)}×{p.f(y)}" for x, y in zip(q, kv, strict=True)]
        products = [p.f(float(x) * float(y)) for x, y in zip(q, kv, strict=True)]
        full = p.options.full
        held_s = held[s] or word(lang, "empty")
        value = n(st["scores"][b, h, 0, s])
        return part_of(
            at,
            [
                word(lang, "q_dot", q=qn, where=f"head {h}", kv=f"{g}, ", slot=s, held=held_s),
                word(
                    lang,
                    "dot",
                    name="scores",
                    terms=sum_terms(terms, full),
                    products=sum_terms(products, full),
                    value=value,
                ),
            ],
        )
    if name == "scaled":
        score, scaled = n(st["scores"][b, h, 0, s]), n(st["scaled"][b, h, 0, s])
        line = word(lang, "scaled", score=score, scale=n(p.trace.scale), value=scaled)
        return part_of(at, [line])
    if name == "masked":
        src = "capped" if "capped" in st else "scaled"
        x, y = float(st[src][b, h, 0, s]), float(st["masked"][b, h, 0, s])
        if y == -math.inf:
            return part_of(at, [word(lang, "masked_shut", slot=s)])
        if x == y:
            return part_of(at, [word(lang, "masked_open", src=src, value=n(y))])
        return part_of(at, [word(lang, "masked_bias", src=src, a=n(x), b=p.f(y - x), value=n(y))])
    if name == "softmax":
        return _softmax_part(p, at, st["masked"][b, h, 0], st["softmax"][b, h, 0], s, h, held, lang)
    return None


def _softmax_part(
    p: Steps, at: str, row: Any, weights: Any, s: int, h: int, held: list[str], lang: Lang
) -> dict[str, Any]:
    """exp(x − m) / Σ over the cache's slots (and a sink), with the row."""
    from attn_cli.present.worked import softmax_parts

    sink = extra_logit(p.trace.inputs, h)
    parts = softmax_parts([float(x) for x in row], sink)
    if parts is None:
        return part_of(at, [word(lang, "row_empty")])
    n, prec = p.n, p.options.precision
    head = (
        word(lang, "row", m=n(parts.row_max))
        if sink is None
        else word(lang, "row_sink", m=n(parts.row_max), sink=n(sink))
    )
    rows = []
    for j in pick_terms(len(row), p.options.full, keep=s):
        if j is None:
            rows.append(("…",) * 5)
            continue
        label = f"{j}: {held[j] or '—'}" + (" ◀" if j == s else "")
        rows.append(
            (
                label,
                n(row[j]),
                n(parts.shifted[j]),
                short_number(parts.exps[j], prec),
                short_number(float(weights[j]), prec),
            )
        )
    if sink is not None:
        rows.append(
            (
                word(lang, "sink"),
                n(sink),
                n(sink - parts.row_max),
                short_number(parts.sink_exp, prec),
                "",
            )
        )
    footer = [
        word(
            lang,
            "exp_sum",
            total=n(parts.total),
            slot=s,
            e=short_number(parts.exps[s], prec),
            w=short_number(float(weights[s]), prec),
        )
    ]
    header = (word(lang, "col_slot"), "masked", "x − m", "e^(x − m)", word(lang, "col_weight"))
    return part_of(at, [head], header, rows, footer)


def _decode_output(
    p: Steps, k: int, name: str, lead: tuple[int, ...], h: int, j: int, lang: Lang
) -> dict[str, Any] | None:
    """An output entry as Σ weight · V_cache over the slots (MLA: the latent's, before W_UV)."""
    st = _step_arrays(p, k)
    made = map_part(p, k, st, name, lead, (h, 0, j), lang)  # λ, diff_output, its norm, scaled
    if made is not None:
        return made
    averaged = "output_latent" if "output_latent" in st else "output"
    if name != averaged or not {"softmax", "V_cache", "Q"} <= set(st):
        return None
    b = lead[0] if lead else 0
    V = st["V_cache"][b]  # (Hkv, C, Dv)
    g = h // max(1, st["Q"].shape[1] // V.shape[0])
    weights, values = st["softmax"][b, h, 0], V[g, :, j]
    full = p.options.full
    terms = [f"{p.n(w)}×{p.f(v)}" for w, v in zip(weights, values, strict=True)]
    products = [p.f(float(w) * float(v)) for w, v in zip(weights, values, strict=True)]
    at = f"{name}[{', '.join(map(str, (*lead, h, 0, j)))}]"
    return part_of(
        at,
        [
            word(lang, "out", name=name, h=h, j=j),
            word(
                lang,
                "out_line",
                terms=sum_terms(terms, full),
                products=sum_terms(products, full),
                value=p.n(st[name][b, h, 0, j]),
            ),
        ],
    )


def _check_table(p: Steps, k: int, lead: tuple[int, ...]) -> str:
    """The step's row against the full attention's row of its token (run.reference)."""
    run = p.run
    if run.reference is None:
        return ""
    step = run.result.steps[k]
    b = lead[0] if lead else 0
    st = _step_arrays(p, k)
    name = run.checked
    if name not in st:
        return ""
    mine = st[name][b, :, 0]  # (H, Dv)
    full = run.reference[b, :, k]  # (H, Dv)
    H = mine.shape[0]
    rows = [(h, which) for h in range(H) for which in (0, 1)]
    labels = [
        bilingual(lambda lang, h=h, w=w: word(lang, "this_step" if w == 0 else "full_row", h=h))
        for h, w in rows
    ]
    diff, tol = run.diffs[k], run.tolerance
    mark = "✓" if diff <= tol else "✗"
    token = safe(run.label(step.index))

    def cell(i: int, j: int) -> str:
        h, which = rows[i]
        if which == 0:
            w = p.derive(lambda lang: _decode_output(p, k, name, lead, h, j, lang))
            return p.cell(
                mine[h, j], name, (*lead, h, 0, j), f'data-step="{k}"', w, f"step {k + 1}"
            )
        where = ", ".join(map(str, (*lead, h, step.index, j)))
        w = p.derive(
            lambda lang: part_of(
                f"{name}[{where}]",
                [
                    word(lang, "ref", token=repr(token), name=name, where=where),
                    word(lang, "ref_step", name=name, h=h, j=j, value=p.n(mine[h, j])),
                    word(lang, "ref_diff", diff=f"{diff:.3e}", mark=mark, tol=f"{tol:g}"),
                ],
            )
        )
        return p.cell(
            full[h, j],
            name,
            (*lead, h, step.index, j),
            f'data-step="{k}" data-source="trace"',
            w,
            f"step {k + 1}",
        )

    caption = bilingual(lambda lang: word(lang, "self_check"))
    cols = [str(j) for j in range(mine.shape[1])]
    table = p.table(caption, attrs_of(lead), labels, cols, cell, full_rows=True, marked_rows=True)
    line = bilingual(
        lambda lang: word(lang, "ref_diff", diff=f"{diff:.3e}", mark=mark, tol=f"{tol:g}")
    )
    return f'{table}<p class="check">{line}</p>'


def _decode_checks(run: DecodeRun, labels: Any) -> str:
    """Every step's largest difference from the full attention, and the prefill's."""
    out = ['<table class="m"><tr>']
    heads = ["col_step", "col_token", "col_pos", "col_slots", "col_diff"]
    if run.paged is not None:
        heads.append("col_contiguous")
    out += [f"<th>{_label(labels, h)}</th>" for h in heads]
    out.append("</tr>")
    steps = run.result.steps
    for k in pick(len(steps), 2 * TABLE_LIMIT, TABLE_EDGE, False):
        if k is None:
            out.append("<tr>" + "<td>…</td>" * len(heads) + "</tr>")
            continue
        s, diff = steps[k], run.diffs[k]
        mark = "✓" if diff <= run.tolerance else "✗"
        near = ""
        if run.paged is not None:
            d = run.paged.contiguous_diffs[k]
            near = f"<td>{d:.3e} {'✓' if d <= run.tolerance else '✗'}</td>"
        out.append(
            f"<tr><td>{k + 1}</td><td>{esc(run.label(s.index))}</td><td>{s.position}</td>"
            f"<td>{s.slots}</td><td>{diff:.3e} {mark}</td>{near}</tr>"
        )
    out.append("</table>")
    mark = "✓" if run.prefill_diff <= run.tolerance else "✗"
    pre = bilingual(
        lambda lang: labels[lang]["check_prefill"].format(
            diff=f"{run.prefill_diff:.3e}", mark=mark, stage=run.checked
        )
    )
    return "".join(out) + f"<p>{pre}</p>"


def decode_notebook_html(run: DecodeRun, height: int = 640) -> str:
    """A decode run's notebook view: its page in a frame of its own."""
    return in_iframe(decode_page(run, RenderOptions(), theme="light"), run.trace.inputs.name or "")


# ---------------------------------------------------------------------------------------------
# attn flash


def flash_page(run: FlashRun, options: RenderOptions | None = None, theme: str = "auto") -> str:
    """The FlashAttention loop as one page: the overview, a section per tile shown, O and L."""
    options = options or RenderOptions()
    run, tokens = short_run(run)
    p = Steps(run, options, "flash", tokens=tokens)
    picked = pick(len(run.tiles), MAX_TILES, TILE_EDGE, False)
    shown = sum(k is not None for k in picked)
    if shown < run.tiles_total:
        p.notes.append(p.note("elided_tiles", shown=shown, n=f"{run.tiles_total:,}"))
    sections = [(word("en", "overview"), _flash_overview(run))]
    kept: dict[str, Any] = {}
    for k in picked:
        if k is None:
            continue
        t = run.tiles[k]
        (t0, t1), (s0, s1) = t.q_block, t.k_block
        where = f"b{t.batch} " if run.trace.inputs.has_batch else ""
        name = f"{where}h{t.head} q{t0}..{t1 - 1} × k{s0}..{s1 - 1}" + (" ⤼" if t.skipped else "")
        sections.append((f"{k + 1}: {name}", _flash_tile(p, k, kept)))
    sections.append((word("en", "result"), _flash_result(p, kept)))
    title = f"{run.trace.inputs.name or 'attn'} · attn flash"
    data = {"format": "attn-flash", "tiles": kept, "stages": kept.pop("stages", None)}
    return steps_page(p, title, sections, data, "hint_tile", theme)


def _flash_overview(run: FlashRun) -> str:
    from attn_cli.present.flash_view import LABELS as FLASH_LABELS
    from attn_cli.present.flash_view import explain, skipped_total

    skipped = skipped_total(run)
    line = bilingual(
        lambda lang: FLASH_LABELS[lang]["blocks"].format(
            bq=run.block_q, bk=run.block_k, n=f"{run.tiles_total:,}", skipped=skipped
        )
    )
    base = "base2" if run.base2 else "base_e"
    from attn_cli.core.flash import LOG2E

    c = f"{run.trace.scale * LOG2E:.6g}"
    how = bilingual(lambda lang: FLASH_LABELS[lang][base].format(c=c))
    box = "".join(explained(run, explain, key) for key in FLASH_EXPLAINED)
    return f"<p>{line}</p><p>{how}</p>{box}"


def _before(run: FlashRun, k: int) -> tuple[Any, Any, Any, int | None]:
    """m, l and acc before tile k: the previous tile's of its query block (and its index), else
    the start (m = −∞ or the sink's logit, l = 0 or 1, acc = 0)."""
    from attn_cli.present.flash_view import previous_m

    tile = run.tiles[k]
    if k > 0:
        b = run.tiles[k - 1]
        if (b.batch, b.head, b.q_block) == (tile.batch, tile.head, tile.q_block):
            return b.m, b.l, b.acc, k - 1
    m = previous_m(run, k)
    sink = extra_logit(run.trace.inputs, tile.head) is not None
    return m, np.full(tile.l.shape, 1.0 if sink else 0.0), np.zeros(tile.acc.shape), None


def _flash_tile(p: Steps, k: int, kept: dict[str, Any]) -> str:
    """One tile: S (or why it was skipped), the running state per query row, P, acc."""
    run = p.run
    tile: Tile = run.tiles[k]
    inp = run.trace.inputs
    (t0, t1), (s0, s1) = tile.q_block, tile.k_block
    names = ("S", "m", "alpha", "P", "l", "acc")
    if p.keep([getattr(tile, n) for n in names]):
        arrays = {n: getattr(tile, n) for n in names}
        kept[str(k)] = {n: None if a is None else listed(np.asarray(a)) for n, a in arrays.items()}
    queries = list(run.trace.query_labels[t0:t1])
    keys = list(run.trace.key_labels[s0:s1])
    lead = (tile.batch,) if inp.has_batch else ()
    attrs = attrs_of(lead, head=tile.head)
    here = f'data-tile="{k}"'
    at = f"tile {k + 1}"
    out = []
    if tile.skipped:
        from attn_cli.present.flash_view import LABELS as FLASH_LABELS

        out.append(f'<p class="note">{bilingual(lambda lang: FLASH_LABELS[lang]["skipped"])}</p>')
    else:
        S = tile.S
        assert S is not None

        def s_cell(i: int, j: int) -> str:
            w = p.derive(lambda lang: _flash_S(p, tile, i, j, lang))
            return p.cell(S[i, j], "S", (i, j), here, w, at)

        out.append(p.table("S", attrs, queries, keys, s_cell))

    out.append(_state_table(p, k, attrs, queries))
    P = tile.P
    if P is not None:

        def p_cell(i: int, j: int) -> str:
            w = p.derive(lambda lang: _flash_P(p, tile, i, j, lang))
            return p.cell(P[i, j], "P", (i, j), here, w, at)

        out.append(p.table("P", attrs, queries, keys, p_cell))

    def acc_cell(i: int, j: int) -> str:
        w = p.derive(lambda lang: _flash_state(p, k, "acc", i, lang, j))
        return p.cell(tile.acc[i, j], "acc", (i, j), here, w, at)

    cols = [str(j) for j in range(tile.acc.shape[1])]
    out.append(p.table("acc", attrs, queries, cols, acc_cell))
    return "\n".join(out)


def _state_table(p: Steps, k: int, attrs: str, queries: list[str]) -> str:
    """m_old (the previous tile's m, or the start value), m, α and l of each query row."""
    tile: Tile = p.run.tiles[k]
    m_old, _, _, prev = _before(p.run, k)
    state = [("m_old", None), ("m", tile.m), ("alpha", tile.alpha), ("l", tile.l)]
    state = [(n, a) for n, a in state if n == "m_old" or a is not None]

    def cell(i: int, j: int) -> str:
        name = state[j][0]
        if name == "m_old" and prev is None:
            return f'<td class="init">{format_number(float(m_old[i]), p.options.precision)}</td>'
        if name == "m_old":
            assert prev is not None
            w = p.derive(lambda lang: _flash_state(p, prev, "m", i, lang))
            return p.cell(m_old[i], "m", (i,), f'data-tile="{prev}"', w, f"tile {prev + 1}")
        w = p.derive(lambda lang: _flash_state(p, k, name, i, lang))
        return p.cell(getattr(tile, name)[i], name, (i,), f'data-tile="{k}"', w, f"tile {k + 1}")

    heads = [n if n != "alpha" else "α" for n, _ in state]
    return p.table("m_old, m, α, l", attrs, queries, heads, cell)


def _exp_name(run: FlashRun) -> str:
    return "exp2" if run.base2 else "exp"


def _flash_S(p: Steps, tile: Tile, i: int, j: int, lang: Lang) -> dict[str, Any]:
    """S as q·k × scale (× log2 e with --base2), from the trace's query and key rows."""
    from attn_cli.check.runs import internal, query_key
    from attn_cli.core.flash import LOG2E

    run = p.run
    assert tile.S is not None
    t, s = tile.q_block[0] + i, tile.k_block[0] + j
    at = f"S[{i}, {j}]"
    value = float(tile.S[i, j])
    qt, kt = run.trace.query_labels[t], run.trace.key_labels[s]
    if value == -math.inf:
        return part_of(at, [word(lang, "S_shut", qt=safe(qt), kt=safe(kt))])
    inp = run.trace.inputs
    qn, kn = query_key(inp, "Q"), query_key(inp, "K")
    g = tile.head // (inp.heads // inp.kv_heads)
    kept = qn in run.trace and kn in run.trace
    q, kk = (
        internal(run.trace, qn)[tile.batch, tile.head, t] if kept else (),
        internal(run.trace, kn)[tile.batch, g, s] if kept else (),
    )
    if len(q) == 0 or len(q) != len(kk):  # S not from these rows (a variant's own): the value
        return part_of(at, [f"S = {p.n(value)}", word(lang, "S_after")])
    terms = [f"{p.f(x)}×{p.f(y)}" for x, y in zip(q, kk, strict=True)]
    dot = math.fsum(float(x) * float(y) for x, y in zip(q, kk, strict=True))
    base, base_n = (" × log2 e", f" × {p.n(LOG2E)}") if run.base2 else ("", "")
    lead = f"{tile.batch}, " if inp.has_batch else ""
    return part_of(
        at,
        [
            word(lang, "S_dot", q=qn, qw=f"{lead}{tile.head}, {t}", k=kn, kw=f"{lead}{g}, {s}"),
            f"q·k = {sum_terms(terms, p.options.full)} = {p.n(dot)}",
            word(
                lang,
                "S_value",
                base=base,
                dot=p.n(dot),
                scale=p.n(run.trace.scale),
                base_n=base_n,
                value=p.n(value),
            ),
            word(lang, "S_after"),
        ],
    )


def _flash_P(p: Steps, tile: Tile, i: int, j: int, lang: Lang) -> dict[str, Any]:
    assert tile.S is not None and tile.P is not None
    m = float(tile.m[i])
    m_safe = 0.0 if m == -math.inf else m
    return part_of(
        f"P[{i}, {j}]",
        [
            word(
                lang,
                "P_line",
                exp=_exp_name(p.run),
                s=p.n(tile.S[i, j]),
                m=p.n(m_safe),
                value=p.n(tile.P[i, j]),
            )
        ],
    )


def _flash_state(p: Steps, k: int, name: str, i: int, lang: Lang, j: int = 0) -> dict[str, Any]:
    """m as the max, α = exp(m_old − m), l as the rescaled sum, acc as α·acc + P·V."""
    run = p.run
    tile: Tile = run.tiles[k]
    m_old, l_old, acc_old, _ = _before(run, k)
    n, f, full = p.n, p.f, p.options.full
    at = f"{name}[{i}]" if name != "acc" else f"acc[{i}, {j}]"
    if tile.skipped:
        value = tile.acc[i, j] if name == "acc" else getattr(tile, name)[i]
        return part_of(at, [word(lang, "skipped_line", name=name, value=n(value))])
    assert tile.S is not None and tile.P is not None and tile.alpha is not None
    a = tile.alpha[i]
    if name == "m":
        row = ", ".join(n(x) for x in tile.S[i][:8]) + (", …" if tile.S.shape[1] > 8 else "")
        return part_of(
            at, [word(lang, "m_line", i=i, old=n(m_old[i]), row=row, value=n(tile.m[i]))]
        )
    if name == "alpha":
        new = float(tile.m[i])
        return part_of(
            at,
            [
                word(
                    lang,
                    "alpha_line",
                    exp=_exp_name(run),
                    old=n(m_old[i]),
                    new=n(0.0 if new == -math.inf else new),
                    value=n(a),
                )
            ],
        )
    if name == "l":
        terms = sum_terms([n(x) for x in tile.P[i]], full)
        return part_of(
            at,
            [word(lang, "l_line", i=i, a=n(a), old=f(l_old[i]), terms=terms, value=n(tile.l[i]))],
        )
    from attn_cli.check.runs import internal

    inp = run.trace.inputs
    g = tile.head // (inp.heads // inp.kv_heads)
    s0, s1 = tile.k_block
    V = internal(run.trace, "V")[tile.batch, g, s0:s1, j]
    terms = sum_terms([f"{n(x)}×{f(v)}" for x, v in zip(tile.P[i], V, strict=True)], full)
    return part_of(
        at,
        [
            word(
                lang,
                "acc_line",
                i=i,
                j=j,
                a=n(a),
                old=f(acc_old[i, j]),
                terms=terms,
                value=n(tile.acc[i, j]),
            )
        ],
    )


def _last_tiles(run: FlashRun) -> dict[tuple[int, int, int], int]:
    """(batch, head, query block start) -> the shown tile that finished that block."""
    S = run.trace.inputs.seq_k
    return {
        (t.batch, t.head, t.q_block[0]): k for k, t in enumerate(run.tiles) if t.k_block[1] == S
    }


def _flash_result(p: Steps, kept: dict[str, Any]) -> str:
    """O and L per (batch, head), each derived from its block's last tile when shown."""
    from attn_cli.present.flash_view import LABELS as FLASH_LABELS

    run = p.run
    inp = run.trace.inputs
    last = _last_tiles(run)
    labels = list(run.trace.query_labels)
    out = []
    for b in range(inp.batch):
        lead = (b,) if inp.has_batch else ()
        for h in range(inp.heads):
            cols = [*(f"O {j}" for j in range(inp.d_v)), "L"]
            cell = _result_cell(p, last, lead, b, h)
            out.append(p.table(where_at(lead, head=h), attrs_of(lead, head=h), labels, cols, cell))
    if p.keep([run.output, run.lse]):
        has = inp.has_batch
        kept["stages"] = {
            n: listed(np.asarray(a if has else a[0]))
            for n, a in (("output", run.output), ("lse", run.lse))
        }
    heads = "".join(
        f"<th>{_label(FLASH_LABELS, h)}</th>" for h in ("col_what", "col_diff", "col_tol")
    )
    out.append(f'<table class="m"><tr>{heads}</tr>')
    for c in run.checks:
        what = _check_label(f"check_{c.name}")
        out.append(
            f"<tr><td>{what}</td><td>{c.max_abs:.3e} {'✓' if c.ok else '✗'}</td>"
            f"<td>{c.tolerance:.3g}</td></tr>"
        )
    out.append("</table>")
    return "\n".join(out)


def _result_cell(
    p: Steps, last: dict[tuple[int, int, int], int], lead: tuple[int, ...], b: int, h: int
) -> Callable[[int, int], str]:
    """The cells of O and L of (batch b, head h): O = acc / l and L = m + log l of the tile that
    finished the query's block."""
    run = p.run
    O, L = run.output[b, h], run.lse[b, h]  # noqa: E741 (T, Dv), (T,)
    log = "log2" if run.base2 else "log"

    def cell(t: int, j: int) -> str:
        t0 = t - t % run.block_q
        k = last.get((b, h, t0))
        lse = j == O.shape[1]
        at = ", ".join(map(str, (*lead, h, t) if lse else (*lead, h, t, j)))

        def make(lang: Lang) -> dict[str, Any]:
            title = f"lse[{at}]" if lse else f"output[{at}]"
            if k is None:
                return part_of(
                    title, [word(lang, "no_last"), f"L = m + {log} l" if lse else "O = acc / l"]
                )
            tile, i = run.tiles[k], t - t0
            n = p.n
            if lse:
                line = word(
                    lang, "L_line", t=t, log=log, m=n(tile.m[i]), l=n(tile.l[i]), value=n(L[t])
                )
            else:
                line = word(
                    lang,
                    "O_line",
                    t=t,
                    j=j,
                    acc=n(tile.acc[i, j]),
                    l=n(tile.l[i]),
                    value=n(O[t, j]),
                )
            return part_of(title, [line])

        w = p.derive(make)
        if lse:
            return p.cell(L[t], "lse", (*lead, h, t), 'data-source="run"', w, "O, L")
        return p.cell(O[t, j], "output", (*lead, h, t, j), 'data-source="run"', w, "O, L")

    return cell


def _check_label(key: str) -> str:
    """A flash check's label; a variant's own checks (a second map's) are in i18n's labels."""
    from attn_cli.present.flash_view import LABELS as FLASH_LABELS

    if key in FLASH_LABELS["en"]:
        return _label(FLASH_LABELS, key)
    return bilingual(lambda lang: label(lang, key))


def _label(labels: dict[Lang, dict[str, str]], key: str) -> str:
    """A view's label (decode_view's, flash_view's LABELS) in both languages."""
    return bilingual(lambda lang: labels[lang][key])


def flash_notebook_html(run: FlashRun, height: int = 640) -> str:
    """A flash run's notebook view: its page in a frame of its own."""
    return in_iframe(flash_page(run, RenderOptions(), theme="light"), run.trace.inputs.name or "")


def _register() -> None:
    """Decode and flash runs in a notebook show these pages (check/runs.py RUN_HTML_VIEWS)."""
    from attn_cli.check.runs import RUN_HTML_VIEWS

    RUN_HTML_VIEWS["decode"] = decode_notebook_html
    RUN_HTML_VIEWS["flash"] = flash_notebook_html


_register()
