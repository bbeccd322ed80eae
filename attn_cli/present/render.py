"""Rich renderables for a trace: a header of the configuration, then one table per stage slice.

Renderers only format what the pipeline computed; they never recompute. Only the CLI prints.
The classroom layer adds, on request: heatmap shading of the score-like stages, a focus on one
query row, the explanation of each stage, a worked cell, step-mode pages and HTML/SVG export.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.panel import Panel
from rich.rule import Rule
from rich.text import Text

from attn_cli.present.heat import SliceHeat, StageHeat, render_legend, stage_heat
from attn_cli.present.i18n import Lang, axis_name, axis_title, dims_text, formula_text, label
from attn_cli.present.options import CELLS_SHOWN, RenderOptions
from attn_cli.present.text import (
    ELLIPSIS,
    NONE,
    TABLE_EDGE,
    axis_labels,
    format_number,
    header_lines,
    pick_cols,
    pick_rows,
    safe,
    shown_slices,
    slices_of,
)
from attn_cli.present.variants import texts

if TYPE_CHECKING:
    from rich.table import Table

    # The classroom layers (explanations, worked cells) are imported where an option asks
    # for them, so a plain `attn trace` does not pay for them at start-up.
    from attn_cli.core.pipeline import Stage, Trace
    from attn_cli.present.explain_registry import CellText, Explanation
    from attn_cli.present.svg import Theme
    from attn_cli.present.worked import WorkedCell


def render_trace(trace: Trace, options: RenderOptions | None = None) -> Group:
    """The whole trace: configuration header, then every selected stage."""
    options = options or RenderOptions()
    parts: list[RenderableType] = [render_header(trace, options.lang)]
    if options.focus is not None:
        focus = safe(trace.query_labels[options.focus])
        parts.append(Text(label(options.lang, "focus", query=focus), style="bold magenta"))
    cells = _cells(trace, options)
    for stage in trace:
        if options.stages is None or stage.name in options.stages:
            parts.append(render_stage(trace, stage, options, cells))
    return Group(*parts)


def render_header(trace: Trace, lang: Lang = "en") -> Panel:
    """The configuration: shapes, heads, scale and its source, masking semantics."""
    inp = trace.inputs
    grid = fields([(key, Text(safe(value))) for key, value in header_lines(trace, lang)])
    title = Text(safe(inp.name) if inp.name else label(lang, "trace_title"), style="bold")
    return Panel(grid, title=title, title_align="left", box=box.ROUNDED)


def fields(lines: list[tuple[str, Text]]) -> Table:
    """Keys in bold, each value wrapped beside its key (a Rich grid)."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for key, value in lines:
        grid.add_row(key, value)
    return grid


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
    heat = stage_heat(trace, stage, options) if options.heatmap else None
    parts = [
        *_stage_heading(trace, stage, options.lang),
        *_stage_tables(trace, stage, options, heat),
    ]
    if heat is not None:
        parts.append(Padding(render_legend(heat, options.lang, options.precision), (0, 0, 1, 0)))
    if options.explain:
        from attn_cli.present.explain import explain_stage

        parts.append(
            render_explanation(explain_stage(trace, stage.name, options.lang, options.precision))
        )
    parts += _stage_cells(trace, stage, options, cells or ())
    return Group(*parts)


def _stage_heading(trace: Trace, stage: Stage, lang: Lang) -> list[RenderableType]:
    """The rule with the stage's name, and its formula and shape."""
    texts(trace.inputs)  # the words of the variants on join the formulas' table (window's)
    formula = formula_text(lang, stage.formula)
    if stage.name == "scaled":
        formula += label(lang, "scale_note", scale=f"{trace.scale:.6g}")
    shape = dims_text(lang, stage.axes, stage.shape)
    return [
        Rule(Text(stage.name, style="bold cyan"), align="left", style="cyan"),
        Text.assemble((formula, "italic"), "   ", (f"[{shape}]", "dim")),
    ]


def _stage_tables(
    trace: Trace, stage: Stage, options: RenderOptions, heat: StageHeat | None
) -> list[RenderableType]:
    """A table per slice of the stage (batch item, head), the middle ones elided."""
    data, axes = stage.table  # a vector (d_b_O) as one row
    lead = axes[:-2]
    slices = slices_of(data.shape)
    shown = shown_slices(data.shape, options.full)
    row_axis, col_axis = axes[-2], axes[-1]
    only_rows = None
    if options.focus is not None and row_axis in ("query", "seq"):
        only_rows = (options.focus,)
    parts: list[RenderableType] = []
    for index in shown:
        if index is None:
            parts.append(
                Padding(Text(_more_tables(options.lang, len(slices)), style="dim"), (0, 0, 1, 2))
            )
            continue
        title = " · ".join(
            f"{axis_title(options.lang, a)} {i}" for a, i in zip(lead, index, strict=True)
        )
        matrix = data[index] if index else data
        parts.append(
            render_matrix(
                matrix,
                row_labels=axis_labels(trace, row_axis, matrix.shape[0]),
                col_labels=axis_labels(trace, col_axis, matrix.shape[1]),
                row_axis=row_axis,
                title=title if len(slices) > 1 else None,  # a single table needs no "head 0"
                options=options,
                heat=None if heat is None else heat.slice(trace, stage, index),
                only_rows=only_rows,
                spaced=True,
            )
        )
    return parts


def _more_tables(lang: Lang, total: int) -> str:
    """``… 10 more tables (… --full shows all)``."""
    more = label(lang, "more_tables", n=total - 2 * TABLE_EDGE)
    hint = label(lang, "full_hint", e=ELLIPSIS)
    return f"{ELLIPSIS} {more} ({hint})" if lang == "en" else f"{ELLIPSIS} {more}（{hint}）"


def _stage_cells(
    trace: Trace, stage: Stage, options: RenderOptions, cells: Sequence[WorkedCell]
) -> list[RenderableType]:
    """The worked cells' parts for this stage, the first few unless ``full``."""
    if not cells:
        return []
    from attn_cli.present.explain import cell_text

    parts: list[RenderableType] = []
    for n, cell in enumerate(cells):
        if n == CELLS_SHOWN and not options.full:
            more = len(cells) - CELLS_SHOWN
            parts.append(Text(f"{ELLIPSIS} +{more} ({ELLIPSIS} --full)", style="dim"))
            break
        part = cell_text(trace, cell, stage.name, options.lang, options.precision, options.full)
        if part is not None:
            parts.append(render_cell(part))
    return parts


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
    none: Callable[[int, int], bool] | None = None,
) -> Matrix:
    """A 2-D array as a table with labelled rows and columns, elided unless ``full``.

    Columns are elided to what fits the width the table is rendered at (see :class:`Matrix`);
    ``spaced`` adds a blank line under it; a cell where ``none(i, j)`` holds no number (an empty
    cache slot's) and shows ``NONE``.
    """
    rows: list[int | None] = (
        list(only_rows) if only_rows is not None else pick_rows(len(row_labels), options.full)
    )
    cols = pick_cols(len(col_labels), options.full)
    # Each column as (header, cells), formatted once; the table is assembled when the width
    # it has is known (Matrix), from the columns that fit.
    labels: _Column = (
        Text(axis_name(options.lang, row_axis), style="dim"),
        [ELLIPSIS if i is None else safe(row_labels[i]) for i in rows],
    )
    columns: dict[int | None, _Column] = {None: (ELLIPSIS, [ELLIPSIS for _ in rows])}
    shown = [j for j in cols if j is not None]
    values = _gathered(matrix, rows, shown) if heat is None else None
    for n, j in enumerate(shown):
        if values is not None:
            cells = [
                ELLIPSIS if x is None else _plain_cell(x[n], options.precision) for x in values
            ]
        else:
            cells = [_number_cell(matrix, i, j, options.precision, heat) for i in rows]
        if none is not None:
            cells = [
                Text(NONE, style="dim") if i is not None and none(i, j) else c
                for i, c in zip(rows, cells, strict=True)
            ]
        columns[j] = (safe(col_labels[j]), cells)
    return Matrix(
        Text(title, style="bold") if title else None,
        labels,
        columns,
        _row_sums(heat, rows, options.precision),
        cols,
        len(col_labels),
        options.full,
        spaced,
    )


def _gathered(matrix: Any, rows: list[int | None], cols: list[int]) -> list[list[float] | None]:
    """The shown cells of an unshaded table as Python floats, row by row (None: the elided
    row), read in one gather rather than one element at a time."""
    kept = [i for i in rows if i is not None]
    block = np.asarray(matrix)[np.ix_(kept, cols)].tolist() if kept and cols else []
    values = iter(block)
    return [None if i is None else (next(values) if cols else []) for i in rows]


def _plain_cell(x: float, precision: int) -> Text | str:
    """An unshaded number: plain text, dim when −∞."""
    if x == -math.inf:
        return Text(format_number(x, precision), style="dim")
    return format_number(x, precision)


def _number_cell(
    matrix: Any, i: int | None, j: int, precision: int, heat: SliceHeat | None
) -> Text | str:
    """Cell (i, j): the number, shaded with a heatmap; the ellipsis for an elided row."""
    if i is None:
        return ELLIPSIS
    x = float(matrix[i, j])
    if heat is not None:
        return heat.cell(i, j, x, precision)
    return Text(format_number(x, precision), style="dim" if x == -math.inf else "")


def _row_sums(heat: SliceHeat | None, rows: list[int | None], precision: int) -> _Column | None:
    """The softmax heatmap's "row sum" column, or None."""
    if heat is None or heat.row_sums is None:
        return None
    sums = heat.row_sums
    return (
        Text(label(heat.lang, "heat_row_sum"), style="dim"),
        [
            ELLIPSIS if i is None else Text(format_number(sums[i], precision), style="dim")
            for i in rows
        ],
    )


def simple_table(title: Text | None = None) -> Table:
    """A summary table: its title on the left, a rule under the headers, no edges, one blank
    inside each side of a cell."""
    from rich.table import Table

    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1),
    )


def listing(
    title: Text | None,
    columns: Sequence[tuple[str, str]],  # (header, justify)
    rows: Sequence[Sequence[Text | str]],
    no_wrap: bool = False,
) -> Table:
    """A :func:`simple_table` of ``columns`` and ``rows``."""
    table = simple_table(title)
    for header, justify in columns:
        table.add_column(header, justify=cast(Any, justify), no_wrap=no_wrap)
    for row in rows:
        table.add_row(*row)
    return table


# a table column: its header and its cells, each a str (plain: a label, a number) or a Text
_Column = tuple[Text | str, list[Text | str]]


def _text(cell: Text | str) -> Text:
    """A cell as Text for Rich's table: a str is never read as markup (a token's "[b]")."""
    return Text(cell) if isinstance(cell, str) else cell


class Matrix:
    """A matrix table that shows as many columns as fit the width it is rendered at.

    Without ``full``, the middle columns give way to the ellipsis column (as NumPy elides),
    so the table is never wider than the terminal unless even the first column alone is too wide.
    With ``full``, every column is shown: in blocks of columns one under another, each with the
    row labels and as many columns as fit the width (as NumPy wraps a wide array), the title
    over the first, the row sums beside the last.
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
        table = simple_table(self.title)
        # Each column as wide as its widest cell, so Rich need not measure every cell.
        table.add_column(
            _text(self.labels[0]),
            justify="left",
            no_wrap=True,
            style="bold",
            width=self.label_width,
        )
        for j in cols:
            table.add_column(
                _text(self.columns[j][0]), justify="right", no_wrap=True, width=self.widths[j]
            )
        if self.row_sums is not None:
            table.add_column(_text(self.row_sums[0]), justify="right", width=self.sums_width)
        shown = [self.labels, *(self.columns[j] for j in cols)]
        if self.row_sums is not None:
            shown.append(self.row_sums)
        for r in range(len(self.labels[1])):
            table.add_row(*(_text(cells[r]) for _, cells in shown))
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

    def blocks(self, max_width: int) -> list[list[int | None]]:
        """Every column, in blocks that each fit ``max_width`` beside the labels (and the row
        sums: a block of one column is as narrow as the table gets)."""
        out: list[list[int | None]] = [[]]
        for j in self.cols:
            if out[-1] and self.width([*out[-1], j]) > max_width:
                out.append([])
            out[-1].append(j)
        return out

    def block(self, cols: list[int | None], first: bool, last: bool) -> Matrix:
        """The table of one block of columns of the full matrix."""
        return Matrix(
            self.title if first else None,
            self.labels,
            {j: self.columns[j] for j in cols},
            self.row_sums if last else None,
            cols,
            self.n,
            True,
            self.spaced or not last,
        )

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        cols = self.cols if self.full else self.fitting(options.max_width)
        width = self.width(cols)
        if self.full and width > options.max_width and len(cols) > 1:
            blocks = self.blocks(options.max_width)
            for n, block in enumerate(blocks):
                part = self.block(block, n == 0, n == len(blocks) - 1)
                yield from console.render(part, options)
            return
        if self.full:  # one column, wider than the console: as wide as it needs
            options = options.update_width(max(options.max_width, width))
        table = self.table(cols)  # Rich crops the cells, wraps the title
        yield from console.render(
            Padding(table, (0, 0, 1, 0), expand=False) if self.spaced else table, options
        )

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        narrowest = self.width(self.cols if self.full else self.fitting(0))
        return Measurement(narrowest, self.width(self.cols))


def _widest(column: _Column) -> int:
    head, cells = column
    return max(cell_len(c.plain if isinstance(c, Text) else c) for c in (head, *cells))


# ---------------------------------------------------------------------------------------------
# The explanation layer and the worked cell


def render_explanation(expl: Explanation) -> Panel:
    """Formula, shapes in and out, and meaning, in a box under the stage."""
    from rich.table import Table

    lang = expl.lang
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for n, line in enumerate(expl.formula):
        grid.add_row(label(lang, "formula") if n == 0 else "", _wrap(line, "italic"))
    shapes = Text.assemble(
        (label(lang, "in") + " ", "dim"),
        label(lang, "sep").join(expl.inputs),
        ("  →  " + label(lang, "out") + " ", "dim"),
        expl.output,
    )
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
    import unicodedata  # a C module: only explanations that wrap load it

    return unicodedata.east_asian_width(ch) in ("W", "F")


def render_cell(part: CellText) -> Panel:
    """A worked cell's part for one stage: its lines, and the softmax row as a table."""
    body: list[RenderableType] = [_wrap(line) for line in part.lines]
    if part.header:
        table = simple_table()
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
    heat = stage_heat(trace, stage, options)
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
        parts.append(render_header(trace, options.lang))
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


def to_html(
    renderable: RenderableType, width: int, title: str, theme: Theme = "dark", lang: Lang = "en"
) -> str:
    """A standalone HTML page (inline CSS, no external resources) in the theme's colours."""
    from attn_cli.present.svg import html_page

    return html_page(record(renderable, width), safe(title), theme, lang)


def to_svg(
    renderable: RenderableType, width: int, title: str, theme: Theme = "dark", lang: Lang = "en"
) -> str:
    """A standalone SVG image that renders alike in browsers, librsvg and Inkscape; the web-font
    URLs are dropped so nothing is fetched."""
    from attn_cli.present.svg import HTML_LANG, place_text_runs, terminal_theme

    svg = record(renderable, width).export_svg(
        title=safe(title), theme=terminal_theme(theme), unique_id="attn"
    )
    svg = _FONT_URL.sub("", svg)  # text is escaped (&quot;), so only the template matches
    svg = svg.replace("<svg ", f'<svg lang="{HTML_LANG.get(lang, "en")}" ', 1)
    return place_text_runs(svg)
