"""How to show a trace, shared by every back end; importing it costs nothing (no Rich)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attn_cli.present.i18n import Lang
    from attn_cli.present.worked import CellRef

CELLS_SHOWN = 4  # worked cells (batch items x heads) shown unless full


@dataclass(frozen=True)
class RenderOptions:
    """How to show a trace: digits, which stages, elision, and the classroom extras."""

    precision: int = 4
    stages: tuple[str, ...] | None = None
    full: bool = False
    heatmap: bool = False  # shade the score-like stages, mark row maxima, show row sums
    explain: bool = False  # formula, shapes and meaning under each stage
    lang: Lang = "en"
    cell: CellRef | None = None  # the worked cell, shown under the stages it runs through
    focus: int | None = None  # show only this query's row in the stages that have one
