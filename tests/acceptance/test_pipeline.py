"""The pipeline against numbers from independent sources: hand-worked examples, published
worked examples, and the slow loop-based reference in ``reference.py``."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest
from conftest import Tolerance
from reference import random_fixture, reference, reference_empty_rows

from attn_cli.core.pipeline import Trace, run
from attn_cli.errors import ComputeError
from attn_cli.io.fixture import validate

E = math.e
NEG_INF = -np.inf

# Hand-derived expectations are exact formulas, so they are compared at float64 precision.
HAND: Tolerance = {"rtol": 1e-12, "atol": 1e-15}
# Values printed in a publication to 4 decimals are compared at half a unit of the last digit.
PRINTED_4DP: Tolerance = {"rtol": 0, "atol": 5e-5}
# The loop reference sums with math.fsum; NumPy's matmul reorders sums, so allow a few ulps
# plus an absolute floor for entries that cancel to near zero.
REFERENCE: Tolerance = {"rtol": 1e-12, "atol": 1e-12}


def trace_of(fx: dict[str, Any]) -> Trace:
    return run(validate(fx, "test.json"))


# ---------------------------------------------------------------------------------------------
# The source article's second example (direct mode, Q = K, unscaled)

ARTICLE_Q = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
ARTICLE_V = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]


def test_article_second_example() -> None:
    trace = trace_of({"Q": ARTICLE_Q, "K": ARTICLE_Q, "V": ARTICLE_V, "scale": 1})

    # scores = Q Kᵀ: row i, column j is the dot product of rows i and j of Q.
    scores = [[1, 0, 1], [0, 1, 1], [1, 1, 2]]
    np.testing.assert_allclose(trace["scores"].data, [scores], **HAND)  # (heads=1, seq, seq)
    np.testing.assert_allclose(trace["scaled"].data, [scores], **HAND)  # scale 1
    assert "masked" not in trace and "concat" not in trace and "X" not in trace

    # softmax rows, by hand:
    #   [1, 0, 1] -> [e, 1, e] / (2e + 1)
    #   [0, 1, 1] -> [1, e, e] / (2e + 1)
    #   [1, 1, 2] -> [e, e, e²] / (2e + e²) = [1, 1, e] / (2 + e)
    a, b = E / (2 * E + 1), 1 / (2 * E + 1)
    c, d = 1 / (2 + E), E / (2 + E)
    weights = np.array([[a, b, a], [b, a, a], [c, c, d]])
    np.testing.assert_allclose(trace["softmax"].data, [weights], **HAND)

    # The same rows as printed to 4 decimals.
    printed = [[0.4223, 0.1554, 0.4223], [0.1554, 0.4223, 0.4223], [0.2119, 0.2119, 0.5761]]
    np.testing.assert_allclose(trace["softmax"].data, [printed], **PRINTED_4DP)

    # The article printed row 2 as [0.21, 0.39, 0.39], which is not softmax([0, 1, 1]);
    # we must not reproduce it.
    wrong_row = np.array([0.21, 0.39, 0.39])
    assert not np.allclose(trace["softmax"].data[0, 1], wrong_row, atol=0.01)

    # output row i = sum_j w[i, j] V[j], with V of our choosing.
    V = np.array(ARTICLE_V)
    output = [[sum(weights[i, j] * V[j, k] for j in range(3)) for k in range(2)] for i in range(3)]
    np.testing.assert_allclose(trace["output"].data, [output], **HAND)  # (heads=1, seq, d_v)
    assert trace.scale == 1.0 and trace.scale_source == "fixture"


def test_illustrated_transformer_thinking_machines() -> None:
    """Jay Alammar, "The Illustrated Transformer": q1·k1 = 112, q1·k2 = 96, d_k = 64."""
    d_k = 64
    q = [[1.0] + [0.0] * (d_k - 1)]  # the query for "Thinking"
    k = [[112.0] + [0.0] * (d_k - 1), [96.0] + [0.0] * (d_k - 1)]  # "Thinking", "Machines"
    v = [[1.0, 0.0], [0.0, 1.0]]
    trace = trace_of({"Q": q, "K": k, "V": v, "key_tokens": ["Thinking", "Machines"]})

    np.testing.assert_allclose(trace["scores"].data, [[[112, 96]]], **HAND)
    # Default scale 1/sqrt(64) = 1/8: 112/8 = 14, 96/8 = 12.
    assert trace.scale == 0.125 and trace.scale_source == "default"
    np.testing.assert_allclose(trace["scaled"].data, [[[14, 12]]], **HAND)
    # softmax([14, 12]) = [1, e^-2] / (1 + e^-2)
    w1 = 1 / (1 + math.exp(-2))
    np.testing.assert_allclose(trace["softmax"].data, [[[w1, 1 - w1]]], **HAND)
    np.testing.assert_allclose(trace["softmax"].data, [[[0.8808, 0.1192]]], **PRINTED_4DP)


# ---------------------------------------------------------------------------------------------
# Hand-worked masking


def test_causal_upper_left_by_hand() -> None:
    trace = trace_of({"Q": ARTICLE_Q, "K": ARTICLE_Q, "V": ARTICLE_V, "scale": 1, "causal": True})
    # scores as in the article example; query i may see keys j <= i.
    masked = [[1, NEG_INF, NEG_INF], [0, 1, NEG_INF], [1, 1, 2]]
    np.testing.assert_array_equal(trace["masked"].data, [masked])
    weights: list[list[float]] = [
        [1, 0, 0],  # only itself
        [1 / (1 + E), E / (1 + E), 0],  # softmax([0, 1])
        [1 / (2 + E), 1 / (2 + E), E / (2 + E)],  # softmax([1, 1, 2])
    ]
    np.testing.assert_allclose(trace["softmax"].data, [weights], **HAND)
    assert trace["softmax"].data[0, 0, 1] == 0.0 and trace["softmax"].data[0, 1, 2] == 0.0
    assert trace.empty_rows == ()


def test_causal_lower_right_by_hand() -> None:
    # Two new queries against three cached keys: query i sees keys j <= i + (3 - 2).
    q = [[0.0, 1.0], [1.0, 1.0]]
    trace = trace_of({"Q": q, "K": ARTICLE_Q, "V": ARTICLE_V, "scale": 1, "causal": "lower-right"})
    masked = [[0, 1, NEG_INF], [1, 1, 2]]
    np.testing.assert_array_equal(trace["masked"].data, [masked])
    weights = [[1 / (1 + E), E / (1 + E), 0], [1 / (2 + E), 1 / (2 + E), E / (2 + E)]]
    np.testing.assert_allclose(trace["softmax"].data, [weights], **HAND)

    # The same fixture with upper-left alignment: query i sees keys j <= i.
    trace = trace_of({"Q": q, "K": ARTICLE_Q, "V": ARTICLE_V, "scale": 1, "causal": "upper-left"})
    # query 0 sees key 0 only; query 1 sees keys 0, 1 with scores [1, 1]: equal weights.
    weights = [[1, 0, 0], [0.5, 0.5, 0]]
    np.testing.assert_allclose(trace["softmax"].data, [weights], **HAND)


def test_lengths_with_an_empty_item_by_hand() -> None:
    # Batch of 2 (layout [batch, seq, d]); item 0 has 2 valid keys, item 1 has none.
    fx = {
        "Q": [ARTICLE_Q, ARTICLE_Q],
        "K": [ARTICLE_Q, ARTICLE_Q],
        "V": [ARTICLE_V, ARTICLE_V],
        "scale": 1,
        "lengths": [2, 0],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning from -inf arithmetic
        trace = trace_of(fx)
    weights = trace["softmax"].data  # (batch, heads, query, key)
    # item 0: scores restricted to keys 0, 1: [1, 0], [0, 1], [1, 1]
    item0 = [[E / (1 + E), 1 / (1 + E), 0], [1 / (1 + E), E / (1 + E), 0], [0.5, 0.5, 0]]
    np.testing.assert_allclose(weights[0, 0], item0, **HAND)
    # item 1: nothing to attend to: weights exactly zero, output exactly zero, never NaN
    np.testing.assert_array_equal(weights[1], np.zeros((1, 3, 3)))
    np.testing.assert_array_equal(trace["output"].data[1], np.zeros((1, 3, 2)))
    assert np.all(np.isneginf(trace["masked"].data[1]))
    assert not np.isnan(weights).any() and not np.isnan(trace["output"].data).any()
    assert trace.empty_rows == ((1, 0, 0), (1, 0, 1), (1, 0, 2))
    # item 0, query 2: (0.5 V[0] + 0.5 V[1]) = [2, 3]
    np.testing.assert_allclose(trace["output"].data[0, 0, 2], [2, 3], **HAND)


def test_fully_masked_row_by_mask_and_by_bias() -> None:
    # Query 1 may attend nowhere (mask row all false); query 2's bias is -inf everywhere.
    mask = [[True, True, False], [False, False, False], [True, True, True]]
    bias = [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], ["-inf", "-inf", "-inf"]]
    fx = {"Q": ARTICLE_Q, "K": ARTICLE_Q, "V": ARTICLE_V, "scale": 1, "mask": mask, "bias": bias}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace = trace_of(fx)
    weights = trace["softmax"].data[0]
    np.testing.assert_allclose(weights[0], [E / (E + 1), 1 / (E + 1), 0], **HAND)
    np.testing.assert_array_equal(weights[1:], np.zeros((2, 3)))
    assert trace.empty_rows == ((0, 0, 1), (0, 0, 2))  # (batch, head, query)


# ---------------------------------------------------------------------------------------------
# Against the loop reference, on seeded random fixtures of every mode

CASES: dict[str, dict[str, Any]] = {
    # projection mode
    "proj-single": {},
    "proj-batch-qkv-bias": {"batch": 2, "qkv_bias": True},
    "proj-heads2": {"heads": 2, "d_model": 6},
    "proj-gqa-W_O-b_O": {"heads": 4, "kv_heads": 2, "W_O": True, "b_O": True, "batch": 2},
    "proj-mqa-causal": {"heads": 4, "kv_heads": 1, "causal": True, "seq": 4},
    "proj-W_O-no-b_O-heads1": {"W_O": True, "d_v": 3},
    "proj-scale-given": {"scale": 0.3, "heads": 2},
    "proj-lower-right-self": {"causal": "lower-right", "batch": 2, "heads": 2},
    "proj-lengths-batch": {"batch": 3, "lengths": [3, 1, 0], "heads": 2, "kv_heads": 1},
    "proj-lengths-scalar": {"lengths": 2},
    "proj-lengths-list-no-batch": {"lengths": [1]},
    "proj-big-values": {"magnitude": 30.0, "heads": 2},
    # direct mode, layout [seq, heads*d]
    "direct2-single": {"mode": "direct"},
    "direct2-heads-dv": {"mode": "direct", "heads": 3, "d_v": 1},
    "direct2-lower-right-cache": {"mode": "direct", "seq": 2, "seq_k": 5, "causal": "lower-right"},
    "direct2-upper-left-short-keys": {"mode": "direct", "seq": 4, "seq_k": 2, "causal": True},
    "direct2-lower-right-short-keys": {
        "mode": "direct",
        "seq": 4,
        "seq_k": 2,
        "causal": "lower-right",
    },
    "direct2-mask-2d": {"mode": "direct", "mask": (3, 3)},
    "direct2-mask-scalar": {"mode": "direct", "mask": ()},
    "direct2-bias-scalar": {"mode": "direct", "bias": ()},
    "direct2-bias-row-neginf": {"mode": "direct", "bias": (4,), "seq_k": 4, "neg_inf_bias": True},
    # direct mode, layout [batch, seq, heads*d]
    "direct3-heads2-mask": {"mode": "direct", "layout": 3, "heads": 2, "mask": (2, 3, 3)},
    "direct3-gqa-bias-4d": {
        "mode": "direct",
        "layout": 3,
        "heads": 4,
        "kv_heads": 2,
        "bias": (2, 4, 3, 3),
    },
    "direct3-batch1-lengths": {"mode": "direct", "layout": 3, "batch": 1, "lengths": [2]},
    # direct mode, layout [batch, heads, seq, d]
    "direct4-heads": {"mode": "direct", "layout": 4, "heads": 2, "seq_k": 4},
    "direct4-gqa-W_O": {"mode": "direct", "layout": 4, "heads": 4, "kv_heads": 2, "W_O": True},
    "direct4-mask-key-padding": {"mode": "direct", "layout": 4, "heads": 2, "mask": (2, 1, 1, 3)},
    "direct4-mask-per-head": {"mode": "direct", "layout": 4, "heads": 2, "mask": (2, 1, 3)},
    # everything at once
    "all-projection": {
        "batch": 2,
        "heads": 4,
        "kv_heads": 2,
        "qkv_bias": True,
        "W_O": True,
        "b_O": True,
        "scale": 0.7,
        "causal": True,
        "mask": (1, 4, 3, 3),
        "bias": (3,),
        "neg_inf_bias": True,
        "lengths": [3, 2],
    },
    "all-direct": {
        "mode": "direct",
        "layout": 4,
        "batch": 3,
        "heads": 2,
        "kv_heads": 1,
        "seq": 3,
        "seq_k": 5,
        "d_v": 3,
        "W_O": True,
        "b_O": True,
        "causal": "lower-right",
        "mask": (3, 1, 3, 5),
        "bias": (2, 1, 5),
        "neg_inf_bias": True,
        "lengths": [5, 4, 1],
    },
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_loop_reference(case: str, seed: int) -> None:
    fx = random_fixture(1000 * seed + len(case), **CASES[case])
    expected = reference(fx)
    trace = trace_of(fx)
    assert list(trace.stages) == list(expected)  # the same stages, in pipeline order
    for name, want in expected.items():
        got = trace[name].data
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got, want, err_msg=name, **REFERENCE)
    assert trace.empty_rows == reference_empty_rows(fx)
    assert not np.isnan(trace["softmax"].data).any()


def test_cases_cover_every_mode() -> None:
    """Guard the table above: every feature appears in at least one case."""
    used = {key for kw in CASES.values() for key in kw}
    for key in ("batch", "heads", "kv_heads", "qkv_bias", "W_O", "b_O", "scale"):
        assert key in used
    for key in ("causal", "mask", "bias", "lengths", "seq_k", "neg_inf_bias"):
        assert key in used
    assert {kw.get("layout", 2) for kw in CASES.values() if kw.get("mode") == "direct"} == {2, 3, 4}
    assert {kw.get("causal") for kw in CASES.values()} >= {True, "lower-right"}


# ---------------------------------------------------------------------------------------------
# Overflow is an error naming the stage; large but finite scores are fine

OVERFLOW: dict[str, dict[str, Any]] = {
    "Q": {
        "X": [[1e200, 1e200]],
        "W_Q": [[1e200], [1.0]],
        "W_K": [[1.0], [1.0]],
        "W_V": [[1.0], [1.0]],
    },
    "scores": {"Q": [[1e200, 1.0]], "K": [[1e200, 1.0]], "V": [[1.0]]},
    "scaled": {"Q": [[1e154]], "K": [[1e154]], "V": [[1.0]], "scale": 1e10},
    "masked": {"Q": [[1e154]], "K": [[1e154]], "V": [[1.0]], "scale": 1, "bias": 1.7e308},
    # scaled + bias overflowing to -inf must not pass for "not allowed"
    "masked-neg": {
        "Q": [[-1e154]],
        "K": [[1e154], [1.0]],
        "V": [[1.0], [2.0]],
        "scale": 1,
        "bias": -1.7e308,
    },
    "projected": {"Q": [[1.0]], "K": [[1.0]], "V": [[1e200]], "W_O": [[1e200]]},
}


@pytest.mark.parametrize("stage", list(OVERFLOW))
def test_overflow_is_a_compute_error_naming_the_stage(stage: str) -> None:
    with pytest.raises(ComputeError) as info:
        trace_of(OVERFLOW[stage])
    err = info.value
    assert err.field.startswith(f"{stage.removesuffix('-neg')}["), err.field
    assert err.source == "test.json"
    assert "overflow" in str(err)


def test_projection_overflow_from_huge_embeddings() -> None:
    fx = {
        "X": [[1e200, 1e200], [1.0, 1.0]],
        "W_Q": [[1e200, 0.0], [0.0, 1.0]],
        "W_K": [[1.0, 0.0], [0.0, 1.0]],
        "W_V": [[1.0, 0.0], [0.0, 1.0]],
        "tokens": ["big", "small"],
    }
    with pytest.raises(ComputeError, match=r"Q\[query 0 'big'|Q\[batch 0, query 0 'big'"):
        trace_of(fx)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_scores_of_magnitude_1e4_do_not_overflow(sign: float) -> None:
    # scores [1e4, 1e4 - 100] (or their negatives); exp(1e4) alone would overflow.
    q = [[sign * 100.0]]
    k = [[100.0], [99.0]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace = trace_of({"Q": q, "K": k, "V": [[1.0], [2.0]], "scale": 1})
    np.testing.assert_allclose(trace["scaled"].data, [[[sign * 1e4, sign * 9900]]], **HAND)
    # softmax([s, s - 100]) = [1, e^-100] / (1 + e^-100); for -s it is [e^-100, 1] / (...)
    small = math.exp(-100) / (1 + math.exp(-100))
    want = [1 - small, small] if sign > 0 else [small, 1 - small]
    np.testing.assert_allclose(trace["softmax"].data, [[want]], rtol=1e-12, atol=0)
    assert np.isfinite(trace["output"].data).all()
