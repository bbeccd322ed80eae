"""Exports for posts, notes and slides: Markdown, LaTeX, HTML, SVG.

Each is checked for structure (tables parse, HTML and SVG are well-formed, LaTeX compiles where
pdflatex is installed) and fed hostile token text that must come out literally.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import run_cli

from attn_cli.present.export_text import latex_escape, md_escape

HOSTILE = ["[bold red]x[/]", "a|b`c`", "<b>&amp;</b>", "50% $x_1$ \\ {y} #~^_", "é\x1b[31mred"]
# What each token must read as, wherever it is shown (the ESC is shown escaped, never sent).
LITERAL = ["[bold red]x[/]", "a|b`c`", "<b>&amp;</b>", "50% $x_1$ \\ {y} #~^_", "é\\x1b[31mred"]


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    n = len(HOSTILE)
    fixture = {
        "name": "<script>alert(1)</script> [bold]& | $",
        "tokens": HOSTILE,
        "Q": [[float(i == j) for j in range(2)] for i in range(n)],
        "K": [[float(i % 2), 1.0] for i in range(n)],
        "V": [[float(i), 1.0] for i in range(n)],
        "causal": True,
    }
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(fixture), encoding="utf-8")
    return path


def export(tmp_path: Path, *args: str, suffix: str) -> str:
    target = tmp_path / f"out.{suffix}"
    result = run_cli("trace", *args, "-o", str(target))
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    return target.read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Markdown


def md_cells(line: str) -> list[str]:
    """The cells of a GitHub table row: split at pipes that are not backslash-escaped."""
    assert line.startswith("|") and line.endswith("|"), line
    return [c.strip() for c in re.split(r"(?<!\\)\|", line[1:-1])]


def md_tables(text: str) -> list[list[list[str]]]:
    tables, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(md_cells(line))
        elif current:
            tables.append(current)
            current = []
    return [*tables, current] if current else tables


def test_markdown_is_github_tables(tmp_path: Path) -> None:
    text = export(tmp_path, "--format", "markdown", "--lang", "en", suffix="md")
    assert text.startswith("# The cat sat\n")
    tables = md_tables(text)
    assert len(tables) == 8  # one per stage
    for table in tables:
        assert all(re.fullmatch(r"-{3}|-+:", c) for c in table[1]), table[1]
        assert len({len(row) for row in table}) == 1, table
    scores = tables[4]
    assert scores[0] == ["query", "The", "cat", "sat"]
    assert scores[2:] == [
        ["The", "0.0000", "8.0000", "4.0000"],
        ["cat", "4.0000", "8.0000", "8.0000"],
        ["sat", "2.0000", "12.0000", "8.0000"],
    ]
    assert "## scores" in text and "`scores = Q·Kᵀ`" in text


def test_markdown_with_explain_cell_and_heatmap(tmp_path: Path) -> None:
    text = export(
        tmp_path,
        "--format",
        "markdown",
        "--explain",
        "--lang",
        "zh",
        "--cell",
        "The,cat",
        "--heatmap",
        suffix="md",
    )
    assert text.count("**这一步在做什么**") == 8
    assert "scores\\[The, cat\\] = Q\\[The\\]·K\\[cat\\] = 2×4 + 0×2 = 8 + 0 = 8" in text
    assert "| The | 0.0033 | **0.9411** | 0.0556 | 1.0000 |" in text  # max in bold, row sum


def test_markdown_escapes_hostile_tokens(tmp_path: Path, hostile: Path) -> None:
    text = export(tmp_path, str(hostile), "--format", "markdown", "--heatmap", suffix="md")
    assert "\x1b" not in text
    assert "<b>" not in text and "<script>" not in text
    for table in md_tables(text):
        assert len({len(row) for row in table}) == 1, table  # a pipe in a token splits nothing
    scores = next(t for t in md_tables(text) if t[0][0] == "query" and len(t[0]) == 6)
    unescaped = [re.sub(r"\\(.)", r"\1", c) for c in scores[0][1:]]
    assert unescaped == LITERAL
    assert md_escape("[bold red]x[/]") == "\\[bold red\\]x\\[/\\]"


# ---------------------------------------------------------------------------------------------
# LaTeX


def pdflatex(tmp_path: Path, tex: str) -> None:
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed (apt-get install texlive-latex-base)")
    source = tmp_path / "doc.tex"
    source.write_text(tex, encoding="utf-8")
    run = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "-no-shell-escape", "doc.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert (tmp_path / "doc.pdf").stat().st_size > 1000


def tex_file_exists(name: str) -> bool:
    kpsewhich = shutil.which("kpsewhich")
    if kpsewhich is None:
        return False
    found = subprocess.run([kpsewhich, name], capture_output=True, text=True, check=False)
    return bool(found.stdout.strip())


def test_latex_escape_specials() -> None:
    assert latex_escape("50% $x_1$ & #~^") == (
        r"50\% \$x\_1\$ \& \#\textasciitilde{}\textasciicircum{}"
    )
    assert latex_escape("a\\b{c}") == r"a\textbackslash{}b\{c\}"
    assert latex_escape("[bold red]x[/]") == "{[}bold red{]}x{[}/{]}"
    assert latex_escape("😀") == r"\texttt{U+1F600}"


def test_latex_document_structure(tmp_path: Path) -> None:
    text = export(
        tmp_path,
        "--format",
        "latex",
        "--explain",
        "--cell",
        "The,cat",
        "--heatmap",
        "--lang",
        "en",
        suffix="tex",
    )
    assert text.startswith("% Generated by attn")
    assert r"\begin{document}" in text and text.rstrip().endswith(r"\end{document}")
    assert text.count(r"\begin{tabular}") == text.count(r"\end{tabular}") == 8 + 1
    assert r"The & $0.0000$ & $8.0000$ & $4.0000$ \\" in text
    assert r"$\mathbf{0.9411}$" in text  # the row maximum, bold in math mode
    assert "CJK" not in text


@pytest.mark.subprocess
def test_latex_compiles_with_pdflatex(tmp_path: Path) -> None:
    text = export(
        tmp_path,
        "causal_multihead",
        "--format",
        "latex",
        "--explain",
        "--cell",
        "like,green",
        "--heatmap",
        "--lang",
        "en",
        suffix="tex",
    )
    pdflatex(tmp_path, text)


@pytest.mark.subprocess
def test_latex_with_hostile_tokens_compiles(tmp_path: Path, hostile: Path) -> None:
    text = export(
        tmp_path,
        str(hostile),
        "--format",
        "latex",
        "--explain",
        "--heatmap",
        "--cell",
        "0,1",
        "--lang",
        "en",
        suffix="tex",
    )
    assert "\x1b" not in text
    assert r"{[}bold red{]}x{[}/{]}" in text and r"a\textbar{}b\textasciigrave{}c" in text
    pdflatex(tmp_path, text)


@pytest.mark.subprocess
def test_latex_in_chinese_uses_the_cjk_package(tmp_path: Path) -> None:
    text = export(tmp_path, "--format", "latex", "--explain", "--lang", "zh", suffix="tex")
    assert r"\usepackage{CJKutf8}" in text and r"\begin{CJK}{UTF8}{gbsn}" in text
    assert "这一步在做什么" in text
    for needed, package in (
        ("CJKutf8.sty", "texlive-lang-cjk"),
        ("c70gbsn.fd", "latex-cjk-chinese-arphic-gbsn00lp"),  # the font
    ):
        if not tex_file_exists(needed):
            pytest.skip(f"LaTeX in Chinese needs {needed} (apt-get install {package})")
    pdflatex(tmp_path, text)


# ---------------------------------------------------------------------------------------------
# HTML and SVG


class StrictHTML(HTMLParser):
    """Tags must nest and close; collects the tags and the text."""

    VOID = frozenset({"meta", "br", "hr", "img", "link", "input"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-3:])
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse_html(text: str) -> StrictHTML:
    assert text.lstrip().lower().startswith("<!doctype html>")
    parser = StrictHTML()
    parser.feed(text)
    parser.close()
    assert parser.stack == [], parser.stack
    return parser


PAGE_TAGS = {
    "html",
    "head",
    "title",
    "meta",
    "style",
    "body",
    "script",
    "header",
    "h1",
    "h2",
    "h3",
    "div",
    "button",
    "label",
    "select",
    "option",
    "nav",
    "main",
    "details",
    "summary",
    "dl",
    "dt",
    "dd",
    "section",
    "p",
    "span",
    "b",
    "br",
    "table",
    "caption",
    "tr",
    "th",
    "td",
    "aside",
}


def test_html_is_well_formed_self_contained_and_coloured(tmp_path: Path) -> None:
    """``-f html`` is the interactive page (present/html_page.py; tests/present/test_html_browser.py
    drives it in Chromium): balanced, nothing fetched, the heatmap's colours inline."""
    text = export(tmp_path, "--format", "html", "--explain", "--lang", "en", suffix="html")
    parser = parse_html(text)
    assert parser.tags <= PAGE_TAGS, parser.tags - PAGE_TAGS
    assert "http://" not in text and "https://" not in text and " src=" not in text
    assert "default-src 'none'" in text  # the page may load nothing, whatever it holds
    body = "".join(parser.text)
    assert "what this step does" in body and "The cat sat" in body
    assert "#fde725" in text.lower()  # the top of the viridis scale (scores[sat, cat] = 12)


def test_html_escapes_hostile_tokens(tmp_path: Path, hostile: Path) -> None:
    text = export(tmp_path, str(hostile), "--format", "html", "--explain", suffix="html")
    parser = parse_html(text)
    assert text.count("<script") == 2  # the data and the page's own script, nothing else
    assert "<b>&amp;</b>" not in text  # never markup
    body = "".join(parser.text)
    for token in LITERAL:
        assert token in body, token
    assert "<script>alert(1)</script> [bold]& | $" in body  # the name, literally
    assert "\x1b" not in text


def svg_text(text: str) -> str:
    root = ET.fromstring(text)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return "".join(root.itertext()).replace("\u00a0", " ")


def test_svg_is_well_formed_self_contained_and_coloured(tmp_path: Path) -> None:
    text = export(tmp_path, "--format", "svg", "--explain", "--lang", "en", suffix="svg")
    content = svg_text(text)
    assert "what this step does" in content and "softmax" in content
    no_comments = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    assert re.findall(r"https?://[^\s\"')]+", no_comments) == ["http://www.w3.org/2000/svg"]
    assert "url(" not in no_comments.replace("url(#", "")  # only references inside the file
    assert "#fde725" in text.lower() and "#440154" in text.lower()  # viridis shading


def test_svg_escapes_hostile_tokens(tmp_path: Path, hostile: Path) -> None:
    text = export(tmp_path, str(hostile), "--format", "svg", "--heatmap", suffix="svg")
    content = svg_text(text)
    for token in LITERAL:
        assert token in content, token
    assert "\x1b" not in text


@pytest.mark.parametrize("fmt", ["plain", "table", "json"])
def test_other_formats_print_hostile_tokens_literally(hostile: Path, fmt: str) -> None:
    colour = "--color" if fmt == "table" else "--no-color"
    args = ["trace", str(hostile), "--format", fmt, "--explain", "--cell", "0,1", colour]
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    out = result.stdout
    if fmt == "json":
        assert json.loads(out)["tokens"] == HOSTILE
        return
    for token in LITERAL:
        assert token in re.sub(r"\x1b\[[0-9;]*m", "", out), token
    assert "\x1b[31m" not in out  # the token's own escape never reaches the terminal


def test_step_refuses_export_formats() -> None:
    result = run_cli("trace", "--step", "--format", "svg")
    assert result.exit_code == 2
    assert "Error: --step: works only in the terminal" in result.stderr
