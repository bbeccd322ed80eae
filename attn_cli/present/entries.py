"""Where one entry of Q, K, V, concat or projected comes from, with the trace's own numbers:
the interactive page's derivation of a cell outside the worked cell's stages (issue 26).

    Q[t, c]           = X[t] · W_Q[:, h·d_k + c] + b_Q[h·d_k + c]   (K and V read X_kv when
                                                                     there is one)
    concat[t, h·d_v + c] = output[h, t, c]                          (the joined stage: a gate's
                                                                     gated, else output)
    projected[t, e]   = concat[t] · W_O[:, e] + b_O[e]

Written as the worked cell writes its dot product (``factor``, ``sum_terms``, ``short_number``,
present/explain.py ``_cell_scores``), in English and Chinese. Nothing is recomputed for the
page: the terms are the products of the trace's and the fixture's numbers, and the total shown
is the trace's own value; an entry whose terms do not add up to it (a variant that makes Q, K,
V itself, MLA) has no derivation here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli.present.explain_registry import CellText, pick_terms
from attn_cli.present.i18n import Lang, label
from attn_cli.present.text import factor, safe, short_number

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace

ENTRY_STAGES = ("Q", "K", "V", "concat", "projected")
FULL_TERMS = 16  # a sum of at most this many terms is shown whole

TEXTS: dict[Lang, dict[str, str]] = {
    "en": {
        "title": "where {name}[{at}] comes from{where}",
        "project": "the {x} row of {token} times column {col} of {w}, term by term{bias}:",
        "bias": ", plus the bias",
        "concat": "the heads joined side by side: column {col} of concat is column {c} of head "
        "{h}'s {joined} ({col} = {h} × {d} + {c})",
    },
    "zh": {
        "title": "{name}[{at}] 的来历{where}",
        "project": "{token} 的 {x} 行乘以 {w} 的第 {col} 列，逐项相乘再相加{bias}：",
        "bias": "，再加上偏置",
        "concat": "各个头并排拼接：concat 的第 {col} 列就是头 {h} 的 {joined} 的第 {c} 列"
        "（{col} = {h} × {d} + {c}）",
    },
}


def entry_text(
    trace: Trace, stage: str, at: tuple[int, ...], lang: Lang, precision: int = 4
) -> CellText | None:
    """The derivation of ``stage[at]`` (``at`` as the JSON trace indexes it), or None."""
    if stage not in ENTRY_STAGES or stage not in trace:
        return None
    if stage == "concat":
        return _concat(trace, at, lang, precision)
    if stage == "projected":
        return _projected(trace, at, lang, precision)
    return _qkv(trace, stage, at, lang, precision)


def _axes(trace: Trace, stage: str, at: tuple[int, ...]) -> dict[str, int]:
    return dict(zip(trace[stage].axes, at, strict=True))


def _title(trace: Trace, stage: str, at: str, lang: Lang, where: list[str]) -> str:
    shown = f" ({' · '.join(where)})" if lang == "en" else f"（{' · '.join(where)}）"
    return TEXTS[lang]["title"].format(name=stage, at=at, where=shown if where else "")


def _batch(trace: Trace, idx: dict[str, int], lang: Lang) -> list[str]:
    return [f"{label(lang, 'batch')} {idx['batch']}"] if "batch" in idx else []


def _qkv(trace: Trace, stage: str, at: tuple[int, ...], lang: Lang, p: int) -> CellText | None:
    """Q, K or V: the source row times a column of the weight, plus the bias."""
    from attn_cli.core.chain import Chain

    inp = trace.inputs
    W = getattr(inp, f"W_{stage}")
    if W is None or any(v.front_stages for v, _ in Chain(inp).on):
        return None  # given directly, or made by a front end (MLA)
    idx = _axes(trace, stage, at)
    cross = stage != "Q" and inp.X_kv is not None
    source = inp.X_kv if cross else inp.X
    if source is None:
        return None
    head_axis = "head" if stage == "Q" else "kv_head"
    h, t, c = idx[head_axis], idx["query" if stage == "Q" else "key"], at[-1]
    col = h * trace[stage].shape[-1] + c
    rows = np.asarray(source)  # (batch, seq, d_model) or (seq, d_model)
    x = rows[idx.get("batch", 0), t] if rows.ndim == 3 else rows[t]
    b = getattr(inp, f"b_{stage}")
    bias = None if b is None else float(np.asarray(b)[col])
    labels = trace.query_labels if stage == "Q" else trace.key_labels
    token = safe(labels[t])
    named = "kv_head" if head_axis == "kv_head" and inp.kv_heads != inp.heads else "head"
    where = [*_batch(trace, idx, lang), f"{label(lang, named)} {h}"]
    return _dot(
        trace,
        stage,
        at,
        lang,
        p,
        (f"{token}, {c}", where, "X_kv" if cross else "X", token, f"W_{stage}", col),
        (x, np.asarray(W)[:, col], bias, f"b_{stage}"),
    )


def _projected(trace: Trace, at: tuple[int, ...], lang: Lang, p: int) -> CellText | None:
    """projected: the concat row times a column of W_O, plus b_O."""
    inp = trace.inputs
    if inp.W_O is None or "concat" not in trace:
        return None
    idx = _axes(trace, "projected", at)
    t, e = idx["query"], at[-1]
    row = np.asarray(trace["concat"].data)[tuple(at[:-1])]  # (heads*d_v,)
    bias = None if inp.b_O is None else float(np.asarray(inp.b_O)[e])
    token = safe(trace.query_labels[t])
    return _dot(
        trace,
        "projected",
        at,
        lang,
        p,
        (f"{token}, {e}", _batch(trace, idx, lang), "concat", token, "W_O", e),
        (row, np.asarray(inp.W_O)[:, e], bias, "b_O"),
    )


def _dot(
    trace: Trace,
    stage: str,
    at: tuple[int, ...],
    lang: Lang,
    p: int,
    names: tuple[str, list[str], str, str, str, int],
    numbers: tuple[Any, Any, float | None, str],  # row, column, bias, the bias's name
) -> CellText | None:
    """``stage[at] = row · column (+ bias)``, term by term, as the worked cell writes a score."""
    shown_at, where, x_name, token, w_name, col = names
    row, column, bias, b_name = numbers
    value = float(np.asarray(trace[stage].data)[at])
    products = (np.asarray(row, dtype=np.float64) * np.asarray(column, dtype=np.float64)).tolist()
    total = math.fsum([*products, bias or 0.0])
    size = math.fsum([*map(abs, products), abs(bias or 0.0)])
    if abs(total - value) > 1e-5 * size + 1e-12:  # float32 runs round at about 1e-7 of it
        return None  # not this stage's arithmetic: no false derivation
    full = len(products) <= FULL_TERMS
    picked = pick_terms(len(products), full)
    terms = [
        f"{factor(float(row[i]), p)}×{factor(float(column[i]), p)}" if i is not None else "…"
        for i in picked
    ]
    parts = [factor(products[i], p) if i is not None else "…" for i in picked]
    lhs = f"{x_name}[{token}]·{w_name}[:, {col}]"
    if bias is not None:
        lhs += f" + {b_name}[{col}]"
        terms.append(factor(bias, p))
        parts.append(factor(bias, p))
    words = TEXTS[lang]
    head = words["project"].format(
        x=x_name, token=token, col=col, w=w_name, bias=words["bias"] if bias is not None else ""
    )
    line = (
        f"{stage}[{shown_at}] = {lhs} = {' + '.join(terms)} = {' + '.join(parts)} = "
        f"{short_number(value, p)}"
    )
    return CellText(_title(trace, stage, shown_at, lang, where), (head, line))


def _concat(trace: Trace, at: tuple[int, ...], lang: Lang, p: int) -> CellText | None:
    """concat: which head's output entry this column is."""
    from attn_cli.core.chain import Chain

    joined = Chain(trace.inputs).joined
    if joined not in trace:
        return None
    idx = _axes(trace, "concat", at)
    t, col = idx["query"], at[-1]
    d = trace[joined].shape[-1]
    h, c = divmod(col, d)
    source = (*([idx["batch"]] if "batch" in idx else []), h, t, c)
    value = float(np.asarray(trace["concat"].data)[at])
    if float(np.asarray(trace[joined].data)[source]) != value:
        return None
    token = safe(trace.query_labels[t])
    words = TEXTS[lang]
    lines = (
        words["concat"].format(col=col, h=h, joined=joined, d=d, c=c),
        f"concat[{token}, {col}] = {joined}[{label(lang, 'head')} {h}, {token}, {c}] = "
        f"{short_number(value, p)}",
    )
    title = _title(trace, "concat", f"{token}, {col}", lang, _batch(trace, idx, lang))
    return CellText(title, lines)
