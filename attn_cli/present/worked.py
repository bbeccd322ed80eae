"""The arithmetic shown in a worked cell, taken apart from the trace's own numbers.

Nothing here recomputes a stage. A worked cell *presents* one number of the trace: the products
of Q and K entries whose sum is the score, the exponentials whose ratio is the weight, and the
weight-times-value terms whose sum is the output. Each helper is pure and small, and the tests
check that its parts add up to the trace's value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attn_cli.core.pipeline import Trace
from attn_cli.errors import UsageError


@dataclass(frozen=True)
class CellRef:
    """One (query, key) pair by position."""

    query: int
    key: int


@dataclass(frozen=True)
class SoftmaxParts:
    """A softmax row taken apart: its maximum, the shifted values, their exponentials, the sum."""

    row_max: float
    shifted: tuple[float, ...]
    exps: tuple[float, ...]
    total: float


@dataclass(frozen=True)
class WorkedCell:
    """Everything a worked cell shows for one batch item and head, from the trace."""

    batch: int | None  # None when the fixture has no batch axis
    head: int
    kv_head: int
    query: int
    key: int
    q: tuple[float, ...]  # Q[query], this head
    k: tuple[float, ...]  # K[key], this head's key/value head
    products: tuple[float, ...]  # q[d] * k[d], the terms of the dot product
    score: float  # scores[query, key] from the trace
    scale: float
    scaled: float  # scaled[query, key] from the trace
    bias: float | None  # the fixture's bias at this cell, if it has one
    masked: float | None  # masked[query, key] from the trace; None when there is no mask stage
    row: tuple[float, ...]  # the softmax input row (masked, else scaled)
    parts: SoftmaxParts | None  # None when every key of the row is masked
    weights: tuple[float, ...]  # softmax[query, :] from the trace
    values: tuple[tuple[float, ...], ...]  # V rows of this head, one per key
    output: tuple[float, ...]  # output[query] from the trace


def dot_terms(q: Sequence[float], k: Sequence[float]) -> tuple[float, ...]:
    """The products q[d]·k[d] whose sum is a score."""
    return tuple(float(a) * float(b) for a, b in zip(q, k, strict=True))


def softmax_parts(row: Sequence[float]) -> SoftmaxParts | None:
    """m = max(row), x − m, e^(x − m) and their sum; None for a row that is all −∞."""
    row_max = max(row)
    if row_max == -math.inf:
        return None
    shifted = tuple(x - row_max for x in row)
    exps = tuple(math.exp(x) for x in shifted)  # exp(−∞) = 0.0
    return SoftmaxParts(row_max, shifted, exps, math.fsum(exps))


def weighted_terms(
    weights: Sequence[float], values: Sequence[Sequence[float]], column: int
) -> tuple[float, ...]:
    """weights[j] · V[j, column] for every key j: the terms of one output entry."""
    return tuple(float(w) * float(v[column]) for w, v in zip(weights, values, strict=True))


def row_sums_for_display(matrix: np.ndarray) -> tuple[float, ...]:
    """The sum of each row of a softmax slice, shown beside it to make "rows sum to 1" visible."""
    return tuple(math.fsum(float(x) for x in row) for row in matrix)


def worked_cells(trace: Trace, ref: CellRef) -> list[WorkedCell]:
    """The worked cell for ``ref`` in every batch item and head, read from the trace."""
    inp = trace.inputs
    groups = inp.heads // inp.kv_heads
    cells = []
    for b in range(inp.batch):
        lead = (b,) if inp.has_batch else ()
        for h in range(inp.heads):
            kv = h // groups  # grouped-query: query head h reads key/value head h // groups
            at = (*lead, h, ref.query)  # a query row of a (batch?, head, query, ...) stage
            cell = (*at, ref.key)
            kv_key = (*lead, kv, ref.key)
            kv_all = (*lead, kv)
            q = tuple(float(x) for x in trace["Q"].data[at])
            k = tuple(float(x) for x in trace["K"].data[kv_key])
            source = trace["masked"] if "masked" in trace else trace["scaled"]
            row = tuple(float(x) for x in source.data[at])
            cells.append(
                WorkedCell(
                    batch=b if inp.has_batch else None,
                    head=h,
                    kv_head=kv,
                    query=ref.query,
                    key=ref.key,
                    q=q,
                    k=k,
                    products=dot_terms(q, k),
                    score=float(trace["scores"].data[cell]),
                    scale=trace.scale,
                    scaled=float(trace["scaled"].data[cell]),
                    bias=_bias_at(trace, b, h, ref),
                    masked=(float(trace["masked"].data[cell]) if "masked" in trace else None),
                    row=row,
                    parts=softmax_parts(row),
                    weights=tuple(float(x) for x in trace["softmax"].data[at]),
                    values=tuple(tuple(float(x) for x in r) for r in trace["V"].data[kv_all]),
                    output=tuple(float(x) for x in trace["output"].data[at]),
                )
            )
    return cells


def _bias_at(trace: Trace, b: int, h: int, ref: CellRef) -> float | None:
    inp = trace.inputs
    if inp.bias is None:
        return None
    full = np.broadcast_to(inp.bias, (inp.batch, inp.heads, inp.seq_q, inp.seq_k))
    return float(full[b, h, ref.query, ref.key])


# ---------------------------------------------------------------------------------------------
# Naming a position on the command line: a token or an index


def resolve_position(text: str, labels: Sequence[str], option: str, axis: str) -> int:
    """The position named by ``text``: a token spelled exactly, else a 0-based index."""
    hits = [i for i, t in enumerate(labels) if t == text]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        where = ", ".join(str(i) for i in hits)
        raise UsageError(
            "", option, f"the {axis} token {text!r} is ambiguous (at positions {where})",
            f"an index instead, one of {where}",
        )  # fmt: skip
    stripped = text.strip()
    if stripped.isdigit() and int(stripped) < len(labels):
        return int(stripped)
    shown = ", ".join(repr(t) for t in labels[:8]) + (", …" if len(labels) > 8 else "")
    raise UsageError(
        "", option, f"no {axis} token or index {text!r}",
        f"a {axis} token ({shown}) or an index 0..{len(labels) - 1}",
    )  # fmt: skip


def parse_cell(spec: str, query_labels: Sequence[str], key_labels: Sequence[str]) -> CellRef:
    """``QUERY,KEY`` (tokens or indices) as positions; a comma inside a token is allowed."""
    splits = [i for i, c in enumerate(spec) if c == ","]
    if not splits:
        raise UsageError("", "--cell", f"{spec!r} has no comma", "QUERY,KEY, e.g. --cell The,cat")
    found: list[CellRef] = []
    errors: list[UsageError] = []
    for i in splits:
        try:
            q = resolve_position(spec[:i], query_labels, "--cell", "query")
            k = resolve_position(spec[i + 1 :], key_labels, "--cell", "key")
        except UsageError as e:
            errors.append(e)
            continue
        found.append(CellRef(q, k))
    if len(found) == 1:
        return found[0]
    if found:
        raise UsageError(
            "", "--cell", f"{spec!r} can be split at more than one comma",
            "indices instead of tokens, e.g. --cell 0,1",
        )  # fmt: skip
    # Report the most telling error: an ambiguity beats a miss.
    ambiguous = [e for e in errors if "ambiguous" in e.what]
    raise (ambiguous or errors)[0]


def row_max_positions_for_display(matrix: np.ndarray) -> frozenset[tuple[int, int]]:
    """Where each row of a softmax slice peaks (ties all marked); rows of zeros have none."""
    marks: set[tuple[int, int]] = set()
    for i, row in enumerate(matrix):
        top = max(float(x) for x in row)
        if top > 0:
            marks.update((i, j) for j, x in enumerate(row) if float(x) == top)
    return frozenset(marks)
