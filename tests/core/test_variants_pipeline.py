"""The variants wired through the fixture format and the pipeline (issue 10).

Numbers come from the loop reference in reference.py (written from the published code of each
variant, never from attn_cli), from invariants the issue lists, and from published values
(softcap 50 maps 10, 60, 120 to 9.8688, 41.6827, 49.1837; ALiBi slopes for 8 heads are
1/2 ... 1/256).
"""

from __future__ import annotations

import json
import math
import tracemalloc
from pathlib import Path
from typing import Any

import make_variant_fixtures
import numpy as np
import pytest
import yaml
from conftest import FIXTURES, Tolerance
from reference import (
    random_fixture,
    random_mla_fixture,
    reference,
    reference_empty_rows,
    reference_sentinel_rows,
)
from reference_linear import random_linear_fixture

from attn_cli.core.memory import memory_needed
from attn_cli.core.pipeline import Trace, run
from attn_cli.core.stages import (
    FORWARD_STAGE_NAMES,
    OPT_IN_STAGES,
    STAGE_NAMES,
    applicable_stages,
)
from attn_cli.errors import InputError
from attn_cli.io.fixture import load_fixture, validate
from attn_cli.io.trace_json import dumps

# both sides float64; only the order of summation (and libm's cos, sin, tanh) differ
REFERENCE: Tolerance = {"rtol": 1e-12, "atol": 1e-12}

CASES: dict[str, dict[str, Any]] = {
    # one variant at a time
    "rope half": {"mode": "direct", "heads": 2, "d_k": 4, "rope": True},
    "rope interleaved partial": {
        "heads": 2,
        "d_k": 6,
        "d_model": 5,
        "rope": {"layout": "interleaved", "dims": 4},
    },
    "rope base, positions": {
        "mode": "direct",
        "seq": 3,
        "seq_k": 4,
        "d_k": 4,
        "rope": {"base": 500, "dims": 2},
        "positions": [7, 2, 9],
        "key_positions": [0, 5, 1, 8],
    },
    "rope lower-right": {
        "mode": "direct",
        "layout": 3,
        "seq": 2,
        "seq_k": 5,
        "d_k": 4,
        "causal": "lower-right",
        "rope": True,
    },
    "alibi paper slopes, 3 heads": {"heads": 3, "alibi": True},
    "alibi given slopes, causal": {
        "mode": "direct",
        "heads": 2,
        "alibi_slopes": True,
        "causal": True,
    },
    "window": {"seq": 5, "causal": True, "window": 2},
    "window lower-right, positions": {
        "mode": "direct",
        "seq": 2,
        "seq_k": 5,
        "causal": "lower-right",
        "window": 3,
    },
    "softcap": {"mode": "direct", "softcap": 0.7, "magnitude": 2.0},
    "sinks": {"mode": "direct", "heads": 2, "sinks": True},
    "sinks with an empty row": {
        "mode": "direct",
        "heads": 2,
        "sinks": True,
        "mask": (3, 3),
        "lengths": None,
    },
    "qk_norm per head": {"heads": 2, "kv_heads": 1, "d_k": 3, "qk_norm": "head"},
    "qk_norm whole projection": {"heads": 2, "d_k": 3, "qk_norm": "projection", "qkv_bias": True},
    "cross-attention": {"seq": 3, "seq_k": 5, "cross": 6, "heads": 2, "W_O": True},
    "cross-attention batch, GQA": {
        "batch": 2,
        "seq": 2,
        "seq_k": 4,
        "cross": 3,
        "heads": 4,
        "kv_heads": 2,
        "causal": True,
    },
    "mask_value -1e4": {
        "mode": "direct",
        "causal": True,
        "mask_value": -1e4,
        "bias": (3, 3),
        "magnitude": 3.0,
    },
    "mask_value leaks": {"mode": "direct", "causal": True, "mask_value": -2.0, "lengths": [1]},
    "mask_value uniform row": {
        "mode": "direct",
        "layout": 3,
        "batch": 2,
        "lengths": [3, 0],
        "mask_value": -1e9,
    },
    "gate": {"heads": 2, "d_k": 3, "gate": True, "W_O": True},
    "gate with a bias, batch, one head": {"batch": 2, "gate": "bias", "magnitude": 3.0},
    "diff": {"heads": 2, "d_k": 4, "causal": True, "diff": True, "W_O": True},
    "diff, batch, per-head λ, lengths, softcap, alibi, bias, cross": {
        "batch": 2,
        "seq": 3,
        "seq_k": 4,
        "cross": 3,
        "heads": 2,
        "d_k": 4,
        "d_v": 3,
        "diff": "init",
        "lengths": [4, 2],
        "softcap": 1.5,
        "alibi": True,
        "bias": (4,),
        "mask_value": -1e4,
    },
    "diff, direct mode, window, scale": {
        "mode": "direct",
        "seq": 5,
        "heads": 2,
        "d_k": 6,
        "causal": True,
        "window": 2,
        "diff": True,
        "scale": 0.4,
    },
    # the combinations real models use
    "Qwen3-Next: gate + qk_norm + partial rope + GQA": {
        "seq": 5,
        "heads": 4,
        "kv_heads": 2,
        "d_k": 4,
        "causal": True,
        "qk_norm": "head",
        "rope": {"dims": 2},
        "gate": True,
        "W_O": True,
    },
    "gpt-oss: rope + GQA + window + sinks": {
        "seq": 5,
        "heads": 4,
        "kv_heads": 2,
        "d_k": 4,
        "d_model": 6,
        "causal": True,
        "rope": True,
        "window": 3,
        "sinks": True,
        "W_O": True,
        "b_O": True,
        "qkv_bias": True,
    },
    "Qwen3: rope + qk_norm + GQA": {
        "seq": 4,
        "heads": 4,
        "kv_heads": 2,
        "d_k": 4,
        "causal": True,
        "rope": True,
        "qk_norm": "head",
    },
    "Llama 4: temperature tuning + rope": {
        "seq": 6,
        "heads": 2,
        "d_k": 4,
        "causal": True,
        "rope": True,
        "temperature": {"floor_scale": 2, "attn_scale": 0.5},
    },
    "HunYuan: norm after rope + GQA": {
        "seq": 5,
        "heads": 2,
        "kv_heads": 1,
        "d_k": 4,
        "causal": True,
        "rope": {"base": 1000.0},
        "post_rope_norm": {
            "q_weight": [1.2, 0.6, 0.9, 1.4],
            "k_weight": [0.7, 1.3, 1.1, 0.8],
            "eps": 1e-5,
        },
    },
    "Llama 4: weightless norm after rope, temperature": {
        "seq": 5,
        "heads": 2,
        "d_k": 4,
        "causal": True,
        "rope": True,
        "post_rope_norm": {"eps": 1e-5},
        "temperature": {"floor_scale": 2, "attn_scale": 0.5},
    },
    "OLMo: clip_qkv + rope + GQA": {
        "seq": 4,
        "heads": 2,
        "kv_heads": 1,
        "d_k": 4,
        "causal": True,
        "rope": True,
        "clip_qkv": 0.5,
    },
    "StableLM 2: qk_layernorm per head + partial rope + GQA": {
        "seq": 4,
        "heads": 2,
        "kv_heads": 1,
        "d_k": 4,
        "causal": True,
        "rope": {"dims": 2},
        "qk_layernorm": {
            "q_weight": [[0.9, 1.2, 0.7, 1.1], [1.3, 0.8, 1.0, 0.6]],
            "k_weight": [[1.1, 0.5, 1.4, 0.9]],
            "eps": 1e-5,
        },
    },
    "Phi: qk_layernorm shared with biases + rope": {
        "seq": 3,
        "heads": 2,
        "d_k": 4,
        "causal": True,
        "rope": True,
        "qk_layernorm": {
            "q_weight": [0.9, 1.2, 0.7, 1.1],
            "k_weight": [1.1, 0.5, 1.4, 0.9],
            "q_bias": [0.1, -0.2, 0.0, 0.3],
            "k_bias": [-0.1, 0.2, 0.05, 0.0],
            "eps": 1e-3,
        },
    },
    "OLMo 2: qk_norm whole + rope": {
        "seq": 4,
        "heads": 2,
        "d_k": 4,
        "causal": True,
        "rope": True,
        "qk_norm": "projection",
    },
    "Gemma 2: softcap + window + GQA": {
        "seq": 5,
        "heads": 2,
        "kv_heads": 1,
        "d_k": 4,
        "causal": True,
        "window": 2,
        "softcap": 1.5,
        "rope": True,
        "magnitude": 2.0,
    },
    "BLOOM-like: alibi + lengths + batch": {
        "mode": "direct",
        "layout": 4,
        "batch": 2,
        "heads": 4,
        "alibi": True,
        "causal": True,
        "lengths": [3, 2],
    },
    "everything": {
        "batch": 2,
        "seq": 4,
        "seq_k": 5,
        "cross": 3,
        "heads": 4,
        "kv_heads": 2,
        "d_k": 4,
        "causal": "lower-right",
        "rope": {"layout": "interleaved", "dims": 2},
        "alibi": True,
        "window": 3,
        "softcap": 2.0,
        "sinks": True,
        "qk_norm": "projection",
        "bias": (4, 5),
        "mask_value": -1e4,
        "W_O": True,
        "scale": 0.3,
    },
    # multi-head latent attention (random_mla_fixture's arguments under "mla")
    "DeepSeek V3: MLA with q LoRA, causal, W_O": {"mla": {"W_O": True}},
    "DeepSeek V2-Lite: MLA without q LoRA, batch, mscale": {
        "mla": {"q_rank": None, "batch": 2, "heads": 3, "d_rope": 4, "d_v": 3, "mscale": 1.3},
    },
    # linear attention (random_linear_fixture's arguments under "linear")
    "linear attention, GQA, chunks of 2, W_O": {"linear": {"kv_heads": 1, "W_O": True}},
    "linear attention, batch, one chunk": {"linear": {"batch": 2, "heads": 1, "chunk": 8}},
    "Gated DeltaNet, 2 value heads per key head, W_O": {
        "linear": {"kind": "gated_deltanet", "heads": 4, "kv_heads": 2, "W_O": True},
    },
    "Gated DeltaNet, batch, chunks of 3": {
        "linear": {"kind": "gated_deltanet", "batch": 2, "seq": 7, "chunk": 3, "kernel": 4},
    },
}


def fixture(case: str, seed: int = 0) -> dict[str, Any]:
    if "linear" in CASES[case]:
        return random_linear_fixture(seed + 31 * len(case), **CASES[case]["linear"])
    if "mla" in CASES[case]:
        return random_mla_fixture(seed + 31 * len(case), **CASES[case]["mla"])
    return random_fixture(seed + 31 * len(case), **CASES[case])


def trace_of(fx: dict[str, Any], **kw: Any) -> Trace:
    return run(validate(fx, "test.json"), **kw)


# ---------------------------------------------------------------------------------------------
# Against the loop reference


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_the_loop_reference(case: str, seed: int) -> None:
    fx = fixture(case, seed)
    expected = reference(fx)
    trace = trace_of(fx)
    assert list(trace.stages) == list(expected)  # the same stages, in the issue's order
    for name, want in expected.items():
        got = trace[name].data
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got, want, err_msg=name, **REFERENCE)
    assert trace.empty_rows == reference_empty_rows(fx)
    leaks = reference_sentinel_rows(fx)
    assert [(r.batch, r.head, r.query, r.uniform) for r in trace.sentinel_rows] == [
        (b, h, i, uniform) for b, h, i, _, uniform in leaks
    ]
    np.testing.assert_allclose(
        [r.leaked for r in trace.sentinel_rows], [x[3] for x in leaks], **REFERENCE
    )


@pytest.mark.parametrize("case", [c for c in CASES if "linear" not in CASES[c]])  # softmax's
def test_lse_matches_the_reference_and_rebuilds_the_weights(case: str) -> None:
    fx = fixture(case)
    want = reference(fx, lse=True)
    trace = trace_of(fx, keep={"lse", "softmax", "masked", "capped", "scaled"})
    lse = trace["lse"].data
    np.testing.assert_allclose(lse, want["lse"], **REFERENCE)
    logits = next(trace[s].data for s in ("masked", "capped", "scaled") if s in trace)
    with np.errstate(invalid="ignore"):  # -inf - -inf in a row with nothing to attend to
        rebuilt = np.nan_to_num(np.exp(logits - lse[..., None]), nan=0.0)
    # exp(x - lse) loses the bits of lse's last place: ~1e-7 when a -1e9 sentinel fills a row
    spacing = float(np.spacing(np.abs(lse[np.isfinite(lse)])).max(initial=0.0))
    np.testing.assert_allclose(rebuilt, trace["softmax"].data, rtol=1e-12, atol=1e-12 + 2 * spacing)
    assert trace["lse"].axes[-2:] == ("head", "query")


def test_the_cases_cover_every_variant_stage() -> None:
    seen = {name for case in CASES for name in reference(fixture(case), lse=True)}
    assert seen == set(FORWARD_STAGE_NAMES)


# ---------------------------------------------------------------------------------------------
# lse is opt-in; --stage subsets are bit-identical to a full run


def test_lse_is_opt_in() -> None:
    inputs = validate(fixture("sinks"), "t.json")
    assert OPT_IN_STAGES == ("lse",)
    assert "lse" not in run(inputs).stages
    assert "lse" not in applicable_stages(inputs)
    assert list(run(inputs, keep={"lse"}).stages) == ["lse"]
    assert "lse" in run(inputs, keep={"lse", "output"}).applicable


BIT_CASES = [
    "everything",
    "gpt-oss: rope + GQA + window + sinks",
    "Qwen3: rope + qk_norm + GQA",
    "mask_value uniform row",
]


@pytest.mark.parametrize("case", BIT_CASES)
def test_each_stage_alone_is_bit_identical_to_a_full_run(case: str) -> None:
    inputs = validate(fixture(case), "t.json")
    full = run(inputs, keep=set(STAGE_NAMES))
    for name in full.stages:
        alone = run(inputs, keep={name})
        assert list(alone.stages) == [name]
        assert np.array_equal(alone[name].data, full[name].data), name
    pair = run(inputs, keep={"output", "lse"})
    assert np.array_equal(pair["output"].data, full["output"].data)
    assert pair.sentinel_rows == full.sentinel_rows
    assert pair.empty_rows == full.empty_rows


# ---------------------------------------------------------------------------------------------
# Memory: a run keeping only the output never holds a (T, S) matrix, whatever the variants


@pytest.mark.slow
def test_output_alone_never_holds_a_score_matrix_with_every_variant() -> None:
    T, H, D = 4096, 2, 4  # one (T, T) float64 score matrix is 128 MiB
    rng = np.random.default_rng(0)
    fx = {
        "Q": rng.standard_normal((T, H * D)),
        "K": rng.standard_normal((T, D)),
        "V": rng.standard_normal((T, D)),
        "heads": H,
        "kv_heads": 1,
        "causal": True,
        "rope": True,
        "alibi": True,
        "window": 100,
        "softcap": 30.0,
        "sinks": [0.5, -0.5],
        "qk_norm": {"q_weight": np.ones(D), "k_weight": np.ones(D)},
        "mask_value": -1e9,
    }
    inputs = validate(fx, "big.json")
    matrix = T * T * 8
    tracemalloc.start()
    try:
        trace = run(inputs, keep={"output"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert list(trace.stages) == ["output"]
    assert peak < matrix / 4, f"peak {peak:,} bytes"  # a few blocks of rows at a time
    assert memory_needed(inputs, keep={"output"}) < memory_needed(inputs) / 4


def test_memory_estimate_counts_the_new_stages() -> None:
    plain = validate(fixture("window") | {"window": None}, "t.json")
    every = validate(fixture("window") | {"rope": True, "softcap": 3.0, "alibi": True}, "t.json")
    B, H, T, S = 1, 1, 5, 5
    # Q_rot and K_rot, capped and alibi kept, two more blocks for ALiBi
    grown = memory_needed(every) - memory_needed(plain)
    assert grown == 8 * (B * (H * T + H * S) * 2 + 2 * B * H * T * S + 2 * T * S)


# ---------------------------------------------------------------------------------------------
# Invariants the issue lists, through the whole pipeline


def test_window_at_least_the_sequence_is_plain_causal() -> None:
    fx = fixture("window")
    plain = trace_of(fx | {"window": None})
    wide = trace_of(fx | {"window": 5})
    for name in plain.stages:
        assert np.array_equal(plain[name].data, wide[name].data), name
    narrow = trace_of(fx | {"window": 1})["softmax"].data  # only itself: the identity
    np.testing.assert_array_equal(narrow[0], np.eye(5))


def test_a_sink_far_below_everything_is_no_sink() -> None:
    fx = fixture("sinks")
    none = trace_of(fx | {"sinks": None})
    far = trace_of(fx | {"sinks": [-1e300, -1e300]})
    for name in none.stages:
        assert np.array_equal(none[name].data, far[name].data), name


def test_sinks_take_weight_from_every_row() -> None:
    trace = trace_of(fixture("sinks"))
    sums = trace["softmax"].data.sum(axis=-1)
    assert (sums < 1).all() and (sums > 0).all()


def test_rope_scores_depend_only_on_the_position_difference() -> None:
    fx = random_fixture(3, mode="direct", seq=3, d_k=8, rope=True, causal=True)
    near = trace_of(fx | {"positions": [5, 6, 7], "key_positions": [3, 4, 5]})
    far = trace_of(fx | {"positions": [12, 13, 14], "key_positions": [10, 11, 12]})
    np.testing.assert_allclose(near["scores"].data, far["scores"].data, rtol=1e-12, atol=1e-12)
    assert not np.allclose(near["Q_rot"].data, far["Q_rot"].data)


def test_lower_right_puts_queries_at_the_last_key_positions() -> None:
    fx = fixture("rope lower-right")
    default = trace_of(fx)
    explicit = trace_of(fx | {"positions": [3, 4], "key_positions": [0, 1, 2, 3, 4]})
    for name in default.stages:
        assert np.array_equal(default[name].data, explicit[name].data), name


def test_rope_leaves_v_alone_and_rotates_partially() -> None:
    trace = trace_of(fixture("rope interleaved partial"))
    assert "V_rot" not in STAGE_NAMES
    # dims 4 of d_k 6: dimensions 4 and 5 pass through
    np.testing.assert_array_equal(trace["Q_rot"].data[..., 4:], trace["Q"].data[..., 4:])
    norms = np.linalg.norm  # a rotation keeps each vector's length
    np.testing.assert_allclose(
        norms(trace["Q_rot"].data, axis=-1), norms(trace["Q"].data, axis=-1), rtol=1e-13
    )


def test_softcap_50_published_values() -> None:
    # Q·K = 10, 60, 120 with scale 1; Gemma 2's cap of 50 (the values the issue quotes)
    fx = {
        "Q": [[1.0]],
        "K": [[10.0], [60.0], [120.0]],
        "V": [[1.0], [2.0], [3.0]],
        "scale": 1,
        "softcap": 50,
    }
    capped = trace_of(fx)["capped"].data[0, 0]
    np.testing.assert_allclose(capped, [9.8688, 41.6827, 49.1837], rtol=0, atol=5e-5)


def test_softcap_comes_before_the_mask() -> None:
    trace = trace_of(fixture("Gemma 2: softcap + window + GQA"))
    masked, capped = trace["masked"].data, trace["capped"].data
    allowed = np.isfinite(masked)
    np.testing.assert_array_equal(masked[allowed], capped[allowed])
    assert np.isneginf(masked[~allowed]).all()  # -inf, not softcap * tanh(-inf) = -softcap


def test_alibi_slopes_for_8_heads_are_the_papers() -> None:
    fx = random_fixture(0, mode="direct", heads=8, alibi=True)
    trace = trace_of(fx)
    assert trace.inputs.setting("alibi") is not None
    np.testing.assert_array_equal(trace.inputs.setting("alibi"), [2.0**-i for i in range(1, 9)])
    assert '"alibi": {"slopes": [0.5, 0.25,' in dumps(trace)


def test_bloom_style_alibi_differs_by_a_row_constant_that_softmax_cancels() -> None:
    fx = random_fixture(4, mode="direct", heads=2, seq=4, causal=True)
    slopes = [0.5, 0.25]
    paper = trace_of(fx | {"alibi": {"slopes": slopes}})
    bloom_bias = [[[m * j for j in range(4)]] for m in slopes]  # slope * key position (BLOOM)
    bloom = trace_of(fx | {"bias": bloom_bias})
    np.testing.assert_allclose(paper["softmax"].data, bloom["softmax"].data, rtol=1e-12)
    assert not np.allclose(
        paper["masked"].data[np.isfinite(paper["masked"].data)],
        bloom["masked"].data[np.isfinite(bloom["masked"].data)],
    )


def test_qk_norm_per_head_gives_unit_rms_times_the_weight() -> None:
    fx = fixture("qk_norm per head")
    fx["qk_norm"]["q_weight"] = [1.0, 1.0, 1.0]
    q_norm = trace_of(fx)["Q_norm"].data
    rms = np.sqrt((q_norm**2).mean(axis=-1))
    np.testing.assert_allclose(rms, 1.0, rtol=1e-5)  # eps 1e-6 against mean squares ~1


def test_a_sentinel_leaks_and_fills_empty_rows_uniformly() -> None:
    fx = {
        "Q": [[1.0], [1.0]],
        "K": [[1.0], [3.0]],
        "V": [[1.0], [2.0]],
        "scale": 1,
        "mask": [[True, False], [False, False]],
    }
    exact = trace_of(fx)
    assert exact.empty_rows == ((0, 0, 1),) and exact.sentinel_rows == ()
    np.testing.assert_array_equal(exact["softmax"].data[0, 1], [0, 0])
    leaky = trace_of(fx | {"mask_value": -1.0})
    first, second = leaky.sentinel_rows
    assert (first.query, first.uniform) == (0, False)
    # query 0: score 1 allowed, the hidden key filled with -1: weight 1 / (1 + e^2) leaks
    assert math.isclose(first.leaked, 1 / (1 + math.e**2), rel_tol=1e-13)
    assert (second.query, second.uniform, second.leaked) == (1, True, 1.0)
    np.testing.assert_array_equal(leaky["softmax"].data[0, 1], [0.5, 0.5])
    assert leaky.empty_rows == ()
    far = trace_of(fx | {"mask_value": -1e4})  # far below every score: no leak, but uniform
    assert [(r.query, r.uniform) for r in far.sentinel_rows] == [(1, True)]


def test_cross_attention_labels_and_shapes() -> None:
    fx = fixture("cross-attention") | {
        "tokens": ["a", "b", "c"],
        "key_tokens": ["v", "w", "x", "y", "z"],
    }
    trace = trace_of(fx)
    assert trace["X_kv"].axes == ("key", "d_model_kv")
    assert trace["scores"].shape == (2, 3, 5)
    assert trace["K"].formula == "K = X_kv·W_K"
    assert trace.key_labels == ("v", "w", "x", "y", "z")


def test_formulas_name_the_conventions() -> None:
    trace = trace_of(fixture("everything"))
    assert trace["scores"].formula == "scores = Q_rot·K_rotᵀ"
    assert "interleaved layout, base 10000, 2 of 4 dims" in trace["Q_rot"].formula
    assert trace["masked"].formula == (
        "masked = capped + bias + alibi, −10000 where not allowed (causal lower-right, window 3)"
    )
    assert "sink" in trace["softmax"].formula


def test_the_trace_config_records_the_variants_only_when_set() -> None:
    text = dumps(trace_of(fixture("gpt-oss: rope + GQA + window + sinks")))
    for key in (
        '"positions": [0, 1, 2, 3, 4]',
        '"rope": {"base": 10000.0, "layout": "half"',
        '"window": 3',
        '"sinks": [',
    ):
        assert key in text
    plain = dumps(trace_of(random_fixture(0)))
    for key in ("positions", "rope", "window", "sinks", "mask_value", "qk_norm", "alibi"):
        assert f'"{key}"' not in plain


# ---------------------------------------------------------------------------------------------
# NumPy files: the new array keys by reference, nested keys in a whole-fixture .npz


def test_npz_fixture_with_nested_variant_keys(tmp_path: Path) -> None:
    fx = fixture("Qwen3: rope + qk_norm + GQA")
    fx |= {
        "rope": {"layout": "interleaved", "base": 100.0},
        "sinks": [0.1, 0.2, 0.3, 0.4],
        "alibi": {"slopes": [0.5, 0.4, 0.3, 0.2]},
    }
    arrays: dict[str, Any] = {k: np.array(v) for k, v in fx.items() if not isinstance(v, dict)}
    for key in ("rope", "qk_norm", "alibi"):
        arrays |= {f"{key}.{sub}": np.array(v) for sub, v in fx[key].items()}
    np.savez(tmp_path / "fx.npz", **arrays)
    from_npz = run(load_fixture(tmp_path / "fx.npz"))
    from_lists = trace_of(fx)
    for name in from_lists.stages:
        assert np.array_equal(from_npz[name].data, from_lists[name].data), name


def test_file_references_and_npz_members_for_the_gate(tmp_path: Path) -> None:
    fx = fixture("gate with a bias, batch, one head")
    W_G, b_G = np.array(fx["gate"]["W_G"]), np.array(fx["gate"]["b_G"])
    np.save(tmp_path / "w_g.npy", W_G)
    np.savez(tmp_path / "g.npz", b_G=b_G)
    refs = fx | {"gate": {"W_G": {"file": "w_g.npy"}, "b_G": {"file": "g.npz", "key": "b_G"}}}
    (tmp_path / "fx.json").write_text(json.dumps(refs))
    members = {k: np.array(v) for k, v in fx.items() if k != "gate"}
    members |= {"gate.W_G": W_G, "gate.b_G": b_G}
    np.savez(tmp_path / "whole.npz", **members)  # type: ignore[arg-type]
    direct = trace_of(fx)
    for path in (tmp_path / "fx.json", tmp_path / "whole.npz"):
        by_file = run(load_fixture(path))
        assert "gated" in by_file.stages
        for name in direct.stages:
            assert np.array_equal(by_file[name].data, direct[name].data), (path, name)


def test_file_references_for_the_new_keys(tmp_path: Path) -> None:
    fx = fixture("cross-attention") | {"sinks": [0.3, -0.2], "causal": True}
    fx |= {"qk_norm": {"q_weight": [1.0, 2.0], "k_weight": [3.0, 2.0]}}
    np.save(tmp_path / "x_kv.npy", np.array(fx["X_kv"]))
    members = {"sinks": np.array(fx["sinks"]), "qk_norm.q_weight": np.array([1.0, 2.0])}
    np.savez(tmp_path / "w.npz", **members)  # type: ignore[arg-type]
    refs = fx | {
        "X_kv": {"file": "x_kv.npy"},
        "sinks": {"file": "w.npz"},
        "positions": [0, 1, 2],
        "qk_norm": {"q_weight": {"file": "w.npz"}, "k_weight": fx["qk_norm"]["k_weight"]},
    }
    import json

    (tmp_path / "fx.json").write_text(json.dumps(refs))
    by_file = run(load_fixture(tmp_path / "fx.json"))
    direct = trace_of(fx | {"positions": [0, 1, 2]})
    for name in direct.stages:
        assert np.array_equal(by_file[name].data, direct[name].data), name


# ---------------------------------------------------------------------------------------------
# Every nonsensical combination is one line naming the file, the field and what was expected

BASE: dict[str, Any] = {
    "Q": [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]],
    "K": [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]],
    "V": [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]],
}
PROJ: dict[str, Any] = {
    "X": [[1.0, 0.0], [0.0, 1.0]],
    "W_Q": [[1.0, 0.0], [0.0, 1.0]],
    "W_K": [[1.0, 0.0], [0.0, 1.0]],
    "W_V": [[1.0], [0.0]],
}

ERRORS: list[tuple[str, dict[str, Any], str, str]] = [
    ("window without causal", {"window": 2}, "window", "given without causal, expected causal"),
    ("window zero", {"window": 0, "causal": True}, "window", "is 0, expected a whole number >= 1"),
    ("window decimal", {"window": 1.5, "causal": True}, "window", "got the number 1.5"),
    ("window boolean", {"window": True, "causal": True}, "window", "got the boolean true"),
    (
        "rope odd d_k",
        {"Q": [[1.0, 0, 0]], "K": [[1.0, 0, 0]], "V": [[1.0]], "rope": True},
        "rope.dims",
        "is 3 (d_k, the default), expected an even whole number between 2 and d_k",
    ),
    ("rope odd dims", {"rope": {"dims": 1}}, "rope.dims", "is 1, expected an even whole number"),
    ("rope dims > d_k", {"rope": {"dims": 4}}, "rope.dims", "between 2 and d_k = 2"),
    (
        "rope layout",
        {"rope": {"layout": "meta"}},
        "rope.layout",
        "got the string 'meta', expected \"half\"",
    ),
    ("rope base", {"rope": {"base": 0}}, "rope.base", "is 0, expected a finite number > 0"),
    ("rope unknown key", {"rope": {"theta": 10000}}, "rope.theta", "unknown key, expected one of"),
    ("rope typo", {"rope": {"dim": 2}}, "rope.dim", "unknown key (did you mean 'dims'?)"),
    ("rope number", {"rope": 10000}, "rope", "got the number 10000, expected true or a mapping"),
    (
        "sinks length",
        {"heads": 2, "Q": [[1.0, 0.0]], "sinks": [0.1]},
        "sinks",
        "has 1 entries, expected one per query head (2)",
    ),
    ("sinks scalar", {"sinks": 0.5}, "sinks", "got the number 0.5, expected a list of heads"),
    ("sinks nan", {"sinks": [float("nan")]}, "sinks[0]", "is nan (not a number)"),
    (
        "alibi slopes length",
        {"alibi": {"slopes": [0.5, 0.25]}},
        "alibi.slopes",
        "has 2 entries, expected one per query head (1)",
    ),
    (
        "alibi negative slope",
        {"alibi": {"slopes": [-0.5]}},
        "alibi.slopes[0]",
        "is -0.5, expected a number >= 0",
    ),
    ("alibi string", {"alibi": "paper"}, "alibi", "got the string 'paper', expected true"),
    (
        "alibi unknown key",
        {"alibi": {"slope": [1.0]}},
        "alibi.slope",
        "unknown key (did you mean 'slopes'?)",
    ),
    ("softcap zero", {"softcap": 0}, "softcap", "is 0, expected a finite number > 0"),
    ("softcap string", {"softcap": "50"}, "softcap", "got the string '50', expected a number"),
    (
        "qk_norm weight length",
        {"qk_norm": {"q_weight": [1.0, 1.0, 1.0], "k_weight": [1.0, 1.0]}},
        "qk_norm.q_weight",
        "has length 3, expected d_k = 2 (each head) or heads*d_k = 2",
    ),
    (
        "qk_norm k weight length",
        {
            "heads": 2,
            "kv_heads": 1,
            "Q": [[1.0, 0.0, 0.0, 1.0]],
            "qk_norm": {"q_weight": [1.0] * 2, "k_weight": [1.0] * 4},
        },
        "qk_norm.k_weight",
        "kv_heads*d_k = 2 (the whole projection)",
    ),
    ("qk_norm k missing", {"qk_norm": {"q_weight": [1.0, 1.0]}}, "qk_norm.k_weight", "missing"),
    (
        "qk_norm eps",
        {"qk_norm": {"q_weight": [1.0, 1.0], "k_weight": [1.0, 1.0], "eps": -1}},
        "qk_norm.eps",
        "is -1, expected a finite number > 0",
    ),
    ("qk_norm list", {"qk_norm": [1.0, 1.0]}, "qk_norm", "got a list, expected a mapping"),
    ("qk_norm unknown", {"qk_norm": {"weight": [1.0]}}, "qk_norm.weight", "unknown key"),
    ("X_kv in direct mode", {"X_kv": [[1.0]]}, "X_kv", "given in direct mode"),
    (
        "positions length",
        {"causal": True, "positions": [0, 1]},
        "positions",
        "has 2 entries, expected a list of seq_q = 3 whole numbers >= 0",
    ),
    (
        "positions decimal",
        {"causal": True, "positions": [0, 1.5, 2]},
        "positions[1]",
        "got the number 1.5, expected a whole number >= 0",
    ),
    ("positions negative", {"causal": True, "positions": [0, -1, 2]}, "positions[1]", "is -1"),
    (
        "positions boolean",
        {"causal": True, "positions": [0, True, 2]},
        "positions[1]",
        "got the boolean true",
    ),
    ("key_positions length", {"causal": True, "key_positions": [0]}, "key_positions", "seq_k = 3"),
    (
        "positions unused",
        {"positions": [0, 1, 2]},
        "positions",
        "given but nothing reads positions, expected rope, alibi, window, chunk, temperature or "
        "causal",
    ),
    (
        "mask_value positive",
        {"causal": True, "mask_value": 1e9},
        "mask_value",
        "is 1000000000.0, expected -inf (the default) or a negative number",
    ),
    ("mask_value zero", {"causal": True, "mask_value": 0}, "mask_value", "is 0"),
    (
        "mask_value string",
        {"causal": True, "mask_value": "min"},
        "mask_value",
        "got the string 'min'",
    ),
    (
        "mask_value unmasked",
        {"mask_value": -1e4},
        "mask_value",
        "given but nothing is masked, expected causal, window, mask or lengths",
    ),
    (
        "gate in direct mode",
        {"gate": {"W_G": [[1.0, 0.0], [0.0, 1.0]]}},
        "gate",
        "given with Q, K and V directly, expected X and W_Q alongside it",
    ),
]

PROJ_ERRORS: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "X_kv rows",
        {"X_kv": [[1.0, 2.0, 3.0]]},
        "W_K",
        "has 2 rows, expected d_model_kv = 3 rows (columns of X_kv)",
    ),
    (
        "X_kv batch axis",
        {"X_kv": [[[1.0, 2.0]]]},
        "X_kv",
        "has 3 axes but X has 2, expected the layout of X",
    ),
    (
        "X_kv batch size",
        {"X": [[[1.0, 0.0]], [[0.0, 1.0]]], "X_kv": [[[1.0, 2.0]]]},
        "X_kv",
        "has batch 1, expected batch 2 as in X",
    ),
    ("X_kv one axis", {"X_kv": [1.0, 2.0]}, "X_kv", "has 1 axes"),
    (
        "gate W_G shape",
        {"gate": {"W_G": [[1.0, 0.0], [0.0, 1.0]]}},
        "gate.W_G",
        "has shape [2, 2], expected [d_model, heads*d_v] = [2, 1*1]",
    ),
    ("gate W_G one axis", {"gate": {"W_G": [1.0, 0.0]}}, "gate.W_G", "has 1 axes"),
    (
        "gate W_G nan",
        {"gate": {"W_G": [[1.0, float("nan")], [0.0, 1.0]]}},
        "gate.W_G[0][1]",
        "is nan (not a number)",
    ),
    (
        "gate W_G inf",
        {"gate": {"W_G": [[1.0, float("inf")], [0.0, 1.0]]}},
        "gate.W_G[0][1]",
        "is inf",
    ),
    ("gate W_G huge", {"gate": {"W_G": [[1.0, 10**400], [0.0, 1.0]]}}, "gate.W_G[0][1]", "is "),
    ("gate W_G string", {"gate": {"W_G": "ones"}}, "gate.W_G", "got the string 'ones'"),
    (
        "gate b_G length",
        {"gate": {"W_G": [[1.0], [0.0]], "b_G": [1.0, 0.0]}},
        "gate.b_G",
        "has length 2, expected heads*d_v = 1",
    ),
    ("gate W_G missing", {"gate": {"b_G": [1.0, 0.0]}}, "gate.W_G", "missing, expected W_G"),
    ("gate typo", {"gate": {"W_g": [[1.0, 0.0]]}}, "gate.W_g", "unknown key (did you mean"),
    ("gate list", {"gate": [[1.0, 0.0], [0.0, 1.0]]}, "gate", "got a list, expected a mapping"),
    ("gate true", {"gate": True}, "gate", "got the boolean true, expected a mapping"),
]


@pytest.mark.parametrize(
    ("snippet", "field", "fragment"),
    [pytest.param(s, f, m, id=i) for i, s, f, m in ERRORS]
    + [pytest.param(PROJ | s, f, m, id=i) for i, s, f, m in PROJ_ERRORS],
)
def test_nonsense_is_one_line_naming_file_field_and_expectation(
    snippet: dict[str, Any], field: str, fragment: str
) -> None:
    base = PROJ if "X" in snippet else BASE
    with pytest.raises(InputError) as caught:
        validate(base | snippet, "fix.yaml")
    msg = str(caught.value)
    assert "\n" not in msg
    assert msg.startswith(f"fix.yaml: {field}: "), msg
    assert ", expected " in msg, msg
    assert fragment in msg, msg


@pytest.mark.parametrize(
    "snippet",
    [
        {"rope": False, "alibi": False},  # false is off
        {"rope": {}, "causal": True, "positions": [3, 1, 2]},
        {"alibi": {"slopes": None}},  # null is omitted: the paper's slopes
        {"causal": True, "mask_value": "-inf"},
        {"causal": True, "mask_value": float("-inf")},
        {"qk_norm": {"q_weight": [1.0, 2.0], "k_weight": [2.0, 1.0], "eps": 1e-5}},
        {"causal": "lower-right", "window": 1},
    ],
)
def test_sensible_variant_keys_load(snippet: dict[str, Any]) -> None:
    run(validate(BASE | snippet, "fix.yaml"))


# ---------------------------------------------------------------------------------------------
# The bundled examples of the variants

VARIANT_EXAMPLES = list(make_variant_fixtures.MAKERS)


@pytest.mark.parametrize("name", VARIANT_EXAMPLES)
def test_bundled_example_is_what_the_script_writes(name: str) -> None:
    path = FIXTURES / f"{name}.yaml"
    assert path.read_text(encoding="utf-8") == make_variant_fixtures.MAKERS[name]()


@pytest.mark.parametrize("name", VARIANT_EXAMPLES)
def test_bundled_example_matches_the_loop_reference(name: str) -> None:
    raw = yaml.safe_load((FIXTURES / f"{name}.yaml").read_text(encoding="utf-8"))
    expected = reference(raw)
    trace = run(load_fixture(FIXTURES / f"{name}.yaml"))
    assert list(trace.stages) == list(expected)
    for stage, want in expected.items():
        np.testing.assert_allclose(trace[stage].data, want, err_msg=stage, **REFERENCE)
    assert trace.inputs.description and len(trace.inputs.tokens or ()) == trace.inputs.seq_q


def test_interleaved_llama_has_the_scores_of_the_half_layout() -> None:
    half = run(load_fixture(FIXTURES / "llama_rope_gqa.yaml"))
    meta = run(load_fixture(FIXTURES / "llama_rope_interleaved.yaml"))
    assert half.inputs.rope is not None and meta.inputs.rope is not None
    assert (half.inputs.rope.layout, meta.inputs.rope.layout) == ("half", "interleaved")
    assert not np.allclose(half["Q"].data, meta["Q"].data)  # other columns ...
    perm = [0, 2, 1, 3]  # ... the HF permute of d_k = 4: Meta column perm[r] is HF column r
    np.testing.assert_array_equal(meta["Q"].data[..., perm], half["Q"].data)
    for stage in ("scores", "softmax", "output"):  # ... the same attention
        np.testing.assert_allclose(meta[stage].data, half[stage].data, rtol=1e-12, atol=1e-14)


def test_mask_sentinel_example_leaks_and_goes_uniform() -> None:
    trace = run(load_fixture(FIXTURES / "mask_sentinel.yaml"))
    leaks = {(r.batch, r.query): r for r in trace.sentinel_rows}
    assert leaks[(0, 0)].leaked > 0.5 and not leaks[(0, 0)].uniform  # -1e4 beats the score
    assert all(leaks[(1, i)].uniform for i in range(4))
    np.testing.assert_allclose(trace["softmax"].data[1], 0.25, rtol=1e-15)
    raw = yaml.safe_load((FIXTURES / "mask_sentinel.yaml").read_text(encoding="utf-8"))
    exact = trace_of({k: v for k, v in raw.items() if k != "mask_value"})
    assert exact.sentinel_rows == () and len(exact.empty_rows) == 4
    np.testing.assert_array_equal(exact["softmax"].data[1], 0.0)


def test_gptoss_rows_sum_below_one_and_gemma_scores_stay_under_the_cap() -> None:
    sums = run(load_fixture(FIXTURES / "gptoss_sinks.yaml"))["softmax"].data.sum(axis=-1)
    assert (sums < 1).all()
    gemma = run(load_fixture(FIXTURES / "gemma2_softcap.yaml"))
    assert np.abs(gemma["scaled"].data).max() > 5 > np.abs(gemma["capped"].data).max()
