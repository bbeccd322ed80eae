"""``attn_cli.probe``: each convention decided on implementations written here.

The functions under probe are this file's: a loop reference (plain Python loops over batch,
head, query and key, PyTorch SDPA's semantics read off its documentation), and ``student``, a
vectorised attention with one planted mistake switched on at a time. Neither shares code with
attn. The expected conventions come from how each function was written, not from attn.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_cli.check.probe import CONVENTIONS, OPTIONS, probe
from attn_cli.errors import ProbeError, UsageError

Array = np.ndarray[Any, Any]


def loop_reference(
    q: Array,
    k: Array,
    v: Array,
    causal: bool = False,
    mask: Array | None = None,
    window: int | None = None,
    scale: float | None = None,
) -> Array:
    """SDPA, one number at a time: upper-left causal, True attends, empty rows zero, GQA
    interleaved; a window of W keys, the query included, causal."""
    B, H, T, D = q.shape
    Hk, S, Dv = k.shape[1], k.shape[2], v.shape[3]
    c = 1 / math.sqrt(D) if scale is None else scale
    out = np.zeros((B, H, T, Dv))
    for b in range(B):
        for h in range(H):
            g = h // (H // Hk)  # the kv head of query head h
            for i in range(T):
                logits = []
                for j in range(S):
                    ok = not ((causal or window is not None) and j > i)
                    ok = ok and not (window is not None and i - j >= window)
                    ok = ok and (mask is None or bool(mask[b, min(h, mask.shape[1] - 1), i, j]))
                    if ok:
                        dot = sum(float(q[b, h, i, t]) * float(k[b, g, j, t]) for t in range(D))
                        logits.append((j, dot * c))
                if not logits:
                    continue  # every key masked: zeros
                top = max(x for _, x in logits)
                weights = [(j, math.exp(x - top)) for j, x in logits]
                total = sum(w for _, w in weights)
                for j, w in weights:
                    out[b, h, i] += w / total * v[b, g, j]
    return out


def student(**bug: Any) -> Callable[..., Array]:
    """Vectorised attention; each keyword plants one mistake (see the branches)."""
    rng = np.random.default_rng(0)

    def fn(
        q: Array,
        k: Array,
        v: Array,
        causal: bool = False,
        mask: Array | None = None,
        window: int | None = None,
        scale: float | None = None,
    ) -> Array:
        heads, T, D = q.shape[1:]
        kv_heads, S = k.shape[1], k.shape[2]
        if kv_heads != heads:
            if bug.get("gqa") == "refuse":
                raise ValueError(f"q has {heads} heads, k has {kv_heads}")
            group = heads // kv_heads
            tiled = bug.get("gqa") == "tile"
            idx = [h % kv_heads if tiled else h // group for h in range(heads)]
            k, v = k[:, idx], v[:, idx]
        c = {"d": 1 / D, "one": 1.0, "const": 0.125}.get(bug.get("scale", ""), 1 / math.sqrt(D))
        if scale is not None and not bug.get("scale_ignored"):
            c = scale
        s = q @ k.swapaxes(-1, -2) * c  # (B, H, T, S)
        i, j = np.arange(T)[:, None], np.arange(S)[None, :]
        allowed = np.ones((q.shape[0], heads, T, S), dtype=bool)
        rule = {"lower-right": j <= i + (S - T), "diagonal": j < i, "ignored": j < S}
        if causal or bug.get("always_causal"):
            allowed &= rule.get(bug.get("causal", ""), j <= i)
        if window is not None and not bug.get("window_ignored"):
            allowed &= (j <= i) & (i - j < window + bug.get("window_extra", 0))
        if mask is not None and bug.get("additive"):
            s = s + mask  # 0 attends, -inf hidden
        elif mask is not None and not bug.get("mask_ignored"):
            allowed &= ~mask if bug.get("mask_inverted") else mask.astype(bool)
        if bug.get("zero_fill"):
            s = s * allowed
            s = np.where(s == 0, -np.inf, s)
        else:
            s = np.where(allowed, s, -1e9 if bug.get("sentinel") else -np.inf)
        axis = -2 if bug.get("axis_queries") else -1
        top = 0.0 if bug.get("no_max") else np.max(s, axis=axis, keepdims=True)
        e = np.exp(s - top)
        w = e / e.sum(axis=axis, keepdims=True)
        if not bug.get("nan_rows") and not bug.get("no_max"):
            w = np.where(np.isnan(w), 0.0, w)  # a row of -inf: zeros, as SDPA
        if bug.get("dropout"):
            w = w * (rng.random(w.shape) > 0.1) / 0.9
        out: Array = w @ v
        if bug.get("batch_norm"):
            out = out - out.mean(axis=0, keepdims=True)
        if bug.get("mutate"):
            q *= 2.0
        return out

    return fn


def conventions(fn: Callable[..., Any], **options: Any) -> dict[str, Any]:
    return probe(fn, **options).conventions


REFERENCE = {
    "scale": "1/sqrt(d)",
    "causal": "upper-left",
    "mask": "true-attends",
    "empty_row": "zeros",
    "gqa": "repeat-interleave",
    "softmax_axis": "keys",
    "large_logits": "stable",
    "zero_scores": "kept",
    "deterministic": True,
    "batch_independent": True,
    "window": "W-keys",
}


def test_the_loop_reference_matches_on_every_convention() -> None:
    report = probe(loop_reference)
    assert report.conventions == REFERENCE
    assert report.verdict == "matches" and report.findings == ()
    assert list(report.as_json()) == ["target", "verdict", "conventions", "findings"]
    assert list(report.as_json()["conventions"]) == list(CONVENTIONS)


def test_the_correct_student_matches() -> None:
    report = probe(student())
    assert report.conventions == REFERENCE, report.findings
    assert report.verdict == "matches"


# one planted mistake -> (the convention, the value found, the finding's id)
PLANTED = [
    ({"scale": "d"}, "scale", "1/d", "scaled_by_d_k"),
    ({"scale": "one"}, "scale", "1", "no_scaling"),
    ({"scale": "const"}, "scale", 0.125, "scale_constant"),
    ({"scale_ignored": True}, "scale", "1/sqrt(d)", "scale_option_ignored"),
    ({"causal": "lower-right"}, "causal", "lower-right", "causal_corner"),
    ({"causal": "diagonal"}, "causal", "diagonal-excluded", "causal_shifted"),
    ({"causal": "ignored"}, "causal", "ignored", "causal_missing"),
    ({"mask_inverted": True}, "mask", "true-blocks", "mask_inverted"),
    ({"mask_ignored": True}, "mask", "ignored", "mask_ignored"),
    ({"sentinel": True}, "empty_row", "uniform", "mask_finite_sentinel"),
    ({"nan_rows": True}, "empty_row", "nan", "empty_row_nan"),
    ({"gqa": "tile"}, "gqa", "tile", "gqa_tiled"),
    ({"axis_queries": True}, "softmax_axis", "queries", "softmax_wrong_axis"),
    ({"no_max": True}, "large_logits", "overflow", "no_max_subtraction"),
    ({"zero_fill": True}, "zero_scores", "masked", "zero_scores_masked"),
    ({"dropout": True}, "deterministic", False, "not_deterministic"),
    ({"batch_norm": True}, "batch_independent", False, "batch_dependent"),
    ({"window_extra": 1}, "window", "W+1-keys", "window_off_by_one"),
    ({"window_ignored": True}, "window", "ignored", "window_ignored"),
    ({"mutate": True}, "deterministic", True, "mutates_inputs"),
]


@pytest.mark.parametrize(("bug", "name", "value", "finding"), PLANTED, ids=[p[3] for p in PLANTED])
def test_a_planted_mistake_is_found_and_named(
    bug: dict[str, Any], name: str, value: Any, finding: str
) -> None:
    report = probe(student(**bug))
    assert report.conventions[name] == value
    assert report.verdict == "differs"
    assert finding in [f.id for f in report.findings]


def test_refusing_gqa_is_no_difference() -> None:
    report = probe(student(gqa="refuse"))
    assert report["gqa"].found == "refused"
    assert "q has 4 heads, k has 2" in report["gqa"].evidence
    assert report.verdict == "matches"


def with_signature(fn: Callable[..., Array], takes: list[str]) -> Callable[..., Array]:
    """``fn`` as a function whose signature names only the options in ``takes``."""

    def wrapped(q: Array, k: Array, v: Array, **options: Any) -> Array:
        return fn(q, k, v, **options)

    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in "qkv"]
    params += [inspect.Parameter(o, inspect.Parameter.KEYWORD_ONLY, default=None) for o in takes]
    wrapped.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return wrapped


@settings(max_examples=12, deadline=None)
@given(
    takes=st.lists(st.sampled_from(OPTIONS), unique=True),
    dtype=st.sampled_from(["float64", "float32"]),
    additive=st.booleans(),
    own_causal=st.booleans(),
    refuse_gqa=st.booleans(),
)
def test_a_correct_function_is_never_reported_as_differing(
    takes: list[str], dtype: str, additive: bool, own_causal: bool, refuse_gqa: bool
) -> None:
    """Whatever options it takes, in float32 or float64, with an additive or a bool mask, causal
    on its own or not, with or without GQA: a correct function matches."""
    own_causal = own_causal and "causal" not in takes
    fn = student(additive=additive, always_causal=own_causal, gqa="refuse" if refuse_gqa else "")
    report = probe(with_signature(fn, takes), dtype=dtype, mask="additive" if additive else "bool")
    assert report.verdict == "matches", report.findings
    assert report.conventions["causal"] == (
        "upper-left" if own_causal or "causal" in takes else "none"
    )
    assert report.conventions["window"] == ("W-keys" if "window" in takes else "n/a")
    assert report.conventions["empty_row"] == ("zeros" if "mask" in takes else "n/a")


@pytest.mark.parametrize(
    ("setting", "value", "expected"),
    [
        ("timeout", 0, "more than 0"),
        ("timeout", math.nan, "more than 0"),
        ("timeout", 2.0**63, "at most 3600"),
        ("timeout", -1.0, "more than 0"),
        ("framework", "jax", "numpy or torch"),
        ("dtype", "float16", "float64 or float32"),
        ("mask", "float", "bool or additive"),
    ],
)
def test_a_hostile_setting_is_a_usage_error(setting: str, value: Any, expected: str) -> None:
    with pytest.raises(UsageError, match=expected) as caught:
        probe(student(), **{setting: value})
    assert caught.value.option == setting


def test_trouble_on_plain_inputs_is_a_probe_error_naming_the_call() -> None:
    def broken(q: Array, k: Array, v: Array) -> Array:
        first: Array = q[0]
        return first

    with pytest.raises(ProbeError, match=r"fn\(q\[2,2,5,8\], k\[2,2,5,8\]\): returned shape"):
        probe(broken)


def test_attns_reference_probed_has_the_conventions_of_torchs_sdpa() -> None:
    """tests/reference/probe_sdpa.json: torch's SDPA probed (made by probe_sdpa.py with torch
    2.13); attn's own reference, wrapped the same way, must be read the same."""
    from conftest import TESTS

    from attn_cli.check.probe import reference

    def sdpa(
        q: Array,
        k: Array,
        v: Array,
        causal: bool = False,
        mask: Array | None = None,
        scale: float | None = None,
    ) -> Array:
        out: Array = reference(q, k, v, causal=causal, allowed=mask, scale=scale)
        return out

    committed = json.loads((TESTS / "reference" / "probe_sdpa.json").read_text())
    report = probe(sdpa)
    assert report.conventions == committed["conventions"]
    assert report.verdict == committed["verdict"] == "matches"


@pytest.mark.slow
def test_the_pytest_fixture_reports_and_asserts() -> None:
    """The plugin's ``attn_probe``: the report, and a failure listing each finding (its
    registration as a fixture: tests/check/test_pytest_plugin.py)."""
    from attn_cli.pytest_plugin import AttnProbe

    attn_probe = AttnProbe()
    assert attn_probe(student()).verdict == "matches"
    attn_probe.assert_matches(student(), dtype="float32")
    with pytest.raises(pytest.fail.Exception, match=r"- scaled_by_d_k: scaled by d_k") as failed:
        attn_probe.assert_matches(student(scale="d"))
    assert "differs from PyTorch SDPA" in str(failed.value)
    with pytest.raises(pytest.fail.Exception, match=r"attn_probe: .*returned shape"):
        attn_probe(lambda q, k, v: q[0])


@pytest.mark.slow
def test_every_finding_has_a_title_an_explanation_and_chinese() -> None:
    """The catalogue's ids exist there (with their Chinese); the probe's own have theirs."""
    import attn_cli.check.mistakes  # noqa: F401 - registers the catalogue
    from attn_cli.check.mistake import ZH, every_mistake
    from attn_cli.check.probe import FROM_CATALOGUE, PROBE_TITLES, finding_title
    from attn_cli.present.probe_view import EXPLAIN_EN, PROBE_ZH, zh_texts

    catalogue = {m.name: m.title for m in every_mistake()}
    for finding_id in FROM_CATALOGUE:
        assert finding_title(finding_id) == catalogue[finding_id]
        assert zh_texts(finding_id) == ZH[finding_id]
    assert set(PROBE_TITLES) == set(PROBE_ZH) and not set(PROBE_TITLES) & set(catalogue)
    assert set(EXPLAIN_EN) == set(FROM_CATALOGUE) | set(PROBE_TITLES)
    planted = {p[3] for p in PLANTED}
    assert planted <= set(EXPLAIN_EN)


def test_a_difference_no_convention_explains_is_still_a_finding() -> None:
    """K used where V is meant: no weight can be read (scale n/a), every convention else looks
    right, yet the random output is not SDPA's."""

    def k_for_v(q: Array, k: Array, v: Array) -> Array:
        return student()(q, k, k)

    report = probe(k_for_v)
    assert report.verdict == "differs"
    found = {f.id: f.evidence for f in report.findings}
    assert report.conventions["scale"] == "n/a"
    assert "with scale 1/sqrt(d), causal none" in found["output_differs"]


def test_refused_and_not_asked_are_no_differences() -> None:
    from attn_cli.check.probe import Decision

    assert not Decision("gqa", "refused", "repeat-interleave", "").differs
    assert not Decision("mask", "n/a", "true-attends", "").differs
    assert not Decision("window", "W-keys", "n/a", "").differs
    assert Decision("gqa", "tile", "repeat-interleave", "").differs


@settings(max_examples=25, deadline=None)
@given(
    shape=st.tuples(
        st.integers(1, 2),
        st.sampled_from([(1, 1), (2, 1), (4, 2), (3, 3)]),
        st.integers(1, 4),
        st.integers(1, 5),
        st.integers(1, 4),
        st.integers(1, 3),
    ),
    causal=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 4)),
    masked=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_the_probes_reference_is_the_loop_reference_on_random_shapes(
    shape: tuple[int, tuple[int, int], int, int, int, int],
    causal: bool,
    window: int | None,
    masked: bool,
    seed: int,
) -> None:
    """What the probe compares against (check.probe.reference) is SDPA's semantics as the loop
    above reads them: any batch, heads (GQA), seq_q, seq_k, d and d_v, causal, window, mask."""
    from attn_cli.check.probe import reference

    B, (heads, kv_heads), T, S, D, Dv = shape
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(B, heads, T, D)), rng.normal(size=(B, kv_heads, S, D))
    v = rng.normal(size=(B, kv_heads, S, Dv))
    mask = rng.random((B, 1, T, S)) < 0.7 if masked else None
    ours = reference(q, k, v, causal=causal, allowed=mask, window=window)
    loop = loop_reference(q, k, v, causal=causal, mask=mask, window=window)
    np.testing.assert_allclose(ours, loop, rtol=1e-12, atol=1e-12)
