"""Rich renderables for a trace: a header of the configuration, then one table per stage slice.

Renderers only format what the pipeline computed; they never recompute. Only the CLI prints.
The classroom layer adds, on request: heatmap shading of the score-like stages, a focus on one
query row, the explanation of each stage, a worked cell, step-mode pages and HTML/SVG export.
"""

from __future__ import annotations

import itertools
import math
import re
import unicodedata
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.panel import Panel
from rich.rule import Rule
from rich.style import Style
from rich.table import Table
from rich.text import Text

from attn_cli.core.stages import SCORE_STAGES as HEAT_STAGES
from attn_cli.present.i18n import Lang, label
from attn_cli.present.options import CELLS_SHOWN, RenderOptions
from attn_cli.present.text import (
    COL_EDGE,
    COL_LIMIT,
    ELLIPSIS,
    ROW_EDGE,
    ROW_LIMIT,
    TABLE_EDGE,
    TABLE_LIMIT,
    axis_labels,
    header_lines,
    pick,
)
from attn_cli.present.text import format_number as format_number
from attn_cli.present.text import safe as safe

if TYPE_CHECKING:
    # The classroom layers (explanations, worked cells) are imported where an option asks
    # for them, so a plain `attn trace` does not pay for them at start-up.
    from attn_cli.core.pipeline import Stage, Trace
    from attn_cli.present.explain import CellText, Explanation
    from attn_cli.present.worked import WorkedCell


def render_trace(trace: Trace, options: RenderOptions | None = None) -> Group:
    """The whole trace: configuration header, then every selected stage."""
    options = options or RenderOptions()
    parts: list[RenderableType] = [render_header(trace)]
    if options.focus is not None:
        focus = safe(trace.query_labels[options.focus])
        parts.append(Text(label(options.lang, "focus", query=focus), style="bold magenta"))
    cells = _cells(trace, options)
    for stage in trace:
        if options.stages is None or stage.name in options.stages:
            parts.append(render_stage(trace, stage, options, cells))
    return Group(*parts)


def render_header(trace: Trace) -> Panel:
    """The configuration: shapes, heads, scale and its source, masking semantics."""
    inp = trace.inputs
    lines = header_lines(trace)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for key, value in lines:
        grid.add_row(key, Text(safe(value)))
    title = Text(safe(inp.name) if inp.name else "attention trace", style="bold")
    return Panel(grid, title=title, title_align="left", box=box.ROUNDED)


def render_stage(
    trace: Trace,
    stage: Stage,
    options: RenderOptions,
    cells: Sequence[WorkedCell] | None = None,
) -> Group:
    """One stage: a rule with its name, the formula and shape, then a table per slice.

    With the classroom options: shading and a legend, the focused row only, the explanation,
    and the worked cell's part for this stage (``cells``, from :func:`worked_cells`).
    """
    shape = ", ".join(f"{a}={n}" for a, n in zip(stage.axes, stage.shape, strict=True))
    formula = stage.formula
    if stage.name == "scaled":
        formula += f"  (scale = {trace.scale:.6g})"
    parts: list[RenderableType] = [
        Rule(Text(stage.name, style="bold cyan"), align="left", style="cyan"),
        Text.assemble((formula, "italic"), "   ", (f"[{shape}]", "dim")),
    ]
    heat = _heat(trace, stage, options) if options.heatmap else None
    lead = stage.axes[:-2]
    slices = list(itertools.product(*(range(n) for n in stage.shape[:-2])))
    shown: Iterable[tuple[int, ...] | None] = slices
    parts_note = ""
    if not options.full and len(slices) > TABLE_LIMIT:
        hidden = len(slices) - 2 * TABLE_EDGE
        shown = [*slices[:TABLE_EDGE], None, *slices[-TABLE_EDGE:]]
        parts_note = f"{ELLIPSIS} {hidden} more tables ({ELLIPSIS} --full shows all)"
    row_axis, col_axis = stage.axes[-2], stage.axes[-1]
    only_rows = None
    if options.focus is not None and row_axis in ("query", "seq"):
        only_rows = (options.focus,)
    for index in shown:
        if index is None:
            parts.append(Padding(Text(parts_note, style="dim"), (0, 0, 1, 2)))
            continue
        title = " · ".join(f"{_axis_title(a)} {i}" for a, i in zip(lead, index, strict=True))
        if len(slices) == 1:
            title = ""  # a single table needs no "head 0"
        matrix = stage.data[index] if index else stage.data
        parts.append(
            render_matrix(
                matrix,
                row_labels=axis_labels(trace, row_axis, matrix.shape[0]),
                col_labels=axis_labels(trace, col_axis, matrix.shape[1]),
                row_axis=row_axis,
                title=title or None,
                options=options,
                heat=None if heat is None else heat.slice(trace, stage, index),
                only_rows=only_rows,
                spaced=True,
            )
        )
    if heat is not None:
        parts.append(Padding(render_legend(heat, options.lang, options.precision), (0, 0, 1, 0)))
    if options.explain:
        from attn_cli.present.explain import explain_stage

        parts.append(
            render_explanation(explain_stage(trace, stage.name, options.lang, options.precision))
        )
    if cells:
        from attn_cli.present.explain import cell_text
    for n, cell in enumerate(cells or ()):
        if n == CELLS_SHOWN and not options.full:
            more = len(cells or ()) - CELLS_SHOWN
            parts.append(Text(f"{ELLIPSIS} +{more} ({ELLIPSIS} --full)", style="dim"))
            break
        part = cell_text(trace, cell, stage.name, options.lang, options.precision, options.full)
        if part is not None:
            parts.append(render_cell(part))
    return Group(*parts)


def _cells(trace: Trace, options: RenderOptions) -> list[WorkedCell]:
    if options.cell is None:
        return []
    from attn_cli.present.worked import worked_cells

    return worked_cells(trace, options.cell)


def render_matrix(
    matrix: Any,
    *,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    row_axis: str,
    title: str | None,
    options: RenderOptions,
    heat: SliceHeat | None = None,
    only_rows: Sequence[int] | None = None,
    spaced: bool = False,
) -> Matrix:
    """A 2-D array as a table with labelled rows and columns, elided unless ``full``.

    Columns are elided to what fits the width the table is rendered at (see :class:`Matrix`);
    ``spaced`` adds a blank line under it.
    """
    rows: list[int | None] = (
        list(only_rows)
        if only_rows is not None
        else pick(len(row_labels), ROW_LIMIT, ROW_EDGE, options.full)
    )
    cols = pick(len(col_labels), COL_LIMIT, COL_EDGE, options.full)
    # Each column as (header, cells), formatted once; the table is assembled when the width
    # it has is known (Matrix), from the columns that fit.
    labels: _Column = (
        Text(row_axis, style="dim"),
        [ELLIPSIS if i is None else Text(safe(row_labels[i])) for i in rows],
    )
    columns: dict[int | None, _Column] = {
        None: (Text(ELLIPSIS), [ELLIPSIS if i is None else Text(ELLIPSIS) for i in rows])
    }
    for j in cols:
        if j is None:
            continue
        cells: list[Text | str] = []
        for i in rows:
            if i is None:
                cells.append(ELLIPSIS)
                continue
            x = float(matrix[i, j])
            if heat is not None:
                cells.append(heat.cell(i, j, x, options.precision))
                continue
            cells.append(
                Text(format_number(x, options.precision), style="dim" if x == -math.inf else "")
            )
        columns[j] = (Text(safe(col_labels[j])), cells)
    row_sums: _Column | None = None
    if heat is not None and heat.row_sums is not None:
        sums = heat.row_sums
        row_sums = (
            Text(label(heat.lang, "heat_row_sum"), style="dim"),
            [
                ELLIPSIS
                if i is None
                else Text(format_number(sums[i], options.precision), style="dim")
                for i in rows
            ],
        )
    return Matrix(
        Text(title, style="bold") if title else None,
        labels,
        columns,
        row_sums,
        cols,
        len(col_labels),
        options.full,
        spaced,
    )


_Column = tuple[Text, list[Text | str]]  # a table column: its header and its cells


class Matrix:
    """A matrix table that shows as many columns as fit the width it is rendered at.

    Without ``full``, the middle columns give way to the ellipsis column (as NumPy elides),
    so the table is never wider than the terminal unless even the first column alone is too wide.
    With ``full``, every column is shown and the table is as wide as they need (print it with
    ``crop=False``).
    """

    def __init__(
        self,
        title: Text | None,
        labels: _Column,
        columns: dict[int | None, _Column],
        row_sums: _Column | None,
        cols: list[int | None],
        n: int,
        full: bool,
        spaced: bool = False,
    ) -> None:
        self.title = title
        self.labels = labels
        self.columns = columns
        self.row_sums = row_sums
        self.cols = cols  # the columns shown when the width allows
        self.n = n  # the number of columns of the matrix
        self.full = full
        self.spaced = spaced  # a blank line under the table
        # each column's width: its widest cell
        self.widths = {j: _widest(column) for j, column in columns.items()}
        self.label_width = _widest(labels)
        self.sums_width = 0 if row_sums is None else _widest(row_sums)

    def table(self, cols: Sequence[int | None]) -> Table:
        """The table of the label column, ``cols`` (None: the ellipsis) and the row sums."""
        table = Table(
            title=self.title,
            title_justify="left",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            padding=(0, 1),
            pad_edge=False,
        )
        # Each column as wide as its widest cell, so Rich need not measure every cell.
        table.add_column(
            self.labels[0], justify="left", no_wrap=True, style="bold", width=self.label_width
        )
        for j in cols:
            table.add_column(
                self.columns[j][0], justify="right", no_wrap=True, width=self.widths[j]
            )
        if self.row_sums is not None:
            table.add_column(self.row_sums[0], justify="right", width=self.sums_width)
        shown = [self.labels, *(self.columns[j] for j in cols)]
        if self.row_sums is not None:
            shown.append(self.row_sums)
        for r in range(len(self.labels[1])):
            table.add_row(*(cells[r] for _, cells in shown))
        return table

    def width(self, cols: Sequence[int | None]) -> int:
        """The width of ``table(cols)``: cells, one blank each side inside, a blank between."""
        shown = 1 + len(cols) + (self.row_sums is not None)
        cells = self.label_width + sum(self.widths[j] for j in cols) + self.sums_width
        return cells + 3 * (shown - 1)  # padding (none at the edges) and column rules

    def fitting(self, max_width: int) -> list[int | None]:
        """The most columns, first and last ones kept, whose table fits ``max_width``."""
        cols = self.cols
        while self.width(cols) > max_width:
            shown = sum(j is not None for j in cols) - 1  # one fewer, the ellipsis between
            if shown < 1:
                break  # not even one number fits beside the labels: Rich crops
            left = (shown + 1) // 2
            cols = [*range(left), None, *range(self.n - (shown - left), self.n)]
        return cols

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        cols = self.cols if self.full else self.fitting(options.max_width)
        table = self.table(cols)
        if self.full:  # every column: as wide as they need, past the console's width if so
            options = options.update_width(max(options.max_width, self.width(cols)))
        yield from console.render(
            Padding(table, (0, 0, 1, 0), expand=False) if self.spaced else table, options
        )

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        narrowest = self.width(self.cols if self.full else self.fitting(0))
        return Measurement(narrowest, self.width(self.cols))


def _widest(column: _Column) -> int:
    head, cells = column
    return max(cell_len(c.plain if isinstance(c, Text) else c) for c in (head, *cells))


def _axis_title(axis: str) -> str:
    return {"kv_head": "kv head"}.get(axis, axis)


# ---------------------------------------------------------------------------------------------
# Heatmap shading: viridis (perceptually ordered, readable with colour-blindness and in grey)

# viridis at 0, 0.1, ..., 1 (matplotlib's colormap, as sampled by R's viridisLite)
VIRIDIS = (
    "#440154", "#482576", "#414487", "#35608d", "#2a788e", "#21908c",
    "#22a884", "#43bf71", "#7ad151", "#bbdf27", "#fde725",
)  # fmt: skip
MASKED_STYLE = Style(color="#e4e4e4", bgcolor="#585858", italic=True)
MAX_MARK, MASKED_MARK, NO_MARK = "*", "·", " "


def viridis(t: float) -> str:
    """The viridis colour at ``t`` in [0, 1], interpolated between samples, as ``#rrggbb``."""
    t = min(max(t, 0.0), 1.0) * (len(VIRIDIS) - 1)
    i = min(int(t), len(VIRIDIS) - 2)
    f = t - i
    a, b = VIRIDIS[i], VIRIDIS[i + 1]
    rgb = (round(int(a[k : k + 2], 16) * (1 - f) + int(b[k : k + 2], 16) * f) for k in (1, 3, 5))
    return "#" + "".join(f"{c:02x}" for c in rgb)


def heat_style(t: float) -> Style:
    """A cell shaded by ``t``: viridis background, black or white text for contrast."""
    return Style(color="#000000" if t >= 0.55 else "#ffffff", bgcolor=viridis(t))


@dataclass(frozen=True)
class StageHeat:
    """Shading for one stage: its value range (over every slice) and what to mark."""

    stage: str
    lo: float
    hi: float
    lang: Lang
    masked: bool  # the stage shows masked cells (−∞ in masked; their zeros in softmax)

    def slice(self, trace: Trace, stage: Stage, index: tuple[int, ...]) -> SliceHeat:
        """The shading of one table of this stage."""
        matrix = stage.data[index] if index else stage.data
        blocked = None
        if "masked" in trace and self.stage in ("masked", "softmax"):
            source = trace["masked"].data
            blocked = _NegInf(source[index] if index else source)
        is_softmax = self.stage == "softmax"
        # Row facts are worked out for the rows shown only, so an elided table costs the same
        # whatever the size of the matrix behind it.
        return SliceHeat(
            lo=self.lo,
            hi=self.hi,
            lang=self.lang,
            blocked=blocked,
            maxima=_RowMaxima(matrix) if is_softmax else None,
            row_sums=_RowSums(matrix) if is_softmax else None,
        )


class _NegInf:
    """``blocked[i, j]``: whether the masked stage holds −∞ there, looked up cell by cell."""

    def __init__(self, masked: Any) -> None:
        self.masked = masked

    def __getitem__(self, ij: tuple[int, int]) -> bool:
        return bool(self.masked[ij] == -math.inf)


class _RowMaxima:
    """``(i, j) in maxima``: whether row i of a softmax slice peaks at j (row i worked once)."""

    def __init__(self, matrix: Any) -> None:
        self.matrix = matrix
        self.rows: dict[int, frozenset[int]] = {}

    def __contains__(self, ij: object) -> bool:
        i, j = cast(tuple[int, int], ij)
        if i not in self.rows:
            from attn_cli.present.worked import row_max_positions_for_display

            marks = row_max_positions_for_display(self.matrix[i : i + 1])
            self.rows[i] = frozenset(col for _, col in marks)
        return j in self.rows[i]


class _RowSums:
    """``row_sums[i]``: the sum of row i of a softmax slice, worked out when asked."""

    def __init__(self, matrix: Any) -> None:
        self.matrix = matrix

    def __getitem__(self, i: int) -> float:
        from attn_cli.present.worked import row_sums_for_display

        return row_sums_for_display(self.matrix[i : i + 1])[0]


@dataclass(frozen=True)
class SliceHeat:
    """Shading for one table: value range, masked cells, row maxima and row sums."""

    lo: float
    hi: float
    lang: Lang
    blocked: Any | None  # [i, j] -> bool: True where the masked stage holds −∞
    maxima: Container[tuple[int, int]] | None  # softmax only: where each row peaks
    row_sums: Any | None  # softmax only: [i] -> the sum of row i

    def cell(self, i: int, j: int, x: float, precision: int) -> Text:
        """One shaded cell; masked cells grey with −∞ or ·, a row maximum with *."""
        mark = ""
        if self.maxima is not None:
            mark = MAX_MARK if (i, j) in self.maxima else NO_MARK
        if self.blocked is not None and bool(self.blocked[i, j]):
            if x == -math.inf:
                return Text("−∞" + mark, style=MASKED_STYLE)
            return Text(format_number(x, precision) + MASKED_MARK, style=MASKED_STYLE)
        t = 0.5 if self.hi <= self.lo else (x - self.lo) / (self.hi - self.lo)
        style = heat_style(t)
        if mark == MAX_MARK:
            style += Style(bold=True, underline=True)
        return Text(format_number(x, precision) + mark, style=style)


def _heat(trace: Trace, stage: Stage, options: RenderOptions) -> StageHeat | None:
    if stage.name not in HEAT_STAGES:
        return None
    if stage.name == "softmax":
        lo, hi = 0.0, 1.0  # weights are probabilities: one fixed scale for every trace
    else:
        shown = _shown_values(stage, options)
        finite = shown[np.isfinite(shown)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    masked = "masked" in trace and stage.name in ("masked", "softmax")
    return StageHeat(stage.name, lo, hi, options.lang, masked)


def _shown_values(stage: Stage, options: RenderOptions) -> Any:
    """The numbers a stage's tables show (all with --full): the colour scale spans these, and
    an elided 4096 × 4096 stage costs no more to shade than a small one."""
    data = stage.data
    if options.full:
        return data
    slices = list(itertools.product(*(range(n) for n in data.shape[:-2])))
    if len(slices) > TABLE_LIMIT:
        slices = [*slices[:TABLE_EDGE], *slices[-TABLE_EDGE:]]
    rows = [i for i in pick(data.shape[-2], ROW_LIMIT, ROW_EDGE, False) if i is not None]
    if options.focus is not None and stage.axes[-2] in ("query", "seq"):
        rows = [options.focus]
    cols = [j for j in pick(data.shape[-1], COL_LIMIT, COL_EDGE, False) if j is not None]
    return np.stack([data[index][np.ix_(rows, cols)] for index in slices])


def render_legend(heat: StageHeat, lang: Lang, precision: int) -> Text:
    """The colour scale from low to high with its range, and what the marks mean."""
    # Gaps go at the end of a piece, never at the start of the next: SVG viewers drop
    # leading blanks of a positioned text run.
    text = Text.assemble((label(lang, "heat_low") + " ", "dim"))
    for n in range(12):
        text.append("█" if n < 11 else "█ ", style=Style(color=viridis(n / 11)))
    text.append(label(lang, "heat_high") + "  ", style="dim")
    text.append(f"{format_number(heat.lo, precision)} … {format_number(heat.hi, precision)}")
    if heat.stage == "softmax":
        text.append(f"   {MAX_MARK} {label(lang, 'heat_max')}")
    if heat.masked:
        sample = "−∞" if heat.stage == "masked" else MASKED_MARK
        text.append("   ")
        text.append(sample, style=MASKED_STYLE)
        text.append(f" {label(lang, 'heat_masked')}")
    return text


# ---------------------------------------------------------------------------------------------
# The explanation layer and the worked cell


def render_explanation(expl: Explanation) -> Panel:
    """Formula, shapes in and out, and meaning, in a box under the stage."""
    lang = expl.lang
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for n, line in enumerate(expl.formula):
        grid.add_row(label(lang, "formula") if n == 0 else "", _wrap(line, "italic"))
    shapes = Text.assemble(
        (label(lang, "in") + " ", "dim"), label(lang, "sep").join(expl.inputs),
        ("  →  " + label(lang, "out") + " ", "dim"), expl.output,
    )  # fmt: skip
    grid.add_row(label(lang, "shapes"), _wrap(shapes))
    for n, para in enumerate(expl.meaning):
        grid.add_row(label(lang, "meaning") if n == 0 else "", _wrap(para))
    return Panel(
        grid,
        title=Text(label(lang, "explain_title"), style="bold green"),
        title_align="left",
        border_style="green",
        box=box.ROUNDED,
    )


def _wrap(text: str | Text, style: str = "") -> Paragraph:
    return Paragraph(text if isinstance(text, Text) else Text(text, style=style))


# Chinese line breaking: never start a line with closing punctuation, never end one with opening.
_NO_LINE_START = frozenset("，。、；：？！）》」』】”’,.;:?!)]…")
_NO_LINE_END = frozenset("（《「『【“‘([")


class Paragraph:
    """Text wrapped for Chinese as well as English.

    Rich breaks lines only at spaces, so a run of Chinese (which has none) would be cut off or
    folded anywhere. Here a line may break at a space or between two wide characters, but not
    before closing punctuation (，。）) nor after opening punctuation (（“), as Chinese typesetting
    requires. Latin words and numbers stay whole.
    """

    def __init__(self, text: Text) -> None:
        self.text = text

    def _units(self) -> list[tuple[int, int]]:
        """(start, end) of each unbreakable piece: a Latin word, a wide character, a space."""
        plain = self.text.plain
        units: list[tuple[int, int]] = []
        start = 0
        for i, ch in enumerate(plain):
            if ch == " " or _wide(ch):
                if start < i:
                    units.append((start, i))
                units.append((i, i + 1))
                start = i + 1
        if start < len(plain):
            units.append((start, len(plain)))
        glued: list[tuple[int, int]] = []
        for a, b in units:
            if glued and not _may_break(plain, glued[-1][1], a):
                glued[-1] = (glued[-1][0], b)
            else:
                glued.append((a, b))
        return glued

    def _lines(self, width: int) -> list[Text]:
        plain = self.text.plain
        breaks: list[int] = []  # offsets where a new line starts
        used = 0
        for a, b in self._units():
            size = cell_len(plain[a:b])
            if plain[a] == " ":
                used += size
                continue
            if used + size > width and used > 0:
                breaks.append(a)
                used = 0
            used += size
        lines = []
        for line in self.text.divide(breaks):
            line.rstrip()
            while line.plain.startswith(" "):
                line = line[1:]
            lines.append(line)
        return lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in self._lines(options.max_width):
            line.overflow = "fold"
            line.end = "\n"
            yield line

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        plain = self.text.plain
        widest = max((cell_len(plain[a:b]) for a, b in self._units()), default=0)
        return Measurement(min(widest, options.max_width), cell_len(plain))


def _may_break(plain: str, end: int, start: int) -> bool:
    """May a line break fall between ``plain[:end]`` and ``plain[start:]`` (adjacent)?"""
    before, after = plain[end - 1], plain[start]
    if before == " " or after == " ":
        return True
    if not (_wide(before) and _wide(after)):
        return False  # Latin stays glued to what touches it: 键=3, W_Q、W_K
    return after not in _NO_LINE_START and before not in _NO_LINE_END


def _wide(ch: str) -> bool:
    return unicodedata.east_asian_width(ch) in ("W", "F")


def render_cell(part: CellText) -> Panel:
    """A worked cell's part for one stage: its lines, and the softmax row as a table."""
    body: list[RenderableType] = [_wrap(line) for line in part.lines]
    if part.header:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1), pad_edge=False)
        for n, head in enumerate(part.header):
            table.add_column(Text(head, style="dim"), justify="left" if n == 0 else "right")
        for row in part.rows:
            table.add_row(*(Text(c) for c in row))
        body.append(table)
    body.extend(_wrap(line) for line in part.footer)
    return Panel(
        Group(*body),
        title=Text(part.title, style="bold yellow"),
        title_align="left",
        border_style="yellow",
        box=box.ROUNDED,
    )


# ---------------------------------------------------------------------------------------------
# The compact heatmap view and step-mode pages


def render_heatmap(trace: Trace, options: RenderOptions) -> Group:
    """Only the attention weights, one shaded table per head, side by side when they fit."""
    from rich.columns import Columns

    stage = trace["softmax"]
    heat = _heat(trace, stage, options)
    assert heat is not None
    name = safe(trace.inputs.name) if trace.inputs.name else safe(trace.inputs.source)
    parts: list[RenderableType] = [
        Rule(
            Text.assemble((label(options.lang, "heat_title"), "bold cyan"), " · ", name),
            align="left",
            style="cyan",
        )
    ]
    has_batch = stage.axes[0] == "batch"
    batches = range(stage.shape[0]) if has_batch else [None]
    for b in batches:
        tables: list[RenderableType] = []
        heads = stage.shape[1] if has_batch else stage.shape[0]
        for h in range(heads):
            index = (h,) if b is None else (b, h)
            title = f"{label(options.lang, 'head')} {h}"
            if b is not None:
                title = f"{label(options.lang, 'batch')} {b} · {title}"
            tables.append(
                render_matrix(
                    stage.data[index],
                    row_labels=trace.query_labels,
                    col_labels=trace.key_labels,
                    row_axis="query",
                    title=title,
                    options=options,
                    heat=heat.slice(trace, stage, index),
                )
            )
        parts.append(Padding(Columns(tables, padding=(0, 4)), (0, 0, 1, 0)))
    parts.append(render_legend(heat, options.lang, options.precision))
    return Group(*parts)


def step_names(trace: Trace, options: RenderOptions) -> list[str]:
    """The stages step mode walks through, in pipeline order."""
    return [s.name for s in trace if options.stages is None or s.name in options.stages]


def render_step_page(trace: Trace, k: int, options: RenderOptions) -> Group:
    """Page ``k`` (0-based) of step mode: where we are, the stage, its explanation, the keys."""
    names = step_names(trace, options)
    n = len(names)
    position = label(options.lang, "step_position", k=k + 1, n=n)
    parts: list[RenderableType] = [
        Text.assemble((position, "bold reverse"), "  ", (names[k], "bold cyan")),
    ]
    if k == 0:
        parts.append(render_header(trace))
    parts.append(render_stage(trace, trace[names[k]], options, _cells(trace, options)))
    keys = label(options.lang, "step_last" if k == n - 1 else "step_keys")
    parts.append(Text.assemble((position, "bold"), "   ", (keys, "dim")))
    return Group(*parts)


# ---------------------------------------------------------------------------------------------
# HTML and SVG: the terminal rendering with its colours, as self-contained files

_FONT_URL = re.compile(r',\s*url\("[^"]*"\) format\("[^"]*"\)')


def record(renderable: RenderableType, width: int) -> Console:
    """A truecolour console of ``width`` columns that has recorded ``renderable``."""
    from io import StringIO

    console = Console(
        record=True,
        width=width,
        file=StringIO(),
        color_system="truecolor",
        force_terminal=True,
        highlight=False,
        markup=False,
        emoji=False,
        legacy_windows=False,
    )
    console.print(renderable)
    return console


def to_html(renderable: RenderableType, width: int, title: str) -> str:
    """A standalone HTML page (inline CSS, no external resources)."""
    from html import escape as html_escape

    page = record(renderable, width).export_html(inline_styles=True)
    head = f"<title>{html_escape(safe(title))}</title>\n<meta charset"
    return page.replace("<meta charset", head, 1)  # the template's head comes first


def to_svg(renderable: RenderableType, width: int, title: str) -> str:
    """A standalone SVG image; the web-font URLs are dropped so nothing is fetched."""
    svg = record(renderable, width).export_svg(title=safe(title), unique_id="attn")
    return _FONT_URL.sub("", svg)  # text is escaped (&quot;), so only the template matches
