"""``attn flash --split-kv S -f html``: the interactive page of html_steps.py (the template, the
script, a derivation per number) stepping chunk by chunk, then through the merge.

Sections: the overview; each chunk (per head, each query's m, l, lse = m + log l and O_s, read
from the page's ``tiles[s]``: ``data-tile=s``); the merge (m*, the weights exp(lse_s − lse),
lse and O = Σ w_s·O_s, from the page's ``stages``: ``data-source="run"``); the checks. Every
number comes from the :class:`SplitRun`; the derivations show the arithmetic on them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli.present.explain_registry import sum_terms
from attn_cli.present.html_page import bilingual, in_iframe, listed
from attn_cli.present.html_steps import (
    Steps,
    attrs_of,
    check_table,
    explained,
    part_of,
    picked_tiles,
    steps_page,
    where_at,
)
from attn_cli.present.i18n import Lang
from attn_cli.present.options import RenderOptions
from attn_cli.present.split_kv_view import LABELS as SPLIT_LABELS
from attn_cli.present.split_kv_view import explain

if TYPE_CHECKING:
    from attn_cli.check.split_runs import SplitRun

WORDS: dict[Lang, dict[str, str]] = {
    "en": {
        "m_line": "m_s = the largest score of this query over keys {s0}..{s1} = {value}",
        "l_line": "l_s = Σ exp(S − m_s) over keys {s0}..{s1} = {value}",
        "lse_line": "lse_s = m_s + {log}(l_s) = {m} + {log}({l}) = {value}",
        "O_line": "O_s = acc_s / l_s: this chunk's own softmax · V over keys {s0}..{s1} = {value}",
        "hidden": "every key of this chunk is hidden from this query: m_s = lse_s = −∞, "
        "l_s = 0, O_s = 0",
        "m_star": "m* = max_s lse_s = max({terms}) = {value}",
        "lse": "lse = m* + {log} Σ_s {exp}(lse_s − m*) = {m} + {log}({terms}) = {value}",
        "w": "w_{s} = {exp}(lse_{s} − lse) = {exp}({a} − {b}) = {value}",
        "w_sink": "w_sink = {exp}(sink − lse) = {exp}({a} − {b}) = {value}",
        "O": "O = Σ_s w_s · O_s = {terms} = {value}",
        "empty": "no key at all: lse = −∞, O = 0",
        "elided": "{shown} of {n} chunks shown here (attn flash --split-kv S -f json writes them "
        "all); the merge reads every chunk.",
    },
    "zh": {
        "m_line": "m_s = 这个查询在键 {s0}..{s1} 上的最大分数 = {value}",
        "l_line": "l_s = 对键 {s0}..{s1} 求 Σ exp(S − m_s) = {value}",
        "lse_line": "lse_s = m_s + {log}(l_s) = {m} + {log}({l}) = {value}",
        "O_line": "O_s = acc_s / l_s：这一段自己在键 {s0}..{s1} 上的 softmax · V = {value}",
        "hidden": "这一段的每个键对这个查询都被遮盖：m_s = lse_s = −∞，l_s = 0，O_s = 0",
        "m_star": "m* = max_s lse_s = max({terms}) = {value}",
        "lse": "lse = m* + {log} Σ_s {exp}(lse_s − m*) = {m} + {log}({terms}) = {value}",
        "w": "w_{s} = {exp}(lse_{s} − lse) = {exp}({a} − {b}) = {value}",
        "w_sink": "w_sink = {exp}(sink − lse) = {exp}({a} − {b}) = {value}",
        "O": "O = Σ_s w_s · O_s = {terms} = {value}",
        "empty": "没有任何键：lse = −∞，O = 0",
        "elided": "这里显示 {n} 段中的 {shown} 段（attn flash --split-kv S -f json 写出全部）；"
        "合并读取了每一段。",
    },
}


def _w(lang: Lang, key: str, **values: Any) -> str:
    return WORDS[lang][key].format(**values)


def split_page(run: SplitRun, options: RenderOptions | None = None, theme: str = "dark") -> str:
    """The chunks and the merge as one page: the overview, a section per chunk, the merge, the
    checks."""
    options = options or RenderOptions()
    p = Steps(run, options, "split")
    r = run.result
    sections = [(SPLIT_LABELS["en"]["page_overview"], _overview(p))]
    chunks: dict[str, Any] = {}
    picked = [s for s in picked_tiles(len(r.chunks)) if s is not None]
    if len(picked) < len(r.chunks):
        n = len(r.chunks)
        p.notes.append(
            f'<p class="note">{bilingual(lambda g: _w(g, "elided", shown=len(picked), n=n))}</p>'
        )
    for s in picked:
        c = r.chunks[s]
        name = SPLIT_LABELS["en"]["page_chunk"].format(s=s, s0=c.keys[0], s1=c.keys[1] - 1)
        sections.append((name, _chunk(p, s, chunks)))
    stages: dict[str, Any] = {}
    sections.append((SPLIT_LABELS["en"]["page_merge"], _merge(p, stages)))
    sections.append((SPLIT_LABELS["en"]["page_checks"], _checks(p)))
    title = f"{run.trace.inputs.name or 'attn'} · attn flash --split-kv {run.splits}"
    data = {
        "format": "attn-flash",
        "split_kv": run.splits,
        "tiles": chunks,
        "stages": stages or None,
    }
    return steps_page(p, title, sections, data, "hint", theme)


def _overview(p: Steps) -> str:
    run: SplitRun = p.run
    r = run.result
    bounds = ", ".join(f"{c.keys[0]}..{c.keys[1] - 1}" for c in r.chunks)
    lines = [
        bilingual(lambda lang: SPLIT_LABELS[lang]["title"].format(n=len(r.chunks))),
        bilingual(lambda lang: SPLIT_LABELS[lang]["bounds"].format(bounds=bounds)),
    ]
    if r.base2:
        lines.append(bilingual(lambda lang: SPLIT_LABELS[lang]["base2"]))
    if r.extra is not None:
        lines.append(bilingual(lambda lang: SPLIT_LABELS[lang]["extra"]))
    box = "".join(explained(run, explain, key) for key in ("split", "chunk", "merge", "weights"))
    return "".join(f"<p>{line}</p>" for line in lines) + box


def _public(run: SplitRun, a: Any) -> Any:
    return np.asarray(a if run.trace.inputs.has_batch else a[0])


def _chunk(p: Steps, s: int, kept: dict[str, Any]) -> str:
    """Chunk s: per (batch, head), each query's m, l, lse and O_s."""
    run: SplitRun = p.run
    c = run.result.chunks[s]
    inp = run.trace.inputs
    names = ("m", "l", "lse", "O")
    arrays = (c.m, c.l, c.lse, c.output)
    if p.keep(arrays):
        kept[str(s)] = {n: listed(_public(run, a)) for n, a in zip(names, arrays, strict=True)}
    s0, s1 = c.keys[0], c.keys[1] - 1
    log = "log2" if run.base2 else "log"
    queries = list(run.trace.query_labels)
    cols = ["m", "l", "lse", *(f"O_s {j}" for j in range(inp.d_v))]
    here, at = f'data-tile="{s}"', f"chunk {s}"
    out = []
    for b in range(inp.batch):
        lead = (b,) if inp.has_batch else ()
        for h in range(inp.heads):

            def cell(i: int, j: int, b: int = b, h: int = h, lead: tuple[int, ...] = lead) -> str:
                name = names[min(j, 3)]
                value = float(c.output[b, h, i, j - 3] if j >= 3 else arrays[j][b, h, i])
                index = (*lead, h, i, j - 3) if j >= 3 else (*lead, h, i)
                m, l = float(c.m[b, h, i]), float(c.l[b, h, i])  # noqa: E741

                def make(lang: Lang) -> dict[str, Any]:
                    title = f"{name}[{', '.join(map(str, index))}]"
                    if m == -math.inf:
                        return part_of(title, [_w(lang, "hidden")])
                    key = {"m": "m_line", "l": "l_line", "lse": "lse_line", "O": "O_line"}[name]
                    return part_of(
                        title,
                        [
                            _w(
                                lang,
                                key,
                                s0=s0,
                                s1=s1,
                                log=log,
                                m=p.n(m),
                                l=p.n(l),
                                value=p.n(value),
                            )
                        ],
                    )

                return p.cell(value, name, index, here, p.derive(make), at)

            out.append(p.table(where_at(lead, head=h), attrs_of(lead, head=h), queries, cols, cell))
    return "\n".join(out)


def _merge(p: Steps, kept: dict[str, Any]) -> str:
    """Per (batch, head): m*, the weights, lse, then O = Σ w_s·O_s."""
    run: SplitRun = p.run
    r = run.result
    m = r.merged
    inp = run.trace.inputs
    n = len(r.chunks)
    W = np.moveaxis(m.weights, 0, -1)  # (B, H, T, n [+ 1])
    arrays = {"m_star": m.m_star, "weights": W, "lse": m.lse, "output": m.output}
    if p.keep(list(arrays.values())):
        kept.update({k: listed(_public(run, a)) for k, a in arrays.items()})
    sink = ["w sink"] if r.extra is not None else []
    cols = ["m*", *(f"w {s}" for s in range(n)), *sink, "lse"]
    queries = list(run.trace.query_labels)
    out = []
    for b in range(inp.batch):
        lead = (b,) if inp.has_batch else ()
        for h in range(inp.heads):
            attrs = attrs_of(lead, head=h)
            where = where_at(lead, "m*, w_s, lse", head=h)
            out.append(p.table(where, attrs, queries, cols, _merge_cell(p, lead, b, h)))
            o_cols = [f"O {j}" for j in range(inp.d_v)]
            where = where_at(lead, "O = Σ w_s·O_s", head=h)
            out.append(p.table(where, attrs, queries, o_cols, _output_cell(p, lead, b, h)))
    return "\n".join(out)


def _states(run: SplitRun, b: int, h: int, i: int) -> list[float]:
    """The lse of each state the merge read for (b, h, i): the chunks', then the sink's."""
    r = run.result
    lses = [float(c.lse[b, h, i]) for c in r.chunks]
    return lses + ([] if r.extra is None else [float(r.extra[b, h])])


def _merge_cell(p: Steps, lead: tuple[int, ...], b: int, h: int) -> Any:
    run: SplitRun = p.run
    m = run.result.merged
    n_w = m.weights.shape[0]
    exp, log = ("exp2", "log2") if run.base2 else ("exp", "log")
    full = p.options.full

    def cell(i: int, j: int) -> str:
        lses = _states(run, b, h, i)
        lse, top = float(m.lse[b, h, i]), float(m.m_star[b, h, i])
        if j == 0:
            name, value, index = "m_star", top, (*lead, h, i)
        elif j <= n_w:
            name, value, index = "weights", float(m.weights[j - 1, b, h, i]), (*lead, h, i, j - 1)
        else:
            name, value, index = "lse", lse, (*lead, h, i)

        def make(lang: Lang) -> dict[str, Any]:
            title = f"{name}[{', '.join(map(str, index))}]"
            if top == -math.inf:
                return part_of(title, [_w(lang, "empty")])
            if name == "m_star":
                shown = sum_terms([p.n(x) for x in lses], full).replace(" + ", ", ")
                return part_of(title, [_w(lang, "m_star", terms=shown, value=p.n(value))])
            if name == "lse":
                terms = sum_terms([f"{exp}({p.n(x)} − {p.n(top)})" for x in lses], full)
                return part_of(
                    title,
                    [_w(lang, "lse", m=p.n(top), log=log, exp=exp, terms=terms, value=p.n(value))],
                )
            s = j - 1
            key = "w_sink" if s == len(run.result.chunks) else "w"
            return part_of(
                title, [_w(lang, key, s=s, exp=exp, a=p.n(lses[s]), b=p.n(lse), value=p.n(value))]
            )

        return p.cell(value, name, index, 'data-source="run"', p.derive(make), "merge")

    return cell


def _output_cell(p: Steps, lead: tuple[int, ...], b: int, h: int) -> Any:
    run: SplitRun = p.run
    r = run.result
    m = r.merged

    def cell(i: int, j: int) -> str:
        value = float(m.output[b, h, i, j])
        index = (*lead, h, i, j)

        def make(lang: Lang) -> dict[str, Any]:
            title = f"output[{', '.join(map(str, index))}]"
            terms = sum_terms(
                [
                    f"{p.f(m.weights[s, b, h, i])}×{p.f(c.output[b, h, i, j])}"
                    for s, c in enumerate(r.chunks)
                ],
                p.options.full,
            )
            return part_of(title, [_w(lang, "O", terms=terms, value=p.n(value))])

        return p.cell(value, "output", index, 'data-source="run"', p.derive(make), "merge")

    return cell


def _checks(p: Steps) -> str:
    """The checks: one-shot merge, fold, tree against plain rows, and the fold against the
    tree."""
    from attn_cli.present.flash_view import LABELS as FLASH_LABELS

    run: SplitRun = p.run
    labels = {lang: FLASH_LABELS[lang] | SPLIT_LABELS[lang] for lang in SPLIT_LABELS}

    def both(key: str) -> str:
        return bilingual(lambda lang: labels[lang][key])

    caption = f"<caption>{both('check_title')}</caption>"
    return check_table(run.checks, both, caption) + explained(run, explain, "orders")


def split_notebook_html(run: SplitRun, height: int = 640) -> str:
    """A split-KV run's notebook view: its page in a frame of its own."""
    return in_iframe(split_page(run, RenderOptions(), theme="light"), run.trace.inputs.name or "")


def _register() -> None:
    """Split-KV runs in a notebook show this page (check/runs.py RUN_HTML_VIEWS)."""
    from attn_cli.check.runs import RUN_HTML_VIEWS

    RUN_HTML_VIEWS["split_kv"] = split_notebook_html


_register()
