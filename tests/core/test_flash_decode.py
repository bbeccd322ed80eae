"""FlashAttention-2 tiles and KV-cache decoding against references written here.

The references are plain Python loops with math.exp/math.log (a two-pass softmax: the row max,
then the sum; Gemma 2's softcap with math.tanh on the scaled score before the bias and the
mask), a naive full recompute for every decode step, a tiny RoPE, counts and ring-buffer
contents worked by hand, and torch.logsumexp numbers committed in tests/reference/torch_lse.json.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_cli.check.grade_decode import decode_mistakes, flash_mistakes  # core's and the variants'
from attn_cli.core.chain import Chain
from attn_cli.core.decode import DecodeMistake, DecodeResult, decode, kv_cache_bytes, self_check
from attn_cli.core.flash import LOG2E, FlashMistake, FlashResult, flash_forward, lse
from attn_cli.core.inputs import Inputs

F64 = 1e-12  # float64 absolute tolerance: the order of summation moves the last bits only
NEG = -math.inf
Array = np.ndarray[Any, Any]


def close(actual: Any, desired: Any, atol: float = F64, rtol: float = 0.0) -> None:
    """assert_allclose with the stated tolerance (-inf equals -inf)."""
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------
# The chain core runs, built from the settings these tests give (as attn builds it from a fixture)


def chain_of(
    q: Array,
    k: Array,
    v: Array,
    causal: str | None = None,
    positions: Any = None,
    **variants: Any,
) -> Chain:
    """The chain of a direct-mode fixture holding q, k, v and these variants' settings (None:
    off); ``positions`` serve queries and keys alike."""
    B, H, T, D = q.shape
    pos = None if positions is None else np.asarray(positions, dtype=np.int64)
    fields = {n: x for n, x in variants.items() if n in Inputs.__dataclass_fields__}
    extra = {n: x for n, x in variants.items() if n not in fields and x is not None}  # by name
    inputs = Inputs(
        source="test",
        mode="direct",
        has_batch=True,
        batch=B,
        seq_q=T,
        seq_k=k.shape[2],
        heads=H,
        kv_heads=k.shape[1],
        d_k=D,
        d_v=v.shape[3],
        Q=q,
        K=k,
        V=v,
        causal=causal,  # type: ignore[arg-type]
        positions=pos,
        key_positions=pos,
        **fields,
        extra=extra,
    )
    return Chain(inputs)


def _flash_chain(q: Array, k: Array, v: Array, kw: dict[str, Any]) -> Chain:
    """The chain for flash: causal as ``causal_offset`` says (0 upper-left, S - T lower-right),
    the boolean ``allowed`` as the fixture's mask."""
    offset = kw.get("causal_offset")
    T, S = q.shape[2], k.shape[2]
    assert offset in (None, 0, S - T)
    causal = None if offset is None else "upper-left" if offset == 0 else "lower-right"
    settings = {n: kw.pop(n, None) for n in ("bias", "sinks", "softcap")}
    return chain_of(q, k, v, causal, mask=kw.pop("allowed", None), **settings)


def flash_run(q: Array, k: Array, v: Array, **kw: Any) -> FlashResult:
    """flash_forward with the chain of ``allowed``, ``bias``, ``sinks``, ``softcap``."""
    return flash_forward(q, k, v, chain=_flash_chain(q, k, v, kw), **kw)


def flash_mistakes_of(q: Array, k: Array, v: Array, **kw: Any) -> tuple[FlashMistake, ...]:
    """flash_mistakes with the chain of the settings, as ``flash_run``."""
    return flash_mistakes(q, k, v, chain=_flash_chain(q, k, v, kw), **kw)


def _decode_chain(q: Array, k: Array, v: Array, kw: dict[str, Any]) -> Chain:
    """The chain for decoding: causal at ``positions``, with ``window``, ``sinks``, ``bias``,
    ``softcap``."""
    settings = {n: kw.pop(n, None) for n in ("window", "sinks", "bias", "softcap")}
    return chain_of(q, k, v, "upper-left", list(kw["positions"]), **settings)


def decode_run(q: Array, k: Array, v: Array, **kw: Any) -> DecodeResult:
    """decode with the chain of the settings."""
    return decode(q, k, v, chain=_decode_chain(q, k, v, kw), **kw)


def decode_mistakes_of(q: Array, k: Array, v: Array, **kw: Any) -> tuple[DecodeMistake, ...]:
    """decode_mistakes with the chain of the settings."""
    return decode_mistakes(q, k, v, chain=_decode_chain(q, k, v, kw), **kw)


# ---------------------------------------------------------------------------------------------
# The loop reference: a two-pass softmax per row, with math.exp and math.log


def loop_attention(
    q: Array,
    k: Array,
    v: Array,
    scale: float,
    allowed: Array | None = None,
    bias: Array | None = None,
    sinks: Array | None = None,
    softcap: float | None = None,
) -> tuple[Array, Array, Array, Array]:
    """masked (B, H, T, S), weights, output (B, H, T, Dv) and lse (B, H, T), one row at a time.

    With ``softcap`` c a scaled score x becomes c·tanh(x/c) before the bias and the mask."""
    B, H, T, D = q.shape
    Hkv, S, Dv = k.shape[1], k.shape[2], v.shape[3]
    masked = np.full((B, H, T, S), NEG)
    weights = np.zeros((B, H, T, S))
    out = np.zeros((B, H, T, Dv))
    L = np.full((B, H, T), NEG)
    for b in range(B):
        for h in range(H):
            g = h // (H // Hkv)
            for i in range(T):
                row = []
                for j in range(S):
                    if allowed is not None and not allowed[b, h, i, j]:
                        row.append(NEG)
                        continue
                    dot = sum(float(q[b, h, i, d]) * float(k[b, g, j, d]) for d in range(D))
                    x = dot * scale
                    if softcap is not None:
                        x = softcap * math.tanh(x / softcap)
                    extra = 0.0 if bias is None else float(bias[b, h, i, j])
                    row.append(x + extra)
                masked[b, h, i] = row
                logits = row + ([float(sinks[h])] if sinks is not None else [])
                top = max(logits)  # pass 1: the row max
                if top == NEG:
                    continue
                total = sum(math.exp(x - top) for x in logits)  # pass 2: the sum
                L[b, h, i] = top + math.log(total)
                for j in range(S):
                    weights[b, h, i, j] = math.exp(row[j] - top) / total
                for e in range(Dv):
                    out[b, h, i, e] = sum(
                        weights[b, h, i, j] * float(v[b, g, j, e]) for j in range(S)
                    )
    return masked, weights, out, L


def causal(T: int, S: int, offset: int) -> Array:
    """Key j allowed for query i when j <= i + offset (0 upper-left, S - T lower-right)."""
    return np.array([[j <= i + offset for j in range(S)] for i in range(T)])


def random_qkv(
    rng: np.random.Generator, B: int, H: int, Hkv: int, T: int, S: int, D: int, Dv: int
) -> tuple[Array, Array, Array]:
    return (
        rng.normal(size=(B, H, T, D)),
        rng.normal(size=(B, Hkv, S, D)),
        rng.normal(size=(B, Hkv, S, Dv)),
    )


# ---------------------------------------------------------------------------------------------
# lse


def test_lse_against_math_loop_and_rebuilds_weights() -> None:
    rng = np.random.default_rng(1)
    masked = rng.normal(size=(2, 3, 4, 5)) * 3
    masked[rng.random(masked.shape) < 0.3] = NEG
    masked[0, 1, 2] = NEG  # a row with nothing allowed
    got = lse(masked)
    for idx in np.ndindex(*masked.shape[:-1]):
        row = [float(x) for x in masked[idx]]
        top = max(row)
        want = NEG if top == NEG else top + math.log(sum(math.exp(x - top) for x in row))
        assert got[idx] == pytest.approx(want, abs=1e-13) if want != NEG else got[idx] == NEG
    # weights = exp(masked - lse): rows sum to 1, an empty row is all zeros
    safe = np.where(np.isneginf(got), 0.0, got)[..., None]
    sums = np.exp(masked - safe).sum(axis=-1)
    close(sums, np.where(np.isneginf(got), 0.0, 1.0))
    assert got[0, 1, 2] == NEG


def test_lse_of_huge_scores_does_not_overflow() -> None:
    masked = np.array([[1000.0, 1000.0, NEG], [-1000.0, -1001.0, -1002.0]])
    want = [1000 + math.log(2), -1000 + math.log(1 + math.exp(-1) + math.exp(-2))]
    close(lse(masked), want, rtol=1e-15)


def test_lse_with_sinks_is_lse_of_the_row_and_the_sink() -> None:
    rng = np.random.default_rng(2)
    masked = rng.normal(size=(1, 3, 2, 4))
    masked[0, 2, 1] = NEG
    sinks = np.array([0.5, -1.0, 2.0])
    got = lse(masked, sinks)
    for _, h, i in np.ndindex(1, 3, 2):
        row = [*masked[0, h, i], sinks[h]]
        top = max(row)
        assert got[0, h, i] == pytest.approx(top + math.log(sum(math.exp(x - top) for x in row)))
    assert got[0, 2, 1] == pytest.approx(2.0, abs=1e-15)  # only the sink is left


# ---------------------------------------------------------------------------------------------
# flash_forward against the two-pass loop

SHAPES = [  # (B, H, Hkv, T, S, D, Dv)
    (1, 1, 1, 5, 5, 3, 2),
    (1, 4, 2, 7, 9, 3, 2),  # GQA, S > T
    (2, 2, 1, 6, 4, 2, 3),  # MQA, S < T
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode", ["none", "upper-left", "lower-right"])
def test_flash_equals_two_pass_softmax_for_every_block_size(
    shape: tuple[int, ...], mode: str
) -> None:
    B, H, Hkv, T, S, D, Dv = shape
    rng = np.random.default_rng(sum(shape))
    q, k, v = random_qkv(rng, B, H, Hkv, T, S, D, Dv)
    offset = {"none": None, "upper-left": 0, "lower-right": S - T}[mode]
    allowed = None if offset is None else np.broadcast_to(causal(T, S, offset), (B, H, T, S))
    masked, weights, out, L = loop_attention(q, k, v, 0.6, allowed)
    for bq in range(1, T + 2):  # block sizes that divide T and S, and those that do not
        for bk in range(1, S + 2):
            r = flash_run(q, k, v, scale=0.6, block_q=bq, block_k=bk, causal_offset=offset)
            close(r.output, out)
            np.testing.assert_array_equal(np.isneginf(r.lse), np.isneginf(L))
            close(r.lse, L)  # -inf rows compare equal
            safe = np.where(np.isneginf(r.lse), 0.0, r.lse)[..., None]
            close(np.exp(masked - safe), weights)


def test_flash_with_mask_bias_and_empty_rows() -> None:
    rng = np.random.default_rng(3)
    q, k, v = random_qkv(rng, 2, 2, 2, 5, 6, 3, 2)
    allowed = rng.random((2, 2, 5, 6)) < 0.6
    allowed[1, 0, 3] = False  # nothing allowed: O = 0, L = -inf, no NaN, no warning
    bias = rng.normal(size=(5, 6))
    _, _, out, L = loop_attention(q, k, v, 0.5, allowed, np.broadcast_to(bias, (2, 2, 5, 6)))
    r = flash_run(q, k, v, scale=0.5, allowed=allowed, bias=bias, block_q=2, block_k=4)
    close(r.output, out)
    close(r.lse, L)
    assert np.all(r.output[1, 0, 3] == 0.0) and r.lse[1, 0, 3] == NEG
    assert not np.isnan(r.output).any() and not np.isnan(r.lse).any()


def test_flash_with_sinks_as_gpt_oss() -> None:
    rng = np.random.default_rng(4)
    q, k, v = random_qkv(rng, 1, 4, 2, 6, 6, 3, 2)
    sinks = np.array([0.3, -2.0, 1.5, 4.0])
    allowed = np.broadcast_to(causal(6, 6, 0), (1, 4, 6, 6))
    _, _, out, L = loop_attention(q, k, v, 0.7, allowed, sinks=sinks)
    for bq, bk in [(1, 1), (2, 4), (4, 3), (6, 6)]:
        r = flash_run(q, k, v, scale=0.7, block_q=bq, block_k=bk, causal_offset=0, sinks=sinks)
        close(r.output, out)
        close(r.lse, L)
    # a sink of -inf is no sink at all (issue 10's invariant)
    none = flash_run(q, k, v, scale=0.7, block_q=2, block_k=2, causal_offset=0)
    minus_inf = flash_run(
        q, k, v, scale=0.7, block_q=2, block_k=2, causal_offset=0, sinks=np.full(4, NEG)
    )
    close(minus_inf.output, none.output)
    close(minus_inf.lse, none.lse)
    # a row with nothing allowed keeps only the sink: O = 0, L = sink
    empty = np.ones((1, 4, 6, 6), bool)
    empty[0, :, 2] = False
    r = flash_run(q, k, v, scale=0.7, allowed=empty, block_q=4, block_k=4, sinks=sinks)
    assert np.all(r.output[0, :, 2] == 0.0)
    close(r.lse[0, :, 2], sinks)


@pytest.mark.parametrize("cap", [0.5, 2.0, 50.0])
def test_flash_with_softcap_equals_two_pass_softmax(cap: float) -> None:
    """Gemma 2: capped before the bias, the mask and the running max, for every block size."""
    rng = np.random.default_rng(int(cap * 10))
    q, k, v = (x * 3 for x in random_qkv(rng, 1, 4, 2, 6, 7, 3, 2))  # scores well past the cap
    allowed = np.broadcast_to(causal(6, 7, 1), (1, 4, 6, 7))
    bias = rng.normal(size=(6, 7))
    want = loop_attention(q, k, v, 0.6, allowed, np.broadcast_to(bias, (1, 4, 6, 7)), softcap=cap)
    masked, _, out, L = want
    allowed_cells = np.isfinite(masked)
    assert np.all(np.abs((masked - bias)[allowed_cells]) <= cap + F64)  # squashed into [-c, c]
    for bq, bk in [(1, 1), (2, 3), (4, 2), (6, 7)]:
        r = flash_run(
            q, k, v, scale=0.6, bias=bias, block_q=bq, block_k=bk, causal_offset=1, softcap=cap
        )
        close(r.output, out)
        close(r.lse, L)
        for t in r.tiles:  # S is the capped (+ bias, masked) block of the reference
            if not t.skipped:
                (t0, t1), (s0, s1) = t.q_block, t.k_block
                close(t.S, masked[0, t.head, t0:t1, s0:s1])
        two = flash_run(
            q,
            k,
            v,
            scale=0.6,
            bias=bias,
            block_q=bq,
            block_k=bk,
            causal_offset=1,
            softcap=cap,
            base2=True,
        )
        close(two.output, out)
        close(two.lse * math.log(2), L)
    plain = flash_run(q, k, v, scale=0.6, bias=bias, block_q=2, block_k=2, causal_offset=1)
    assert np.abs(plain.output - out).max() > 1e-3  # the cap changes the answer


# ---------------------------------------------------------------------------------------------
# the tiles themselves


def test_causal_skipped_tiles_worked_by_hand() -> None:
    rng = np.random.default_rng(5)
    # upper-left, T = S = 5, blocks of 2: query blocks [0,2) [2,4) [4,5), key blocks the same.
    # [0,2) sees keys 0..1: key blocks [2,4) and [4,5) wholly above the diagonal (2 skipped);
    # [2,4) sees keys 0..3: [4,5) skipped (1); [4,5) sees everything. 3 per head.
    q, k, v = random_qkv(rng, 1, 2, 2, 5, 5, 2, 2)
    r = flash_run(q, k, v, scale=1.0, block_q=2, block_k=2, causal_offset=0)
    skipped = {(t.head, t.q_block, t.k_block) for t in r.tiles if t.skipped}
    want = {((0, 2), (2, 4)), ((0, 2), (4, 5)), ((2, 4), (4, 5))}
    assert skipped == {(h, *qk) for h in (0, 1) for qk in want}
    assert len(r.tiles) == 2 * 3 * 3
    # lower-right, T = 3, S = 5 (offset 2): [0,2) sees keys 0..3, so only [4,5) is skipped
    q, k, v = random_qkv(rng, 1, 1, 1, 3, 5, 2, 2)
    r = flash_run(q, k, v, scale=1.0, block_q=2, block_k=2, causal_offset=2)
    assert [(t.q_block, t.k_block) for t in r.tiles if t.skipped] == [((0, 2), (4, 5))]


def test_a_skipped_tile_computes_nothing_and_keeps_the_state() -> None:
    rng = np.random.default_rng(6)
    q, k, v = random_qkv(rng, 1, 1, 1, 4, 4, 2, 2)
    r = flash_run(q, k, v, scale=1.0, block_q=1, block_k=1, causal_offset=0)
    for before, tile in zip(r.tiles, r.tiles[1:], strict=False):
        if tile.skipped:
            assert tile.S is None and tile.P is None and tile.alpha is None
            np.testing.assert_array_equal(tile.m, before.m)
            np.testing.assert_array_equal(tile.l, before.l)
            np.testing.assert_array_equal(tile.acc, before.acc)
    assert sum(t.skipped for t in r.tiles) == 6  # 4·3/2 tiles above the diagonal


def test_tile_recurrence_by_hand() -> None:
    """One query row, two key blocks of one key each, worked with math.exp."""
    q = np.array([[[[1.0, 0.0]]]])
    k = np.array([[[[1.0, 0.0], [3.0, 0.0]]]])
    v = np.array([[[[10.0], [20.0]]]])
    r = flash_run(q, k, v, scale=1.0, block_q=1, block_k=1)
    first, second = r.tiles
    assert first.m[0] == 1.0 and first.alpha[0] == 0.0 and first.l[0] == 1.0  # type: ignore[index]
    assert first.acc[0, 0] == 10.0
    assert second.m[0] == 3.0
    assert second.alpha[0] == pytest.approx(math.exp(-2))  # type: ignore[index]
    assert second.l[0] == pytest.approx(math.exp(-2) + 1)
    assert second.acc[0, 0] == pytest.approx(10 * math.exp(-2) + 20)
    assert r.output[0, 0, 0, 0] == pytest.approx((10 * math.exp(-2) + 20) / (math.exp(-2) + 1))
    assert r.lse[0, 0, 0] == pytest.approx(3 + math.log(math.exp(-2) + 1))


def test_base2_equals_base_e() -> None:
    # Triton's constant, 1.44269504, is log2(e) rounded to float32
    assert np.float32(1.44269504) == np.float32(LOG2E)
    assert pytest.approx(1 / math.log(2), rel=1e-15) == LOG2E
    rng = np.random.default_rng(7)
    q, k, v = random_qkv(rng, 2, 2, 1, 5, 7, 3, 2)
    e = flash_run(q, k, v, scale=0.5, block_q=2, block_k=3, causal_offset=2)
    two = flash_run(q, k, v, scale=0.5, block_q=2, block_k=3, causal_offset=2, base2=True)
    close(two.output, e.output)
    close(two.lse * math.log(2), e.lse)
    for te, t2 in zip(e.tiles, two.tiles, strict=True):
        close(t2.m, te.m * LOG2E)
        close(t2.l, te.l)  # sums and rescales are the same numbers
        if not te.skipped:
            close(t2.S, te.S * LOG2E)  # type: ignore[operator]
            close(t2.P, te.P)


def test_float32_error_in_ulps() -> None:
    """float32 moves the last bits (summation order), not the math: a few ulps at most."""
    rng = np.random.default_rng(8)
    q, k, v = random_qkv(rng, 1, 2, 2, 8, 8, 4, 3)
    v = np.add(1.0, rng.random(v.shape))  # outputs in [1, 2]: one ulp is 2^-23 everywhere
    allowed = np.broadcast_to(causal(8, 8, 0), (1, 2, 8, 8))
    _, _, out, L = loop_attention(q, k, v, 0.5, allowed)
    f32 = [x.astype(np.float32) for x in (q, k, v)]
    r = flash_run(*f32, scale=0.5, block_q=3, block_k=3, causal_offset=0)
    assert r.output.dtype == np.float32 and r.lse.dtype == np.float32
    ulps_out = np.abs(r.output - out) / np.spacing(np.abs(out).astype(np.float32))
    ulps_lse = np.abs(r.lse - L) / np.spacing(np.abs(L).astype(np.float32))
    print(f"float32 flash: output {ulps_out.max():.1f} ulp, lse {ulps_lse.max():.1f} ulp")
    assert ulps_out.max() <= 16
    assert ulps_lse.max() <= 64  # lse near 0 has tiny ulps; its absolute error is ~1e-7


@settings(max_examples=40, deadline=None)
@given(
    T=st.integers(1, 7),
    S=st.integers(1, 7),
    bq=st.integers(1, 8),
    bk=st.integers(1, 8),
    mode=st.sampled_from([None, "upper-left", "lower-right"]),
    cap=st.sampled_from([None, 0.3, 5.0]),
    seed=st.integers(0, 2**16),
)
def test_results_do_not_depend_on_block_sizes(
    T: int, S: int, bq: int, bk: int, mode: str | None, cap: float | None, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(rng, 1, 2, 1, T, S, 3, 2)
    offset = {None: None, "upper-left": 0, "lower-right": S - T}[mode]
    kw: dict[str, Any] = {"scale": 0.8, "causal_offset": offset, "softcap": cap}
    one = flash_run(q, k, v, block_q=T, block_k=S, **kw)
    tiled = flash_run(q, k, v, block_q=bq, block_k=bk, **kw)
    close(tiled.output, one.output)
    np.testing.assert_array_equal(np.isneginf(tiled.lse), np.isneginf(one.lse))
    close(tiled.lse, one.lse)


# ---------------------------------------------------------------------------------------------
# flash mistakes


def test_each_flash_mistake_differs_from_the_right_answer() -> None:
    rng = np.random.default_rng(9)
    q, k, v = random_qkv(rng, 1, 2, 1, 6, 6, 3, 2)
    kw: dict[str, Any] = {"scale": 0.9, "block_q": 2, "block_k": 2, "causal_offset": 0}
    right = flash_run(q, k, v, **kw)
    mistakes = {m.name: m.result for m in flash_mistakes_of(q, k, v, **kw)}
    assert set(mistakes) == {
        "acc_not_rescaled",
        "sum_not_rescaled",
        "lse_without_max",
        "lse_base2",
        "causal_extra_skip",
    }
    for name, wrong in mistakes.items():
        d_out = np.abs(wrong.output - right.output).max()
        finite = np.isfinite(wrong.lse) & np.isfinite(right.lse)
        d_lse = np.abs(wrong.lse - right.lse)[finite].max(initial=0.0)
        changed = np.isfinite(wrong.lse) != np.isfinite(right.lse)
        assert max(d_out, d_lse) > 1e-3 or changed.any(), name
    close(mistakes["lse_base2"].lse, right.lse * LOG2E)
    close(mistakes["lse_without_max"].output, right.output)
    # causal_extra_skip: the first query block loses its only tile, so its rows are empty
    assert np.all(mistakes["causal_extra_skip"].lse[0, :, :2] == NEG)
    # without causal the skip mistake does not apply
    no_causal = flash_mistakes_of(q, k, v, scale=0.9, block_q=2, block_k=2)
    assert "causal_extra_skip" not in {m.name for m in no_causal}


def test_rescale_mistakes_vanish_with_one_key_block() -> None:
    """With one key block there is nothing to rescale: the mistakes only show across blocks."""
    rng = np.random.default_rng(10)
    q, k, v = random_qkv(rng, 1, 1, 1, 4, 5, 2, 2)
    right = flash_run(q, k, v, scale=1.0, block_q=2, block_k=5)
    for m in flash_mistakes_of(q, k, v, scale=1.0, block_q=2, block_k=5):
        if m.name in ("acc_not_rescaled", "sum_not_rescaled"):
            close(m.result.output, right.output)
            close(m.result.lse, right.lse)


# ---------------------------------------------------------------------------------------------
# torch.logsumexp numbers (made once by tests/reference/torch_lse.py; torch not needed here)


def test_lse_and_flash_against_committed_torch_numbers() -> None:
    data = json.loads((Path(__file__).parent.parent / "reference" / "torch_lse.json").read_text())
    q, k, v = (np.array(data[n], dtype=np.float64) for n in ("q", "k", "v"))
    allowed = np.array(data["allowed"], dtype=bool)
    masked = np.array(data["masked"], dtype=np.float64)
    sinks = np.array(data["sinks"])
    want = np.array(data["lse"], dtype=np.float64)
    assert np.isneginf(want).sum() == 1  # the row with nothing allowed
    close(lse(masked), want)
    close(lse(masked, sinks), np.array(data["lse_with_sinks"]))
    r = flash_run(q, k, v, scale=data["scale"], allowed=allowed, block_q=2, block_k=4)
    close(r.lse, want)
    out = np.array(
        [
            [[[math.nan if x is None else x for x in row] for row in head] for head in batch]
            for batch in data["output"]
        ]
    )
    defined = ~np.isnan(out)  # torch's softmax of a row of -inf is NaN; ours is 0
    close(r.output[defined], out[defined])
    assert np.all(r.output[~defined] == 0.0)


# ---------------------------------------------------------------------------------------------
# KV-cache decoding against a naive full recompute per step


def rope(x: Array, positions: Array, base: float = 10000.0) -> Array:
    """Half-layout RoPE (GPT-NeoX, HF rotate_half): pair i with i + D/2, angle = p·base^(-2i/D)."""
    D = x.shape[-1]
    inv_freq = base ** (-np.arange(0, D, 2) / D)  # (D/2,)
    angle = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]  # (n, D/2)
    cos, sin = np.cos(angle), np.sin(angle)
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def naive_full(
    q: Array,
    k: Array,
    v: Array,
    scale: float,
    positions: Array,
    rotate: Callable[[Array, Array], Array] | None = None,
    window: int | None = None,
    sinks: Array | None = None,
    bias: Array | None = None,
    softcap: float | None = None,
) -> Array:
    """Every token's output recomputed from scratch (B, H, T, Dv): keys 0..i, rotated anew."""
    B, H, T, _ = q.shape
    pos = np.asarray(positions)
    if rotate is not None:
        q, k = rotate(q, pos), rotate(k, pos)
    allowed = np.zeros((B, H, T, T), dtype=bool)
    for i in range(T):
        for j in range(i + 1):
            allowed[:, :, i, j] = window is None or 0 <= pos[i] - pos[j] < window
    full_bias = None if bias is None else np.broadcast_to(bias, (B, H, T, T))
    return loop_attention(q, k, v, scale, allowed, full_bias, sinks, softcap)[2]


def check_decode(result: DecodeResult, full: Array) -> None:
    """Every step and the prefill equal the full recompute to 1e-12."""
    P = result.prefill
    close(result.prefill_output, full[:, :, :P])
    assert [s.index for s in result.steps] == list(range(P, full.shape[2]))
    for step in result.steps:
        close(step.output[:, :, 0], full[:, :, step.index])
    assert max(self_check(result, full), default=0.0) <= 1e-12


CASES = {  # name: (B, H, Hkv, T, rope?, window, sinks?, bias?, softcap)
    "mha": (1, 2, 2, 6, False, None, False, False, None),
    "gqa": (2, 4, 2, 7, False, None, False, False, None),
    "rope": (1, 2, 2, 7, True, None, False, False, None),
    "window": (1, 2, 1, 7, False, 3, False, False, None),
    "sinks": (1, 2, 2, 6, False, None, True, False, None),
    "alibi_bias": (1, 2, 2, 6, False, None, False, True, None),
    "gpt_oss_like": (1, 4, 2, 8, True, 3, True, False, None),
    "softcap": (1, 2, 2, 6, False, None, False, False, 0.4),
    "gemma2_like": (2, 4, 2, 7, True, 4, False, True, 1.5),  # softcap, window, GQA, bias
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("prefill", [1, 3])
def test_every_decode_step_equals_the_full_recompute(case: str, prefill: int) -> None:
    B, H, Hkv, T, use_rope, window, use_sinks, use_bias, softcap = CASES[case]
    rng = np.random.default_rng(T * 10 + H)
    q, k, v = random_qkv(rng, B, H, Hkv, T, T, 4, 3)
    if softcap is not None:
        q = q * 3  # scores well past the cap
    sinks = rng.normal(size=H) if use_sinks else None
    pos = np.arange(T)
    slopes = 0.5 ** np.arange(1, H + 1)[:, None, None]  # 0.5, 0.25, ...
    bias = -slopes * np.abs(pos[:, None] - pos[None, :]) if use_bias else None  # (H, T, T)
    rotate = rope if use_rope else None
    kw: dict[str, Any] = {
        "scale": 0.5,
        "positions": pos,
        "rotate": rotate,
        "window": window,
        "sinks": sinks,
        "bias": bias,
        "softcap": softcap,
    }
    full = naive_full(q, k, v, **kw)
    result = decode_run(q, k, v, prefill=prefill, **kw)
    check_decode(result, full)
    for step in result.steps:  # capped: the scaled row through c·tanh(x/c), with a softcap only
        if softcap is None:
            assert step.capped is None
        else:
            assert step.capped is not None
            want = [
                [[softcap * math.tanh(float(x) / softcap) for x in row] for row in head]
                for head in step.scaled[0]
            ]
            close(step.capped[0], want)


def test_prefill_of_everything_leaves_no_steps() -> None:
    rng = np.random.default_rng(12)
    q, k, v = random_qkv(rng, 1, 1, 1, 4, 4, 2, 2)
    r = decode_run(q, k, v, scale=1.0, prefill=4, positions=range(4))
    assert r.steps == ()
    close(r.prefill_output, naive_full(q, k, v, 1.0, np.arange(4)))


def test_rope_decode_depends_only_on_relative_positions() -> None:
    rng = np.random.default_rng(13)
    q, k, v = random_qkv(rng, 1, 2, 2, 6, 6, 4, 2)
    at0 = decode_run(q, k, v, scale=0.5, prefill=2, positions=np.arange(6), rotate=rope)
    at7 = decode_run(q, k, v, scale=0.5, prefill=2, positions=np.arange(7, 13), rotate=rope)
    check_decode(at7, naive_full(q, k, v, 0.5, np.arange(7, 13), rope))
    for a, b in zip(at0.steps, at7.steps, strict=True):
        close(a.output, b.output)


def test_keys_are_rotated_once_at_their_own_position() -> None:
    rng = np.random.default_rng(14)
    q, k, v = random_qkv(rng, 1, 2, 1, 5, 5, 4, 2)
    r = decode_run(q, k, v, scale=0.5, prefill=2, positions=np.arange(5), rotate=rope)
    last = r.steps[-1]
    assert last.cache_positions == (0, 1, 2, 3, 4) and last.slots == 5
    close(last.K_cache, rope(k, np.arange(5)))
    close(last.V_cache, v)
    assert last.Q_rot is not None
    close(last.Q_rot[:, :, 0], rope(q, np.arange(5))[:, :, 4])
    np.testing.assert_array_equal(last.Q, q[:, :, 4:5])
    # each step keeps the cache it saw
    first = r.steps[0]
    assert first.cache_positions == (0, 1, 2) and first.K_cache.shape == (1, 1, 3, 4)


def test_ring_buffer_worked_by_hand() -> None:
    """window 3, seq 7: slot = position mod 3, the oldest key evicted as each new one arrives."""
    rng = np.random.default_rng(15)
    q, k, v = random_qkv(rng, 1, 2, 1, 7, 7, 2, 2)
    r = decode_run(q, k, v, scale=1.0, prefill=1, positions=np.arange(7), window=3)
    assert [s.slot for s in r.steps] == [1, 2, 0, 1, 2, 0]
    assert [s.cache_positions for s in r.steps] == [
        (0, 1, -1),
        (0, 1, 2),
        (3, 1, 2),
        (3, 4, 2),
        (3, 4, 5),
        (6, 4, 5),
    ]
    assert all(s.slots == 3 for s in r.steps)
    first = r.steps[0]  # the empty slot is masked out and gets no weight
    assert np.all(first.masked[..., 2] == NEG) and np.all(first.softmax[..., 2] == 0.0)
    # a prefill of 4 leaves slots holding positions 3, 1, 2
    r4 = decode_run(q, k, v, scale=1.0, prefill=4, positions=np.arange(7), window=3)
    assert [s.cache_positions for s in r4.steps] == [(3, 4, 2), (3, 4, 5), (6, 4, 5)]
    np.testing.assert_array_equal(r4.steps[-1].K_cache[:, :, 0], k[:, :, 6])
    check_decode(r4, naive_full(q, k, v, 1.0, np.arange(7), window=3))


@pytest.mark.parametrize("window", [None, 3])
def test_steps_hold_views_of_one_cache_and_recompute_their_rows_to_the_bit(
    window: int | None,
) -> None:
    """A decode holds O(T) numbers (issue 27): every step's cache is a view or a gather of one
    array of the tokens' keys, not a copy kept per step, and a step's score rows, computed
    again when read, are the ones its output came from, bit for bit."""
    rng = np.random.default_rng(16)
    q, k, v = random_qkv(rng, 2, 4, 2, 9, 9, 4, 3)
    r = decode_run(
        q, k, v, scale=0.5, prefill=2, positions=np.arange(9), rotate=rope, window=window
    )
    assert len({id(s.cache.K) for s in r.steps}) == 1  # one array of keys for every step
    if window is None:
        assert all(np.shares_memory(s.K_cache, r.steps[-1].K_cache) for s in r.steps)
    for s in r.steps:
        again = s.attend.compute(s.index, s.Q if s.Q_rot is None else s.Q_rot, s.cache)
        np.testing.assert_array_equal(again.output, s.output)  # the same bits as the run's
        np.testing.assert_array_equal(again.softmax, s.softmax)
        for h in range(4):  # output = the weights times the cached values of the head's group
            want = np.einsum("bc,bcd->bd", s.softmax[:, h, 0], s.V_cache[:, h // 2])
            close(want, s.output[:, h, 0])
    check_decode(r, naive_full(q, k, v, 0.5, np.arange(9), rope, window=window))


def test_window_of_the_whole_sequence_equals_plain_causal() -> None:
    rng = np.random.default_rng(16)
    q, k, v = random_qkv(rng, 1, 2, 2, 5, 5, 2, 2)
    plain = decode_run(q, k, v, scale=1.0, prefill=1, positions=range(5))
    wide = decode_run(q, k, v, scale=1.0, prefill=1, positions=range(5), window=5)
    for a, b in zip(plain.steps, wide.steps, strict=True):
        close(a.output, b.output)


def test_sinks_weights_sum_to_less_than_one() -> None:
    rng = np.random.default_rng(17)
    q, k, v = random_qkv(rng, 1, 2, 2, 4, 4, 2, 2)
    r = decode_run(q, k, v, scale=1.0, prefill=1, positions=range(4), sinks=np.array([1.0, -1.0]))
    for step in r.steps:
        sums = step.softmax.sum(axis=-1)
        assert np.all(sums < 1.0) and np.all(sums > 0.0)


def test_self_check_reports_a_difference() -> None:
    rng = np.random.default_rng(18)
    q, k, v = random_qkv(rng, 1, 2, 2, 5, 5, 2, 2)
    full = naive_full(q, k, v, 1.0, np.arange(5))
    r = decode_run(q, k, v, scale=1.0, prefill=2, positions=range(5))
    assert len(self_check(r, full)) == 3 and max(self_check(r, full[0])) <= 1e-12  # no batch axis
    wrong = full.copy()
    wrong[0, 1, 3, 0] += 0.25
    diffs = self_check(r, wrong)
    assert diffs[1] == pytest.approx(0.25) and max(diffs[0], diffs[2]) <= 1e-12


def test_kv_cache_bytes_worked_by_hand() -> None:
    # Llama-like: 32 heads, 8 kv heads, d 128, float16: 2 * 8 * 128 * 2 = 4096 bytes a token
    llama = kv_cache_bytes(kv_heads=8, heads=32, d_k=128, d_v=128, itemsize=2, seq=4096)
    assert (llama.per_token, llama.per_token_mha, llama.per_token_mqa) == (4096, 16384, 512)
    assert (llama.total, llama.total_mha, llama.total_mqa) == (16 * 2**20, 64 * 2**20, 2 * 2**20)
    # GPT-2 small, float32: 12 heads of 64, MHA: 2 * 12 * 64 * 4 = 6144 bytes a token a layer
    assert kv_cache_bytes(12, 12, 64, 64, 4, 1024).per_token == 6144
    # d_v different from d_k: K and V counted separately, 3 * (4 + 2) * 8 = 144
    assert kv_cache_bytes(3, 6, 4, 2, 8, 10).total == 1440


# ---------------------------------------------------------------------------------------------
# decode mistakes


def test_each_decode_mistake_differs_from_the_right_answer() -> None:
    rng = np.random.default_rng(19)
    q, k, v = random_qkv(rng, 1, 4, 2, 7, 7, 4, 2)
    kw: dict[str, Any] = {
        "scale": 0.5,
        "prefill": 2,
        "positions": np.arange(7),
        "rotate": rope,
        "window": 3,
    }
    right = decode_run(q, k, v, **kw)
    mistakes = {m.name: m.result for m in decode_mistakes_of(q, k, v, **kw)}
    assert set(mistakes) == {
        "rerotate_cache",
        "restart_positions",
        "cache_by_query_head",
        "ring_buffer_off_by_one",
        "attend_before_append",
    }
    for name, wrong in mistakes.items():
        diff = max(
            np.abs(a.output - b.output).max() for a, b in zip(wrong.steps, right.steps, strict=True)
        )
        assert diff > 1e-3, name
    # what each one is, checked against the test's own RoPE
    restart = mistakes["restart_positions"].steps[0]  # token 2 rotated at position 0
    assert restart.Q_rot is not None
    close(restart.Q_rot, restart.Q)
    rerot = mistakes["rerotate_cache"].steps[0]  # key 0 rotated twice at position 0 ... and key 1
    close(rerot.K_cache[:, :, 1], rope(rope(k, np.arange(7)), np.arange(7))[:, :, 1])
    assert mistakes["ring_buffer_off_by_one"].steps[-1].slots == 4
    before = mistakes["attend_before_append"].steps[0]  # token 2 sees the cache of tokens 0, 1
    assert before.cache.held.tolist() == [0, 1, -1]


def test_decode_mistakes_that_cannot_apply_are_left_out() -> None:
    rng = np.random.default_rng(20)
    q, k, v = random_qkv(rng, 1, 2, 2, 4, 4, 2, 2)
    found = decode_mistakes_of(q, k, v, scale=1.0, prefill=1, positions=range(4))
    assert [m.name for m in found] == ["attend_before_append"]  # the one that any loop can make
