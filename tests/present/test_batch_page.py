"""``attn decode F1 F2 ... --batch -f html`` (present/html_batch.py) without a browser: the page's
embedded numbers are ``-f json``'s, every number cell names its place in that JSON and shows its
number, every sequence's every token has its output row on the page (equal to a loop-based
attention written here), the block tables of a shared-prefix batch, the Chinese texts, hostile
token text, a long batch's bounded page. tests/present/test_html_browser.py opens it in Chromium."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli
from test_html_page import DATA, HOSTILE, as_shown, json_at, step_cells

TOL = 1e-12


def _fixture(path: Path, seq: int, seed: int, tokens: list[str] | None = None) -> Path:
    """A plain causal fixture of one head, d_k = d_v = 2, random numbers."""
    rng = np.random.default_rng(seed)
    fx: dict[str, Any] = {"causal": True}
    fx |= {n: rng.standard_normal((seq, 2)).round(4).tolist() for n in "QKV"}
    if tokens is not None:
        fx["tokens"] = tokens
    path.write_text(json.dumps(fx), encoding="utf-8")
    return path


def _loop_attention(path: Path) -> list[list[float]]:
    """out[t] = Σ_{s ≤ t} softmax_s(q_t·k_s / √d) v_s, one loop per token: the reference."""
    fx = json.loads(path.read_text(encoding="utf-8"))
    Q, K, V = fx["Q"], fx["K"], fx["V"]
    out = []
    for t, q in enumerate(Q):
        logits = [
            sum(a * b for a, b in zip(q, K[s], strict=True)) / math.sqrt(len(q))
            for s in range(t + 1)
        ]
        m = max(logits)
        e = [math.exp(x - m) for x in logits]
        total = math.fsum(e)
        out.append(
            [math.fsum(e[s] / total * V[s][j] for s in range(t + 1)) for j in range(len(V[0]))]
        )
    return out


def _page_and_json(*argv: str) -> tuple[str, dict[str, Any]]:
    page = run_cli("decode", *argv, "--batch", "-f", "html")
    assert page.exit_code == 0, page.output
    data = run_cli("decode", *argv, "--batch", "-f", "json")
    assert data.exit_code == 0, data.output
    return page.stdout, json.loads(data.stdout)


def _data(page: str) -> dict[str, Any]:
    found = DATA.search(page)
    assert found is not None
    out: dict[str, Any] = json.loads(found.group(1))
    return out


def test_the_page_holds_the_batch_jsons_numbers_and_every_sequences_outputs(
    tmp_path: Path,
) -> None:
    a, b = _fixture(tmp_path / "a.json", 5, 1), _fixture(tmp_path / "b.json", 4, 2)
    page, run = _page_and_json(str(a), str(b), "--arrive", "0,1", "--prefill", "3", "--chunk", "2")
    data = _data(page)
    assert data["format"] == "attn-decode-batch"
    steps = run["steps"]
    assert list(data["steps"]) == [str(k) for k in range(len(steps))]
    for k, step in enumerate(steps):
        assert data["steps"][str(k)]["stages"] == step["stages"], k
    # every number cell shows the JSON's number at its place; collect the output rows shown
    shown_rows: dict[tuple[str, int], list[float]] = {}
    for stage, index, attrs, text in step_cells(page):
        k = int(attrs["step"])
        value = json_at(steps[k]["stages"][stage]["data"], index)
        assert text == as_shown(value), (k, stage, index)
        if stage == "output" and index[0] == 0:  # one head
            _, r, c = index
            row = steps[k]["rows"][r]
            shown_rows.setdefault((row["sequence"], row["token"]), [0.0, 0.0])[c] = float(value)  # type: ignore[arg-type]
    # every token of every sequence has its output row, equal to the loop reference
    for name, path in (("a", a), ("b", b)):
        want = _loop_attention(path)
        for t, row in enumerate(want):
            np.testing.assert_allclose(shown_rows[(name, t)], row, rtol=0, atol=TOL)
    assert page.count('<section class="stage"') == len(steps) + 2
    # the rows table says who is packed where, cu_seqlens as the JSON gives them
    step = steps[1]  # b joins with its first chunk of 2 while a finishes its prompt
    assert [(r["sequence"], r["token"]) for r in step["rows"]] == [("a", 2), ("b", 0), ("b", 1)]
    assert f"cu_seqlens_q = {step['cu_seqlens_q']}" in page
    assert "prefill chunk 2 of 2" in page and "prefill chunk 1 of 2" in page
    assert ">joins: b<" in page and "leaves (its last row is here): a" in page


BATCHABLE = [
    "causal_multihead",
    "deepseek_mla",
    "gemma2_softcap",
    "gptoss_sinks",
    "llama31_rope_scaling",
    "qwen3_next_gate",
    "qwen3_qk_norm",
    "mistral_sliding_window",
    "llama4_chunked",
    "llama4_temperature",
    "olmo_clip_qkv",
]


@pytest.mark.parametrize("name", BATCHABLE)
def test_every_batchable_examples_page_shows_the_jsons_numbers(name: str) -> None:
    """Every causal example of one map, twice (the second joining at step 1): each cell is the
    JSON's number; an output entry's derivation is Σ weight × V only where that sum gives it
    (MLA's latent cache and a gate after it: the cell says what it is instead)."""
    page, run = _page_and_json(name, name, "--arrive", "0,1")
    data = _data(page)
    for stage, index, attrs, text in step_cells(page):
        k = int(attrs["step"])
        assert text == as_shown(json_at(run["steps"][k]["stages"][stage]["data"], index))
    cell = re.search(
        r'data-stage="output" data-index="0,0,0" data-step="0"[^>]*data-w="(\d+)"', page
    )
    assert cell is not None
    lines = data["derivations"][int(cell.group(1))]["en"]["lines"]
    summed = lines[0].startswith("output[head 0, row 0, 0] = Σ weight × V")
    assert summed == (name not in ("deepseek_mla", "qwen3_next_gate")), lines
    if summed:  # the first token attends to itself alone: its output is its value row
        assert _numbers(lines[1])[-1] == pytest.approx(
            json_at(run["steps"][0]["stages"]["output"]["data"], (0, 0, 0)), abs=5e-5
        )


def test_a_weights_derivation_is_its_packed_row_through_softmax(tmp_path: Path) -> None:
    a, b = _fixture(tmp_path / "a.json", 3, 3), _fixture(tmp_path / "b.json", 3, 4)
    page, run = _page_and_json(str(a), str(b), "--prefill", "2")
    data = _data(page)
    step = run["steps"][0]  # a's rows 0, 1 then b's rows 0, 1: 4 rows, 4 keys
    cell = re.search(
        r'data-stage="softmax" data-index="0,3,3" data-step="0"[^>]*data-w="(\d+)"', page
    )
    assert cell is not None
    part = data["derivations"][int(cell.group(1))]["en"]
    masked = step["stages"]["masked"]["data"][0][3]
    assert masked[:2] == ["-inf", "-inf"]  # a's keys: the block-diagonal mask
    m = max(masked[2:])
    e = [math.exp(x - m) for x in masked[2:]]
    assert "m = the row's maximum" in part["lines"][0]
    np.testing.assert_allclose(_numbers(part["lines"][0])[-2:], [m, 0], atol=5e-5)  # m, weight 0
    # Σ e^(x − m), weight of key 3 = e / Σ = w: as the loop here computes them
    total, _, e3, total2, w = _numbers(part["footer"][0])
    np.testing.assert_allclose(
        [total, e3, total2, w], [sum(e), e[1], sum(e), e[1] / sum(e)], atol=5e-5
    )
    assert [r[0] for r in part["rows"]] == ["2: 1:0", "3: 1:1 ◀"]  # b's own keys only
    np.testing.assert_allclose([_numbers(r[1])[0] for r in part["rows"]], masked[2:], atol=5e-5)


def _numbers(text: str) -> list[float]:
    """The numbers of a derivation's line (its minus sign is U+2212)."""
    return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", text.replace("−", "-"))]


def test_a_shared_prefix_batch_shows_its_block_tables_and_counts() -> None:
    args = (
        "llama_rope_gqa",
        "llama_rope_gqa",
        "--arrive",
        "0,1",
        "--paged",
        "--share-prefix",
        "--block-size",
        "1",
        "--prefill",
        "2",
    )
    page, run = _page_and_json(*args)
    text = html.unescape(page)
    shared = 0
    for step in run["steps"]:
        pages = step["pages"]
        tables = "; ".join(f"{n} → {t}" for n, t in pages["block_tables"].items())
        assert f"block tables: {tables}" in text
        refs = ", ".join(f"{p} ×{n}" for p, n in pages["refcounts"].items()) or "—"
        assert f"reference counts (page ×sequences): {refs}" in text
        shared += len(pages["shared"])
    assert shared > 0 and "shares page" in text and "页" in text


WINDOW_SHARED = (
    "mistral_sliding_window",
    "mistral_sliding_window",
    "--arrive",
    "0,1",
    "--paged",
    "--share-prefix",
    "--block-size",
    "1",
)


@pytest.mark.parametrize(
    "argv",
    [
        ("llama_rope_gqa", "gptoss_sinks", "--arrive", "0,2"),
        ("deepseek_mla", "deepseek_mla", "--arrive", "0,1"),  # an output that is not Σ w·V
        WINDOW_SHARED,  # a window's frees and shared pages
    ],
)
def test_the_chinese_texts_have_no_english_but_names(argv: tuple[str, ...]) -> None:
    page, _ = _page_and_json(*argv)
    data = _data(page)
    texts = [html.unescape(z) for z in re.findall(r'<span class="zh">(.*?)</span>', page, re.S)]
    texts += [json.dumps(d["zh"], ensure_ascii=False) for d in data["derivations"]]
    names = {
        "cu_seqlens_q",
        "cu_seqlens_k",
        "cu_seqlens",
        "Q_packed",
        "softmax",
        "output",
        "masked",
        "max",
        "llama_rope_gqa",
        "gptoss_sinks",
        "The",
        "cat",
        "sat",
        "the",
        "on",
        "mat",
        "vLLM",
        "SGLang",
        "TensorRT",
        "LLM",
        "FlashAttention",
        "title",
        "lines",
        "header",
        "rows",
        "footer",
        "mask",
        "n_i",
        "scalar",
        "deepseek_mla",
        "W_UV",
        "mistral_sliding_window",
        "refcount",
        "block_table",
    }
    left = {w for t in texts for w in re.findall(r"[A-Za-z_]{2,}", t)} - names
    assert left == set(), left


def test_hostile_tokens_in_a_batch_page(tmp_path: Path) -> None:
    n = len(HOSTILE)
    a = _fixture(tmp_path / "a.json", n, 5, HOSTILE)
    b = _fixture(tmp_path / "b.json", n, 6, HOSTILE[::-1])
    result = run_cli("decode", str(a), str(b), "--batch", "-f", "html")
    assert result.exit_code == 0, result.output
    page = result.stdout
    assert page.count("<script") == 2 and "<!--" not in page
    assert "\u2028" not in page and "\u202e" not in page and "\u2066" not in page
    assert html.escape(HOSTILE[0][:10]) in page and "<script>alert" not in page


def test_a_long_batch_gives_a_bounded_page_and_says_so(tmp_path: Path) -> None:
    a, b = _fixture(tmp_path / "a.json", 30, 7), _fixture(tmp_path / "b.json", 20, 8)
    result = run_cli("decode", str(a), str(b), "--batch", "-f", "html")
    assert result.exit_code == 0, result.output
    page = result.stdout
    assert page.count('<section class="stage"') == 2 + 6  # the first and last 3 of 30 steps
    assert "6 of 30 steps shown" in page
    assert len(page) < 1_500_000


def test_full_keeps_a_long_rows_derivations_bounded(tmp_path: Path) -> None:
    """--full draws every table cell, but a derivation over a sequence's 100 keys elides the
    middle of its terms (past 64): the page stays near a megabyte, not tens of them."""
    a, b = _fixture(tmp_path / "a.json", 100, 9), _fixture(tmp_path / "b.json", 90, 10)
    result = run_cli("decode", str(a), str(b), "--batch", "--full", "-f", "html")
    assert result.exit_code == 0, result.output
    page = result.stdout
    assert len(page) < 1_500_000
    data = _data(page)
    last = max(int(k) for k in data["steps"])
    cell = re.search(
        rf'data-stage="softmax" data-index="0,0,5" data-step="{last}"[^>]*'
        r'data-w="(\d+)"',
        page,
    )
    assert cell is not None
    rows = data["derivations"][int(cell.group(1))]["en"]["rows"]
    assert ["…"] * 5 in rows and len(rows) < 20


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-o", "/nonexistent/b.html"], "--output: folder '/nonexistent' does not exist"),
        (["-o", "/dev/full"], "--output: the disk is full"),
        (["--step"], "--step: works only in the terminal, expected no --format html/-o"),
        (["--precision", "99"], "--precision: got 99, expected an integer from 0 to 17"),
        (["--arrive", "0,١"], "--arrive: item 2 is '١'"),
    ],
)
def test_hostile_page_options_get_one_line(args: list[str], message: str) -> None:
    res = run_cli("decode", "causal_multihead", "causal_multihead", "--batch", "-f", "html", *args)
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], res.stderr
