"""The math of attention variants against independent sources.

The code that runs (the plug-ins' hooks and helpers, the chain's fill, the softmax of
``core/steps.py``, the pipeline's sentinel rows, the layouts of ``core/variants.py``) is checked
against a slow loop written here with
plain Python (``math.cos``, ``math.exp``, ``math.tanh``), against published numbers (ALiBi slopes,
softcap values), and against invariants (RoPE depends only on the position difference, the
Meta <-> HF permutation gives the same scores, sinks at -inf change nothing).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, TypedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_cli.core import variants as V
from attn_cli.core.chain import REGISTRY, Chain, cells_of
from attn_cli.core.ops import rms_norm
from attn_cli.core.pipeline import Trace, run
from attn_cli.core.plugins.bias import alibi_slopes
from attn_cli.core.plugins.rope import apply_rope, rope_angles, rope_inv_freq
from attn_cli.core.steps import softmax_rows
from attn_cli.core.variant import Cells, ExtraLogit, ScoreModifier
from attn_cli.errors import InputError
from attn_cli.io.fixture import validate


class Tolerance(TypedDict):
    rtol: float
    atol: float


EXACT = Tolerance(rtol=1e-15, atol=0.0)
LOOP = Tolerance(rtol=1e-13, atol=1e-14)  # same math, different rounding order
NEG_INF = -math.inf
FAST = settings(max_examples=40, deadline=None)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------------------------
# Loop references (plain Python; numpy only as a container)


def loop_rope(
    vec: list[float], pos: float, base: float, layout: str, dims: int, sign: float = 1.0
) -> list[float]:
    """One vector rotated the way the papers write it."""
    out = list(vec)
    half = dims // 2
    for i in range(half):
        theta = sign * pos * math.pow(base, -2.0 * i / dims)
        c, s = math.cos(theta), math.sin(theta)
        if layout == "half":
            # HF: q * cos + rotate_half(q) * sin, rotate_half(q) = [-q2, q1]
            out[i] = vec[i] * c + (-vec[i + half]) * s
            out[i + half] = vec[i + half] * c + vec[i] * s
        else:
            # Meta: (x[2i] + i x[2i+1]) * e^(i theta)
            z = complex(vec[2 * i], vec[2 * i + 1]) * complex(c, s)
            out[2 * i], out[2 * i + 1] = z.real, z.imag
    return out


def loop_rope_array(
    x: np.ndarray[Any, Any], positions: list[int], base: float, layout: str, dims: int
) -> np.ndarray[Any, Any]:
    """x (..., T, D): every row rotated by ``loop_rope``."""
    out = np.empty_like(x)
    for idx in np.ndindex(*x.shape[:-1]):
        out[idx] = loop_rope([float(a) for a in x[idx]], positions[idx[-1]], base, layout, dims)
    return out


def loop_softmax_with_sink(row: list[float], sink: float | None) -> tuple[list[float], float]:
    """Join the sink, subtract the max, exponentiate, normalise, drop the sink (gpt-oss)."""
    logits = row + ([sink] if sink is not None else [])
    m = max(logits, default=NEG_INF)
    if m == NEG_INF:
        return [0.0] * len(row), 0.0
    e = [math.exp(a - m) for a in logits]
    total = math.fsum(e)
    p = [a / total for a in e]
    return (p[:-1], p[-1]) if sink is not None else (p, 0.0)


def loop_dot(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


# ---------------------------------------------------------------------------------------------
# The code that runs, called as the chain calls it


def fixture(heads: int = 1, T: int = 1, S: int = 1, **extra: Any) -> dict[str, Any]:
    """Zeros of the given sizes (one batch item, d_k = 1) plus ``extra`` keys."""
    return {
        "Q": np.zeros((1, heads, T, 1)).tolist(),
        "K": np.zeros((1, heads, S, 1)).tolist(),
        "V": np.zeros((1, heads, S, 1)).tolist(),
        **extra,
    }


def cells(heads: int, pos_q: Any, pos_k: Any) -> Cells:
    """One batch item, ``heads`` heads, queries and keys at the given positions."""
    pq, pk = np.asarray(pos_q, dtype=np.int64), np.asarray(pos_k, dtype=np.int64)
    return Cells(np.arange(1), np.arange(heads), np.arange(pq.size), np.arange(pk.size), pq, pk)


def alibi_bias(slopes: Any, pos_q: Any, pos_k: Any) -> np.ndarray[Any, Any]:
    """ALiBi's bias as the chain adds it (the plug-in's ``bias`` hook), (H, T, S)."""
    m = np.asarray(slopes, dtype=np.float64)  # (H,)
    inputs = validate(fixture(len(m)), "test")
    bias = REGISTRY["alibi"].bias(m, inputs, cells(len(m), pos_q, pos_k), np.float64)
    assert bias is not None
    return np.asarray(bias[0])  # (H, T, S)


def softcap(x: np.ndarray[Any, Any], cap: float) -> np.ndarray[Any, Any]:
    """The softcap plug-in's score modifier, as the chain runs it."""
    modifier = REGISTRY["softcap"]
    assert isinstance(modifier, ScoreModifier)
    return np.asarray(modifier.modify(cap, x))


class SinkSoftmax(NamedTuple):
    """The kept weights (..., H, T, S) and the sink's share of each row (..., H, T)."""

    weights: np.ndarray[Any, Any]
    dropped: np.ndarray[Any, Any]


def softmax_with_sinks(x: np.ndarray[Any, Any], sinks: Any = None) -> SinkSoftmax:
    """The chain's softmax (steps.softmax_rows) over x (..., H, T, S) with the sinks plug-in's
    extra logit; the sink's share is exp(sink − lse), from the log-sum-exp it returns."""
    lse = np.empty(x.shape[:-1])  # (..., H, T)
    if sinks is None:
        weights, _ = softmax_rows(x, None, lse=lse)
        return SinkSoftmax(weights, np.zeros_like(lse))
    H = x.shape[-3]
    plugin = REGISTRY["sinks"]
    assert isinstance(plugin, ExtraLogit)
    logit = plugin.extra_logit(np.asarray(sinks, dtype=np.float64), cells(H, [], []), x.dtype)
    assert logit is not None
    sink = np.asarray(logit)[:, None, None]  # (H, 1, 1)
    weights, _ = softmax_rows(x, None, sink=sink, lse=lse)
    nothing = np.isneginf(lse)  # no key and no sink: the share is 0
    dropped = np.where(nothing, 0.0, np.exp(sink[..., 0] - np.where(nothing, 0.0, lse)))
    return SinkSoftmax(weights, dropped)


def fill_not_allowed(
    x: np.ndarray[Any, Any], allowed: Any, mask_value: float = NEG_INF
) -> np.ndarray[Any, Any]:
    """``masked`` as the chain fills it: x (T, S) where the fixture's mask allows, else its
    ``mask_value``."""
    T, S = x.shape
    extra = {} if mask_value == NEG_INF else {"mask_value": mask_value}
    inputs = validate(fixture(1, T, S, mask=np.asarray(allowed).tolist(), **extra), "test")
    every = cells_of(inputs, slice(None), slice(None), slice(None))
    masked, _, _ = Chain(inputs).masked(x, every, None, lambda stage: None)
    return np.asarray(masked[0, 0])  # (T, S)


def traced(x: np.ndarray[Any, Any], allowed: Any, mask_value: float | None = None) -> Trace:
    """attn's pipeline on scores x (H, T, S): Q = x, K = V = the identity, scale 1, so that
    scores = x exactly."""
    H, _, S = x.shape
    eye = [[np.eye(S).tolist()] * H]  # (1, H, S, S)
    extra = {} if mask_value is None else {"mask_value": mask_value}
    fx = {
        "Q": x[None].tolist(),
        "K": eye,
        "V": eye,
        "scale": 1.0,
        "mask": np.asarray(allowed).tolist(),
    }
    return run(validate({**fx, **extra}, "test"))


def weights_of(trace: Trace) -> np.ndarray[Any, Any]:
    """The traced softmax, (H, T, S) (one batch item)."""
    return np.asarray(trace.stages["softmax"].data[0])


def sentinel_leak(trace: Trace) -> np.ndarray[Any, Any]:
    """The weight each row gave to hidden keys, (B, H, T), from the trace's sentinel rows."""
    leak = np.zeros(trace.stages["softmax"].data.shape[:-1])
    for row in trace.sentinel_rows:
        leak[row.batch, row.head, row.query] = row.leaked
    return leak


# ---------------------------------------------------------------------------------------------
# Positions


def test_default_positions_by_hand() -> None:
    q, k = V.default_positions(2, 5, None)
    assert q.tolist() == [0, 1] and k.tolist() == [0, 1, 2, 3, 4]
    q, _ = V.default_positions(2, 5, "upper-left")
    assert q.tolist() == [0, 1]
    q, k = V.default_positions(2, 5, "lower-right")  # the last two key positions (KV cache)
    assert q.tolist() == [3, 4] and k.tolist() == [0, 1, 2, 3, 4]


def test_lower_right_causal_matches_the_offset_rule() -> None:
    """causal_allowed on lower-right positions is key j <= i + S - T, by loop."""
    T, S = 3, 7
    q, k = V.default_positions(T, S, "lower-right")
    want = [[j <= i + S - T for j in range(S)] for i in range(T)]
    assert V.causal_allowed(q, k).tolist() == want


# ---------------------------------------------------------------------------------------------
# RoPE


def test_inv_freq_against_loop() -> None:
    for dims, base in ((2, 10000.0), (8, 10000.0), (64, 500000.0), (6, 10.0)):
        want = [math.pow(base, -2.0 * i / dims) for i in range(dims // 2)]
        np.testing.assert_allclose(rope_inv_freq(dims, base), want, **LOOP)


def test_rope_angles_against_loop() -> None:
    pos = [0, 1, 7, 4096]
    want = [[p * math.pow(10000.0, -2.0 * i / 8) for i in range(4)] for p in pos]
    np.testing.assert_allclose(rope_angles(pos, 8, 10000.0), want, **LOOP)


@pytest.mark.parametrize("layout", V.ROPE_LAYOUTS)
@pytest.mark.parametrize("dims", [None, 4, 2])
def test_apply_rope_against_loop(layout: V.RopeLayout, dims: int | None) -> None:
    x = rng(1).normal(size=(2, 3, 5, 6))  # (B, H, T, D)
    pos = [0, 1, 2, 9, 100]
    got = apply_rope(x, pos, base=10000.0, layout=layout, dims=dims)
    want = loop_rope_array(x, pos, 10000.0, layout, dims or 6)
    np.testing.assert_allclose(got, want, **LOOP)
    if dims is not None:  # partial rotary: the rest passes through untouched
        np.testing.assert_array_equal(got[..., dims:], x[..., dims:])


def test_rope_position_zero_is_identity() -> None:
    x = rng(2).normal(size=(4, 8))
    np.testing.assert_array_equal(apply_rope(x, [0, 0, 0, 0]), x)


def test_rope_one_pair_by_hand() -> None:
    """D = 2, position 1, half layout: (1, 0) rotates to (cos 1, sin 1)."""
    got = apply_rope(np.array([[1.0, 0.0]]), [1])
    np.testing.assert_allclose(got, [[math.cos(1.0), math.sin(1.0)]], **EXACT)


@pytest.mark.parametrize("layout", V.ROPE_LAYOUTS)
def test_rope_scores_depend_only_on_the_distance(layout: V.RopeLayout) -> None:
    """The issue's example: rope(q, 5)·rope(k, 3) == rope(q, 12)·rope(k, 10)."""
    q, k = rng(3).normal(size=(2, 1, 8))
    a = apply_rope(q, [5], layout=layout)[0] @ apply_rope(k, [3], layout=layout)[0]
    b = apply_rope(q, [12], layout=layout)[0] @ apply_rope(k, [10], layout=layout)[0]
    np.testing.assert_allclose(a, b, rtol=1e-13)
    c = apply_rope(q, [5], layout=layout)[0] @ apply_rope(k, [4], layout=layout)[0]
    assert abs(a - c) > 1e-3  # and the distance does matter


vectors = st.lists(st.floats(-10, 10), min_size=8, max_size=8)


@FAST
@given(
    q=vectors,
    k=vectors,
    m=st.integers(0, 2000),
    n=st.integers(0, 2000),
    shift=st.integers(-500, 500),
    layout=st.sampled_from(V.ROPE_LAYOUTS),
)
def test_rope_relative_position_law(
    q: list[float], k: list[float], m: int, n: int, shift: int, layout: V.RopeLayout
) -> None:
    """<R(m)q, R(n)k> = <R(m+s)q, R(n+s)k> for every shift s."""
    if m + shift < 0 or n + shift < 0:
        return
    qa, ka = np.array([q]), np.array([k])
    a = apply_rope(qa, [m], layout=layout)[0] @ apply_rope(ka, [n], layout=layout)[0]
    b = (
        apply_rope(qa, [m + shift], layout=layout)[0]
        @ apply_rope(ka, [n + shift], layout=layout)[0]
    )
    # angles up to 2500 rad lose ~2500 * 2^-52 each; scores are bounded by |q||k| <= 800
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)


@FAST
@given(x=vectors, p=st.integers(0, 5000), layout=st.sampled_from(V.ROPE_LAYOUTS))
def test_rope_keeps_the_norm_and_inverse_undoes_it(
    x: list[float], p: int, layout: V.RopeLayout
) -> None:
    xa = np.array([x])
    r = apply_rope(xa, [p], layout=layout)
    np.testing.assert_allclose(np.linalg.norm(r), np.linalg.norm(xa), rtol=1e-13, atol=1e-13)
    back = apply_rope(r, [p], layout=layout, inverse=True)
    np.testing.assert_allclose(back, xa, rtol=0, atol=1e-12)


def test_inverse_is_rotation_by_minus_the_angle() -> None:
    x = rng(4).normal(size=(3, 6))
    pos = [2, 5, 11]
    got = apply_rope(x, pos, layout="interleaved", dims=4, inverse=True)
    want = np.array(
        [loop_rope(list(x[t]), pos[t], 10000.0, "interleaved", 4, sign=-1.0) for t in range(3)]
    )
    np.testing.assert_allclose(got, want, **LOOP)


@FAST
@given(
    seed=st.integers(0, 2**32 - 1),
    d=st.sampled_from([2, 4, 6, 8, 16]),
    partial=st.booleans(),
)
def test_interleaved_rope_is_half_rope_of_permuted_dims(seed: int, d: int, partial: bool) -> None:
    """interleaved(x)[perm] == half(x[perm]): the two layouts differ only by a relabelling."""
    dims = 2 if partial else d
    x = rng(seed).normal(size=(2, 5, d))
    pos = [0, 3, 7, 20, 1000]
    perm = V.interleaved_to_half_permutation(d, dims)
    inter = apply_rope(x, pos, layout="interleaved", dims=dims)
    half = apply_rope(x[..., perm], pos, layout="half", dims=dims)
    np.testing.assert_allclose(inter[..., perm], half, **EXACT)


def hf_permute(w: np.ndarray[Any, Any], n_heads: int) -> np.ndarray[Any, Any]:
    """HF convert_llama_weights_to_hf ``permute`` on a torch-layout weight [out, in], in NumPy."""
    dim1, dim2 = w.shape
    # w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)
    w4 = w.reshape(n_heads, dim1 // n_heads // 2, 2, dim2)  # (heads, D/2, 2, in)
    return np.asarray(w4.transpose(0, 2, 1, 3).reshape(dim1, dim2))  # (heads*D, in)


def test_permutation_by_hand() -> None:
    assert V.interleaved_to_half_permutation(8).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert V.interleaved_to_half_permutation(6, 4).tolist() == [0, 2, 1, 3, 4, 5]


def test_column_permutation_is_hf_permute() -> None:
    """On W [d_model, heads*d] (our X @ W layout), the same as HF's permute on W.T."""
    heads, d, d_model = 3, 8, 5
    W = rng(5).normal(size=(d_model, heads * d))
    got = V.interleaved_to_half_columns(W, heads)
    np.testing.assert_array_equal(got, hf_permute(W.T, heads).T)
    np.testing.assert_array_equal(V.interleaved_to_half_columns(got, heads, inverse=True), W)


def test_meta_and_hf_weights_give_the_same_scores() -> None:
    """Meta weights with interleaved RoPE == HF-permuted weights with half RoPE, score by score."""
    heads, d, d_model, T = 2, 8, 6, 5
    r = rng(6)
    X = r.normal(size=(T, d_model))
    W_Q, W_K = r.normal(size=(2, d_model, heads * d))
    pos = list(range(T))

    def scores(W_q: Any, W_k: Any, layout: V.RopeLayout) -> np.ndarray[Any, Any]:
        q = (X @ W_q).reshape(T, heads, d).transpose(1, 0, 2)  # (H, T, D)
        k = (X @ W_k).reshape(T, heads, d).transpose(1, 0, 2)  # (H, T, D)
        q, k = apply_rope(q, pos, layout=layout), apply_rope(k, pos, layout=layout)
        return np.asarray(q @ k.transpose(0, 2, 1))  # (H, T, T)

    meta = scores(W_Q, W_K, "interleaved")
    hf_q, hf_k = (hf_permute(W.T, heads).T for W in (W_Q, W_K))
    np.testing.assert_allclose(scores(hf_q, hf_k, "half"), meta, rtol=1e-12, atol=1e-12)
    # and the unpermuted weights with the wrong layout do not
    assert not np.allclose(scores(W_Q, W_K, "half"), meta)


# ---------------------------------------------------------------------------------------------
# ALiBi


def test_alibi_slopes_for_8_heads_are_powers_of_a_half() -> None:
    """Press et al.: for 8 heads, 1/2, 1/4, ..., 1/256."""
    np.testing.assert_array_equal(alibi_slopes(8), [2.0**-i for i in range(1, 9)])


def test_alibi_slopes_for_6_heads_by_hand() -> None:
    """Not a power of two: the 4-head slopes 2^-2..2^-8, then 2^-1, 2^-3 (every other 8-head)."""
    want = [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]
    np.testing.assert_allclose(alibi_slopes(6), want, **EXACT)


def test_alibi_slopes_for_12_heads_by_hand() -> None:
    """The 8-head slopes, then every other 16-head slope 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5."""
    want = [2.0**-i for i in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    np.testing.assert_allclose(alibi_slopes(12), want, rtol=1e-15)


@pytest.mark.parametrize("n", [1, 2, 4, 16, 32])
def test_alibi_slopes_power_of_two_rule(n: int) -> None:
    """2^(-8/n) to the powers 1..n."""
    want = [math.pow(2.0, -8.0 * i / n) for i in range(1, n + 1)]
    np.testing.assert_allclose(alibi_slopes(n), want, rtol=1e-14)


def test_alibi_bias_against_loop() -> None:
    slopes = [0.5, 0.25, 0.125]
    pq, pk = [2, 3, 4], [0, 1, 2, 3, 4]
    want = [[[-m * abs(a - b) for b in pk] for a in pq] for m in slopes]
    np.testing.assert_allclose(alibi_bias(slopes, pq, pk), want, **EXACT)
    assert alibi_bias(slopes, pq, pk).max() == 0.0  # a penalty: never positive


def test_alibi_symmetric_and_bloom_forms_agree_after_causal_softmax() -> None:
    """-m|i-j| and BLOOM's m*j differ by -m*i per row, which the softmax cancels (causal rows)."""
    m, T = 0.25, 5
    scores = rng(7).normal(size=(T, T))
    for i in range(T):
        sym = [scores[i, j] - m * abs(i - j) if j <= i else NEG_INF for j in range(T)]
        bloom = [scores[i, j] + m * j if j <= i else NEG_INF for j in range(T)]
        a, _ = loop_softmax_with_sink(sym, None)
        b, _ = loop_softmax_with_sink(bloom, None)
        np.testing.assert_allclose(a, b, rtol=1e-13)
    got = alibi_bias([m], list(range(T)), list(range(T)))[0]
    np.testing.assert_allclose(got[3, :4], [-0.75, -0.5, -0.25, 0.0], **EXACT)


# ---------------------------------------------------------------------------------------------
# Causal and sliding window


def test_window_against_loop() -> None:
    pq, pk = [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]
    for w in (1, 2, 3, 6, 7):
        want = [[0 <= a - b < w for b in pk] for a in pq]
        assert V.window_allowed(pq, pk, w).tolist() == want


def test_window_counts_keys_including_itself() -> None:
    """Mistral/HF: with window 3 a query sees at most 3 keys (itself and the 2 before)."""
    allowed = V.window_allowed(range(8), range(8), 3)
    assert allowed.sum(axis=1).tolist() == [1, 2, 3, 3, 3, 3, 3, 3]
    assert allowed[5].tolist() == [False, False, False, True, True, True, False, False]


@pytest.mark.parametrize("T,S", [(5, 5), (2, 6), (6, 6)])
def test_window_at_least_the_sequence_is_plain_causal(T: int, S: int) -> None:
    q, k = V.default_positions(T, S, "lower-right")
    plain = V.causal_allowed(q, k)
    for w in (S, S + 1, 1000):
        np.testing.assert_array_equal(V.window_allowed(q, k, w), plain)
    assert not np.array_equal(V.window_allowed(q, k, S - 1), plain)  # one less does cut


def test_window_one_is_the_diagonal() -> None:
    np.testing.assert_array_equal(V.window_allowed(range(4), range(4), 1), np.eye(4, dtype=bool))


# ---------------------------------------------------------------------------------------------
# Softcap


def test_softcap_published_numbers() -> None:
    """The issue's worked numbers: cap 50 maps 10, 60, 120 to 9.8688, 41.6827, 49.1837."""
    got = softcap(np.array([10.0, 60.0, 120.0]), 50.0)
    np.testing.assert_allclose(got, [9.8688, 41.6827, 49.1837], rtol=0, atol=5e-5)


@FAST
@given(
    xs=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=20),
    cap=st.floats(0.1, 100.0),
)
def test_softcap_against_tanh_loop_and_bounds(xs: list[float], cap: float) -> None:
    got = softcap(np.array(xs), cap)
    want = [cap * math.tanh(x / cap) for x in xs]
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=1e-300)
    assert np.all(np.abs(got) <= cap)
    np.testing.assert_array_equal(softcap(-np.array(xs), cap), -got)  # odd


def test_softcap_is_nearly_identity_for_small_scores() -> None:
    x = np.array([-0.01, 0.0, 0.01])
    np.testing.assert_allclose(softcap(x, 50.0), x, rtol=1e-7)


def test_softcap_after_mask_is_the_mistake() -> None:
    """tanh(-inf) = -1: capping after the mask turns -inf into -cap, so masked keys get weight."""
    masked = np.array([[1.0, NEG_INF]])
    w, _ = softmax_with_sinks(softcap(masked, 5.0)[None])
    assert w[0, 0, 1] > 0


# ---------------------------------------------------------------------------------------------
# Softmax with sinks


def scores_with_holes(seed: int, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """Random scores with some -inf, and one row that is entirely -inf."""
    r = rng(seed)
    x = r.normal(scale=3.0, size=shape)
    x[r.random(shape) < 0.3] = NEG_INF
    x[..., 0, 1, :] = NEG_INF
    return x


def test_sinks_against_loop() -> None:
    x = scores_with_holes(8, (2, 3, 4, 5))  # (B, H, T, S)
    sinks = [0.5, -2.0, 3.0]
    got = softmax_with_sinks(x, sinks)
    for idx in np.ndindex(*x.shape[:-1]):
        w, dropped = loop_softmax_with_sink([float(a) for a in x[idx]], sinks[idx[-2]])
        np.testing.assert_allclose(got.weights[idx], w, **LOOP)
        np.testing.assert_allclose(got.dropped[idx], dropped, **LOOP)


def test_plain_softmax_against_loop_and_empty_rows_are_zeros() -> None:
    x = scores_with_holes(9, (3, 4, 5))  # (H, T, S)
    got = softmax_with_sinks(x)
    for idx in np.ndindex(*x.shape[:-1]):
        w, _ = loop_softmax_with_sink([float(a) for a in x[idx]], None)
        np.testing.assert_allclose(got.weights[idx], w, **LOOP)
    np.testing.assert_array_equal(got.weights[0, 1], 0.0)
    np.testing.assert_array_equal(got.dropped, 0.0)


def test_sinks_at_minus_infinity_are_no_sinks() -> None:
    x = scores_with_holes(10, (2, 3, 4, 5))
    plain = softmax_with_sinks(x)
    gone = softmax_with_sinks(x, [NEG_INF] * 3)
    np.testing.assert_array_equal(gone.weights, plain.weights)
    np.testing.assert_array_equal(gone.dropped, 0.0)


def test_very_negative_sinks_approach_no_sinks() -> None:
    x = scores_with_holes(11, (3, 4, 5))
    x[0, 1, :] = 0.0  # no empty row here: an empty row would still give its mass to the sink
    got = softmax_with_sinks(x, [-60.0] * 3)
    np.testing.assert_allclose(got.weights, softmax_with_sinks(x).weights, rtol=0, atol=1e-20)


def test_empty_row_with_a_sink_gives_everything_to_the_sink() -> None:
    x = np.full((2, 1, 3), NEG_INF)  # (H, T, S)
    got = softmax_with_sinks(x, [0.0, -5.0])
    np.testing.assert_array_equal(got.weights, 0.0)
    np.testing.assert_array_equal(got.dropped, 1.0)


def test_sink_by_hand() -> None:
    """Scores [0, 0] and sink 0: three equal logits, each 1/3; 1/3 dropped."""
    got = softmax_with_sinks(np.zeros((1, 1, 2)), [0.0])
    np.testing.assert_allclose(got.weights, [[[1 / 3, 1 / 3]]], **EXACT)
    np.testing.assert_allclose(got.dropped, [[1 / 3]], **EXACT)


@FAST
@given(
    seed=st.integers(0, 2**32 - 1),
    sinks=st.lists(st.floats(-30, 30), min_size=3, max_size=3),
)
def test_sink_rows_sum_to_one_minus_dropped(seed: int, sinks: list[float]) -> None:
    x = scores_with_holes(seed, (3, 4, 6))
    got = softmax_with_sinks(x, sinks)
    np.testing.assert_allclose(got.weights.sum(axis=-1), 1.0 - got.dropped, rtol=0, atol=1e-14)
    assert np.all(got.weights >= 0) and np.all((got.dropped >= 0) & (got.dropped <= 1))


# ---------------------------------------------------------------------------------------------
# RMSNorm (QK-norm)


def loop_rms_norm(x: list[float], w: list[float], eps: float, plus_one: bool) -> list[float]:
    ms = math.fsum(a * a for a in x) / len(x)
    inv = 1.0 / math.sqrt(ms + eps)
    return [a * inv * ((1.0 + g) if plus_one else g) for a, g in zip(x, w, strict=True)]


@pytest.mark.parametrize("plus_one", [False, True])
def test_rms_norm_against_loop(plus_one: bool) -> None:
    r = rng(12)
    x = r.normal(size=(2, 3, 4, 8))  # (B, H, T, D): per-head (Qwen3)
    w = r.normal(size=8)
    got = rms_norm(x, w, 1e-6, plus_one=plus_one)
    for idx in np.ndindex(*x.shape[:-1]):
        want = loop_rms_norm([float(a) for a in x[idx]], list(w), 1e-6, plus_one)
        np.testing.assert_allclose(got[idx], want, **LOOP)


def test_rms_norm_over_the_whole_projection() -> None:
    """OLMo 2: weight of length heads*d normalises (B, T, heads*d) before the head split."""
    r = rng(13)
    x, w = r.normal(size=(4, 12)), r.normal(size=12)
    got = rms_norm(x, w, 1e-6)
    for t in range(4):
        np.testing.assert_allclose(got[t], loop_rms_norm(list(x[t]), list(w), 1e-6, False), **LOOP)


def test_rms_norm_keeps_float32() -> None:
    x: Any = rng(14).normal(size=(3, 8)).astype(np.float32)
    got = rms_norm(x, np.ones(8), 1e-6)
    assert got.dtype == np.float32
    want = [loop_rms_norm([float(a) for a in row], [1.0] * 8, 1e-6, False) for row in x]
    np.testing.assert_allclose(got, want, rtol=1e-6)


@FAST
@given(
    x=st.lists(st.floats(-100, 100), min_size=4, max_size=4).filter(
        lambda v: math.fsum(a * a for a in v) > 1e-3
    ),
    c=st.floats(0.01, 100.0),
)
def test_rms_norm_laws(x: list[float], c: float) -> None:
    """Unit weight and no eps: root-mean-square 1, and scaling the input changes nothing."""
    xa = np.array(x)
    y = rms_norm(xa, np.ones(4), 0.0)
    np.testing.assert_allclose(math.sqrt(math.fsum(a * a for a in y) / 4), 1.0, rtol=1e-13)
    np.testing.assert_allclose(rms_norm(c * xa, np.ones(4), 0.0), y, rtol=1e-12, atol=1e-13)


# ---------------------------------------------------------------------------------------------
# Mask sentinels


def test_fill_not_allowed_default_and_sentinels() -> None:
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    allowed = np.array([[True, False], [False, False]])
    assert fill_not_allowed(x, allowed).tolist() == [[1.0, NEG_INF], [NEG_INF, NEG_INF]]
    assert fill_not_allowed(x, allowed, -1e4).tolist() == [[1.0, -1e4], [-1e4, -1e4]]
    low = float(np.finfo(np.float32).min)
    got = fill_not_allowed(x.astype(np.float32), allowed, low)
    assert got.dtype == np.float32 and got[1, 1] == low


def test_sentinel_leak_against_loop() -> None:
    """The pipeline's sentinel rows: the weight a finite sentinel let through, row by row."""
    r = rng(15)
    x = r.normal(size=(2, 3, 4))  # (H, T, S)
    allowed = r.random((3, 4)) < 0.5
    trace = traced(x, allowed, -2.0)  # a sentinel near the scores: weight leaks
    w, got = weights_of(trace), sentinel_leak(trace)[0]  # (H, T, S), (H, T)
    for h in range(2):
        for t in range(3):
            want = math.fsum(float(w[h, t, s]) for s in range(4) if not allowed[t, s])
            np.testing.assert_allclose(got[h, t], want, **LOOP)
    assert got.max() > 0  # not vacuous: weight did leak


@pytest.mark.parametrize("sentinel", [-1e9, -1e4, float(np.finfo(np.float64).min)])
def test_finite_sentinel_turns_a_fully_masked_row_uniform(sentinel: float) -> None:
    """The lesson: a finite sentinel gives an empty row 1/S everywhere; -inf gives zeros."""
    x = np.array([[[0.3, -1.2, 2.0], [0.5, 0.1, -0.4]]])  # (H, T, S)
    allowed = np.array([[True, True, False], [False, False, False]])
    trace = traced(x, allowed, sentinel)
    w = weights_of(trace)
    np.testing.assert_allclose(w[0, 1], [1 / 3] * 3, **EXACT)
    np.testing.assert_allclose(sentinel_leak(trace)[0, 0], [0.0, 1.0], rtol=0, atol=1e-15)
    w_inf = weights_of(traced(x, allowed))
    np.testing.assert_array_equal(w_inf[0, 1], 0.0)
    np.testing.assert_allclose(w[0, 0], w_inf[0, 0], rtol=1e-15)


def test_small_sentinel_leaks_when_scores_are_large() -> None:
    """-1e4 is not far enough below scores of about -1e4 (e.g. big logits): weight leaks."""
    x = np.array([[[-1e4 - 1.0, 0.0]]])  # (H, T, S)
    allowed = np.array([[True, False]])
    trace = traced(x, allowed, -1e4)
    want = math.exp(0.0) / (math.exp(-1.0) + math.exp(0.0))  # the masked key wins
    np.testing.assert_allclose(sentinel_leak(trace)[0], [[want]], rtol=1e-15)


# ---------------------------------------------------------------------------------------------
# Bad arguments


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: rope_inv_freq(3), "positive even"),
        (lambda: apply_rope(np.zeros((2, 4)), [0, 1], dims=6), "dims must be in 1..4"),
        (lambda: apply_rope(np.zeros((2, 4)), [0, 1], layout="complex"), "layout"),  # type: ignore[arg-type]
        (lambda: apply_rope(np.zeros((2, 4)), [0]), "positions must have shape"),
        (lambda: V.interleaved_to_half_columns(np.zeros((3, 10)), 3), "do not split"),
        (lambda: alibi_slopes(0), "at least one head"),
        (lambda: V.window_allowed([0], [0], 0), ">= 1"),
        (lambda: rms_norm(np.zeros((2, 4)), np.ones(3)), "length 4"),
    ],
)
def test_bad_arguments(call: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"softcap": 0.0}, "> 0"),
        ({"sinks": [0.0]}, r"one per query head \(2\)"),
    ],
)
def test_bad_settings(extra: dict[str, Any], message: str) -> None:
    """The plug-ins' ``parse``: a cap must be > 0, and sinks hold one logit per head."""
    with pytest.raises(InputError, match=message):
        validate(fixture(2, **extra), "test")
