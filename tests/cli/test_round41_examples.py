"""The bundled examples of this round's variants (llama4_chunked, llama4_temperature,
olmo_clip_qkv) as a user meets them: the trace table, JSON, HTML, --explain in English and
Chinese, the grader with each of the variant's mistakes, decoding, FlashAttention and the backward
pass. Every number is checked against ``forward`` below: attention written out loop by loop from
the fixture's YAML and the published rules (transformers' chunked mask, Llama4TextAttention's
temperature, OlmoAttention's clamp), which never calls attn_cli."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import FIXTURES, GOLDEN, Tolerance, run_cli

Rule = Callable[[int, int], bool]  # (query position, key position) -> may it look
NAMES = ["llama4_chunked", "llama4_temperature", "olmo_clip_qkv"]
F64: Tolerance = {"rtol": 1e-12, "atol": 1e-12}


def bundled(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((FIXTURES / f"{name}.yaml").read_text("utf-8"))
    return loaded


# ---------------------------------------------------------------------------------------------
# The loop reference


def rope(x: list[float], pos: int, layout: str) -> list[float]:
    """RoPE of one head's vector at ``pos``, base 10000 on every dimension: pairs (i, i + d/2)
    as HF's rotate_half (``half``), (2i, 2i+1) as Meta's complex rotation (``interleaved``)."""
    d, out = len(x), list(x)
    pairs = [(i, i + d // 2) if layout == "half" else (2 * i, 2 * i + 1) for i in range(d // 2)]
    for i, (a, b) in enumerate(pairs):
        angle = pos * 10000.0 ** (-2 * i / d)
        out[a] = x[a] * math.cos(angle) - x[b] * math.sin(angle)
        out[b] = x[b] * math.cos(angle) + x[a] * math.sin(angle)
    return out


def chunk_rule(c: int) -> Rule:
    return lambda i, j: j // c == i // c


def factor(pos: int, temperature: dict[str, Any], offset: int | None = None) -> float:
    """Llama 4: 1 + attn_scale · ln(1 + ⌊(pos + 1) / floor_scale⌋)."""
    off = temperature.get("offset", 1) if offset is None else offset
    steps = math.floor((pos + off) / float(temperature["floor_scale"]))
    return 1 + float(temperature["attn_scale"]) * math.log(1 + steps)


def forward(fx: dict[str, Any], **mistake: Any) -> dict[str, np.ndarray]:
    """Every stage the grader reads, (heads, T, ...), one number at a time. ``mistake``:
    ``rule`` replaces the chunk rule, ``on_keys`` scales the keys too, ``offset`` replaces
    the temperature's, ``unclipped`` leaves Q and K unclamped (V stays clamped)."""
    X = fx["X"]
    H, Hkv = fx["heads"], fx["kv_heads"]
    T, dk = len(X), len(fx["W_Q"][0]) // H

    def project(W: list[list[float]], head: int, t: int) -> list[float]:
        cols = range(head * dk, (head + 1) * dk)
        return [math.fsum(X[t][m] * W[m][c] for m in range(len(X[t]))) for c in cols]

    c = fx.get("clip_qkv")
    rule = mistake.get("rule") or (chunk_rule(fx["chunk"]) if "chunk" in fx else None)
    tt = fx.get("temperature")
    layout = None if "rope" not in fx else ("half" if fx["rope"] is True else "interleaved")
    out: dict[str, list[Any]] = {n: [] for n in ("Q", "K", "V", "masked", "softmax", "output")}
    out.update({n: [] for n in ("Q_clip", "K_clip", "Q_tuned")})
    first = [h for h in range(H) if h % (H // Hkv) == 0]  # the first query head of each group
    for h in range(H):
        g = h // (H // Hkv)
        q = [project(fx["W_Q"], h, t) for t in range(T)]
        k = [project(fx["W_K"], g, t) for t in range(T)]
        v = [project(fx["W_V"], g, t) for t in range(T)]
        out["Q"].append(q)
        out["K"] += [k] if h in first else []
        if c is not None:  # OLMo: clamp right after the projections
            v = [[min(max(x, -c), c) for x in row] for row in v]
            if not mistake.get("unclipped"):
                q, k = ([[min(max(x, -c), c) for x in row] for row in m] for m in (q, k))
            out["Q_clip"].append(q)
            out["K_clip"] += [k] if h in first else []
        out["V"] += [v] if h in first else []
        if layout is not None:
            q = [rope(row, t, layout) for t, row in enumerate(q)]
            k = [rope(row, t, layout) for t, row in enumerate(k)]
        if tt is not None:  # Llama 4: the queries only
            q = [[x * factor(t, tt, mistake.get("offset")) for x in row] for t, row in enumerate(q)]
            if mistake.get("on_keys"):
                k = [[x * factor(t, tt) for x in row] for t, row in enumerate(k)]
            out["Q_tuned"].append(q)
        masked = [
            [
                math.fsum(a * b for a, b in zip(q[i], k[j], strict=True)) / math.sqrt(dk)
                if j <= i and (rule is None or rule(i, j))
                else -math.inf
                for j in range(T)
            ]
            for i in range(T)
        ]
        softmax = []
        for row in masked:
            top = max(row)
            e = [math.exp(x - top) for x in row]
            softmax.append([x / math.fsum(e) for x in e])
        out["masked"].append(masked)
        out["softmax"].append(softmax)
        out["output"].append(
            [
                [math.fsum(w[j] * v[j][e] for j in range(T)) for e in range(len(v[0]))]
                for w in softmax
            ]
        )
    return {n: np.array(a) for n, a in out.items() if a}


def the_sum(fx: dict[str, Any]) -> float:
    """L = Σ output, the loss attn's backward pass takes without a ``grad``."""
    return math.fsum(forward(fx)["output"].ravel())


# ---------------------------------------------------------------------------------------------
# The numbers: the trace, its JSON and the golden file against the loops


def json_trace(name: str) -> dict[str, Any]:
    result = run_cli("trace", name, "-f", "json")
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def data(doc: dict[str, Any], stage: str) -> np.ndarray:
    return np.array(doc["stages"][stage]["data"], dtype=float)  # "-inf" strings as floats


@pytest.mark.parametrize("name", NAMES)
def test_the_json_and_the_golden_are_the_loops_numbers(name: str) -> None:
    want = forward(bundled(name))
    golden = json.loads((GOLDEN / f"{name}.json").read_text("utf-8"))
    for doc in (json_trace(name), golden):
        for stage in ("masked", "softmax", "output", *(s for s in want if "_" in s)):
            np.testing.assert_allclose(data(doc, stage), want[stage], err_msg=stage, **F64)


def test_chunked_the_first_query_of_a_chunk_sees_itself_alone() -> None:
    """'on' at position 3 opens the second chunk: one weight of 1, where a window of 3 would
    spread it over 'cat', 'sat' and 'on'; 'mat' (5) sees 'on', 'the' and itself only."""
    doc = json_trace("llama4_chunked")
    weights = data(doc, "softmax")  # (heads, 6, 6)
    for h in range(2):
        assert weights[h, 3].tolist() == [0, 0, 0, 1, 0, 0]
        assert (weights[h, 5, :3] == 0).all() and (weights[h, 5, 3:] > 0).all()
        assert (weights[h, 2, :3] > 0).all() and (weights[h, 2, 3:] == 0).all()
    assert doc["config"]["chunk"] == 3


def test_temperature_the_factor_per_position() -> None:
    """Q_tuned / Q row by row: 1, 1 + ln 2 / 2 twice, 1 + ln 3 / 2 twice, 1 + ln 4 / 2."""
    doc = json_trace("llama4_temperature")
    ratio = data(doc, "Q_tuned") / data(doc, "Q")  # (heads, 6, d_k)
    by_hand = [1, *[1 + math.log(2) / 2] * 2, *[1 + math.log(3) / 2] * 2, 1 + math.log(4) / 2]
    np.testing.assert_allclose(ratio, np.broadcast_to(np.array(by_hand)[:, None], ratio.shape))
    np.testing.assert_allclose(np.round(by_hand, 2), [1, 1.35, 1.35, 1.55, 1.55, 1.69])
    assert "1.35, 1.35, 1.55, 1.55, 1.69" in bundled("llama4_temperature")["description"]
    assert doc["config"]["temperature"] == {"floor_scale": 2.0, "attn_scale": 0.5, "offset": 1}


def test_clip_qkv_clips_some_values_and_passes_the_rest() -> None:
    doc = json_trace("olmo_clip_qkv")
    Q, K = data(doc, "Q"), data(doc, "K")
    raw_v = forward({**bundled("olmo_clip_qkv"), "clip_qkv": math.inf})["V"]
    assert [int((np.abs(a) > 2).sum()) for a in (Q, K, raw_v)] == [5, 4, 4]  # of 40, 20, 20
    for before, after in (
        (Q, data(doc, "Q_clip")),
        (K, data(doc, "K_clip")),
        (raw_v, data(doc, "V")),
    ):
        inside = np.abs(before) <= 2
        np.testing.assert_allclose(after[inside], before[inside], **F64)  # V's from the loops
        np.testing.assert_array_equal(after[~inside], 2 * np.sign(before[~inside]))


# ---------------------------------------------------------------------------------------------
# What a user sees: the table, HTML, --explain in both languages

SHOWN = {  # the stage that shows the variant, and its formula as the table prints it
    "llama4_chunked": (
        "masked",
        "masked = scaled, −∞ where not allowed (causal upper-left, chunks of 3)",
    ),
    "llama4_temperature": ("Q_tuned", "Q_tuned = Q × (1 + 0.5 · ln(1 + ⌊(position + 1) / 2⌋))"),
    "olmo_clip_qkv": ("Q_clip", "Q_clip = clamp(Q, −2, 2)"),
}
EXPLAINED = {  # what --explain says of that stage, in English and in Chinese
    "llama4_chunked": ("the first query of a chunk sees itself alone", "分块注意力 chunk = 3"),
    "llama4_temperature": ("far queries get sharper attention", "只缩放查询，不缩放键"),
    "olmo_clip_qkv": ("every entry of Q above 2 becomes 2", "Q 中大于 2 的元素变成 2"),
}


@pytest.mark.parametrize("name", NAMES)
def test_the_table_shows_the_variants_stage(name: str) -> None:
    formula = SHOWN[name][1]
    result = run_cli("trace", name, "-f", "plain", "--width", "100")
    assert result.exit_code == 0, result.output
    assert formula in result.stdout
    assert bundled(name)["name"] in result.stdout


@pytest.mark.slow  # Rich's HTML export of every stage
@pytest.mark.parametrize("name", NAMES)
def test_the_html_page_holds_the_variants_stage(tmp_path: Path, name: str) -> None:
    page = tmp_path / f"{name}.html"
    result = run_cli("trace", name, "-f", "html", "-o", str(page))
    assert result.exit_code == 0, result.output
    text = page.read_text("utf-8")
    assert text.startswith("<!DOCTYPE html>") and SHOWN[name][0] in text


@pytest.mark.parametrize(("name", "lang"), [(n, lang) for n in NAMES for lang in ("en", "zh")])
def test_explain_says_what_the_variant_does(name: str, lang: str) -> None:
    stage = SHOWN[name][0]
    args = (
        "trace",
        name,
        "-s",
        stage,
        "--explain",
        "--lang",
        lang,
        "-f",
        "plain",
        "--width",
        "200",
    )
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    said = " ".join(line.strip(" │") for line in result.stdout.splitlines())
    assert EXPLAINED[name][lang == "zh"] in said, said


# ---------------------------------------------------------------------------------------------
# The grader: each mistake of the variant, planted in the loops, named

MISTAKES = [
    ("llama4_chunked", "chunk_off_by_one", {"rule": lambda i, j: (i + 1) // 3 == (j + 1) // 3}),
    ("llama4_chunked", "chunk_off_by_one", {"rule": lambda i, j: (i - 1) // 3 == (j - 1) // 3}),
    ("llama4_chunked", "chunk_as_window", {"rule": lambda i, j: i - j < 3}),
    ("llama4_temperature", "temperature_on_keys", {"on_keys": True}),
    ("llama4_temperature", "temperature_off_by_one", {"offset": 0}),
    ("olmo_clip_qkv", "clip_qkv_left_out", {"unclipped": True}),
]


def graded(tmp_path: Path, name: str, stages: dict[str, Any]) -> dict[str, Any]:
    """``attn check NAME --against student.npz -f json``: the report of the one fixture."""
    dump = tmp_path / "student.npz"
    np.savez(dump, **stages)
    result = run_cli("check", name, "--against", str(dump), "-f", "json")
    assert result.exit_code in (0, 1), result.output
    (report,) = json.loads(result.stdout)["fixtures"]
    assert report["status"] in ("same", "different")
    return dict(report)


def diagnoses(report: dict[str, Any]) -> list[str]:
    return [d["name"] for d in report["diagnoses"]]


@pytest.mark.parametrize(
    ("name", "mistake", "how"), MISTAKES, ids=[f"{m}-{i}" for i, (_, m, _) in enumerate(MISTAKES)]
)
def test_each_mistake_of_the_variant_is_named(
    tmp_path: Path, name: str, mistake: str, how: dict[str, Any]
) -> None:
    student = forward(bundled(name), **how)
    keep = ["masked", "softmax", "output"] if name == "llama4_chunked" else list(student)
    if mistake == "temperature_on_keys":  # the queries are right: the scores differ first
        keep.remove("Q_tuned")
    report = graded(tmp_path, name, {n: student[n] for n in keep})
    assert diagnoses(report) == [mistake]


@pytest.mark.parametrize("name", NAMES)
def test_the_right_numbers_pass_and_name_nothing(tmp_path: Path, name: str) -> None:
    report = graded(tmp_path, name, forward(bundled(name)))
    assert report["status"] == "same" and diagnoses(report) == []


# ---------------------------------------------------------------------------------------------
# Decoding, FlashAttention, the backward pass: run exactly, or refuse in one line


@pytest.mark.parametrize("prefill", [1, 3])
@pytest.mark.parametrize("name", NAMES)
def test_decoding_gives_the_loops_rows(name: str, prefill: int) -> None:
    result = run_cli("decode", name, "--prefill", str(prefill), "-f", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    want = forward(bundled(name))["output"]  # (heads, T, d_v)
    assert [s["index"] for s in doc["steps"]] == list(range(prefill, want.shape[1]))
    for step in doc["steps"]:
        got = np.array(step["stages"]["output"]["data"])  # (heads, 1, d_v)
        np.testing.assert_allclose(got[:, 0], want[:, step["index"]], **F64)
    assert doc["max_abs_diff"] <= 1e-12


@pytest.mark.parametrize("name", NAMES)
def test_flash_gives_the_loops_output(name: str) -> None:
    result = run_cli("flash", name, "--block-q", "2", "--block-k", "2", "-f", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    np.testing.assert_allclose(data(doc, "output"), forward(bundled(name))["output"], **F64)
    assert all(check["ok"] for check in doc["checks"])


@pytest.mark.parametrize("name", ["llama4_chunked", "llama4_temperature"])
def test_the_backward_pass_is_the_loops_slope(name: str) -> None:
    """d_X against central differences of L = Σ output through the loops (step 1e-6)."""
    result = run_cli("trace", name, "--backward", "-s", "d_X", "-f", "json")
    assert result.exit_code == 0, result.output
    got = data(json.loads(result.stdout), "d_X")  # (T, d_model)
    fx, h = bundled(name), 1e-6
    slope = np.zeros_like(got)
    for t, m in np.ndindex(*got.shape):
        up, down = (json.loads(json.dumps(fx)) for _ in range(2))
        up["X"][t][m] += h
        down["X"][t][m] -= h
        slope[t, m] = (the_sum(up) - the_sum(down)) / (2 * h)
    np.testing.assert_allclose(got, slope, rtol=1e-6, atol=1e-7)


def test_the_backward_pass_refuses_clip_qkv_in_one_line() -> None:
    result = run_cli("trace", "olmo_clip_qkv", "--backward")
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("Error: olmo_clip_qkv.yaml: clip_qkv: is 2: the backward pass")


def test_the_worked_rope_cell_rotates_the_clipped_query() -> None:
    """olmo_clip_qkv: Q_rot[cat] is RoPE of Q_clip[cat], whose dimension 2 was clamped from
    −2.2381 to −2, so pair 0 at position 1 reads 1.2740·cos 1 − (−2)·sin 1 = 2.3713."""
    result = run_cli("trace", "olmo_clip_qkv", "-s", "Q_rot", "--cell", "cat,The", "-f", "plain")
    assert result.exit_code == 0, result.output
    said = " ".join(line.strip(" │") for line in result.stdout.splitlines())
    assert "Q_rot = RoPE(Q_clip, positions)" in said and "rotates Q_clip[cat]" in said
    by_hand = 1.2740 * math.cos(1) + 2 * math.sin(1)
    assert f"1.2740×0.5403 − (−2)×0.8415 = {by_hand:.4f}" in said
