"""``dtype="float32"`` (``--dtype float32``): the same stages in single precision.

float32 carries about 7 significant digits (eps 1.2e-7). The fixtures here hold numbers of
order 1 and sums over at most a few dozen terms, so every stage agrees with the slow float64
loop reference to rtol 1e-4 plus atol 1e-5 (the floor for entries that cancel to near zero,
and for softmax weights, which pass on the scores' absolute error).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from conftest import Tolerance, run_cli
from reference import random_fixture, reference
from test_pipeline import CASES

from attn_cli.core.pipeline import run
from attn_cli.errors import ComputeError
from attn_cli.io.fixture import validate

FLOAT32: Tolerance = {"rtol": 1e-4, "atol": 1e-5}


def float32_trace(fx: dict[str, Any]) -> Any:
    return run(validate(fx, "test.json"), dtype="float32")


@pytest.mark.parametrize("case", list(CASES))
def test_float32_matches_the_float64_loop_reference(case: str) -> None:
    fx = random_fixture(7 + len(case), **CASES[case])
    expected = reference(fx)
    trace = float32_trace(fx)
    assert trace.dtype == "float32"
    assert list(trace.stages) == list(expected)
    for name, want in expected.items():
        got = trace[name].data
        assert got.dtype == np.float32, name
        np.testing.assert_allclose(got, want, err_msg=name, **FLOAT32)


def test_float32_keeps_empty_rows_exactly_zero() -> None:
    fx = {
        "Q": [[1.0], [1.0]],
        "K": [[1.0], [1.0]],
        "V": [[1.0], [2.0]],
        "mask": [[False, False], [True, True]],
    }
    trace = float32_trace(fx)
    assert trace.empty_rows == ((0, 0, 0),)
    assert trace["softmax"].data[0, 0].tolist() == [0.0, 0.0]
    assert trace["softmax"].data[0, 1].tolist() == [0.5, 0.5]


def test_a_number_beyond_float32_is_an_error_naming_it() -> None:
    # 1e39 is a fine float64 but infinite in float32: refused, not silently inf
    fx = {
        "X": [[1e39, 0.0]],
        "W_Q": [[1.0], [1.0]],
        "W_K": [[1.0], [1.0]],
        "W_V": [[1.0], [1.0]],
        "tokens": ["big"],
    }
    run(validate(fx, "test.json"))  # float64 copes (the scores overflow is checked below)
    with pytest.raises(ComputeError) as info:
        float32_trace(fx)
    assert info.value.field == "X[query 0 'big', feature 0]"
    assert "float32 overflow" in str(info.value)


def test_float32_overflow_in_a_stage_names_the_stage() -> None:
    # 1e20 * 1e20 = 1e40: finite in float64, beyond float32's 3.4e38
    with pytest.raises(ComputeError) as info:
        float32_trace({"Q": [[1e20]], "K": [[1e20]], "V": [[1.0]]})
    assert info.value.field.startswith("scores[")
    assert "float32 overflow" in str(info.value)


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="dtype"):
        run(validate(random_fixture(0), "test.json"), dtype="float16")  # type: ignore[arg-type]


def test_cli_json_says_which_dtype_made_it() -> None:
    result = run_cli("trace", "--dtype", "float32", "--format", "json")
    assert result.exit_code == 0, result.output
    trace = json.loads(result.stdout)
    assert trace["config"]["dtype"] == "float32"
    # softmax([0, 1, 1]) style rows of "The cat sat" still sum to 1 within float32 precision
    for row in trace["stages"]["softmax"]["data"][0]:
        assert abs(sum(row) - 1) < 1e-6
    default = json.loads(run_cli("trace", "--format", "json").stdout)
    assert default["config"]["dtype"] == "float64"


def test_cli_refuses_an_unknown_dtype() -> None:
    result = run_cli("trace", "--dtype", "float16")
    assert result.exit_code == 2
    assert "float16" in result.output
