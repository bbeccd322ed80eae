"""q/k LayerNorm (the qk_layernorm variant) from the command line: ``attn new --qk-layernorm``
writes weights of one row per head (kv heads for K) that load and trace; the bundled example
``qk_layernorm`` through trace (tables, JSON, HTML, explanations in English and Chinese),
decoding and FlashAttention (each checks itself against the trace: every ✓) and the backward
pass. The numbers themselves: tests/core/test_qk_layernorm.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from attn_cli.io.fixture import load_fixture

EXAMPLE = "qk_layernorm"


@pytest.mark.parametrize("suffix", ["yaml", "npz"])
def test_new_writes_a_layernorm_per_head_that_traces(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"n.{suffix}"
    made = run_cli("new", str(path), "--qk-layernorm", "--heads", "4", "--kv-heads", "2")
    assert made.exit_code == 0, made.output
    if suffix == "yaml":
        text = path.read_text(encoding="utf-8")
        assert "qk_layernorm:   # LayerNorm of Q and K before RoPE" in text
    ln = load_fixture(path).setting("qk_layernorm")
    assert ln.q_weight.shape == (4, 4) and ln.k_weight.shape == (2, 4) and ln.eps == 1e-5
    assert ln.q_bias is None and ln.k_bias is None
    traced = run_cli("trace", str(path), "-f", "json")
    assert traced.exit_code == 0, traced.output
    assert {"Q_ln", "K_ln"} <= set(json.loads(traced.stdout)["stages"])


@pytest.mark.slow
def test_the_example_in_trace_json_html_and_explanations(tmp_path: Path) -> None:
    table = run_cli("trace", EXAMPLE, "-s", "Q_ln")
    assert table.exit_code == 0, table.stderr
    assert "Q_ln = (Q − mean(Q)) / √(var(Q) + eps) × q_weight" in table.stdout
    assert "q/k LayerNorm: a LayerNorm of each head of Q and K, one per head" in table.stdout
    data = json.loads(run_cli("trace", EXAMPLE, "-f", "json").stdout)
    assert data["config"]["qk_layernorm"] == {
        "eps": 1e-5,
        "q_weights": "head",
        "k_weights": "head",
        "bias": False,
    }
    page = tmp_path / "page.html"
    assert run_cli("trace", EXAMPLE, "-f", "html", "-o", str(page)).exit_code == 0
    assert "K_ln" in page.read_text(encoding="utf-8")
    for lang, word in (("en", "LayerNorm of each head of K"), ("zh", "K 每个头的 LayerNorm")):
        explained = run_cli("trace", EXAMPLE, "--explain", "--lang", lang, "-s", "K_ln")
        assert explained.exit_code == 0, explained.stderr
        assert word in explained.stdout


@pytest.mark.parametrize("command", ["decode", "flash"])
def test_decoding_and_flash_run_it_and_agree_with_the_trace(command: str) -> None:
    result = run_cli(command, EXAMPLE)
    assert result.exit_code == 0, result.stderr
    assert "✓" in result.stdout and "✗" not in result.stdout


def test_the_backward_pass_runs_it() -> None:
    result = run_cli("trace", EXAMPLE, "--backward", "-f", "json")
    assert result.exit_code == 0, result.stderr
    stages = json.loads(result.stdout)["stages"]
    assert {"d_Q_ln", "d_K_ln", "d_X"} <= set(stages)
    assert np.isfinite(np.asarray(stages["d_X"]["data"], dtype=float)).all()
