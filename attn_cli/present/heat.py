"""Heatmap shading of the score-like stages: viridis (present/palette.py), stepped where the
terminal has no true colour; the masked cells, each softmax row's maximum and its sum; the legend.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from attn_cli.core.stages import SCORE_STAGES as HEAT_STAGES
from attn_cli.present.i18n import Lang, label
from attn_cli.present.options import RenderOptions
from attn_cli.present.palette import (
    PALETTE_16,
    PALETTE_256,
    STEPPED_SYSTEMS,
    heat_style,
    scale_position,
    stepped_style,
    viridis,
)
from attn_cli.present.text import (
    format_number,
    pick_cols,
    pick_rows,
    shown_slices,
)

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Stage, Trace


MASKED_STYLE = Style(color="#e4e4e4", bgcolor="#585858", italic=True)
MAX_MARK, MASKED_MARK, NO_MARK = "*", "·", " "


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
        t = scale_position(x, self.lo, self.hi)
        extra = Style(bold=True, underline=True) if mark == MAX_MARK else None
        return HeatText(format_number(x, precision) + mark, t, extra)


class HeatText(Text):
    """A shaded cell that takes its colours when rendered: viridis in true colour (and in
    HTML/SVG), the stepped palette in a 256- or 16-colour terminal (present/palette.py)."""

    def __init__(self, text: str, t: float, extra: Style | None = None) -> None:
        super().__init__(text, style=heat_style(t) + extra if extra else heat_style(t))
        self.t = t
        self.extra = extra

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterable[Segment]:
        system = console.color_system
        if system not in STEPPED_SYSTEMS:
            yield from super().__rich_console__(console, options)
            return
        stepped = self.copy()
        stepped.style = self.style_for(system)
        yield from stepped.__rich_console__(console, options)

    def style_for(self, system: str | None) -> Style:
        """The cell's style in a terminal of colour ``system`` (Rich's name)."""
        if system not in STEPPED_SYSTEMS:
            return cast(Style, self.style)
        style = stepped_style(self.t, "256" if system == "256" else "standard")
        return style + self.extra if self.extra else style


def stage_heat(trace: Trace, stage: Stage, options: RenderOptions) -> StageHeat | None:
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
    slices = [index for index in shown_slices(data.shape, False) if index is not None]
    rows = [i for i in pick_rows(data.shape[-2], False) if i is not None]
    if options.focus is not None and stage.axes[-2] in ("query", "seq"):
        rows = [options.focus]
    cols = [j for j in pick_cols(data.shape[-1], False) if j is not None]
    return np.stack([data[index][np.ix_(rows, cols)] for index in slices])


def render_legend(heat: StageHeat, lang: Lang, precision: int) -> Legend:
    """The colour scale from low to high with its range, and what the marks mean."""
    return Legend(heat, lang, precision)


class Legend:
    """The legend of a stage's shading, drawn in the colours the terminal has."""

    def __init__(self, heat: StageHeat, lang: Lang, precision: int) -> None:
        self.heat = heat
        self.lang = lang
        self.precision = precision

    def text(self, system: str | None = None) -> Text:
        """The legend for a console of colour ``system`` (Rich's name; None: no colour)."""
        heat, lang = self.heat, self.lang
        # Gaps go at the end of a piece, never at the start of the next: SVG viewers drop
        # leading blanks of a positioned text run.
        text = Text.assemble((label(lang, "heat_low") + " ", "dim"))
        for n, colour in enumerate(blocks := _scale_colours(system)):
            text.append("█" if n < len(blocks) - 1 else "█ ", style=Style(color=colour))
        text.append(label(lang, "heat_high") + "  ", style="dim")
        lo, hi = format_number(heat.lo, self.precision), format_number(heat.hi, self.precision)
        text.append(f"{lo} … {hi}")
        if heat.stage == "softmax":
            text.append(f"   {MAX_MARK} {label(lang, 'heat_max')}")
        if heat.masked:
            sample = "−∞" if heat.stage == "masked" else MASKED_MARK
            text.append("   ")
            text.append(sample, style=MASKED_STYLE)
            text.append(f" {label(lang, 'heat_masked')}")
        return text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.text(console.color_system)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.text(console.color_system))


def _scale_colours(system: str | None) -> list[str]:
    """The colours of the legend's scale: 12 viridis samples, or the terminal's 10 steps."""
    if system == "256":
        return [f"color({n})" for n in PALETTE_256]
    if system in STEPPED_SYSTEMS:
        return list(PALETTE_16)
    return [viridis(n / 11) for n in range(12)]
