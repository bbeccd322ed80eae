"""The worked cell's part under each forward stage (scores, scaled, masked, softmax, output),
in English or Chinese: every product, sum and weight written out from the trace's numbers.

Registered in explain_registry.py's ``CELL_TEXTS``, which ``explain.cell_text`` reads.
"""

from __future__ import annotations

import math

from attn_cli.present.explain_registry import (
    CELL_TEXTS,
    Cell,
    CellText,
    pick_terms,
    sum_terms,
)
from attn_cli.present.i18n import label
from attn_cli.present.text import factor, safe, short_number
from attn_cli.present.variants import all_texts
from attn_cli.present.worked import weighted_terms

CELL_LINE = 76  # a worked line's characters that fit a panel at 80 columns (its borders, padding)


def _cell_scores(c: Cell) -> CellText | None:
    """The worked cell under ``scores``."""
    cell, precision, full, at = c.cell, c.precision, c.full, c.at
    terms = [
        f"{factor(a, precision)}×{factor(b, precision)}"
        for a, b in zip(cell.q, cell.k, strict=True)
    ]
    products = [factor(p, precision) for p in cell.products]
    return c.worked(
        "cell_dot",
        f"scores{at} = {cell.q_name}[{c.q_label}]·{cell.k_name}[{c.k_label}] = "
        f"{sum_terms(terms, full)} = {sum_terms(products, full)} = {c.n(cell.score)}",
    )


def _cell_scaled(c: Cell) -> CellText | None:
    """The worked cell under ``scaled``."""
    cell, at, n = c.cell, c.at, c.n
    return c.worked(
        "cell_scale",
        f"scaled{at} = scores{at} × {n(cell.scale)} = {n(cell.score)} × {n(cell.scale)}"
        f" = {n(cell.scaled)}",
    )


def _cell_masked(c: Cell) -> CellText | None:
    """The worked cell under ``masked``: the logit, plus the biases, or the fill."""
    cell = c.cell
    if cell.masked is None:
        return None
    at, n = c.at, c.n
    got = cell.extras
    modifiers = [t.stage for t in all_texts() if t.stage and got.get(t.stage) is not None]
    source = modifiers[-1] if modifiers else "scaled"
    value = got.get(source) if modifiers else cell.scaled
    assert value is not None
    added = [t for t in all_texts() if t.bias_stage and got.get(t.bias_stage) is not None]
    terms = [
        ("bias", cell.bias),
        *((t.bias_stage or "", got.get(t.bias_stage or "")) for t in added),
    ]
    names, numbers = [f"{source}{at}"], [n(value)]
    for name, term in terms:
        if term is not None:
            names.append(f"{name}{at}")
            numbers.append(factor(term, c.precision))
    lines = []
    if len(names) > 1:
        lines.append(label(c.lang, added[-1].add_label if added else "cell_bias"))
        total = math.fsum([value, *(term or 0.0 for _, term in terms)])
        lines.append(f"{' + '.join(names)} = {' + '.join(numbers)} = {n(total)}")
    if not cell.allowed:
        lines.append(f"masked{at} = {n(cell.masked)}")
        if cell.mask_value == -math.inf:
            lines.append(label(c.lang, "cell_blocked"))
        else:
            lines.append(label(c.lang, "cell_blocked_value", v=n(cell.mask_value)))
        return CellText(c.title, tuple(lines))
    shown = f"masked{at} = {names[0]} = {n(cell.masked)}" if len(names) == 1 else None
    lines.append(shown or f"masked{at} = {n(cell.masked)}")
    lines.append(label(c.lang, "cell_blocked" if cell.masked == -math.inf else "cell_open"))
    return CellText(c.title, tuple(lines))


def _cell_softmax(c: Cell) -> CellText | None:
    """The worked cell under ``softmax``."""
    trace, cell, lang, precision = c.trace, c.cell, c.lang, c.precision
    q_label, title, n = c.q_label, c.title, c.n
    if cell.parts is None:
        return CellText(title, (label(lang, "cell_row_empty", query=q_label),))
    parts = cell.parts
    header = (
        label(lang, "col_key"),
        cell.row_name,
        "x − m",
        "e^(x − m)",
        label(lang, "col_weight"),
    )
    keys = pick_terms(len(cell.row), c.full, keep=cell.key)
    rows = tuple(
        ("…",) * 5
        if j is None
        else (
            safe(trace.key_labels[j]) + (" ◀" if j == cell.key else ""),
            n(cell.row[j]),
            n(parts.shifted[j]),
            short_number(parts.exps[j], precision),
            short_number(cell.weights[j], precision),
        )
        for j in keys
    )
    head = label(lang, "cell_row", query=q_label, m=n(parts.row_max))
    footer = [
        label(
            lang,
            "cell_exp_sum",
            total=n(parts.total),
            query=q_label,
            key=c.k_label,
            e=short_number(parts.exps[cell.key], precision),
            weight=short_number(cell.weights[cell.key], precision),
        ),
    ]
    if cell.sink is not None:
        head = label(lang, "cell_row_sink", query=q_label, m=n(parts.row_max), sink=n(cell.sink))
        dropped = parts.sink_exp / parts.total
        rows += (
            (
                label(lang, "col_sink"),
                n(cell.sink),
                n(cell.sink - parts.row_max),
                short_number(parts.sink_exp, precision),
                f"({short_number(dropped, precision)})",
            ),
        )
        footer.append(
            label(
                lang,
                "cell_sink_dropped",
                d=short_number(dropped, precision),
                kept=short_number(1 - dropped, precision),
            )
        )
    return CellText(title, (head,), header=header, rows=rows, footer=tuple(footer))


def _cell_output(c: Cell) -> CellText | None:
    """The worked cell under ``output``."""
    cell, lang, precision, full = c.cell, c.lang, c.precision, c.full
    q_label, title, n = c.q_label, c.values_title, c.n
    lines = [label(lang, "cell_output", query=q_label)]
    columns = pick_terms(len(cell.output), full)
    for col in columns:
        if col is None:
            lines.append("…")
            continue
        terms = [
            f"{n(w)}×{factor(v[col], precision)}"
            for w, v in zip(cell.weights, cell.values, strict=True)
        ]
        products = [factor(p, precision) for p in weighted_terms(cell.weights, cell.values, col)]
        head = f"output[{q_label}, {col}] = {sum_terms(terms, full)}"
        tail = f"= {sum_terms(products, full)} = {n(cell.output[col])}"
        # one line if it fits a panel at 80 columns, else broken before its second "=" (Rich
        # broke it wherever the width ran out, "0.0434 +" then "0.0434 + 0 = 0.0868")
        fits = len(head) + 1 + len(tail) <= CELL_LINE
        lines += [f"{head} {tail}"] if fits else [head, tail]
    return CellText(title, tuple(lines))


# The stages a worked cell runs through, and its part under each.
CELL_TEXTS.update(
    {
        "scores": _cell_scores,
        "scaled": _cell_scaled,
        "masked": _cell_masked,
        "softmax": _cell_softmax,
        "output": _cell_output,
    }
)
