"""Worked cells of the modern variants: RoPE pairs, capped scores, ALiBi biases, the masked
cell's terms and fill, the sink's share of a softmax row.

Every part a cell shows is checked to add up to the trace's own value (rtol 1e-12), and the
convention behind it (angle = position × base^(−2i/dims), which dimensions pair up, the paper's
ALiBi slopes) is recomputed here with plain ``math``, independently of attn.
"""

from __future__ import annotations

import math
import re
from functools import cache
from typing import Any

import pytest
from conftest import FIXTURES, Tolerance
from numpy.testing import assert_allclose
from test_explain import english_left

from attn_cli.core.pipeline import Trace, run
from attn_cli.io.fixture import load_fixture, validate
from attn_cli.present.explain import cell_text
from attn_cli.present.worked import CellRef, WorkedCell, worked_cells

SUM_TOL: Tolerance = {"rtol": 1e-12, "atol": 1e-12}
VARIANTS = [
    "llama_rope_gqa",
    "llama_rope_interleaved",
    "mistral_sliding_window",
    "gemma2_softcap",
    "gptoss_sinks",
    "qwen3_qk_norm",
    "cross_attention",
    "mask_sentinel",
    "llama4_chunked",
    "llama4_temperature",
    "olmo_clip_qkv",
]

# ALiBi is in no bundled example: a small one, with RoPE's partial rotary and a softcap
# without any mask (so the softmax reads ``capped``), and one with ALiBi, bias and a window.
EXTRA: dict[str, dict[str, Any]] = {
    "alibi_window_bias": {
        "name": "alibi_window_bias",
        "tokens": ["a", "b", "c", "d"],
        "Q": [[1, 0, 2, 0], [0, 1, 0, 1], [1, 1, 0, 0], [0.5, -1, 1, 0]],  # 2 heads of d_k 2
        "K": [[1, 0], [0, 1], [1, 1], [-1, 0.5]],
        "V": [[1, 2], [3, 4], [5, 6], [7, 8]],
        "heads": 2,
        "kv_heads": 1,
        "causal": True,
        "window": 2,
        "alibi": True,
        "bias": [0, -0.5, 0.25, 1],
        "positions": [0, 2, 5, 6],
        "key_positions": [0, 2, 5, 6],
    },
    "partial_rope_softcap": {
        "name": "partial_rope_softcap",
        "tokens": ["p", "q", "r"],
        "Q": [[3, -1, 2, 0.5, 1, 0], [0, 2, -1, 1, 0, 1], [1, 1, 1, 1, 1, 1]],
        "K": [[1, 0, 0, 2, 1, 1], [0, 1, 1, 0, 0, 1], [2, 2, -1, 0, 1, 0]],
        "V": [[1, 0], [0, 1], [1, 1]],
        "rope": {"base": 100, "layout": "interleaved", "dims": 4},
        "softcap": 2,
        "scale": 1,
    },
}
CASES = [*VARIANTS, *EXTRA]


@cache
def trace_of(name: str) -> Trace:
    if name in EXTRA:
        return run(validate(EXTRA[name], f"{name}.json"))
    return run(load_fixture(FIXTURES / f"{name}.yaml"))


def every_cell(trace: Trace) -> list[WorkedCell]:
    inp = trace.inputs
    return [
        cell
        for i in range(inp.seq_q)
        for j in range(inp.seq_k)
        for cell in worked_cells(trace, CellRef(i, j))
    ]


def paper_slopes(n: int) -> list[float]:
    """Press et al.'s get_slopes, written out again: 2^(-8/n)^(1..n) for a power of two."""
    if math.log2(n).is_integer():
        return [2 ** (-8 * (h + 1) / n) for h in range(n)]
    closest = 2 ** math.floor(math.log2(n))
    return paper_slopes(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


def expected_pairs(layout: str, dims: int) -> list[tuple[int, int]]:
    if layout == "half":  # rotate_half: i with i + dims/2
        return [(i, i + dims // 2) for i in range(dims // 2)]
    return [(2 * i, 2 * i + 1) for i in range(dims // 2)]  # Meta's view_as_complex


# ---------------------------------------------------------------------------------------------
# The parts add up to the trace


@pytest.mark.parametrize("name", CASES)
def test_rotation_pairs_add_up_to_q_rot_and_k_rot(name: str) -> None:
    trace = trace_of(name)
    rope = trace.inputs.rope
    cells = every_cell(trace)
    if rope is None:
        assert all(c.q_rot is None and c.k_rot is None for c in cells)
        return
    pos_q, pos_k = trace.inputs.token_positions()
    for cell in cells:
        for rot, position in ((cell.q_rot, pos_q[cell.query]), (cell.k_rot, pos_k[cell.key])):
            assert rot is not None and rot.position == position
            assert [(p.first, p.second) for p in rot.pairs] == expected_pairs(
                rope.layout, rope.dims
            )
            for p in rot.pairs:
                angle = int(position) * rope.base ** (-2 * p.index / rope.dims)
                assert_allclose(p.angle, angle, rtol=1e-14)
                assert_allclose((p.cos, p.sin), (math.cos(angle), math.sin(angle)), rtol=1e-14)
                assert_allclose(p.a * p.cos - p.b * p.sin, p.rotated_a, **SUM_TOL)
                assert_allclose(p.a * p.sin + p.b * p.cos, p.rotated_b, **SUM_TOL)
            assert len(rot.passed) == trace.inputs.d_k - rope.dims
        assert cell.q_rot is not None and cell.k_rot is not None
        # the rotated rows are what the scores read
        q = [0.0] * trace.inputs.d_k
        for p in cell.q_rot.pairs:
            q[p.first], q[p.second] = p.rotated_a, p.rotated_b
        q[rope.dims :] = cell.q_rot.passed
        assert_allclose(q, cell.q, **SUM_TOL)


@pytest.mark.parametrize("name", CASES)
def test_capped_alibi_and_masked_add_up(name: str) -> None:
    trace = trace_of(name)
    inp = trace.inputs
    slopes = paper_slopes(inp.heads) if inp.setting("alibi") is not None else None
    for cell in every_cell(trace):
        logit = cell.scaled
        if inp.setting("softcap") is not None:
            assert cell.capped is not None and cell.softcap == inp.setting("softcap")
            logit = inp.setting("softcap") * math.tanh(cell.scaled / inp.setting("softcap"))
            assert_allclose(logit, cell.capped, **SUM_TOL)
        if slopes is not None:
            assert cell.slope == slopes[cell.head] and cell.alibi is not None
            pos_q, pos_k = cell.positions
            assert_allclose(-slopes[cell.head] * abs(pos_q - pos_k), cell.alibi, **SUM_TOL)
        if cell.masked is None:
            continue
        if not cell.allowed:
            assert cell.masked == inp.mask_value
            continue
        total = math.fsum([logit, cell.bias or 0.0, cell.alibi or 0.0])
        assert_allclose(total, cell.masked, **SUM_TOL)


@pytest.mark.parametrize("name", CASES)
def test_softmax_parts_with_the_sink_add_up(name: str) -> None:
    trace = trace_of(name)
    for cell in every_cell(trace):
        parts = cell.parts
        if parts is None:
            assert not any(cell.weights)
            continue
        sink = math.exp(cell.sink - parts.row_max) if cell.sink is not None else 0.0
        assert_allclose(parts.sink_exp, sink, rtol=1e-14)
        assert_allclose(math.fsum([*parts.exps, parts.sink_exp]), parts.total, **SUM_TOL)
        assert_allclose([e / parts.total for e in parts.exps], cell.weights, **SUM_TOL)
        # what the sink took is what the kept weights miss
        assert_allclose(parts.sink_exp / parts.total, 1 - math.fsum(cell.weights), **SUM_TOL)


def test_the_allowed_flag_follows_window_and_positions() -> None:
    """alibi_window_bias: positions 0, 2, 5, 6; window 2 means 0 <= pos_q - pos_k < 2."""
    trace = trace_of("alibi_window_bias")
    pos = [0, 2, 5, 6]
    for i in range(4):
        for j in range(4):
            (cell, _) = worked_cells(trace, CellRef(i, j))
            assert cell.allowed == (0 <= pos[i] - pos[j] < 2), (i, j)


# ---------------------------------------------------------------------------------------------
# What the cells say


def cell_lines(name: str, stage: str, ref: CellRef, lang: str = "en", head: int = 0) -> str:
    trace = trace_of(name)
    cell = next(c for c in worked_cells(trace, ref) if c.head == head)
    part = cell_text(trace, cell, stage, lang)  # type: ignore[arg-type]
    assert part is not None, stage
    rows = [" | ".join(r) for r in part.rows]
    return "\n".join([part.title, *part.lines, " | ".join(part.header), *rows, *part.footer])


def test_rope_cell_shows_one_pair_by_hand() -> None:
    # partial_rope_softcap, query r (position 2), interleaved, base 100, dims 4:
    # pair 0 = dims (0, 1), angle = 2 × 100^0 = 2; Q[r] = (1, 1): cos 2 = -0.4161, sin 2 = 0.9093
    # Q_rot[r, 0] = 1×(−0.4161) − 1×0.9093 = −1.3254; Q_rot[r, 1] = 0.9093 − 0.4161 = 0.4932
    # pair 1 = dims (2, 3), angle = 2 × 100^(−2/4) = 0.2
    text = cell_lines("partial_rope_softcap", "Q_rot", CellRef(2, 0))
    assert "Q_rot[r] rotates Q[r] at position 2" in text
    assert "pair 0, dimensions (0, 1): angle = 2 × 100^(−0/4) = 2 × 1 = 2;" in text
    assert "cos = −0.4161, sin = 0.9093" in text
    assert "Q_rot[r, 0] = a·cos − b·sin = 1×(−0.4161) − 1×0.9093 = −1.3254" in text
    assert "Q_rot[r, 1] = a·sin + b·cos = 1×0.9093 + 1×(−0.4161) = 0.4932" in text
    assert "pair 1, dimensions (2, 3): angle = 2 × 100^(−2/4) = 2 × 0.1 = 0.2;" in text
    assert "dimensions 4 to 5 pass through unchanged (partial rotary)" in text
    key = cell_lines("partial_rope_softcap", "K_rot", CellRef(2, 1))
    assert "K_rot[q] rotates K[q] at position 1" in key


def test_rope_cell_elides_middle_pairs_unless_full() -> None:
    spec = {
        "Q": [[float(d % 3) for d in range(16)]] * 2,
        "K": [[1.0] * 16] * 2,
        "V": [[1.0], [2.0]],
        "rope": True,
    }
    trace = run(validate(spec, "wide.json"))
    (cell,) = worked_cells(trace, CellRef(1, 0))
    short = cell_text(trace, cell, "Q_rot", "en")
    full = cell_text(trace, cell, "Q_rot", "en", full=True)
    assert short is not None and full is not None
    assert sum(line.startswith("pair ") for line in short.lines) == 2  # fastest and slowest
    assert sum(line.startswith("pair ") for line in full.lines) == 8
    assert any("--full" in line for line in short.lines)


def test_capped_cell_by_hand() -> None:
    # partial_rope_softcap, scale 1, softcap 2; query p and key p sit at position 0, unrotated:
    # scores = (3, -1, 2, 0.5, 1, 0)·(1, 0, 0, 2, 1, 1) = 3 + 1 + 1 = 5
    # capped = 2 × tanh(5 / 2) = 2 × 0.986614 = 1.973229 (by calculator)
    text = cell_lines("partial_rope_softcap", "capped", CellRef(0, 0))
    assert "soft-capping squeezes the score into (−2, 2):" in text
    assert (
        "capped[p, p] = 2 × tanh(scaled[p, p] / 2) = 2 × tanh(5 / 2) = 2 × tanh(2.5000) = "
        "2 × 0.9866 = 1.9732" in text
    )
    # the softmax reads capped when nothing masks
    assert "capped | x − m" in cell_lines("partial_rope_softcap", "softmax", CellRef(0, 0))


def test_alibi_cell_by_hand() -> None:
    # 2 heads: slopes 2^-4 = 0.0625 and 2^-8; query d (position 6), key c (position 5)
    text = cell_lines("alibi_window_bias", "alibi", CellRef(3, 2))
    assert "head 0's ALiBi bias: −slope × |query position − key position|" in text
    assert "alibi[d, c] = −0.0625 × |6 − 5| = −0.0625 × 1 = −0.0625" in text
    head1 = cell_lines("alibi_window_bias", "alibi", CellRef(3, 0), head=1)
    assert "alibi[d, a] = −0.003906 × |6 − 0| = −0.003906 × 6 = −0.0234" in head1


def test_masked_cell_shows_the_alibi_term_and_the_fill() -> None:
    text = cell_lines("alibi_window_bias", "masked", CellRef(3, 2))
    assert "plus the ALiBi bias:" in text
    # bias[c] = 0.25; scaled = Q[d]·K[c] / √2 = (0.5 − 1) / √2 = -0.3536
    assert (
        "scaled[d, c] + bias[d, c] + alibi[d, c] = −0.3536 + 0.2500 + (−0.0625) = −0.1661" in text
    )
    assert "this key may be attended" in text
    blocked = cell_lines("alibi_window_bias", "masked", CellRef(3, 0))  # 6 − 0 >= window 2
    assert "masked[d, a] = −∞" in blocked and "may not be attended: −∞" in blocked


def test_masked_cell_of_a_finite_sentinel_says_it_is_not_minus_infinity() -> None:
    trace = trace_of("mask_sentinel")
    cells = worked_cells(trace, CellRef(3, 3))  # batch 1 is all padding: (d, d) is hidden
    hidden = cell_text(trace, cells[1], "masked", "en")
    assert hidden is not None
    assert hidden.lines == (
        "masked[d, d] = −10000",
        "this key may not be attended, but the fixture fills it with −10000, not −∞: its "
        "weight will be small, yet not 0",
    )
    zh = cell_text(trace, cells[1], "masked", "zh")
    assert zh is not None and "不是 −∞" in zh.lines[1]
    seen = cell_text(trace, cells[0], "masked", "en")
    assert seen is not None and seen.lines[-1].startswith("this key may be attended")


def test_softmax_cell_shows_the_sink_and_what_it_took() -> None:
    text = cell_lines("gptoss_sinks", "softmax", CellRef(3, 1))
    trace = trace_of("gptoss_sinks")
    (cell, *_) = worked_cells(trace, CellRef(3, 1))
    assert cell.parts is not None
    dropped = cell.parts.sink_exp / cell.parts.total
    assert "with the head's sink 0.4200 joined: m = the maximum of the row and the sink" in text
    assert re.search(r"^\(sink\) \| 0\.4200 \| ", text, re.M)
    assert f"the sink took {dropped:.4f} of the row" in text
    assert f"the kept weights sum to {1 - dropped:.4f}" in text


def test_scores_cell_names_the_rotated_stages() -> None:
    text = cell_lines("qwen3_qk_norm", "scores", CellRef(1, 0))
    assert "scores[cat, The] = Q_rot[cat]·K_rot[The] = " in text
    rope_only = cell_lines("mistral_sliding_window", "scores", CellRef(1, 0))
    assert "= Q_rot[cat]·K_rot[The]" in rope_only


@pytest.mark.parametrize("name", CASES)
def test_chinese_cells_have_no_english_left(name: str) -> None:
    trace = trace_of(name)
    tokens = (*trace.query_labels, *trace.key_labels)
    stages = ("Q_rot", "K_rot", "capped", "alibi", "masked", "softmax", "scores")
    for cell in worked_cells(trace, CellRef(trace.inputs.seq_q - 1, 0)):
        for stage in stages:
            part = cell_text(trace, cell, stage, "zh")
            if part is None:
                continue
            texts = [part.title, *part.lines, *part.header, *part.footer]
            texts += [c for row in part.rows for c in row]
            for text in texts:
                assert english_left(text, tokens) == [], text
            en = cell_text(trace, cell, stage, "en")
            assert en is not None and len(en.lines) == len(part.lines)
