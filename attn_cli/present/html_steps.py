"""The stepped pages of ``attn decode``, ``attn flash`` and their kin as the interactive page of
``attn trace -f html`` (issue 26; the contract is docs/html.md): the same template
(``page.html``), the same script (``page.js``), a section per decoding step or per tile instead
of one per stage. This module is their frame (:class:`Steps`, the words, the sections); the pages
are html_decode.py, html_flash.py, html_state.py, html_batch.py and html_split.py.

Each number cell is ``<td data-stage=NAME data-index=I,J,...>`` with ``data-step=K`` (the index
into the decode JSON's ``steps``) or ``data-tile=K`` (into the flash JSON's ``tiles``), or
``data-source="run"`` (the flash JSON's ``stages``), or ``data-source="trace"`` (the full
attention's row: the JSON trace's stage). The numbers and their derivations are made from what
the run holds (its steps, tiles and trace); the script only shows them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attn_cli.present.html_page import (
    LANG_TAGS,
    LANGS,
    PAGE_NUMBERS,
    WORDS,
    Page,
    bilingual,
    esc,
    filled,
    script_json,
)
from attn_cli.present.i18n import Lang, axis_title
from attn_cli.present.options import RenderOptions
from attn_cli.present.text import (
    ELLIPSIS,
    factor,
    format_number,
    pick,
    pick_cols,
    pick_rows,
    pick_tables,
    short_number,
    with_short_labels,
)

MAX_STEPS = 64  # decode steps drawn with --full; past it (and past 16 without) the middle elides
MAX_TILES = 64  # flash tiles drawn; past it the middle elides (--max-tiles keeps more in JSON)
TILE_EDGE = 8
MAX_DERIVED = 3_000  # derivations embedded; past it a cell shows its formula

# The flash tile's update, line by line: formulas, the same in both languages.
TILE_LINES = {
    "m_line": "m = max(m_old, max_j S[{i}, j]) = max({old}, {row}) = {value}",
    "alpha_line": "α = {exp}(m_old − m) = {exp}({old} − {new}) = {value}",
    "P_line": "P = {exp}(S − m) = {exp}({s} − {m}) = {value}",
    "l_line": "l = α·l_old + Σ_j P[{i}, j] = {a}×{old} + {terms} = {value}",
    "acc_line": "acc[{i}, {j}] = α·acc_old + Σ_k P[{i}, k]·V[k, {j}] = {a}×{old} + {terms} "
    "= {value}",
}
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
        **TILE_LINES,
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
        **TILE_LINES,
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
        rows = pick_rows(len(row_labels), full or full_rows)
        cols = pick_cols(len(col_labels), full)
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
    """The trace page's template filled with this page's body and data."""
    from attn_cli.io.trace_json import json_text

    title = esc(run.trace.inputs.name or "attn")
    return filled(options.lang, theme, title, body, script_json(json_text(data)))


def _top(p: Steps, title: str, sections: list[tuple[str, str]]) -> list[str]:
    """The bar (title, language, theme, head and batch filters) and the section list."""
    return Page(p.trace, p.options).top(title, [_named(name) for name, _ in sections])


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


def short_steps(run: Any, options: RenderOptions | None, kind: str) -> Steps:
    """A decode, flash or state page being made of ``run`` with its trace labelling its tokens
    cut (present/text.py ``with_short_labels``), as every page draws them; the tokens' full text
    kept once for the page's data."""
    from dataclasses import replace

    short = replace(run, trace=with_short_labels(run.trace))
    return Steps(short, options or RenderOptions(), kind, tokens=run.trace.inputs.tokens)


def decode_steps_page(
    p: Steps, sections: list[tuple[str, str]], kept: dict[str, Any], theme: str
) -> str:
    """A single run's decode page (a cache's, a state's), titled by its fixture."""
    title = f"{p.trace.inputs.name or 'attn'} · attn decode"
    return steps_page(p, title, sections, {"format": "attn-decode", "steps": kept}, "hint", theme)


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


def picked_tiles(n: int) -> list[int | None]:
    """The tiles (or split-KV chunks) of ``n`` a page draws: all up to MAX_TILES, else the
    first and last TILE_EDGE (None: the elided middle)."""
    return pick(n, MAX_TILES, TILE_EDGE, False)


def picked_steps(p: Steps, n: int) -> list[int | None]:
    """The steps a decode page shows (None: the elided middle), with the page's note when some
    are elided: every step with --full up to MAX_STEPS, else the first and last few."""
    picked = pick_tables(n, p.options.full and n <= MAX_STEPS)
    if None in picked:
        shown = sum(k is not None for k in picked)
        p.notes.append(p.note("elided_steps", shown=shown, n=n, cap=MAX_STEPS))
    return picked


def step_sections(
    p: Steps,
    n: int,
    overview: str,
    name: Callable[[int], str],
    step: Callable[[int, dict[str, Any]], str],
    checks: Callable[[], str],
) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """A stepped page's sections: the overview, one per step shown (``name(k)``, ``step(k,
    kept)``), the checks; and ``kept``, the numbers of the steps shown (the page's data)."""
    sections = [(word("en", "overview"), overview)]
    kept: dict[str, Any] = {}
    for k in picked_steps(p, n):
        if k is not None:
            sections.append((name(k), step(k, kept)))
    sections.append((word("en", "checks"), checks()))
    return sections, kept


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


def view_label(labels: dict[Lang, dict[str, str]], key: str) -> str:
    """A view's label (decode_view's, flash_view's LABELS) in both languages."""
    return bilingual(lambda lang: labels[lang][key])


def check_table(checks: Sequence[Any], label: Callable[[str], str], caption: str = "") -> str:
    """A run's self-checks as a table: what was compared, the largest difference and its mark,
    the tolerance; ``label(key)`` is a column's or a check's label in both languages."""
    heads = "".join(f"<th>{label(k)}</th>" for k in ("col_what", "col_diff", "col_tol"))
    out = [f'<table class="m">{caption}<tr>{heads}</tr>']
    for c in checks:
        out.append(
            f"<tr><td>{label(f'check_{c.name}')}</td><td>{c.max_abs:.3e} "
            f"{'✓' if c.ok else '✗'}</td><td>{c.tolerance:.3g}</td></tr>"
        )
    out.append("</table>")
    return "\n".join(out)


def softmax_rows(
    p: Steps,
    parts: Any,
    picked: Sequence[int | None],
    cell: Callable[[int], tuple[str, float, float]],
    sink: float | None,
    lang: Lang,
) -> list[tuple[str, ...]]:
    """The rows of a softmax row's derivation (``parts``: worked.softmax_parts): each term's
    label, logit x, x − m, e^(x − m) and weight (``cell(i)``: the label, x and the weight of
    term i; None in ``picked``: the elided ones), then the sink's."""
    n, prec = p.n, p.options.precision
    rows: list[tuple[str, ...]] = []
    for i in picked:
        if i is None:
            rows.append(("…",) * 5)
            continue
        label, x, weight = cell(i)
        exp = short_number(parts.exps[i], prec)
        rows.append((label, n(x), n(parts.shifted[i]), exp, short_number(weight, prec)))
    if sink is not None:
        shifted, exp = n(sink - parts.row_max), short_number(parts.sink_exp, prec)
        rows.append((word(lang, "sink"), n(sink), shifted, exp, ""))
    return rows
