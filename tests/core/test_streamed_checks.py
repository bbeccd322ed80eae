"""Flash's streamed self-check and the blocked backward (issue 27), against references written
here or committed: the loop forward of tests/reference.py, the plain-Python two-pass softmax and
finite differences of test_flash_cli's fixtures, torch.autograd's gradients of
tests/reference/torch_backward.json, and the whole backward pass (itself checked against them).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import random_fixture
from reference import reference as loop_reference
from test_flash_cli import capped, fixture, two_pass

from attn_cli.api import load, trace_file
from attn_cli.check import references, runs
from attn_cli.check.references import reference_rows
from attn_cli.check.runs import flash_failure, internal, query_key, run_flash
from attn_cli.core import backward as core_backward
from attn_cli.core import flash as core_flash
from attn_cli.core import gradients as core_gradients
from attn_cli.core.chain import Chain, allowed_span, cells_of
from attn_cli.core.gradients import backward_needs, blocked
from attn_cli.core.pipeline import run
from attn_cli.io.examples import example_paths

Array = np.ndarray[Any, Any]
F64 = 1e-12
INPUT_GRADIENTS = (
    "d_Q",
    "d_K",
    "d_V",
    "d_X",
    "d_X_kv",
    "d_W_Q",
    "d_W_K",
    "d_W_V",
    "d_b_Q",
    "d_b_K",
    "d_b_V",
    "d_output",
    "d_concat",
    "d_projected",
    "d_W_O",
    "d_b_O",
    "d_Q_rot",
    "d_K_rot",
    "d_Q_norm",
    "d_K_norm",
    "d_gate",
    "d_gated",
    "d_W_G",
    "d_b_G",
    "delta",
)
TORCH = Path(__file__).parent.parent / "reference" / "torch_backward.json"


def _refused(name: str, what: str) -> bool:
    from attn_cli.core.pipeline import refuse
    from attn_cli.errors import AttnError

    try:
        refuse(load(name), what)
    except AttnError:
        return True
    return False


FLASH_EXAMPLES = [n for n in sorted(example_paths()) if not _refused(n, "FlashAttention")]
BACKWARD_EXAMPLES = [n for n in sorted(example_paths()) if not _refused(n, "the backward pass")]


# ---------------------------------------------------------------------------------------------
# Flash's reference rows


def _reference_of(trace: Any) -> tuple[Array, Array]:
    inp = trace.inputs
    q, k = internal(trace, query_key(inp, "Q")), internal(trace, query_key(inp, "K"))
    return reference_rows(trace, q, k, internal(trace, "V"))


@pytest.mark.slow
@pytest.mark.parametrize("name", FLASH_EXAMPLES)
def test_reference_rows_equal_the_loop_reference(name: str) -> None:
    """O and L of every bundled example flash runs, as tests/reference.py's loops give them."""
    import yaml

    inputs = load(name)
    trace = run(inputs, keep={"Q", "K", "V", query_key(inputs, "Q"), query_key(inputs, "K")})
    fx = yaml.safe_load(example_paths()[name].read_text())
    if "mask_value" in fx:  # a finite sentinel: flash masks with −∞ (the loop with the sentinel)
        fx = {k: v for k, v in fx.items() if k != "mask_value"}
    want = loop_reference(fx, lse=True)
    out, L = _reference_of(trace)
    has_batch = trace.inputs.has_batch
    np.testing.assert_allclose(out if has_batch else out[0], want["output"], rtol=0, atol=F64)
    np.testing.assert_allclose(L if has_batch else L[0], want["lse"], rtol=0, atol=F64)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    seq=st.integers(1, 7),
    causal=st.sampled_from([None, True, "lower-right"]),
    window=st.sampled_from([None, 2]),
    softcap=st.sampled_from([None, 1.5]),
    sinks=st.booleans(),
    cells=st.integers(1, 40),
)
def test_reference_rows_are_the_loop_reference_at_any_block(
    seed: int, seq: int, causal: Any, window: Any, softcap: Any, sinks: bool, cells: int
) -> None:
    """Random fixtures (GQA, the score variants, sinks), blocks of any size: the loop's O, L."""
    if causal is None:
        window = None  # a window looks back only: it needs causal
    extra = {k: v for k, v in (("window", window), ("softcap", softcap)) if v is not None}
    fx = random_fixture(
        seed,
        mode="direct",
        layout=4,
        batch=2,
        seq=seq,
        seq_k=seq + 1,
        heads=4,
        kv_heads=2,
        causal=causal,
        sinks=sinks,
        **extra,
    )
    inputs = load_dict(fx)
    trace = run(inputs, keep={"Q", "K", "V"})
    want = loop_reference(fx, lse=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(references, "REF_CELLS", cells)
        out, L = _reference_of(trace)
    np.testing.assert_allclose(out, want["output"], rtol=0, atol=F64)
    np.testing.assert_allclose(L, want["lse"], rtol=0, atol=F64)


def load_dict(fx: dict[str, Any]) -> Any:
    from attn_cli.io.validate import validate

    return validate(json.loads(json.dumps(fx)), "random.json")


def test_the_span_is_what_the_rules_allow() -> None:
    """allowed_span: from the first key any row may see to the last (causal, then a window)."""
    inputs = load("mistral_sliding_window")
    chain = Chain(inputs)
    T = inputs.seq_q
    window = int(inputs.window)  # type: ignore[arg-type]
    for t0 in range(T):
        cells = cells_of(inputs, slice(0, 1), slice(0, 1), slice(t0, t0 + 1))
        # the query at t0 sees keys t0 - window + 1 .. t0 (Mistral's window counts itself)
        assert allowed_span(chain, cells) == (max(0, t0 - window + 1), t0 + 1), t0


@pytest.mark.slow
def test_a_big_run_keeps_no_score_stage_and_checks_o_and_l(tmp_path: Path) -> None:
    """Above BIG_SCORES cells the trace keeps Q, K, V only; O and L are checked (and pass)."""
    path, _ = fixture(tmp_path, H=1, Hkv=1, T=2100, S=2100)
    run_ = run_flash(str(path), block_q=256, block_k=256, max_tiles=3)
    assert set(run_.trace.stages) == {"Q", "K", "V"}
    assert [c.name for c in run_.checks] == ["output", "lse"] and run_.ok
    assert run_.checks[0].max_abs <= 1e-13


@pytest.mark.parametrize(
    "bug", ["acc_not_rescaled", "sum_not_rescaled", "lse_without_max", "extra_skip"]
)
def test_every_wrong_kernel_fails_the_streamed_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bug: str
) -> None:
    """With no score stage kept (as above BIG_SCORES), O or L alone catch each mistake."""
    monkeypatch.setattr(runs, "BIG_SCORES", 0)
    path, _ = fixture(tmp_path, H=4, Hkv=2, T=9, S=9)
    right = run_flash(str(path), block_q=2, block_k=2)
    assert [c.name for c in right.checks] == ["output", "lse"] and right.ok

    def wrong(q: Array, k: Array, v: Array, **kw: Any) -> Any:
        setup = core_flash._Setup(
            kw["chain"],
            kw["scale"],
            kw["origin"],
            kw["causal_offset"],
            kw["base2"],
            kw["record_tiles"],
        )
        return core_flash._forward(
            q, k, v, kw["block_q"], kw["block_k"], setup, core_flash.FlashBugs(**{bug: True})
        )

    monkeypatch.setattr(core_flash, "flash_forward", wrong)  # read at each call
    failure = flash_failure(run_flash(str(path), block_q=2, block_k=2))
    assert failure is not None
    assert "differs from the trace's" in str(failure)


@pytest.mark.slow
@pytest.mark.parametrize("name", FLASH_EXAMPLES)
def test_every_head_at_once_is_each_head_alone(name: str) -> None:
    """The loop without tiles (every head of a batch item per product) gives the per-head
    loop's O and L to rounding, and the tiles shown are those of the per-head loop."""
    from attn_cli.check.runs import flash_args

    trace = run(load(name))
    args = flash_args(trace)
    whole = core_flash.flash_forward(**args, block_q=2, block_k=3, record_tiles=False)
    alone = core_flash.flash_forward(**args, block_q=2, block_k=3, record_tiles=True)
    assert not whole.tiles and alone.tiles
    np.testing.assert_allclose(whole.output, alone.output, rtol=0, atol=F64)
    np.testing.assert_allclose(whole.lse, alone.lse, rtol=0, atol=F64)


def test_the_shown_tiles_overwrite_their_blocks_bit_for_bit(tmp_path: Path) -> None:
    """A shown tile's last accumulator over its l is the O written for its rows, exactly."""
    path, _ = fixture(tmp_path, H=2, Hkv=1, T=6, S=6, causal=None)
    run_ = run_flash(str(path), block_q=2, block_k=3, max_tiles=2)  # head 0, rows 0..1
    last = run_.tiles[1]
    assert last.k_block == (3, 6) and last.q_block == (0, 2)
    np.testing.assert_array_equal(run_.output[0, 0, 0:2], last.acc / last.l[:, None])


def test_softcap_two_pass_still_matches(tmp_path: Path) -> None:
    """The plain-Python two-pass softmax (test_flash_cli's), softcap and GQA, no score stage."""
    path, arrays = fixture(tmp_path, H=4, Hkv=2, T=7, S=7, softcap=0.7)
    run_ = run_flash(str(path), block_q=3, block_k=2)
    out, L = two_pass(arrays, 0, 0.7)
    np.testing.assert_allclose(run_.output, out, rtol=0, atol=F64)
    np.testing.assert_allclose(run_.lse, L, rtol=0, atol=F64)
    assert capped(10.0, 0.7) < 0.7  # the reference caps


# ---------------------------------------------------------------------------------------------
# The blocked backward


def _input_gradients(trace: Any) -> list[str]:
    return [s for s in INPUT_GRADIENTS if s in trace.applicable]


@pytest.mark.parametrize("name", BACKWARD_EXAMPLES)
def test_blocked_gradients_equal_the_whole_pass(name: str) -> None:
    """Every bundled example: the input gradients kept alone equal the whole pass's."""
    inputs = load(name)
    whole = run(inputs, backward=True)
    keep = _input_gradients(whole)
    part = run(inputs, keep=keep, backward=True)
    chain = Chain(inputs)  # a sink, MLA's absorbed form, diff's second map: the whole pass
    whole_only = chain.extra or any(v.side_stages or v.out_reads for v, _ in chain.on)
    assert blocked(inputs, keep) == (not whole_only)
    for stage in keep:
        ref = whole[stage].data
        tol = 1e-9 * (1 + float(np.max(np.abs(ref), initial=0.0)))
        np.testing.assert_allclose(part[stage].data, ref, rtol=0, atol=tol, err_msg=stage)


def test_blocked_holds_no_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """The blocked pass reads lse, never softmax, and never runs the whole pass."""
    inputs = load("llama_rope_gqa")
    keep = {"d_Q", "d_K", "d_V"}
    needs = backward_needs(inputs, keep)
    assert "lse" in needs and "softmax" not in needs and "scaled" not in needs

    def whole(*args: Any) -> Any:
        raise AssertionError("the whole backward ran")

    monkeypatch.setattr(core_gradients, "attention_backward", whole)
    trace = run(inputs, keep=keep, backward=True)
    assert list(trace.stages) == ["d_V", "d_Q", "d_K"] or set(trace.stages) == keep
    with pytest.raises(AssertionError, match="whole backward"):
        run(inputs, keep={*keep, "softmax"}, backward=True)  # weights kept: the whole pass


@pytest.mark.parametrize("cells", [1, 5, 64])
def test_blocked_gradients_match_torch_at_any_block(
    monkeypatch: pytest.MonkeyPatch, cells: int
) -> None:
    """torch.autograd's float64 gradients (projection mode, GQA, causal, W_O, every bias, a
    random upstream), committed: the blocked pass at blocks of any size."""
    monkeypatch.setattr(core_backward, "BLOCK_CELLS", cells)
    ref = json.loads(TORCH.read_text())
    fx = {
        k: ref[k]
        for k in (
            "X",
            "W_Q",
            "W_K",
            "W_V",
            "W_O",
            "b_Q",
            "b_K",
            "b_V",
            "b_O",
            "heads",
            "kv_heads",
            "causal",
            "grad",
            "scale",
        )
    }
    keep = ["d_Q", "d_K", "d_V", "d_X", "d_W_Q", "d_W_K", "d_W_V", "d_b_Q", "d_b_V", "d_W_O"]
    inputs = load_dict(fx)
    assert blocked(inputs, keep)
    trace = run(inputs, keep=keep, backward=True)
    for stage in keep:
        want = np.array(ref[stage])
        np.testing.assert_allclose(trace[stage].data, want, rtol=1e-10, atol=1e-13, err_msg=stage)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("softcap", "causal"), [(None, "upper-left"), (0.8, "lower-right"), (None, None)]
)
def test_blocked_gradients_match_finite_differences(
    tmp_path: Path, softcap: float | None, causal: str | None
) -> None:
    """Central differences of L = Σ output, the output from the plain-Python two-pass softmax
    (GQA: 4 query heads on 2 kv heads; a softcap), against the blocked d_Q, d_K, d_V."""
    extra: dict[str, Any] = {} if softcap is None else {"softcap": softcap}
    path, arrays = fixture(tmp_path, H=4, Hkv=2, T=4, S=5, causal=causal, **extra)
    trace = trace_file(str(path), stages=["d_Q", "d_K", "d_V"], backward=True)
    assert blocked(trace.inputs, ["d_Q", "d_K", "d_V"])
    offset = {None: None, "upper-left": 0, "lower-right": 1}[causal]
    step = 1e-6
    for name in ("Q", "K", "V"):
        numeric = np.zeros_like(arrays[name])
        for idx in np.ndindex(*arrays[name].shape):
            total = []
            for sign in (1, -1):
                moved = {**arrays, name: arrays[name].copy()}
                moved[name][idx] += sign * step
                total.append(two_pass(moved, offset, softcap)[0].sum())
            numeric[idx] = (total[0] - total[1]) / (2 * step)
        np.testing.assert_allclose(
            trace[f"d_{name}"].data, numeric, rtol=1e-6, atol=1e-7, err_msg=name
        )
    assert math.isfinite(float(trace["d_Q"].data.sum()))


def test_the_memory_estimate_of_the_blocked_backward() -> None:
    """Blocked, the estimate holds no (T, S) array: far below one head's weights at 8,192."""
    from attn_cli.core.memory import memory_needed

    T = 8192
    inputs = load_dict(
        {
            "Q": [[0.0] * 16] * T,
            "K": [[0.0] * 4] * T,
            "V": [[0.0] * 4] * T,
            "heads": 8,
            "kv_heads": 2,
            "causal": True,
        }
    )
    blocked_bytes = memory_needed(inputs, {"d_Q", "d_K", "d_V"}, 8, backward=True)
    whole_bytes = memory_needed(inputs, {"d_Q", "d_K", "d_V", "softmax"}, 8, backward=True)
    assert blocked_bytes < 8 * T * T  # one head's (T, T) weights in float64: 512 MiB
    assert whole_bytes > 8 * 8 * T * T * 4  # every head's weights and three more (T, S) arrays
