"""A decode step shows the query the scores read under that stage's own name: after RoPE a norm
(post_rope_norm) or a temperature may act, and without RoPE only the temperature does, so the
row is not "the query rotated" then. Its numbers are the trace's row of that stage."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import run_cli

from attn_cli.api import trace_file


def _row(text: str, title: str) -> np.ndarray:
    """The two head rows of the table under ``title`` in plain output."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = [line for line in lines[start + 1 :] if line.startswith("head ")][:2]
    return np.array(
        [[float(x) for x in re.split(r"\s+", r.split(None, 2)[2].strip())] for r in rows]
    )


@pytest.mark.parametrize(
    ("example", "stage", "prefill"),
    [("llama4_temperature", "Q_tuned", 5), ("post_rope_norm", "Q_postnorm", 3)],
)
def test_the_query_row_is_named_by_the_stage_it_is(example: str, stage: str, prefill: int) -> None:
    result = run_cli("decode", example, "--prefill", str(prefill), "-f", "plain", "--width", "200")
    assert result.exit_code == 0, result.stderr
    title = f"{stage}: the query at position {prefill}, as the scores read it"
    assert title in result.stdout and "the query rotated" not in result.stdout
    trace = trace_file(example)
    want = trace[stage].data[:, prefill]  # (heads, d_k): the last token's row
    np.testing.assert_allclose(_row(result.stdout, title), want, atol=5e-5)


def test_a_rotated_query_keeps_its_name() -> None:
    result = run_cli("decode", "llama_rope_gqa", "--prefill", "3", "-f", "plain")
    assert result.exit_code == 0, result.stderr
    assert "Q_rot: the query rotated at position 3" in result.stdout
