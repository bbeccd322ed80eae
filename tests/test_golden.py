"""This project's own golden files: the plain rendering (width 100) and the JSON trace of every
bundled example, compared on every run. A test never writes them; regenerate them on purpose:

    python tests/update_golden.py

The text is compared exactly. The JSON is compared exactly in structure (every key, in order,
every string and shape) and numerically within a tight tolerance, so that another CPU or BLAS
build, which may round the last bit differently, still passes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import BUNDLED, GOLDEN, clean_env, run_attn, run_cli

REGENERATE = "if the change is intended: python tests/update_golden.py, then review the diff"
RTOL, ATOL = 1e-12, 1e-15  # last-bit differences only


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
def test_json_trace_matches_its_golden(name: str) -> None:
    result = run_cli("trace", name, "--format", "json")
    assert result.exit_code == 0, result.output
    now = json.loads(result.stdout)
    golden = json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))
    # the generator names the version that wrote the file; everything else must agree
    assert now.pop("generator").startswith("attn ") and golden.pop("generator").startswith("attn ")
    _same(now, golden, name)


def _same(now: Any, golden: Any, where: str) -> None:
    """Equal structure and strings; numbers within RTOL/ATOL; "-inf", "inf", "nan" exactly."""
    if isinstance(golden, dict):
        assert isinstance(now, dict) and list(now) == list(golden), f"{where}: keys; {REGENERATE}"
        for key in golden:
            _same(now[key], golden[key], f"{where}.{key}")
    elif isinstance(golden, list):
        assert isinstance(now, list) and len(now) == len(golden), f"{where}: length; {REGENERATE}"
        for i, (a, b) in enumerate(zip(now, golden, strict=True)):
            _same(a, b, f"{where}[{i}]")
    elif isinstance(golden, float) and not isinstance(now, (str, bool)) and now is not None:
        assert math.isclose(now, golden, rel_tol=RTOL, abs_tol=ATOL), f"{where}: {now} != {golden}"
    else:
        assert type(now) is type(golden) and now == golden, f"{where}: {now!r} != {golden!r}"


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
            np.array(two[name]["data"], float), np.array(one[name]["data"], float),
            rtol=1e-9, atol=1e-12, err_msg=name,
        )  # fmt: skip
