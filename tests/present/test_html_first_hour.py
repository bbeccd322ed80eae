"""Issue 40, "The first hour", the pages' side, in headless Chromium (test_html_browser.py's
harness): a phone opens every page at its top and shows a tapped number's derivation on the
screen; the pages follow the system's light or dark setting; 中文 mode leaves no English word
but math names, token text and numbers; an empty cache slot shows — where the decode JSON says
the slot is empty; the hovered cell is told apart from the pinned one; a projector's larger type.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from test_html_browser import MISSING, browser  # noqa: F401  (browser: a fixture)

pytestmark = [
    pytest.mark.skipif(MISSING is not None, reason=MISSING or ""),
    pytest.mark.slow,
    pytest.mark.subprocess,
]
PHONE = {"width": 390, "height": 844}


def made(tmp_path: Path, *args: str) -> Path:
    """``attn ARGS -f html`` written to a file."""
    path = tmp_path / f"{'-'.join(a.replace('/', '_') for a in args[:2])}.html"
    result = run_cli(*args, "-f", "html", "-o", str(path), "-q")
    assert result.exit_code == 0, result.stderr
    return path


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:  # noqa: F811
    """A factory of browser contexts (a phone, a colour scheme), each closed after the test."""
    opened: list[Any] = []

    def make(**kwargs: Any) -> Any:
        ctx = browser.new_context(**kwargs)
        opened.append(ctx)
        return ctx

    yield make
    for ctx in opened:
        ctx.close()


def open_page(ctx: Any, path: Path, hash_: str = "") -> Any:
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(path.resolve().as_uri() + hash_)
    page.wait_for_selector("body[data-ready='1']", timeout=10_000)
    page.wait_for_load_state("load")
    page.wait_for_timeout(50)  # the browser's scroll to a fragment, had it been left to it
    page.errors = errors
    return page


PAGES = [
    ("trace", "causal_multihead"),
    ("decode", "causal_multihead"),
    ("decode", "gemma2_softcap"),  # a ring buffer with empty slots
    ("decode", "gated_deltanet"),  # the state page
    ("flash", "causal_multihead"),
]


@pytest.mark.parametrize(("command", "name"), PAGES)
@pytest.mark.parametrize("hash_", ["", "#stage-2"])
def test_a_phone_opens_every_page_at_its_top(
    context: Any, tmp_path: Path, command: str, name: str, hash_: str
) -> None:
    """They opened scrolled down (decode 258 px, flash 396 px), the title off screen."""
    path = made(tmp_path, command, name)
    page = open_page(context(viewport=PHONE, is_mobile=True, has_touch=True), path, hash_)
    assert page.evaluate("window.scrollY") == 0
    top = page.evaluate("document.querySelector('header.top h1').getBoundingClientRect().top")
    assert 0 <= top < 100
    stage = page.eval_on_selector_all("section.stage", "ss => ss.map(s => s.dataset.stageName)")
    shown = 2 if hash_ else 0  # the hash still opens its section
    assert page.get_attribute("[data-role='stage-title']", "data-stage") == stage[shown]
    assert page.evaluate("location.hash") == hash_  # written back once the page has loaded
    assert page.errors == []


@pytest.mark.parametrize(("command", "name"), PAGES)
def test_a_tapped_numbers_derivation_is_on_the_phones_screen(
    context: Any, tmp_path: Path, command: str, name: str
) -> None:
    """It landed below the screen (y = 1194 on an 844 px one)."""
    path = made(tmp_path, command, name)
    page = open_page(context(viewport=PHONE, is_mobile=True, has_touch=True), path)
    sections = page.eval_on_selector_all("section.stage", "ss => ss.length")
    page.tap(f"nav.stages button[data-go='{min(2, sections - 1)}']")
    cells = page.query_selector_all("section.stage.current td[data-stage]")
    assert cells
    cell = cells[-1]  # the last: the lowest on the page
    expected = f"{cell.get_attribute('data-stage')}[{cell.get_attribute('data-index')}"
    cell.tap()
    box = page.locator("[data-role='derivation']").bounding_box()
    assert box is not None
    assert box["y"] >= 0 and box["y"] + box["height"] <= PHONE["height"] + 1, box
    assert box["height"] >= 100
    heading = page.inner_text("[data-role='derivation'] h2")
    assert expected.replace(",", ", ") in heading
    # the table is not hidden behind the panel: the tapped cell is above it, or can scroll there
    padding = page.evaluate(
        "parseFloat(getComputedStyle(document.querySelector('main')).paddingBottom)"
    )
    assert padding >= box["height"] - 1
    cell.tap()  # a second tap lets go: the panel returns to its place under the tables
    assert page.get_attribute("body", "data-pinned") == "0"
    assert page.errors == []


DARK, LIGHT = "rgb(22, 22, 29)", "rgb(255, 255, 255)"
BACKGROUND = "getComputedStyle(document.body).backgroundColor"


@pytest.mark.parametrize("command", ["trace", "decode", "flash"])
@pytest.mark.parametrize(
    ("scheme", "colour", "other"), [("dark", DARK, LIGHT), ("light", LIGHT, DARK)]
)
def test_pages_follow_the_systems_colour_scheme_and_the_toggle_still_works(
    context: Any, tmp_path: Path, command: str, scheme: str, colour: str, other: str
) -> None:
    path = made(tmp_path, command, "causal_multihead")
    page = open_page(context(color_scheme=scheme), path)
    assert page.get_attribute("body", "data-theme") == "auto"
    assert page.evaluate(BACKGROUND) == colour
    page.click("[data-role='theme']")  # the other one, whatever the system's
    assert page.evaluate(BACKGROUND) == other
    page.click("[data-role='theme']")
    assert page.evaluate(BACKGROUND) == colour


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_a_theme_asked_for_holds_against_the_system(
    context: Any, tmp_path: Path, theme: str
) -> None:
    path = tmp_path / "page.html"
    result = run_cli(
        "trace", "causal_multihead", "-f", "html", "-o", str(path), "-q", "--theme", theme
    )
    assert result.exit_code == 0, result.stderr
    for scheme in ("light", "dark"):
        page = open_page(context(color_scheme=scheme), path)
        assert page.evaluate(BACKGROUND) == (LIGHT if theme == "light" else DARK)


# -- 中文 ------------------------------------------------------------------------------------
# Names that stay as they are in Chinese text: math and code names, commands, products. A word
# with "_" or a digit is an identifier (W_Q, d_k, float64); one of the page's stage names, its
# tokens and its fixture's name are data.
NAMES = {
    "attn",
    "trace",
    "decode",
    "flash",
    "json",
    "full",
    "English",  # commands, the switch
    "inf",
    "nan",  # numbers: -inf
    "softmax",
    "exp",
    "log",
    "max",
    "mod",
    "lse",
    "sum",
    "acc",
    "norm",
    "mean",
    "eps",
    "beta",
    "SiLU",
    "conv",
    "delta",
    "update",
    "scale",
    "offset",
    "bias",
    "mask",
    "sink",
    "rowmax",
    "rowsum",
    "ulp",
    "float",
    "bf",
    "torch",
    "SDPA",
    "Triton",
    "FlashAttention",
    "gpt-oss",
    "log-sum-exp",
    "heads",
    "state",
    "logit",
    "window",
    "pos",
    "dims",
    "angle",
    "base",
    "cos",
    "sin",
    "half",
    "interleaved",
    "RoPE",
    "HF",
    "Mistral",
    "Gemma",
    "Qwen",
    "Next",
    "Gated",
    "DeltaNet",
    "yarn",
    "linear",
    "dynamic",
    "longrope",
    "llama",  # rope layouts, models
}


def latin_words(text: str) -> set[str]:
    """The Latin words of ``text``, but a command-line option (--base2): a name, as code."""
    text = re.sub(r"--[A-Za-z][\w-]*", " ", text)
    return set(re.findall(r"[A-Za-z][A-Za-z_\-]*[A-Za-z]|[A-Za-z]", text))


def fixture_words(name: str) -> set[str]:
    """The fixture's tokens and stage names, from its JSON trace (not from the page)."""
    result = run_cli("trace", name, "-f", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    words = latin_words(" ".join(doc["stages"]))
    for token in [*doc["tokens"], *(doc.get("key_tokens") or [])]:
        words |= latin_words(str(token))
    return words


def allowed(word: str, data_words: set[str]) -> bool:
    return (
        len(word) == 1
        or word in NAMES
        or word in data_words
        or "_" in word
        or word.isupper()  # Q, K, V, MHA, GQA
    )


def data_words_of(page: Any) -> set[str]:
    """The page's data: stage names, cell stage names, tokens, its title (the fixture's name)."""
    words: set[str] = set()
    for text in page.eval_on_selector_all(
        "section.stage, td[data-stage], nav.stages button",
        "es => es.map(e => (e.dataset.stageName || '') + ' ' + (e.dataset.stage || ''))",
    ):
        words |= latin_words(text)
    words |= latin_words(page.inner_text("header.top h1"))
    data = json.loads(page.text_content("#attn-data"))
    for key in ("tokens", "query_labels", "key_labels"):
        for source in (data, data.get("trace", {})):
            for token in source.get(key, []) if isinstance(source, dict) else []:
                words |= latin_words(str(token))
    stages = data.get("trace", {}).get("stages", {})
    words |= latin_words(" ".join(stages))
    return words


def english_left(page: Any, name: str) -> dict[str, str]:
    """Switched to 中文, every section visited and its first and last number clicked: each
    English word left in the visible text, with the line it is on."""
    page.click("[data-role='lang']")
    assert page.get_attribute("html", "lang") == "zh-Hans"
    known = data_words_of(page) | fixture_words(name)
    left: dict[str, str] = {}
    n = page.eval_on_selector_all("nav.stages button", "bs => bs.length")
    for k in range(max(n, 1)):
        if n:
            page.click(f"nav.stages button[data-go='{k}']")
        cells = page.query_selector_all("section.stage.current td[data-stage]")
        for cell in [None, *cells[:1], *cells[-1:]]:
            if cell is not None:
                cell.click()
            for line in page.inner_text("body").splitlines():
                for word in latin_words(line) - known:
                    if not allowed(word, known):
                        left.setdefault(word, line.strip()[:120])
    return left


@pytest.mark.parametrize(
    ("command", "name"), [*PAGES, ("trace", "gptoss_sinks"), ("flash", "gemma2_softcap")]
)
def test_chinese_mode_leaves_no_english_words(
    context: Any, tmp_path: Path, command: str, name: str
) -> None:
    path = made(tmp_path, command, name)
    page = open_page(context(viewport={"width": 1280, "height": 800}), path)
    assert english_left(page, name) == {}
    title = page.inner_text("[data-role='stage-title']")
    assert latin_words(title) <= data_words_of(page) | NAMES  # "overview" was English
    assert page.errors == []


def test_chinese_mode_of_the_model_view_and_its_layer_page(context: Any, tmp_path: Path) -> None:
    checkpoint = Path(__file__).parent.parent / "reference" / "forward" / "llama"
    path = tmp_path / "view.html"
    result = run_cli(
        "import",
        str(checkpoint),
        "--text",
        "The cat sat",
        "--layer",
        "all",
        "-f",
        "html",
        "-o",
        str(path),
    )
    if result.exit_code == 2 and "models" in result.stderr:
        pytest.skip("attn import --text needs the models extra")
    assert result.exit_code == 0, result.stderr
    page = open_page(context(viewport={"width": 1280, "height": 800}), path)
    page.click("[data-role='lang']")
    page.hover("figure.thumb td >> nth=1")
    known = latin_words(page.inner_text("header.top h1")) | {"UNK", "softmax", "English"}
    words = latin_words(page.inner_text("body")) - known
    assert {w for w in words if not allowed(w, known)} == set()
    page.click("figure.thumb >> nth=0")
    frame = page.frame_locator("iframe")
    frame.locator("body[data-ready='1']").wait_for()
    assert frame.locator("body").get_attribute("data-lang") == "zh"
    inner = frame.locator("body").inner_text()
    title = frame.locator("header.top h1").inner_text()  # the layer's name: data
    stages = latin_words(
        " ".join(
            frame.locator("section.stage").evaluate_all("ss => ss.map(s => s.dataset.stageName)")
        )
    )
    left = latin_words(inner) - latin_words(title) - stages - known
    assert {w for w in left if not allowed(w, known)} == set()


# -- an empty cache slot ---------------------------------------------------------------------


def test_an_empty_ring_slot_shows_a_dash_where_the_json_says_it_is_empty(
    context: Any, tmp_path: Path
) -> None:
    """Its scores and softmax read 0.0000, as if computed; only masked said −∞."""
    result = run_cli("decode", "gemma2_softcap", "-f", "json")
    assert result.exit_code == 0, result.stderr
    steps = json.loads(result.stdout)["steps"]
    path = made(tmp_path, "decode", "gemma2_softcap")
    page = open_page(context(viewport={"width": 1280, "height": 800}), path)
    for k, step in enumerate(steps):
        empty = [s for s, at in enumerate(step["cache_positions"]) if at < 0]
        page.click(f"nav.stages button[data-go='{k + 1}']")
        section = "section.stage.current"
        for head in (0, 1):
            table = page.locator(f"{section} table.m[data-head='{head}']")
            rows = table.evaluate(
                "t => Array.from(t.rows).slice(1).map(r => [r.cells[0].textContent,"
                " Array.from(r.cells).slice(1).map(c => c.textContent)])"
            )
            for name, cells in rows:
                dashes = [s for s, c in enumerate(cells) if c == "—"]
                if name == "masked":
                    assert dashes == [] and [cells[s] for s in empty] == ["-inf"] * len(empty)
                else:
                    assert dashes == empty, (k, head, name)
        none = page.locator(f"{section} td.none").count()
        # K_cache and V_cache (one kv head, d 4); scores, scaled, capped, softmax × 2 heads
        assert none == len(empty) * (4 + 4 + 4 * 2)
        legend = page.locator(f"{section} p.note span.en", has_text="an empty slot").count()
        assert legend == (1 if empty else 0)
        if empty:  # a dash is no number: nothing to derive, nothing selected
            page.click(f"{section} td.none >> nth=0")
            assert page.get_attribute("body", "data-pinned") != "1"


# -- the pointer and the projector -----------------------------------------------------------


def test_after_a_click_and_arrow_the_hovered_cell_is_not_outlined_as_the_pinned_one(
    context: Any, tmp_path: Path
) -> None:
    path = made(tmp_path, "trace", "causal_multihead")
    page = open_page(context(viewport={"width": 1280, "height": 800}), path)
    page.click("nav.stages button:text-is('scores')")
    page.click("td[data-stage='scores'][data-index='0,1,0']")
    page.keyboard.press("ArrowRight")
    assert page.inner_text("[data-role='stage-title']") == "scaled"
    hovered = page.locator("td[data-stage='scaled'][data-index='0,2,1']")
    hovered.hover()
    style = "td => [getComputedStyle(td).outlineStyle, getComputedStyle(td).outlineColor]"
    sel = page.evaluate("getComputedStyle(document.body).getPropertyValue('--sel').trim()")
    assert hovered.evaluate(style)[0] == "dashed"
    pinned = page.locator("td.sel")
    assert pinned.count() == 1 and pinned.get_attribute("data-stage") == "scores"
    assert pinned.evaluate(style)[0] == "solid" and sel
    assert page.inner_text("[data-role='derivation'] h2") == "scores[0, 1, 0]"  # still pinned


@pytest.mark.parametrize("command", ["trace", "decode", "flash"])
def test_a_larger_type_for_a_projector(context: Any, tmp_path: Path, command: str) -> None:
    path = made(tmp_path, command, "causal_multihead")
    page = open_page(context(viewport={"width": 1280, "height": 800}), path)
    size = "parseFloat(getComputedStyle(document.querySelector('table.m td')).fontSize)"
    small = page.evaluate(size)
    page.keyboard.press("l")
    assert page.get_attribute("body", "data-large") == "1"
    assert page.evaluate(size) >= 1.5 * small
    assert page.evaluate("location.hash").endswith(",large")
    page.click("[data-role='large']")  # the button: back to the usual type
    assert page.evaluate(size) == small
    again = open_page(context(viewport={"width": 1280, "height": 800}), path, "#stage-1,large")
    assert again.get_attribute("body", "data-large") == "1"
    assert again.get_attribute("[data-role='large']", "aria-pressed") == "true"
    assert again.evaluate("window.scrollY") == 0


def test_the_model_views_larger_type_follows_into_a_layers_page(
    context: Any, tmp_path: Path
) -> None:
    checkpoint = Path(__file__).parent.parent / "reference" / "forward" / "gpt2"
    path = tmp_path / "view.html"
    result = run_cli(
        "import",
        str(checkpoint),
        "--text",
        "The cat sat",
        "--layer",
        "all",
        "-f",
        "html",
        "-o",
        str(path),
    )
    if result.exit_code == 2 and "models" in result.stderr:
        pytest.skip("attn import --text needs the models extra")
    assert result.exit_code == 0, result.stderr
    page = open_page(context(viewport={"width": 1280, "height": 800}), path)
    size = "parseFloat(getComputedStyle(document.querySelector('header.top h1')).fontSize)"
    small = page.evaluate(size)
    page.click("[data-role='large']")
    assert page.get_attribute("body", "data-large") == "1"
    assert page.evaluate(size) > small
    page.click("figure.thumb >> nth=0")
    frame = page.frame_locator("iframe")
    frame.locator("body[data-ready='1']").wait_for()
    assert frame.locator("body").get_attribute("data-large") == "1"
    assert page.errors == []
