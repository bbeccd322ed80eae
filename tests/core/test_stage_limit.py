"""``run(inputs, keep=...)`` (``--stage``): the stages asked for equal a full run's, and what
they do not need is neither kept nor computed."""

from __future__ import annotations

import json
import tracemalloc
from collections import Counter
from typing import Any

import numpy as np
import pytest
from conftest import run_cli
from reference import random_fixture
from test_pipeline import CASES

import attn_cli.core.engine as engine
import attn_cli.core.pipeline as pipeline
import attn_cli.core.stages as stages
import attn_cli.core.steps as steps
from attn_cli.core.pipeline import run
from attn_cli.core.stages import needed_stages
from attn_cli.io.fixture import validate


def inputs_of(case: str) -> Any:
    return validate(random_fixture(3 + len(case), **CASES[case]), "test.json")


@pytest.mark.parametrize("case", ["proj-gqa-W_O-b_O", "all-projection", "all-direct"])
def test_each_stage_alone_equals_the_full_run(case: str) -> None:
    inputs = inputs_of(case)
    full = run(inputs)
    for name in full.stages:
        alone = run(inputs, keep={name})
        assert list(alone.stages) == [name]
        # the same blocks in the same order: equal to the last bit, not just close
        assert np.array_equal(alone[name].data, full[name].data), name
        assert alone[name].formula == full[name].formula
        assert alone[name].axes == full[name].axes
    pair = run(inputs, keep={"softmax", "Q"})
    assert list(pair.stages) == ["Q", "softmax"]  # pipeline order, whatever the order asked


def test_a_stage_that_does_not_apply_is_absent_not_an_error() -> None:
    inputs = inputs_of("proj-single")  # no mask, one head, no W_O
    trace = run(inputs, keep={"masked", "projected", "scores"})
    assert list(trace.stages) == ["scores"]
    assert trace.applicable == ("X", "Q", "K", "V", "scores", "scaled", "softmax", "output")


def test_unknown_stage_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown stages"):
        run(inputs_of("proj-single"), keep={"weights"})  # not a stage: softmax is


CLASSIC = (
    "X",
    "Q",
    "K",
    "V",
    "scores",
    "scaled",
    "masked",
    "softmax",
    "output",
    "concat",
    "projected",
)


@pytest.mark.parametrize(
    ("keep", "needed"),
    [
        ({"X"}, {"X"}),
        ({"scores"}, {"X", "Q", "K", "scores"}),  # no V
        ({"softmax"}, {"X", "Q", "K", "scores", "scaled", "masked", "softmax"}),
        ({"V"}, {"X", "V"}),
        ({"projected"}, {*CLASSIC}),
    ],
)
def test_needed_stages(keep: set[str], needed: set[str]) -> None:
    applicable = stages.applicable_stages(inputs_of("all-projection"))
    assert needed_stages(keep, applicable) == needed


def count_calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    calls: Counter[str] = Counter()
    for module, name in (
        (pipeline, "project"),
        (engine, "attention_scores"),
        (steps, "exp_rows"),  # the softmax, inside the one chain (steps.attention)
        (engine, "weighted_sum"),
    ):
        real = getattr(module, name)

        def spy(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    return calls


def test_stages_not_needed_are_not_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = inputs_of("proj-gqa-W_O-b_O")  # batch 2, heads 4: one block per (batch, head)
    calls = count_calls(monkeypatch)
    run(inputs, keep={"X"})
    assert calls == Counter()
    run(inputs, keep={"scores"})
    assert calls == Counter(project=2, attention_scores=8)  # Q and K; no V, no softmax
    calls.clear()
    run(inputs, keep={"softmax"})
    assert calls == Counter(project=2, attention_scores=8, exp_rows=8)
    calls.clear()
    run(inputs)
    assert calls == Counter(project=4, attention_scores=8, exp_rows=8, weighted_sum=8)


@pytest.mark.slow  # a big trace under tracemalloc
def test_output_alone_never_holds_a_score_matrix() -> None:
    T, D = 4096, 4  # one (T, T) float64 score matrix is 128 MiB
    rng = np.random.default_rng(0)
    inputs = validate(
        {
            "Q": rng.standard_normal((T, D)),
            "K": rng.standard_normal((T, D)),
            "V": rng.standard_normal((T, D)),
            "causal": True,
        },
        "big.json",
    )
    matrix = T * T * 8
    tracemalloc.start()
    try:
        trace = run(inputs, keep={"output"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert list(trace.stages) == ["output"]
    assert peak < matrix / 4, f"peak {peak:,} bytes"  # a block of rows at a time
    assert inputs.V is not None
    np.testing.assert_allclose(trace["output"].data[0, 0], inputs.V[0, 0, 0], rtol=1e-15)


def test_cli_stage_keeps_only_that_stage_and_lists_what_applies() -> None:
    result = run_cli("trace", "--stage", "output", "--format", "json")
    assert result.exit_code == 0, result.output
    assert list(json.loads(result.stdout)["stages"]) == ["output"]
    result = run_cli("trace", "--stage", "masked")
    assert result.exit_code == 2
    assert "no such stage" in result.stderr
    assert "one of X, Q, K, V, scores, scaled, softmax, lse, output" in result.stderr
