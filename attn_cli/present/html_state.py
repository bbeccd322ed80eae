"""``attn decode -f html`` of a recurrent-state decode (linear attention, Gated DeltaNet): the
decode page (html_steps.py) with a section per step of what the state view shows (the numbers
the token read, the state after it, its output), the state ledger and the self-checks.

Each number cell is ``<td data-stage=NAME data-index=I,J,... data-step=K>`` with NAME and the
index as in ``attn decode -f json``'s ``steps[K].stages`` (the state's parts as ``state.S``,
``state.z``, ``state.conv``). A derivation shows the numbers it is made of when the update it
names is recomputed here to the cell's value (S_t = S_{t−1} + φ(k)vᵀ, num = φ(q)ᵀS, ...);
every other cell's derivation says what the cell is (the variant's formula), never a formula
that does not give its value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli.present.html_page import bilingual, esc, listed
from attn_cli.present.html_steps import (
    Steps,
    attrs_of,
    decode_steps_page,
    explained,
    part_of,
    short_steps,
    step_sections,
    where_at,
)
from attn_cli.present.i18n import Lang, axis_title
from attn_cli.present.options import RenderOptions
from attn_cli.present.text import pick_steps, safe

if TYPE_CHECKING:
    from attn_cli.check.state_runs import StateRun

STATE_WORDS: dict[Lang, dict[str, str]] = {
    "en": {
        "what": "{name}: {formula} (the variant's formula; this number is taken as the decode "
        "step computed it)",
        "S_add": "S_t = S_{{t−1}} + φ(k)vᵀ: S[{i}, {j}] = {prev} + {k}×{v} = {value}",
        "z_add": "z_t = z_{{t−1}} + φ(k): z[{i}] = {prev} + {k} = {value}",
        "num": "num[{j}] = Σ_i φ(q)_i·S[i, {j}] = {terms} = {value}",
        "den": "den = Σ_i φ(q)_i·z_i = {terms} = {value}",
        "out_div": "output[{j}] = φ(q)ᵀS / φ(q)ᵀz = num / den = {num} / {den} = {value}",
        "kv_mem": "kv_mem[{j}] = Σ_i S_{{t−1}}[i, {j}]·e^g·k_i = Σ ({terms}) × {eg} = {value}",
        "delta": "delta[{j}] = beta·(v − kv_mem) = {beta} × ({v} − {mem}) = {value}",
        "S_delta": "S_t = S_{{t−1}}·e^g + k·deltaᵀ: S[{i}, {j}] = {prev} × {eg} + {k}×{d} = "
        "{value}",
        "out_sq": "output[{j}] = Σ_i S_t[i, {j}]·q_i = {terms} = {value}",
        "prev_prefill": "S_{t−1}, z_{t−1}: the state after the prefill",
        "prev_step": "S_{{t−1}}, z_{{t−1}}: the state after step {k}",
        "now": "S_t, z_t: this step's state, after its update",
        "ledger_step": "state: {state} bytes at every length; softmax attention's KV cache of "
        "the same heads after {t} tokens: {kv} bytes",
    },
    "zh": {
        "what": "{name}：{formula}（该变体的公式；这个数取自解码这一步的计算）",
        "S_add": "S_t = S_{{t−1}} + φ(k)vᵀ：S[{i}, {j}] = {prev} + {k}×{v} = {value}",
        "z_add": "z_t = z_{{t−1}} + φ(k)：z[{i}] = {prev} + {k} = {value}",
        "num": "num[{j}] = Σ_i φ(q)_i·S[i, {j}] = {terms} = {value}",
        "den": "den = Σ_i φ(q)_i·z_i = {terms} = {value}",
        "out_div": "output[{j}] = φ(q)ᵀS / φ(q)ᵀz = num / den = {num} / {den} = {value}",
        "kv_mem": "kv_mem[{j}] = Σ_i S_{{t−1}}[i, {j}]·e^g·k_i = Σ ({terms}) × {eg} = {value}",
        "delta": "delta[{j}] = beta·(v − kv_mem) = {beta} × ({v} − {mem}) = {value}",
        "S_delta": "S_t = S_{{t−1}}·e^g + k·deltaᵀ：S[{i}, {j}] = {prev} × {eg} + {k}×{d} = "
        "{value}",
        "out_sq": "output[{j}] = Σ_i S_t[i, {j}]·q_i = {terms} = {value}",
        "prev_prefill": "S_{t−1}、z_{t−1}：预填充之后的状态",
        "prev_step": "S_{{t−1}}、z_{{t−1}}：第 {k} 步之后的状态",
        "now": "S_t、z_t：这一步更新之后的状态",
        "ledger_step": "状态：无论多长都是 {state} 字节；同样头数的 softmax 注意力在 {t} 个词之后"
        "的 KV 缓存：{kv} 字节",
    },
}


def _s(lang: Lang, key: str, **values: Any) -> str:
    text = STATE_WORDS[lang][key]
    return text.format(**values) if values else text.replace("{{", "{").replace("}}", "}")


def step_stages(trace: Any, step: Any) -> list[tuple[str, Any]]:
    """A step's numbers as ``attn decode -f json`` names them (io/decode_json.py state_dumps),
    each with its batch axis."""
    return [
        *step.read.items(),
        *((f"state.{k}", x) for k, x in (step.state or {}).items()),
        ("output", step.output),
        *step.outs.items(),
    ]


def state_page(run: StateRun, options: RenderOptions | None = None, theme: str = "auto") -> str:
    """The state decode as one page: the overview and ledger, a section per step, the checks."""
    p = short_steps(run, options, "decode")
    run = p.run
    steps = run.result.steps

    def name(k: int) -> str:
        return f"{k + 1}: {safe(run.label(steps[k].index))}@{steps[k].position}"

    sections, kept = step_sections(
        p, len(steps), _overview(run), name, lambda k, kept: _step(p, k, kept), lambda: _checks(run)
    )
    return decode_steps_page(p, sections, kept, theme)


def _t(lang: Lang, key: str, **values: Any) -> str:
    from attn_cli.present.state_view import LABELS

    return LABELS[lang][key].format(**values)


def _overview(run: StateRun) -> str:
    from attn_cli.present.state_view import LEDGER_TOKENS, explain, ledger_formula

    P = run.result.prefill
    tokens = ", ".join(safe(run.label(i)) for i in range(P))
    c = run.ledger
    out = [
        f"<p><b>{bilingual(lambda lang: _t(lang, 'title'))}</b></p>",
        f"<p>{bilingual(lambda lang: _t(lang, 'overview', p=P, tokens=tokens))}</p>",
        f"<p>{bilingual(lambda lang: _t(lang, 'steps', n=len(run.result.steps)))}</p>",
    ]
    heads = ("col_tokens", "col_state", "col_kv", "col_ratio")
    out.append(
        f'<table class="m"><caption>{bilingual(lambda lang: _t(lang, "ledger_title"))}'
        "</caption><tr>"
        + "".join(f"<th>{bilingual(lambda lang, h=h: _t(lang, h))}</th>" for h in heads)
        + "</tr>"
    )
    rows = [("row_prefill", P), ("row_last", c.seq)]
    rows += [("", t) for t in LEDGER_TOKENS if t > c.seq]
    for key, t in rows:
        name = bilingual(lambda lang, key=key, t=t: _t(lang, key, t=t)) if key else f"{t:,}"
        kv = c.kv_at(t)
        out.append(
            f"<tr><td>{name}</td><td>{c.state:,}</td><td>{kv:,}</td>"
            f"<td>{kv / c.state:,.2f}</td></tr>"
        )
    out.append("</table>")
    formula = bilingual(lambda lang: ledger_formula(run, lang))
    out.append(f"<p>{formula}</p>")
    if run.trace.inputs.has_batch:
        out.append(
            f"<p>{bilingual(lambda lang: _t(lang, 'batch_note', b=run.trace.inputs.batch))}</p>"
        )
    out += [explained(run, explain, key) for key in ("state", "ledger", "check")]
    return "".join(out)


def _checks(run: StateRun) -> str:
    """Every step's largest difference from the chunked form, and the prefill's."""
    heads = ("col_step", "col_token", "col_pos", "col_state", "col_kv", "col_diff")
    out = [
        f'<table class="m"><caption>{bilingual(lambda lang: _t(lang, "check_title"))}</caption>'
        "<tr>"
        + "".join(f"<th>{bilingual(lambda lang, h=h: _t(lang, h))}</th>" for h in heads)
        + "</tr>"
    ]
    steps, c = run.result.steps, run.ledger
    for k in pick_steps(len(steps), False):
        if k is None:
            out.append("<tr>" + "<td>…</td>" * len(heads) + "</tr>")
            continue
        s, diff = steps[k], run.diffs[k]
        mark = "✓" if diff <= run.tolerance else "✗"
        out.append(
            f"<tr><td>{k + 1}</td><td>{esc(run.label(s.index))}</td><td>{s.position}</td>"
            f"<td>{c.state:,}</td><td>{c.kv_at(s.index + 1):,}</td>"
            f"<td>{diff:.3e} {mark}</td></tr>"
        )
    out.append("</table>")
    mark = "✓" if run.prefill_diff <= run.tolerance else "✗"
    pre = bilingual(
        lambda lang: _t(
            lang, "check_prefill", diff=f"{run.prefill_diff:.3e}", mark=mark, stage=run.checked
        )
    )
    return "".join(out) + f"<p>{pre}</p>"


def _previous(run: StateRun, k: int) -> dict[str, Any] | None:
    """The state before step k (with its batch axis), None where it was not kept."""
    if k == 0:
        return dict(run.result.prefill_state)
    before = run.result.steps[k - 1].state
    return None if before is None else dict(before)


def _step(p: Steps, k: int, kept: dict[str, Any]) -> str:
    """One token: the numbers it read, the state after it, its output, the ledger, the check."""
    run: StateRun = p.run
    step = run.result.steps[k]
    inp = run.trace.inputs
    named = step_stages(run.trace, step)
    if p.keep([x for _, x in named]):
        kept[str(k)] = {
            "index": step.index,
            "stages": {
                name: {
                    "shape": list(np.shape(x if inp.has_batch else x[0])),
                    "data": listed(np.asarray(x if inp.has_batch else x[0])),
                }
                for name, x in named
            },
        }
    token = repr(safe(run.label(step.index)))
    n_steps = len(run.result.steps)
    where = bilingual(
        lambda lang: _t(lang, "step", k=k + 1, n=n_steps, token=token, pos=step.position)
    )
    prev = (
        (lambda lang: _s(lang, "prev_prefill"))
        if k == 0
        else (lambda lang: _s(lang, "prev_step", k=k))
    )
    out = [f"<p>{where}</p>", f'<p class="note">{bilingual(prev)}</p>']
    arrays = {name: np.asarray(x) for name, x in named}
    before = _previous(run, k)
    for b in range(inp.batch):
        lead = (b,) if inp.has_batch else ()
        for name, x in arrays.items():
            out += _tables(p, k, name, x, lead, arrays, before)
    c = run.ledger
    ledger = bilingual(
        lambda lang: _s(
            lang,
            "ledger_step",
            state=f"{c.state:,}",
            t=step.index + 1,
            kv=f"{c.kv_at(step.index + 1):,}",
        )
    )
    diff = run.diffs[k]
    mark = "✓" if diff <= run.tolerance else "✗"
    check = bilingual(
        lambda lang: _t(
            lang,
            "check",
            token=token,
            diff=f"{diff:.3e}",
            mark=mark,
            tol=f"{run.tolerance:g}",
            stage=run.checked,
        )
    )
    out += [f'<p class="note">{ledger}</p>', f'<p class="check">{check}</p>']
    return "\n".join(out)


def _head_labels(n: int) -> list[str]:
    return [bilingual(lambda lang, h=h: f"{axis_title(lang, 'head')} {h}") for h in range(n)]


def _tables(
    p: Steps,
    k: int,
    name: str,
    x: Any,
    lead: tuple[int, ...],
    arrays: dict[str, Any],
    before: dict[str, Any] | None,
) -> list[str]:
    """A stage's tables: a row per head (read numbers, output), a d_k × d_v matrix per head
    (S), the conv window (a row per earlier token)."""
    b = lead[0] if lead else 0
    a = x[b]
    here, at = f'data-step="{k}"', f"step {k + 1}"

    def make(index: tuple[int, ...]) -> str:
        w = p.derive(lambda lang: _derive(p, k, name, index, b, arrays, before, lang))
        return p.cell(a[index], name, (*lead, *index), here, w, at)

    cols = [str(j) for j in range(a.shape[-1])]
    if a.ndim == 3 and a.shape[1] != 1:  # (H, d_k, d_v): a matrix per head
        rows = [str(i) for i in range(a.shape[1])]

        def matrix(h: int) -> str:
            return p.table(
                where_at(lead, name, head=h),
                attrs_of(lead, head=h),
                rows,
                cols,
                lambda i, j: make((h, i, j)),
            )

        return [matrix(h) for h in range(a.shape[0])]
    if a.ndim == 2 and name == "state.conv":  # (K−1, C): the window of the tokens before
        n = a.shape[0]
        rows = [f"t−{n - i}" for i in range(n)]
        return [
            p.table(where_at(lead, name), attrs_of(lead), rows, cols, lambda i, j: make((i, j)))
        ]
    # a row per head: (H, d) the numbers read, (H, 1, d_v) output and the transforms of it
    middle = (0,) if a.ndim == 3 else ()
    return [
        p.table(
            where_at(lead, name),
            attrs_of(lead),
            _head_labels(a.shape[0]),
            cols,
            lambda h, j: make((h, *middle, j)),
            marked_rows=True,
        )
    ]


def _close(x: float, y: float) -> bool:
    return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)


def _derive(
    p: Steps,
    k: int,
    name: str,
    index: tuple[int, ...],
    b: int,
    arrays: dict[str, Any],
    before: dict[str, Any] | None,
    lang: Lang,
) -> dict[str, Any]:
    """The update that made the cell, with its numbers, when recomputing it gives the cell's
    value; else what the cell is."""
    at = f"{name}[{', '.join(map(str, index))}]"
    value = float(arrays[name][b][index])
    A = {n: x[b] for n, x in arrays.items()}
    prev = None if before is None else {n: np.asarray(x)[b] for n, x in before.items()}
    line = _worked(Update(p, name, index, A, prev, value, lang))
    if line is not None:
        if name in ("state.S", "state.z", "kv_mem"):  # read the state before the token
            line.append(_s(lang, "prev_prefill") if k == 0 else _s(lang, "prev_step", k=k))
        elif name in ("num", "den") or (name == "output" and "kv_mem" in arrays):
            line.append(_s(lang, "now"))
        return part_of(at, line)
    key = name.removeprefix("state.")
    formula = p.run.formulas.get(key)
    if formula is None:
        from attn_cli.core.stages import SPECS

        formula = SPECS[key].formula(p.trace.inputs) if key in SPECS else key
    return part_of(at, [_s(lang, "what", name=name, formula=formula), f"= {p.n(value)}"])


def _worked(update: Update) -> list[str] | None:
    """The lines of a recomputed update, None where the numbers are not at hand or do not
    give the cell's value."""
    for worked in (_linear, _delta):
        got, lines = worked(update)
        if got is not None and _close(got, update.value):
            return lines
    return None


@dataclass(frozen=True)
class Update:
    """A cell of a state step to work out: its name and index, the step's arrays ``A`` and the
    state before the step (``prev``), the value the page shows."""

    p: Steps
    name: str
    index: tuple[int, ...]
    A: dict[str, Any]
    prev: dict[str, Any] | None
    value: float
    lang: Lang

    def dot(self, u: Any, w: Any) -> tuple[float, str]:
        """Σ u_i·w_i exactly summed, and its terms as a worked line writes them."""
        from attn_cli.present.explain_registry import sum_terms

        f = self.p.f
        terms = [f"{f(x)}×{f(y)}" for x, y in zip(u, w, strict=True)]
        got = math.fsum(float(x) * float(y) for x, y in zip(u, w, strict=True))
        return got, sum_terms(terms, self.p.options.full)


def _linear(u: Update) -> tuple[float | None, list[str]]:
    """Linear attention: S_t = S_{t−1} + φ(k)vᵀ, z_t = z_{t−1} + φ(k), output = num / den."""
    n, f, A, prev, dot = u.p.n, u.p.f, u.A, u.prev, u.dot
    name, index, value, lang = u.name, u.index, u.value, u.lang
    got: float | None = None
    lines: list[str] = []
    if "phi_k" not in A or "phi_q" not in A:
        return None, []
    if name == "state.S" and prev is not None and "S" in prev:
        h, i, j = index
        old, kk, vv = float(prev["S"][h, i, j]), float(A["phi_k"][h, i]), float(A["v"][h, j])
        got = old + kk * vv
        lines = [_s(lang, "S_add", i=i, j=j, prev=f(old), k=f(kk), v=f(vv), value=n(value))]
    elif name == "state.z" and prev is not None and "z" in prev:
        h, i = index
        old, kk = float(prev["z"][h, i]), float(A["phi_k"][h, i])
        got = old + kk
        lines = [_s(lang, "z_add", i=i, prev=f(old), k=f(kk), value=n(value))]
    elif name == "num" and "state.S" in A:
        h, j = index
        got, terms = dot(A["phi_q"][h], A["state.S"][h, :, j])
        lines = [_s(lang, "num", j=j, terms=terms, value=n(value))]
    elif name == "den" and "state.z" in A:
        h, _ = index
        got, terms = dot(A["phi_q"][h], A["state.z"][h])
        lines = [_s(lang, "den", terms=terms, value=n(value))]
    elif name == "output" and {"num", "den"} <= set(A):
        h, _, j = index
        num, den = float(A["num"][h, j]), float(A["den"][h, 0])
        got = num / den if den != 0 else math.nan
        lines = [_s(lang, "out_div", j=j, num=n(num), den=n(den), value=n(value))]
    return got, lines


def _delta(u: Update) -> tuple[float | None, list[str]]:
    """The gated delta rule: kv_mem, delta, S_t = S_{t−1}·e^g + k·deltaᵀ, output = S_tᵀq."""
    n, f, A, prev, dot = u.p.n, u.p.f, u.A, u.prev, u.dot
    name, index, value, lang = u.name, u.index, u.value, u.lang
    got: float | None = None
    lines: list[str] = []
    if not {"k", "q", "g", "beta", "delta", "kv_mem"} <= set(A):
        return None, []
    if name == "kv_mem" and prev is not None and "S" in prev:
        h, j = index
        eg = math.exp(float(A["g"][h, 0]))
        s, terms = dot(prev["S"][h, :, j], A["k"][h])
        got = s * eg
        lines = [_s(lang, "kv_mem", j=j, terms=terms, eg=n(eg), value=n(value))]
    elif name == "delta" and "v" in A:
        h, j = index
        beta, vv, mem = float(A["beta"][h, 0]), float(A["v"][h, j]), float(A["kv_mem"][h, j])
        got = beta * (vv - mem)
        lines = [_s(lang, "delta", j=j, beta=n(beta), v=f(vv), mem=f(mem), value=n(value))]
    elif name == "state.S" and prev is not None and "S" in prev:
        h, i, j = index
        eg = math.exp(float(A["g"][h, 0]))
        old, kk, d = float(prev["S"][h, i, j]), float(A["k"][h, i]), float(A["delta"][h, j])
        got = old * eg + kk * d
        lines = [
            _s(lang, "S_delta", i=i, j=j, prev=f(old), eg=n(eg), k=f(kk), d=f(d), value=n(value))
        ]
    elif name == "output" and "state.S" in A:
        h, _, j = index
        got, terms = dot(A["state.S"][h, :, j], A["q"][h])
        lines = [_s(lang, "out_sq", j=j, terms=terms, value=n(value))]
    return got, lines
