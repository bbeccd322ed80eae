"""Rich renderables for a trace: a header of the configuration, then one table per stage slice.

Renderers only format what the pipeline computed; they never recompute. Only the CLI prints.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from attn_cli.pipeline import Stage, Trace

ELLIPSIS = "…"
# An axis longer than LIMIT shows its first and last EDGE entries, as NumPy summarises arrays.
ROW_LIMIT, ROW_EDGE = 12, 5
COL_LIMIT, COL_EDGE = 10, 4
TABLE_LIMIT, TABLE_EDGE = 16, 3  # tables (batch items x heads) per stage


@dataclass(frozen=True)
class RenderOptions:
    """How to show a trace: digits after the point, which stages, and whether to elide."""

    precision: int = 4
    stages: tuple[str, ...] | None = None
    full: bool = False


def safe(text: str) -> str:
    """Input text as printable characters only: no escape sequences reach the terminal."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def format_number(x: float, precision: int) -> str:
    """Fixed-point with ``precision`` digits; never ``-0.0000``; infinities spelled out."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    s = f"{x:.{precision}f}"
    if s.startswith("-") and not s.strip("-0.").strip():
        s = s[1:]
    return s


def render_trace(trace: Trace, options: RenderOptions | None = None) -> Group:
    """The whole trace: configuration header, then every selected stage."""
    options = options or RenderOptions()
    parts: list[RenderableType] = [render_header(trace)]
    for stage in trace:
        if options.stages is None or stage.name in options.stages:
            parts.append(render_stage(trace, stage, options))
    return Group(*parts)


def render_header(trace: Trace) -> Panel:
    """The configuration: shapes, heads, scale and its source, masking semantics."""
    inp = trace.inputs
    lines: list[tuple[str, str]] = []
    if inp.description:
        lines.append(("about", inp.description))
    lines.append(("source", inp.source))
    if inp.mode == "projection":
        lines.append(("mode", "projection: Q = X·W_Q (X @ W; a torch nn.Linear weight is Wᵀ)"))
    else:
        lines.append(("mode", "direct: Q, K, V given"))
    dims = [f"batch {inp.batch}" if inp.has_batch else "no batch axis"]
    dims.append(f"seq_q {inp.seq_q}" if inp.seq_q != inp.seq_k else f"seq {inp.seq_q}")
    if inp.seq_q != inp.seq_k:
        dims.append(f"seq_k {inp.seq_k}")
    if inp.d_model is not None:
        dims.append(f"d_model {inp.d_model}")
    dims.append(f"d_k {inp.d_k}")
    dims.append(f"d_v {inp.d_v}")
    if inp.d_out is not None:
        dims.append(f"d_out {inp.d_out}")
    lines.append(("shapes", ", ".join(dims)))
    heads = f"{inp.heads}"
    if inp.kv_heads != inp.heads:
        heads += (
            f" query heads, {inp.kv_heads} key/value heads (grouped-query: head h reads "
            f"kv head h // {inp.heads // inp.kv_heads})"
        )
    lines.append(("heads", heads))
    default = 1 / math.sqrt(inp.d_k)
    if trace.scale_source == "default":
        scale = f"{trace.scale:.6g} = 1/√d_k (default, as torch SDPA)"
    else:
        scale = f"{trace.scale:.6g} (from the fixture; 1/√d_k would be {default:.6g})"
        if trace.scale == 1:
            scale += ", unscaled as in the source article"
    lines.append(("scale", scale))
    masking: list[str] = []
    if inp.causal == "upper-left":
        masking.append("causal upper-left: query i sees keys j ≤ i (torch is_causal=True)")
    elif inp.causal == "lower-right":
        masking.append("causal lower-right: query i sees keys j ≤ i + seq_k − seq_q (KV cache)")
    if inp.mask is not None:
        masking.append(
            "mask: true = may attend (torch SDPA's convention; nn.MultiheadAttention's is the "
            "opposite)"
        )
    if inp.bias is not None:
        masking.append("bias: added to the scaled scores (−∞ blocks a key)")
    if inp.lengths is not None:
        masking.append(
            f"lengths {[int(n) for n in inp.lengths]}: keys past each length are padding"
        )
    if len(masking) > 1:
        masking.append(
            "these combine (torch SDPA refuses attn_mask with is_causal; attn allows it)"
        )
    for i, text in enumerate(masking):
        lines.append(("masking" if i == 0 else "", text))
    if trace.empty_rows:
        lines.append(("note", "rows with nothing to attend to get all-zero weights (torch ≥ 2.5)"))

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for key, value in lines:
        grid.add_row(key, Text(safe(value)))
    title = Text(safe(inp.name) if inp.name else "attention trace", style="bold")
    return Panel(grid, title=title, title_align="left", box=box.ROUNDED)


def render_stage(trace: Trace, stage: Stage, options: RenderOptions) -> Group:
    """One stage: a rule with its name, the formula and shape, then a table per slice."""
    shape = ", ".join(f"{a}={n}" for a, n in zip(stage.axes, stage.shape, strict=True))
    formula = stage.formula
    if stage.name == "scaled":
        formula += f"  (scale = {trace.scale:.6g})"
    parts: list[RenderableType] = [
        Rule(Text(stage.name, style="bold cyan"), align="left", style="cyan"),
        Text.assemble((formula, "italic"), "   ", (f"[{shape}]", "dim")),
    ]
    lead = stage.axes[:-2]
    slices = list(itertools.product(*(range(n) for n in stage.shape[:-2])))
    shown: Iterable[tuple[int, ...] | None] = slices
    parts_note = ""
    if not options.full and len(slices) > TABLE_LIMIT:
        hidden = len(slices) - 2 * TABLE_EDGE
        shown = [*slices[:TABLE_EDGE], None, *slices[-TABLE_EDGE:]]
        parts_note = f"{ELLIPSIS} {hidden} more tables ({ELLIPSIS} --full shows all)"
    for index in shown:
        if index is None:
            parts.append(Padding(Text(parts_note, style="dim"), (0, 0, 1, 2)))
            continue
        title = " · ".join(f"{_axis_title(a)} {i}" for a, i in zip(lead, index, strict=True))
        if len(slices) == 1:
            title = ""  # a single table needs no "head 0"
        matrix = stage.data[index] if index else stage.data
        row_axis, col_axis = stage.axes[-2], stage.axes[-1]
        parts.append(
            _spaced(
                render_matrix(
                    matrix,
                    row_labels=_labels(trace, row_axis, matrix.shape[0]),
                    col_labels=_labels(trace, col_axis, matrix.shape[1]),
                    row_axis=row_axis,
                    title=title or None,
                    options=options,
                )
            )
        )
    return Group(*parts)


def _spaced(table: Table) -> Padding:
    return Padding(table, (0, 0, 1, 0), expand=False)


def render_matrix(
    matrix: Any,
    *,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    row_axis: str,
    title: str | None,
    options: RenderOptions,
) -> Table:
    """A 2-D array as a table with labelled rows and columns, elided unless ``full``."""
    rows = _pick(len(row_labels), ROW_LIMIT, ROW_EDGE, options.full)
    cols = _pick(len(col_labels), COL_LIMIT, COL_EDGE, options.full)
    table = Table(
        title=Text(title, style="bold") if title else None,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1),
        pad_edge=False,
    )
    table.add_column(Text(row_axis, style="dim"), justify="left", no_wrap=True, style="bold")
    for j in cols:
        header = Text(ELLIPSIS) if j is None else Text(safe(col_labels[j]))
        table.add_column(header, justify="right", no_wrap=True)
    for i in rows:
        if i is None:
            table.add_row(ELLIPSIS, *(ELLIPSIS for _ in cols))
            continue
        cells: list[RenderableType] = [Text(safe(row_labels[i]))]
        for j in cols:
            if j is None:
                cells.append(Text(ELLIPSIS))
                continue
            x = float(matrix[i, j])
            cells.append(
                Text(format_number(x, options.precision), style="dim" if x == -math.inf else "")
            )
        table.add_row(*cells)
    return table


def _pick(n: int, limit: int, edge: int, full: bool) -> list[int | None]:
    """Indices to show along one axis; None marks the ellipsis."""
    if full or n <= limit:
        return list(range(n))
    return [*range(edge), None, *range(n - edge, n)]


def _labels(trace: Trace, axis: str, n: int) -> tuple[str, ...]:
    if axis in ("query", "seq"):
        return trace.query_labels
    if axis == "key":
        return trace.key_labels
    return tuple(str(i) for i in range(n))


def _axis_title(axis: str) -> str:
    return {"kv_head": "kv head"}.get(axis, axis)
