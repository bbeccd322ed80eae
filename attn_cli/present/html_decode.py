"""``attn decode -f html``: the decode as the stepped page of html_steps.py, token by token.

Each step's query, its cache (growing, or the ring buffer of a window with its slot indices, or
MLA's latent cache), the scores to the output, and the step's row against the full attention
(the self-check); every number cell derives from the run's steps (``data-step=K``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli.present.explain_registry import pick_terms, sum_terms
from attn_cli.present.html_maps import MAP_ROWS, map_part
from attn_cli.present.html_page import (
    bilingual,
    esc,
    in_iframe,
    listed,
)
from attn_cli.present.html_steps import (
    Steps,
    attrs_of,
    decode_steps_page,
    explained,
    part_of,
    short_steps,
    softmax_rows,
    step_sections,
    view_label,
    where_at,
    word,
)
from attn_cli.present.i18n import Lang, axis_title
from attn_cli.present.options import RenderOptions
from attn_cli.present.text import (
    pick_steps,
    safe,
    short_number,
)
from attn_cli.present.variants import extra_logit

if TYPE_CHECKING:
    from attn_cli.check.runs import DecodeRun
    from attn_cli.core.decode import DecodeStep

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


def decode_page(run: DecodeRun, options: RenderOptions | None = None, theme: str = "auto") -> str:
    """The decode as one page: the overview, a section per step shown, the self-check."""
    from attn_cli.present.decode_view import LABELS as DECODE_LABELS

    p = short_steps(run, options, "decode")
    run = p.run
    steps = run.result.steps

    def name(k: int) -> str:
        step = steps[k]
        return f"{k + 1}: {safe(run.label(step.index))}@{step.position} → {step.slot}"

    sections, kept = step_sections(
        p,
        len(steps),
        _decode_overview(run, DECODE_LABELS),
        name,
        lambda k, kept: _decode_step(p, k, kept, DECODE_LABELS),
        lambda: _decode_checks(run, DECODE_LABELS),
    )
    return decode_steps_page(p, sections, kept, theme)


def _decode_overview(run: DecodeRun, labels: Any) -> str:
    """What the prefill covered, how many steps, the cache's cost per token."""
    from attn_cli.present.decode_explain import explain

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
    from attn_cli.present.decode_explain import explain
    from attn_cli.present.decode_view import block_table, pool_rows

    assert run.paged is not None and run.result.prefill_pages is not None
    table = run.result.prefill_pages.table
    rows = {lang: pool_rows(run, lang) for lang in ("en", "zh")}
    out = [f"<p><b>{view_label(labels, 'pool_title')}</b></p>", '<table class="m"><tr>']
    out += [
        f"<th>{view_label(labels, h)}</th>" for h in ("col_layout", "col_slots_pool", "col_bytes")
    ]
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

    def cell(j: int) -> tuple[str, float, float]:
        label = f"{j}: {held[j] or '—'}" + (" ◀" if j == s else "")
        return label, float(row[j]), float(weights[j])

    picked = pick_terms(len(row), p.options.full, keep=s)
    rows = softmax_rows(p, parts, picked, cell, sink, lang)
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
    out += [f"<th>{view_label(labels, h)}</th>" for h in heads]
    out.append("</tr>")
    steps = run.result.steps
    for k in pick_steps(len(steps), False):
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


def _register() -> None:
    """Decode runs in a notebook show this page (check/runs.py RUN_HTML_VIEWS)."""
    from attn_cli.check.runs import RUN_HTML_VIEWS

    RUN_HTML_VIEWS["decode"] = decode_notebook_html


_register()
