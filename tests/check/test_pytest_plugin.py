"""The pytest plugin: a course's tests call ``attn_golden.check(my_attention, "lecture.yaml")``.

Run with pytester in this process (no subprocess): the plugin is named with ``-p`` because the
``pytest11`` entry point is only there once the package is installed with it.
"""

from __future__ import annotations

import json
import math

import pytest
from conftest import FIXTURES

from attn_cli.api import trace_file
from attn_cli.check.compare import check_golden, write_golden
from attn_cli.check.grade import grade  # noqa: F401
from attn_cli.present.report import failure_details  # noqa: F401

pytest_plugins = ["pytester"]


@pytest.fixture(scope="module", autouse=True)
def _warm(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Load every module the plugin's path uses before pytester's runs: an in-process run
    forgets the modules it imported, and NumPy (or YAML's constructors) cannot load twice."""
    trace = trace_file(FIXTURES / "causal_multihead.yaml")
    golden = tmp_path_factory.mktemp("warm") / "g.json"
    write_golden(trace, golden)
    check_golden(trace, golden)


PLUGIN = ("-p", "attn_cli.pytest_plugin", "-p", "no:cacheprovider", "--disable-plugin-autoload")

# Written as a student would, with plain NumPy: right, and with the classic mistakes.
STUDENT = """
import numpy as np


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def right(X, W_Q, W_K, W_V, scale):
    q, k, v = X @ W_Q, X @ W_K, X @ W_V
    w = softmax(q @ k.T * scale)
    return {"scores": q @ k.T, "weights": w, "out": w @ v}


def unscaled(X, W_Q, W_K, W_V):
    q, k, v = X @ W_Q, X @ W_K, X @ W_V
    w = softmax(q @ k.T)
    return {"scores": q @ k.T, "softmax": w, "output": w @ v}


def output_only(X, W_Q, W_K, W_V, d_k):
    q, k, v = X @ W_Q, X @ W_K, X @ W_V
    return softmax(q @ k.T / np.sqrt(d_k)) @ v


def wants_too_much(X, W_Q, rotary_base):
    return X


def test_right(attn_golden):
    comparison = attn_golden.check(right, "lecture.yaml")
    assert comparison.aliases == {"weights": "softmax", "out": "output"}


def test_output_only(attn_golden):
    attn_golden.check(output_only, "lecture.yaml")


def test_unscaled(attn_golden):
    attn_golden.check(unscaled, "lecture.yaml")


def test_wants_too_much(attn_golden):
    attn_golden.check(wants_too_much, "lecture.yaml")
"""


@pytest.fixture
def course(pytester: pytest.Pytester) -> pytest.Pytester:
    """A course folder: the lecture fixture (The cat sat) and the student's tests."""
    pytester.makepyfile(test_student=STUDENT)
    (pytester.path / "lecture.yaml").write_bytes((FIXTURES / "the_cat_sat.yaml").read_bytes())
    return pytester


def test_no_golden_fails_and_says_how_to_write_it(course: pytest.Pytester) -> None:
    result = course.runpytest(*PLUGIN, "-k", "right")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no golden trace*attn_golden/lecture.json*--attn-update*"])
    assert not (course.path / "attn_golden").exists()  # a test run never writes one


def test_update_writes_the_golden_then_grades(course: pytest.Pytester) -> None:
    result = course.runpytest(*PLUGIN, "--attn-update", "-k", "right or output_only")
    result.assert_outcomes(passed=2)
    golden = course.path / "attn_golden" / "lecture.json"
    doc = json.loads(golden.read_text())
    # softmax[The, cat] = 1 / (1 + e^(-4√2) + e^(-2√2)), worked by hand in test_explain.py
    expected = 1 / (1 + math.exp(-4 * math.sqrt(2)) + math.exp(-2 * math.sqrt(2)))
    assert math.isclose(doc["stages"]["softmax"]["data"][0][0][1], expected, rel_tol=1e-12)
    again = course.runpytest(*PLUGIN, "-k", "right or output_only")
    again.assert_outcomes(passed=2)


def test_a_mistake_fails_with_the_first_stage_and_the_diagnosis(course: pytest.Pytester) -> None:
    course.runpytest(*PLUGIN, "--attn-update", "-k", "right").assert_outcomes(passed=1)
    result = course.runpytest(*PLUGIN, "-k", "unscaled")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*AssertionError: attn_golden: unscaled() differs from attn's trace of*lecture.yaml",
            "*softmax differs first: 9 of 9 cells*",
            "*[[]head 0, query 0 The, key 1 cat]: attn 0.941089, yours 0.98169*",
            "*diagnosis: no 1/√d_k scaling*",
            "*It also accounts for your output.*",
        ]
    )


def test_a_changed_fixture_is_caught_by_its_golden(course: pytest.Pytester) -> None:
    course.runpytest(*PLUGIN, "--attn-update", "-k", "right").assert_outcomes(passed=1)
    lecture = course.path / "lecture.yaml"
    lecture.write_text(lecture.read_text().replace("[1, 0, 1, 0]", "[1, 0, 1, 1]", 1))
    result = course.runpytest(*PLUGIN, "-k", "right")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no longer matches its golden*(first: X)*--attn-update*"])


def test_a_parameter_the_fixture_lacks_is_named(course: pytest.Pytester) -> None:
    course.runpytest(*PLUGIN, "--attn-update", "-k", "right").assert_outcomes(passed=1)
    result = course.runpytest(*PLUGIN, "-k", "wants_too_much")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*wants_too_much() needs 'rotary_base'*it gives: X, *"])


def test_golden_dir_setting_and_bundled_names(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nattn_golden_dir = goldens\n")
    pytester.makepyfile(
        test_bundled="""
        def mine(X, W_Q, W_K, W_V, scale):
            import numpy as np
            s = (X @ W_Q) @ (X @ W_K).T * scale
            w = np.exp(s - s.max(-1, keepdims=True))
            return {"softmax": w / w.sum(-1, keepdims=True)}

        def test_it(attn_golden):
            attn_golden.check(mine, "causal_multihead")
        """
    )
    result = pytester.runpytest(*PLUGIN, "--attn-update")
    result.assert_outcomes(failed=1)  # two heads: one softmax for both is the wrong shape
    assert (pytester.path / "goldens" / "causal_multihead.json").is_file()
    result.stdout.fnmatch_lines(["*softmax shape differs first: attn [[]2, 4, 4], yours [[]4, 4]*"])


def test_the_plugin_module_imports_only_pytest() -> None:
    """Loaded by every pytest run where attn is installed: its imports stay at module level."""
    import ast
    import inspect

    import attn_cli.pytest_plugin

    tree = ast.parse(inspect.getsource(attn_cli.pytest_plugin))
    top = {
        alias.name.split(".")[0]
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in (
            node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
        )
    }
    assert top <= {"__future__", "inspect", "os", "collections", "pathlib", "typing", "pytest"}


PROBED = """
import math

import numpy as np


def attention(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True) @ v


def over_d(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) / q.shape[-1]
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True) @ v


def test_right(attn_probe):
    attn_probe.assert_matches(attention)
    assert attn_probe(attention).conventions["gqa"] == "refused"


def test_over_d(attn_probe):
    attn_probe.assert_matches(over_d)
"""


@pytest.mark.slow
def test_attn_probe_asserts_that_a_function_matches_sdpa(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_probed=PROBED)
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*attn_probe: over_d differs from PyTorch SDPA:*", "*- scaled_by_d_k: scaled by d_k*"]
    )
