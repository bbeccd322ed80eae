"""``attn decode F1 F2 ... --batch -f html``: the continuous batch as the decode page
(html_steps.py, the same template and script), a section per step of the batch: the packed query
rows (which sequence and token each is, prefill, chunk or decode), ``cu_seqlens``, who joins and
who leaves, the block tables and reference counts of a paged batch, the block-diagonal mask,
each head's softmax over the packed keys, every packed row's output, the self-check.

Each number cell is ``<td data-stage=NAME data-index=H,R,N data-step=K>`` with NAME and the index
as in ``attn decode ... --batch -f json``'s ``steps[K].stages`` (scores, masked, softmax,
output: (heads, packed rows, packed keys or d_v)). A weight's derivation is exp(x − m)/Σ over
its packed row (the −∞ of the other sequences' keys giving 0); an output entry's is
Σ weight × V over the packed keys, shown only where recomputing it gives the cell's value (a
latent cache's W_UV or a gate after it: the cell says what it is).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from attn_cli.present.batch_view import LABELS, explain, page_lines, pool_notes
from attn_cli.present.explain_registry import pick_terms, sum_terms
from attn_cli.present.html_page import LANGS, bilingual, esc, listed
from attn_cli.present.html_steps import (
    MAX_STEPS,
    Steps,
    attrs_of,
    explained,
    part_of,
    softmax_rows,
    step_sections,
    steps_page,
    word,
)
from attn_cli.present.i18n import Lang
from attn_cli.present.options import RenderOptions
from attn_cli.present.run_view import lookup
from attn_cli.present.text import short_number, with_short_labels
from attn_cli.present.variants import extra_logit
from attn_cli.present.worked import softmax_parts

if TYPE_CHECKING:
    from attn_cli.check.batch_runs import BatchRun

STAGES = ("scores", "masked", "softmax", "output")  # a step's, as the batch JSON names them
MAX_TERMS = 64  # a derivation's terms shown whole with --full; past it the middle elides
WORDS: dict[Lang, dict[str, str]] = {
    "en": {
        "col_phase": "what",
        "prefill": "prefill",
        "chunk": "prefill chunk {i} of {n}",
        "decode": "decode",
        "weight": "weight over the packed keys of row {r} ({who}), head {h}: m = the row's "
        "maximum = {m}; the other sequences' keys are −∞ (weight 0)",
        "weight_sink": "weight over the packed keys of row {r} ({who}) and the sink {sink}, "
        "head {h}: m = {m}; the other sequences' keys are −∞ (weight 0)",
        "empty": "row {r} may attend no key: every weight is 0",
        "exp_sum": "Σ e^(x − m) = {total}; weight of key {c} = {e} / {total} = {w}",
        "col_key": "packed key",
        "out": "output[head {h}, row {r}, {j}] = Σ weight × V[key, {j}] over the packed keys "
        "of the row's own sequence (V of its kv head {g}; every other key's weight is 0):",
        "out_line": "= {terms} = {value}",
        "what": "{name}[head {h}, row {r}, {c}]: {what}, as the batch's step computed it",
        "what_output": "the row's output after its sequence's own finish (a latent cache's "
        "W_UV, a gate)",
    },
    "zh": {
        "col_phase": "阶段",
        "prefill": "预填充",
        "chunk": "预填充第 {i} 块（共 {n} 块）",
        "decode": "解码",
        "weight": "第 {r} 行（{who}）在头 {h} 对打包键的权重：m = 这一行的最大值 = {m}；"
        "其他序列的键为 −∞（权重为 0）",
        "weight_sink": "第 {r} 行（{who}）在头 {h} 对打包键和汇点 {sink} 的权重：m = {m}；"
        "其他序列的键为 −∞（权重为 0）",
        "empty": "第 {r} 行没有可以看的键：所有权重都是 0",
        "exp_sum": "Σ e^(x − m) = {total}；键 {c} 的权重 = {e} / {total} = {w}",
        "col_key": "打包键",
        "out": "output[头 {h}, 行 {r}, {j}] = Σ 权重 × V[键, {j}]，对这一行所在序列的打包键求和"
        "（取它的键值头 {g} 的 V；其他键的权重都是 0）：",
        "out_line": "= {terms} = {value}",
        "what": "{name}[头 {h}, 行 {r}, {c}]：{what}，由批处理的这一步算出",
        "what_output": "这一行经过它所在序列自己的收尾（潜在缓存的 W_UV、门控）之后的输出",
    },
}


def _b(lang: Lang, key: str, **values: Any) -> str:
    return WORDS[lang][key].format(**values)


_t = partial(lookup, LABELS)  # a label of LABELS in a language, filled in


def short_batch(run: BatchRun) -> BatchRun:
    """The run with every sequence's token labels cut (present/text.py ``with_short_labels``)."""
    return replace(run, traces=tuple(with_short_labels(t) for t in run.traces))


def batch_page(run: BatchRun, options: RenderOptions | None = None, theme: str = "auto") -> str:
    """The batch as one page: the sequences, a section per step shown, the self-check."""
    options = options or RenderOptions()
    tokens = {name: t.inputs.tokens for name, t in zip(run.names, run.traces, strict=True)}
    run = short_batch(run)
    p = Steps(run, options, "decode")
    steps = run.result.steps
    sections, kept = step_sections(
        p,
        len(steps),
        _overview(run),
        lambda k: f"{k + 1}: {len(steps[k].rows)} × {len(steps[k].keys)}",
        lambda k, kept: _step(p, k, kept),
        lambda: _checks(run),
    )
    more = " …" if len(run.names) > 1 else ""
    title = f"{run.names[0]}{more} · attn decode --batch"
    data = {"format": "attn-decode-batch", "steps": kept, "sequences": tokens}
    return steps_page(p, title, sections, data, "hint", theme)


def _table(caption: str, heads: list[str], rows: list[list[str]]) -> str:
    """A table of words (markup: each caption and header already in both languages)."""
    out = [f'<table class="m"><caption>{caption}</caption><tr>']
    out += [f"<th>{h}</th>" for h in heads]
    out.append("</tr>")
    out += ["<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows]
    return "".join(out) + "</table>"


def _heads(keys: tuple[str, ...]) -> list[str]:
    return [bilingual(lambda lang, k=k: _t(lang, k)) for k in keys]


def _overview(run: BatchRun) -> str:
    """What a step does, the table of sequences, the pool of a paged batch, explanations."""
    members = run.result.members
    chunk = members[0].chunk

    def how(lang: Lang) -> str:
        return _t(lang, "chunked", c=chunk) if chunk else _t(lang, "whole")

    overview = bilingual(lambda lang: _t(lang, "overview", n=len(members), chunked=how(lang)))
    out = [f"<p><b>{bilingual(lambda lang: _t(lang, 'title'))}</b></p>", f"<p>{overview}</p>"]
    heads = ("col_index", "col_seq", "col_tokens", "col_arrive", "col_prefill", "col_leaves")
    rows = [
        [str(j), esc(m.name), str(m.tokens), str(m.arrive), str(m.prefill), str(m.leaves - 1)]
        for j, m in enumerate(members)
    ]
    out.append(_table(bilingual(lambda lang: _t(lang, "seq_title")), _heads(heads), rows))
    out += _pool(run)
    keys = ["packed", "cu_seqlens", "mask", "check"]
    if run.result.share:
        keys += ["prefix", "cow"]
    out += [explained(run, explain, key) for key in keys]
    return "".join(out)


def _pool(run: BatchRun) -> list[str]:
    """A paged batch's pool (batch_view.pool_notes), each note in both languages."""
    both = {lang: pool_notes(run, lang) for lang in LANGS}
    return [f"<p>{bilingual(lambda lang, n=n: both[lang][n])}</p>" for n in range(len(both["en"]))]


def _phase(run: BatchRun, j: int, token: int, lang: Lang) -> str:
    """Whether a row is its prompt's (all at once, or which chunk) or a generated token's."""
    m = run.result.members[j]
    if token >= m.prefill:
        return _b(lang, "decode")
    if m.chunk is None or m.chunk >= m.prefill:
        return _b(lang, "prefill")
    return _b(lang, "chunk", i=token // m.chunk + 1, n=-(-m.prefill // m.chunk))


def _step(p: Steps, k: int, kept: dict[str, Any]) -> str:
    """One step: who is packed where, the pool, the mask, each head's weights, the outputs."""
    run: BatchRun = p.run
    step = run.result.steps[k]
    arrays = [step.scores, step.masked, step.softmax, step.output]
    if p.keep(arrays):
        kept[str(k)] = {
            "step": step.step,
            "stages": {
                name: {"shape": list(a.shape), "data": listed(a)}
                for name, a in zip(STAGES, arrays, strict=True)
            },
        }
    names = run.names
    title = bilingual(
        lambda lang: _t(lang, "step", s=step.step, r=len(step.rows), k=len(step.keys))
    )
    cu = bilingual(
        lambda lang: _t(lang, "cu", q=list(step.cu_seqlens_q), k=list(step.cu_seqlens_k))
    )
    out = [f"<p><b>{title}</b></p>", f"<p>{cu}</p>"]
    for key, who in (("joins", step.entering), ("leaves", step.leaving)):
        if who:
            text = bilingual(
                lambda lang, key=key, who=who: _t(lang, key, names=", ".join(names[j] for j in who))
            )
            out.append(f'<p class="note">{text}</p>')
    lines = {lang: page_lines(run, k, lang) for lang in ("en", "zh")}
    out += [
        f'<p class="note">{bilingual(lambda lang, n=n: lines[lang][n])}</p>'
        for n in range(len(lines["en"]))
    ]
    out.append(_rows(run, k))
    rows = [run.label(j, t) for j, t in step.rows]
    keys = [run.label(j, t) for j, t in step.keys]
    out.append(_mask(p, k, rows, keys))
    at, where = f"step {k + 1}", f'data-step="{k}"'
    for h in range(step.softmax.shape[0]):

        def weight(r: int, c: int, h: int = h) -> str:
            w = p.derive(lambda lang: _weight(p, k, h, r, c, keys, lang))
            return p.cell(step.softmax[h, r, c], "softmax", (h, r, c), where, w, at)

        caption = bilingual(lambda lang, h=h: _t(lang, "softmax_title", h=h))
        out.append(p.table(caption, attrs_of((), head=h), rows, keys, weight))
    d_v = [str(j) for j in range(step.output.shape[-1])]
    for h in range(step.output.shape[0]):

        def output(r: int, c: int, h: int = h) -> str:
            w = p.derive(lambda lang: _output(p, k, h, r, c, keys, lang))
            return p.cell(step.output[h, r, c], "output", (h, r, c), where, w, at)

        caption = bilingual(lambda lang, h=h: _t(lang, "output_title", h=h))
        out.append(
            p.table(
                caption, attrs_of((), head=h), rows, d_v, output, full_rows=len(rows) <= MAX_STEPS
            )
        )
    out += [_check(run, j, [t for i, t in step.rows if i == j]) for j in step.present]
    return "\n".join(out)


def _rows(run: BatchRun, k: int) -> str:
    """The packed query rows: which sequence and token each is, its position, its phase."""
    step = run.result.steps[k]
    members = run.result.members
    heads = [
        *_heads(("col_row", "col_index", "col_seq", "col_token", "col_pos")),
        bilingual(lambda lang: _b(lang, "col_phase")),
    ]
    rows = [
        [
            str(r),
            str(j),
            esc(run.names[j]),
            esc(run.traces[j].query_labels[t]),
            str(int(members[j].positions[t])),
            bilingual(lambda lang, j=j, t=t: _phase(run, j, t, lang)),
        ]
        for r, (j, t) in enumerate(step.rows)
    ]
    return _table(bilingual(lambda lang: _t(lang, "rows_title")), heads, rows)


def _mask(p: Steps, k: int, rows: list[str], keys: list[str]) -> str:
    """The block-diagonal mask over the packed rows and keys (the JSON's ``mask``): 0 or −∞."""
    step = p.run.result.steps[k]

    def cell(r: int, c: int) -> str:
        if step.mask[r, c]:
            return f'<td data-mask="{r},{c}">0</td>'
        return f'<td class="masked" data-mask="{r},{c}">−∞</td>'

    caption = bilingual(lambda lang: _t(lang, "mask_title"))
    return p.table(caption, "", rows, keys, cell)


def _who(run: BatchRun, r: int, k: int) -> str:
    j, t = run.result.steps[k].rows[r]
    return f"{run.names[j]}, {run.traces[j].query_labels[t]}"


def _own(step: Any, r: int) -> range:
    """The packed keys of row r's own sequence (every other key is −∞ to it: weight 0)."""
    n = step.present.index(step.rows[r][0])
    return range(step.cu_seqlens_k[n], step.cu_seqlens_k[n + 1])


def _weight(
    p: Steps, k: int, h: int, r: int, c: int, keys: list[str], lang: Lang
) -> dict[str, Any]:
    """exp(x − m) / Σ over the row's own keys in the pack (and its sequence's sink)."""
    run: BatchRun = p.run
    step = run.result.steps[k]
    own = _own(step, r)
    row, weights = step.masked[h, r, own.start : own.stop], step.softmax[h, r]
    sink = extra_logit(run.traces[step.rows[r][0]].inputs, h)
    at = f"softmax[{h}, {r}, {c}]"
    parts = softmax_parts([float(x) for x in row], sink)
    if parts is None:
        return part_of(at, [_b(lang, "empty", r=r)])
    n, prec = p.n, p.options.precision
    who = _who(run, r, k)
    m = n(parts.row_max)
    head = (
        _b(lang, "weight", r=r, who=who, h=h, m=m)
        if sink is None
        else _b(lang, "weight_sink", r=r, who=who, h=h, m=m, sink=n(sink))
    )
    every = p.options.full and len(own) <= MAX_TERMS  # a long row's terms elide even with --full

    def cell(i: int) -> tuple[str, float, float]:
        key = own.start + i
        label = f"{key}: {keys[key]}" + (" ◀" if key == c else "")
        return label, float(row[i]), float(weights[key])

    picked = pick_terms(len(own), every, keep=c - own.start if c in own else None)
    rows = softmax_rows(p, parts, picked, cell, sink, lang)
    e = parts.exps[c - own.start] if c in own else 0.0  # another sequence's key: e^(−∞) = 0
    footer = [
        _b(
            lang,
            "exp_sum",
            total=n(parts.total),
            c=c,
            e=short_number(e, prec),
            w=short_number(float(weights[c]), prec),
        )
    ]
    header = (_b(lang, "col_key"), "masked", "x − m", "e^(x − m)", word(lang, "col_weight"))
    return part_of(at, [head], header, rows, footer)


def _output(
    p: Steps, k: int, h: int, r: int, c: int, keys: list[str], lang: Lang
) -> dict[str, Any]:
    """Σ weight × V over the packed keys, where that sum is the cell's value."""
    run: BatchRun = p.run
    step = run.result.steps[k]
    members = run.result.members
    value = float(step.output[h, r, c])
    g = h // (step.softmax.shape[0] // int(members[0].v.shape[1]))
    at = f"output[{h}, {r}, {c}]"
    j = step.rows[r][0]
    if members[j].finish is None and members[j].after is None:
        own = _own(step, r)  # the other sequences' keys: weight 0
        weights = [float(step.softmax[h, r, i]) for i in own]
        values = [float(members[i].v[0, g, t, c]) for i, t in step.keys[own.start : own.stop]]
        got = math.fsum(w * v for w, v in zip(weights, values, strict=True))
        if math.isclose(got, value, rel_tol=1e-9, abs_tol=1e-12):
            terms = [f"{p.n(w)}×{p.f(v)}" for w, v in zip(weights, values, strict=True)]
            every = p.options.full and len(terms) <= MAX_TERMS
            return part_of(
                at,
                [
                    _b(lang, "out", h=h, r=r, j=c, g=g),
                    _b(lang, "out_line", terms=sum_terms(terms, every), value=p.n(value)),
                ],
            )
    line = _b(lang, "what", name="output", h=h, r=r, c=c, what=_b(lang, "what_output"))
    return part_of(at, [line, f"= {p.n(value)}"])


def _check(run: BatchRun, j: int, tokens: list[int]) -> str:
    """A sequence's rows of this step against its own decode and the full rows."""
    solo = max(run.solo[j][t] for t in tokens)
    full = max(run.full[j][t] for t in tokens)

    def mark(x: float) -> str:
        return "✓" if x <= run.tolerance else "✗"

    line = bilingual(
        lambda lang: _t(
            lang,
            "check",
            name=run.names[j],
            solo=f"{solo:.3e}",
            full=f"{full:.3e}",
            m1=mark(solo),
            m2=mark(full),
        )
    )
    return f'<p class="check">{line}</p>'


def _checks(run: BatchRun) -> str:
    """Every sequence's largest differences from its own decode, the full rows, contiguous."""
    heads = ["col_seq", "col_tokens", "col_solo", "col_full"]
    if run.contiguous is not None:
        heads.append("col_contiguous")
    rows = []
    for j, name in enumerate(run.names):
        near = () if run.contiguous is None else (run.contiguous[j],)
        cells = [esc(name), str(len(run.solo[j]))]
        for diffs in (run.solo[j], run.full[j], *near):
            worst = max(diffs)
            cells.append(f"{worst:.3e} {'✓' if worst <= run.tolerance else '✗'}")
        rows.append(cells)
    return _table(bilingual(lambda lang: _t(lang, "check_title")), _heads(tuple(heads)), rows)
