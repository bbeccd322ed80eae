"""A trace as Markdown (GitHub tables, for blog posts) or LaTeX (tabular per stage, for notes).

Same content as the terminal rendering: the configuration, every selected stage as labelled
tables, and on request the heatmap marks (row maximum, masked cells, row sums), the
explanations and the worked cell. Every piece of input text is escaped for the format, so a
token spelled ``[bold red]x[/]``, ``a|b`` or ``50% & $x_1$`` prints literally.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from attn_cli._version import __version__
from attn_cli.core.pipeline import Stage, Trace
from attn_cli.present.explain import cell_text, explain_stage
from attn_cli.present.explain_registry import CellText, Explanation
from attn_cli.present.i18n import Lang, axis_name, axis_title, dims_text, formula_text, label
from attn_cli.present.latex_math import cjk, latex_mixed
from attn_cli.present.latex_math import latex_escape as latex_escape
from attn_cli.present.options import CELLS_SHOWN
from attn_cli.present.text import (
    ELLIPSIS,
    TABLE_EDGE,
    axis_labels,
    format_number,
    header_lines,
    pick_cols,
    pick_rows,
    safe,
    shown_slices,
    slices_of,
    with_short_labels,
)
from attn_cli.present.variants import texts
from attn_cli.present.worked import (
    WorkedCell,
    row_max_positions_for_display,
    row_sums_for_display,
    worked_cells,
)

if TYPE_CHECKING:
    from attn_cli.present.options import RenderOptions


# ---------------------------------------------------------------------------------------------
# Escaping

_MD_SPECIAL = frozenset("\\`*_[]<>|~&$#!")


def md_escape(text: str) -> str:
    """Input text for Markdown (inline or in a table cell): markup characters escaped."""
    return "".join("\\" + c if c in _MD_SPECIAL else c for c in safe(text))


# ---------------------------------------------------------------------------------------------
# Shared walk over the trace


def _slices(stage: Stage, full: bool) -> tuple[list[tuple[int, ...] | None], int]:
    return shown_slices(stage.shape, full), len(slices_of(stage.shape))


def _slice_title(stage: Stage, index: tuple[int, ...], lang: Lang) -> str:
    return " · ".join(f"{axis_title(lang, a)} {i}" for a, i in zip(stage.axes, index, strict=False))


class _Grid:
    """One table of a stage as strings: header, rows, with the heatmap marks applied."""

    def __init__(
        self,
        trace: Trace,
        stage: Stage,
        index: tuple[int, ...],
        options: RenderOptions,
        number: Callable[[float], str],
        mark_max: Callable[[str], str],
        masked: Callable[[str], str],
    ) -> None:
        data, axes = stage.table  # a vector (d_b_O) as one row
        matrix = data[index] if index else data
        row_axis, col_axis = axes[-2], axes[-1]
        row_labels = axis_labels(trace, row_axis, matrix.shape[0])
        col_labels = axis_labels(trace, col_axis, matrix.shape[1])
        if options.focus is not None and row_axis in ("query", "seq"):
            rows: list[int | None] = [options.focus]
        else:
            rows = pick_rows(matrix.shape[0], options.full)
        cols = pick_cols(matrix.shape[1], options.full)
        heat = options.heatmap and stage.name in ("masked", "softmax")
        blocked: Any = None
        if heat and "masked" in trace:
            source = trace["masked"].data
            blocked = (source[index] if index else source) == -math.inf
        softmax = options.heatmap and stage.name == "softmax"
        maxima = row_max_positions_for_display(matrix) if softmax else frozenset()
        sums = row_sums_for_display(matrix) if softmax else ()
        self.header = [axis_name(options.lang, row_axis)]
        self.header += [ELLIPSIS if j is None else col_labels[j] for j in cols]
        if softmax:
            self.header.append(label(options.lang, "heat_row_sum"))
        self.rows: list[list[str]] = []
        self.row_labels: list[str | None] = []
        for i in rows:
            if i is None:
                self.row_labels.append(None)
                self.rows.append([ELLIPSIS] * (len(self.header) - 1))
                continue
            self.row_labels.append(row_labels[i])
            cells = []
            for j in cols:
                if j is None:
                    cells.append(ELLIPSIS)
                    continue
                text = number(float(matrix[i, j]))
                if blocked is not None and blocked[i, j]:
                    text = masked(text)
                elif (i, j) in maxima:
                    text = mark_max(text)
                cells.append(text)
            if softmax:
                cells.append(number(sums[i]))
            self.rows.append(cells)


# ---------------------------------------------------------------------------------------------
# Markdown


def to_markdown(trace: Trace, options: RenderOptions) -> str:
    """The trace as GitHub-flavoured Markdown (token labels cut as the terminal cuts them)."""
    trace = with_short_labels(trace)
    lang = options.lang
    inp = trace.inputs
    out = [f"# {md_escape(inp.name or label(lang, 'trace_title'))}", ""]
    out += [f"*{md_escape(label(lang, 'traced_by', version=__version__))}*", ""]
    for key, value in header_lines(trace, lang):
        out.append(f"- **{key}**: {md_escape(value)}" if key else f"  {md_escape(value)}")
    out.append("")
    if options.focus is not None:
        focus = label(lang, "focus", query=trace.query_labels[options.focus])
        out += [f"**{md_escape(focus)}**", ""]
    cells = worked_cells(trace, options.cell) if options.cell is not None else []
    for stage in trace:
        if options.stages is not None and stage.name not in options.stages:
            continue
        where = md_escape(f"[{dims_text(lang, stage.axes, stage.shape)}]")
        texts(trace.inputs)  # the words of the variants on join the formulas' table (window's)
        formula = formula_text(lang, stage.formula)
        out += [f"## {stage.name}", "", f"{_code(formula)} — {where}", ""]
        shown, total = _slices(stage, options.full)
        for index in shown:
            if index is None:
                more = label(lang, "more_tables", n=total - 2 * TABLE_EDGE)
                out += [f"*{ELLIPSIS} {md_escape(more)}*", ""]
                continue
            if total > 1:
                out += [f"**{md_escape(_slice_title(stage, index, lang))}**", ""]
            grid = _Grid(
                trace,
                stage,
                index,
                options,
                number=lambda x: _md_number(x, options.precision),
                mark_max=lambda s: f"**{s}**",
                masked=lambda s: f"*{s}* ·",
            )
            out += _md_table(grid)
        if options.heatmap and stage.name == "softmax":
            legend = (
                f"**{label(lang, 'md_bold')}** = {label(lang, 'heat_max')}; "
                f"· = {label(lang, 'heat_masked')}; "
                f"{label(lang, 'heat_row_sum')} = Σ"
            )
            out += [legend, ""]
        if options.explain:
            out += _md_explanation(explain_stage(trace, stage.name, lang, options.precision))
        for n, cell in enumerate(cells):
            if n == CELLS_SHOWN and not options.full:
                out += [f"*{ELLIPSIS} +{len(cells) - CELLS_SHOWN}*", ""]
                break
            part = cell_text(trace, cell, stage.name, lang, options.precision, options.full)
            if part is not None:
                out += _md_cell(part)
    return "\n".join(out).rstrip("\n") + "\n"


def _md_number(x: float, precision: int) -> str:
    if x == -math.inf:
        return "−∞"
    return format_number(x, precision)


def _code(text: str) -> str:
    """An inline code span that survives any backticks inside it."""
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _md_table(grid: _Grid) -> list[str]:
    header = [md_escape(h) for h in grid.header]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" + "--:|" * (len(header) - 1)]
    for row_label, cells in zip(grid.row_labels, grid.rows, strict=True):
        first = ELLIPSIS if row_label is None else md_escape(row_label)
        lines.append("| " + " | ".join([first, *cells]) + " |")
    return [*lines, ""]


def _md_explanation(expl: Explanation) -> list[str]:
    lang = expl.lang
    out = [f"**{md_escape(label(lang, 'explain_title'))}**", ""]
    for n, line in enumerate(expl.formula):
        out.append(
            f"- **{label(lang, 'formula')}**: {_code(line)}" if n == 0 else f"  {_code(line)}"
        )
    shapes = (
        f"{label(lang, 'in')} {md_escape(label(lang, 'sep').join(expl.inputs))} → "
        f"{label(lang, 'out')} {md_escape(expl.output)}"
    )
    out.append(f"- **{label(lang, 'shapes')}**: {shapes}")
    for n, para in enumerate(expl.meaning):
        lead = f"- **{label(lang, 'meaning')}**: " if n == 0 else "  "
        out += [lead + md_escape(para)] if n == 0 else ["", lead + md_escape(para)]
    return [*out, ""]


def _md_cell(part: CellText) -> list[str]:
    out = [f"**{md_escape(part.title)}**", ""]
    out += [f"- {md_escape(line)}" for line in part.lines]
    out.append("")
    if part.header:
        out.append("| " + " | ".join(md_escape(h) for h in part.header) + " |")
        out.append("|" + "---|" + "--:|" * (len(part.header) - 1))
        out += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in part.rows]
        out.append("")
    out += [f"- {md_escape(line)}" for line in part.footer]
    return [*out, ""] if part.footer else out


# ---------------------------------------------------------------------------------------------
# LaTeX


def to_latex(trace: Trace, options: RenderOptions) -> str:
    """The trace as a standalone LaTeX document for pdflatex (tabular per stage; token labels
    cut as the terminal cuts them)."""
    trace = with_short_labels(trace)
    body = _latex_header(trace, options)
    cells = worked_cells(trace, options.cell) if options.cell is not None else []
    for stage in trace:
        if options.stages is None or stage.name in options.stages:
            body += _latex_stage(trace, stage, options, cells)
    return _latex_document("\n".join(body))


def _latex_header(trace: Trace, options: RenderOptions) -> list[str]:
    """The title, the configuration as a description list, and the focused query."""
    lang = options.lang
    inp = trace.inputs
    body = [r"\section*{" + latex_escape(inp.name or label(lang, "trace_title")) + "}"]
    body.append(r"\noindent\textit{" + latex_escape(label(lang, "traced_by", version=__version__)))
    body[-1] += "}"
    body.append(r"\begin{description}")
    given = (inp.description or "", inp.source)  # input text: printed as typed
    for key, value in header_lines(trace, lang):
        body.append(rf"\item[{latex_escape(key)}] {latex_mixed(value, given)}")
    body.append(r"\end{description}")
    if options.focus is not None:
        focus = label(lang, "focus", query=trace.query_labels[options.focus])
        body.append(r"\noindent\textbf{" + latex_escape(focus) + "}\n")
    return body


def _latex_stage(
    trace: Trace, stage: Stage, options: RenderOptions, cells: list[WorkedCell]
) -> list[str]:
    """One stage: its name, formula and shape, its tables, explanation and worked cells."""
    lang = options.lang
    tokens = _tokens(trace)
    shape = dims_text(lang, stage.axes, stage.shape)
    body = [r"\subsection*{" + latex_escape(stage.name) + "}"]
    texts(trace.inputs)  # the words of the variants on join the formulas' table (window's)
    formula = latex_mixed(formula_text(lang, stage.formula), tokens)
    shape = latex_mixed(f"[{shape}]", formulas=False)
    body.append(r"\noindent " + formula + r"\quad " + shape + "\n")
    shown, total = _slices(stage, options.full)
    for index in shown:
        if index is None:
            more = label(lang, "more_tables", n=total - 2 * TABLE_EDGE)
            body.append(r"\noindent\dots{} " + latex_escape(more) + "\n")
            continue
        grid = _Grid(
            trace,
            stage,
            index,
            options,
            number=_latex_number(options.precision),
            mark_max=lambda s: "$" + r"\mathbf{" + s.strip("$") + "}$",
            masked=lambda s: s + r"\ensuremath{\cdot}",
        )
        title = latex_escape(_slice_title(stage, index, lang)) if total > 1 else ""
        body += _latex_table(grid, title)
    if options.explain:
        expl = explain_stage(trace, stage.name, lang, options.precision)
        body += _latex_explanation(expl, tokens)
    for n, cell in enumerate(cells):
        if n == CELLS_SHOWN and not options.full:
            body.append(r"\noindent\dots{} " + f"+{len(cells) - CELLS_SHOWN}\n")
            break
        part = cell_text(trace, cell, stage.name, lang, options.precision, options.full)
        if part is not None:
            body += _latex_cell(part, tokens)
    return body


def _tokens(trace: Trace) -> tuple[str, ...]:
    """The tokens as the explanations show them: literal text inside any formula."""
    return tuple(safe(t) for t in (*trace.query_labels, *trace.key_labels))


def _latex_document(text: str) -> str:
    """The preamble around ``text``; the CJK package only when the text has Chinese."""
    chinese = any(cjk(c) for c in text)
    head = [
        r"% Generated by attn " + __version__ + ". Compile with: pdflatex FILE.tex",
        r"\documentclass[10pt]{article}",
        r"\usepackage[T1]{fontenc}",
        r"\usepackage[utf8]{inputenc}",
        r"\usepackage{amsmath}",
        r"\setlength{\parindent}{0pt}",
        r"\setlength{\parskip}{4pt}",
    ]
    if chinese:
        head.append(r"\usepackage{CJKutf8}  % Chinese: needs the CJK package (texlive-lang-cjk)")
    doc = [*head, r"\begin{document}"]
    doc += [r"\begin{CJK}{UTF8}{gbsn}", text, r"\end{CJK}"] if chinese else [text]
    doc.append(r"\end{document}")
    return "\n".join(doc) + "\n"


def _latex_number(precision: int) -> Callable[[float], str]:
    def number(x: float) -> str:
        if math.isinf(x):
            return r"$-\infty$" if x < 0 else r"$\infty$"
        return "$" + format_number(x, precision) + "$"

    return number


def _latex_table(grid: _Grid, title: str) -> list[str]:
    spec = "l|" + "r" * (len(grid.header) - 1)
    out = []
    if title:
        out.append(r"\noindent\textbf{" + title + "}\n")
    out.append(r"\noindent\begin{tabular}{" + spec + "}")
    out.append(" & ".join(latex_escape(h) for h in grid.header) + r" \\ \hline")
    for row_label, cells in zip(grid.row_labels, grid.rows, strict=True):
        first = r"\dots{}" if row_label is None else latex_escape(row_label)
        cells = [r"\dots{}" if c == ELLIPSIS else c for c in cells]
        out.append(" & ".join([first, *cells]) + r" \\")
    out.append(r"\end{tabular}")
    out.append("")
    return out


def _latex_explanation(expl: Explanation, tokens: Sequence[str]) -> list[str]:
    lang = expl.lang
    out = [r"\noindent\textbf{" + latex_escape(label(lang, "explain_title")) + "}"]
    out.append(r"\begin{description}")
    formula = r"\\ ".join(latex_mixed(line, tokens) for line in expl.formula)
    out.append(rf"\item[{latex_escape(label(lang, 'formula'))}] {formula}")
    shapes = (
        f"{label(lang, 'in')} {label(lang, 'sep').join(expl.inputs)} → "
        f"{label(lang, 'out')} {expl.output}"
    )
    shapes = latex_mixed(shapes, tokens, formulas=False)
    out.append(rf"\item[{latex_escape(label(lang, 'shapes'))}] {shapes}")
    meaning = "\n\n".join(latex_mixed(p, tokens) for p in expl.meaning)
    out.append(rf"\item[{latex_escape(label(lang, 'meaning'))}] {meaning}")
    out.append(r"\end{description}")
    return out


def _latex_cell(part: CellText, tokens: Sequence[str]) -> list[str]:
    """A worked cell's part: its numbers set as math, as the tables set theirs."""
    out = [r"\noindent\textbf{" + latex_mixed(part.title, tokens) + "}", r"\begin{itemize}"]
    out += [r"\item " + latex_mixed(line, tokens) for line in part.lines]
    out.append(r"\end{itemize}")
    if part.header:
        out.append(r"\noindent\begin{tabular}{l|" + "r" * (len(part.header) - 1) + "}")
        out.append(" & ".join(latex_mixed(h) for h in part.header) + r" \\ \hline")
        out += [
            " & ".join([latex_escape(row[0]), *(latex_mixed(c) for c in row[1:])]) + r" \\"
            for row in part.rows
        ]
        out.append(r"\end{tabular}")
        out.append("")
    out += [r"\noindent " + latex_mixed(line, tokens) + "\n" for line in part.footer]
    return out
