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


def projection_fixture(path: Path) -> dict[str, Any]:
    """3 tokens, d_model 3, 2 heads of d_k = d_v = 2, every bias, W_O and b_O: small numbers
    whose products a reader can check."""
    fixture = {
        "name": "projections with biases",
        "tokens": ["a", "b", "c"],
        "X": [[1.0, -2.0, 0.5], [0.25, 1.5, -1.0], [2.0, 0.0, -0.5]],
        "W_Q": [[0.5, -1.0, 0.25, 2.0], [1.0, 0.5, -0.5, 0.0], [-1.5, 0.75, 1.0, 0.5]],
        "W_K": [[1.0, 0.0, -0.5, 0.5], [0.25, -1.0, 1.0, 0.75], [0.5, 0.5, 0.0, -1.0]],
        "W_V": [[0.0, 1.0, 0.5, -0.5], [2.0, -0.25, 0.0, 1.0], [1.0, 0.5, -1.0, 0.25]],
        "b_Q": [0.1, -0.2, 0.3, -0.4],
        "b_K": [0.5, 0.0, -0.5, 0.25],
        "b_V": [-0.1, 0.2, 0.0, 0.3],
        "heads": 2,
        "W_O": [[1.0, -0.5, 0.0], [0.5, 0.25, -1.0], [0.0, 1.0, 0.5], [-0.5, 0.0, 2.0]],
        "b_O": [0.5, -0.25, 1.0],
        "causal": True,
    }
    path.write_text(json.dumps(fixture), encoding="utf-8")
    return fixture


def test_q_k_v_concat_and_projected_cells_show_their_terms(  # issue 26
    browser: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    fixture = projection_fixture(tmp_path / "proj.json")
    page = tmp_path / "proj.html"
    result = run_cli("trace", str(tmp_path / "proj.json"), "-f", "html", "-o", str(page), "-q")
    assert result.exit_code == 0, result.output
    result = run_cli("trace", str(tmp_path / "proj.json"), "-f", "json")
    stages = json.loads(result.stdout)["stages"]
    opened = Opened(browser, page)
    X = fixture["X"]
    for name in ("Q", "K", "V"):  # head 1, token c, column 1: W's column 1·2 + 1 = 3
        W, b = fixture[f"W_{name}"], fixture[f"b_{name}"]
        text = opened.click(name, (1, 2, 1))
        value = math.fsum([*(X[2][i] * W[i][3] for i in range(3)), b[3]])  # the loop here
        assert math.isclose(value, at(stages[name]["data"], (1, 2, 1)), abs_tol=1e-12)
        assert f"{name}[c, 1] = X[c]·W_{name}[:, 3] + b_{name}[3] = " in text, text
        terms = " + ".join(f"{as_factor(X[2][i])}×{as_factor(W[i][3])}" for i in range(3))
        assert f"{terms} + {as_factor(b[3])} = " in text, text
        assert text.rstrip().endswith(f"= {signed(value)}"), text
    text = opened.click("concat", (2, 3))  # column 3 = head 1's column 1
    output = at(stages["output"]["data"], (1, 2, 1))
    assert at(stages["concat"]["data"], (2, 3)) == output
    assert f"concat[c, 3] = output[head 1, c, 1] = {signed(output)}" in text, text
    assert "3 = 1 × 2 + 1" in text
    text = opened.click("projected", (2, 2))
    concat, W_O = at(stages["concat"]["data"], (2,)), fixture["W_O"]
    value = math.fsum([*(concat[j] * W_O[j][2] for j in range(4)), fixture["b_O"][2]])
    assert math.isclose(value, at(stages["projected"]["data"], (2, 2)), abs_tol=1e-12)
    terms = " + ".join(f"{as_factor(concat[j])}×{as_factor(W_O[j][2])}" for j in range(4))
    assert f"projected[c, 2] = concat[c]·W_O[:, 2] + b_O[2] = {terms} + 1 = " in text, text
    assert text.rstrip().endswith(f"= {signed(value)}"), text
    opened.page.click("[data-role='lang']")
    zh = opened.derivation()
    assert "逐项相乘再相加，再加上偏置" in zh and "的来历" in zh and "where" not in zh
    assert opened.errors() == []


def test_cross_attention_keys_are_derived_from_x_kv(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """K reads the encoder's X_kv (the fixture's own numbers, read here from its YAML)."""
    import yaml

    from attn_cli.io.examples import example_paths

    fixture = yaml.safe_load(Path(example_paths()["cross_attention"]).read_text())
    path, trace = page_and_json(tmp_path, "cross_attention")
    opened = Opened(browser, path)
    text = opened.click("K", (1, 4, 0))  # kv head 1, key ".", column 0: W_K's column 4
    X_kv, W_K = fixture["X_kv"], fixture["W_K"]
    terms = " + ".join(f"{as_factor(X_kv[4][i])}×{as_factor(W_K[i][4])}" for i in range(6))
    assert f"K[., 0] = X_kv[.]·W_K[:, 4] = {terms} = " in text, text
    value = math.fsum(X_kv[4][i] * W_K[i][4] for i in range(6))
    assert math.isclose(value, at(trace["stages"]["K"]["data"], (1, 4, 0)), abs_tol=1e-12)
    assert opened.errors() == []
