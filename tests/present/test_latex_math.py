"""LaTeX with real math: formulas in ``\\( \\)`` with ``^``, ``_``, ``\\cdot``, ``\\sqrt``,
``\\top``; heatmap maxima bold in math; one minus sign in tables and worked cells alike; token
text still literal. Expected strings are written by hand; pdflatex compiles the result where it
is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import FIXTURES, run_cli

from attn_cli.core.pipeline import run
from attn_cli.io.fixture import load_fixture
from attn_cli.present.export_text import to_latex
from attn_cli.present.latex_math import latex_mixed, latex_number
from attn_cli.present.options import RenderOptions
from attn_cli.present.worked import CellRef


@pytest.mark.parametrize(
    ("text", "latex"),
    [
        ("scores = Q·Kᵀ", r"\(\mathrm{scores} = Q\cdot K^{\top}\)"),
        ("1/√d_k", r"\(1/\sqrt{d_{k}}\)"),
        ("Q = X·W_Q + b_Q", r"\(Q = X\cdot W_{Q} + b_{Q}\)"),
        ("e^(x − m)", r"\(e^{x - m}\)"),
        ("x − m", r"\(x - m\)"),
        ("Since e^−∞ = 0, those", r"Since \(e^{-\infty} = 0\), those"),
        (
            "scores[i, j] = Σ_d Q[i, d] × K[j, d]",
            r"\(\mathrm{scores}[i, j] = \sum_{d} Q[i, d] \times K[j, d]\)",
        ),
        (
            "softmax = softmax(masked) over keys",
            r"\(\mathrm{softmax} = \mathrm{softmax}(\mathrm{masked})\) over keys",
        ),
        (
            "Q_norm = Q / √(mean(Q²) + eps)",
            r"\(Q_{\mathrm{norm}} = Q / \sqrt{\mathrm{mean}(Q^{2}) + \mathrm{eps}}\)",
        ),
        ("m_i = max_k scaled[i, k]", r"\(m_{i} = \max_{k} \mathrm{scaled}[i, k]\)"),
        ("eps = 1e−06", r"\(\mathrm{eps} = 1\mathrm{e}{-06}\)"),
        (
            "concat = [head 0 | head 1 | …]",
            r"\(\mathrm{concat} = [\mathrm{head}\ 0 | \mathrm{head}\ 1 | \dots ]\)",
        ),
        # prose stays text, escaped; a hyphenated word is no minus sign
        ("X (the input embeddings)", "X (the input embeddings)"),
        ("scaled dot-product attention", "scaled dot-{}product attention"),
        ("(j ≤ i), never", r"\((j \leq i)\), never"),
        # Chinese around a formula
        ("用 d_model 个数字", r"用 \(d_{\mathrm{model}}\) 个数字"),
    ],
)
def test_formulas_become_math(text: str, latex: str) -> None:
    assert latex_mixed(text) == latex


def test_minus_signs_are_math_minus() -> None:
    assert latex_mixed("−0.5") == r"\(-0.5\)"
    assert latex_mixed("-0.5") == r"\(-0.5\)"  # ASCII hyphen-minus from a number: the same
    assert latex_number("−∞") == r"-\infty"


def test_literals_print_as_typed_even_inside_a_formula() -> None:
    line = "scores[x_1, 50% $x] = Q[x_1]·K[50% $x] = -1×0.5 = -0.5"
    assert latex_mixed(line, ["x_1", "50% $x"]) == (
        r"\(\mathrm{scores}[\text{x\_1}, \text{50\% \$x}] = Q[\text{x\_1}]\cdot "
        r"K[\text{50\% \$x}] = -1\times 0.5 = -0.5\)"
    )
    # a literal that is a word of prose stays where it is
    assert latex_mixed("the row of a: m = 2", ["a"]) == r"the row of a: \(m = 2\)"


def test_shapes_set_only_subscripts_as_math() -> None:
    assert latex_mixed("Q [head=1, d_k=2]", formulas=False) == r"Q {[}head=1, \(d_{k}\)=2{]}"


# ---------------------------------------------------------------------------------------------
# The document


def cat_sat_latex(**options: object) -> str:
    trace = run(load_fixture(FIXTURES / "the_cat_sat.yaml"))
    return to_latex(trace, RenderOptions(**options))  # type: ignore[arg-type]


def test_stage_formulas_are_math() -> None:
    text = cat_sat_latex(explain=True)
    assert r"\noindent \(\mathrm{scores} = Q\cdot K^{\top}\)\quad" in text
    assert r"\(\mathrm{scaled} = \mathrm{scores} \times 1/\sqrt{d_{k}}" in text
    assert r"\textasciicircum" not in text  # no visible ^ anywhere
    ours = re.sub(r"\\item\[(about|source)\].*", "", text)  # input text stays as typed
    assert r"\item[about] Source article\textquotesingle{}s example 1: its X and W\_Q" in text
    assert not re.search(r"[A-Za-z]\\_[A-Za-z]", ours)  # nor d\_k: subscripts are math


def test_heatmap_maxima_are_bold_in_math() -> None:
    text = cat_sat_latex(heatmap=True)
    # softmax[The, cat] = 0.9411 is the row maximum (worked in test_explain.py)
    assert r"The & $0.0033$ & $\mathbf{0.9411}$ & $0.0556$ & $1.0000$ \\" in text
    assert r"\textbf{$" not in text  # \textbf does not bold math digits


def test_worked_cells_use_the_minus_of_the_tables() -> None:
    text = cat_sat_latex(cell=CellRef(0, 1))
    # x − m of key The: 0 − 5.6569; the table of the worked softmax row
    assert r"The & \(0\) & \(-5.6569\) & \(0.0035\) & \(0.0033\) \\" in text
    assert r"\(x - m\) & \(e^{x - m}\)" in text
    assert not re.search(r"-\{\}\d", text)  # no text-mode hyphen before a number anywhere
    assert r"\(\mathrm{scores}[\text{The}, \text{cat}] = Q[\text{The}]\cdot K[\text{cat}]" in text


def pdflatex(tmp_path: Path, tex: str) -> None:
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed (apt-get install texlive-latex-base)")
    (tmp_path / "doc.tex").write_text(tex, encoding="utf-8")
    done = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "-no-shell-escape", "doc.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:]


@pytest.mark.subprocess
@pytest.mark.parametrize("name", ["the_cat_sat", "causal_multihead", "padding_batch"])
def test_every_export_option_compiles(tmp_path: Path, name: str) -> None:
    target = tmp_path / "out.tex"
    args = ["--explain", "--heatmap", "--cell", "0,1", "--full", "--lang", "en"]
    result = run_cli("trace", name, "--format", "latex", *args, "-o", str(target))
    assert result.exit_code == 0, result.output
    pdflatex(tmp_path, target.read_text(encoding="utf-8"))


@pytest.mark.subprocess
def test_math_looking_tokens_compile_and_stay_literal(tmp_path: Path) -> None:
    tokens = ["x_1", "a^2", "-1", "√2", "$\\alpha$"]
    fixture = {
        "tokens": tokens,
        "Q": [[float(i == j) for j in range(2)] for i in range(5)],
        "K": [[float(i % 2), -1.0] for i in range(5)],
        "V": [[float(i), 1.0] for i in range(5)],
    }
    path = tmp_path / "m.json"
    path.write_text(json.dumps(fixture), encoding="utf-8")
    target = tmp_path / "out.tex"
    args = ["--format", "latex", "--explain", "--cell", "0,1", "--lang", "en", "-o", str(target)]
    result = run_cli("trace", str(path), *args)
    assert result.exit_code == 0, result.output
    tex = target.read_text(encoding="utf-8")
    assert r"\text{x\_1}" in tex and r"\text{a\textasciicircum{}2}" in tex
    pdflatex(tmp_path, tex)
