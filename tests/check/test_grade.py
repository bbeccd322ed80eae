"""The grader, ``attn check FIXTURE --against DUMP``: exit code first, then what it says.

``student`` below is attention written the way a student would (no batch axis, NumPy, separate
from attn's pipeline), into which one classic mistake at a time is planted. Each mistake must be
diagnosed by name; a difference that no mistake reproduces must be reported plainly.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from conftest import ROOT, run_cli
from typer.testing import Result

DOCS = ROOT / "docs" / "grader"


Array = npt.NDArray[Any]
Nested = Any  # a matrix as nested lists, as a fixture holds it


def student(
    Q: Nested,
    K: Nested,
    V: Nested,
    *,
    heads: int = 1,
    mask: Nested | None = None,
    causal: bool = False,
    mistake: str | None = None,
    dtype: type[np.floating[Any]] = np.float64,
) -> dict[str, Any]:
    """Scaled dot-product attention with at most one planted ``mistake``; stages by name."""
    Q, K, V = (np.asarray(a, dtype) for a in (Q, K, V))
    T, S = len(Q), len(K)
    d = Q.shape[1] // heads

    def split(x: Array) -> Array:
        if mistake == "heads_interleaved":
            h: Array = x.reshape(len(x), -1, heads).transpose(2, 0, 1)  # head h: columns h::heads
        else:
            h = x.reshape(len(x), heads, -1).transpose(1, 0, 2)  # (heads, seq, d)
        return h

    q, k, v = split(Q), split(K), split(V)
    if mistake == "scores_transposed":
        scores = k @ q.transpose(0, 2, 1)  # (heads, S, T)
    elif mistake == "k_not_transposed":
        scores = q @ k  # runs only because S == d
    else:
        scores = q @ k.transpose(0, 2, 1)  # (heads, T, S)
    factor = {"no_scaling": 1.0, "scaled_by_d_k": 1.0 / d}.get(mistake or "", 1.0 / np.sqrt(d))
    scaled = scores * dtype(factor)
    keep = np.ones(scores.shape[-2:], bool)
    if causal:
        tri = np.tril(np.ones((T, S), bool), k=1 if mistake == "causal_shifted" else 0)
        keep &= ~tri if mistake == "causal_inverted" else tri
    if mask is not None:
        keep &= ~np.asarray(mask, bool) if mistake == "mask_inverted" else np.asarray(mask, bool)
    axis = -2 if mistake == "softmax_wrong_axis" else -1
    with np.errstate(over="ignore", invalid="ignore"):
        masked = np.where(keep, scaled, -np.inf)
        top = 0 if mistake == "no_max_subtraction" else masked.max(axis, keepdims=True)
        e = np.exp(masked - top)
        weights = e / e.sum(axis, keepdims=True)
        out = weights @ v if weights.shape[-1] == v.shape[-2] else None
    return {"scores": scores, "scaled": scaled, "masked": masked, "weights": weights, "out": out}


# "The cat sat" after projection (Q = X·W_Q, K = X·W_K worked by hand), with a V of our own.
CAT = {
    "tokens": ["The", "cat", "sat"],
    "Q": [[2, 0], [0, 4], [2, 2]],
    "K": [[0, 1], [4, 2], [2, 2]],
    "V": [[1, 0], [0, 1], [1, 1]],
}
MASK = [[True, False, True], [True, True, False], [False, True, True]]


def run_student(
    fixture: dict[str, Any],
    mistake: str | None = None,
    keep: tuple[str, ...] = ("scores", "weights", "out"),
    dtype: type[np.floating[Any]] = np.float64,
) -> dict[str, Any]:
    stages = student(
        fixture["Q"],
        fixture["K"],
        fixture["V"],
        heads=fixture.get("heads", 1),
        mask=fixture.get("mask"),
        causal=fixture.get("causal", False),
        mistake=mistake,
        dtype=dtype,
    )
    return {name: stages[name] for name in keep}


def graded(
    tmp_path: Path,
    fixture: dict[str, Any],
    dump: dict[str, Any],
    suffix: str = ".json",
    *args: str,
) -> tuple[Result, dict[str, Any]]:
    """Grade ``dump`` (stage -> array) against ``fixture``: (plain result, JSON report)."""
    fixture_path = tmp_path / "fixture.json"
    fixture_path.write_text(json.dumps(fixture))
    dump_path = tmp_path / f"dump{suffix}"
    if suffix == ".npz":
        np.savez(dump_path, **dump)
    else:
        dump_path.write_text(json.dumps({k: np.asarray(v).tolist() for k, v in dump.items()}))
    base = ["check", str(fixture_path), "--against", str(dump_path), *args]
    plain = run_cli(*base, "--format", "plain")
    report = run_cli(*base, "--format", "json")
    assert report.exit_code == plain.exit_code
    return plain, json.loads(report.stdout)["fixtures"][0]


def diagnosed(report: dict[str, Any]) -> list[str]:
    return [d["name"] for d in report["diagnoses"]]


def said(result: Result) -> str:
    """The output with line wrapping undone."""
    return " ".join(result.stdout.split())


# ---------------------------------------------------------------------------------------------
# A correct implementation passes, whatever the dump's form


@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_a_correct_implementation_passes_with_aliases_reported(tmp_path: Path, suffix: str) -> None:
    result, report = graded(tmp_path, CAT, run_student(CAT), suffix)
    assert result.exit_code == 0, result.output
    assert "aliases: weights -> softmax, out -> output" in result.stdout
    assert result.stdout.rstrip().splitlines()[-1].startswith("same: ")
    assert report["aliases"] == {"weights": "softmax", "out": "output"}
    assert [s["status"] for s in report["stages"]] == ["same", "same", "same"]


def test_float32_code_passes_the_grader_default_tolerance(tmp_path: Path) -> None:
    result, _ = graded(tmp_path, CAT, run_student(CAT, dtype=np.float32), ".npz")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    "shape", [(3, 3), (1, 3, 3), (1, 1, 3, 3)], ids=["no-head", "head", "batch-and-head"]
)
def test_batch_and_head_axes_of_size_one_may_be_left_out_or_added(
    tmp_path: Path, shape: tuple[int, ...]
) -> None:
    weights = run_student(CAT, keep=("weights",))["weights"].reshape(shape)
    result, _ = graded(tmp_path, CAT, {"attention": weights})
    assert result.exit_code == 0, result.output


def test_a_batch_of_one_may_be_dumped_without_its_batch_axis(tmp_path: Path) -> None:
    batched = {**CAT, "Q": [CAT["Q"]], "K": [CAT["K"]], "V": [CAT["V"]]}  # [batch, seq, d]
    result, _ = graded(tmp_path, batched, run_student(CAT))
    assert result.exit_code == 0, result.output


def test_a_json_trace_is_a_dump_too(tmp_path: Path) -> None:
    fixture = tmp_path / "fixture.json"
    fixture.write_text(json.dumps(CAT))
    trace = tmp_path / "trace.json"
    traced = run_cli("trace", str(fixture), "-f", "json", "-o", str(trace))
    assert traced.exit_code == 0
    result = run_cli("check", str(fixture), "--against", str(trace))
    assert result.exit_code == 0, result.output
    assert "(7 stages," in result.stdout  # Q, K, V, scores, scaled, softmax, output


def test_names_that_are_not_stages_are_reported_as_ignored(tmp_path: Path) -> None:
    dump = {**run_student(CAT), "loss": [0.5], "Softmax_debug": [[1.0]]}
    result, report = graded(tmp_path, CAT, dump)
    assert result.exit_code == 0
    assert "ignored (not a stage name): loss, Softmax_debug" in result.stdout
    assert report["ignored"] == ["loss", "Softmax_debug"]


# ---------------------------------------------------------------------------------------------
# Each classic mistake, diagnosed by name


def test_no_scaling(tmp_path: Path) -> None:
    dump = run_student(CAT, "no_scaling", keep=("scores", "scaled", "weights", "out"))
    result, report = graded(tmp_path, CAT, dump)
    assert result.exit_code == 1
    assert report["first_difference"] == "scaled"
    assert diagnosed(report) == ["no_scaling"]
    assert "diagnosis: no 1/√d_k scaling" in result.stdout
    assert "1/√d_k = 0.707107" in said(result)
    assert report["diagnoses"][0]["explains"] == ["softmax", "output"]


def test_scaled_by_d_k_instead_of_its_square_root(tmp_path: Path) -> None:
    result, report = graded(tmp_path, CAT, run_student(CAT, "scaled_by_d_k"))
    assert result.exit_code == 1
    assert report["first_difference"] == "softmax"
    assert diagnosed(report) == ["scaled_by_d_k"]
    assert "diagnosis: scaled by d_k instead of √d_k" in result.stdout


def test_softmax_over_the_wrong_axis(tmp_path: Path) -> None:
    dump = run_student(CAT, "softmax_wrong_axis")
    np.testing.assert_allclose(dump["weights"].sum(axis=-2), 1.0, rtol=1e-12)  # columns
    result, report = graded(tmp_path, CAT, dump)
    assert result.exit_code == 1
    assert report["first_difference"] == "softmax"
    assert diagnosed(report) == ["softmax_wrong_axis"]
    assert "diagnosis: softmax over the wrong axis (columns sum to 1)" in result.stdout


def test_q_and_k_swapped(tmp_path: Path) -> None:
    result, report = graded(tmp_path, CAT, run_student(CAT, "scores_transposed"))
    assert result.exit_code == 1
    assert report["first_difference"] == "scores"
    assert diagnosed(report) == ["scores_transposed"]
    assert "diagnosis: Q and K swapped (scores transposed)" in result.stdout
    assert report["diagnoses"][0]["explains"] == ["softmax", "output"]


def test_q_and_k_swapped_with_fewer_queries_than_keys(tmp_path: Path) -> None:
    # K·Qᵀ has shape [seq_k, seq_q] = [3, 2]: a shape difference, still diagnosed
    fixture = {"Q": [[1, 0], [0, 1]], "K": [[1, 2], [3, 4], [5, 6]], "V": [[1], [2], [3]]}
    result, report = graded(
        tmp_path, fixture, run_student(fixture, "scores_transposed", keep=("scores",))
    )
    assert result.exit_code == 1
    assert report["stages"][0]["status"] == "shape"
    assert diagnosed(report) == ["scores_transposed"]


def test_k_not_transposed(tmp_path: Path) -> None:
    # seq_k = d_k = 2, so Q·K runs: [[1,2],[0,1]]·[[1,0],[2,1]] = [[5,2],[2,1]], not Q·Kᵀ
    fixture = {"Q": [[1, 2], [0, 1]], "K": [[1, 0], [2, 1]], "V": [[1, 0], [0, 1]]}
    dump = run_student(fixture, "k_not_transposed")
    np.testing.assert_array_equal(dump["scores"][0], [[5, 2], [2, 1]])
    result, report = graded(tmp_path, fixture, dump)
    assert result.exit_code == 1
    assert report["first_difference"] == "scores"
    assert diagnosed(report) == ["k_not_transposed"]
    assert "diagnosis: K not transposed (Q·K instead of Q·Kᵀ)" in result.stdout


def test_mask_polarity_inverted(tmp_path: Path) -> None:
    fixture = {**CAT, "mask": MASK}
    keep = ("scores", "masked", "weights", "out")
    result, report = graded(tmp_path, fixture, run_student(fixture, "mask_inverted", keep))
    assert result.exit_code == 1
    assert report["first_difference"] == "masked"
    assert diagnosed(report) == ["mask_inverted"]
    assert "diagnosis: mask polarity inverted" in result.stdout
    assert "nn.MultiheadAttention's convention" in said(result)


def test_causal_mask_inverted_with_an_empty_row_of_nan(tmp_path: Path) -> None:
    fixture = {**CAT, "causal": True}
    dump = run_student(fixture, "causal_inverted")
    assert np.isnan(dump["weights"][0, 2]).all()  # "sat" may see no later key: nan
    result, report = graded(tmp_path, fixture, dump)
    assert result.exit_code == 1
    assert report["first_difference"] == "softmax"
    assert diagnosed(report) == ["mask_inverted"]
    assert "causal mask inverted" in said(result)


def test_causal_mask_shifted_by_one(tmp_path: Path) -> None:
    fixture = {**CAT, "causal": True}
    result, report = graded(tmp_path, fixture, run_student(fixture, "causal_shifted"))
    assert result.exit_code == 1
    assert report["first_difference"] == "softmax"
    assert diagnosed(report) == ["causal_shifted"]
    assert "diagnosis: causal mask shifted by one" in result.stdout
    assert "each query also sees the next key" in said(result)


def test_heads_split_interleaved(tmp_path: Path) -> None:
    fixture = {
        "heads": 2,
        "Q": [[1, 0, 2, 0], [0, 1, 0, 2], [1, 1, 0, 0]],
        "K": [[0, 1, 1, 0], [1, 0, 0, 1], [2, 0, 0, 1]],
        "V": [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]],
    }
    dump = {"q": np.array(fixture["Q"], float), **run_student(fixture, "heads_interleaved")}
    result, report = graded(tmp_path, fixture, dump)
    assert result.exit_code == 1
    # the flat Q (before any split) is right; the first difference is in the scores per head
    assert [s["status"] for s in report["stages"][:2]] == ["same", "different"]
    assert report["first_difference"] == "scores"
    assert diagnosed(report) == ["heads_interleaved"]
    assert "diagnosis: heads split interleaved instead of in blocks" in result.stdout
    assert report["aliases"]["q"] == "Q"


def test_forgot_the_row_max_subtraction_float64(tmp_path: Path) -> None:
    # scores[0][0] = 40·40 = 1600, scaled 1131 > 709.78: exp overflows, inf/inf = nan
    fixture = {"Q": [[40, 0], [0, 1], [1, 1]], "K": [[40, 0], [0, 1], [1, 0]], "V": CAT["V"]}
    dump = run_student(fixture, "no_max_subtraction")
    assert np.isnan(dump["weights"][0, 0, 0])
    result, report = graded(tmp_path, fixture, dump)
    assert result.exit_code == 1
    assert report["first_difference"] == "softmax"
    assert diagnosed(report) == ["no_max_subtraction"]
    assert "diagnosis: forgot the row-max subtraction (overflow)" in result.stdout
    assert "in float64 without subtracting the row maximum" in said(result)


def test_forgot_the_row_max_subtraction_float32(tmp_path: Path) -> None:
    # scaled 144/√2 = 101.8: finite in float64, but exp overflows float32 above 88.72
    fixture = {"Q": [[12, 0], [0, 1], [1, 1]], "K": [[12, 0], [0, 1], [1, 0]], "V": CAT["V"]}
    dump = run_student(fixture, "no_max_subtraction", dtype=np.float32)
    result, report = graded(tmp_path, fixture, dump, ".npz")
    assert result.exit_code == 1
    assert diagnosed(report) == ["no_max_subtraction"]
    assert "in float32 without subtracting the row maximum" in said(result)


def test_a_row_with_nothing_to_attend_to_gives_nan(tmp_path: Path) -> None:
    fixture = {**CAT, "mask": [[False, False, False], [True, True, False], [True, True, True]]}
    result, report = graded(tmp_path, fixture, run_student(fixture))
    assert result.exit_code == 1
    assert diagnosed(report) == ["empty_row_nan"]


def test_a_stage_saved_under_another_name(tmp_path: Path) -> None:
    stages = run_student(CAT, keep=("scaled", "weights"))
    result, report = graded(tmp_path, CAT, {"scores": stages["scaled"], "attn": stages["weights"]})
    assert result.exit_code == 1
    assert report["first_difference"] == "scores"
    assert diagnosed(report) == ["stage_mixup"]
    assert "Your scores equals attn's scaled" in said(result)


# ---------------------------------------------------------------------------------------------
# Nothing is claimed that the numbers do not confirm


def test_an_unrecognised_difference_is_reported_plainly(tmp_path: Path) -> None:
    dump = run_student(CAT)
    dump["out"] = dump["out"] + 0.1
    result, report = graded(tmp_path, CAT, dump)
    assert result.exit_code == 1
    assert report["first_difference"] == "output"
    assert report["diagnoses"] == []
    assert "diagnosis: none. Your output differs from attn's" in said(result)
    assert "none of the known mistakes reproduces it" in said(result)


def test_columns_summing_to_1_alone_do_not_make_a_diagnosis(tmp_path: Path) -> None:
    # the wrong axis on top of a second mistake (Q off by 1%): the softmax's columns sum to 1,
    # but recomputing the wrong axis from attn's own scores does not give these numbers
    skewed = {**CAT, "Q": (np.array(CAT["Q"]) * 1.01).tolist()}
    dump = run_student(skewed, "softmax_wrong_axis", keep=("weights",))
    np.testing.assert_allclose(dump["weights"].sum(axis=-2), 1.0, rtol=1e-12)
    result, report = graded(tmp_path, CAT, dump)
    assert result.exit_code == 1
    assert report["diagnoses"] == []
    assert "diagnosis: none" in result.stdout


def test_a_mistake_that_changes_nothing_is_not_a_difference(tmp_path: Path) -> None:
    # Q = K: the scores are symmetric, so swapping Q and K gives the right numbers
    fixture = {"Q": [[1, 0], [0, 1], [1, 1]], "K": [[1, 0], [0, 1], [1, 1]], "V": CAT["V"]}
    result, _ = graded(tmp_path, fixture, run_student(fixture, "scores_transposed"))
    assert result.exit_code == 0, result.output


def test_the_first_difference_is_in_pipeline_order_not_file_order(tmp_path: Path) -> None:
    stages = run_student(CAT, "no_scaling", keep=("out", "weights", "scaled"))
    result, report = graded(tmp_path, CAT, stages)
    assert result.exit_code == 1
    assert report["first_difference"] == "scaled"
    assert [s["name"] for s in report["stages"]] == ["scaled", "softmax", "output"]


# ---------------------------------------------------------------------------------------------
# Unreadable dumps are trouble


def _write_npz_with_objects(path: Path) -> None:
    np.savez(path, scores=np.array([{"a": 1}], dtype=object))


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.json", None, "no such file"),
        ("bad.json", "{oops", "invalid JSON"),
        ("list.json", "[[1, 2]]", "top level is list"),
        ("ragged.json", '{"scores": [[1, 2], [3]]}', "scores: rows of different lengths"),
        ("strings.json", '{"scores": [["a"]]}', "scores: holds 'a'"),
        ("nothing.json", '{"loss": 1}', "no stage found (it holds loss)"),
        ("twice.json", '{"attn": [[1]], "weights": [[1]]}', "names the same stage (softmax)"),
        ("dump.txt", "scores 1 2 3", "unknown dump type '.txt'"),
        ("bad.npz", "this is not a zip archive", "not a readable .npz archive"),
        (
            "objects.npz",
            _write_npz_with_objects,
            "holds Python objects (reading them would unpickle)",
        ),
    ],
)
def test_an_unreadable_dump_is_trouble(
    tmp_path: Path, name: str, content: str | Callable[[Path], None] | None, message: str
) -> None:
    path = tmp_path / name
    if callable(content):
        content(path)
    elif content is not None:
        path.write_text(content)
    result = run_cli("check", "the_cat_sat", "--against", str(path))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: {path}")
    assert message in result.stderr
    assert result.stderr.count("\n") == 1


# ---------------------------------------------------------------------------------------------
# The worked example in docs/grader/


def test_the_docs_example_dump_is_what_the_student_code_writes() -> None:
    spec = importlib.util.spec_from_file_location(
        "student_attention", DOCS / "student_attention.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stages = module.attention(module.X)
    dump = json.loads((DOCS / "student_dump.json").read_text())
    assert list(dump) == list(stages)
    for name, arr in stages.items():
        np.testing.assert_allclose(dump[name], arr, rtol=1e-15, atol=0, err_msg=name)


def test_the_docs_example_is_diagnosed_exactly_as_the_docs_show(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(ROOT)
    dump = "docs/grader/student_dump.json"
    result = run_cli("check", "the_cat_sat", "--against", dump, "--format", "plain")
    assert result.exit_code == 1
    readme = (DOCS / "README.md").read_text()
    shown = re.search(r"```text\n(.*?)```", readme, re.S)
    assert shown is not None
    assert result.stdout == shown.group(1)
    report = run_cli("check", "the_cat_sat", "--against", dump, "--format", "json")
    assert [d["name"] for d in json.loads(report.stdout)["fixtures"][0]["diagnoses"]] == [
        "softmax_wrong_axis"
    ]
