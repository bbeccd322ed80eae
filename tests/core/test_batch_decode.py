"""``attn decode F1 F2 ... --batch``: continuous batching against a schedule written here as a
loop, the loop-based reference attention of tests/reference.py for every sequence's every row,
each fixture's own ``attn decode``, and hostile options (one ``Error:`` line, exit 2)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import random_fixture, reference

from attn_cli.check.batch_runs import run_batch
from attn_cli.core.batch import batch_decode

TOL = 1e-12


def schedule(lengths: list[int], arrive: list[int], prefill: int, chunk: int | None) -> list[Any]:
    """Each step's packed rows [(sequence, token)] by hand: a sequence joins at its step, its
    first min(prefill, T) tokens come chunk rows a step, then one token a step."""
    todo = []
    for j, (T, a) in enumerate(zip(lengths, arrive, strict=True)):
        P = min(prefill, T)
        c = chunk or P
        at = a
        for start in range(0, P, c):
            todo.append((at, [(j, t) for t in range(start, min(P, start + c))]))
            at += 1
        for t in range(P, T):
            todo.append((at, [(j, t)]))
            at += 1
    steps = []
    for s in range(max(at for at, _ in todo) + 1):
        rows = [
            r for j in range(len(lengths)) for at, rs in todo if at == s for r in rs if r[0] == j
        ]
        if rows:
            steps.append((s, rows))
    return steps


def test_the_packing_follows_the_schedule_by_hand() -> None:
    run = run_batch(["llama_rope_gqa", "gptoss_sinks", "llama_rope_interleaved"], (0, 1, 3), 3, 2)
    want = schedule([5, 5, 5], [0, 1, 3], 3, 2)
    got = [(s.step, list(s.rows)) for s in run.result.steps]
    assert got == want
    for s in run.result.steps:
        present = list(dict.fromkeys(j for j, _ in s.rows))
        counts = [sum(1 for j, _ in s.rows if j == p) for p in present]
        assert list(s.cu_seqlens_q) == [0, *np.cumsum(counts).tolist()]
        caches = [max(t for j, t in s.rows if j == p) + 1 for p in present]
        assert list(s.cu_seqlens_k) == [0, *np.cumsum(caches).tolist()]
    assert run.worst <= TOL


def test_the_mask_is_block_diagonal_and_causal_inside() -> None:
    run = run_batch(["causal_multihead", "causal_multihead"], (0, 1), 2, None)
    for s in run.result.steps:
        for r, (j, t) in enumerate(s.rows):
            for c, (i, u) in enumerate(s.keys):
                assert s.mask[r, c] == (i == j and u <= t), (s.step, r, c)
                if i != j:
                    assert (s.softmax[:, r, c] == 0).all()


@pytest.mark.parametrize(
    "names",
    [
        ["llama_rope_gqa", "gptoss_sinks"],
        ["mistral_sliding_window", "gemma2_softcap"],
        ["deepseek_mla", "deepseek_mla"],
    ],
)
def test_every_sequence_equals_its_own_decode_json(names: list[str]) -> None:
    res = run_cli("decode", *names, "--batch", "--arrive", "1,0", "--prefill", "2", "-f", "json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["format"] == "attn-decode-batch"
    for name, seq in zip(names, doc["sequences"].values(), strict=True):
        alone = json.loads(run_cli("decode", name, "--prefill", "2", "-f", "json").stdout)
        out = np.array(seq["output"])  # (H, T, Dv)
        for step in alone["steps"]:
            want = np.array(step["stages"]["output"]["data"])[:, 0]  # (H, Dv)
            np.testing.assert_allclose(out[:, step["index"]], want, rtol=0, atol=TOL)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    arrive=st.lists(st.integers(0, 4), min_size=4, max_size=4),
    prefill=st.integers(1, 4),
    chunk=st.sampled_from([None, 1, 2]),
    window=st.sampled_from([None, 2]),
)
def test_random_batches_equal_the_loop_reference(
    tmp_path_factory: Any,
    seed: int,
    lengths: list[int],
    arrive: list[int],
    prefill: int,
    chunk: int | None,
    window: int | None,
) -> None:
    folder = tmp_path_factory.mktemp("batch")
    paths, refs = [], []
    for j, T in enumerate(lengths):
        extra: dict[str, Any] = {} if window is None else {"window": window}
        fx = random_fixture(seed + j, seq=T, heads=2, kv_heads=1, causal=True, **extra)
        path = folder / f"s{j}.json"
        path.write_text(json.dumps(fx))
        paths.append(path)
        refs.append(reference(fx)["output"])  # (H, T, Dv), by loops
    run = run_batch(paths, tuple(arrive[: len(lengths)]), prefill, chunk)
    for j, ref in enumerate(refs):
        np.testing.assert_allclose(run.result.outputs(j), ref, rtol=0, atol=TOL)
    assert [(s.step, list(s.rows)) for s in run.result.steps] == schedule(
        lengths, arrive[: len(lengths)], prefill, chunk
    )


def test_a_leaking_mask_changes_the_later_sequences_only() -> None:
    """The mistake of one causal mask over the pack: the first sequence of each step keeps its
    numbers; a later one sees the earlier ones' keys and leaves the reference."""
    run = run_batch(["causal_multihead", "causal_multihead"], (0, 0), 2, None)
    leaky = batch_decode(run.result.members, leak=True)
    np.testing.assert_allclose(leaky.outputs(0), run.result.outputs(0), rtol=0, atol=TOL)
    assert np.abs(leaky.outputs(1) - run.result.outputs(1)).max() > 1e-3


# -- the command line ---------------------------------------------------------------------------


def test_the_table_shows_rows_cu_seqlens_and_who_joins() -> None:
    res = run_cli(
        "decode",
        "llama_rope_gqa",
        "gptoss_sinks",
        "--batch",
        "--arrive",
        "0,2",
        "--prefill",
        "2",
        "-f",
        "plain",
        "--width",
        "160",
    )
    assert res.exit_code == 0, res.stderr
    out = res.stdout
    assert "cu_seqlens_q = [0, 1, 3] · cu_seqlens_k = [0, 4, 6]" in out  # step 2: token 3, 0 and 1
    assert "joins: gptoss_sinks" in out and "leaves (its last row is here): llama_rope_gqa" in out
    assert "the block-diagonal mask" in out


@pytest.mark.slow  # importing test_explain builds its traces
def test_chinese_batch_texts_have_no_english_left() -> None:
    from test_explain import english_left

    res = run_cli(
        "decode",
        "causal_multihead",
        "causal_multihead",
        "--batch",
        "--explain",
        "--lang",
        "zh",
        "-f",
        "plain",
        "--width",
        "300",
        "--arrive",
        "0,1",
        "--paged",
        "--share-prefix",
        "--block-size",
        "1",
    )
    assert res.exit_code == 0, res.stderr
    lines = [
        line
        for line in res.stdout.splitlines()
        if any(w in line for w in ("打包", "序列", "批", "遮盖", "页", "块表"))
    ]
    assert len(lines) > 20 and any("写时复制" in line for line in lines)
    allowed = (
        "Q_packed",
        "cu_seqlens",
        "cu_seqlens_q",
        "cu_seqlens_k",
        "n_i",
        "vLLM",
        "SGLang",
        "TensorRT",
        "LLM",
        "FlashAttention",
        "attn",
        "decode",
        "softmax",
        "output",
        "mask",
        "causal_multihead",
        "max",
        "packed",
        "Q",
        "block_table",
        "refcount",
        "causal_multihead#2",
    )
    for line in lines:
        assert english_left(line, allowed) == [], line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arrive", "0,x"], "--arrive: item 2 is 'x', expected a whole number of steps"),
        (["--arrive", "-1,0"], "--arrive: item 1 is '-1'"),
        (["--arrive", "٣,0"], "--arrive: item 1 is '٣'"),
        (["--arrive", "1e308,0"], "--arrive: item 1 is '1e308'"),
        (["--arrive", "nan,0"], "--arrive: item 1 is 'nan'"),
        (["--arrive", f"{2**63},0"], "expected a whole number of steps from 0 to 1,000,000"),
        (["--arrive", "0"], "--arrive: gives 1 steps for 2 fixtures"),
        (["--chunk", "0"], "--chunk: got 0"),
        (["--share-prefix"], "--share-prefix: shares the pages of a paged batch, expected"),
        (["--paged", "--block-size", "0"], "--block-size: got 0"),
        (["--paged", "--block-size", str(2**63)], f"--block-size: is {2**63}, expected 1 to"),
        (["--paged", "--pages", "0"], "--pages: got 0"),
        (["--paged", "--pages", "1", "--block-size", "2"], "expected at least 4"),
        (["-f", "html", "--step"], "--step: works only in the terminal"),
    ],
)
def test_hostile_batch_options_get_one_line(args: list[str], message: str) -> None:
    res = run_cli("decode", "causal_multihead", "causal_multihead", "--batch", *args)
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], res.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["llama_rope_gqa", "causal_multihead", "--batch"],
            "causal_multihead.yaml: heads: is 2, expected 4 as in llama_rope_gqa.yaml",
        ),
        (
            ["llama_rope_gqa", "llama31_rope_scaling", "--batch"],
            "llama31_rope_scaling.yaml: heads: is 2, expected 4 as in llama_rope_gqa.yaml",
        ),
        (["causal_multihead", "causal_multihead"], "more than one fixture given without --batch"),
        (["causal_multihead", "--arrive", "0"], "--arrive or --chunk given without --batch"),
        (["linear_attention", "linear_attention", "--batch"], "a batch packs the KV caches"),
        (["padding_batch", "--batch"], "causal"),
        (["causal_multihead"] * 10_000 + ["--batch"], "10,000 fixtures, expected 1 to 256"),
    ],
)
def test_hostile_batches_get_one_line(args: list[str], message: str) -> None:
    res = run_cli("decode", *args)
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], res.stderr


# -- the grader ---------------------------------------------------------------------------------


def loop_batch(names: list[str], arrive: list[int], leak: bool = False) -> list[Any]:
    """Every sequence's outputs (H, T, Dv) from a batch written as loops, prefill 1, one row a
    step: at each step the rows of the sequences present, in order, each over its own keys;
    ``leak``: a row also sees every key of the sequences packed before it in that step."""
    from attn_cli.api import load
    from attn_cli.core.pipeline import run

    seqs = [run(load(n), keep={"Q", "K", "V"}) for n in names]
    QKV = [[t[x].data for x in "QKV"] for t in seqs]  # (H, T, D) each
    outs = [np.zeros((q.shape[0], q.shape[1], v.shape[2])) for q, _, v in QKV]
    for s in range(max(a + q.shape[1] for a, (q, _, _) in zip(arrive, QKV, strict=True))):
        packed = [
            (j, s - arrive[j]) for j in range(len(names)) if 0 <= s - arrive[j] < QKV[j][0].shape[1]
        ]
        for n, (j, t) in enumerate(packed):
            q = QKV[j][0]
            keys = [(i, u) for i, u in packed[:n] if leak for u in range(u + 1)]
            keys += [(j, u) for u in range(t + 1)]
            for h in range(q.shape[0]):
                x = [float(q[h, t] @ QKV[i][1][h, u]) / np.sqrt(q.shape[2]) for i, u in keys]
                e = np.exp(np.array(x) - max(x))
                w = e / e.sum()
                outs[j][h, t] = sum(
                    wi * QKV[i][2][h, u] for wi, (i, u) in zip(w, keys, strict=True)
                )
    return outs


def batch_dump(tmp_path: Any, names: list[str], arrive: list[int], outs: list[Any]) -> Any:
    from attn_cli.check.compare import GRADER_TOLERANCE
    from attn_cli.check.run import check_fixture

    doc = {
        "format": "attn-decode-batch",
        "prefill": 1,
        "sequences": {
            f"s{j}": {"fixture": n, "arrive": a, "output": o.tolist()}
            for j, (n, a, o) in enumerate(zip(names, arrive, outs, strict=True))
        },
    }
    path = tmp_path / "batch.json"
    path.write_text(json.dumps(doc))
    outcome = check_fixture(names[0], against=path, tolerance=GRADER_TOLERANCE)
    assert outcome.comparison is not None
    return outcome.comparison


def test_a_right_batch_loop_passes(tmp_path: Any) -> None:
    names, arrive = ["causal_multihead", "causal_multihead"], [0, 1]
    c = batch_dump(tmp_path, names, arrive, loop_batch(names, arrive))
    assert c.same, c.stages


def test_a_leaking_ragged_mask_is_named(tmp_path: Any) -> None:
    names, arrive = ["causal_multihead", "causal_multihead"], [0, 1]
    c = batch_dump(tmp_path, names, arrive, loop_batch(names, arrive, leak=True))
    assert not c.same
    assert [d.name for d in c.diagnoses] == ["ragged_mask_leak"]


def test_our_own_batch_json_grades_as_the_same(tmp_path: Any) -> None:
    from attn_cli.check.compare import GRADER_TOLERANCE
    from attn_cli.check.run import check_fixture

    res = run_cli(
        "decode",
        "llama_rope_gqa",
        "gptoss_sinks",
        "--batch",
        "--arrive",
        "1,0",
        "--prefill",
        "3",
        "--chunk",
        "2",
        "-f",
        "json",
    )
    path = tmp_path / "ours.json"
    path.write_text(res.stdout)
    outcome = check_fixture("llama_rope_gqa", against=path, tolerance=GRADER_TOLERANCE)
    assert outcome.comparison is not None and outcome.comparison.same


# -- a paged batch and shared prompt pages (--paged --share-prefix) ----------------------------


def test_a_shared_page_is_copied_exactly_when_written() -> None:
    """By hand, pages of 2: llama_rope_gqa twice, the second joining at step 1 (prompt: token
    0). Step 0: sequence 0 takes page 0. Step 1: it writes token 1, page 0 is full; sequence 1
    joins, its prompt's keys and values are page 0's first row: it shares page 0 (count 2) and
    writes nothing. Step 2: sequence 0 takes page 1 for token 2; sequence 1 writes token 1 into
    page 0, held by two: copied to page 2 first (page 0 back to count 1)."""
    run = run_batch(
        ["llama_rope_gqa", "llama_rope_gqa"], (0, 1), 1, None, paged=(2, None), share=True
    )
    pages = [s.pages for s in run.result.steps]
    assert all(p is not None for p in pages)
    assert [p.shared for p in pages if p] == [(), ((1, 0, 0),), (), (), (), ()]
    assert [p.copied for p in pages if p] == [(), (), ((1, 0, 0, 2),), (), (), ()]
    assert [dict(p.refcounts) for p in pages if p][:3] == [{0: 1}, {0: 2}, {0: 1, 1: 1, 2: 1}]
    assert run.contiguous is not None and max(max(c) for c in run.contiguous) <= TOL
    assert run.worst <= TOL


def test_without_sharing_nothing_is_shared_or_copied() -> None:
    run = run_batch(["llama_rope_gqa", "llama_rope_gqa"], (0, 1), 1, None, paged=(2, None))
    assert all(
        s.pages is not None and not s.pages.shared and not s.pages.copied for s in run.result.steps
    )
    assert run.worst <= TOL


def prefix_pair(seed: int, T: int, same: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two fixtures of one model whose first ``same`` tokens are the same, the rest not."""
    a = random_fixture(seed, seq=T, heads=2, kv_heads=1, causal=True)
    b = json.loads(json.dumps(a))
    rng = np.random.default_rng(seed + 1)
    for t in range(same, T):
        b["X"][t] = rng.standard_normal(len(a["X"][0])).tolist()
    return a, b


@pytest.mark.slow  # 20 batches, each decoded three times (paged, contiguous, alone): 0.5 s
@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    T=st.integers(2, 6),
    same=st.integers(1, 6),
    bs=st.integers(1, 4),
    arrive=st.integers(0, 4),
    prefill=st.integers(1, 4),
)
def test_shared_prefixes_keep_every_row_and_count_every_page(
    tmp_path_factory: Any, seed: int, T: int, same: int, bs: int, arrive: int, prefill: int
) -> None:
    folder = tmp_path_factory.mktemp("prefix")
    fixtures = prefix_pair(seed, T, min(same, T))
    paths = []
    for j, fx in enumerate(fixtures):
        paths.append(folder / f"p{j}.json")
        paths[-1].write_text(json.dumps(fx))
    run = run_batch(paths, (0, arrive), prefill, None, paged=(bs, None), share=True)
    for j, fx in enumerate(fixtures):
        np.testing.assert_allclose(run.result.outputs(j), reference(fx)["output"], rtol=0, atol=TOL)
    shared: set[tuple[int, int]] = set()  # (sequence, block) that took a page as cached
    for s in run.result.steps:
        p = s.pages
        assert p is not None
        shared |= {(j, b) for j, b, _ in p.shared}
        # a copy only of a block that was shared, and only when that sequence writes into it
        for j, b, _, _ in p.copied:
            assert (j, b) in shared
            assert any(i == j and t // bs == b for i, t in s.rows)
        holders: dict[int, int] = {}
        for j, table in p.tables:
            if j not in s.leaving:
                for page in table:
                    holders[page] = holders.get(page, 0) + 1
        assert dict(p.refcounts) == holders  # a count is the block tables holding the page


def no_copy_loop(a: dict[str, Any], b: dict[str, Any]) -> list[Any]:
    """Both sequences' outputs (H, T, Dv) by loops when the second (joining at step 1 with a
    one-token prompt, pages of 2) writes its token 1 into the page it shares with the first
    without copying: from step 3 on the first reads b's key and value 1 in place of its own."""
    outs = []
    proj = []
    for fx in (a, b):
        X = np.array(fx["X"])
        Q, K, V = (X @ np.array(fx[w]) for w in ("W_Q", "W_K", "W_V"))
        proj.append((Q.reshape(len(X), 2, -1), K, V))  # Q (T, H, d); K, V (T, d): one kv head
    for j, (Q, K, V) in enumerate(proj):
        T, H, d = Q.shape
        out = np.zeros((H, T, V.shape[1]))
        for t in range(T):
            keys, values = K[: t + 1].copy(), V[: t + 1].copy()
            if j == 0 and t >= 3:  # step t: the page 0 row 1 holds b's token 1 since step 2
                keys[1], values[1] = proj[1][1][1], proj[1][2][1]
            for h in range(H):
                x = keys @ Q[t, h] / np.sqrt(d)
                w = np.exp(x - x.max())
                out[h, t] = (w / w.sum()) @ values
        outs.append(out)
    return outs


def test_a_shared_page_written_without_copying_is_named(tmp_path: Any) -> None:
    from attn_cli.check.compare import GRADER_TOLERANCE
    from attn_cli.check.run import check_fixture

    a, b = prefix_pair(7, 5, 1)
    paths = []
    for j, fx in enumerate((a, b)):
        paths.append(tmp_path / f"f{j}.json")
        paths[-1].write_text(json.dumps(fx))
    for outs, want in (
        (no_copy_loop(a, b), ["shared_page_written_without_copy"]),
        ([reference(fx)["output"] for fx in (a, b)], []),
    ):
        seqs = {
            f"s{j}": {"fixture": str(p), "arrive": j, "output": o.tolist()}
            for j, (p, o) in enumerate(zip(paths, outs, strict=True))
        }
        doc = {
            "format": "attn-decode-batch",
            "prefill": 1,
            "sequences": seqs,
            "paged": {"block_size": 2, "share_prefix": True},
        }
        path = tmp_path / "dump.json"
        path.write_text(json.dumps(doc))
        outcome = check_fixture(str(paths[0]), against=path, tolerance=GRADER_TOLERANCE)
        assert outcome.comparison is not None
        assert outcome.comparison.same == (not want)
        assert [d.name for d in outcome.comparison.diagnoses] == want


def test_the_table_and_json_show_tables_counts_shares_and_copies() -> None:
    args = [
        "decode",
        "llama_rope_gqa",
        "llama_rope_gqa",
        "--batch",
        "--arrive",
        "0,1",
        "--paged",
        "--share-prefix",
        "--block-size",
        "2",
    ]
    res = run_cli(*args, "-f", "plain", "--width", "200")
    assert res.exit_code == 0, res.stderr
    assert "llama_rope_gqa#2 shares page 0 for its block 0" in res.stdout
    assert (
        "copy on write: llama_rope_gqa#2 writes into page 0 (another sequence holds it): "
        "copied to page 2, its block 0 now → page 2" in res.stdout
    )
    assert "reference counts (page ×sequences): 0 ×2" in res.stdout
    doc = json.loads(run_cli(*args, "-f", "json").stdout)
    assert doc["paged"]["share_prefix"] is True and doc["paged"]["pages_used"] == 5
    assert doc["steps"][2]["pages"]["copied"] == [
        {"sequence": "llama_rope_gqa#2", "block": 0, "from": 0, "to": 2}
    ]
    zh = run_cli(*args, "-f", "plain", "--lang", "zh", "--explain", "--width", "200").stdout
    assert "写时复制：llama_rope_gqa#2 要写入页 0" in zh


def test_a_batch_past_the_memory_budget_is_refused_before_it_runs() -> None:
    """causal_multihead twice from step 0: 4 steps of 2 rows over 2, 4, 6, 8 keys, 40 cells;
    three tables (scores, masked, softmax) of 2 heads in float64: 8 · 3 · 2 · 40 = 1,920 bytes."""
    from attn_cli.check.batch_runs import _refuse_memory
    from attn_cli.errors import InputError

    run = run_batch(["causal_multihead", "causal_multihead"], (0, 0), 1, None)
    _refuse_memory(run.traces[0], list(run.result.members), False, 1920)
    with pytest.raises(InputError, match=r"would need about 1\.9 KiB of memory, expected at most"):
        _refuse_memory(run.traces[0], list(run.result.members), False, 1919)


# -- a sliding window frees a paged batch's pages ------------------------------------------------


def window_allocator(
    steps: list[Any], lengths: list[int], window: int, bs: int
) -> list[tuple[dict[int, list[int]], list[int], list[int]]]:
    """A pool by hand, per step: (each present sequence's block table, -1 once released; the
    pages taken; the pages given back). Before anyone writes, a sequence releases each leading
    block whose every token k is a window behind its first row t (t − k ≥ window); each new
    block takes the lowest page no one holds; a leaving sequence gives back what it still holds."""
    tables: dict[int, list[int]] = {}
    out = []
    for _, rows in steps:
        present = list(dict.fromkeys(j for j, _ in rows))
        taken: list[int] = []
        freed: list[int] = []
        for j in present:
            first = min(t for i, t in rows if i == j)
            for b, page in enumerate(tables.get(j, [])):
                last_on_block = (b + 1) * bs - 1
                if page != -1 and b < first // bs and first - last_on_block >= window:
                    freed.append(page)
                    tables[j][b] = -1
        for j in present:
            tables.setdefault(j, [])
            for i, t in rows:
                if i == j and t % bs == 0:
                    held = {p for table in tables.values() for p in table}
                    page = next(p for p in range(100) if p not in held)
                    tables[j].append(page)
                    taken.append(page)
        out.append(({j: list(tables[j]) for j in present}, taken, list(freed)))
        for j in present:
            if max(t for i, t in rows if i == j) == lengths[j] - 1:
                freed += [p for p in tables.pop(j) if p != -1]
        out[-1] = (out[-1][0], taken, freed)
    return out


def _window_fixture(path: Any, seq: int, window: int, seed: int) -> Any:
    rng = np.random.default_rng(seed)
    fx = {
        "causal": True,
        "window": window,
        **{n: rng.standard_normal((seq, 3)).round(3).tolist() for n in "QKV"},
    }
    path.write_text(json.dumps(fx))
    return fx


@pytest.mark.parametrize(
    ("lengths", "arrive", "prefill", "chunk", "window", "bs"),
    [
        ([6, 5], [0, 2], 1, None, 3, 1),
        ([7, 6], [0, 1], 3, 2, 2, 2),
        ([8, 4, 5], [0, 0, 3], 2, None, 3, 2),
        ([9, 9], [0, 4], 4, 3, 4, 3),
    ],
)
def test_a_window_frees_a_paged_batchs_pages_as_a_loop_allocator_does(
    tmp_path: Any,
    lengths: list[int],
    arrive: list[int],
    prefill: int,
    chunk: int | None,
    window: int,
    bs: int,
) -> None:
    paths, fixtures = [], []
    for j, T in enumerate(lengths):
        paths.append(tmp_path / f"w{j}.json")
        fixtures.append(_window_fixture(paths[-1], T, window, j))
    run = run_batch(paths, tuple(arrive), prefill, chunk, paged=(bs, None))
    want = window_allocator(schedule(lengths, arrive, prefill, chunk), lengths, window, bs)
    got = []
    for s in run.result.steps:
        assert s.pages is not None
        got.append(
            ({j: list(t) for j, t in s.pages.tables}, list(s.pages.allocated), list(s.pages.freed))
        )
    assert got == want
    assert any(-1 in table for tables, _, _ in want for table in tables.values())
    # the packed keys are the live blocks' tokens only, and every row is still the reference's
    for s, (tables, _, _) in zip(run.result.steps, want, strict=True):
        for j, table in tables.items():
            first = next(b for b, p in enumerate(table) if p != -1) * bs
            assert min(t for i, t in s.keys if i == j) == first
    for j, fx in enumerate(fixtures):
        np.testing.assert_allclose(run.result.outputs(j), reference(fx)["output"], rtol=0, atol=TOL)
    assert run.worst <= TOL
    unwindowed = sum(-(-T // bs) for T in lengths)
    assert run.result.peak < unwindowed


def test_the_json_and_table_show_a_windows_freed_blocks(tmp_path: Any) -> None:
    for j in range(2):
        _window_fixture(tmp_path / f"w{j}.json", 6, 2, j)
    args = [
        "decode",
        str(tmp_path / "w0.json"),
        str(tmp_path / "w1.json"),
        "--batch",
        "--arrive",
        "0,1",
        "--paged",
        "--block-size",
        "1",
    ]
    doc = json.loads(run_cli(*args, "-f", "json").stdout)
    want = window_allocator(schedule([6, 6], [0, 1], 1, None), [6, 6], 2, 1)
    for step, (tables, taken, freed) in zip(doc["steps"], want, strict=True):
        names = {0: "w0", 1: "w1"}
        assert step["pages"]["block_tables"] == {names[j]: t for j, t in tables.items()}
        assert step["pages"]["allocated"] == taken and step["pages"]["freed"] == freed
    table = run_cli(*args, "-f", "plain").stdout
    assert f"block tables: w1 → {want[-1][0][1]}" in table and "[-1, -1, -1, -1, " in table
    assert "once it has passed every token of a block" in " ".join(table.split())


@pytest.mark.slow  # 20 batches, each decoded three times (paged, contiguous, alone)
@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    T=st.integers(3, 7),
    same=st.integers(1, 7),
    bs=st.integers(1, 3),
    arrive=st.integers(0, 3),
    prefill=st.integers(1, 4),
    window=st.integers(1, 4),
)
def test_a_window_over_shared_pages_frees_a_page_only_at_count_zero(
    tmp_path_factory: Any,
    seed: int,
    T: int,
    same: int,
    bs: int,
    arrive: int,
    prefill: int,
    window: int,
) -> None:
    folder = tmp_path_factory.mktemp("window")
    fixtures = prefix_pair(seed, T, min(same, T))
    paths = []
    for j, fx in enumerate(fixtures):
        fx["window"] = window
        paths.append(folder / f"w{j}.json")
        paths[-1].write_text(json.dumps(fx))
    run = run_batch(paths, (0, arrive), prefill, None, paged=(bs, None), share=True)
    for j, fx in enumerate(fixtures):
        np.testing.assert_allclose(run.result.outputs(j), reference(fx)["output"], rtol=0, atol=TOL)
    for s in run.result.steps:
        p = s.pages
        assert p is not None
        holders: dict[int, int] = {}
        for j, table in p.tables:
            first = min(t for i, t in s.rows if i == j)
            for b, page in enumerate(table):
                if page == -1:  # released: every token of the block a window behind
                    assert first - ((b + 1) * bs - 1) >= window, (j, b, first)
                elif j not in s.leaving:
                    holders[page] = holders.get(page, 0) + 1
        assert dict(p.refcounts) == holders  # a page is held while one table still points at it
        for page in p.freed:
            assert page not in holders or page in p.allocated  # given back, or taken again


def test_a_shared_page_the_window_passed_goes_back_when_its_last_holder_releases_it(
    tmp_path: Any,
) -> None:
    """By hand, pages of 2, window 3, prompts of 2: the second sequence joins at step 1 and
    shares page 0 (block 0: tokens 0, 1, the same in both). Step 3: the first sequence's first
    row is token 4, 4 − 1 ≥ 3: it releases block 0, page 0 drops to count 1 and stays (the
    second still reads it). Step 4: the second's first row is token 4 too: it releases block 0,
    page 0 reaches 0 and goes back, and its token 4 starts block 2 on the lowest free page, 0."""
    paths = []
    for j, fx in enumerate(prefix_pair(1, 7, 4)):
        fx["window"] = 3
        paths.append(tmp_path / f"w{j}.json")
        paths[-1].write_text(json.dumps(fx))
    run = run_batch(paths, (0, 1), 2, None, paged=(2, None), share=True)
    pages = [s.pages for s in run.result.steps]
    assert all(p is not None for p in pages)
    steps = [p for p in pages if p is not None]
    assert steps[1].shared == ((1, 0, 0),) and dict(steps[1].refcounts)[0] == 2
    assert dict(steps[3].tables)[0][0] == -1 and dict(steps[3].refcounts)[0] == 1
    assert 0 not in steps[3].freed
    assert dict(steps[4].tables)[1][:1] == (-1,) and steps[4].freed[:1] == (0,)
    assert dict(steps[4].tables)[1][2] == 0 and 0 in steps[4].allocated
    assert run.worst <= TOL
