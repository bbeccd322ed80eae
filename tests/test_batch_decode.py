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
        rows = [r for j in range(len(lengths)) for at, rs in todo if at == s for r in rs
                if r[0] == j]  # fmt: skip
        if rows:
            steps.append((s, rows))
    return steps


def test_the_packing_follows_the_schedule_by_hand() -> None:
    run = run_batch(["llama_rope_gqa", "gptoss_sinks", "llama_rope_interleaved"], (0, 1, 3),
                    3, 2)  # fmt: skip
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


@pytest.mark.parametrize("names", [["llama_rope_gqa", "gptoss_sinks"],
                                   ["mistral_sliding_window", "gemma2_softcap"],
                                   ["deepseek_mla", "deepseek_mla"]])  # fmt: skip
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
    tmp_path_factory: Any, seed: int, lengths: list[int], arrive: list[int], prefill: int,
    chunk: int | None, window: int | None,
) -> None:  # fmt: skip
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
    res = run_cli("decode", "llama_rope_gqa", "gptoss_sinks", "--batch", "--arrive", "0,2",
                  "--prefill", "2", "-f", "plain", "--width", "160")  # fmt: skip
    assert res.exit_code == 0, res.stderr
    out = res.stdout
    assert "cu_seqlens_q = [0, 1, 3] · cu_seqlens_k = [0, 4, 6]" in out  # step 2: token 3, 0 and 1
    assert "joins: gptoss_sinks" in out and "leaves (its last row is here): llama_rope_gqa" in out
    assert "the block-diagonal mask" in out


@pytest.mark.slow  # importing test_explain builds its traces
def test_chinese_batch_texts_have_no_english_left() -> None:
    from test_explain import english_left

    res = run_cli("decode", "causal_multihead", "causal_multihead", "--batch", "--explain",
                  "--lang", "zh", "-f", "plain", "--width", "300")  # fmt: skip
    assert res.exit_code == 0, res.stderr
    lines = [line for line in res.stdout.splitlines()
             if any(w in line for w in ("打包", "序列", "批", "遮盖"))]  # fmt: skip
    assert len(lines) > 8
    allowed = ("Q_packed", "cu_seqlens", "cu_seqlens_q", "cu_seqlens_k", "n_i", "vLLM", "SGLang",
               "TensorRT", "LLM", "FlashAttention", "attn", "decode", "softmax", "output",
               "mask", "causal_multihead", "max", "packed", "Q")  # fmt: skip
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
        (["--paged"], "--paged: a paged batch"),
        (["-f", "html"], "html: a batch has no page yet"),
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
        packed = [(j, s - arrive[j]) for j in range(len(names))
                  if 0 <= s - arrive[j] < QKV[j][0].shape[1]]  # fmt: skip
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

    doc = {"format": "attn-decode-batch", "prefill": 1, "sequences": {
        f"s{j}": {"fixture": n, "arrive": a, "output": o.tolist()}
        for j, (n, a, o) in enumerate(zip(names, arrive, outs, strict=True))}}  # fmt: skip
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

    res = run_cli("decode", "llama_rope_gqa", "gptoss_sinks", "--batch", "--arrive", "1,0",
                  "--prefill", "3", "--chunk", "2", "-f", "json")  # fmt: skip
    path = tmp_path / "ours.json"
    path.write_text(res.stdout)
    outcome = check_fixture("llama_rope_gqa", against=path, tolerance=GRADER_TOLERANCE)
    assert outcome.comparison is not None and outcome.comparison.same
