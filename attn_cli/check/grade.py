"""Grading a user's own attention code: take its dump (dump.py), find where it first leaves the
trace, and name the classic mistake behind it, but only after recomputing that mistake from the
trace's own earlier stages reproduces the user's numbers within the tolerance.

The mistakes are those of plain attention and of the variants that are on, each found by the
variant's name in check/mistake.py's table (one module of check/mistakes/ per variant); the
recomputation is the one chain's (check/recompute.py), whole-array and batch axis first
(B, H, T, S), and ``as_traced`` drops the batch axis again when the fixture had none. A row a
mistake leaves with no key is recomputed as the user's own softmax gives it (nan or 0, row by
row), so that a diagnosis accounts for the later stages. When no mistake fits, the comparison
still says what the numbers show: one factor everywhere, the axes reordered, or what else the
first differing stage looks like next to attn's (hints.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace

import numpy as np

import attn_cli.check.mistakes  # noqa: F401 (registers the mistakes attn knows)
from attn_cli.check import grade_backward, hints
from attn_cli.check.compare import (
    GRADER_TOLERANCE,
    SIZE_ONE_AXES,
    Comparison,
    Diagnosis,
    SameRatio,
    Tolerance,
    TransposeFit,
    all_close,
    as_traced,
    cell_errors,
    compare,
    conform,
)
from attn_cli.check.dump import BatchDump, DecodeDump, Dump, FlashDump
from attn_cli.check.mistake import ZH, every_mistake, mistakes_for
from attn_cli.check.recompute import Candidate, Weights, softmax_and_lse
from attn_cli.core.inputs import BoolArray, FloatArray
from attn_cli.core.pipeline import Trace
from attn_cli.core.stages import SPECS

# ---------------------------------------------------------------------------------------------
# Grading


def grade(
    trace: Trace,
    dump: Dump,
    tolerance: Tolerance = GRADER_TOLERANCE,
    stages: Sequence[str] | None = None,
    worst: int = 5,
) -> Comparison:
    """Compare the dump with the trace and diagnose the first stage that differs."""
    if isinstance(dump, BatchDump):
        from attn_cli.check.grade_batch import grade_batch  # core/batch.py's packing

        return grade_batch(dump, tolerance, worst)
    if isinstance(dump, (DecodeDump, FlashDump)):
        from attn_cli.check.grade_decode import grade_special  # core's decode and flash

        return grade_special(trace, dump, tolerance, worst)
    if grade_backward.wants_backward(dump):  # gradients (dQ, q.grad, ...): the backward pass
        trace = grade_backward.with_backward(trace)
        dump = grade_backward.retarget(dump, trace)
    comparison = compare(
        trace,
        dump.arrays,
        kind="dump",
        against=dump.source,
        tolerance=tolerance,
        stages=stages,
        worst=worst,
    )
    notes = []
    if dump.aliases:
        notes.append("aliases: " + ", ".join(f"{k} -> {v}" for k, v in dump.aliases.items()))
    if dump.ignored:
        notes.append("ignored (not a stage name): " + ", ".join(dump.ignored))
    first = comparison.first_difference
    found: tuple[Diagnosis, ...] = ()
    tried: tuple[str, ...] = ()
    if first is not None and first.status in ("different", "shape"):
        later = [s.name for s in comparison.differing if s.name != first.name]
        gradient = first.name in trace and SPECS[first.name].gradient
        diagnoser = grade_backward.diagnose_backward if gradient else diagnose
        found, tried = diagnoser(trace, dump.arrays, first.name, later, tolerance)
    ratio = transpose = None
    seen: tuple[str, ...] = ()
    if first is not None and first.name in trace and first.name in dump.arrays:
        given = dump.arrays[first.name]
        if first.status == "shape":
            transpose = transpose_fit(trace, first.name, given, tolerance)
            if transpose is None and not found:
                seen = (hints.shape_look(trace, first.name, given),)
        elif first.status == "different" and not found:
            ratio = same_ratio(trace, first.name, given, tolerance)
            seen = () if ratio is not None else hints.looks(trace, first.name, given, tolerance)
    return replace(
        comparison,
        notes=tuple(notes),
        aliases=dict(dump.aliases),
        ignored=dump.ignored,
        diagnoses=found,
        tried=tried,
        ratio=ratio,
        transpose=transpose,
        looks=seen,
    )


def diagnose(
    trace: Trace,
    given: Mapping[str, FloatArray],
    stage: str,
    later: Sequence[str],
    tolerance: Tolerance,
) -> tuple[tuple[Diagnosis, ...], tuple[str, ...]]:
    """Every known mistake that reproduces ``given[stage]`` and, of those, the ones that
    reproduce the most of the ``later`` stages; and the titles of those tried."""
    found: list[Diagnosis] = []
    tried: list[str] = []
    nan_rows = evident_nan_rows(trace, given)
    for mistake in mistakes_for(trace.inputs):
        if mistake.fallback and found:
            break
        with np.errstate(all="ignore"):
            candidates = mistake.candidates(trace)
        if not any(stage in cand.stages for cand in candidates):
            continue  # does not apply to this fixture, or enters after this stage
        tried.append(mistake.title)
        best: tuple[Candidate, tuple[str, ...]] | None = None
        for cand in _ways(trace, candidates, stage, nan_rows, tolerance):
            if not _fits(
                given[stage],
                as_traced(trace, stage, cand.stages[stage]),
                trace[stage].axes,
                stage,
                tolerance,
            ):
                continue
            explains = tuple(
                n
                for n in later
                if n in cand.stages
                and _fits(
                    given[n], as_traced(trace, n, cand.stages[n]), trace[n].axes, n, tolerance
                )
            )
            if best is None or len(explains) > len(best[1]):
                best = cand, explains  # of the ways it can go wrong, the one explaining most
            if len(explains) == len(later):
                break
        if best is not None:
            cand, explains = best
            found.append(
                Diagnosis(
                    name=mistake.name,
                    title=mistake.title,
                    detail=cand.detail.format(stage=stage)
                    + f" Confirmed: recomputed from attn's own earlier stages, it reproduces "
                    f"every cell of your {stage} ({tolerance})." + cand.note,
                    stage=stage,
                    explains=explains,
                    unexplained=tuple(n for n in later if n not in explains),
                    title_zh=ZH.get(mistake.name, ("", ""))[0],
                    explanation_zh=ZH.get(mistake.name, ("", ""))[1],
                )
            )
    most = max((len(d.explains) for d in found), default=0)
    kept = [d for d in found if len(d.explains) == most]  # a later stage tells them apart
    return tuple(kept), tuple(tried)


def _ways(
    trace: Trace,
    candidates: Sequence[Candidate],
    stage: str,
    nan_rows: BoolArray | None,
    tolerance: Tolerance,
) -> Iterator[Candidate]:
    """The candidates that change ``stage``, each followed by its recomputation with the
    user's own softmax where that gives nan rows (``_following``)."""
    correct = trace[stage]
    for cand in candidates:
        if stage not in cand.stages:
            continue
        value = as_traced(trace, stage, cand.stages[stage])
        if value.shape == correct.shape and all_close(value, correct.data, tolerance):
            continue  # this mistake changes nothing here: it cannot be told apart
        yield cand
        if cand.rerun is None or nan_rows is None:
            continue
        with np.errstate(all="ignore"):
            stages = cand.rerun(_following(nan_rows))
        if "softmax" in stages and np.isnan(stages["softmax"]).any():
            yield replace(cand, stages=stages, rerun=None, note=FOLLOWED_NOTE)


FOLLOWED_NOTE = (
    " Your softmax gives nan for a row with nothing to attend to (as a plain softmax and "
    "torch.softmax do), and attn follows it there, row by row: the nan rows of your later "
    "stages come from this mistake."
)


def evident_nan_rows(trace: Trace, given: Mapping[str, FloatArray]) -> BoolArray | None:
    """The (batch, head, query) rows where the user's softmax gives nan, read from the first
    of softmax, output, concat, projected in the dump (concat and projected: any head of the
    query); None when it gives none, or shows none of them."""
    inp = trace.inputs
    shape = (inp.batch, inp.heads, inp.seq_q)
    for name in ("softmax", "output", "concat", "projected"):
        if name not in given or name not in trace:
            continue
        fitted = conform(given[name], trace[name].shape, trace[name].axes, name)
        if fitted is None:
            continue
        nan: BoolArray = np.asarray(np.isnan(fitted if inp.has_batch else fitted[None]))
        if name in ("softmax", "output"):
            rows: BoolArray = np.asarray(nan.all(axis=-1))  # (B, H, T)
        else:
            per_query: BoolArray = np.asarray(nan.any(axis=-1))  # (B, T): any head
            rows = np.broadcast_to(per_query[:, None, :], shape)  # (B, H, T)
        return rows if bool(rows.any()) else None
    return None


def _following(nan_rows: BoolArray) -> Weights:
    """The pipeline's softmax, except that a row with nothing allowed is nan where the user's
    is (``nan_rows``, (B, H, T)) and all-zero where it is not."""

    def weights(x: FloatArray) -> FloatArray:
        w = softmax_and_lse(x, None)[0]  # (B, H, T, S)
        w[np.isneginf(x).all(axis=-1) & nan_rows] = np.nan
        return w

    return weights


def _fits(
    raw: FloatArray, value: FloatArray, axes: tuple[str, ...], stage: str, tol: Tolerance
) -> bool:
    if len(axes) != value.ndim:  # a candidate of another stage's shape: compare as it is
        return raw.shape == value.shape and all_close(raw, value, tol)
    fitted = conform(raw, value.shape, axes, stage)
    return fitted is not None and all_close(fitted, value, tol)


# ---------------------------------------------------------------------------------------------
# Hints when no mistake fits: one factor everywhere, or the axes in another order


def same_ratio(
    trace: Trace, stage: str, given: FloatArray, tolerance: Tolerance
) -> SameRatio | None:
    """Whether every cell of ``given`` is attn's ``stage`` times one number (within the
    tolerance, at least two cells differing), and what that number may be."""
    ref = trace[stage]
    yours = conform(given, ref.shape, ref.axes, stage)
    if yours is None:
        return None
    attn = ref.data.astype(np.float64)
    bad = cell_errors(yours, attn, tolerance)[0]
    with np.errstate(all="ignore"):
        known = bad & np.isfinite(yours) & np.isfinite(attn) & (attn != 0)
        if int(bad.sum()) < 2 or not known.any():
            return None
        ratio = float(np.median(yours[known] / attn[known]))
        if ratio == 0 or not math.isfinite(ratio):
            return None
        if cell_errors(yours, attn * ratio, tolerance)[0].any():
            return None  # not one factor everywhere
    reading, suggestion = _read_ratio(trace, ratio)
    return SameRatio(stage, ratio, int(bad.sum()), reading, suggestion)


def _read_ratio(trace: Trace, ratio: float) -> tuple[str, str]:
    """The ratio as a named number of this fixture, and what it suggests."""
    s, d_k = trace.scale, trace.inputs.d_k
    default = trace.scale_source == "default"
    scale = "a scale of 1/√d_k" if default else f"the fixture's scale {s:g}"
    named = (
        (
            s,
            f"1/√{d_k}" if default else "scale",
            f"{scale} applied twice, or where it was not meant?",
        ),
        (1 / s, f"√{d_k}" if default else "1/scale", f"{scale} left out, or undone?"),
        (-1.0, "-1", "the sign flipped: a difference taken the wrong way round?"),
    )
    for value, reading, suggestion in named:
        if value != 1 and math.isclose(ratio, value, rel_tol=1e-3):
            return reading, suggestion
    return "", "a scale or a normalisation applied where it was not meant, or left out?"


def transpose_fit(
    trace: Trace, stage: str, given: FloatArray, tolerance: Tolerance
) -> TransposeFit | None:
    """When ``given``'s shape is a permutation of attn's ``stage`` (size-one batch and head
    axes may be left out): the transpose that fits, the one that matches the numbers if any."""
    ref = trace[stage]
    attn = ref.data.astype(np.float64)
    g = given
    while g.ndim > attn.ndim and g.shape[0] == 1:
        g = g[0]  # extra leading axes of size 1
    for kept in _kept_axes(ref.shape, ref.axes, g.ndim):
        target = tuple(ref.shape[i] for i in kept)
        fits = [
            p
            for p in itertools.permutations(range(g.ndim))
            if p != tuple(range(g.ndim)) and tuple(g.shape[i] for i in p) == target
        ]
        best: tuple[tuple[int, ...], int] | None = None
        for p in fits:
            moved = g.transpose(p).reshape(attn.shape)  # (attn's axes)
            differing = int(cell_errors(moved, attn, tolerance)[0].sum())
            if best is None or differing < best[1]:
                best = p, differing
            if differing == 0:
                break
        if best is not None:
            p, differing = best
            names = tuple(ref.axes[i] for i in kept)
            yours = tuple(names[p.index(i)] for i in range(g.ndim))
            return TransposeFit(stage, p, yours, names, int(attn.size), differing)
    return None


def _kept_axes(shape: tuple[int, ...], axes: tuple[str, ...], ndim: int) -> list[tuple[int, ...]]:
    """attn's axes a dump of ``ndim`` axes may hold: all, or all but some of size one."""
    n = len(shape)
    if ndim == n:
        return [tuple(range(n))]
    optional = [
        i for i, (a, k) in enumerate(zip(axes, shape, strict=True)) if a in SIZE_ONE_AXES and k == 1
    ]
    if ndim > n or n - ndim > len(optional):
        return []
    return [
        tuple(i for i in range(n) if i not in drop)
        for drop in itertools.combinations(optional, n - ndim)
    ]


# ---------------------------------------------------------------------------------------------
# The mistakes: those of plain attention and of every variant attn ships (check/mistakes/)


MISTAKES = every_mistake()  # as registered when the grader is imported; diagnose asks anew
