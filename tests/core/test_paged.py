"""``attn decode --paged``: the KV cache in pages of a pool read through a block table, against a
block allocator written here as a loop, the contiguous decode, and the loop-based reference
attention of tests/reference.py (every step's output row, <= 1e-12 in float64)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import random_fixture, reference

from attn_cli.check.paged_runs import paging_for
from attn_cli.check.runs import check_decode, decode_args, decode_keep, load_trace, refuse_decode
from attn_cli.core.decode import decode
from attn_cli.core.paged import Paging
from attn_cli.core.pipeline import run
from attn_cli.errors import UsageError
from attn_cli.io.fixture import validate

CAUSAL_EXAMPLES = (
    "causal_multihead",
    "deepseek_mla",
    "gemma2_softcap",
    "gptoss_sinks",
    "llama31_rope_scaling",
    "llama_rope_gqa",
    "llama_rope_interleaved",
    "mask_sentinel",
    "mistral_sliding_window",
    "llama4_chunked",
    "llama4_temperature",
    "olmo_clip_qkv",
)
TOL = 1e-12


def allocate(T: int, bs: int, positions: list[int], window: int | None) -> list[dict[str, Any]]:
    """The block table after each token, by hand: token t goes to block t // bs, slot t % bs;
    a block whose every token is at a position <= pos[t] - window goes back to the pool first;
    a new block takes the lowest free page."""
    table: list[int] = []
    free = set(range(T + 1))
    out = []
    for t in range(T):
        freed = []
        if window is not None:
            for b in range(t // bs):
                tokens = range(b * bs, (b + 1) * bs)
                if table[b] >= 0 and all(positions[j] <= positions[t] - window for j in tokens):
                    freed.append(table[b])
                    free.add(table[b])
                    table[b] = -1
        taken = []
        if t % bs == 0:
            page = min(free)
            free.remove(page)
            table.append(page)
            taken.append(page)
        out.append(
            {
                "table": list(table),
                "page": table[t // bs],
                "slot": t % bs,
                "taken": taken,
                "freed": freed,
            }
        )
    return out


def example_trace(name: str) -> Any:
    trace, _ = load_trace(name, decode_keep, refuse=refuse_decode)
    return trace


@pytest.mark.parametrize("name", CAUSAL_EXAMPLES)
def test_paged_equals_contiguous_and_the_trace_for_every_block_size(name: str) -> None:
    trace = example_trace(name)
    T = trace.inputs.seq_q
    for bs in range(1, T + 2):
        for prefill in (1, T):
            paging = paging_for(trace.inputs, bs, None)
            r = check_decode(trace, prefill, paging=paging)
            assert r.paged is not None
            assert r.worst <= TOL, (bs, prefill, r.diffs, r.paged.contiguous_diffs)
            assert len(r.paged.contiguous_diffs) == T - prefill


@pytest.mark.parametrize("name", ["mistral_sliding_window", "llama_rope_gqa", "gptoss_sinks"])
@pytest.mark.parametrize("bs", [1, 2, 4])
def test_block_tables_follow_the_allocator_by_hand(name: str, bs: int) -> None:
    trace = example_trace(name)
    T, window = trace.inputs.seq_q, trace.inputs.window
    positions = [int(p) for p in trace.inputs.token_positions()[0]]
    result = check_decode(trace, 1, paging=paging_for(trace.inputs, bs, None)).result
    hand = allocate(T, bs, positions, window)
    records = [result.prefill_pages, *(s.pages for s in result.steps)]
    for t, (want, got) in enumerate(zip(hand, records, strict=True)):
        assert got is not None
        assert list(got.table) == want["table"], t
        assert got.placed[-1] == (t, want["page"], want["slot"])
        assert list(got.allocated) == want["taken"] and list(got.freed) == want["freed"], t


def test_a_window_frees_pages_and_reuses_them() -> None:
    trace = example_trace("mistral_sliding_window")  # 6 tokens, window 3
    r = check_decode(trace, 1, paging=paging_for(trace.inputs, 1, None))
    assert r.paged is not None and r.paged.paging == Paging(1, 3)  # 3 tokens live at once
    last = r.result.steps[-1].pages
    assert last is not None
    # token 3 (position 3) frees block 0 (position 0 <= 3 - 3) and takes its page 0 again
    assert last.table == (-1, -1, -1, 0, 1, 2)
    assert last.in_use == 3


def test_the_gather_reads_the_pool_through_the_table() -> None:
    """The last step's cache rows are the pool's rows page by page, in logical order."""
    trace = example_trace("llama_rope_gqa")
    args = decode_args(trace)
    res = decode(args.q, args.k, args.v, prefill=1, paging=Paging(2, 5), **args.kwargs())
    step = res.steps[-1]
    assert step.pages is not None and step.pages.table == (0, 1, 2)
    pool = step.cache.K  # (B, Hkv, pages · 2, D)
    K = step.K_cache  # (B, Hkv, 6, D): blocks 0, 1, 2; slot 5 empty (5 tokens)
    np.testing.assert_array_equal(K[:, :, :5], pool[:, :, :5])
    np.testing.assert_array_equal(K[:, :, 5], 0)
    assert step.cache_positions == (0, 1, 2, 3, 4, -1)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    T=st.integers(1, 7),
    heads=st.sampled_from([(1, 1), (2, 1), (2, 2)]),
    window=st.sampled_from([None, 1, 2, 3]),
    bs=st.integers(1, 8),
    prefill=st.integers(1, 7),
)
def test_random_fixtures_paged_equal_the_loop_reference(
    seed: int, T: int, heads: tuple[int, int], window: int | None, bs: int, prefill: int
) -> None:
    extra: dict[str, Any] = {} if window is None else {"window": window}
    fx = random_fixture(seed, seq=T, heads=heads[0], kv_heads=heads[1], causal=True, **extra)
    inputs = validate(fx, "random.yaml")
    trace = run(inputs, keep=decode_keep(inputs))
    P = min(prefill, T)
    r = check_decode(trace, P, paging=paging_for(inputs, bs, None))
    full = reference(fx)["output"]  # (H, T, Dv), by loops
    for s in r.result.steps:
        np.testing.assert_allclose(s.output[0, :, 0], full[:, s.index], rtol=0, atol=TOL)
    assert r.paged is not None and r.paged.worst <= TOL


# -- the command line ---------------------------------------------------------------------------


def test_json_keeps_the_outputs_and_adds_the_block_tables() -> None:
    res = run_cli("decode", "mistral_sliding_window", "--paged", "--block-size", "2", "-f", "json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    plain = json.loads(run_cli("decode", "mistral_sliding_window", "-f", "json").stdout)
    assert data["paged"]["block_size"] == 2 and data["paged"]["pages"] == 2
    tables = [s["pages"]["block_table"] for s in data["steps"]]
    assert tables == [[0], [0, 1], [0, 1], [-1, 1, 0], [-1, 1, 0]]
    for a, b in zip(data["steps"], plain["steps"], strict=True):
        np.testing.assert_allclose(
            a["stages"]["output"]["data"], b["stages"]["output"]["data"], rtol=0, atol=TOL
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--paged", "--block-size", "0"], "--block-size: got 0, expected an integer of at"),
        (["--paged", "--block-size", "-3"], "--block-size"),
        (["--paged", "--block-size", str(2**63)], f"is {2**63}, expected 1 to 4,096 tokens a"),
        (["--paged", "--pages", "0"], "--pages: got 0, expected an integer of at least 1"),
        (["--paged", "--pages", str(2**63)], f"--pages: is {2**63}, expected 1 to 1,048,576"),
        (["--paged", "--block-size", "1", "--pages", "2"], "expected at least 3"),
        (["--paged", "--block-size", "1e308"], "--block-size"),
        (["--paged", "--block-size", "nan"], "--block-size"),
        (["--pages", "3"], "--pages: sizes the pool of a paged cache, expected --paged beside it"),
        (["--block-size", "3"], "--block-size: sizes the pool"),
    ],
)
def test_hostile_pool_options_get_one_line(args: list[str], message: str) -> None:
    res = run_cli("decode", "mistral_sliding_window", *args)
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], res.stderr


@pytest.mark.parametrize(
    ("name", "variant"),
    [
        ("linear_attention", "linear"),
        ("gated_deltanet", "gated_delta"),
        ("diff_transformer", "diff"),
    ],
)
def test_a_decode_with_its_own_loop_refuses_paging(name: str, variant: str) -> None:
    res = run_cli("decode", name, "--paged")
    assert res.exit_code == 2
    line = res.stderr.strip()
    assert "\n" not in line and "a paged cache holds the keys and values" in line
    assert "(see --paged)" in line


def test_a_pool_too_small_says_how_many_pages_it_needs() -> None:
    trace = example_trace("causal_multihead")  # 4 tokens
    with pytest.raises(UsageError, match=r"a pool of 1 is too small .* expected at least 2"):
        paging_for(trace.inputs, 2, 1)


# -- the grader: a paged loop written here with each mistake, diagnosed by name ----------------


def paged_loop(fixture: str, bs: int, bug: str = "") -> list[Any]:
    """Every token's output (T, H, Dv) from a paged cache written as loops: pages 0, 1, ... in
    block order (no window), token t at row page · bs + t mod bs of the pool; ``bug``: "shift"
    reads block b through block_table[b + 1] (the last wraps to entry 0), "global" writes token
    t at row page · bs + t (wrapped in the pool)."""
    from attn_cli.api import load

    inputs = load(fixture)
    trace = run(inputs, keep={"Q", "K", "V"})
    Q, K, V = (trace[n].data for n in "QKV")  # (H, T, D)
    H, T, D = Q.shape
    scale = 1 / D**0.5
    rows = -(-T // bs) * bs
    outs = []
    for i in range(T):
        pool: dict[int, int] = {}  # pool row -> the token written there
        for t in range(i + 1):
            slot = t if bug == "global" else t % bs
            pool[((t // bs) * bs + slot) % rows] = t
        blocks = i // bs + 1
        read = [(b + 1) % blocks if bug == "shift" else b for b in range(blocks)]
        per_head = []
        for h in range(H):
            logits, values = [], []
            for b in range(blocks):
                for s in range(bs):
                    if b * bs + s > i:
                        continue  # an empty slot of the last page: hidden
                    src = pool.get(read[b] * bs + s)
                    k = K[h, src] if src is not None else np.zeros(D)
                    values.append(V[h, src] if src is not None else np.zeros(V.shape[2]))
                    logits.append(
                        sum(float(a) * float(c) for a, c in zip(Q[h, i], k, strict=True)) * scale
                    )
            top = max(logits)
            e = [np.exp(x - top) for x in logits]
            per_head.append((sum(w * v for w, v in zip(e, values, strict=True)) / sum(e)).tolist())
        outs.append(per_head)
    return outs


def grade_dump(tmp_path: Any, fixture: str, outputs: list[Any], bs: int) -> Any:
    from attn_cli.check.compare import GRADER_TOLERANCE
    from attn_cli.check.run import check_fixture

    path = tmp_path / "paged.json"
    path.write_text(json.dumps({"decode_output": outputs[1:], "prefill": 1, "block_size": bs}))
    outcome = check_fixture(fixture, against=path, tolerance=GRADER_TOLERANCE)
    assert outcome.comparison is not None
    return outcome.comparison


def test_a_right_paged_loop_passes(tmp_path: Any) -> None:
    c = grade_dump(tmp_path, "causal_multihead", paged_loop("causal_multihead", 2), 2)
    assert c.same, c.stages


@pytest.mark.parametrize(
    ("bug", "name"),
    [("shift", "block_table_off_by_one"), ("global", "page_slot_from_global_position")],
)
def test_paged_mistakes_are_named(tmp_path: Any, bug: str, name: str) -> None:
    c = grade_dump(tmp_path, "causal_multihead", paged_loop("causal_multihead", 2, bug), 2)
    assert not c.same
    assert [d.name for d in c.diagnoses] == [name]


def test_our_own_paged_json_grades_as_the_same(tmp_path: Any) -> None:
    from attn_cli.check.compare import GRADER_TOLERANCE
    from attn_cli.check.run import check_fixture

    res = run_cli("decode", "gptoss_sinks", "--paged", "--block-size", "2", "-f", "json")
    path = tmp_path / "ours.json"
    path.write_text(res.stdout)
    outcome = check_fixture("gptoss_sinks", against=path, tolerance=GRADER_TOLERANCE)
    assert outcome.comparison is not None and outcome.comparison.same


# -- the views ----------------------------------------------------------------------------------


def test_the_table_shows_the_pool_the_block_table_and_the_gather() -> None:
    res = run_cli(
        "decode",
        "mistral_sliding_window",
        "--paged",
        "--block-size",
        "2",
        "-f",
        "plain",
        "--width",
        "200",
    )
    assert res.exit_code == 0, res.stderr
    out = res.stdout
    assert "pool: 2 pages × 2 tokens" in out and "contiguous ring of 3" in out
    # token 4 (position 4): block 0 (positions 0, 1 <= 4 - 3) goes back, its page 0 is taken
    assert "token 'the' → logical block 2 = 4 // 2 → page 0, slot 0 = 4 mod 2" in out
    assert (
        "page 0 back to the pool" in out
        and "block table (logical block → page): 0 → freed, 1 → 1, 2 → 0" in out
    )
    assert "vs contiguous" in out


@pytest.mark.slow  # importing test_explain builds its traces
def test_chinese_paged_texts_have_no_english_left() -> None:
    from test_explain import english_left

    res = run_cli(
        "decode",
        "mistral_sliding_window",
        "--paged",
        "--block-size",
        "2",
        "-f",
        "plain",
        "--explain",
        "--lang",
        "zh",
        "--width",
        "300",
    )
    assert res.exit_code == 0, res.stderr
    ours = [
        line for line in res.stdout.splitlines() if any(w in line for w in ("页", "块表", "收集"))
    ]
    assert len(ours) > 10
    tokens = tuple(example_trace("mistral_sliding_window").query_labels)
    allowed = (
        "PagedAttention",
        "vLLM",
        "K_cache",
        "scores",
        "softmax",
        "output",
        "mod",
        "float64",
        "block_size",
        "block_table",
        "pool",
        "pages",
        "kv_heads",
        "d_k",
        "d_v",
        "blocks",
        "slots",
        *tokens,
    )
    for line in ours:
        assert english_left(line, allowed) == [], line


def test_the_html_page_steps_through_the_block_tables(tmp_path: Any) -> None:
    out = tmp_path / "paged.html"
    res = run_cli(
        "decode",
        "mistral_sliding_window",
        "--paged",
        "--block-size",
        "2",
        "-f",
        "html",
        "-o",
        str(out),
    )
    assert res.exit_code == 0, res.stderr
    page = out.read_text()
    assert "block table (logical block → page): 0 → freed, 1 → 1, 2 → 0" in page
    assert "块表（逻辑块 → 物理页）" in page and "paged pool per layer" in page
    assert "page 0, slot 0 of the pool: block_table[4 // 2], 4 mod 2" in page
