"""What ``attn check`` reports: one line per fixture, Rich tables of the details, and JSON.

Formatting only: every number comes from the :class:`Comparison` the check layer made. Rich
is imported inside the functions that build tables, so the JSON report never loads it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from attn_cli.check.compare import (
    REPORT_FORMAT,
    REPORT_VERSION,
    SIDES,
    Comparison,
    Outcome,
    StageResult,
    exit_code,
)
from attn_cli.errors import printable

if TYPE_CHECKING:
    from rich.console import RenderableType

    from attn_cli.core.pipeline import Trace


def fmt_value(x: float) -> str:
    """A value at full precision (shortest repr); never ``-0.0``."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x + 0.0)  # + 0.0 turns -0.0 into 0.0


def fmt_error(x: float) -> str:
    """An error in 3 significant digits."""
    if x == 0:
        return "0"
    return "inf" if math.isinf(x) else f"{x:.3e}"


def position(trace: Trace, axes: Sequence[str], index: Sequence[int]) -> list[str]:
    """Each index labelled: the token for query and key axes, the number otherwise."""
    out = []
    tokens = {"query": trace.inputs.tokens, "seq": trace.inputs.tokens,
              "key": trace.inputs.key_tokens}  # fmt: skip
    for axis, i in zip(axes, index, strict=True):
        labels = tokens.get(axis)
        out.append(f"{i} {labels[i]}" if labels and i < len(labels) else str(i))
    return out


def stage_status_text(comparison: Comparison, result: StageResult) -> tuple[str, str]:
    """(status word, what differs) for one stage, naming the sides."""
    ref, mine = SIDES[comparison.kind]
    if result.status == "same":
        return "same", f"0 of {result.cells}"
    if result.status == "different":
        return "different", f"{result.differing} of {result.cells}"
    if result.status == "shape":
        exp, act = result.expected_shape, result.actual_shape
        return "shape differs", f"{ref} {list(exp or ())}, {mine} {list(act or ())}"
    if result.status == "missing_expected":
        return f"not in {ref}", ""
    return f"not in {mine}", ""


def summary_line(outcome: Outcome) -> str:
    """One line for one fixture."""
    if outcome.error is not None:
        return f"error: {outcome.fixture}: {outcome.error}"
    if outcome.written is not None:
        return f"{outcome.written}"
    comparison = outcome.comparison
    assert comparison is not None
    n = len(comparison.stages)
    first = comparison.first_difference
    if first is None:
        return f"same: {outcome.fixture} matches {comparison.against} ({n} stages, " \
               f"{comparison.tolerance})"  # fmt: skip
    k = len(comparison.differing)
    if comparison.kind == "dump":
        return (
            f"DIFFERENT: {outcome.fixture}: {k} of {n} stages in {comparison.against} differ "
            f"from attn's; first: {first.name}"
        )
    return (
        f"DIFFERENT: {outcome.fixture}: {k} of {n} stages differ from {comparison.against}; "
        f"first: {first.name}"
    )


def render_outcomes(outcomes: Sequence[Outcome], *, worst: int = 5) -> RenderableType | None:
    """The details of each fixture that differs (and of every grading); None if there are none.

    The one-line summaries (``summary_lines``) are separate: they must never wrap.
    """
    from rich.console import Group

    parts = [
        render_comparison(o.fixture, o.comparison, worst=worst)
        for o in outcomes
        if o.comparison is not None and (not o.comparison.same or o.comparison.kind == "dump")
    ]
    return Group(*parts) if parts else None


def summary_lines(outcomes: Sequence[Outcome]) -> list[str]:
    """One line per fixture, then (for several) the total."""
    lines = [_safe(summary_line(o)) for o in outcomes]
    if len(outcomes) > 1:
        counts = {s: sum(o.status == s for o in outcomes) for s in
                  ("same", "different", "written", "error")}  # fmt: skip
        shown = ", ".join(f"{n} {s}" for s, n in counts.items() if n or s in ("same", "different"))
        lines.append(f"{len(outcomes)} fixtures: {shown}")
    return lines


def render_comparison(fixture: str, c: Comparison, *, worst: int = 5) -> RenderableType:
    """One fixture: the rule, every stage's counts and errors, the worst cells of the first."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    ref, mine = SIDES[c.kind]
    parts: list[RenderableType] = [
        Text(_safe(f"{fixture} against {c.against}"), style="bold"),
        Text(f"a cell passes when |{mine} − {ref}| ≤ atol + rtol·|{ref}|  ({c.tolerance})"),
    ]
    parts.extend(Text(_safe(note)) for note in c.notes)
    parts.append(Text(""))
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1))
    for header, justify in (("stage", "left"), ("result", "left"), ("cells differing", "left"),
                            ("max abs error", "right"), ("max rel error", "right")):  # fmt: skip
        table.add_column(header, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for s in c.stages:
        word, count = stage_status_text(c, s)
        style = "green" if s.status == "same" else "bold red"
        numeric = s.status in ("same", "different")
        table.add_row(
            s.name, Text(word, style=style), count,
            fmt_error(s.max_abs) if numeric else "", fmt_error(s.max_rel) if numeric else "",
        )  # fmt: skip
    parts += [table, Text("")]
    first = c.first_difference
    if first is not None and first.worst:
        parts.append(Text(f"{first.name} differs first; its worst cells:", style="bold"))
        cells = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1))
        for axis in first.axes:
            cells.add_column(axis.replace("_", " ") if axis == "kv_head" else axis, no_wrap=True)
        for header in (ref, mine, "abs error", "rel error"):
            cells.add_column(header, justify="right", no_wrap=True)
        for cell in first.worst[:worst]:
            cells.add_row(
                *(_safe(p) for p in position(c.trace, first.axes, cell.index)),
                fmt_value(cell.expected), fmt_value(cell.actual),
                fmt_error(cell.abs_error), fmt_error(cell.rel_error),
            )  # fmt: skip
        parts += [cells, Text("")]
    elif first is not None:
        parts.append(Text(f"{first.name} differs first ({stage_status_text(c, first)[0]})",
                          style="bold"))  # fmt: skip
    for d in c.diagnoses:
        parts.append(Text.assemble(("diagnosis: ", "bold"), (d.title, "bold yellow")))
        parts.append(Text(_safe(d.detail)))
        if d.explains:
            parts.append(Text(f"It also accounts for your {', '.join(d.explains)}."))
        if d.unexplained:
            parts.append(Text(f"It does not account for your {', '.join(d.unexplained)}: "
                              "look there for a second difference."))  # fmt: skip
        parts.append(Text(""))
    if c.kind == "dump" and first is not None and first.status == "different" and not c.diagnoses:
        parts.append(
            Text(
                f"diagnosis: none. Your {first.name} differs from attn's, and none of the known "
                f"mistakes reproduces it (tried: {', '.join(c.tried) or 'none apply here'})."
            )
        )
        parts.append(Text(""))
    return Group(*parts)


def report_json(outcomes: Sequence[Outcome]) -> str:
    """The machine-readable report: per fixture and stage, status, counts and worst cells."""
    doc = {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "exit_code": exit_code(outcomes),
        "fixtures": [_outcome_json(o) for o in outcomes],
        "total": {s: sum(o.status == s for o in outcomes)
                  for s in ("same", "different", "written", "error")},
    }  # fmt: skip
    return _pretty(doc) + "\n"


def _pretty(value: Any, indent: int = 0) -> str:
    """Indented JSON with lists of plain values (shapes, indices, names) kept on one line."""
    pad = " " * (indent + 2)
    if isinstance(value, dict) and value:
        items = [f"{pad}{json.dumps(k)}: {_pretty(v, indent + 2)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        items = [pad + _pretty(v, indent + 2) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    return json.dumps(value, ensure_ascii=False)


def _outcome_json(o: Outcome) -> dict[str, Any]:
    out: dict[str, Any] = {"fixture": o.fixture, "status": o.status}
    if o.error is not None:
        out["error"] = o.error
    if o.written is not None:
        out["message"] = o.written
    c = o.comparison
    if c is None:
        return out
    first = c.first_difference
    ref, mine = SIDES[c.kind]
    out.update(
        against=c.against,
        kind=c.kind,
        sides={"expected": ref, "actual": mine},
        rtol=c.tolerance.rtol,
        atol=c.tolerance.atol,
        first_difference=None if first is None else first.name,
        stages=[_stage_json(c, s) for s in c.stages],
    )
    if c.kind == "dump":
        out["aliases"] = dict(c.aliases)
        out["ignored"] = list(c.ignored)
        out["diagnoses"] = [
            {"name": d.name, "title": d.title, "detail": d.detail, "stage": d.stage,
             "explains": list(d.explains), "unexplained": list(d.unexplained)}
            for d in c.diagnoses
        ]  # fmt: skip
    return out


def _stage_json(c: Comparison, s: StageResult) -> dict[str, Any]:
    out: dict[str, Any] = {"name": s.name, "status": s.status}
    out["expected_shape"] = None if s.expected_shape is None else list(s.expected_shape)
    out["actual_shape"] = None if s.actual_shape is None else list(s.actual_shape)
    if s.status in ("same", "different"):
        out.update(
            cells=s.cells,
            differing=s.differing,
            max_abs_error=_json_number(s.max_abs),
            max_rel_error=_json_number(s.max_rel),
            worst=[
                {
                    "index": list(cell.index),
                    "position": dict(
                        zip(s.axes, position(c.trace, s.axes, cell.index), strict=True)
                    ),
                    "expected": _json_number(cell.expected),
                    "actual": _json_number(cell.actual),
                    "abs_error": _json_number(cell.abs_error),
                    "rel_error": _json_number(cell.rel_error),
                }
                for cell in s.worst
            ],
        )
    return out


def _json_number(x: float) -> float | str:
    return x + 0.0 if math.isfinite(x) else fmt_value(x)


def _safe(text: str) -> str:
    return printable(text)
