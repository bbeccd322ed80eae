"""``attn probe``: learn which conventions someone's attention function follows, by calling it.

The function is called as ``fn(q, k, v, **options)`` with arrays ``(batch, heads, seq, d)`` (K and
V may have fewer heads) and returns ``(batch, heads, seq_q, d_v)``; an option (``causal``,
``scale``, ``mask``, ``window``) is passed only when its signature names it. Each convention is
asked with inputs made to separate its answers, mostly with ``v = I`` (``seq_k = d_v``), so that
the output *is* the attention weights: row t of the output is query t's weights over the keys.
The informative query is the last one: it sees every key under each causal alignment.

The reference is PyTorch's ``scaled_dot_product_attention`` written in NumPy (core.steps'
``sdpa``): scale 1/√d, upper-left causal, a True mask entry attends, a row with every key
masked gives zeros (torch >= 2.5), K/V heads repeated interleaved (``enable_gqa``), softmax over
the keys after subtracting the row maximum, and a sliding window of W keys, the query included
(0 <= i - j < W, as HF and Mistral have it; SDPA has none).

A convention the function cannot be asked about is ``"n/a"``; one it does not support (refusing
K/V with fewer heads) is not a difference. Every difference is a finding, named with the
grader's words where the grader's catalogue (check/mistakes/) knows the mistake.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from attn_cli.check.asker import Asker
from attn_cli.core.inputs import BoolArray, FloatArray
from attn_cli.core.steps import sdpa, softmax
from attn_cli.errors import ProbeError, UsageError
from attn_cli.io.target import load

CONVENTIONS = (
    "scale",
    "causal",
    "mask",
    "empty_row",
    "gqa",
    "softmax_axis",
    "large_logits",
    "zero_scores",
    "deterministic",
    "batch_independent",
    "window",
)
OPTIONS = ("causal", "scale", "mask", "window")
NA = "n/a"
FRAMEWORKS = ("numpy", "torch")
DTYPES = ("float64", "float32")
MASK_KINDS = ("bool", "additive")
MAX_TIMEOUT = 3600.0
B, H = 2, 2  # batch items and query heads of every input (GQA: 4 query heads, 2 kv heads)
WINDOW = 3

Value = str | float | bool


@dataclass(frozen=True)
class Decision:
    """One convention: what the function does, what the reference does, and the evidence."""

    name: str
    found: Value
    reference: Value
    evidence: str

    @property
    def differs(self) -> bool:
        """Found and not the reference's: n/a is not asked, refusing GQA is not supporting it."""
        unasked = NA in (self.found, self.reference) or self.found == "refused"
        return self.found != self.reference and not unasked


@dataclass(frozen=True)
class Finding:
    """A difference from the reference: an id (the grader's, where it has one) and evidence."""

    id: str
    title: str
    evidence: str


@dataclass(frozen=True)
class ProbeReport:
    """What ``probe`` learnt: a decision per convention and the findings, in that order."""

    target: str
    decisions: tuple[Decision, ...]
    findings: tuple[Finding, ...]
    takes: tuple[str, ...]  # the options its signature names
    framework: str = "numpy"
    dtype: str = "float64"

    @property
    def verdict(self) -> str:
        return "differs" if self.findings else "matches"

    @property
    def conventions(self) -> dict[str, Value]:
        return {d.name: d.found for d in self.decisions}

    def __getitem__(self, name: str) -> Decision:
        return next(d for d in self.decisions if d.name == name)

    def as_json(self) -> dict[str, Any]:
        """The report as ``attn probe -f json`` writes it (these keys, in this order)."""
        return {
            "target": self.target,
            "verdict": self.verdict,
            "conventions": self.conventions,
            "findings": [
                {"id": f.id, "title": f.title, "evidence": f.evidence} for f in self.findings
            ],
        }


# Findings the grader's catalogue does not hold: id -> title. Those it holds take its titles.
PROBE_TITLES = {
    "scale_constant": "a constant scale where 1/√d_k is meant",
    "scale_option_ignored": "the scale passed in is not the one applied",
    "causal_other": "a causal mask of another shape",
    "mask_ignored": "the mask is not applied",
    "mask_other": "the mask is applied in another way",
    "empty_row_other": "a row with every key masked gives neither zeros nor nan",
    "gqa_other": "K/V heads shared out in another order",
    "zero_scores_masked": "scores that are exactly 0 masked (scores * mask, then == 0 -> -inf)",
    "not_deterministic": "two identical calls differ (dropout left on?)",
    "batch_dependent": "a batch item's output depends on the other items",
    "window_other": "a sliding window of another shape",
    "mutates_inputs": "the function changes its input arrays",
    "output_differs": "the output differs in a way none of the conventions explains",
}


# The grader's mistakes a probe can find (check/mistakes/): their ids, titles and Chinese.
FROM_CATALOGUE = (
    "scaled_by_d_k",
    "no_scaling",
    "causal_corner",
    "causal_shifted",
    "causal_missing",
    "mask_inverted",
    "mask_zero_fill",
    "empty_row_nan",
    "mask_finite_sentinel",
    "gqa_tiled",
    "softmax_wrong_axis",
    "no_max_subtraction",
    "window_off_by_one",
    "window_ignored",
)


def finding_title(finding_id: str) -> str:
    """The title of a finding: the grader's catalogue's, else the probe's own."""
    if finding_id in PROBE_TITLES:
        return PROBE_TITLES[finding_id]
    import attn_cli.check.mistakes  # noqa: F401 - registers the catalogue
    from attn_cli.check.mistake import every_mistake

    return next(m.title for m in every_mistake() if m.name == finding_id)


def _finding(finding_id: str, evidence: str) -> Finding:
    return Finding(finding_id, finding_title(finding_id), evidence)


def _decided(decision: Decision, finding_id: str) -> tuple[Decision, list[Finding]]:
    """The decision, with a finding of that id when it differs from the reference."""
    return decision, [_finding(finding_id, decision.evidence)] if decision.differs else []


# ---------------------------------------------------------------------------------------------
# The reference and the small arrays


def reference(
    q: FloatArray,
    k: FloatArray,
    v: FloatArray,
    *,
    scale: float | None = None,
    causal: bool = False,
    allowed: BoolArray | None = None,
    window: int | None = None,
) -> FloatArray:
    """PyTorch SDPA's semantics in NumPy (GQA interleaved, empty rows zero), plus a window."""
    T, S = q.shape[-2], k.shape[-2]
    i, j = np.arange(T)[:, None], np.arange(S)[None, :]
    keep = np.ones((T, S), dtype=bool)
    if causal or window is not None:
        keep &= j <= i  # upper-left, as is_causal
    if window is not None:
        keep &= i - j < window
    allowed = keep if allowed is None else allowed & keep  # (B, 1 or H, T, S)
    return sdpa(q, k, v, allowed=allowed, scale=scale)[0]


def eye_values(d: int, heads: int = H) -> FloatArray:
    """V = I for every head: the output is the weights (row t: query t over the keys)."""
    v: FloatArray = np.broadcast_to(np.eye(d), (B, heads, d, d)).copy()  # (B, H, S, S)
    return v


def own_hidden(causal: Value, T: int, S: int) -> BoolArray:
    """Which keys a causal convention hides: (T, S), True = hidden (none for "none", "n/a")."""
    rules = dict(_causal_rules(T, S))
    return rules.get(str(causal), rules["none"])


def _hidden(w: FloatArray) -> BoolArray:
    """Zero weights, and every weight of a row that holds nan."""
    return (np.abs(w) < 1e-20) | np.isnan(w).any(axis=-1, keepdims=True)


def _row(w: FloatArray) -> str:
    """A row of numbers, short: [0.7311, 0.2689, 0]."""
    return "[" + ", ".join(f"{x:.4g}" for x in np.asarray(w).ravel()[:6]) + "]"


def _scale_value(label: Value, d: int) -> float | None:
    """The scale a scale convention gives at head size d (None: unknown)."""
    if label == "1/sqrt(d)":
        return 1 / math.sqrt(d)
    if label == "1/d":
        return 1 / d
    if label == "1":
        return 1.0
    return float(label) if isinstance(label, float) else None


def options_taken(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The options (causal, scale, mask, window) the function's signature names."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: positional only
        return ()
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(o for o in OPTIONS if o in params and params[o].kind in named)


# ---------------------------------------------------------------------------------------------
# The conventions, one function each: (decision, findings)

Decided = tuple[Decision, list[Finding]]


@dataclass(frozen=True)
class Known:
    """What earlier probes learnt and later ones build on."""

    scale: Value = NA
    causal: Value = NA  # what the function does when not asked to be causal
    mask: Value = NA


def _scale_at(asker: Asker, d: int, scale: float | None = None) -> tuple[float | None, str]:
    """The scale the function applies at head size d: the last query scores 2 on key 0 and 1
    on key 1 (no score 0, which some take for masked), so its weights are in the ratio e^scale."""
    q = np.zeros((B, H, d, d))
    q[..., -1, 0] = 2.0  # (B, H, T, D): the last query is 2·e0
    k = np.zeros((B, H, d, d))
    k[..., 0, 0], k[..., 1, 0] = 1.0, 0.5  # scores 2 and 1
    k[..., 2:, 0] = 0.25
    out = asker.ask(q, k, eye_values(d), causal=False, scale=scale)
    assert not isinstance(out, str)
    w = out[:, :, -1, :2]  # (B, H, 2): the last query's weights of keys 0 and 1
    if not np.isfinite(w).all() or (w <= 0).any():
        return None, f"d={d}: last query's weights of keys 0, 1 = {_row(w[0, 0])}"
    found = float(np.log(w[..., 0] / w[..., 1]).mean())
    if not math.isfinite(found):  # a weight so small that the ratio overflows
        return None, f"d={d}: last query's weights of keys 0, 1 = {_row(w[0, 0])}"
    return found, f"d={d}: weights {_row(w[0, 0])} -> {found:.6g}"


def probe_scale(asker: Asker) -> Decided:
    """Scores 2 and 1 at two head sizes: e^c is the weights' ratio, c = 1/√d, 1/d, 1 or c."""
    (c4, e4), (c16, e16) = _scale_at(asker, 4), _scale_at(asker, 16)
    evidence = f"q·k = 2 vs 1; {e4}; {e16}"

    def near(x: float | None, y: float) -> bool:
        return x is not None and abs(x - y) <= 1e-3 * abs(y)

    found: Value = NA
    for label in ("1/sqrt(d)", "1/d", "1"):
        if near(c4, _scale_value(label, 4) or 0) and near(c16, _scale_value(label, 16) or 0):
            found = label
    if found == NA and c4 is not None and c16 is not None:
        found = float(f"{c4:.6g}")
    decision = Decision("scale", found, "1/sqrt(d)", evidence)
    ids = {"1/d": "scaled_by_d_k", "1": "no_scaling"}
    findings = []
    if decision.differs:
        findings.append(_finding(ids.get(str(found), "scale_constant"), evidence))
    if "scale" in asker.takes:
        c, e = _scale_at(asker, 4, scale=0.3)
        if not near(c, 0.3):
            findings.append(_finding("scale_option_ignored", f"scale=0.3 passed; {e}"))
    return decision, findings


def probe_causal(asker: Asker) -> Decided:
    """seq_q = 3 < seq_k = 5, random q and k, v = I: the zero weights draw the causal mask."""
    T, S = 3, 5
    rng = np.random.default_rng(38)
    q, k = rng.normal(size=(B, H, T, S)) * 0.5, rng.normal(size=(B, H, S, S)) * 0.5
    takes = "causal" in asker.takes
    out = asker.ask(q, k, eye_values(S), causal=True if takes else None, fatal=False)
    if isinstance(out, str):
        return Decision("causal", NA, "upper-left" if takes else "none", out), []
    found = next(
        (
            label
            for label, rule in _causal_rules(T, S)
            if np.array_equal(_hidden(out), np.broadcast_to(rule, out.shape))
        ),
        "other",
    )
    if takes and found == "none":
        found = "ignored"
    reference = "upper-left" if takes or found != "none" else "none"
    call = "fn(q[2,2,3,5], k[2,2,5,5], v=I" + (", causal=True)" if takes else ")")
    expected = ~own_hidden(reference, T, S)
    evidence = (
        f"{call}: queries 0, 2 see keys {_seen(~_hidden(out)[0, 0])}, reference {_seen(expected)}"
    )
    decision = Decision("causal", found, reference, evidence)
    ids = {
        "lower-right": "causal_corner",
        "diagonal-excluded": "causal_shifted",
        "ignored": "causal_missing",
    }
    return _decided(decision, ids.get(str(found), "causal_other"))


def _causal_rules(T: int, S: int) -> list[tuple[str, BoolArray]]:
    """Each causal convention and the keys it hides, (T, S), True = hidden."""
    i, j = np.arange(T)[:, None], np.arange(S)[None, :]
    return [
        ("none", np.zeros((T, S), dtype=bool)),
        ("upper-left", j > i),
        ("lower-right", j > i + (S - T)),
        ("diagonal-excluded", j >= i),
        ("diagonal-excluded", j >= i + (S - T)),
    ]


def _seen(seen: BoolArray) -> str:
    """The keys the first and the last query see: [0] and [0, 1, 2]."""
    return " and ".join(str(np.flatnonzero(row).tolist()) for row in (seen[0], seen[-1]))


def probe_softmax_axis(asker: Asker) -> Decided:
    """Random q and k (4×4), v = I: the weights' rows sum to 1 (keys) or its columns (queries)."""
    rng = np.random.default_rng(7)
    q, k = rng.normal(size=(B, H, 4, 4)), rng.normal(size=(B, H, 4, 4))
    out = asker.ask(q, k, eye_values(4), causal=False)
    assert not isinstance(out, str)
    w = np.nan_to_num(out[0, 0], nan=0.0)
    rows, cols = w.sum(axis=-1), w.sum(axis=-2)
    row_error = np.abs(rows[rows != 0] - 1).max(initial=0.0)
    col_error = np.abs(cols[cols != 0] - 1).max(initial=0.0)
    found = "keys" if row_error <= col_error else "queries"
    evidence = f"random q, k [4x4], v = I: row sums {_row(rows)}, column sums {_row(cols)}"
    decision = Decision("softmax_axis", found, "keys", evidence)
    return _decided(decision, "softmax_wrong_axis")


# Where the mask probe lets a query attend (True): every row holds both, no causal shape.
MASK_ALLOWED = np.array(
    [[1, 0, 1, 0], [0, 1, 1, 0], [1, 1, 0, 1], [0, 1, 0, 1]], dtype=bool
)  # (T, S)


def _mask_arg(allowed: BoolArray, polarity: Value, kind: str) -> np.ndarray[Any, Any]:
    """The mask to pass so that ``allowed`` is what attends, in the function's polarity."""
    full = np.broadcast_to(allowed, (B, 1, *allowed.shape)).copy()  # (B, 1, T, S)
    if kind == "additive":
        additive: FloatArray = np.where(full, 0.0, -np.inf)
        return additive
    passed: np.ndarray[Any, Any] = ~full if polarity == "true-blocks" else full
    return passed


def probe_mask(asker: Asker, known: Known) -> Decided:
    """A mask with no causal shape, random q and k, v = I: the zero weights are where it hides."""
    if "mask" not in asker.takes:
        return Decision("mask", NA, NA, "fn takes no mask"), []
    kind = asker.mask_kind
    rng = np.random.default_rng(11)
    q, k, v = rng.normal(size=(B, H, 4, 4)), rng.normal(size=(B, H, 4, 4)), eye_values(4)
    own = own_hidden(known.causal, 4, 4)
    out = asker.ask(
        q, k, v, mask=_mask_arg(MASK_ALLOWED, "true-attends", kind), causal=False, fatal=False
    )
    reference: Value = NA if kind == "additive" else "true-attends"
    if isinstance(out, str):
        return Decision("mask", NA, reference, out), []
    hidden = _hidden(out)
    applied = np.broadcast_to(~MASK_ALLOWED | own, hidden.shape)
    inverted = np.broadcast_to(MASK_ALLOWED | own, hidden.shape)
    evidence = (
        f"mask row 0 {_row(MASK_ALLOWED[0].astype(float))} ({kind}, v = I): weights "
        f"{_row(out[0, 0, 0])}"
    )
    findings: list[Finding] = []
    if np.array_equal(hidden, applied):
        found: Value = reference
    elif kind == "bool" and np.array_equal(hidden, inverted):
        found = "true-blocks"
        findings.append(_finding("mask_inverted", evidence))
    else:
        found, findings = _mask_unapplied(asker, known, (q, k, v), out, evidence)
    return Decision("mask", found, reference, evidence), findings


def _mask_unapplied(
    asker: Asker, known: Known, qkv: tuple[FloatArray, ...], out: FloatArray, evidence: str
) -> tuple[Value, list[Finding]]:
    """No weight hidden where the mask says: ignored, hidden places set to 0, or other."""
    q, k, v = qkv
    bare = asker.ask(q, k, v, causal=False, fatal=False)
    if not isinstance(bare, str) and np.allclose(out, bare, rtol=1e-6, atol=1e-9, equal_nan=True):
        return "ignored", [_finding("mask_ignored", evidence + "; without the mask the same")]
    scale = _scale_value(known.scale, 4)
    if scale is not None:
        own = own_hidden(known.causal, 4, 4)
        for polarity, keep in (("true-attends", MASK_ALLOWED), ("true-blocks", ~MASK_ALLOWED)):
            scores = np.where(keep, q @ k.swapaxes(-1, -2) * scale, 0.0)  # (B, H, T, S)
            w = softmax(np.where(own, -np.inf, scores))
            if np.allclose(out, w, rtol=1e-5, atol=1e-7):
                return polarity, [_finding("mask_zero_fill", evidence)]
    return "other", [_finding("mask_other", evidence)]


def _mask_works(asker: Asker, known: Known) -> bool:
    """The mask hides what it says (in one polarity, or added): later probes may pass one."""
    if "mask" not in asker.takes:
        return False
    polar = known.mask in ("true-attends", "true-blocks")
    return polar or (asker.mask_kind, known.mask) == ("additive", NA)


def probe_empty_row(asker: Asker, known: Known) -> Decided:
    """The last query with every key masked (in the function's polarity), v = I."""
    kind = asker.mask_kind
    if "mask" not in asker.takes:
        return Decision("empty_row", NA, NA, "fn takes no mask"), []
    if not _mask_works(asker, known):
        return Decision("empty_row", NA, "zeros", f"its mask is {known.mask}"), []
    allowed = MASK_ALLOWED.copy()
    allowed[-1] = False  # the last query may attend to no key
    rng = np.random.default_rng(12)
    q, k = rng.normal(size=(B, H, 4, 4)), rng.normal(size=(B, H, 4, 4))
    out = asker.ask(
        q, k, eye_values(4), mask=_mask_arg(allowed, known.mask, kind), causal=False, fatal=False
    )
    if isinstance(out, str):
        return Decision("empty_row", NA, "zeros", out), []
    row = out[:, :, -1]  # (B, H, S)
    if np.isnan(row).any():
        found = "nan"
    elif np.allclose(row, 0.0, atol=1e-12):
        found = "zeros"
    elif np.allclose(row, 1 / row.shape[-1], rtol=1e-6):
        found = "uniform"
    else:
        found = "other"
    evidence = f"last query, every key masked (v = I): {_row(row[0, 0])}, reference [0, 0, 0, 0]"
    ids = {"nan": "empty_row_nan", "uniform": "mask_finite_sentinel"}
    decision = Decision("empty_row", found, "zeros", evidence)
    return _decided(decision, ids.get(found, "empty_row_other"))


def probe_gqa(asker: Asker) -> Decided:
    """4 query heads alike, 2 K/V heads alike but V scaled by 1 and 2: each query head's output
    sum, over head 0's, is the number of the K/V head it read."""
    rng = np.random.default_rng(13)
    q = np.repeat(rng.normal(size=(B, 1, 4, 4)), 4, axis=1)  # (B, 4, T, D): heads alike
    k = np.repeat(rng.normal(size=(B, 1, 4, 4)), 2, axis=1)  # (B, 2, S, D)
    v = eye_values(4, heads=2) * np.array([1.0, 2.0])[None, :, None, None]  # (B, 2, S, S)
    out = asker.ask(q, k, v, causal=False, fatal=False)
    if isinstance(out, str):
        return Decision("gqa", "refused", "repeat-interleave", out), []
    sums = out.sum(axis=(0, 2, 3))  # (4,): one per query head
    read = sums / sums[0] if sums[0] != 0 else sums
    found = "other"
    if np.allclose(read, [1, 1, 2, 2], rtol=1e-6):
        found = "repeat-interleave"
    elif np.allclose(read, [1, 2, 1, 2], rtol=1e-6):
        found = "tile"
    evidence = (
        f"q[2,4,4,4], k, v[2,2,4,4], V head g = (g+1)·I: query heads read "
        f"{_row(read)}, reference [1, 1, 2, 2]"
    )
    decision = Decision("gqa", found, "repeat-interleave", evidence)
    finding = "gqa_tiled" if found == "tile" else "gqa_other"
    return _decided(decision, finding)


def probe_large_logits(asker: Asker, known: Known) -> Decided:
    """The last query's logits (after the function's own scale) 1e4 and 0: exp(1e4) overflows
    unless the row maximum is subtracted first."""
    scale = _scale_value(known.scale, 4)
    if scale is None or scale <= 0:
        return Decision("large_logits", NA, "stable", f"its scale is {known.scale}"), []
    q = np.zeros((B, H, 4, 4))
    q[..., -1, 0] = 1e4 / scale  # (B, H, T, D): logit 1e4 on key 0 after the scale
    k = np.zeros((B, H, 4, 4))
    k[..., 0, 0] = 1.0
    out = asker.ask(q, k, eye_values(4), causal=False, fatal=False)
    if isinstance(out, str):
        return Decision("large_logits", NA, "stable", out), []
    row = out[:, :, -1]
    found = "stable" if np.isfinite(row).all() else "overflow"
    evidence = f"logits [1e4, 0, 0, 0] (v = I): {_row(row[0, 0])}, reference [1, 0, 0, 0]"
    decision = Decision("large_logits", found, "stable", evidence)
    return _decided(decision, "no_max_subtraction")


def probe_zero_scores(asker: Asker, known: Known) -> Decided:
    """The last query scores exactly 0 on key 0 (q ⟂ k), nothing masked (a mask of all-attend
    when its mask works, causal on if taken): key 0 keeps its weight unless zeros are taken for
    masked places."""
    q = np.zeros((B, H, 4, 4))
    q[..., -1, 0] = 1.0  # (B, H, T, D): the last query is e0
    k = np.zeros((B, H, 4, 4))
    k[..., 0, 1], k[..., 1, 0], k[..., 2, 0], k[..., 3, 0] = 1.0, 1.0, -1.0, 0.5  # scores 0,1,-1,.5
    options: dict[str, Any] = {"causal": True}
    if _mask_works(asker, known):  # a mask of all-attend: the path where scores * mask goes
        options["mask"] = _mask_arg(np.ones((4, 4), dtype=bool), known.mask, asker.mask_kind)
    out = asker.ask(q, k, eye_values(4), fatal=False, **options)
    if isinstance(out, str):
        return Decision("zero_scores", NA, "kept", out), []
    w0 = out[:, :, -1, 0]  # the last query's weight of key 0 (its score is 0)
    found = "kept" if (w0 > 0).all() else "masked"
    evidence = f"last query's scores [0, 1, -1, 0.5], nothing masked: weights {_row(out[0, 0, -1])}"
    decision = Decision("zero_scores", found, "kept", evidence)
    return _decided(decision, "zero_scores_masked")


def _random(batch: int, seed: int = 3) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Random q, k, v (batch, 2, 5, 8)."""
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(batch, H, 5, 8)),
        rng.normal(size=(batch, H, 5, 8)),
        rng.normal(size=(batch, H, 5, 8)),
    )


def probe_calls(asker: Asker, known: Known) -> tuple[Decided, list[Finding]]:
    """Two calls with the same random inputs: equal (deterministic), and equal to the reference
    with the conventions found (else a difference no convention explains)."""
    q, k, v = _random(B)
    first = asker.ask(q, k, v, causal=False)
    second = asker.ask(q, k, v, causal=False)
    assert not isinstance(first, str) and not isinstance(second, str)
    same = bool(np.array_equal(first, second, equal_nan=True))
    worst = float(np.nanmax(np.abs(first - second), initial=0.0))
    evidence = f"fn(q[2,2,5,8], k, v) twice: max |difference| {worst:.3g}"
    decision = Decision("deterministic", same, True, evidence)
    return _decided(decision, "not_deterministic"), _unexplained(
        first, (q, k, v), known, asker.dtype
    )


def _unexplained(
    out: FloatArray, qkv: tuple[FloatArray, ...], known: Known, dtype: str
) -> list[Finding]:
    """The output of random inputs against the reference with the scale and causal mask found."""
    if known.causal == "other":
        return []
    d = qkv[0].shape[-1]
    scale = _scale_value(known.scale, d) or 1 / math.sqrt(d)  # not found: the reference's
    q, k, v = (a.astype(dtype).astype(np.float64) for a in qkv)
    hidden = own_hidden(known.causal, q.shape[-2], k.shape[-2])
    expected = sdpa(q, k, v, allowed=~hidden, scale=scale)[0]
    tol = 1e-9 if dtype == "float64" else 1e-4
    if np.allclose(out, expected, rtol=tol, atol=tol):
        return []
    gap = np.abs(out - expected)
    worst = "nan" if np.isnan(gap).any() else f"{gap.max():.3g}"
    used = known.scale if _scale_value(known.scale, d) is not None else "1/sqrt(d)"
    evidence = (
        f"fn(q[2,2,5,8], k, v) random: max |difference| {worst} from the reference "
        f"with scale {used}, causal {known.causal}"
    )
    return [_finding("output_differs", evidence)]


def probe_batch(asker: Asker) -> Decided:
    """Three batch items, then the middle one alone: its output must not change."""
    q, k, v = _random(3, seed=5)
    together = asker.ask(q, k, v, causal=False)
    alone = asker.ask(q[1:2], k[1:2], v[1:2], causal=False)
    assert not isinstance(together, str) and not isinstance(alone, str)
    tol = 1e-9 if asker.dtype == "float64" else 1e-5
    same = bool(np.allclose(together[1:2], alone, rtol=tol, atol=tol, equal_nan=True))
    worst = float(np.nanmax(np.abs(together[1:2] - alone), initial=0.0))
    evidence = f"item 1 of q[3,2,5,8] vs q[1,2,5,8] alone: max |difference| {worst:.3g}"
    decision = Decision("batch_independent", same, True, evidence)
    return _decided(decision, "batch_dependent")


def probe_window(asker: Asker) -> Decided:
    """window=3 (causal on if taken), seq 6, v = I: the keys the last two queries see."""
    if "window" not in asker.takes:
        return Decision("window", NA, NA, "fn takes no window"), []
    T = 6
    rng = np.random.default_rng(17)
    q, k = rng.normal(size=(B, H, T, T)) * 0.5, rng.normal(size=(B, H, T, T)) * 0.5
    out = asker.ask(q, k, eye_values(T), window=WINDOW, causal=True, fatal=False)
    if isinstance(out, str):
        return Decision("window", NA, "W-keys", out), []
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    causal = j <= i
    rules = [
        ("W-keys", causal & (i - j < WINDOW)),
        ("W+1-keys", causal & (i - j < WINDOW + 1)),
        ("ignored", causal),
        ("ignored", np.ones((T, T), dtype=bool)),
    ]
    seen = ~_hidden(out)[:, :, WINDOW + 1 :]  # rows 4 and 5 tell W, W+1 and causal apart
    found = next(
        (
            label
            for label, allowed in rules
            if np.array_equal(seen, np.broadcast_to(allowed[WINDOW + 1 :], seen.shape))
        ),
        "other",
    )
    evidence = (
        f"window={WINDOW}, seq 6 (v = I): query 5's weights {_row(out[0, 0, -1])}, "
        f"reference sees keys 3, 4, 5"
    )
    decision = Decision("window", found, "W-keys", evidence)
    ids = {"W+1-keys": "window_off_by_one", "ignored": "window_ignored"}
    return _decided(decision, ids.get(found, "window_other"))


# ---------------------------------------------------------------------------------------------
# The door


def probe(
    fn: Callable[..., Any],
    *,
    target: str | None = None,
    framework: str = "numpy",
    dtype: str = "float64",
    mask: str = "bool",
    timeout: float = 10.0,
) -> ProbeReport:
    """Ask ``fn(q, k, v, **options)`` which conventions it follows; a ProbeError when it cannot
    be asked at all (it raises, hangs or returns no array of the right shape on plain inputs).

    ``framework`` "torch" passes torch tensors (float64, or ``dtype``) and reads tensors back;
    ``mask`` "additive" passes a float mask (0 attends, -inf hidden) instead of a bool one.
    Each call is abandoned after ``timeout`` seconds (see io/target.py).
    """
    _check_settings(framework, dtype, mask, timeout)
    name = target or getattr(fn, "__qualname__", None) or repr(fn)
    asker = Asker(fn, name, framework, dtype, timeout, options_taken(fn), mask_kind=mask)
    _first_call(asker)
    decided: dict[str, Decided] = {}
    decided["scale"] = probe_scale(asker)
    decided["causal"] = probe_causal(asker)
    decided["softmax_axis"] = probe_softmax_axis(asker)
    known = Known(decided["scale"][0].found, _own_causal(asker, decided["causal"][0]))
    decided["mask"] = probe_mask(asker, known)
    known = Known(known.scale, known.causal, decided["mask"][0].found)
    decided["empty_row"] = probe_empty_row(asker, known)
    decided["gqa"] = probe_gqa(asker)
    decided["large_logits"] = probe_large_logits(asker, known)
    decided["zero_scores"] = probe_zero_scores(asker, known)
    decided["deterministic"], unexplained = probe_calls(asker, known)
    decided["batch_independent"] = probe_batch(asker)
    decided["window"] = probe_window(asker)
    findings = [f for n in CONVENTIONS for f in decided[n][1]]
    if asker.mutated:
        findings.append(_finding("mutates_inputs", "; ".join(asker.mutated.values())))
    if decided["softmax_axis"][0].found == "keys":  # the check runs softmax over the keys
        findings += unexplained  # a difference the conventions found do not explain
    return ProbeReport(
        name,
        tuple(decided[n][0] for n in CONVENTIONS),
        tuple(findings),
        asker.takes,
        framework,
        dtype,
    )


def probe_target(target: str, **settings: Any) -> ProbeReport:
    """Load TARGET (``file.py:function`` or ``module:function``; the file runs) and probe it."""
    timeout = settings.get("timeout", 10.0)
    _check_settings(
        settings.get("framework", "numpy"),
        settings.get("dtype", "float64"),
        settings.get("mask", "bool"),
        timeout,
    )
    return probe(load(target, timeout=timeout), target=target, **settings)


def _own_causal(asker: Asker, causal: Decision) -> Value:
    """What the function hides when not asked to be causal (probes then pass causal=False)."""
    return "none" if "causal" in asker.takes else causal.found


def _first_call(asker: Asker) -> None:
    """Plain random inputs: an array of the right shape, not nan everywhere, else trouble."""
    q, k, v = _random(B)
    out = asker.ask(q, k, v, causal=False)
    assert not isinstance(out, str)
    if np.isnan(out).all():
        raise ProbeError(
            asker.source, "fn(q[2,2,5,8], k, v)", "returned nan in every cell", "numbers"
        )


def _check_settings(framework: str, dtype: str, mask: str, timeout: float) -> None:
    asked = (
        ("framework", framework, FRAMEWORKS),
        ("dtype", dtype, DTYPES),
        ("mask", mask, MASK_KINDS),
    )
    for option, value, choices in asked:
        if value not in choices:
            raise UsageError("", option, f"got {value!r}", " or ".join(choices), option=option)
    if not (isinstance(timeout, int | float) and 0 < timeout <= MAX_TIMEOUT):
        raise UsageError(
            "",
            "timeout",
            f"got {timeout!r}",
            f"seconds, more than 0 and at most {MAX_TIMEOUT:g}",
            option="timeout",
        )
    if framework == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise UsageError(
                "",
                "framework",
                "torch is not installed",
                "pip install torch, or numpy",
                option="framework",
            ) from None
