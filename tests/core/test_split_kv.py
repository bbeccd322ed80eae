"""``attn flash --split-kv S`` (flash-decoding's merge), against references written here.

The references: tests/reference.py's loop attention (output and lse of every bundled causal
example); a per-chunk softmax in plain Python (math.exp over the chunk's keys only: m, l, lse,
O_s); and a merge in plain Python (math.exp, math.log, the max shift) taken over the chunks in a
shuffled order. The grader's mistakes are made here too, in plain Python, from those chunks.
"""

from __future__ import annotations

import json
import math
import random
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import reference
from test_explain import english_left

from attn_cli.check.runs import flash_args
from attn_cli.check.split_runs import SplitRun, run_split
from attn_cli.core.split_kv import MergeBugs, chunk_bounds, merge, split_kv_forward
from attn_cli.io.examples import example_dir
from attn_cli.present.options import RenderOptions
from attn_cli.present.split_kv_view import _EXPLAIN, LABELS, split_pages, split_titles

Array = np.ndarray[Any, Any]
F64 = 1e-12
NEG = -math.inf
LOG2E = 1 / math.log(2)
CAUSAL = [  # every bundled causal example flash runs (the gate, linear attention: refused)
    "causal_multihead",
    "llama_rope_gqa",
    "llama_rope_interleaved",
    "mistral_sliding_window",
    "gptoss_sinks",
    "qwen3_qk_norm",
    "gemma2_softcap",
    "llama31_rope_scaling",
    "deepseek_mla",
    "mask_sentinel",
    "llama4_chunked",
    "llama4_temperature",
    "olmo_clip_qkv",
]


# ---------------------------------------------------------------------------------------------
# References


def loop_merge(states: list[tuple[float, list[float]]]) -> tuple[float, list[float]]:
    """(lse, O) of (lse_s, O_s) states in plain Python: the max shift, −∞ weighs 0."""
    top = max(L for L, _ in states)
    if top == NEG:
        return NEG, [0.0] * len(states[0][1])
    lse = top + math.log(math.fsum(math.exp(L - top) for L, _ in states if L != NEG))
    w = [0.0 if L == NEG else math.exp(L - lse) for L, _ in states]
    out = [
        math.fsum(ws * o[e] for ws, (_, o) in zip(w, states, strict=True))
        for e in range(len(states[0][1]))
    ]
    return lse, out


def chunk_softmax(x: list[float], vs: list[list[float]]) -> tuple[float, float, float, list[float]]:
    """m, l, lse and O of one row's scores ``x`` (−∞: hidden) against its chunk's values."""
    m = max(x)
    if m == NEG:
        return NEG, 0.0, NEG, [0.0] * len(vs[0])
    p = [math.exp(s - m) for s in x]
    total = math.fsum(p)
    out = [
        math.fsum(pi * v[e] for pi, v in zip(p, vs, strict=True)) / total for e in range(len(vs[0]))
    ]
    return m, total, m + math.log(total), out


def direct_fixture(
    path: Path, T: int, S: int, causal: str | None, seed: int, size: float = 1.0
) -> dict[str, Array]:
    """A direct-mode fixture (4-axis Q, K, V; 2 heads sharing one kv head) written to
    ``path``; its arrays."""
    rng = np.random.default_rng(seed)
    a = {
        "Q": rng.normal(size=(1, 2, T, 3)) * size,
        "K": rng.normal(size=(1, 1, S, 3)),
        "V": rng.normal(size=(1, 1, S, 2)),
    }
    doc: dict[str, Any] = {n: x.tolist() for n, x in a.items()}
    if causal is not None:
        doc["causal"] = causal
    path.write_text(json.dumps(doc))
    return a


def scores(a: dict[str, Array], causal: str | None) -> list[list[list[float]]]:
    """Per head and query, the scaled scores over every key, −∞ where causal hides it."""
    q, k = a["Q"][0], a["K"][0, 0]
    T, S, D = q.shape[1], k.shape[0], q.shape[2]
    offset = {None: None, "upper-left": 0, "lower-right": S - T}[causal]
    return [
        [
            [
                NEG
                if offset is not None and j > i + offset
                else math.fsum(q[h, i, d] * k[j, d] for d in range(D)) / math.sqrt(D)
                for j in range(S)
            ]
            for i in range(T)
        ]
        for h in range(q.shape[0])
    ]


def chunk_states(
    a: dict[str, Array], causal: str | None, bounds: tuple[tuple[int, int], ...]
) -> list[list[list[tuple[float, float, float, list[float]]]]]:
    """[head][query][chunk] -> (m, l, lse, O_s) by :func:`chunk_softmax`."""
    v = a["V"][0, 0].tolist()
    return [
        [[chunk_softmax(row[s0:s1], v[s0:s1]) for s0, s1 in bounds] for row in head]
        for head in scores(a, causal)
    ]


def example_reference(name: str) -> dict[str, Array]:
    """tests/reference.py's output and lse of a bundled example (its mask_value as −∞, as
    flash computes: the −∞ fill)."""
    fx = yaml.safe_load((example_dir() / f"{name}.yaml").read_text())
    fx.pop("mask_value", None)
    return reference(fx, lse=True)


def public(run: SplitRun, arr: Array) -> Array:
    return arr if run.trace.inputs.has_batch else arr[0]


def close(got: Array, want: Array, tol: float = F64) -> None:
    """Equal within ``tol`` (and 1e-15 of the value: lse ≈ −1e4 under mask_sentinel's fill
    rounds at 2e-12), −∞ exactly where the reference has it."""
    got, want = np.asarray(got, float), np.asarray(want, float)
    assert got.shape == want.shape
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-15, atol=tol)


# ---------------------------------------------------------------------------------------------
# The chunks and the merge


@settings(max_examples=40)
@given(keys=st.integers(1, 60), data=st.data())
def test_chunks_are_as_even_as_numpy_array_split(keys: int, data: st.DataObject) -> None:
    splits = data.draw(st.integers(1, keys))
    parts = np.array_split(np.arange(keys), splits)
    assert chunk_bounds(keys, splits) == tuple((int(p[0]), int(p[-1]) + 1) for p in parts)


def test_merge_by_hand() -> None:
    # lse 1 and 3: lse = 3 + log(1 + e^-2); w = e^-2 / (1 + e^-2), 1 / (1 + e^-2)
    m = merge(
        [np.array([1.0]), np.array([3.0]), np.array([NEG])],
        [np.array([[2.0]]), np.array([[-1.0]]), np.array([[0.0]])],
    )
    w0 = math.exp(-2) / (1 + math.exp(-2))
    assert m.lse[0] == pytest.approx(3 + math.log1p(math.exp(-2)), abs=1e-15)
    assert m.weights[:, 0].tolist() == pytest.approx([w0, 1 - w0, 0.0], abs=1e-15)
    assert m.output[0, 0] == pytest.approx(2 * w0 - (1 - w0), abs=1e-15)
    assert m.m_star[0] == 3.0


def test_merge_of_huge_logits_does_not_overflow_and_the_mistake_does() -> None:
    lses = [np.array([1000.0]), np.array([1001.0])]
    outs = [np.array([[1.0]]), np.array([[3.0]])]
    m = merge(lses, outs)
    w1 = 1 / (1 + math.exp(-1))
    assert m.lse[0] == pytest.approx(1001 + math.log1p(math.exp(-1)), abs=1e-12)
    # exp(lse_s − lse) with lse ≈ 1001 carries lse's rounding (1001 · 2^-52 ≈ 2e-13)
    assert m.output[0, 0] == pytest.approx((1 - w1) + 3 * w1, abs=1e-12)
    bad = merge(lses, outs, bugs=MergeBugs(without_max=True))
    assert bad.lse[0] == math.inf and math.isnan(bad.output[0, 0])


def test_a_row_with_no_key_merges_to_minus_inf_and_zero() -> None:
    m = merge([np.array([NEG]), np.array([NEG])], [np.zeros((1, 2)), np.zeros((1, 2))])
    assert m.lse[0] == NEG and m.output.tolist() == [[0.0, 0.0]]
    assert m.weights.tolist() == [[0.0], [0.0]]


def test_causal_chunks_after_a_query_weigh_exactly_zero_without_a_warning() -> None:
    """Called outside run_split's errstate: a RuntimeWarning fails the test (pytest config)."""
    run = run_split("causal_multihead", splits=4)
    r = split_kv_forward(**flash_args(run.trace), splits=4, block_q=2)
    for s, chunk in enumerate(r.chunks):  # chunk s holds key s alone: query i < s sees none
        hidden = np.arange(4) < s
        assert np.all(np.isneginf(chunk.lse[0][:, hidden])) and np.all(chunk.l[0][:, hidden] == 0)
        assert np.all(chunk.output[0][:, hidden] == 0.0)
        assert np.all(r.merged.weights[s, 0][:, hidden] == 0.0)
    assert not np.isnan(r.merged.output).any()


@pytest.mark.slow
@pytest.mark.parametrize("name", CAUSAL)
def test_every_split_of_a_bundled_example_equals_the_reference(name: str) -> None:
    ref = example_reference(name)
    rng = random.Random(name)
    for S in range(1, example_keys(name) + 1):
        run = run_split(name, splits=S)
        assert run.ok, [c for c in run.checks if not c.ok]
        r = run.result
        close(public(run, r.merged.output), ref["output"])
        close(public(run, r.merged.lse), ref["lse"])
        for lse, out in (r.fold, r.tree):
            close(public(run, out), ref["output"])
            close(public(run, lse), ref["lse"])
        # the chunks merged here in a shuffled order, the sink (if any) a state of its own
        states = [(c.lse, c.output) for c in r.chunks]
        if r.extra is not None:
            states.append(
                (
                    np.broadcast_to(r.extra[:, :, None], r.chunks[0].lse.shape),
                    np.zeros_like(r.chunks[0].output),
                )
            )
        rng.shuffle(states)
        B, H, T = r.chunks[0].lse.shape
        ref_L, ref_O = (
            ref[n] if run.trace.inputs.has_batch else ref[n][None] for n in ("lse", "output")
        )
        for b, h, i in np.ndindex(B, H, T):
            row = loop_merge([(float(L[b, h, i]), o[b, h, i].tolist()) for L, o in states])
            close(np.array(row[0]), ref_L[b, h, i])
            close(np.array(row[1]), ref_O[b, h, i])


def example_keys(name: str) -> int:
    return run_split(name, splits=1).trace.inputs.seq_k


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(
    T=st.integers(1, 6),
    extra_keys=st.integers(0, 3),
    causal=st.sampled_from([None, "upper-left", "lower-right"]),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_random_fixtures_chunk_by_chunk_and_merged_in_any_order(
    T: int, extra_keys: int, causal: str | None, seed: int, data: st.DataObject
) -> None:
    S = T + extra_keys
    splits = data.draw(st.integers(1, S))
    bq = data.draw(st.integers(1, T))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f.json"
        a = direct_fixture(path, T, S, causal, seed)
        run = run_split(str(path), splits=splits, block_q=bq)
    assert run.ok
    bounds = chunk_bounds(S, splits)
    want = chunk_states(a, causal, bounds)
    order = data.draw(st.permutations(range(splits)))
    for h, i in np.ndindex(2, T):
        for s, chunk in enumerate(run.result.chunks):
            m, l, lse, out = want[h][i][s]  # noqa: E741
            close(
                np.array([chunk.m[0, h, i], chunk.l[0, h, i], chunk.lse[0, h, i]]),
                np.array([m, l, lse]),
            )
            close(chunk.output[0, h, i], np.array(out))
        lse, out = loop_merge([(want[h][i][s][2], want[h][i][s][3]) for s in order])
        for got_L, got_O in ((run.lse, run.output), run.result.fold, run.result.tree):
            close(np.array(got_L[0, h, i]), np.array(lse))
            close(got_O[0, h, i], np.array(out))


def test_base2_and_tile_sizes_compose() -> None:
    plain = run_split("llama_rope_gqa", splits=2)
    other = run_split("llama_rope_gqa", splits=2, block_q=1, block_k=1, base2=True)
    assert other.ok
    close(other.output, plain.output)
    close(other.lse, plain.lse * LOG2E)  # L in base 2: L · log2 e
    for a, b in zip(other.result.chunks, plain.result.chunks, strict=True):
        close(a.lse, b.lse * LOG2E)


# ---------------------------------------------------------------------------------------------
# The command: tables, JSON, pages, explanations


def test_json_has_every_chunk_and_the_merge(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    a = direct_fixture(path, 4, 5, "upper-left", seed=3)
    result = run_cli("flash", str(path), "--split-kv", "2", "-f", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["format"] == "attn-flash" and doc["split_kv"] == 2
    assert all(c["ok"] for c in doc["checks"])
    assert [c["keys"] for c in doc["chunks"]] == [[0, 3], [3, 5]]
    want = chunk_states(a, "upper-left", ((0, 3), (3, 5)))
    for s, chunk in enumerate(doc["chunks"]):
        assert list(chunk) == ["keys", "m", "l", "lse", "O"]
        assert np.shape(chunk["O"]) == (1, 2, 4, 2)  # (batch, heads, queries, d_v)
        for name, k in (("m", 0), ("l", 1), ("lse", 2)):
            got = np.array([[float(x) for x in row] for row in chunk[name][0]])
            close(got, np.array([[want[h][i][s][k] for i in range(4)] for h in range(2)]))
    assert np.shape(doc["merge"]["weights"]) == (1, 2, 4, 2)  # a row's weights over chunks
    assert np.array(doc["merge"]["weights"]).sum(axis=-1) == pytest.approx(1.0, abs=1e-15)
    for h, i in np.ndindex(2, 4):
        lse, out = loop_merge([(want[h][i][s][2], want[h][i][s][3]) for s in (1, 0)])
        assert doc["stages"]["lse"]["data"][0][h][i] == pytest.approx(lse, abs=F64)
        assert doc["stages"]["output"]["data"][0][h][i] == pytest.approx(out, abs=F64)
        for order in ("left_fold", "tree"):
            assert doc["orders"][order]["lse"][0][h][i] == pytest.approx(lse, abs=F64)


def test_table_shows_chunks_merge_and_the_two_orders() -> None:
    result = run_cli("flash", "causal_multihead", "--split-kv", "3", "-f", "plain")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "chunks (keys): 0..1, 2..2, 3..3" in out
    for text in (
        "chunk 2 of 3 · keys 3..3",
        "the merge of 3 chunks",
        "w 2",
        "m*",
        "merged left to right (a fold)",
        "right to left in pairs (a tree)",
    ):
        assert text in out, text
    assert "✗" not in out


def test_html_page_steps_through_chunks_and_merge(tmp_path: Path) -> None:
    out = tmp_path / "p.html"
    result = run_cli("flash", "causal_multihead", "--split-kv", "2", "-f", "html", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    page = out.read_text()
    for name in ("chunk 0: keys 0..1", "chunk 1: keys 2..3", "the merge", "the self-check"):
        assert f'data-stage-name="{name}"' in page, name
    blob = re.search(r'<script type="application/json"[^>]*>(.*?)</script>', page, re.S)
    assert blob is not None
    data = json.loads(blob.group(1))
    assert data["split_kv"] == 2 and sorted(data["tiles"]) == ["0", "1"]
    assert data["tiles"]["1"]["lse"][0][0] == "-inf"  # "I" sees no key of chunk 1
    # head 0, "tea": chunk lse 4.4603 and 5.7143 merge to 5.9653 (docs/flash.md, by hand)
    lines = [line for d in data["derivations"] for line in d["en"]["lines"]]
    lse = "lse = m* + log Σ_s exp(lse_s − m*) = 5.7143 + log(exp(4.4603 − 5.7143) + exp("
    assert any(line.startswith(lse + "5.7143 − 5.7143)) = 5.9653") for line in lines)
    assert any(
        line.startswith("w_0 = exp(lse_0 − lse) = exp(4.4603 − 5.9653) = 0.222") for line in lines
    )


def test_html_page_elides_the_middle_chunks(tmp_path: Path) -> None:
    direct_fixture(tmp_path / "f.json", 2, 70, None, seed=5)
    out = tmp_path / "p.html"
    args = ("flash", str(tmp_path / "f.json"), "--split-kv", "70", "-f", "html", "-o", str(out))
    assert run_cli(*args).exit_code == 0
    page = out.read_text()
    assert "16 of 70 chunks shown here" in page  # the first 8 and the last 8, as flash's tiles
    assert page.count('<section class="stage"') == 1 + 16 + 2
    assert 'data-stage-name="chunk 61: keys 61..61"' not in page
    assert 'data-stage-name="chunk 62: keys 62..62"' in page


def test_the_library_door_shows_its_page_in_a_notebook() -> None:
    import attn_cli

    run = attn_cli.run_split("causal_multihead", splits=2)
    view = run._repr_html_()
    assert view is not None and view.startswith("<iframe srcdoc=")
    assert "attn flash --split-kv 2" in view


def test_sinks_join_the_merge_once() -> None:
    result = run_cli("flash", "gptoss_sinks", "--split-kv", "5", "-f", "plain")
    assert result.exit_code == 0, result.stderr
    assert "w sink" in result.stdout and "the sink logit joins the merge once" in result.stdout


def test_step_pages_have_titles() -> None:
    run = run_split("causal_multihead", splits=2)
    for lang in ("en", "zh"):
        pages = list(split_pages(run, RenderOptions(lang=lang)))
        titles = split_titles(run, lang)
        assert len(pages) == len(titles) == 2 + 3  # overview, 2 chunks, merge, checks


@pytest.mark.subprocess
@pytest.mark.slow
def test_step_in_a_pty() -> None:
    from test_decode_cli import step_in_pty

    code, _ = step_in_pty(
        ["flash", "causal_multihead", "--split-kv", "2", "--step"],
        [
            (b"\r", r"stage 2 of 5\s+chunk 0: keys 0\.\.1"),
            (b"\r", r"stage 3 of 5\s+chunk 1: keys 2\.\.3"),
            (b"\r", r"stage 4 of 5\s+the merge"),
            (b"q", r""),
        ],
        first=r"stage 1 of 5\s+overview",
    )
    assert code == 0


def test_npz_dump_with_split_kv_is_graded(tmp_path: Path) -> None:
    a = direct_fixture(tmp_path / "f.json", 4, 4, "upper-left", seed=2)
    want = chunk_states(a, "upper-left", chunk_bounds(4, 2))
    rows = [[mistaken_merge(want[h][i], "weights_by_l") for i in range(4)] for h in range(2)]
    O = np.array([[[r[1] for r in head] for head in rows]])  # noqa: E741 (1, H, T, d_v)
    L = np.array([[[r[0] for r in head] for head in rows]])  # (1, H, T)
    np.savez(tmp_path / "d.npz", O=O, L=L, split_kv=np.array(2))
    result = run_cli("check", str(tmp_path / "f.json"), "--against", str(tmp_path / "d.npz"))
    assert result.exit_code == 1, result.stderr
    assert "O weighted by each chunk's l instead of exp(lse_s − lse)" in result.stdout


def test_explanations_en_and_zh() -> None:
    result = run_cli(
        "flash", "causal_multihead", "--split-kv", "2", "--explain", "--lang", "zh", "-f", "plain"
    )
    assert result.exit_code == 0, result.stderr
    assert "合并满足结合律和交换律" in result.stdout
    for key, texts in _EXPLAIN.items():
        allowed = (
            "flash-decoding",
            "FlashInfer",
            "merge_state",
            "GPU",
            "softmax",
            "attn",
            "float64",
            "lse_s",
            "KV",
        )
        assert english_left(texts["zh"][1], allowed) == [], key
        assert not any("\u4e00" <= c <= "\u9fff" for c in "".join(texts["en"])), key
    for text in LABELS["zh"].values():
        names = (
            "KV",
            "flash-decoding",
            "log-sum-exp",
            "FlashAttention",
            "lse",
            "exp",
            "log",
            "exp2",
            "log2",
            "acc",
            "sink",
            "logit",
            "softmax",
            "output",
            "trace",
            "base2",
            "max",
            "full",
            "lse_s",
            "O_s",
            "w_s",
        )
        assert english_left(re.sub(r"{\w+}", " ", text), names) == [], text


# ---------------------------------------------------------------------------------------------
# The grader: each mistake of the merge named


def mistaken_merge(
    states: list[tuple[float, float, float, list[float]]], kind: str
) -> tuple[float, list[float]]:
    """One row's (lse, O) merged with a mistake, in plain Python, from (m, l, lse, O_s)."""
    dv = len(states[0][3])
    if kind == "weights_by_l":  # the weights by l, lse right
        lse, _ = loop_merge([(s[2], s[3]) for s in states])
        total = math.fsum(s[1] for s in states)
        return lse, [math.fsum(s[1] * s[3][e] for s in states) / total for e in range(dv)]
    if kind == "wrong_base":  # base-e lse merged with 2^x and log2
        top = max(s[2] for s in states)
        lse = top + math.log2(math.fsum(2 ** (s[2] - top) for s in states if s[2] != NEG))
        w = [0.0 if s[2] == NEG else 2 ** (s[2] - lse) for s in states]
        return lse, [
            math.fsum(wi * s[3][e] for wi, s in zip(w, states, strict=True)) for e in range(dv)
        ]
    # without the max: Σ exp(lse_s), which overflows past about 709.78 (∞/∞: NaN)
    try:
        w = [math.exp(s[2]) for s in states]
    except OverflowError:
        return math.inf, [math.nan] * dv
    total = sum(w)
    if total == 0:  # every chunk hidden, or underflowed: log 0, 0/0
        return NEG, [math.nan] * dv
    return math.log(total), [
        sum(wi * s[3][e] for wi, s in zip(w, states, strict=True)) / total for e in range(dv)
    ]


@pytest.mark.parametrize(
    ("kind", "name", "size"),
    [
        ("weights_by_l", "merge_weights_by_l", 1.0),
        ("wrong_base", "merge_wrong_base", 1.0),
        ("without_max", "merge_without_max", 3000.0),
    ],
)
def test_each_merge_mistake_is_diagnosed_by_name(
    tmp_path: Path, kind: str, name: str, size: float
) -> None:
    path = tmp_path / "f.json"
    a = direct_fixture(path, 5, 5, "upper-left", seed=11, size=size)  # 3000: logits ~±1000
    bounds = chunk_bounds(5, 3)
    want = chunk_states(a, "upper-left", bounds)
    rows = [[mistaken_merge(want[h][i], kind) for i in range(5)] for h in range(2)]
    dump = {
        "split_kv": 3,
        "output": [
            [[[x if math.isfinite(x) else str(x) for x in r[1]] for r in head] for head in rows]
        ],
        "lse": [[[r[0] if math.isfinite(r[0]) else str(r[0]) for r in head] for head in rows]],
    }
    (tmp_path / "dump.json").write_text(json.dumps(dump))
    result = run_cli("check", str(path), "--against", str(tmp_path / "dump.json"), "-f", "json")
    assert result.exit_code == 1, result.stderr
    report = json.loads(result.stdout)
    text = json.dumps(report)
    assert name in text, text[:2000]
    for other in {"merge_weights_by_l", "merge_wrong_base", "merge_without_max"} - {name}:
        assert other not in text


def test_a_right_split_dump_passes(tmp_path: Path) -> None:
    out = tmp_path / "skv.json"
    result = run_cli("flash", "llama_rope_gqa", "--split-kv", "3", "-f", "json", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    result = run_cli("check", "llama_rope_gqa", "--against", str(out))
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "split-KV: the keys in 3 chunks" in result.stdout


# ---------------------------------------------------------------------------------------------
# Hostile values and combinations: one Error line, exit 2


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("0", "got '0'"),
        ("-1", "got '-1'"),
        ("1.5", "got '1.5'"),
        ("٣", "got '٣'"),
        ("", "got ''"),
        ("abc", "got 'abc'"),
        ("1e3", "got '1e3'"),
        (str(2**64), "got '1844"),
        (str(2**63), "is 9223372036854775808, but the fixture has 4 keys"),
        ("5", "is 5, but the fixture has 4 keys"),
    ],
)
def test_hostile_split_values(value: str, says: str) -> None:
    result = run_cli("flash", "causal_multihead", f"--split-kv={value}")
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "--split-kv" in lines[0]
    assert says in lines[0]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--max-tiles", "3"], "--max-tiles: does not apply with --split-kv"),
        (["--step", "-f", "json"], "--step: works only in the terminal"),
        (["--max-memory", "1K"], "memory"),
        (["--block-q", "0"], "--block-q"),
    ],
)
def test_combinations_compose_or_are_refused_in_one_line(args: list[str], says: str) -> None:
    result = run_cli("flash", "causal_multihead", "--split-kv", "2", *args)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and says in lines[0], lines


def test_a_second_softmax_map_is_refused() -> None:
    result = run_cli("flash", "diff_transformer", "--split-kv", "2")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: diff_transformer.yaml: diff: split-KV merges one")


@pytest.mark.parametrize("value", [0, 5, 2**63, 1.5, -1, "2"])
def test_a_dump_with_a_hostile_split_kv(tmp_path: Path, value: Any) -> None:
    good = json.loads(run_cli("flash", "causal_multihead", "--split-kv", "2", "-f", "json").stdout)
    good["split_kv"] = value
    (tmp_path / "d.json").write_text(json.dumps(good))
    result = run_cli("check", "causal_multihead", "--against", str(tmp_path / "d.json"))
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "split_kv" in lines[0], lines
