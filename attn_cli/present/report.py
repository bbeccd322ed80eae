"""What ``attn check`` reports: one line per fixture, Rich tables of the details, and JSON.

Formatting only: every number comes from the :class:`Comparison` the check layer made. Rich
is imported inside the functions that build tables, so the JSON report never loads it.
"""

from __future__ import annotations

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
from attn_cli.io.trace_json import json_text

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


def fmt_pair(expected: float, actual: float, digits: int = 6) -> tuple[str, str]:
    """Two values in ``digits`` significant digits, or as many more as tell them apart."""
    for d in range(digits, 18):  # 17 significant digits tell any two float64 apart
        shown = _significant(expected, d), _significant(actual, d)
        if shown[0] != shown[1]:
            return shown
    return _significant(expected, digits), _significant(actual, digits)


def _significant(x: float, digits: int) -> str:
    """``x`` in ``digits`` significant digits (``-0.96``, ``1.5e-07``); never ``-0``."""
    if not math.isfinite(x):
        return fmt_value(x)
    return f"{x + 0.0:.{digits}g}"


def plural(n: int, noun: str) -> str:
    """``1 stage``, ``2 stages``: a count with its noun in agreement."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def fmt_error(x: float) -> str:
    """An error in 3 significant digits."""
    if x == 0:
        return "0"
    return "inf" if math.isinf(x) else f"{x:.3e}"


def position(trace: Trace, axes: Sequence[str], index: Sequence[int]) -> list[str]:
    """Each index labelled: the token for query and key axes, the number otherwise."""
    out = []
    tokens = {
        "query": trace.inputs.tokens,
        "seq": trace.inputs.tokens,
        "key": trace.inputs.key_tokens,
    }
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
        return (
            f"same: {outcome.fixture} matches {comparison.against} ({plural(n, 'stage')}, "
            f"{comparison.tolerance})"
        )
    k = len(comparison.differing)
    differ = "differs" if k == 1 else "differ"
    if comparison.kind == "dump":
        return (
            f"DIFFERENT: {outcome.fixture}: {k} of {plural(n, 'stage')} in {comparison.against} "
            f"{differ} from attn's; first: {first.name}"
        )
    return (
        f"DIFFERENT: {outcome.fixture}: {k} of {plural(n, 'stage')} {differ} from "
        f"{comparison.against}; first: {first.name}"
    )


def render_outcomes(
    outcomes: Sequence[Outcome], *, worst: int = 5, lang: str = "en"
) -> RenderableType | None:
    """The details of each fixture that differs (and of every grading); None if there are none.
    ``lang`` "zh" says each diagnosis in Chinese too.

    The one-line summaries (``summary_lines``) are separate: they must never wrap.
    """
    from rich.console import Group

    parts = [
        render_comparison(o.fixture, o.comparison, worst=worst, lang=lang)
        for o in outcomes
        if o.comparison is not None and (not o.comparison.same or o.comparison.kind == "dump")
    ]
    return Group(*parts) if parts else None


def summary_lines(outcomes: Sequence[Outcome]) -> list[str]:
    """One line per fixture, then (for several) the total."""
    lines = [printable(summary_line(o)) for o in outcomes]
    if len(outcomes) > 1:
        counts = {
            s: sum(o.status == s for o in outcomes)
            for s in ("same", "different", "written", "error")
        }
        shown = ", ".join(f"{n} {s}" for s, n in counts.items() if n or s in ("same", "different"))
        lines.append(f"{plural(len(outcomes), 'fixture')}: {shown}")
    return lines


def render_comparison(
    fixture: str, c: Comparison, *, worst: int = 5, lang: str = "en"
) -> RenderableType:
    """One fixture: the rule, every stage's counts and errors, the worst cells of the first."""
    from rich.console import Group
    from rich.text import Text

    ref, mine = SIDES[c.kind]
    parts: list[RenderableType] = [
        Text(printable(f"{fixture} against {c.against}"), style="bold"),
        Text(f"a cell passes when |{mine} − {ref}| ≤ atol + rtol·|{ref}|  ({c.tolerance})"),
    ]
    parts.extend(Text(printable(note)) for note in c.notes)
    parts += [Text(""), _stage_table(c), Text("")]
    parts += _first_difference(c, worst)
    parts += _diagnosis_lines(c, lang)
    return Group(*parts)


def _stage_table(c: Comparison) -> RenderableType:
    """Every stage: its result, the cells differing, the largest errors."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1))
    for header, justify in (
        ("stage", "left"),
        ("result", "left"),
        ("cells differing", "left"),
        ("max abs error", "right"),
        ("max rel error", "right"),
    ):
        table.add_column(header, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for s in c.stages:
        word, count = stage_status_text(c, s)
        style = "green" if s.status == "same" else "bold red"
        numeric = s.status in ("same", "different")
        table.add_row(
            s.name,
            Text(word, style=style),
            count,
            fmt_error(s.max_abs) if numeric else "",
            fmt_error(s.max_rel) if numeric else "",
        )
    return table


def _first_difference(c: Comparison, worst: int) -> list[RenderableType]:
    """The first stage that differs, with its ``worst`` cells when there are any."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    first = c.first_difference
    if first is None:
        return []
    if not first.worst:
        return [
            Text(f"{first.name} differs first ({stage_status_text(c, first)[0]})", style="bold"),
            Text(""),
        ]
    ref, mine = SIDES[c.kind]
    cells = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1))
    for axis in first.axes:
        cells.add_column(axis.replace("_", " ") if axis == "kv_head" else axis, no_wrap=True)
    for header in (ref, mine, "abs error", "rel error"):
        cells.add_column(header, justify="right", no_wrap=True)
    for cell in first.worst[:worst]:
        cells.add_row(
            *(printable(p) for p in position(c.trace, first.axes, cell.index)),
            *fmt_pair(cell.expected, cell.actual),
            fmt_error(cell.abs_error),
            fmt_error(cell.rel_error),
        )
    title = Text(f"{first.name} differs first; its worst cells:", style="bold")
    return [title, cells, Text("")]


def _diagnosis_lines(c: Comparison, lang: str = "en") -> list[RenderableType]:
    """The diagnoses (or that none reproduces a dump's difference), then the hints; in Chinese
    (``lang`` "zh") each diagnosis is said in Chinese first, then its English detail with the
    fixture's numbers."""
    from rich.text import Text

    parts: list[RenderableType] = []
    for d in c.diagnoses:
        if lang == "zh" and d.title_zh:
            parts.append(
                Text.assemble(
                    ("诊断：", "bold"),
                    (printable(d.title_zh), "bold yellow"),
                    f" [{printable(d.title)}]",
                )
            )
            parts.append(Text(printable(d.explanation_zh)))
        else:
            parts.append(
                Text.assemble(("diagnosis: ", "bold"), (printable(d.title), "bold yellow"))
            )
        parts.append(Text(printable(d.detail)))
        if d.explains:
            parts.append(Text(f"It also accounts for your {', '.join(d.explains)}."))
        if d.unexplained:
            parts.append(
                Text(
                    f"It does not account for your {', '.join(d.unexplained)}: "
                    "look there for a second difference."
                )
            )
        parts.append(Text(""))
    first = c.first_difference
    if c.kind == "dump" and first is not None and first.status == "different" and not c.diagnoses:
        parts.append(
            Text(
                f"diagnosis: none. Your {first.name} differs from attn's, and none of the known "
                f"mistakes reproduces it (tried: {', '.join(c.tried) or 'none apply here'})."
            )
        )
        parts.append(Text(""))
    for line in hint_lines(c):
        parts.append(Text.assemble(("hint: ", "bold"), printable(line)))
        parts.append(Text(""))
    return parts


def hint_lines(c: Comparison) -> list[str]:
    """What the grader noticed besides the named mistakes: one factor everywhere, the axes of
    the first differing stage in another order, or what else that stage looks like."""
    lines = []
    r = c.ratio
    if r is not None:
        reading = f" = {r.reading}" if r.reading else ""
        lines.append(
            f"every cell of your {r.stage} is attn's × {r.ratio:.4g}{reading}: {r.suggestion}"
        )
    t = c.transpose
    if t is not None:
        then = (
            "and then every cell matches: only the order of the axes differs"
            if t.matches
            else f"but then {t.differing:,} of {plural(t.cells, 'cell')} still differ"
        )
        lines.append(
            f"your {t.stage} is [{', '.join(t.your_axes)}] where attn's is "
            f"[{', '.join(t.axes)}]: {t.call} makes it fit, {then}."
        )
    lines += c.looks
    return lines


def report_json(outcomes: Sequence[Outcome]) -> str:
    """The machine-readable report: per fixture and stage, status, counts and worst cells."""
    doc = {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "exit_code": exit_code(outcomes),
        "fixtures": [_outcome_json(o) for o in outcomes],
        "total": {
            s: sum(o.status == s for o in outcomes)
            for s in ("same", "different", "written", "error")
        },
    }
    return _pretty(doc) + "\n"


def _pretty(value: Any, indent: int = 0) -> str:
    """Indented JSON with lists of plain values (shapes, indices, names) kept on one line."""
    pad = " " * (indent + 2)
    if isinstance(value, dict) and value:
        items = [f"{pad}{json_text(k)}: {_pretty(v, indent + 2)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        items = [pad + _pretty(v, indent + 2) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    return json_text(value)


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
        out["diagnoses"] = [_json_of(d, *DIAGNOSIS_KEYS) for d in c.diagnoses]
        out["ratio"] = None if c.ratio is None else _json_of(c.ratio, *RATIO_KEYS)
        out["transpose"] = None if c.transpose is None else _json_of(c.transpose, *TRANSPOSE_KEYS)
        out["hints"] = list(c.looks)
    return out


# The JSON keys of a diagnosis, a ratio and a transpose found by the grader: their attributes
DIAGNOSIS_KEYS = (
    "name",
    "title",
    "detail",
    "stage",
    "explains",
    "unexplained",
    "title_zh",
    "explanation_zh",
)
RATIO_KEYS = ("stage", "ratio", "cells", "reading", "suggestion")
TRANSPOSE_KEYS = (
    "stage",
    "permutation",
    "call",
    "your_axes",
    "axes",
    "cells",
    "differing",
    "matches",
)


def _json_of(record: Any, *keys: str) -> dict[str, Any]:
    """A record's attributes ``keys`` as JSON: a tuple as a list, a float finite or named."""
    out: dict[str, Any] = {}
    for key in keys:
        value = getattr(record, key)
        if isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, float):
            value = _json_number(value)
        out[key] = value
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


# ---------------------------------------------------------------------------------------------
# Reports for CI systems: JUnit XML and GitHub Actions annotations


def report_junit(outcomes: Sequence[Outcome], *, worst: int = 5) -> str:
    """JUnit XML: one testsuite for the run, one testcase per fixture and stage.

    A stage that differs is a ``<failure>`` naming the first stage that differs, with its worst
    cells (and, when grading, the diagnosis) in the body; a fixture that could not be checked
    is one testcase with an ``<error>``; ``--update`` gives one passing testcase per fixture.
    """
    import xml.etree.ElementTree as ET

    suite = ET.Element("testsuite", name="attn check")
    for o in outcomes:
        for case in _junit_cases(o, worst):
            suite.append(case)
    cases = suite.findall("testcase")
    counts = {
        "tests": str(len(cases)),
        "failures": str(sum(c.find("failure") is not None for c in cases)),
        "errors": str(sum(c.find("error") is not None for c in cases)),
        "skipped": "0",
    }
    suite.attrib.update(counts)
    root = ET.Element("testsuites", {"name": "attn check", **counts})
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "unicode") + "\n"


def _junit_cases(o: Outcome, worst: int) -> list[Any]:
    import xml.etree.ElementTree as ET

    # printable is what XML 1.0 can hold (``\\x1b``, ``\\ufffe`` escaped) on one line;
    # ElementTree then escapes ``& < > "``
    fixture = printable(o.fixture)
    attrs = (
        {"classname": fixture, "file": fixture} if _is_file(o.fixture) else {"classname": fixture}
    )

    def testcase(name: str) -> ET.Element:
        return ET.Element("testcase", {**attrs, "name": printable(name)})

    if o.error is not None:
        case = testcase("check")
        error = ET.SubElement(case, "error", message=printable(o.error), type="error")
        error.text = printable(o.error)
        return [case]
    if o.written is not None:
        case = testcase("update")
        ET.SubElement(case, "system-out").text = printable(o.written)
        return [case]
    c = o.comparison
    assert c is not None
    first = c.first_difference
    cases = []
    for s in c.stages:
        case = testcase(s.name)
        if s.status != "same":
            assert first is not None
            failure = ET.SubElement(
                case, "failure", message=failure_message(c, s, first), type=s.status
            )
            failure.text = "\n".join(failure_details(c, s, worst))  # each line printable
        cases.append(case)
    return cases


def failure_message(c: Comparison, s: StageResult, first: StageResult) -> str:
    """``Q differs first: 2 of 16 cells, max abs error 1.000e-03 (against golden/cat.json)``."""
    word, count = stage_status_text(c, s)
    what = f"{s.name} {'differs' if word == 'different' else word}"
    what += " first" if s is first else f" (the first stage that differs is {first.name})"
    if s.status == "different":
        what += f": {count} cells, max abs error {fmt_error(s.max_abs)}"
    elif count:
        what += f": {count}"
    return printable(f"{what} (against {c.against}; {c.tolerance})")


def failure_details(c: Comparison, s: StageResult, worst: int) -> list[str]:
    """The worst cells of a stage, one per line, then what the grader diagnosed.

    Each line is printable: a token's newline is ``\\n``, so joined with newlines the lines stay
    one per line and none a token starts (a ``::warning::`` GitHub would read as a command).
    """
    ref, mine = SIDES[c.kind]
    lines = [f"first stage that differs: {c.first_difference.name if c.first_difference else ''}"]
    if s.worst:
        lines.append(f"worst cells ({', '.join(s.axes)}):")
    for cell in s.worst[:worst]:
        labels = position(c.trace, s.axes, cell.index)
        where = ", ".join(f"{a} {p}" for a, p in zip(s.axes, labels, strict=True))
        exp, act = fmt_pair(cell.expected, cell.actual)
        lines.append(
            f"  [{where}]: {ref} {exp}, {mine} {act}, abs error {fmt_error(cell.abs_error)}"
        )
    lines += diagnosis_lines(c)
    return [printable(line) for line in lines]


def diagnosis_lines(c: Comparison) -> list[str]:
    """What the grader found (or that it found nothing), as plain lines."""
    lines = []
    for d in c.diagnoses:
        lines.append(f"diagnosis: {d.title}: {d.detail}")
        if d.explains:
            lines.append(f"It also accounts for your {', '.join(d.explains)}.")
        if d.unexplained:
            lines.append(
                f"It does not account for your {', '.join(d.unexplained)}: look there "
                "for a second difference."
            )
    first = c.first_difference
    if c.kind == "dump" and first is not None and first.status == "different" and not c.diagnoses:
        lines.append(
            f"diagnosis: none. Your {first.name} differs from attn's, and none of the known "
            f"mistakes reproduces it (tried: {', '.join(c.tried) or 'none apply here'})."
        )
    lines += [f"hint: {line}" for line in hint_lines(c)]
    return [printable(line) for line in lines]


def report_github(outcomes: Sequence[Outcome], *, worst: int = 5) -> str:
    """GitHub Actions workflow commands: an ``::error`` per fixture that differs or failed,
    then the summary lines, for the log."""
    lines = []
    for o in outcomes:
        props = {"file": o.fixture} if _is_file(o.fixture) else {}
        if o.error is not None:
            props["title"] = f"attn check: {o.fixture}: error"
            lines.append(_workflow_command("error", props, printable(o.error)))
            continue
        c = o.comparison
        if c is None or c.same:
            continue
        first = c.first_difference
        assert first is not None
        props["title"] = f"attn check: {o.fixture}: {first.name} differs first"
        message = [printable(summary_line(o)), failure_message(c, first, first)]
        message += failure_details(c, first, worst)[1:]
        lines.append(_workflow_command("error", props, "\n".join(message)))
    return "".join(line + "\n" for line in [*lines, *summary_lines(outcomes)])


def _workflow_command(kind: str, props: dict[str, str], message: str) -> str:
    """``::error file=F,title=T::message``, escaped as GitHub's toolkit escapes them; the
    message's lines are printable already (a user's newline is ``\\n``)."""
    shown = ",".join(f"{k}={_escape_property(printable(v))}" for k, v in props.items())
    body = "\n".join(printable(line) for line in message.split("\n"))
    return f"::{kind} {shown}::{_escape_data(body)}" if shown else f"::{kind}::{_escape_data(body)}"


def _escape_data(text: str) -> str:
    """As @actions/core escapeData: % first, then CR and LF."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """As @actions/core escapeProperty: escapeData, then ``:`` and ``,``."""
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _is_file(fixture: str) -> bool:
    """Whether a report may name the fixture as a file (not ``<stdin>``, not a bundled name)."""
    import os

    try:
        return os.path.isfile(fixture)
    except (OSError, ValueError):
        return False
