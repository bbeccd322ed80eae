"""Plain-text helpers shared by every renderer and exporter: numbers and safe token text."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

from attn_cli.errors import printable
from attn_cli.present.i18n import Lang, label
from attn_cli.present.variants import active
from attn_cli.present.variants import texts as variant_texts

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


ELLIPSIS = "…"
NONE = "—"  # no number here: an empty cache slot holds no key (decode's tables and page)
# An axis longer than LIMIT shows its first and last EDGE entries, as NumPy summarises arrays
# (edgeitems=3). Every renderer and exporter elides the same way.
ROW_LIMIT, ROW_EDGE = 12, 3
COL_LIMIT, COL_EDGE = 10, 3
TABLE_LIMIT, TABLE_EDGE = 16, 3  # tables (batch items x heads) per stage


# A token's label on a page (table headers, derivations, titles) is cut to this many characters,
# as the terminal cuts it to its column with "…": a 10^6-character token repeated in every header
# and derivation made a 617 MB page. The full text stays once, in the page's data.
LABEL_CHARS = 40


def short_label(text: str, limit: int = LABEL_CHARS) -> str:
    """``text`` cut to ``limit`` characters, the last an ellipsis, when it is longer."""
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS


def with_short_labels(trace: Trace) -> Trace:
    """The trace with every token label cut (``short_label``): what a page draws from, so that
    each of its generators labels as the others do (the numbers are the same arrays)."""
    from dataclasses import replace

    inp = trace.inputs
    cut = [
        None if t is None else tuple(short_label(x) for x in t)
        for t in (inp.tokens, inp.key_tokens)
    ]
    if cut == [inp.tokens, inp.key_tokens]:
        return trace
    return replace(trace, inputs=replace(inp, tokens=cut[0], key_tokens=cut[1]))


def pick(n: int, limit: int, edge: int, full: bool) -> list[int | None]:
    """Indices to show along one axis; None marks the ellipsis."""
    if full or n <= limit:
        return list(range(n))
    return [*range(edge), None, *range(n - edge, n)]


def pick_rows(n: int, full: bool) -> list[int | None]:
    """The rows of a table to show, as NumPy elides: the first and last few past the limit."""
    return pick(n, ROW_LIMIT, ROW_EDGE, full)


def pick_cols(n: int, full: bool) -> list[int | None]:
    """The columns of a table to show (before the width drops more: render.Matrix)."""
    return pick(n, COL_LIMIT, COL_EDGE, full)


def pick_tables(n: int, full: bool) -> list[int | None]:
    """The tables (slices, steps, chunks) to show: the first and last few past the limit."""
    return pick(n, TABLE_LIMIT, TABLE_EDGE, full)


def pick_steps(n: int, full: bool) -> list[int | None]:
    """The rows of a table with a row per step (the checks): twice as many as tables."""
    return pick(n, 2 * TABLE_LIMIT, TABLE_EDGE, full)


def slices_of(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The index of every table of an array of ``shape`` (its last two axes: rows, columns)."""
    return list(itertools.product(*(range(n) for n in shape[:-2])))


def shown_slices(shape: tuple[int, ...], full: bool) -> list[tuple[int, ...] | None]:
    """The tables shown of an array of ``shape`` (None: the elided middle ones)."""
    slices = slices_of(shape)
    return [None if i is None else slices[i] for i in pick_tables(len(slices), full)]


def axis_labels(trace: Trace, axis: str, n: int) -> tuple[str, ...]:
    """Tokens for the query and key axes, indices for the feature axes."""
    if axis in ("query", "seq"):
        return trace.query_labels
    if axis == "key":
        return trace.key_labels
    return tuple(str(i) for i in range(n))


def safe(text: str) -> str:
    """Input text as printable characters only: no escape sequences reach the terminal."""
    return printable(text)


MINUS = "\u2212"  # −, the minus sign of formulas


def format_number(x: float, precision: int, *, math_style: bool = False) -> str:
    """Fixed-point with ``precision`` digits; never ``-0.0000``; infinities spelled out.

    The one number formatter. Tables are data: an ASCII hyphen and ``-inf``, as a program
    reading plain output expects. ``math_style`` (worked cells and explanations, which write
    ``e^(x − m)`` and ``−∞``): the minus sign U+2212 and ``−∞``. An ASCII console gets ``-`` and
    ``-inf`` for both (cli/output.py).
    """
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        if math_style:
            return MINUS + "∞" if x < 0 else "∞"
        return "-inf" if x < 0 else "inf"
    s = f"{x:.{precision}f}"
    if s.startswith("-") and not s.strip("-0.").strip():
        s = s[1:]
    return MINUS + s[1:] if math_style and s.startswith("-") else s


def short_number(x: float, precision: int) -> str:
    """A number in a formula: a whole one without decimals (``8``), else ``format_number``;
    the minus sign and −∞ as formulas write them."""
    if not math.isinf(x) and x == int(x) and abs(x) < 1e15:
        return str(int(x)).replace("-", MINUS)
    return format_number(x, precision, math_style=True)


def factor(x: float, precision: int) -> str:
    """A number as a factor in a product: negative ones in parentheses, ``2×(−1)``."""
    s = short_number(x, precision)
    return f"({s})" if s.startswith(("-", MINUS)) else s


def header_lines(trace: Trace, lang: Lang = "en") -> list[tuple[str, str]]:
    """The configuration as (key, text) lines: shapes, heads, scale and masking semantics."""
    inp = trace.inputs
    lines: list[tuple[str, str]] = []
    if inp.description:
        lines.append((label(lang, "h_about"), inp.description))
    lines.append((label(lang, "h_source"), inp.source))
    mode = "mode_projection" if inp.mode == "projection" else "mode_direct"
    from attn_cli.core.chain import Chain  # a front end that makes Q, K, V itself (MLA)

    for v, _ in Chain(inp).on:
        if v.front_stages:
            variant_texts(inp)  # its labels join the table
            mode = f"mode_{v.name}"
    lines.append((label(lang, "h_mode"), label(lang, mode)))
    lines.append((label(lang, "h_shapes"), _dims(trace, lang)))
    lines.append((label(lang, "h_heads"), _heads(trace, lang)))
    lines.append((label(lang, "h_scale"), _scale(trace, lang)))
    for i, text in enumerate(_masking(trace, lang)):
        lines.append((label(lang, "h_masking") if i == 0 else "", text))
    for i, text in enumerate(_conventions(trace, lang)):
        lines.append((label(lang, "h_conventions") if i == 0 else "", text))
    upstream = upstream_line(trace, lang)  # the backward pass ran: where its gradient started
    if upstream is not None:
        lines.append(upstream)
    if trace.empty_rows:
        lines.append((label(lang, "h_note"), label(lang, "note_empty_rows")))
    return lines


def upstream_line(trace: Trace, lang: Lang) -> tuple[str, str] | None:
    """The header line that says where the backward pass started, or None without it."""
    if trace.upstream is None:
        return None
    from attn_cli.core.stage_facts import final_stage

    final = final_stage(trace.inputs)
    if trace.upstream == "grad":
        text = (
            f"L = Σ grad ∘ {final}，grad 由配置文件给出"
            if lang == "zh"
            else f"L = Σ grad ∘ {final}, with the fixture's grad"
        )
    else:
        text = (
            f"L = Σ {final}（没有 grad：上游梯度全为 1）"
            if lang == "zh"
            else f"L = Σ {final} (no grad in the fixture: a gradient of ones)"
        )
    return ("反向传播" if lang == "zh" else "backward", text)


def _dims(trace: Trace, lang: Lang) -> str:
    """``no batch axis, seq 3, d_model 4, d_k 2, d_v 2``."""
    inp = trace.inputs
    dims = [label(lang, "dim_batch", n=inp.batch) if inp.has_batch else label(lang, "dim_no_batch")]
    if inp.seq_q != inp.seq_k:
        dims += [f"seq_q {inp.seq_q}", f"seq_k {inp.seq_k}"]
    else:
        dims.append(label(lang, "dim_seq", n=inp.seq_q))
    sizes = (("d_model", inp.d_model), ("d_k", inp.d_k), ("d_v", inp.d_v), ("d_out", inp.d_out))
    dims += [f"{name} {n}" for name, n in sizes if n is not None]
    return label(lang, "list_sep").join(dims)


def _heads(trace: Trace, lang: Lang) -> str:
    inp = trace.inputs
    if inp.kv_heads == inp.heads:
        return f"{inp.heads}"
    group = inp.heads // inp.kv_heads
    if inp.kv_heads == 1:  # "1 key/value head": no plural, and no grouping to explain
        return label(lang, "heads_one_kv", heads=inp.heads)
    return label(lang, "heads_grouped", heads=inp.heads, kv=inp.kv_heads, group=group)


def _scale(trace: Trace, lang: Lang) -> str:
    scale = f"{trace.scale:.6g}"
    if trace.scale_source == "default":
        return label(lang, "scale_default", scale=scale)
    if trace.scale_source != "fixture":  # a variant's own scale (MLA's mscale²)
        variant_texts(trace.inputs)  # its labels join the table
        return label(lang, f"scale_{trace.scale_source}", scale=scale)
    default = f"{1 / math.sqrt(trace.inputs.d_k):.6g}"
    text = label(lang, "scale_given", scale=scale, default=default)
    return text + (label(lang, "scale_unscaled") if trace.scale == 1 else "")


def _masking(trace: Trace, lang: Lang) -> list[str]:
    """What masks and biases the scores, one line each, and a note when they combine."""
    inp = trace.inputs
    masking: list[str] = []
    if inp.causal == "upper-left":
        masking.append(label(lang, "mask_upper_left"))
    elif inp.causal == "lower-right":
        masking.append(label(lang, "mask_lower_right"))
    if inp.mask is not None:
        masking.append(label(lang, "mask_mask"))
    if inp.bias is not None:
        masking.append(label(lang, "mask_bias"))
    if inp.lengths is not None:
        masking.append(label(lang, "mask_lengths", lengths=[int(n) for n in inp.lengths]))
    if len(masking) > 1:
        masking.append(label(lang, "mask_combine"))
    return masking


def _conventions(trace: Trace, lang: Lang) -> list[str]:
    """Every modern convention in force, one line each: nothing for classic attention."""
    inp = trace.inputs
    out: list[str] = []
    if inp.X_kv is not None:
        out.append(label(lang, "conv_cross", d=inp.d_model_kv))
    on = active(inp)
    for texts in on:
        out += texts.conventions(texts.setting(inp), inp, lang) if texts.before_positions else []
    if any(t.reads_positions for t in on):
        pos_q, pos_k = inp.token_positions()
        out.append(label(lang, "conv_positions", q=_span(pos_q), k=_span(pos_k)))
    for texts in on:
        out += [] if texts.before_positions else texts.conventions(texts.setting(inp), inp, lang)
    if inp.mask_value != -math.inf:
        out.append(label(lang, "conv_mask_value", v=f"{inp.mask_value:g}"))
    return out


def _span(positions: Any) -> str:
    """``0..4`` for consecutive positions, else the list."""
    items = [int(p) for p in positions]
    if len(items) > 2 and items == list(range(items[0], items[0] + len(items))):
        return f"{items[0]}..{items[-1]}"
    return ", ".join(str(p) for p in items)
