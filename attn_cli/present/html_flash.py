"""``attn flash -f html``: the FlashAttention loop as the stepped page of html_steps.py, tile
by tile: S, the running max m, alpha, P, the running sum l, the accumulator, skipped tiles, then
O and L; every number cell derives from the run's tiles (``data-tile=K``) or its stages.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli.present.explain_registry import sum_terms
from attn_cli.present.html_page import (
    bilingual,
    in_iframe,
    listed,
)
from attn_cli.present.html_steps import (
    Steps,
    attrs_of,
    check_table,
    explained,
    part_of,
    picked_tiles,
    short_steps,
    steps_page,
    view_label,
    where_at,
    word,
)
from attn_cli.present.i18n import Lang, label
from attn_cli.present.options import RenderOptions
from attn_cli.present.text import (
    format_number,
    safe,
)
from attn_cli.present.variants import extra_logit

if TYPE_CHECKING:
    from attn_cli.check.runs import FlashRun
    from attn_cli.core.flash import Tile

FLASH_EXPLAINED = ("loop", "skipped", "S", "m", "alpha", "P", "l", "acc", "O", "L", "check")


def flash_page(run: FlashRun, options: RenderOptions | None = None, theme: str = "auto") -> str:
    """The FlashAttention loop as one page: the overview, a section per tile shown, O and L."""
    p = short_steps(run, options, "flash")
    run = p.run
    picked = picked_tiles(len(run.tiles))
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
    out.append(check_table(run.checks, _check_label))
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
        return view_label(FLASH_LABELS, key)
    return bilingual(lambda lang: label(lang, key))


def flash_notebook_html(run: FlashRun, height: int = 640) -> str:
    """A flash run's notebook view: its page in a frame of its own."""
    return in_iframe(flash_page(run, RenderOptions(), theme="light"), run.trace.inputs.name or "")


def _register() -> None:
    """Flash runs in a notebook show this page (check/runs.py RUN_HTML_VIEWS)."""
    from attn_cli.check.runs import RUN_HTML_VIEWS

    RUN_HTML_VIEWS["flash"] = flash_notebook_html


_register()
