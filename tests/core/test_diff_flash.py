"""FlashAttention of differential attention: two tiled softmax maps per head over the same V
tiles (Q1·K1ᵀ and Q2·K2ᵀ, as the reference's multihead_flashdiff_1.py calls flash_attn_func
twice), then diff_output = O1 − λ·O2. Against the loop reference of tests/reference.py (every
stage written as loops from the paper's formula) for any tile sizes, and a second map written in
the test as a plain two-pass softmax."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import random_fixture, reference

from attn_cli.check.runs import check_flash
from attn_cli.core.pipeline import run
from attn_cli.io.validate import validate


def second_map_rows(Q: Any, K: Any, V: Any, scale: float, causal: bool) -> tuple[Any, Any]:
    """O2 (H, T, Dv) and L2 (H, T) of one batch item: each row's max, then its sum, by hand."""
    H, T, D = Q.shape
    half = D // 2
    O, L = np.zeros((H, T, V.shape[2])), np.zeros((H, T))  # noqa: E741 (the paper's names)
    for h in range(H):
        for i in range(T):
            keys = range(i + 1) if causal else range(K.shape[1])
            x = {j: math.fsum(Q[h, i, half:] * K[h, j, half:]) * scale for j in keys}
            top = max(x.values())
            total = math.fsum(math.exp(s - top) for s in x.values())
            L[h, i] = top + math.log(total)
            for j, s in x.items():
                O[h, i] += math.exp(s - L[h, i]) * V[h, j]
    return O, L


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    seq=st.integers(1, 6),
    heads=st.integers(1, 3),
    half=st.integers(1, 3),
    batch=st.sampled_from([None, 2]),
    causal=st.booleans(),
    per_head=st.booleans(),
    bq=st.integers(1, 7),
    bk=st.integers(1, 7),
)
def test_both_tiled_maps_and_their_difference_equal_the_loops_for_any_tiles(
    seed: int,
    seq: int,
    heads: int,
    half: int,
    batch: int | None,
    causal: bool,
    per_head: bool,
    bq: int,
    bk: int,
) -> None:
    fx = random_fixture(
        seed,
        seq=seq,
        heads=heads,
        d_k=2 * half,
        batch=batch,
        causal=causal,
        diff="init" if per_head else True,
        W_O=True,
    )
    want = reference(fx)  # (B?, H, T, ·)
    trace = run(validate(fx, "d.json"))
    flash = check_flash(trace, bq, bk, False, 0)
    names = [c.name for c in flash.checks]
    assert names == ["output", "lse", "softmax", "output_2", "lse_2", "diff_output"]
    assert all(c.ok for c in flash.checks), flash.checks
    out = flash.output if batch else flash.output[0]
    np.testing.assert_allclose(out, want["softmax"] @ want["V"], rtol=1e-10, atol=1e-12)
    # the second map by hand, and the difference the tiles make of the two
    Q, K, V = (np.asarray(want[s]) if batch else np.asarray(want[s])[None] for s in "QKV")
    lam = np.asarray(want["lambda"])
    for b in range(Q.shape[0]):
        O2, _ = second_map_rows(Q[b], K[b], V[b], trace.scale, causal)
        diff = flash.output[b] - lam[:, None, None] * O2
        ref = want["diff_output"][b] if batch else want["diff_output"]
        np.testing.assert_allclose(diff, ref, rtol=1e-10, atol=1e-12)


def test_flash_of_the_example_checks_both_maps(tmp_path: Path) -> None:
    out = tmp_path / "f.json"
    result = run_cli(
        "flash",
        "diff_transformer",
        "--block-q",
        "2",
        "--block-k",
        "2",
        "-f",
        "json",
        "-o",
        str(out),
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(out.read_text())
    checks = {c["name"]: c for c in doc["checks"]}
    assert set(checks) == {"output", "lse", "softmax", "output_2", "lse_2", "diff_output"}
    assert all(c["ok"] and c["max_abs_diff"] <= 1e-12 for c in checks.values())


def test_the_checks_of_the_second_map_are_named_in_chinese() -> None:
    result = run_cli("flash", "diff_transformer", "--lang", "zh")
    assert result.exit_code == 0, result.stderr
    assert "第二张图的 O（Q2、K2）对比逐行普通 softmax" in result.stdout
    assert "O − λ·O_2 对比完整计算的 diff_output" in result.stdout
