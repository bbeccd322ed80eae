"""The page's derivations beyond scores, softmax and output, in headless Chromium: a RoPE pair's
cos and sin (worked out here from the fixture's base and positions), a logit cap's tanh, and the
backward pass's chain rule (dP = d_output · V)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from test_html_browser import (  # noqa: F401  (browser: a fixture)
    MISSING,
    Opened,
    as_factor,
    at,
    browser,
    in_formula,
    page_and_json,
)

pytestmark = [
    pytest.mark.skipif(MISSING is not None, reason=MISSING or ""),
    pytest.mark.slow,
    pytest.mark.subprocess,
]


def signed(x: float) -> str:
    """A number as a worked line writes it alone: −0.9900, 0.1411."""
    text = in_formula(x)
    return f"−{text}" if x < 0 and text.strip("0.") else text


def test_a_rope_cell_shows_each_pairs_cos_and_sin(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    path, trace = page_and_json(tmp_path, "llama_rope_gqa")
    rope = trace["config"]["rope"]
    assert rope["layout"] == "half"
    q = 3
    p = trace["config"]["positions"][q]
    opened = Opened(browser, path)
    text = opened.click("Q_rot", (1, q, 0))
    for i in range(rope["dims"] // 2):
        angle = p * rope["base"] ** (-2 * i / rope["dims"])
        assert f"cos = {signed(math.cos(angle))}, sin = {signed(math.sin(angle))}" in text, text
    q_row = at(trace["stages"]["Q"]["data"], (1, q))
    assert in_formula(q_row[0]) in text  # the pair's a and b, before rotation
    assert opened.errors() == []


def test_a_capped_cell_shows_the_tanh(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    path, trace = page_and_json(tmp_path, "gemma2_softcap")
    cap = trace["config"]["softcap"]
    stages = trace["stages"]
    opened = Opened(browser, path)
    text = opened.click("capped", (0, 4, 1))
    x = at(stages["scaled"]["data"], (0, 4, 1))
    capped = at(stages["capped"]["data"], (0, 4, 1))
    assert math.isclose(capped, cap * math.tanh(x / cap), rel_tol=1e-12)  # the formula shown
    assert "tanh" in text and in_formula(x) in text and in_formula(capped) in text, text
    assert in_formula(cap) in text
    assert opened.errors() == []


def test_a_gradient_cell_shows_its_chain_rule_terms(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    path, _ = page_and_json(tmp_path, "causal_multihead", "--backward")
    result = run_cli("trace", "causal_multihead", "--backward", "-f", "json")
    assert result.exit_code == 0, result.output
    stages = json.loads(result.stdout)["stages"]  # the backward trace, made apart from the page
    assert "d_softmax" in stages
    opened = Opened(browser, path)
    h, q, k = 1, 3, 2
    text = opened.click("d_softmax", (h, q, k))
    d_output = at(stages["d_output"]["data"], (h, q))
    v = at(stages["V"]["data"], (h, k))
    for a, b in zip(d_output, v, strict=True):
        assert f"{as_factor(a)}×{as_factor(b)}" in text, (a, b, text)
    dp = sum(a * b for a, b in zip(d_output, v, strict=True))
    assert math.isclose(dp, at(stages["d_softmax"]["data"], (h, q, k)), abs_tol=1e-12)
    assert in_formula(dp) in text
    opened.page.click("[data-role='lang']")
    assert "逐项相乘" in opened.derivation()
    assert opened.errors() == []


def test_cell_and_focus_open_the_page_on_that_cell(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """--cell Q,K opens with that softmax weight derived; --focus keeps one query's rows."""
    path, trace = page_and_json(tmp_path, "causal_multihead", "--cell", "2,1", "--focus", "2")
    opened = Opened(browser, path)
    text = opened.derivation()
    assert text.startswith("softmax[0, 2, 1]") and "Σ e^(x − m)" in text
    weight = at(trace["stages"]["softmax"]["data"], (0, 2, 1))
    assert in_formula(weight) in text
    opened.page.click("nav.stages button:text-is('scores')")
    rows = opened.page.eval_on_selector_all(
        "section.stage.current td[data-stage]",
        "tds => [...new Set(tds.map(t => t.dataset.index.split(',')[1]))]",
    )
    assert rows == ["2"]  # only the focused query's row, in every head
    opened.page.keyboard.press("Escape")
    opened.page.hover("section.stage.current td[data-index='1,2,0']")
    assert opened.derivation().startswith("scores[1, 2, 0]")  # unpinned: hovering derives again
    assert opened.errors() == []
