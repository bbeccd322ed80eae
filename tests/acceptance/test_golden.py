"""This project's own golden files: the plain rendering (width 100) and the JSON trace of every
bundled example, compared on every run. A test never writes them; regenerate them on purpose:

    python tests/update_golden.py

The text is compared exactly. The JSON is compared exactly in structure (every key, in order,
every string and shape) and numerically within a tight tolerance, so that another CPU or BLAS
build, which may round the last bit differently, still passes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import BUNDLED, GOLDEN, REGENERATE, assert_same_json, clean_env, run_attn, run_cli

from attn_cli.api import trace_file


def test_there_is_a_golden_pair_for_every_bundled_example_and_nothing_else() -> None:
    expected = sorted(f"{n}{suffix}" for n in BUNDLED for suffix in (".json", ".txt"))
    assert sorted(p.name for p in GOLDEN.iterdir()) == expected, REGENERATE


@pytest.mark.parametrize("name", BUNDLED)
def test_plain_rendering_matches_its_golden(name: str) -> None:
    result = run_cli("trace", name, "--format", "plain", "--width", "100")
    assert result.exit_code == 0, result.output
    golden = (GOLDEN / f"{name}.txt").read_text(encoding="utf-8")
    assert result.stdout == golden, REGENERATE


@pytest.mark.parametrize("name", BUNDLED)
def test_the_plain_golden_cannot_depend_on_the_blas_kernel(name: str) -> None:
    """The text golden is compared exactly, which is safe only while no number it shows (4
    decimals) lies within a last-bit difference of a rounding edge: 0.12345 could print as
    0.1234 on one CPU and 0.1235 on another. Guard that for every stage of every example."""
    for stage in trace_file(name):
        data = np.asarray(stage.data, dtype=float)
        shown = data[np.isfinite(data)] * 10**4
        edge = np.abs(shown - np.floor(shown) - 0.5)  # 0 exactly on a half-way value
        near = edge < 1e-9 * np.maximum(1.0, np.abs(shown))
        assert not near.any(), f"{name}.{stage.name}: {shown[near] / 10**4} is on a rounding edge"


@pytest.mark.parametrize("name", BUNDLED)
def test_json_trace_matches_its_golden(name: str) -> None:
    result = run_cli("trace", name, "--format", "json")
    assert result.exit_code == 0, result.output
    now = json.loads(result.stdout)
    golden = json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))
    # the generator names the version that wrote the file; everything else must agree
    assert now.pop("generator").startswith("attn ") and golden.pop("generator").startswith("attn ")
    assert_same_json(now, golden, name)


def test_plain_output_never_shows_negative_zero(tmp_path: Path) -> None:
    # -0.00001 rounds to "-0.0000" in Python's f"{x:.4f}"; attn shows it as 0.0000
    fixture = tmp_path / "tiny.json"
    fixture.write_text(json.dumps({"Q": [[-0.00001, 1]], "K": [[1, 0]], "V": [[-0.00001, 2]]}))
    result = run_cli("trace", str(fixture), "--format", "plain")
    assert result.exit_code == 0
    assert f"{-0.00001:.4f}" == "-0.0000"
    assert "-0.0000" not in result.stdout
    assert "0.0000" in result.stdout


@pytest.mark.subprocess
def test_json_trace_is_numerically_identical_across_openblas_thread_counts(tmp_path: Path) -> None:
    # 16 x 256 @ 256 x 256 is above OpenBLAS's threading threshold (m·n·k > 262144), so the
    # projections really run on 1 and on 2 threads
    rng = np.random.default_rng(2024)
    fixture = {"X": rng.standard_normal((16, 256)).round(3).tolist(), "heads": 4}
    for w in ("W_Q", "W_K", "W_V", "W_O"):
        fixture[w] = (rng.standard_normal((256, 256)) / 16).round(4).tolist()
    path = tmp_path / "wide.json"
    path.write_text(json.dumps(fixture))
    traces = []
    for threads in ("1", "2"):
        env = clean_env(OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads)
        done = run_attn("trace", str(path), "--format", "json", env=env)
        assert done.returncode == 0, done.stderr
        traces.append(json.loads(done.stdout)["stages"])
    one, two = traces
    assert list(one) == list(two)
    for name in one:
        # within attn check's default tolerance (rtol 1e-9, atol 1e-12)
        np.testing.assert_allclose(
            np.array(two[name]["data"], float),
            np.array(one[name]["data"], float),
            rtol=1e-9,
            atol=1e-12,
            err_msg=name,
        )
