"""The grader's accounting and its hints (issue 14, "The grader").

- A mistake that empties a row, followed by the student's own plain softmax (nan for that row):
  the nan rows of the later stages come from the mistake, not from a second difference.
- No diagnosis, but every cell of the first differing stage is attn's times one number: say so,
  and read the number (1/√d_k ...).
- A dump whose shape is a permutation of attn's: say which transpose fits, and whether the
  numbers then match.

``student`` below is attention written in loops the way a student would (NumPy as a container,
``math.exp`` for the softmax, no batch-wide tricks), separate from attn's pipeline and the grader.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from conftest import run_cli
from typer.testing import Result

Array = npt.NDArray[np.float64]
NAN = float("nan")

# "The cat sat" after projection, with d_k = 2 (scale 1/√2), causal.
CAT = {
    "tokens": ["The", "cat", "sat"],
    "Q": [[2, 0], [0, 4], [2, 2]],
    "K": [[0, 1], [4, 2], [2, 2]],
    "V": [[1, 0], [0, 1], [1, 1]],
    "causal": True,
}
# Two heads of d_k = 2 (scale 1/√2), four tokens, no mask.
TWO_HEADS = {
    "heads": 2,
    "Q": [[1, 0, 2, 1], [0, 1, 0, 2], [1, 1, 0, 0], [2, 0, 1, 1]],
    "K": [[0, 1, 1, 0], [1, 0, 0, 1], [2, 0, 0, 1], [1, 1, 1, 1]],
    "V": [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [0, 1, 0, 1]],
}
MASKS = {
    "not_tril": "mask_inverted",  # allowed = ~tril: each query sees only later keys
    "tril_k-1": "causal_shifted",  # allowed = tril(k=-1): each query misses its own key
}


def plain_softmax(row: list[float]) -> list[float]:
    """exp(x - max) / sum, as written by hand: a row of -inf gives nan (-inf - -inf)."""
    top = max(row)
    if top == -math.inf:
        return [NAN] * len(row)  # what NumPy and torch.softmax give for such a row
    e = [math.exp(x - top) for x in row]
    total = math.fsum(e)
    return [x / total for x in e]


def allowed(kind: str | None, t: int, s: int) -> bool:
    """Whether query t may attend to key s: causal, or with one of the planted mask mistakes."""
    if kind == "not_tril":
        return not s <= t  # ~tril(ones)
    if kind == "tril_k-1":
        return s <= t - 1  # tril(ones, k=-1)
    return s <= t


def student(
    Q: Any,
    K: Any,
    V: Any,
    *,
    heads: int = 1,
    causal: str | None = "ok",
    lengths: list[int] | None = None,
    q_scale: float = 1.0,
    v_scale: float = 1.0,
    scale: float | None = None,
) -> dict[str, Array]:
    """Attention per batch item, head and query in loops; [batch, heads, ...] arrays.

    ``causal``: None (no mask), "ok", or a planted mask mistake (see ``allowed``). With
    ``lengths``, only the first ``lengths[b]`` keys exist, and an item with none is skipped (its
    weights and output stay 0): the padding is handled apart from the causal mask.
    ``q_scale`` and ``v_scale`` multiply Q and V before anything else (a planted extra scale);
    ``scale`` is the scores' (default 1/√d).
    """
    q_all, k_all, v_all = (np.asarray(a, dtype=np.float64) for a in (Q, K, V))
    if q_all.ndim == 2:
        q_all, k_all, v_all = q_all[None], k_all[None], v_all[None]
    q_all, v_all = q_all * q_scale, v_all * v_scale
    B, T, width = q_all.shape
    S, dv = k_all.shape[1], v_all.shape[2] // heads
    d = width // heads
    factor = 1 / math.sqrt(d) if scale is None else scale
    st = {
        "Q": np.zeros((B, heads, T, d)),
        "scores": np.zeros((B, heads, T, S)),
        "masked": np.full((B, heads, T, S), -math.inf),
        "softmax": np.zeros((B, heads, T, S)),
        "output": np.zeros((B, heads, T, dv)),
    }
    for b in range(B):
        n_keys = S if lengths is None else lengths[b]
        for h in range(heads):
            q = q_all[b, :, h * d : (h + 1) * d]
            k = k_all[b, :, h * d : (h + 1) * d]
            v = v_all[b, :, h * dv : (h + 1) * dv]
            st["Q"][b, h] = q
            for t in range(T):
                for s in range(S):
                    st["scores"][b, h, t, s] = math.fsum(q[t, i] * k[s, i] for i in range(d))
            if n_keys == 0:
                continue  # a fully padded item: nothing to attend to, weights stay 0
            for t in range(T):
                row = [
                    st["scores"][b, h, t, s] * factor
                    if causal is None or allowed(causal, t, s)
                    else -math.inf
                    for s in range(n_keys)
                ]
                st["masked"][b, h, t, :n_keys] = row
                w = plain_softmax(row)
                st["softmax"][b, h, t, :n_keys] = w
                for j in range(dv):
                    st["output"][b, h, t, j] = math.fsum(w[s] * v[s, j] for s in range(n_keys))
    return st


def grade(
    tmp_path: Path, fixture: dict[str, Any], dump: dict[str, Any], fmt: str = "plain"
) -> Result:
    """``attn check FIXTURE --against DUMP --format FMT``, the dump as a user's .npz."""
    fixture_path = tmp_path / "fixture.json"
    fixture_path.write_text(json.dumps(fixture))
    dump_path = tmp_path / "dump.npz"
    np.savez(dump_path, **dump)
    return run_cli("check", str(fixture_path), "--against", str(dump_path), "--format", fmt)


def report(tmp_path: Path, fixture: dict[str, Any], dump: dict[str, Any]) -> dict[str, Any]:
    result = grade(tmp_path, fixture, dump, "json")
    assert result.exit_code == 1, result.output
    found: dict[str, Any] = json.loads(result.stdout)["fixtures"][0]
    return found


def said(result: Result) -> str:
    """The output with line wrapping undone."""
    return " ".join(result.stdout.split())


def unbatched(stages: dict[str, Array], *names: str) -> dict[str, Array]:
    """The named stages without the batch axis, as a fixture without one is dumped."""
    return {n: stages[n][0] for n in names}


# ---------------------------------------------------------------------------------------------
# 1. A mistake that empties a row, then the student's own plain softmax


@pytest.mark.parametrize("kind", list(MASKS))
def test_the_nan_row_of_a_plain_softmax_is_the_mistakes_not_a_second_one(
    tmp_path: Path, kind: str
) -> None:
    stages = student(CAT["Q"], CAT["K"], CAT["V"], causal=kind)
    empty = 2 if kind == "not_tril" else 0  # ~tril: "sat" sees no key; tril(k=-1): "The" none
    assert all(math.isnan(x) for x in stages["softmax"][0, 0, empty])
    result = grade(tmp_path, CAT, unbatched(stages, "scores", "masked", "softmax", "output"))
    assert result.exit_code == 1, result.output
    assert "second difference" not in said(result)
    assert "It also accounts for your softmax, output." in said(result)
    found = report(tmp_path, CAT, unbatched(stages, "scores", "masked", "softmax", "output"))
    assert found["first_difference"] == "masked"
    assert [(d["name"], d["explains"], d["unexplained"]) for d in found["diagnoses"]] == [
        (MASKS[kind], ["softmax", "output"], [])
    ]


@pytest.mark.parametrize("kind", list(MASKS))
def test_a_softmax_that_is_nan_in_some_empty_rows_and_zero_in_others(
    tmp_path: Path, kind: str
) -> None:
    # the student skips a fully padded item (its rows stay 0) but takes a plain softmax
    # elsewhere, so the row the mistake empties is nan: attn follows the softmax row by row
    fixture = {
        **CAT,
        "Q": [CAT["Q"]] * 2,
        "K": [CAT["K"]] * 2,
        "V": [CAT["V"]] * 2,
        "lengths": [3, 0],
    }
    stages = student(fixture["Q"], fixture["K"], fixture["V"], causal=kind, lengths=[3, 0])
    assert np.isnan(stages["softmax"][0]).any() and (stages["softmax"][1] == 0).all()
    dump = {n: stages[n] for n in ("masked", "softmax", "output")}
    result = grade(tmp_path, fixture, dump)
    assert result.exit_code == 1, result.output
    assert "second difference" not in said(result)
    assert "It also accounts for your softmax, output." in said(result)
    assert "nan for a row with nothing to attend to" in said(result)
    found = report(tmp_path, fixture, dump)
    assert [(d["name"], d["explains"], d["unexplained"]) for d in found["diagnoses"]] == [
        (MASKS[kind], ["softmax", "output"], [])
    ]
    # without the masked stage, the softmax is the first difference and is diagnosed alike
    only = report(tmp_path, fixture, {n: stages[n] for n in ("softmax", "output")})
    assert only["first_difference"] == "softmax"
    assert [(d["name"], d["explains"]) for d in only["diagnoses"]] == [(MASKS[kind], ["output"])]


def test_a_nan_row_the_mistake_does_not_empty_is_still_a_difference(tmp_path: Path) -> None:
    # the same mistake, and a nan the mistake cannot explain (a row that has keys): not claimed
    stages = student(CAT["Q"], CAT["K"], CAT["V"], causal="tril_k-1")
    stages["output"][0, 0, 1] = NAN
    found = report(tmp_path, CAT, unbatched(stages, "masked", "softmax", "output"))
    assert [(d["name"], d["unexplained"]) for d in found["diagnoses"]] == [
        ("causal_shifted", ["output"])
    ]


# ---------------------------------------------------------------------------------------------
# 2a. No diagnosis, but one factor everywhere


def two_heads(**planted: Any) -> dict[str, Array]:
    return student(TWO_HEADS["Q"], TWO_HEADS["K"], TWO_HEADS["V"], heads=2, causal=None, **planted)


RATIOS = [
    # (planted, dumped, first stage, ratio, reading, suggestion)
    (
        {"q_scale": 1 / math.sqrt(2)},
        ("Q", "scores", "softmax", "output"),
        "Q",
        1 / math.sqrt(2),
        "1/√2",
        "a scale of 1/√d_k applied twice, or where it was not meant?",
    ),
    (
        {"q_scale": math.sqrt(2)},
        ("Q", "softmax"),
        "Q",
        math.sqrt(2),
        "√2",
        "a scale of 1/√d_k left out, or undone?",
    ),
    (
        {"v_scale": 3.0},
        ("softmax", "output"),
        "output",
        3.0,
        "",
        "a scale or a normalisation applied where it was not meant, or left out?",
    ),
    (
        {"q_scale": -1.0},
        ("Q",),
        "Q",
        -1.0,
        "-1",
        "the sign flipped: a difference taken the wrong way round?",
    ),
]


@pytest.mark.parametrize(
    ("planted", "dumped", "first", "ratio", "reading", "suggestion"),
    RATIOS,
    ids=["Q-over-sqrt-d_k", "Q-times-sqrt-d_k", "V-times-3", "Q-negated"],
)
def test_one_factor_everywhere_is_said_and_read(
    tmp_path: Path,
    planted: dict[str, float],
    dumped: tuple[str, ...],
    first: str,
    ratio: float,
    reading: str,
    suggestion: str,
) -> None:
    dump = unbatched(two_heads(**planted), *dumped)
    found = report(tmp_path, TWO_HEADS, dump)
    assert found["first_difference"] == first
    assert found["diagnoses"] == []
    shown = found["ratio"]
    np.testing.assert_allclose(shown.pop("ratio"), ratio, rtol=1e-12)
    differing = next(s["differing"] for s in found["stages"] if s["name"] == first)
    assert shown == {
        "stage": first,
        "cells": differing,
        "reading": reading,
        "suggestion": suggestion,
    }
    assert found["transpose"] is None
    text = f"{ratio:.4g}" + (f" = {reading}" if reading else "")
    line = f"hint: every cell of your {first} is attn's × {text}: {suggestion}"
    assert line in said(grade(tmp_path, TWO_HEADS, dump))


def test_the_ratio_in_the_issues_words(tmp_path: Path) -> None:
    dump = unbatched(two_heads(q_scale=1 / math.sqrt(2)), "Q", "softmax")
    result = grade(tmp_path, TWO_HEADS, dump)
    assert result.exit_code == 1
    assert (
        "Q is attn's × 0.7071 = 1/√2: a scale of 1/√d_k applied twice, or where it was not "
        "meant?" in said(result)
    )


def test_no_ratio_when_a_mistake_fits_or_the_factor_varies(tmp_path: Path) -> None:
    # scaled by 1/d_k: the masked stage is attn's × 1/√2, and that is a named mistake
    stages = student(CAT["Q"], CAT["K"], CAT["V"], scale=1 / 2)
    found = report(tmp_path, CAT, unbatched(stages, "masked", "softmax"))
    assert [d["name"] for d in found["diagnoses"]] == ["scaled_by_d_k"]
    assert found["ratio"] is None
    # an offset is no factor
    stages = two_heads()
    stages["output"] = stages["output"] + 0.1
    found = report(tmp_path, TWO_HEADS, unbatched(stages, "softmax", "output"))
    assert found["diagnoses"] == [] and found["ratio"] is None
    # one differing cell has a ratio to itself: not worth saying
    stages = two_heads()
    stages["output"][0, 1, 2, 0] *= 2
    found = report(tmp_path, TWO_HEADS, unbatched(stages, "output"))
    assert found["ratio"] is None


# ---------------------------------------------------------------------------------------------
# 2b. The axes in another order


def test_weights_as_query_head_key_name_the_transpose_and_match(tmp_path: Path) -> None:
    stages = two_heads()
    by_query = stages["softmax"][0].transpose(1, 0, 2)  # einsum("qhd,khd->qhk"): [query, head, key]
    dump = {"weights": by_query, "out": stages["output"][0]}
    found = report(tmp_path, TWO_HEADS, dump)
    assert found["stages"][0]["status"] == "shape"
    assert found["transpose"] == {
        "stage": "softmax",
        "permutation": [1, 0, 2],
        "call": "transpose(1, 0, 2)",
        "your_axes": ["query", "head", "key"],
        "axes": ["head", "query", "key"],
        "cells": 32,
        "differing": 0,
        "matches": True,
    }
    assert found["ratio"] is None
    line = (
        "hint: your softmax is [query, head, key] where attn's is [head, query, key]: "
        "transpose(1, 0, 2) makes it fit, and then every cell matches: only the order of the "
        "axes differs."
    )
    assert line in said(grade(tmp_path, TWO_HEADS, dump))


def test_a_transpose_that_fits_the_shape_but_not_the_numbers(tmp_path: Path) -> None:
    # one head, left out, and the key axis first: [key, query] for [head=1, query, key]
    fixture = {"Q": [[1, 0], [0, 1]], "K": [[1, 2], [3, 4], [5, 6]], "V": [[1], [2], [3]]}
    stages = student(fixture["Q"], fixture["K"], fixture["V"], causal=None, q_scale=2.0)
    dump = {"softmax": stages["softmax"][0, 0].T}  # (S, T) = (3, 2)
    found = report(tmp_path, fixture, dump)
    t = found["transpose"]
    assert (t["call"], t["your_axes"], t["axes"]) == (
        "transpose(1, 0)",
        ["key", "query"],
        ["query", "key"],
    )
    assert not t["matches"] and 0 < t["differing"] <= t["cells"] == 6
    text = said(grade(tmp_path, fixture, dump))
    assert f"transpose(1, 0) makes it fit, but then {t['differing']} of 6 cells still differ" in (
        text
    )


# ---------------------------------------------------------------------------------------------
# Every report format carries the hints


def test_junit_and_github_carry_the_hints(tmp_path: Path) -> None:
    stages = two_heads(q_scale=1 / math.sqrt(2))
    dump = {"Q": stages["Q"][0], "weights": stages["softmax"][0].transpose(1, 0, 2)}
    ratio = "hint: every cell of your Q is attn's × 0.7071 = 1/√2: a scale of 1/√d_k applied"
    junit = grade(tmp_path, TWO_HEADS, dump, "junit")
    assert junit.exit_code == 1
    failures = [f.text or "" for f in ET.fromstring(junit.stdout.encode()).iter("failure")]
    assert len(failures) == 2 and all(ratio in text for text in failures)
    github = grade(tmp_path, TWO_HEADS, dump, "github")
    assert github.exit_code == 1
    (command,) = [line for line in github.stdout.splitlines() if line.startswith("::error")]
    assert ratio.replace("%", "%25") in command.split("::", 2)[2].replace("%0A", "\n")
    # the first stage is Q; softmax's shape differs later: only the first stage is hinted at
    assert "transpose(" not in github.stdout


def test_a_transpose_hint_in_junit_and_github(tmp_path: Path) -> None:
    stages = two_heads()
    dump = {"weights": stages["softmax"][0].transpose(1, 0, 2)}
    hint = "transpose(1, 0, 2) makes it fit, and then every cell matches"
    junit = grade(tmp_path, TWO_HEADS, dump, "junit")
    (failure,) = ET.fromstring(junit.stdout.encode()).iter("failure")
    assert failure.get("type") == "shape" and hint in (failure.text or "")
    github = grade(tmp_path, TWO_HEADS, dump, "github")
    assert hint in github.stdout.replace("%0A", "\n")


# ---------------------------------------------------------------------------------------------
# 2c. What else the first differing stage looks like (issue 28): a hint whenever nothing fits


def _plant(stage: str, change: Any, fixture: dict[str, Any] = TWO_HEADS) -> dict[str, Array]:
    """The student's correct stages (no batch axis) with ``change`` applied to ``stage``."""
    q, k, v = fixture["Q"], fixture["K"], fixture["V"]
    causal = "ok" if fixture.get("causal") else None
    stages = student(q, k, v, heads=fixture.get("heads", 1), causal=causal)
    names = ("scores", "masked", "softmax", "output") if causal else ("scores", "softmax", "output")
    dump = unbatched(stages, *names)
    dump[stage] = change(dump[stage].copy())
    return dump


def _move_query(x: Array) -> Array:
    x[:, 1:] = x[:, :-1].copy()  # your query i is attn's query i - 1
    return x


def _first_row_halved(x: Array) -> Array:
    x[:, 0] *= 0.5
    return x


LOOKED = [
    (
        "output",
        lambda x: x + 0.1,
        TWO_HEADS,
        "every cell of your output is attn's + 0.1: a bias or a constant added",
    ),
    (
        "scores",
        lambda x: x - x.max(axis=-1, keepdims=True),
        TWO_HEADS,
        "each row of your "
        "scores is attn's plus a number of its own (one per query): the softmax does not see it",
    ),
    (
        "output",
        _move_query,
        TWO_HEADS,
        "your output is attn's moved by one query: your query i holds attn's query i - 1",
    ),
    (
        "output",
        lambda x: x[..., ::-1],
        TWO_HEADS,
        "your output is attn's with its d_v axis in "
        "another order: your d_v 0, 1, 2, ... hold attn's d_v 1, 0",
    ),
    (
        "softmax",
        _first_row_halved,
        TWO_HEADS,
        "the rows of your softmax sum to between 0.5 and "
        "1, attn's to 1: a softmax over another extent",
    ),
]


@pytest.mark.parametrize(
    ("stage", "change", "fixture", "hint"),
    LOOKED,
    ids=["offset", "offset-per-row", "shift", "permutation", "row-sums"],
)
def test_what_the_differing_stage_looks_like_is_a_hint(
    tmp_path: Path, stage: str, change: Any, fixture: dict[str, Any], hint: str
) -> None:
    found = report(tmp_path, fixture, _plant(stage, change, fixture))
    assert found["first_difference"] == stage
    assert found["diagnoses"] == [] and found["ratio"] is None
    assert any(hint in h for h in found["hints"]), found["hints"]
    text = said(grade(tmp_path, fixture, _plant(stage, change, fixture)))
    assert f"hint: {found['hints'][0]}" in text


def test_cells_that_keep_the_earlier_stage_are_named(tmp_path: Path) -> None:
    # CAT, causal: one hidden place of masked left as attn's scaled (the mask not applied there)
    stages = student(CAT["Q"], CAT["K"], CAT["V"])
    scaled = np.asarray(CAT["Q"], float) @ np.asarray(CAT["K"], float).T / math.sqrt(2)
    masked = stages["masked"][0].copy()
    masked[0, 0, 2] = scaled[0, 2]
    found = report(tmp_path, CAT, {"masked": masked})
    assert found["diagnoses"] == []
    assert found["hints"] == [
        "in the 1 cells that differ, your masked holds attn's scaled: the step from scaled to "
        "masked is not done there (a mask not applied, a transform skipped?)"
    ]


def test_noise_is_hinted_at_by_where_it_differs(tmp_path: Path) -> None:
    stages = student(CAT["Q"], CAT["K"], CAT["V"])
    softmax = stages["softmax"][0].copy()
    softmax[0, 2] = [0.2, 0.5, 0.3]  # the last query's weights made up
    found = report(tmp_path, CAT, {"softmax": softmax})
    assert found["diagnoses"] == [] and found["ratio"] is None
    (hint,) = found["hints"]
    assert hint.startswith("3 of 9 cells of your softmax differ (only query 2)"), hint


def test_a_shape_no_transpose_fits_is_hinted_at(tmp_path: Path) -> None:
    stages = student(CAT["Q"], CAT["K"], CAT["V"])
    kept = np.concatenate([stages["softmax"][0], np.zeros((1, 3, 1))], axis=-1)  # a 4th column
    found = report(tmp_path, CAT, {"softmax": kept})
    assert found["transpose"] is None
    assert found["hints"] == [
        "your softmax has shape [1, 3, 4] where attn's is [1, 3, 3] [head, query, key]: an axis "
        "kept, added or cut that attn does not have (a sink column not dropped, heads not merged "
        "or split, a batch axis?)"
    ]


def test_a_named_mistake_gets_no_hint(tmp_path: Path) -> None:
    stages = student(CAT["Q"], CAT["K"], CAT["V"], causal="not_tril")
    found = report(tmp_path, CAT, unbatched(stages, "masked", "softmax"))
    assert [d["name"] for d in found["diagnoses"]] == ["mask_inverted"]
    assert found["hints"] == []


def test_differences_only_at_hidden_keys_are_said_to_be_there(tmp_path: Path) -> None:
    # CAT, causal: the three hidden places of masked hold made-up numbers, no known sentinel
    stages = student(CAT["Q"], CAT["K"], CAT["V"])
    masked = stages["masked"][0].copy()
    masked[0, 0, 1], masked[0, 0, 2], masked[0, 1, 2] = -5.0, -7.0, -6.0
    found = report(tmp_path, CAT, {"masked": masked})
    assert found["diagnoses"] == []
    assert found["hints"] == [
        "3 of 9 cells of your masked differ (only query 0, 1; key 1, 2); all of them at keys attn "
        "hides."
    ]
