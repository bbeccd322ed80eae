"""A ``Trace`` in a notebook: docs/notebook.ipynb executed top to bottom (nbclient, a real
ipykernel), and its pages, two in one document, driven in headless Chromium."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest
from test_html_browser import MISSING, at, browser, shown  # noqa: F401  (browser: a fixture)

import attn_cli
from attn_cli.io.trace_json import dumps

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "notebook.ipynb"
pytestmark = [pytest.mark.slow, pytest.mark.subprocess]


def test_repr_html_is_the_page_in_a_frame_of_its_own() -> None:
    trace = attn_cli.trace_file("the_cat_sat")  # the package's door registers the page
    view = trace._repr_html_()
    assert view is not None
    assert view.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts"' in view
    page = html.unescape(re.search(r'srcdoc="([^"]*)"', view).group(1))  # type: ignore[union-attr]
    assert page.startswith("<!DOCTYPE html>") and 'data-role="derivation"' in page
    assert 'data-stage="softmax" data-index="0,2,1"' in page


def executed() -> Any:
    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError:
        pytest.skip("nbclient, nbformat and ipykernel are not installed (pip install '.[test]')")
    nb = nbformat.read(NOTEBOOK, as_version=4)  # type: ignore[no-untyped-call]
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    return nb


def test_the_example_notebook_runs_top_to_bottom(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    if MISSING is not None:
        pytest.skip(MISSING)
    nb = executed()
    views = [
        out["data"]["text/html"]
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if "text/html" in out.get("data", {})
    ]
    assert len(views) == 5 and all(v.startswith("<iframe srcdoc=") for v in views)
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert errors == []
    # The first two pages in one document, as a notebook shows them: each works on its own.
    page = browser.new_page()
    dialogs: list[str] = []
    console: list[str] = []

    def dialog(d: Any) -> None:
        dialogs.append(d.message)
        d.dismiss()

    page.on("dialog", dialog)
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    page.set_content("<!DOCTYPE html><html><body>" + views[0] + views[1] + "</body></html>")
    frames = [f for f in page.frames if f != page.main_frame]
    assert len(frames) == 2
    for frame, name in zip(frames, ("the_cat_sat", "causal_multihead"), strict=True):
        frame.wait_for_selector("body[data-ready='1']")
        trace = json.loads(dumps(attn_cli.trace_file(name)))
        cells = frame.eval_on_selector_all(
            "td[data-stage]",
            "tds => tds.map(td => [td.dataset.stage, td.dataset.index, td.firstChild.textContent])",
        )
        assert len(cells) == sum(len(list(_indices(s["shape"]))) for s in trace["stages"].values())
        for stage, index, text in cells:
            place = tuple(int(i) for i in index.split(","))
            assert text == shown(at(trace["stages"][stage]["data"], place)), (stage, index)
        frame.click("nav.stages button:text-is('softmax')")
        frame.click("td[data-stage='softmax']")
        assert "Σ e^(x − m)" in frame.inner_text("[data-role='derivation']")
        frame.click("[data-role='lang']")
        assert "单元格演算" in frame.inner_text("[data-role='derivation']")
    # keys go to the frame in focus only: the other page stays where it was
    frames[0].click("nav.stages button:text-is('X')")
    page.keyboard.press("ArrowRight")
    assert frames[0].text_content("[data-role='stage-title']") == "Q"
    assert frames[1].text_content("[data-role='stage-title']") == "softmax"
    assert dialogs == [] and console == []
    page.close()
    steps_in_frames(browser, views[3], views[4])


def steps_in_frames(browser: Any, decode: str, flash: str) -> None:  # noqa: F811
    """The decode and flash cells' pages (html_steps.py), in frames: a step and a tile derive."""
    page = browser.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    page.set_content("<!DOCTYPE html><html><body>" + decode + flash + "</body></html>")
    frames = [f for f in page.frames if f != page.main_frame]
    assert len(frames) == 2
    for frame in frames:
        frame.wait_for_selector("body[data-ready='1']")
    decode_frame, flash_frame = frames
    decode_frame.click("nav.stages button[data-go='1']")
    assert decode_frame.text_content("[data-role='stage-title']").startswith("1: ")
    decode_frame.click("section.stage.current td[data-stage='softmax']")
    assert "Σ e^(x − m)" in decode_frame.inner_text("[data-role='derivation']")
    flash_frame.click("nav.stages button[data-go='1']")
    flash_frame.click("section.stage.current td[data-stage='alpha']")
    assert "α = exp(m_old − m)" in flash_frame.inner_text("[data-role='derivation']")
    assert console == []
    page.close()


def _indices(shape: list[int]) -> Any:
    import numpy as np

    return np.ndindex(*shape)
