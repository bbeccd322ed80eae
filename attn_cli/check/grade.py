"""Grading a user's own attention code: take its dump (dump.py), find where it first leaves the
trace, and name the classic mistake behind it, but only after recomputing that mistake from the
trace's own earlier stages reproduces the user's numbers within the tolerance.

The recomputation reuses pipeline.py's step functions, whole-array and batch axis first
(B, H, T, S); only the mistaken variants are written here. It only ever starts from the
trace's own stages, and ``_public`` drops the batch axis again when the fixture had none.
A row a mistake leaves with no key is recomputed as the user's own softmax gives it (nan or
0, row by row), so that a diagnosis accounts for the later stages. When no mistake fits, the
comparison still says what the numbers show: one factor everywhere, or the axes reordered.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from attn_cli.check import grade_backward
from attn_cli.check.compare import (
    GRADER_TOLERANCE,
    SIZE_ONE_AXES,
    Comparison,
    Diagnosis,
    SameRatio,
    Tolerance,
    TransposeFit,
    cell_errors,
    compare,
    conform,
)
from attn_cli.check.dump import DecodeDump, FlashDump
from attn_cli.check.dump import Dump as Dump  # Dump, load_dump, stage_for: their old import path
from attn_cli.check.dump import load_dump as load_dump
from attn_cli.check.dump import stage_for as stage_for
from attn_cli.check.grade_variants import (
    VARIANT_MISTAKES,
    Change,
    Expand,
    Weights,
    alibi_stage,
    masked_with,
    projections,
    qk_norm,
    softmax_and_lse,
    with_causal,
)
from attn_cli.check.grade_variants import internal as _internal
from attn_cli.core.inputs import BoolArray, FloatArray, Inputs
from attn_cli.core.pipeline import Trace
from attn_cli.core.stages import SPECS, STAGE_NAMES, softmax_input
from attn_cli.core.steps import (
    allowed_positions,
    apply_mask,
    attention_scores,
    cap_scores,
    project,
    repeat_kv,
    rotate,
    scale_scores,
    weighted_sum,
    window_reach,
)
from attn_cli.core.steps import concat_heads as merge_heads
from attn_cli.core.variants import causal_allowed

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
    if isinstance(dump, (DecodeDump, FlashDump)):
        from attn_cli.check.grade_decode import grade_special  # core's decode and flash

        return grade_special(trace, dump, tolerance, worst)
    if grade_backward.wants_backward(dump):  # gradients (dQ, q.grad, ...): the backward pass
        trace = grade_backward.with_backward(trace)
        dump = grade_backward.retarget(dump, trace)
    comparison = compare(
        trace, dump.arrays, kind="dump", against=dump.source, tolerance=tolerance,
        stages=stages, worst=worst,
    )  # fmt: skip
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
    if first is not None and first.name in trace and first.name in dump.arrays:
        given = dump.arrays[first.name]
        if first.status == "shape":
            transpose = transpose_fit(trace, first.name, given, tolerance)
        elif first.status == "different" and not found:
            ratio = same_ratio(trace, first.name, given, tolerance)
    return replace(
        comparison, notes=tuple(notes), aliases=dict(dump.aliases), ignored=dump.ignored,
        diagnoses=found, tried=tried, ratio=ratio, transpose=transpose,
    )  # fmt: skip


@dataclass(frozen=True)
class _Candidate:
    """The stages a mistaken computation produces (internal layout), and how it went wrong.

    ``rerun`` recomputes the same stages with another softmax (see ``_following``); ``note``
    is said after the confirmation."""

    detail: str
    stages: Mapping[str, FloatArray]
    rerun: Callable[[Weights], Mapping[str, FloatArray]] | None = None
    note: str = ""


@dataclass(frozen=True)
class _Mistake:
    name: str
    title: str
    candidates: Callable[[Trace], list[_Candidate]]  # empty: does not apply to this fixture
    fallback: bool = False  # tried only when no other mistake fits


def diagnose(
    trace: Trace,
    given: Mapping[str, FloatArray],
    stage: str,
    later: Sequence[str],
    tolerance: Tolerance,
) -> tuple[tuple[Diagnosis, ...], tuple[str, ...]]:
    """Every known mistake that reproduces ``given[stage]``, and the titles of those tried."""
    found: list[Diagnosis] = []
    tried: list[str] = []
    nan_rows = evident_nan_rows(trace, given)
    for mistake in MISTAKES:
        if mistake.fallback and found:
            break
        with np.errstate(all="ignore"):
            candidates = mistake.candidates(trace)
        if not any(stage in cand.stages for cand in candidates):
            continue  # does not apply to this fixture, or enters after this stage
        tried.append(mistake.title)
        best: tuple[_Candidate, tuple[str, ...]] | None = None
        for cand in _ways(trace, candidates, stage, nan_rows, tolerance):
            if not _fits(given[stage], _public(trace, cand.stages[stage]), trace[stage].axes,
                         stage, tolerance):  # fmt: skip
                continue
            explains = tuple(
                n for n in later
                if n in cand.stages and _fits(given[n], _public(trace, cand.stages[n]),
                                              trace[n].axes, n, tolerance)
            )  # fmt: skip
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
                )
            )
    return tuple(found), tuple(tried)


def _ways(
    trace: Trace,
    candidates: Sequence[_Candidate],
    stage: str,
    nan_rows: BoolArray | None,
    tolerance: Tolerance,
) -> Iterator[_Candidate]:
    """The candidates that change ``stage``, each followed by its recomputation with the
    user's own softmax where that gives nan rows (``_following``)."""
    correct = trace[stage]
    for cand in candidates:
        if stage not in cand.stages:
            continue
        value = _public(trace, cand.stages[stage])
        if value.shape == correct.shape and _close(value, correct.data, tolerance):
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
        return raw.shape == value.shape and _close(raw, value, tol)
    fitted = conform(raw, value.shape, axes, stage)
    return fitted is not None and _close(fitted, value, tol)


def _close(actual: FloatArray, expected: FloatArray, tol: Tolerance) -> bool:
    bad, _, _ = cell_errors(actual, expected, tol)
    return not bool(bad.any())


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
        (s, f"1/√{d_k}" if default else "scale", f"{scale} applied twice, or where it was "
         "not meant?"),
        (1 / s, f"√{d_k}" if default else "1/scale", f"{scale} left out, or undone?"),
        (-1.0, "-1", "the sign flipped: a difference taken the wrong way round?"),
    )  # fmt: skip
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
            p for p in itertools.permutations(range(g.ndim))
            if p != tuple(range(g.ndim)) and tuple(g.shape[i] for i in p) == target
        ]  # fmt: skip
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
    optional = [i for i, (a, k) in enumerate(zip(axes, shape, strict=True))
                if a in SIZE_ONE_AXES and k == 1]  # fmt: skip
    if ndim > n or n - ndim > len(optional):
        return []
    return [
        tuple(i for i in range(n) if i not in drop)
        for drop in itertools.combinations(optional, n - ndim)
    ]


# ---------------------------------------------------------------------------------------------
# Recomputing with a mistake


def _public(trace: Trace, arr: FloatArray) -> FloatArray:
    return arr if trace.inputs.has_batch else arr[0]


def softmax_unguarded(x: FloatArray) -> FloatArray:
    """Softmax as written before torch 2.5: a row of -inf gives nan."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out: FloatArray = e / e.sum(axis=-1, keepdims=True)
    return out


def allowed(
    inp: Inputs, *, causal_shift: int = 0, invert_causal: bool = False, invert_mask: bool = False
) -> BoolArray:
    """Where a query may attend (B, H, T, S), from causal and window (at the token positions),
    mask and lengths, possibly with a mistake: the causal limit moved ``causal_shift`` keys
    (the window's far end stays), the causal part inverted, or the boolean mask inverted."""
    pos_q, pos_k = inp.token_positions()
    causal = np.ones((inp.seq_q, inp.seq_k), dtype=bool)  # (T, S)
    if inp.causal is not None:
        causal = causal_allowed(pos_q + causal_shift, pos_k)  # key <= query + shift
        if inp.window is not None:
            reach = window_reach(inp.window, pos_q, pos_k)
            causal &= np.subtract.outer(pos_q, pos_k) < reach  # (T, S): the far end
        causal = ~causal if invert_causal else causal
    if invert_mask and inp.mask is not None:
        inp = replace(inp, mask=~inp.mask)
    return with_causal(inp, causal)


def interleave_heads(x: FloatArray, n: int) -> FloatArray:
    """The mistaken split: head h takes columns h, h+n, h+2n, … of the flat features."""
    B, T, width = x.shape
    heads: FloatArray = x.reshape(B, T, width // n, n).transpose(0, 3, 1, 2)  # (B, n, T, d)
    return heads


def merge_interleaved(x: FloatArray) -> FloatArray:
    """The inverse of ``interleave_heads``: (B, n, T, d) -> (B, T, d*n)."""
    B, n, T, d = x.shape
    flat: FloatArray = x.transpose(0, 2, 3, 1).reshape(B, T, d * n)  # (B, T, d*n)
    return flat


def downstream(
    trace: Trace,
    start: str,
    values: Mapping[str, FloatArray],
    *,
    weights: Weights | None = None,
    merge: Callable[[FloatArray], FloatArray] = merge_heads,
    inputs: Inputs | None = None,
    expand: Expand = repeat_kv,
) -> dict[str, FloatArray]:
    """Recompute every stage from ``start`` on as the pipeline does, with ``values`` replacing
    the trace's stages and ``inputs`` its inputs (positions, window, slopes, weights).

    Mistakes enter as ``weights`` (the softmax; default the pipeline's, with sinks), ``merge``
    (heads side by side) and ``expand`` (kv heads to query heads; default grouped).
    """
    inp = inputs or trace.inputs
    order = [n for n in STAGE_NAMES if n in trace.applicable]
    todo = order[order.index(start) :]
    redo = _Recompute(trace, inp, order, dict(values), weights, merge, expand)
    for name in todo:
        if name in redo.s or name in ("X", "X_kv", "lse"):
            continue  # lse comes with the softmax
        if name in _QKV_STAGES:
            redo.qkv(name)
        elif name in _LOGIT_STAGES:
            redo.logits(name)
        else:
            redo.mix(name)
    return {n: redo.s[n] for n in todo if n in redo.s}


_QKV_STAGES = ("Q", "K", "V", "Q_norm", "K_norm", "Q_rot", "K_rot")
_LOGIT_STAGES = ("scores", "scaled", "capped", "alibi", "masked")


@dataclass(frozen=True)
class _Recompute:
    """downstream's walk: each stage recomputed into ``s`` from the stages before it."""

    trace: Trace
    inp: Inputs
    order: list[str]
    s: dict[str, FloatArray]
    weights: Weights | None
    merge: Callable[[FloatArray], FloatArray]
    expand: Expand

    def get(self, name: str) -> FloatArray:
        return self.s[name] if name in self.s else _internal(self.trace, name)

    def qkv(self, name: str) -> None:
        """Q, K, V (projected), QK-norm and RoPE."""
        inp, order, s, get = self.inp, self.order, self.s, self.get
        if name in ("Q", "K", "V") and inp.mode == "projection":
            X_kv = get("X_kv") if "X_kv" in order else None
            s.update({n: a for n, a in projections(inp, get("X"), X_kv).items() if n not in s})
        elif name in ("Q_norm", "K_norm"):
            s[name] = qk_norm(inp, name[0], get(name[0]))  # (B, heads, T, D)
        elif name in ("Q_rot", "K_rot"):
            assert inp.rope is not None
            pos_q, pos_k = inp.token_positions()
            source = f"{name[0]}_norm" if f"{name[0]}_norm" in order else name[0]
            s[name] = rotate(get(source), pos_q if name == "Q_rot" else pos_k, inp.rope)

    def logits(self, name: str) -> None:
        """The scores, scaled, capped, ALiBi and masked."""
        inp, order, s, get = self.inp, self.order, self.s, self.get
        if name == "scores":
            q, k = (get(_reads(order, n)) for n in ("Q", "K"))
            s[name] = attention_scores(q, self.expand(k, inp.heads // inp.kv_heads))  # (B, H, T, S)
        elif name == "scaled":
            s[name] = scale_scores(get("scores"), self.trace.scale)
        elif name == "capped":
            assert inp.softcap is not None
            s[name] = cap_scores(get("scaled"), inp.softcap)
        elif name == "alibi":
            s[name] = alibi_stage(inp)  # (B, H, T, S)
        elif name == "masked":
            logits = get("capped" if "capped" in order else "scaled")
            alibi = get("alibi") if "alibi" in order else None
            ok = allowed_positions(inp)
            s[name] = apply_mask(logits, ok, inp.bias, alibi=alibi, fill=inp.mask_value)

    def mix(self, name: str) -> None:
        """The softmax (and lse), the output, the heads merged and projected."""
        inp, order, s, get = self.inp, self.order, self.s, self.get
        if name == "softmax":
            x = get(softmax_input(inp))
            if self.weights is None:
                s[name], lse = softmax_and_lse(x, inp.sinks)
                if "lse" in order and "lse" not in s:
                    s["lse"] = lse  # (B, H, T)
            else:
                s[name] = self.weights(x)
        elif name == "output":
            v = self.expand(get("V"), inp.heads // inp.kv_heads)
            s[name] = weighted_sum(get("softmax"), v)  # (B, H, T, Dv)
        elif name == "concat":
            s[name] = self.merge(get("output"))  # (B, T, H*Dv)
        elif name == "projected":
            assert inp.W_O is not None
            s[name] = project(get("concat"), inp.W_O, inp.b_O)  # (B, T, E)


def _reads(order: Sequence[str], name: str) -> str:
    """The stage the scores read for Q or K: rotated, else normalised, else plain."""
    return next(n for n in (f"{name}_rot", f"{name}_norm", name) if n in order)


def _both_softmaxes(
    trace: Trace, start: str, values: Mapping[str, FloatArray], detail: str
) -> list[_Candidate]:
    """A mistake followed by a correct softmax, or by the user's where it gives nan rows."""
    return [_candidate(trace, detail, start, values)]


def _candidate(
    trace: Trace,
    detail: str,
    start: str,
    values: Mapping[str, FloatArray],
    **how: Any,
) -> _Candidate:
    """The stages from ``start`` recomputed with ``values`` (``how``: see ``downstream``), and
    the way to recompute them with another softmax; a sink keeps every row finite: no nan."""

    def rerun(weights: Weights) -> dict[str, FloatArray]:
        return downstream(trace, start, values, weights=weights, **how)

    stages = downstream(trace, start, values, **how)
    return _Candidate(detail, stages, rerun if trace.inputs.sinks is None else None)


def _weights_input(trace: Trace) -> FloatArray:
    return _internal(trace, softmax_input(trace.inputs))


def _no_scaling(trace: Trace) -> list[_Candidate]:
    if trace.scale == 1:
        return []
    which = "1/√d_k" if trace.scale_source == "default" else "the fixture's scale"
    detail = (
        f"Your {{stage}} is what attn gets when the scores are never multiplied by {which} "
        f"= {trace.scale:.6g}. Fix: scaled = scores * {which}."
    )
    return _both_softmaxes(trace, "scaled", {"scaled": _internal(trace, "scores")}, detail)


def _scaled_by_d_k(trace: Trace) -> list[_Candidate]:
    d_k = trace.inputs.d_k
    if trace.scale_source != "default" or d_k == 1:
        return []
    detail = (
        f"Your {{stage}} is what attn gets when the scores are divided by d_k = {d_k} instead "
        f"of √d_k = {math.sqrt(d_k):.6g}. Fix: divide by math.sqrt(d_k)."
    )
    scaled = _internal(trace, "scores") / d_k
    return _both_softmaxes(trace, "scaled", {"scaled": scaled}, detail)


def _softmax_wrong_axis(trace: Trace) -> list[_Candidate]:
    x = _weights_input(trace).swapaxes(-1, -2)  # (B, H, S, T): softmax now runs over queries
    detail = (
        "Your {stage} is what attn gets with the softmax taken over the queries (axis -2) "
        "instead of the keys (axis -1): each column of the weights sums to 1, not each row. "
        "Fix: softmax(x, axis=-1)."
    )
    sinks = trace.inputs.sinks
    kinds: list[Weights] = [lambda y: softmax_and_lse(y, sinks)[0]]
    kinds += [softmax_unguarded] if sinks is None else []
    return [
        _Candidate(detail, downstream(trace, "softmax", {"softmax": f(x).swapaxes(-1, -2)}))
        for f in kinds
    ]


def _scores_transposed(trace: Trace) -> list[_Candidate]:
    scores = _internal(trace, "scores").swapaxes(-1, -2)  # (B, H, S, T): K·Qᵀ
    detail = (
        "Your {stage} is what attn gets from K·Qᵀ instead of Q·Kᵀ (Q and K swapped): the "
        "scores are transposed, keys on the rows. Fix: scores = Q @ K.swapaxes(-1, -2)."
    )
    if trace.inputs.seq_q != trace.inputs.seq_k:
        only = {"scores": scores, "scaled": scores * trace.scale}
        return [_Candidate(detail, only)]
    return _both_softmaxes(trace, "scores", {"scores": scores}, detail)


def _k_not_transposed(trace: Trace) -> list[_Candidate]:
    inp = trace.inputs
    if inp.seq_k != inp.d_k:
        return []  # Q·K only runs at all when seq_k = d_k
    order = trace.applicable
    k = repeat_kv(_internal(trace, _reads(order, "K")), inp.heads // inp.kv_heads)  # (B, H, S, D)
    scores = _internal(trace, _reads(order, "Q")) @ k  # (B, H, T, D) @ (B, H, S=D, D)
    detail = (
        f"Your {{stage}} is what attn gets from Q·K instead of Q·Kᵀ (K not transposed; it only "
        f"runs because seq_k = d_k = {inp.d_k}). Fix: scores = Q @ K.swapaxes(-1, -2)."
    )
    return _both_softmaxes(trace, "scores", {"scores": scores}, detail)


def _masked_with(trace: Trace, ok: BoolArray) -> FloatArray:
    return masked_with(trace, ok)


def _mask_inverted(trace: Trace) -> list[_Candidate]:
    inp = trace.inputs
    out: list[_Candidate] = []
    if inp.mask is not None:
        ok = allowed(inp, invert_mask=True)
        detail = (
            "Your {stage} is what attn gets with the boolean mask inverted: true taken as "
            "'blocked' (nn.MultiheadAttention's convention) instead of 'may attend' (torch "
            "SDPA's, and the fixture's). Fix: masked = where(mask, scaled, -inf)."
        )
        out += _both_softmaxes(trace, "masked", {"masked": _masked_with(trace, ok)}, detail)
    if inp.causal is not None:
        ok = allowed(inp, invert_causal=True)
        detail = (
            "Your {stage} is what attn gets with the causal mask inverted: each query sees only "
            "the keys after it and never the ones up to it. Fix: block where key > query, e.g. "
            "where(tril(ones), scaled, -inf)."
        )
        out += _both_softmaxes(trace, "masked", {"masked": _masked_with(trace, ok)}, detail)
    return out


def _causal_shifted(trace: Trace) -> list[_Candidate]:
    if trace.inputs.causal is None:
        return []
    out: list[_Candidate] = []
    for shift, what in (
        (1, "each query also sees the next key (tril(…, k=1), or triu(…, 2) blocked)"),
        (-1, "each query misses its own key (tril(…, k=-1), or triu(…, 0) blocked)"),
    ):
        ok = allowed(trace.inputs, causal_shift=shift)
        detail = (
            f"Your {{stage}} is what attn gets with the causal mask shifted by one: {what}. "
            "Fix: query i may attend to keys j <= i."
        )
        out += _both_softmaxes(trace, "masked", {"masked": _masked_with(trace, ok)}, detail)
    return out


def _heads_interleaved(trace: Trace) -> list[_Candidate]:
    inp = trace.inputs
    if inp.heads == 1 and inp.kv_heads == 1:
        return []
    q = interleave_heads(merge_heads(_internal(trace, "Q")), inp.heads)
    k = interleave_heads(merge_heads(_internal(trace, "K")), inp.kv_heads)
    v = interleave_heads(merge_heads(_internal(trace, "V")), inp.kv_heads)
    d = inp.d_k
    detail = (
        f"Your {{stage}} is what attn gets when head h takes the columns h, h+{inp.heads}, "
        f"h+{2 * inp.heads}, … (reshape(B, T, d_k, heads)) instead of the block "
        f"h·{d}:(h+1)·{d} (reshape(B, T, heads, d_k)). Fix: "
        "x.reshape(B, T, heads, d_k).transpose(0, 2, 1, 3)."
    )
    values = {"Q": q, "K": k, "V": v}
    return [
        _candidate(trace, detail, "Q", values, merge=merge)
        for merge in (merge_heads, merge_interleaved)
    ]


def _no_max_subtraction(trace: Trace) -> list[_Candidate]:
    x = _weights_input(trace)
    out = []
    for dtype, limit in ((np.float64, 709.78), (np.float32, 88.72)):
        e = np.exp(x.astype(dtype))  # no row maximum subtracted: exp overflows to inf
        if not np.isposinf(e).any():
            continue  # no overflow in this precision: the mistake changes nothing visible
        total = e.sum(axis=-1, keepdims=True)  # (B, H, T, 1)
        if trace.inputs.sinks is not None:
            total = total + np.exp(trace.inputs.sinks.astype(dtype))[:, None, None]
        weights = (e / total).astype(np.float64)
        detail = (
            f"Your {{stage}} is what attn gets from exp(x) / sum(exp(x)) in {np.dtype(dtype)} "
            f"without subtracting the row maximum first: exp(x) overflows to inf for x > {limit} "
            "and inf/inf is nan. Fix: exp(x - x.max(axis=-1, keepdims=True))."
        )
        out.append(_Candidate(detail, downstream(trace, "softmax", {"softmax": weights})))
    return out


def _empty_row_nan(trace: Trace) -> list[_Candidate]:
    if not trace.empty_rows or trace.inputs.sinks is not None:
        return []  # with a sink, an empty row gives its mass to the sink, never nan
    weights = softmax_unguarded(_weights_input(trace))
    detail = (
        "Your {stage} is what attn gets when a query row that may attend to no key gets nan "
        "(softmax of all -inf) instead of all-zero weights, as torch SDPA gives since 2.5. "
        "Fix: set such rows to 0."
    )
    return [_Candidate(detail, downstream(trace, "softmax", {"softmax": weights}))]


def _stage_mixup(trace: Trace) -> list[_Candidate]:
    detail = (
        "Your {stage} equals attn's {other}: the array may be saved under the wrong name "
        "(a naming slip, or the two steps done in another order)."
    )
    return [
        _Candidate(detail.replace("{other}", other), {name: _internal(trace, other)})
        for name in trace.stages
        for other in trace.stages
        if other != name
    ]


def _recomputed(changes: Callable[[Trace], list[Change]]) -> Callable[[Trace], list[_Candidate]]:
    """A variant mistake's candidates: each change recomputed downstream by the pipeline's
    steps (and, where the user's softmax gives nan rows, with it: see ``_ways``)."""

    def candidates(trace: Trace) -> list[_Candidate]:
        return [
            _candidate(
                trace, c.detail, c.start, c.values, inputs=c.inputs, expand=c.expand or repeat_kv
            )
            for c in changes(trace)
        ]

    return candidates


MISTAKES = (
    _Mistake("no_scaling", "no 1/√d_k scaling", _no_scaling),
    _Mistake("scaled_by_d_k", "scaled by d_k instead of √d_k", _scaled_by_d_k),
    _Mistake(
        "softmax_wrong_axis", "softmax over the wrong axis (columns sum to 1)", _softmax_wrong_axis
    ),
    _Mistake("scores_transposed", "Q and K swapped (scores transposed)", _scores_transposed),
    _Mistake("k_not_transposed", "K not transposed (Q·K instead of Q·Kᵀ)", _k_not_transposed),
    _Mistake("mask_inverted", "mask polarity inverted", _mask_inverted),
    _Mistake("causal_shifted", "causal mask shifted by one", _causal_shifted),
    _Mistake(
        "heads_interleaved", "heads split interleaved instead of in blocks", _heads_interleaved
    ),
    _Mistake(
        "no_max_subtraction", "forgot the row-max subtraction (overflow)", _no_max_subtraction
    ),
    _Mistake("empty_row_nan", "a row with nothing to attend to gives nan", _empty_row_nan),
    *(_Mistake(m.name, m.title, _recomputed(m.changes)) for m in VARIANT_MISTAKES),
    _Mistake("stage_mixup", "stage saved under another stage's name", _stage_mixup, True),
)
