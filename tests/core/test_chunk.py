"""Chunked attention, the shipped variant ``chunk`` (Llama 4's attention_chunk_size): its numbers
against the loop reference given the same rule as an explicit boolean mask (the rule stated a
second way), through trace, JSON, --explain (en/zh), the backward pass, decoding,
FlashAttention, and the grader's two mistakes planted in a student's masks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli
from reference import random_fixture, reference

from attn_cli.api import trace_file
from attn_cli.check.dump import load_dump
from attn_cli.check.grade import grade
from attn_cli.core.pipeline import run
from attn_cli.io.fixture import validate

CHUNK, T = 3, 7
F64 = 1e-12


def rule_mask(T: int, rule: Any) -> list[list[bool]]:
    """A rule written out as a loop: query i sees key j when ``rule(i, j)``."""
    return [[bool(rule(i, j)) for j in range(T)] for i in range(T)]


def same_chunk(i: int, j: int) -> bool:
    return i // CHUNK == j // CHUNK


def fixtures(seed: int = 7) -> tuple[dict[str, Any], dict[str, Any]]:
    """(with ``chunk``, with the same rule as an explicit mask); causal, 2 heads, GQA, RoPE."""
    fx = random_fixture(
        seed, seq=T, d_model=8, heads=2, kv_heads=1, d_k=4, W_O=True, causal=True, rope=True
    )
    return {**fx, "chunk": CHUNK}, {**fx, "mask": rule_mask(T, same_chunk)}


def write(tmp_path: Path, fx: dict[str, Any], name: str = "chunked.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(fx))
    return path


def test_chunks_match_the_loop_reference_with_an_explicit_mask() -> None:
    plugged, explicit = fixtures()
    trace = run(validate(plugged, "plugged"))
    want = reference(explicit)
    for name in ("masked", "softmax", "output", "projected"):
        np.testing.assert_allclose(trace[name].data, want[name], rtol=F64, atol=F64)
    assert "chunks of 3" in trace["masked"].formula
    # the first query of a chunk sees itself alone: unlike a window of 3
    assert trace["softmax"].data[0, 3, 3] == 1.0


def test_trace_json_and_explain_in_both_languages(tmp_path: Path) -> None:
    path = write(tmp_path, fixtures()[0])
    doc = run_cli("trace", str(path), "--format", "json")
    assert doc.exit_code == 0, doc.output
    assert json.loads(doc.stdout)["config"]["chunk"] == CHUNK
    en = run_cli("trace", str(path), "--stage", "masked", "--explain", "-f", "plain")
    assert en.exit_code == 0, en.output
    assert "Chunked attention, chunk = 3" in en.stdout.replace("\n", " ")
    zh = run_cli(
        "trace", str(path), "--stage", "masked", "--explain", "--lang", "zh", "-f", "plain"
    )
    assert zh.exit_code == 0, zh.output
    assert "分块注意力" in zh.stdout


@pytest.mark.parametrize(
    ("raw", "got"),
    [(0, "is 0"), (1.5, "got 1.5"), ("4", "got '4'"), (10**30, f"is {10**30}")],  # 10**30: was
)  # an OverflowError traceback in positions // chunk
def test_a_bad_chunk_is_one_line(tmp_path: Path, raw: Any, got: str) -> None:
    path = write(tmp_path, {**fixtures()[0], "chunk": raw})
    result = run_cli("trace", str(path))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: {path}: chunk: ")
    assert len(result.stderr.splitlines()) == 1


def test_chunk_without_causal_is_refused_in_one_line(tmp_path: Path) -> None:
    fx = {k: v for k, v in fixtures()[0].items() if k != "causal"}
    result = run_cli("trace", str(write(tmp_path, fx)))
    assert result.exit_code == 2
    assert "chunk: given without causal" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_backward_decode_and_flash_hide_the_same_keys(tmp_path: Path) -> None:
    from attn_cli.check.runs import run_decode, run_flash

    plugged, explicit = fixtures()
    mine = run(validate(plugged, "plugged"), backward=True)
    theirs = run(validate(explicit, "explicit"), backward=True)
    for name in [s.name for s in theirs if s.name.startswith("d_")]:
        np.testing.assert_allclose(mine[name].data, theirs[name].data, rtol=F64, atol=F64)
    path = write(tmp_path, plugged)
    want = reference(explicit)["output"]  # (H, T, Dv)
    decoded = run_decode(str(path), prefill=2)
    assert decoded.ok, decoded.worst
    for step in decoded.result.steps:
        np.testing.assert_allclose(step.output[0, :, 0], want[:, step.index], rtol=F64, atol=F64)
    flash = run_flash(str(path), block_q=2, block_k=3)
    assert flash.ok
    np.testing.assert_allclose(flash.output[0], want, rtol=F64, atol=F64)


STUDENTS = {
    "chunk_off_by_one": lambda i, j: (i + 1) // CHUNK == (j + 1) // CHUNK,
    "chunk_as_window": lambda i, j: i - j < CHUNK,
}


@pytest.mark.parametrize("mistake", sorted(STUDENTS))
def test_a_planted_mistake_is_named(tmp_path: Path, mistake: str) -> None:
    plugged, _ = fixtures()
    base = {k: v for k, v in plugged.items() if k != "chunk"}
    student = reference({**base, "mask": rule_mask(T, STUDENTS[mistake])})
    dump: dict[str, Any] = {n: student[n][None] for n in ("masked", "softmax", "output")}
    np.savez(tmp_path / "dump.npz", **dump)
    comparison = grade(trace_file(str(write(tmp_path, plugged))), load_dump(tmp_path / "dump.npz"))
    assert [d.name for d in comparison.diagnoses] == [mistake]
