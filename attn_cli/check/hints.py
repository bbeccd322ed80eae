"""What the first differing stage looks like next to attn's, when no known mistake reproduces it:
one number added everywhere or to each row, a shift of one along a token axis, an axis in
another order, rows that no longer sum as attn's do, the cells that differ holding the values
of an earlier stage; and failing all of these, where the differing cells sit. Each look is one
sentence for a ``hint:`` line: a place to look, never a diagnosis. The factor everywhere and
the transposed axes are grade.py's (``SameRatio``, ``TransposeFit``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from attn_cli.check.compare import Tolerance, all_close, cell_errors, conform
from attn_cli.check.recompute import allowed
from attn_cli.core.inputs import BoolArray, FloatArray
from attn_cli.core.stages import STAGE_NAMES

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace

TOKEN_AXES = ("query", "key", "seq")  # where a position read one off shows as a shift
MAX_COLUMNS = 256  # a longer axis is not searched for a permutation


def _logits() -> tuple[str, ...]:
    """The stages from scores to masked (the score modifiers' and biases' between): a constant
    per row leaves the softmax blind to it."""
    return tuple(STAGE_NAMES[STAGE_NAMES.index("scores") : STAGE_NAMES.index("masked") + 1])


def looks(trace: Trace, stage: str, given: FloatArray, tolerance: Tolerance) -> tuple[str, ...]:
    """The sentences that describe ``given`` next to attn's ``stage``; () when it fits no
    layout of attn's or does not differ."""
    ref = trace[stage]
    yours = conform(given, ref.shape, ref.axes, stage)
    if yours is None:
        return ()
    attn = ref.data.astype(np.float64)
    yours = yours.astype(np.float64)
    bad = cell_errors(yours, attn, tolerance)[0]
    if not bad.any():
        return ()
    seen = Seen(trace, stage, yours, attn, bad, tolerance)
    with np.errstate(all="ignore"):
        said = [s for s in (look(seen) for look in LOOKS) if s is not None]
        return tuple(said) or (where(seen),)


@dataclass(frozen=True)
class Seen:
    """Your ``stage`` next to attn's, both float64 in attn's layout: ``bad`` the cells that
    differ beyond ``tol``."""

    trace: Trace
    stage: str
    yours: FloatArray
    attn: FloatArray
    bad: BoolArray
    tol: Tolerance

    @property
    def axes(self) -> tuple[str, ...]:
        return self.trace[self.stage].axes


Look = Callable[[Seen], "str | None"]


def offset(s: Seen) -> str | None:
    """One number added to every cell, or (logits) one number of its own to each row."""
    stage, yours, attn, tol = s.stage, s.yours, s.attn, s.tol
    finite = np.isfinite(yours) & np.isfinite(attn)
    if not finite.any() or s.bad.sum() < 2:
        return None
    diff = np.where(finite, yours - attn, np.nan)
    c = float(np.nanmedian(diff))
    if c != 0 and all_close(yours, attn + c, tol):
        return (
            f"every cell of your {stage} is attn's + {c:.4g}: a bias or a constant added (or "
            "subtracted) where it was not meant?"
        )
    if stage not in _logits():
        return None
    per_row = np.nanmedian(diff, axis=-1, keepdims=True)  # (..., 1)
    per_row = np.where(np.isnan(per_row), 0.0, per_row)
    if all_close(yours, attn + per_row, tol):
        return (
            f"each row of your {stage} is attn's plus a number of its own (one per query): the "
            "softmax does not see it, so your weights may still agree; a term that depends on "
            "the query only (a bias by query position, a row maximum subtracted?)"
        )
    return None


def shift(s: Seen) -> str | None:
    """Your stage equals attn's moved by one along a token axis (where they overlap)."""
    yours, attn, bad = s.yours, s.attn, s.bad
    for axis, name in enumerate(s.axes):
        n = yours.shape[axis]
        if name not in TOKEN_AXES or n < 3:
            continue
        for by in (1, -1):
            mine = np.take(yours, range(max(0, -by), n - max(0, by)), axis=axis)
            theirs = np.take(attn, range(max(0, by), n - max(0, -by)), axis=axis)
            inside = np.take(bad, range(max(0, -by), n - max(0, by)), axis=axis)
            if inside.any() and all_close(mine, theirs, s.tol):
                return (
                    f"your {s.stage} is attn's moved by one {name}: your {name} i holds attn's "
                    f"{name} i {'+' if by > 0 else '-'} 1 (for every i where both exist): a "
                    "position or an index off by one, a shift or roll on the wrong side?"
                )
    return None


def permuted(s: Seen) -> str | None:
    """An axis whose entries are attn's in another order (the same order everywhere)."""
    axes = s.axes
    for axis in reversed(range(s.yours.ndim)):
        n = s.yours.shape[axis]
        if n < 2 or n > MAX_COLUMNS or axes[axis] == "batch":
            continue
        mine, theirs = np.moveaxis(s.yours, axis, 0), np.moveaxis(s.attn, axis, 0)
        order = []
        for j in range(n):
            fits = [i for i in range(n) if i not in order and all_close(mine[j], theirs[i], s.tol)]
            if not fits:
                break
            order.append(fits[0])
        if len(order) == n and order != list(range(n)):
            name = axes[axis]
            return (
                f"your {s.stage} is attn's with its {name} axis in another order: your {name} "
                f"0, 1, 2, ... hold attn's {name} {', '.join(str(i) for i in order)}: a pairing, "
                "a split or a gather that takes the entries in another order?"
            )
    return None


def row_sums(s: Seen) -> str | None:
    """The weights' rows: what they sum to, next to what attn's sum to."""
    if s.stage != "softmax":
        return None
    mine, theirs = np.nansum(s.yours, axis=-1), np.nansum(s.attn, axis=-1)  # (B?, H, T)
    if all_close(mine, theirs, s.tol):
        return None
    low, high = float(np.nanmin(mine)), float(np.nanmax(mine))
    a_low, a_high = float(theirs.min()), float(theirs.max())
    span = f"{low:.4g}" if np.isclose(low, high) else f"between {low:.4g} and {high:.4g}"
    a_span = f"{a_low:.4g}" if np.isclose(a_low, a_high) else f"{a_low:.4g} to {a_high:.4g}"
    return (
        f"the rows of your softmax sum to {span}, attn's to {a_span}: a softmax over another "
        "extent, a term joined to or left out of the sum, or weights changed after it?"
    )


def holds_earlier(s: Seen) -> str | None:
    """The cells that differ hold an earlier stage's values: the step not done there."""
    trace, stage, bad = s.trace, s.stage, s.bad
    before = STAGE_NAMES[: STAGE_NAMES.index(stage)] if stage in STAGE_NAMES else []
    for name in reversed(before):
        if name not in trace or trace[name].shape != s.attn.shape:
            continue
        earlier = trace[name].data.astype(np.float64)
        if all_close(s.yours[bad], earlier[bad], s.tol):
            what = "every cell" if bad.all() else f"the {int(bad.sum()):,} cells that differ"
            return (
                f"in {what}, your {stage} holds attn's {name}: the step from {name} to "
                f"{stage} is not done there (a mask not applied, a transform skipped?)"
            )
    return None


LOOKS: tuple[Look, ...] = (offset, shift, permuted, row_sums, holds_earlier)


def where(s: Seen) -> str:
    """Where the differing cells sit, and by how much: said whatever they look like."""
    trace, stage, yours, attn, bad = s.trace, s.stage, s.yours, s.attn, s.bad
    axes = s.axes
    n, total = int(bad.sum()), bad.size
    parts = []
    for axis, name in enumerate(axes):
        hit = np.flatnonzero(bad.any(axis=tuple(i for i in range(bad.ndim) if i != axis)))
        if 0 < len(hit) < bad.shape[axis]:
            shown = ", ".join(str(i) for i in hit[:8]) + (", ..." if len(hit) > 8 else "")
            parts.append(f"{name} {shown}")
    place = f" (only {'; '.join(parts)})" if parts else " (spread over every axis)"
    hidden = _hidden_cells(trace, stage, bad)
    finite = bad & np.isfinite(yours) & np.isfinite(attn)
    size = ""
    if finite.any():
        rel = np.abs(yours[finite] - attn[finite]) / np.maximum(np.abs(attn[finite]), 1e-300)
        size = f"; relative differences from {rel.min():.2g} to {rel.max():.2g}"
    return f"{n:,} of {total:,} cells of your {stage} differ{place}{hidden}{size}."


def _hidden_cells(trace: Trace, stage: str, bad: BoolArray) -> str:
    """Whether the differing cells of a stage laid out like the scores are hidden ones."""
    if trace[stage].axes[-2:] != ("query", "key"):
        return ""
    ok = allowed(trace.inputs)  # (B, H, T, S)
    hidden = ~(ok if trace.inputs.has_batch else ok[0])
    if hidden.shape != bad.shape or not hidden.any():
        return ""
    if not (bad & ~hidden).any():
        return "; all of them at keys attn hides"
    if not (bad & hidden).any():
        return "; none of them at keys attn hides"
    return ""


def shape_look(trace: Trace, stage: str, given: FloatArray) -> str:
    """A shape that is no layout of attn's: which sizes differ."""
    ref = trace[stage]
    return (
        f"your {stage} has shape {list(given.shape)} where attn's is {list(ref.shape)} "
        f"[{', '.join(ref.axes)}]: an axis kept, added or cut that attn does not have (a sink "
        "column not dropped, heads not merged or split, a batch axis?)"
    )
