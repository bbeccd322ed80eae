"""The arithmetic shown in a worked cell, taken apart from the trace's own numbers.

Nothing here recomputes a stage. A worked cell *presents* one number of the trace: the products
of Q and K entries whose sum is the score, the exponentials whose ratio is the weight, and the
weight-times-value terms whose sum is the output. Each helper is pure and small, and the tests
check that its parts add up to the trace's value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attn_cli.core.pipeline import Trace
from attn_cli.core.stages import softmax_input
from attn_cli.core.steps import allowed_positions
from attn_cli.errors import UsageError
from attn_cli.present.variants import extra_logit, texts


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
    sink_exp: float = 0.0  # e^(sink − m): in the sum, but no key's weight (gpt-oss)


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
    q_name: str = "Q"  # the stage the scores read for Q: Q_rot, Q_norm or Q
    k_name: str = "K"
    positions: tuple[int, int] = (0, 0)  # (query position, key position)
    allowed: bool = True  # whether the query may attend the key (every allowed-keys rule)
    mask_value: float = -math.inf  # what fills a place that is not allowed
    row_name: str = "scaled"  # the stage the softmax reads: masked, capped or scaled
    sink: float | None = None  # an extra logit of this head joined to the row (gpt-oss's sink)
    # each variant's numbers and parts at this cell (present/variants/), read as attributes:
    # cell.capped, or a Q/K transform's rows taken apart (RoPE's cell.q_rot)
    extras: Mapping[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        """A variant's number or part at this cell (its stage's value, its setting, a row taken
        apart), None when it is off."""
        extras: Mapping[str, Any] = self.__dict__.get("extras", {})
        if name in extras:
            return extras[name]
        raise AttributeError(name)


def dot_terms(q: Sequence[float], k: Sequence[float]) -> tuple[float, ...]:
    """The products q[d]·k[d] whose sum is a score."""
    return tuple(float(a) * float(b) for a, b in zip(q, k, strict=True))


def softmax_parts(row: Sequence[float], sink: float | None = None) -> SoftmaxParts | None:
    """m = max(row), x − m, e^(x − m) and their sum; None for a row that is all −∞.

    A ``sink`` logit joins the maximum and the sum, and takes no key's weight.
    """
    row_max = max([*row, sink]) if sink is not None else max(row)
    if row_max == -math.inf or max(row) == -math.inf:
        return None
    shifted = tuple(x - row_max for x in row)
    exps = tuple(math.exp(x) for x in shifted)  # exp(−∞) = 0.0
    sink_exp = 0.0 if sink is None else math.exp(sink - row_max)
    return SoftmaxParts(row_max, shifted, exps, math.fsum([*exps, sink_exp]), sink_exp)


def weighted_terms(
    weights: Sequence[float], values: Sequence[Sequence[float]], column: int
) -> tuple[float, ...]:
    """weights[j] · V[j, column] for every key j: the terms of one output entry."""
    return tuple(float(w) * float(v[column]) for w, v in zip(weights, values, strict=True))


def row_sums_for_display(matrix: np.ndarray) -> tuple[float, ...]:
    """The sum of each row of a softmax slice, shown beside it to make "rows sum to 1" visible."""
    return tuple(math.fsum(float(x) for x in row) for row in matrix)


def worked_cells(trace: Trace, ref: CellRef) -> list[WorkedCell]:
    """The worked cell for ``ref`` in every batch item and head, read from the trace; none
    without a softmax (linear attention: its cell is a row of implicit_weights, not worked)."""
    inp = trace.inputs
    if "softmax" not in trace.applicable:
        return []
    return [worked_cell(trace, ref, b, h) for b in range(inp.batch) for h in range(inp.heads)]


def worked_cell(trace: Trace, ref: CellRef, b: int, h: int) -> WorkedCell:
    """The worked cell of batch item ``b``, head ``h``."""
    inp = trace.inputs
    lead = (b,) if inp.has_batch else ()
    kv = h // (inp.heads // inp.kv_heads)  # grouped-query: head h reads kv head h // groups
    at = (*lead, h, ref.query)  # a query row of a (batch?, head, query, ...) stage
    cell = (*at, ref.key)
    kv_key = (*lead, kv, ref.key)
    kv_all = (*lead, kv)
    q_name, k_name = _read(trace, "Q"), _read(trace, "K")
    q = tuple(float(x) for x in trace[q_name].data[at])
    k = tuple(float(x) for x in trace[k_name].data[kv_key])
    row = tuple(float(x) for x in trace[softmax_input(inp)].data[at])
    sink = extra_logit(inp, h)
    pos_q, pos_k = inp.token_positions()
    positions = (int(pos_q[ref.query]), int(pos_k[ref.key]))
    shown = texts(inp)
    extras = {k: v for t in shown for k, v in t.cell_values(trace, h, cell).items()}
    for t in shown:
        extras |= t.cell_rows(trace, (at, kv_key), positions)
    return WorkedCell(
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
        parts=softmax_parts(row, sink),
        weights=tuple(float(x) for x in trace["softmax"].data[at]),
        values=tuple(tuple(float(x) for x in r) for r in trace["V"].data[kv_all]),
        output=tuple(float(x) for x in trace["output"].data[at]),
        q_name=q_name,
        k_name=k_name,
        positions=positions,
        allowed=_allowed(trace, b, h, ref),
        mask_value=inp.mask_value,
        row_name=softmax_input(inp),
        sink=sink,
        extras=extras,
    )


def _read(trace: Trace, name: str) -> str:
    """What the scores read for Q or K: the last Q/K transform's stage kept (rotated, else
    normalised, or differential attention's first half), else plain."""
    from attn_cli.core.chain import Chain

    return next(s for s in reversed(Chain(trace.inputs).qk_stages(name)) if s in trace)


def _allowed(trace: Trace, b: int, h: int, ref: CellRef) -> bool:
    """Whether the query may attend the key, by every allowed-keys rule of the fixture."""
    allowed = allowed_positions(trace.inputs, (b, h, ref.query, ref.query + 1))  # (1, S)
    return (
        True
        if allowed is None
        else bool(np.broadcast_to(allowed, (1, trace.inputs.seq_k))[0, ref.key])
    )


def _bias_at(trace: Trace, b: int, h: int, ref: CellRef) -> float | None:
    inp = trace.inputs
    if inp.bias is None:
        return None
    full = np.broadcast_to(inp.bias, (inp.batch, inp.heads, inp.seq_q, inp.seq_k))
    return float(full[b, h, ref.query, ref.key])


# ---------------------------------------------------------------------------------------------
# Naming a position on the command line: a token or an index


def resolve_position(text: str, labels: Sequence[str], option: str, axis: str) -> int:
    """The position named by ``text``: a token spelled exactly, else a 0-based index.

    An index is ASCII digits only (``'١'`` and ``'²'`` are digits to Python, not to us) and
    is compared as text, so a 10,000-digit number is refused in time proportional to it.
    """
    hits = [i for i, t in enumerate(labels) if t == text]
    if len(hits) == 1:
        return hits[0]
    index = None if hits else _index(text)
    if index is not None and index < len(labels):
        return index
    if hits:
        where = _first_eight([str(i) for i in hits[:9]])
        what = f"the {axis} token {_shown(text)} is ambiguous (at positions {where})"
        expected = f"an index instead, one of {where}"
    else:
        what = f"no {axis} token or index {_shown(text)}"
        shown = _first_eight([_shown(t) for t in labels[:9]])
        expected = f"a {axis} token ({shown}) or an index 0..{len(labels) - 1}"
    raise UsageError("", option, what, expected)


def _first_eight(items: list[str]) -> str:
    """The first eight of ``items`` (given up to nine), and ", …" when there are more."""
    return ", ".join(items[:8]) + (", …" if len(items) > 8 else "")


_MAX_INDEX_DIGITS = 18  # more than any axis can have; int() stays instant


def _index(text: str) -> int | None:
    """``text`` as a 0-based index: ASCII digits, with blanks around allowed; else None."""
    digits = text.strip()
    if not digits or len(digits) > _MAX_INDEX_DIGITS or not (digits.isascii() and digits.isdigit()):
        return None
    return int(digits)


def _shown(text: str, limit: int = 40) -> str:
    """A token or option value quoted for an error line, cut short when long."""
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def parse_cell(spec: str, query_labels: Sequence[str], key_labels: Sequence[str]) -> CellRef:
    """``QUERY,KEY`` (tokens or indices) as positions; a comma inside a token is allowed.

    Only splits whose halves could name a position are tried (no longer than the longest
    token or index), so thousands of commas cost time linear in the text, not quadratic.
    """
    longest_q = max([_MAX_INDEX_DIGITS + 2, *(len(t) for t in query_labels)])
    longest_k = max([_MAX_INDEX_DIGITS + 2, *(len(t) for t in key_labels)])
    if len(spec) > longest_q + longest_k + 1:
        raise UsageError(
            "",
            "--cell",
            f"{_shown(spec)} is {len(spec):,} characters long",
            "QUERY,KEY: a query and a key token (or index), e.g. --cell The,cat",
        )
    if "," not in spec:
        raise UsageError(
            "", "--cell", f"{_shown(spec)} has no comma", "QUERY,KEY, e.g. --cell The,cat"
        )
    splits = [
        i
        for i, c in enumerate(spec)
        if c == "," and i <= longest_q and len(spec) - i - 1 <= longest_k
    ]
    if not splits:
        raise UsageError(
            "",
            "--cell",
            f"no query and key in {_shown(spec)}",
            "QUERY,KEY: a query and a key token (or index), e.g. --cell The,cat",
        )
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
            "",
            "--cell",
            f"{_shown(spec)} can be split at more than one comma",
            "indices instead of tokens, e.g. --cell 0,1",
        )
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
