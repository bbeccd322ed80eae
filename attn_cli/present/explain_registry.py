"""The explanation tables, and what their entries read and return.

``EXPLAINERS`` (keyed by the stage table's explanation keys, core/stages.py) and ``CELL_TEXTS``
(keyed by stage) are filled by the modules that write the texts, each with its own entries when
it is imported: explain.py (the forward stages) and explain_backward.py (the gradients). A
module of texts imports this one, never another module of texts; explain.py, which answers
``explain_stage`` and ``cell_text``, imports explain_backward, so every entry is in before the
first lookup.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attn_cli.present.i18n import Lang, axis_name, label
from attn_cli.present.text import safe, short_number
from attn_cli.present.variants import all_texts

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace
    from attn_cli.present.worked import WorkedCell

TERMS_SHOWN = 8  # a sum with more terms than this shows its first and last few unless full


@dataclass(frozen=True)
class Explanation:
    """One stage explained: formula lines, shapes in and out, and what it means."""

    stage: str
    lang: Lang
    formula: tuple[str, ...]
    inputs: tuple[str, ...]
    output: str
    meaning: tuple[str, ...]


@dataclass(frozen=True)
class CellText:
    """A worked cell's part for one stage: a title, lines, and an optional table."""

    title: str
    lines: tuple[str, ...]
    header: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()
    footer: tuple[str, ...] = ()


def shape_text(name: str, axes: Sequence[str], shape: Sequence[int], lang: Lang) -> str:
    """``Q [head=1, query=3, d_k=2]`` with the axis names in ``lang``."""
    dims = ", ".join(f"{axis_name(lang, a)}={n}" for a, n in zip(axes, shape, strict=True))
    return f"{name} [{dims}]"


@dataclass(frozen=True)
class Context:
    """What every stage's explanation reads: the trace, the stage, the language, numbers."""

    trace: Trace
    name: str
    lang: Lang
    precision: int

    @property
    def scale(self) -> str:
        return short_number(self.trace.scale, self.precision)

    @property
    def default_scale(self) -> str:
        return short_number(1 / math.sqrt(self.trace.inputs.d_k), self.precision)

    def shape_of(self, stage_name: str) -> str:
        s = self.trace[stage_name]
        return shape_text(stage_name, s.axes, s.shape, self.lang)

    def weight(self, w_name: str, axes: tuple[str, ...]) -> str:
        w = getattr(self.trace.inputs, w_name)
        assert w is not None
        return shape_text(w_name, axes, w.shape, self.lang)


Parts = tuple[tuple[str, ...], tuple[str, ...], list[str]]  # formula, inputs, meaning


@dataclass(frozen=True)
class Cell:
    """What every stage's part of the worked cell reads."""

    trace: Trace
    cell: WorkedCell
    lang: Lang
    precision: int
    full: bool
    stage: str = ""

    @property
    def q_label(self) -> str:
        return safe(self.trace.query_labels[self.cell.query])

    @property
    def k_label(self) -> str:
        return safe(self.trace.key_labels[self.cell.key])

    @property
    def at(self) -> str:
        return f"[{self.q_label}, {self.k_label}]"

    @property
    def title(self) -> str:
        title = label(self.lang, "cell_title", query=self.q_label, key=self.k_label)
        return title + self._where()

    @property
    def values_title(self) -> str:
        """The title of a part summed over every key (output): its columns are V's, no key's."""
        return label(self.lang, "cell_title_values", query=self.q_label) + self._where()

    def _where(self) -> str:
        where = _where(self.cell, self.trace, self.lang)
        return label(self.lang, "cell_where", where=where) if where else ""

    def n(self, x: float) -> str:
        return short_number(x, self.precision)

    def worked(self, key: str, line: str, **values: object) -> CellText:
        """The cell's part as the label ``key`` (what is computed) over one worked line."""
        return CellText(self.title, (label(self.lang, key, **values), line))

    def g(self, x: float) -> str:
        """A factor such as base^(−2i/dims) or a slope: ``precision`` significant digits."""
        if x == int(x) and abs(x) < 1e15:
            return str(int(x))
        return f"{x:.{self.precision}g}"


def _where(cell: WorkedCell, trace: Trace, lang: Lang) -> str:
    parts = []
    if cell.batch is not None:
        parts.append(f"{label(lang, 'batch')} {cell.batch}")
    if trace.inputs.heads > 1:
        parts.append(f"{label(lang, 'head')} {cell.head}")
        if trace.inputs.kv_heads != trace.inputs.heads:
            parts.append(f"{label(lang, 'kv_head')} {cell.kv_head}")
    return " · ".join(parts)


def pick_terms(n: int, full: bool, keep: int | None = None) -> list[int | None]:
    """Which terms to show: all, or the first and last few (and ``keep``) around "…"."""
    if full or n <= TERMS_SHOWN:
        return list(range(n))
    shown = {*range(TERMS_SHOWN - 2), *range(n - 2, n)} | ({keep} if keep is not None else set())
    picked: list[int | None] = []
    for i in sorted(shown):
        if picked and picked[-1] is not None and i != picked[-1] + 1:
            picked.append(None)
        picked.append(i)
    return picked


def sum_terms(terms: Sequence[str], full: bool) -> str:
    picked = pick_terms(len(terms), full)
    return " + ".join("…" if i is None else terms[i] for i in picked)


# One explainer per explanation key of the stage table (core/stages.py), and the part of the
# worked cell under each stage a cell runs through: filled by explain.py and explain_backward.py.
EXPLAINERS: dict[str, Callable[[Context], Parts]] = {}
CELL_TEXTS: dict[str, Callable[[Cell], CellText | None]] = {}


def explainer(key: str) -> Callable[[Context], Parts] | None:
    """The explainer for an explanation key: attn's own, else a registered variant's."""
    found = EXPLAINERS.get(key)
    for texts in all_texts():
        found = found or texts.explainers.get(key)
    return found


def cell_part(stage: str) -> Callable[[Cell], CellText | None] | None:
    """The worked-cell part under a stage: attn's own, else a registered variant's."""
    found = CELL_TEXTS.get(stage)
    for texts in all_texts():
        found = found or texts.cell_texts.get(stage)
    return found
