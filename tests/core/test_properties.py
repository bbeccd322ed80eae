"""Property tests: invariants of attention that hold for any fixture hypothesis can draw.

Hypothesis draws the structure (mode, layout, sizes, heads, masking); the numbers come from a
seeded NumPy generator (``reference.random_fixture``), so a failure still shrinks to a small
configuration and a seed.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from conftest import Tolerance
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import random_fixture, reference

from attn_cli.core.pipeline import Trace, run
from attn_cli.io.fixture import validate

SETTINGS = settings(max_examples=80, deadline=None)
# Softmax rows are sums of at most a few float64 terms: they reach 1 within a few ulps.
ROW_SUM: Tolerance = {"rtol": 1e-12, "atol": 0}
# Batch sizes and head layouts may change NumPy's summation order, not the math.
SAME: Tolerance = {"rtol": 1e-12, "atol": 1e-14}

BATCHED = ("X", "Q", "K", "V")


def trace_of(fx: dict[str, Any]) -> Trace:
    return run(validate(fx, "prop.json"))


@st.composite
def fixtures(
    draw: st.DrawFn, *, batched: bool | None = None, masking: bool = True
) -> dict[str, Any]:
    """A random fixture mapping of any mode; ``batched`` forces a batch axis on or off."""
    mode = draw(st.sampled_from(["projection", "direct"]))
    has_batch = draw(st.booleans()) if batched is None else batched
    layout = draw(st.sampled_from([3, 4])) if has_batch else 2
    batch = draw(st.integers(1, 3)) if has_batch else None
    B = batch or 1
    seq = draw(st.integers(1, 4))
    seq_k = draw(st.integers(1, 4)) if mode == "direct" else seq
    heads = draw(st.sampled_from([1, 2, 3, 4]))
    kv_heads = draw(st.sampled_from([n for n in (1, 2, 3, 4) if heads % n == 0]))
    kw: dict[str, Any] = {
        "mode": mode,
        "layout": layout,
        "batch": batch,
        "seq": seq,
        "seq_k": seq_k,
        "heads": heads,
        "kv_heads": kv_heads,
        "d_k": draw(st.integers(1, 3)),
        "d_v": draw(st.integers(1, 3)),
        "qkv_bias": draw(st.booleans()),
        "W_O": draw(st.booleans()),
        "b_O": True,
        "magnitude": draw(st.sampled_from([0.5, 3.0])),
    }
    if masking:
        kw["causal"] = draw(st.sampled_from([None, True, "upper-left", "lower-right"]))
        shapes = [
            (),
            (seq_k,),
            (seq, seq_k),
            (heads, 1, seq_k),
            (B, 1, 1, seq_k),
            (B, heads, seq, seq_k),
        ]
        kw["mask"] = draw(st.none() | st.sampled_from(shapes))
        kw["bias"] = draw(st.none() | st.sampled_from(shapes))
        kw["neg_inf_bias"] = draw(st.booleans())
        if draw(st.booleans()):
            kw["lengths"] = draw(st.lists(st.integers(0, seq_k), min_size=B, max_size=B))
    return random_fixture(draw(st.integers(0, 2**32 - 1)), **kw)


def _with_batch(a: np.ndarray, has_batch: bool) -> np.ndarray:
    return a if has_batch else a[None]


# ---------------------------------------------------------------------------------------------
# Softmax


@SETTINGS
@given(fixtures())
def test_softmax_rows_sum_to_one_or_zero_for_empty_rows(fx: dict[str, Any]) -> None:
    trace = trace_of(fx)
    has_batch = trace.inputs.has_batch
    weights = _with_batch(trace["softmax"].data, has_batch)  # (B, H, T, S)
    assert not np.isnan(weights).any()
    assert (weights >= 0).all() and (weights <= 1).all()
    sums = weights.sum(axis=-1)  # (B, H, T)
    empty = np.zeros(sums.shape, dtype=bool)
    for row in trace.empty_rows:
        empty[row] = True
    np.testing.assert_array_equal(sums[empty], 0.0)
    np.testing.assert_allclose(sums[~empty], 1.0, **ROW_SUM)
    # A row is empty exactly when the reference masks every key of it.
    if "masked" in trace:
        ref = _with_batch(reference(fx)["masked"], has_batch)
        np.testing.assert_array_equal(empty, np.isneginf(ref).all(axis=-1))
    else:
        assert trace.empty_rows == ()


@SETTINGS
@given(fixtures())
def test_disallowed_positions_get_exactly_zero(fx: dict[str, Any]) -> None:
    trace = trace_of(fx)
    ref = reference(fx)  # independent: which positions the loop reference sets to -inf
    if "masked" not in ref:
        assert "masked" not in trace
        return
    disallowed = np.isneginf(ref["masked"])
    np.testing.assert_array_equal(np.isneginf(trace["masked"].data), disallowed)
    assert (trace["softmax"].data[disallowed] == 0.0).all()  # exactly 0, not just tiny


# ---------------------------------------------------------------------------------------------
# Batches


def _slice_batch(fx: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    """The fixture of batch items start:stop (keeping the batch axis)."""
    out = dict(fx)
    for key in BATCHED:
        if key in fx:
            out[key] = fx[key][start:stop]
    for key in ("mask", "bias"):  # only a 4-axis array with a real batch axis is per item
        value = fx.get(key)
        if isinstance(value, list) and np.ndim(value) == 4 and len(value) > 1:
            out[key] = value[start:stop]
    if "lengths" in fx:
        out["lengths"] = fx["lengths"][start:stop]
    return out


def _check_same(whole: Trace, parts: list[Trace], bounds: list[tuple[int, int]]) -> None:
    assert all(list(p.stages) == list(whole.stages) for p in parts)
    for name in whole.stages:
        joined = np.concatenate([p[name].data for p in parts], axis=0)
        np.testing.assert_allclose(joined, whole[name].data, err_msg=name, **SAME)
    rows = [
        (b + start, h, i)
        for p, (start, _) in zip(parts, bounds, strict=True)
        for b, h, i in p.empty_rows
    ]
    assert tuple(rows) == whole.empty_rows


@SETTINGS
@given(fixtures(batched=True))
def test_batch_traced_whole_equals_items_one_by_one(fx: dict[str, Any]) -> None:
    whole = trace_of(fx)
    bounds = [(b, b + 1) for b in range(whole.inputs.batch)]
    _check_same(whole, [trace_of(_slice_batch(fx, *ab)) for ab in bounds], bounds)


@SETTINGS
@given(fixtures(batched=True), st.data())
def test_result_does_not_depend_on_how_the_batch_is_split(
    fx: dict[str, Any], data: st.DataObject
) -> None:
    whole = trace_of(fx)
    B = whole.inputs.batch
    cuts = sorted(set(data.draw(st.lists(st.integers(1, B - 1), max_size=2)))) if B > 1 else []
    edges = [0, *cuts, B]
    bounds = list(itertools.pairwise(edges))
    _check_same(whole, [trace_of(_slice_batch(fx, *ab)) for ab in bounds], bounds)


# ---------------------------------------------------------------------------------------------
# Grouped-query attention


def _repeat_blocks(rows: list[list[float]], n: int, group: int) -> list[list[float]]:
    """Each row's n column blocks, block g repeated ``group`` times: [g0 g0 g1 g1 ...]."""
    d = len(rows[0]) // n
    return [
        [x for h in range(n * group) for x in row[(h // group) * d : (h // group + 1) * d]]
        for row in rows
    ]


def _ungrouped(fx: dict[str, Any], heads: int, kv_heads: int) -> dict[str, Any]:
    """The same fixture with K/V (or W_K/W_V, b_K/b_V) repeated so that kv_heads == heads."""
    group = heads // kv_heads
    out = dict(fx, kv_heads=heads) if "kv_heads" in fx else dict(fx)
    if "X" in fx:
        for key in ("W_K", "W_V"):
            out[key] = _repeat_blocks(fx[key], kv_heads, group)
        for key in ("b_K", "b_V"):
            if key in fx:
                out[key] = _repeat_blocks([fx[key]], kv_heads, group)[0]
    elif np.ndim(fx["K"]) == 4:  # [batch, kv_heads, seq, d]: query head h reads h // group
        for key in ("K", "V"):
            out[key] = [[item[h // group] for h in range(heads)] for item in fx[key]]
    else:
        for key in ("K", "V"):
            if np.ndim(fx[key]) == 2:
                out[key] = _repeat_blocks(fx[key], kv_heads, group)
            else:
                out[key] = [_repeat_blocks(item, kv_heads, group) for item in fx[key]]
    return out


@SETTINGS
@given(fixtures())
def test_gqa_equals_attention_with_repeated_keys_and_values(fx: dict[str, Any]) -> None:
    grouped = trace_of(fx)
    H, Hkv = grouped.inputs.heads, grouped.inputs.kv_heads
    plain = trace_of(_ungrouped(fx, H, Hkv))
    assert plain.inputs.kv_heads == H
    for name in grouped.stages:
        if name in ("K", "V"):
            # the grouped K/V, each head repeated H // Hkv times along the head axis
            g = _with_batch(grouped[name].data, grouped.inputs.has_batch)
            want = np.stack([g[:, h // (H // Hkv)] for h in range(H)], axis=1)
            got = _with_batch(plain[name].data, plain.inputs.has_batch)
            np.testing.assert_allclose(got, want, err_msg=name, **SAME)
        else:
            np.testing.assert_allclose(plain[name].data, grouped[name].data, err_msg=name, **SAME)
    assert plain.empty_rows == grouped.empty_rows
