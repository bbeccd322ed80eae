"""The bundled examples in fixtures/, checked against numbers from independent sources.

Hand-worked values (in comments) for the two article examples; for the others a slow,
loop-based reference written here, which never calls attn_cli.core.pipeline.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES
from numpy.testing import assert_allclose

from attn_cli.core.pipeline import Trace, run
from attn_cli.io.fixture import load_fixture

ALL_FIXTURES = sorted([*FIXTURES.glob("*.yaml"), *FIXTURES.glob("*.json")])

E = math.e
RTOL = 1e-12  # reference and pipeline both compute in float64; only summation order differs
ATOL = 1e-12


def trace_of(name: str) -> Trace:
    return run(load_fixture(FIXTURES / name))


# ---------------------------------------------------------------------------------------------
# A slow reference: one query, one head at a time, with math.exp


def reference_head(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    allowed: Callable[[int, int], bool] = lambda i, j: True,
) -> tuple[np.ndarray, np.ndarray]:
    """Softmax weights (T, S) and output (T, Dv) of one head, by explicit loops."""
    T, S = q.shape[0], k.shape[0]
    weights = np.zeros((T, S))
    out = np.zeros((T, v.shape[1]))
    for i in range(T):
        logits = {j: scale * sum(q[i, d] * k[j, d] for d in range(q.shape[1])) for j in range(S)}
        logits = {j: x for j, x in logits.items() if allowed(i, j)}
        top = max(logits.values())
        exps = {j: math.exp(x - top) for j, x in logits.items()}
        total = sum(exps.values())
        for j, x in exps.items():
            weights[i, j] = x / total
            out[i] += weights[i, j] * v[j]
    return weights, out


def reference_projection(
    X: np.ndarray,
    W_Q: np.ndarray,
    W_K: np.ndarray,
    W_V: np.ndarray,
    heads: int,
    kv_heads: int,
    W_O: np.ndarray,
    b_O: np.ndarray | None = None,
    allowed: Callable[[int, int], bool] = lambda i, j: True,
) -> dict[str, np.ndarray]:
    """Projection-mode multi-head attention, head by head; arrays in the trace's layout."""
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V  # (T, heads*d), (T, kv_heads*d), (T, kv_heads*d)
    d_k = W_Q.shape[1] // heads
    d_v = W_V.shape[1] // kv_heads
    group = heads // kv_heads
    weights, outputs = [], []
    for h in range(heads):
        g = h // group  # the key/value head this query head reads
        q = Q[:, h * d_k : (h + 1) * d_k]
        k = K[:, g * d_k : (g + 1) * d_k]
        v = V[:, g * d_v : (g + 1) * d_v]
        w, o = reference_head(q, k, v, 1 / math.sqrt(d_k), allowed)
        weights.append(w)
        outputs.append(o)
    concat = np.hstack(outputs)  # (T, heads*d_v): head h in columns h*d_v:(h+1)*d_v
    projected = concat @ W_O + (0 if b_O is None else b_O)
    return {
        "softmax": np.array(weights),
        "output": np.array(outputs),
        "concat": concat,
        "projected": projected,
    }


# ---------------------------------------------------------------------------------------------
# Every bundled file


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: p.name)
def test_every_fixture_loads_and_is_labelled(path: Path) -> None:
    inputs = load_fixture(path)
    assert inputs.name.strip()
    assert inputs.description.strip()
    assert "\n" not in inputs.description.strip()
    assert inputs.tokens is not None
    assert len(inputs.tokens) == inputs.seq_q
    assert all(t.strip() for t in inputs.tokens)
    run(inputs)  # and traces without error or warning


def test_the_expected_examples_are_bundled() -> None:
    names = {p.stem for p in ALL_FIXTURES}
    assert {
        "the_cat_sat",
        "article_example_2",
        "pytorch_snippet",
        "causal_multihead",
        "grouped_query",
        "padding_batch",
    } <= names


# ---------------------------------------------------------------------------------------------
# The cat sat (the article's X and W_Q; W_K and W_V are attn's)


def test_the_cat_sat_by_hand() -> None:
    trace = trace_of("the_cat_sat.yaml")
    # Q = X W_Q: The [1,0,1,0] -> [2,0]; cat [0,2,0,2] -> [0,4]; sat [1,1,1,1] -> [2,2]
    assert_allclose(trace["Q"].data[0], [[2, 0], [0, 4], [2, 2]], rtol=0, atol=0)
    # K = X W_K: The -> [0,1]; cat -> [4,2]; sat -> [2,2]
    assert_allclose(trace["K"].data[0], [[0, 1], [4, 2], [2, 2]], rtol=0, atol=0)
    # V = X W_V: The -> [2,1]; cat -> [0,2]; sat -> [2,2]
    assert_allclose(trace["V"].data[0], [[2, 1], [0, 2], [2, 2]], rtol=0, atol=0)
    # scores = Q Kᵀ, e.g. The·cat = [2,0]·[4,2] = 8, sat·cat = [2,2]·[4,2] = 12
    scores = np.array([[0, 8, 4], [4, 8, 8], [2, 12, 8]], dtype=float)
    assert_allclose(trace["scores"].data[0], scores, rtol=0, atol=0)
    # default scale 1/sqrt(d_k) = 1/sqrt(2)
    assert trace.scale_source == "default"
    assert_allclose(trace.scale, 1 / math.sqrt(2), rtol=1e-15)
    assert_allclose(trace["scaled"].data[0], scores / math.sqrt(2), rtol=1e-15)
    # softmax row by row with math.exp, then output = weights · V
    weights = np.array([[math.exp(s / math.sqrt(2)) for s in row] for row in scores])
    weights /= weights.sum(axis=1, keepdims=True)
    assert_allclose(trace["softmax"].data[0], weights, rtol=RTOL, atol=ATOL)
    V = np.array([[2, 1], [0, 2], [2, 2]], dtype=float)
    assert_allclose(trace["output"].data[0], weights @ V, rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------------------------------------
# Article example 2 (Q = K = [[1,0],[0,1],[1,1]], unscaled; V = the same vectors, attn's choice)


def test_article_example_2_by_hand() -> None:
    trace = trace_of("article_example_2.yaml")
    assert trace.scale == 1
    assert trace.scale_source == "fixture"
    # scores = Q Kᵀ, as printed in the article
    scores = [[1, 0, 1], [0, 1, 1], [1, 1, 2]]
    assert_allclose(trace["scores"].data[0], scores, rtol=0, atol=0)
    assert_allclose(trace["scaled"].data[0], scores, rtol=0, atol=0)
    softmax = trace["softmax"].data[0]
    # row 1: softmax([1,0,1]) = [e, 1, e] / (2e + 1)
    assert_allclose(softmax[0], [0.4223, 0.1554, 0.4223], rtol=0, atol=5e-5)
    # row 2: softmax([0,1,1]) = [1, e, e] / (2e + 1); the article's [0.21, 0.39, 0.39] is wrong
    assert_allclose(softmax[1], [0.1554, 0.4223, 0.4223], rtol=0, atol=5e-5)
    assert not np.allclose(softmax[1], [0.21, 0.39, 0.39], rtol=0, atol=5e-3)
    # row 3: softmax([1,1,2]) = [1, 1, e] / (e + 2), which the article gets right
    assert_allclose(softmax[2], [0.2119, 0.2119, 0.5761], rtol=0, atol=5e-5)
    # the same rows in closed form
    assert_allclose(
        softmax,
        [
            [E / (2 * E + 1), 1 / (2 * E + 1), E / (2 * E + 1)],
            [1 / (2 * E + 1), E / (2 * E + 1), E / (2 * E + 1)],
            [1 / (E + 2), 1 / (E + 2), E / (E + 2)],
        ],
        rtol=1e-14,
    )
    # output = softmax · V with V = [[1,0],[0,1],[1,1]] (attn's choice):
    #   row 1: (e·[1,0] + 1·[0,1] + e·[1,1]) / (2e+1) = [2e, e+1] / (2e+1) = [0.8446, 0.5777]
    #   row 2: (1·[1,0] + e·[0,1] + e·[1,1]) / (2e+1) = [e+1, 2e] / (2e+1) = [0.5777, 0.8446]
    #   row 3: (1·[1,0] + 1·[0,1] + e·[1,1]) / (e+2)  = [e+1, e+1] / (e+2) = [0.7881, 0.7881]
    output = trace["output"].data[0]
    assert_allclose(output, [[0.8446, 0.5777], [0.5777, 0.8446], [0.7881, 0.7881]], atol=5e-5)
    assert_allclose(
        output,
        [
            [2 * E / (2 * E + 1), (E + 1) / (2 * E + 1)],
            [(E + 1) / (2 * E + 1), 2 * E / (2 * E + 1)],
            [(E + 1) / (E + 2), (E + 1) / (E + 2)],
        ],
        rtol=1e-14,
    )


# ---------------------------------------------------------------------------------------------
# The article's PyTorch snippet (seeded random; scaled by default, unlike the article)


def test_pytorch_snippet_is_the_seeded_data() -> None:
    inputs = load_fixture(FIXTURES / "pytorch_snippet.yaml")
    rng = np.random.default_rng(0)
    for name in ("Q", "K", "V"):  # drawn in this order, see fixtures/README.md
        expected = rng.standard_normal((2, 5, 64)).round(4)  # (batch, seq, d)
        assert_allclose(getattr(inputs, name)[:, 0], expected, rtol=0, atol=0)


def test_pytorch_snippet_against_reference() -> None:
    trace = trace_of("pytorch_snippet.yaml")
    inputs = trace.inputs
    assert inputs.has_batch
    assert (inputs.batch, inputs.heads, inputs.seq_q, inputs.d_k) == (2, 1, 5, 64)
    assert trace.scale_source == "default"
    assert trace.scale == 0.125  # 1/sqrt(64), which the article leaves out
    assert trace["softmax"].shape == (2, 1, 5, 5)
    for b in range(2):
        q, k, v = (getattr(inputs, name)[b, 0] for name in ("Q", "K", "V"))  # (5, 64)
        scores = np.einsum("td,sd->ts", q, k)  # torch.bmm(Q, K.transpose(1, 2))
        assert_allclose(trace["scores"].data[b, 0], scores, rtol=1e-12, atol=1e-12)
        weights, out = reference_head(q, k, v, 0.125)
        assert_allclose(trace["softmax"].data[b, 0], weights, rtol=RTOL, atol=ATOL)
        assert_allclose(trace["output"].data[b, 0], out, rtol=1e-11, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Causal multi-head with W_O


def test_causal_multihead_against_reference() -> None:
    trace = trace_of("causal_multihead.yaml")
    i = trace.inputs
    assert i.X is not None and i.W_Q is not None and i.W_K is not None and i.W_V is not None
    assert i.W_O is not None
    assert (i.heads, i.causal, i.seq_q) == (2, "upper-left", 4)
    ref = reference_projection(
        i.X[0], i.W_Q, i.W_K, i.W_V, 2, 2, i.W_O, i.b_O, allowed=lambda q, k: k <= q
    )
    for stage in ("softmax", "output", "concat", "projected"):
        assert_allclose(trace[stage].data, ref[stage], rtol=RTOL, atol=ATOL, err_msg=stage)
    # a token never looks ahead: the strict upper triangle is exactly 0, for every head
    weights = trace["softmax"].data  # (heads, T, S)
    upper = np.triu(np.ones((4, 4), dtype=bool), k=1)
    assert (weights[:, upper] == 0).all()
    assert (weights[:, ~upper] > 0).all()
    # the first token can only attend to itself
    assert_allclose(weights[:, 0, 0], [1.0, 1.0], rtol=0, atol=0)


def test_causal_multihead_first_row_by_hand() -> None:
    trace = trace_of("causal_multihead.yaml")
    # "I" attends only to itself, so its output is its own value vector per head:
    # V("I") = [1,0,1,0] W_V = [1, 0, 1, 1]; concat row 0 = [1, 0 | 1, 1]
    assert_allclose(trace["concat"].data[0], [1, 0, 1, 1], rtol=0, atol=0)
    # projected = concat W_O + b_O = [1+1, 0, -1+1, 1] + [0, 0.5, 0, -0.5] = [2, 0.5, 0, 0.5]
    assert_allclose(trace["projected"].data[0], [2, 0.5, 0, 0.5], rtol=0, atol=1e-15)


# ---------------------------------------------------------------------------------------------
# Grouped-query attention (4 query heads, 2 key/value heads)


def test_grouped_query_against_reference() -> None:
    trace = trace_of("grouped_query.yaml")
    i = trace.inputs
    assert i.X is not None and i.W_Q is not None and i.W_K is not None and i.W_V is not None
    assert i.W_O is not None
    assert (i.heads, i.kv_heads) == (4, 2)
    # K and V keep their 2 heads; everything from the scores on has 4
    assert trace["K"].shape[0] == 2
    assert trace["V"].shape[0] == 2
    assert trace["Q"].shape[0] == 4
    assert trace["scores"].shape[0] == 4
    assert trace["softmax"].shape[0] == 4
    ref = reference_projection(i.X[0], i.W_Q, i.W_K, i.W_V, 4, 2, i.W_O)
    for stage in ("softmax", "output", "concat", "projected"):
        assert_allclose(trace[stage].data, ref[stage], rtol=RTOL, atol=ATOL, err_msg=stage)


def test_grouped_query_heads_share_keys() -> None:
    trace = trace_of("grouped_query.yaml")
    # query heads 0 and 1 read key head 0, heads 2 and 3 read key head 1
    K = trace["K"].data  # (kv_heads, S, d_k)
    Q = trace["Q"].data  # (heads, T, d_k)
    for h in range(4):
        assert_allclose(trace["scores"].data[h], Q[h] @ K[h // 2].T, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# Padding: a batch of 2 with lengths [3, 2]


def keys_below(n: int) -> Callable[[int, int], bool]:
    """Allowed: the first ``n`` keys, for every query."""
    return lambda i, j: j < n


def test_padding_batch_against_reference() -> None:
    trace = trace_of("padding_batch.yaml")
    i = trace.inputs
    assert i.lengths is not None
    assert list(i.lengths) == [3, 2]
    for b, n in enumerate([3, 2]):
        q, k, v = (getattr(i, name)[b, 0] for name in ("Q", "K", "V"))  # (3, 2)
        weights, out = reference_head(q, k, v, 1 / math.sqrt(2), keys_below(n))
        assert_allclose(trace["softmax"].data[b, 0], weights, rtol=RTOL, atol=ATOL)
        assert_allclose(trace["output"].data[b, 0], out, rtol=RTOL, atol=ATOL)
    # item 1's padding key gets exactly 0 from every query, so its V [100, 100] never leaks
    assert (trace["softmax"].data[1, 0, :, 2] == 0).all()
    assert np.isneginf(trace["masked"].data[1, 0, :, 2]).all()
    assert (trace["output"].data[1] <= 1).all()
    # item 0 is not padded: every weight positive
    assert (trace["softmax"].data[0] > 0).all()
    # the zero query of the padded position spreads evenly over the two real keys
    assert_allclose(trace["softmax"].data[1, 0, 2], [0.5, 0.5, 0], rtol=0, atol=1e-15)
