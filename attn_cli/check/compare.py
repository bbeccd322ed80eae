"""Checking a trace against stored numbers, cell by cell: |actual − expected| ≤ atol + rtol·|e|.

The stored numbers are a golden JSON trace, a fixture's ``expected`` section, or a user's own
dump (grade.py; there the trace is the reference). Non-finite values compare equal only to the
same non-finite value. A check yields an :class:`Outcome` per fixture; the report functions at
the end format outcomes and never recompute.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from attn_cli.core.inputs import BoolArray, FloatArray
from attn_cli.core.pipeline import Trace
from attn_cli.core.stages import SPECS, STAGE_NAMES
from attn_cli.errors import AttnError, InputError, UsageError

if TYPE_CHECKING:
    pass

Kind = Literal["golden", "expected", "dump"]
Status = Literal["same", "different", "shape", "missing_expected", "missing_actual"]

REPORT_FORMAT = "attn-check"
REPORT_VERSION = 1
SIZE_ONE_AXES = ("batch", "head", "kv_head")  # may be left out of expected values when of size 1
PER_HEAD = ("Q", "K", "V")  # may also be given flat, [batch?, seq, heads*d], heads in blocks


@dataclass(frozen=True)
class Tolerance:
    """A cell passes when |actual − expected| ≤ atol + rtol·|expected| (numpy.isclose's rule)."""

    rtol: float
    atol: float

    def __str__(self) -> str:
        return f"rtol {self.rtol:g}, atol {self.atol:g}"


# Golden files and expected sections hold float64 written at full precision: only rounding noise
# (different BLAS kernels or thread counts, ~1e-15 relative) may pass.
GOLDEN_TOLERANCE = Tolerance(rtol=1e-9, atol=1e-12)
# A user's own code may run in float32 (~1e-7 relative): loose for rounding, far tighter than
# any of the mistakes the grader looks for (those move numbers by whole percents).
GRADER_TOLERANCE = Tolerance(rtol=1e-4, atol=1e-5)

# What each side is called in reports: (the reference, the side being checked)
SIDES: dict[Kind, tuple[str, str]] = {
    "golden": ("golden", "trace"),
    "expected": ("expected", "trace"),
    "dump": ("attn", "yours"),
}


@dataclass(frozen=True)
class Cell:
    """One differing cell: its index in the stage's public layout and both values."""

    index: tuple[int, ...]
    expected: float
    actual: float
    abs_error: float
    rel_error: float


@dataclass(frozen=True)
class StageResult:
    """How one stage compared."""

    name: str
    status: Status
    axes: tuple[str, ...] = ()
    expected_shape: tuple[int, ...] | None = None
    actual_shape: tuple[int, ...] | None = None
    cells: int = 0
    differing: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    worst: tuple[Cell, ...] = ()


@dataclass(frozen=True)
class Diagnosis:
    """A classic mistake that, recomputed from the trace's own stages, reproduces the dump."""

    name: str  # stable id, e.g. "no_scaling"
    title: str  # e.g. "no 1/√d_k scaling"
    detail: str  # what was recomputed and matched, and the fix
    stage: str  # the stage where it was confirmed (the first that differs)
    explains: tuple[str, ...] = ()  # later differing stages it reproduces too
    unexplained: tuple[str, ...] = ()  # later differing stages it does not
    title_zh: str = ""  # the title in Chinese
    explanation_zh: str = ""  # what the mistake is and the fix, in Chinese


@dataclass(frozen=True)
class SameRatio:
    """No mistake fits, but every cell of the first differing stage is attn's times one number
    (within the tolerance): a scale applied once too often, or too few times, is likely."""

    stage: str
    ratio: float  # yours / attn's, the same in every cell
    cells: int  # the cells that differ (all of them follow the ratio)
    reading: str  # the ratio as a named number, e.g. "1/√2"; "" when it is none
    suggestion: str  # e.g. "a scale of 1/√d_k applied twice, or where it was not meant?"


@dataclass(frozen=True)
class TransposeFit:
    """The dump's shape is a permutation of attn's: ``yours.transpose(permutation)`` has attn's
    layout, and then ``differing`` of ``cells`` cells still differ (0: the numbers match)."""

    stage: str
    permutation: tuple[int, ...]
    your_axes: tuple[str, ...]  # attn's axis names, in the order of your array's axes
    axes: tuple[str, ...]  # attn's axis names, in attn's order
    cells: int
    differing: int

    @property
    def matches(self) -> bool:
        return self.differing == 0

    @property
    def call(self) -> str:
        """The transpose as code: ``transpose(1, 0, 2)``."""
        return f"transpose({', '.join(str(i) for i in self.permutation)})"


@dataclass(frozen=True, eq=False)
class Comparison:
    """Every compared stage of one fixture, in pipeline order, and what it was compared with."""

    trace: Trace
    kind: Kind
    against: str
    tolerance: Tolerance
    stages: tuple[StageResult, ...]
    notes: tuple[str, ...] = ()  # e.g. aliases used, names ignored
    aliases: Mapping[str, str] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()
    diagnoses: tuple[Diagnosis, ...] = ()
    tried: tuple[str, ...] = ()  # titles of the diagnoses tried, when none applied
    ratio: SameRatio | None = None  # grading: no diagnosis, but one factor everywhere
    transpose: TransposeFit | None = None  # grading: the first stage's axes in another order
    looks: tuple[str, ...] = ()  # grading: what the first stage looks like, when nothing fits

    @property
    def same(self) -> bool:
        return all(s.status == "same" for s in self.stages)

    @property
    def first_difference(self) -> StageResult | None:
        return next((s for s in self.stages if s.status != "same"), None)

    @property
    def differing(self) -> tuple[StageResult, ...]:
        return tuple(s for s in self.stages if s.status != "same")


@dataclass(frozen=True, eq=False)
class Outcome:
    """What ``attn check`` did for one fixture: compared, wrote a golden, or hit an error."""

    fixture: str
    comparison: Comparison | None = None
    written: str | None = None  # the message of --update
    error: str | None = None

    @property
    def status(self) -> Literal["same", "different", "written", "error"]:
        if self.error is not None:
            return "error"
        if self.written is not None:
            return "written"
        assert self.comparison is not None
        return "same" if self.comparison.same else "different"


def exit_code(outcomes: Sequence[Outcome]) -> int:
    """As diff: 0 all same (or written), 1 something differs, 2 trouble."""
    statuses = {o.status for o in outcomes}
    if "error" in statuses:
        return 2
    return 1 if "different" in statuses else 0


# ---------------------------------------------------------------------------------------------
# Comparing


def cell_errors(
    actual: FloatArray, expected: FloatArray, tol: Tolerance
) -> tuple[BoolArray, FloatArray, FloatArray]:
    """Per cell: fails the rule?, absolute error, relative error (inf where expected is 0)."""
    finite = np.isfinite(actual) & np.isfinite(expected)
    with np.errstate(over="ignore", invalid="ignore"):
        diff = np.abs(np.where(finite, actual, 0.0) - np.where(finite, expected, 0.0))
        same_special = (actual == expected) | (np.isnan(actual) & np.isnan(expected))
        bad = ~np.isclose(actual, expected, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
        abs_err = np.where(finite, diff, np.where(same_special, 0.0, np.inf))
        scale = np.abs(np.where(finite, expected, 1.0))
        rel_err = np.where(
            scale > 0, abs_err / np.where(scale > 0, scale, 1.0), np.where(abs_err > 0, np.inf, 0.0)
        )
    return bad, abs_err, rel_err


def all_close(actual: FloatArray, expected: FloatArray, tol: Tolerance) -> bool:
    """Every cell within the tolerance, as :func:`cell_errors` rules (nan equals only nan)."""
    bad, _, _ = cell_errors(actual, expected, tol)
    return not bool(bad.any())


def compare_stage(
    name: str,
    axes: tuple[str, ...],
    expected: FloatArray,
    actual: FloatArray,
    tol: Tolerance,
    worst: int = 5,
) -> StageResult:
    """Compare two arrays of the same shape; keep the ``worst`` differing cells."""
    assert expected.shape == actual.shape
    bad, abs_err, rel_err = cell_errors(actual, expected, tol)
    order = np.argsort(-abs_err[bad], kind="stable")[:worst]  # bad cells, largest error first
    where = np.argwhere(bad)
    cells = tuple(
        Cell(
            index=(ix := tuple(int(i) for i in where[k])),
            expected=float(expected[ix]),
            actual=float(actual[ix]),
            abs_error=float(abs_err[ix]),
            rel_error=float(rel_err[ix]),
        )
        for k in order
    )
    n_bad = int(bad.sum())
    return StageResult(
        name=name,
        status="different" if n_bad else "same",
        axes=axes,
        expected_shape=tuple(expected.shape),
        actual_shape=tuple(actual.shape),
        cells=int(expected.size),
        differing=n_bad,
        max_abs=float(abs_err.max()) if abs_err.size else 0.0,
        max_rel=float(rel_err.max()) if rel_err.size else 0.0,
        worst=cells,
    )


def conform(
    given: FloatArray, shape: tuple[int, ...], axes: tuple[str, ...], stage: str = ""
) -> FloatArray | None:
    """``given`` in the layout ``shape``, allowing batch and head axes of size 1 to be left out
    or added, and Q, K, V flat ([batch?, seq, heads*d], heads in blocks); None if it won't fit."""
    if given.shape == shape:
        return given
    g = given
    while g.ndim > len(shape) and g.shape[0] == 1:
        g = g[0]  # extra leading axes of size 1
    if g.shape == shape:
        return g
    if g.ndim < len(shape):
        optional = [
            i
            for i, (a, n) in enumerate(zip(axes, shape, strict=True))
            if a in SIZE_ONE_AXES and n == 1
        ]
        for r in range(1, len(optional) + 1):
            for drop in itertools.combinations(optional, r):
                if tuple(n for i, n in enumerate(shape) if i not in drop) == g.shape:
                    return g.reshape(shape)
    if stage in PER_HEAD and len(shape) >= 3 and g.ndim >= 2:
        H, T, d = shape[-3:]
        if H > 1 and g.shape[-2:] == (T, H * d):
            split = g.reshape(*g.shape[:-1], H, d).swapaxes(-3, -2)  # (..., H, T, d)
            return conform(split, shape, axes)
    return None


def as_traced(trace: Trace, name: str, arr: FloatArray) -> FloatArray:
    """A recomputed stage as the trace lays it out: without the batch axis when the fixture has
    none (a stage without one, differential attention's lambda, as it is)."""
    return arr if trace.inputs.has_batch or SPECS[name].axes[0] != "batch" else arr[0]


def compare(
    trace: Trace,
    given: Mapping[str, FloatArray],
    *,
    kind: Kind,
    against: str,
    tolerance: Tolerance,
    stages: Sequence[str] | None = None,
    worst: int = 5,
) -> Comparison:
    """Compare ``given`` stage values with the trace.

    ``golden``: every stage on either side (a stage on one side only is a mismatch), exact
    shapes. ``expected`` and ``dump``: the stages given, shapes conformed (see ``conform``).
    In a dump the trace is the reference, so errors are relative to the trace.
    """
    if kind == "golden":
        names = [n for n in STAGE_NAMES if n in trace or n in given]
    else:
        names = [n for n in STAGE_NAMES if n in given]
    if stages is not None:
        names = [n for n in names if n in stages]
    if not names:
        what = "none of the selected stages" if stages is not None else "no stages"
        raise UsageError(against, "", f"nothing to compare: {what} on either side", "a stage")
    results: list[StageResult] = []
    for name in names:
        if name not in trace:  # in a dump the trace is the reference (the expected side)
            missing: Status = "missing_expected" if kind == "dump" else "missing_actual"
            results.append(StageResult(name, missing))
            continue
        stage = trace[name]
        if name not in given:
            results.append(StageResult(name, "missing_expected", stage.axes, None, stage.shape))
            continue
        raw = given[name]
        fitted = raw if kind == "golden" else conform(raw, stage.shape, stage.axes, name)
        if fitted is None or fitted.shape != stage.shape:
            shapes = (tuple(raw.shape), stage.shape) if kind != "dump" else (stage.shape, raw.shape)
            results.append(StageResult(name, "shape", stage.axes, *shapes))
            continue
        if kind == "dump":
            results.append(compare_stage(name, stage.axes, stage.data, fitted, tolerance, worst))
        else:
            results.append(compare_stage(name, stage.axes, fitted, stage.data, tolerance, worst))
    return Comparison(trace, kind, against, tolerance, tuple(results))


def check_golden(
    trace: Trace,
    path: Path,
    tolerance: Tolerance = GOLDEN_TOLERANCE,
    stages: Sequence[str] | None = None,
    worst: int = 5,
) -> Comparison:
    """Compare the trace with the golden JSON trace at ``path``."""
    from attn_cli.io.trace_json import load_trace_json

    if not path.exists():
        raise InputError(
            str(path), "", "no such golden file", "a golden JSON trace (write it with --update)"
        )
    golden = load_trace_json(path)
    return compare(
        trace,
        golden,
        kind="golden",
        against=str(path),
        tolerance=tolerance,
        stages=stages,
        worst=worst,
    )


def check_expected(
    trace: Trace,
    tolerance: Tolerance = GOLDEN_TOLERANCE,
    stages: Sequence[str] | None = None,
    worst: int = 5,
) -> Comparison:
    """Compare the trace with its fixture's own ``expected`` section."""
    expected = trace.inputs.expected
    if not expected:
        raise UsageError(
            trace.inputs.source,
            "expected",
            "the fixture has no expected section",
            "an `expected` mapping in the fixture, or --golden FILE, --golden-dir DIR or "
            "--against DUMP",
        )
    return compare(
        trace,
        expected,
        kind="expected",
        against="its expected section",
        tolerance=tolerance,
        stages=stages,
        worst=worst,
    )


def write_golden(trace: Trace, path: Path) -> str:
    """(Re)write the golden JSON trace at ``path`` atomically; say what changed."""
    from attn_cli.io.files import write_atomic
    from attn_cli.io.trace_json import dumps, load_trace_json

    before = "new"
    if path.is_file():
        try:
            old = compare(
                trace,
                load_trace_json(path),
                kind="golden",
                against=str(path),
                tolerance=GOLDEN_TOLERANCE,
            )
        except AttnError:
            before = "replaced an unreadable file"
        else:
            moved = [s.name for s in old.differing]
            before = "unchanged" if not moved else "changed: " + ", ".join(moved)
    text = dumps(trace)
    write_atomic(path, text, option="--golden")
    return f"wrote {path} ({before}; {len(trace.stages)} stages, {len(text.encode()):,} bytes)"
