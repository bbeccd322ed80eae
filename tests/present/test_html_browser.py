"""The interactive page (``attn trace -f html``, present/html_page.py) driven in a real browser.

Headless Chromium (Debian's ``chromium``, which .ci/run installs) through playwright's Python
API. Each bundled example's page is opened from its file and checked against the JSON trace of
the same fixture (``attn trace -f json``, read here, not through the page): no console error, no
request beyond the file, every number cell present where the contract (docs/html.md) puts it
and equal to the JSON trace at the shown precision, the derivations of a softmax, a score and
an output cell showing the numbers they are computed from, → and ← changing the stage, the
language switch bringing the Chinese texts, a screenshot that is not blank. Hostile token text
is shown as text and runs nothing; a 64-token page becomes interactive in under a second; a
4,096-token trace gives a bounded page.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli

from attn_cli.io.examples import example_paths

CHROMIUM = os.environ.get("ATTN_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def _browser_missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install '.[test]')"
    if not Path(CHROMIUM).is_file():
        return "no Chromium at /usr/bin/chromium (apt-get install chromium; .ci/run does it)"
    return None


MISSING = _browser_missing()
if MISSING is not None and os.environ.get("ATTN_REQUIRE_BROWSER"):  # .ci/run installed one
    raise RuntimeError(f"ATTN_REQUIRE_BROWSER is set but {MISSING}")
pytestmark = [
    pytest.mark.skipif(MISSING is not None, reason=MISSING or ""),
    pytest.mark.slow,
    pytest.mark.subprocess,
]
EXAMPLES = sorted(example_paths())


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


class Opened:
    """A page opened from its file, with what it printed, asked for and popped up."""

    def __init__(self, browser: Any, path: Path, viewport: tuple[int, int] = (1280, 800)) -> None:
        self.page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
        self.console: list[str] = []
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        self.page.on("request", lambda r: self.requests.append(r.url))

        def dialog(d: Any) -> None:
            self.dialogs.append(d.message)
            d.dismiss()

        self.page.on("dialog", dialog)
        self.url = path.resolve().as_uri()
        start = time.perf_counter()
        self.page.goto(self.url)
        self.page.wait_for_selector("body[data-ready='1']", timeout=10_000)
        self.seconds = time.perf_counter() - start  # as the test waited for it
        # as the page measured it: from the navigation's start to the script's last line
        self.ready_ms = float(self.page.get_attribute("body", "data-ready-ms") or "nan")

    def title(self) -> str:
        return str(self.page.text_content("[data-role='stage-title']"))

    def derivation(self) -> str:
        return str(self.page.inner_text("[data-role='derivation']"))

    def click(self, stage: str, index: tuple[int, ...]) -> str:
        """Go to the stage, click the cell, and read the derivation."""
        self.page.click(f"nav.stages button:text-is('{stage}')")
        self.page.click(f"td[data-stage='{stage}'][data-index='{','.join(map(str, index))}']")
        return self.derivation()

    def errors(self) -> list[str]:
        return [m for m in self.console if m.startswith(("error", "pageerror", "warning"))]


def page_and_json(tmp_path: Path, name: str, *extra: str) -> tuple[Path, dict[str, Any]]:
    """The fixture's page (``-f html``) and its JSON trace (``-f json``), made separately."""
    page = tmp_path / f"{name}.html"
    result = run_cli("trace", name, "-f", "html", "-o", str(page), "-q", *extra)
    assert result.exit_code == 0, result.output
    result = run_cli("trace", name, "-f", "json")
    assert result.exit_code == 0, result.output
    return page, json.loads(result.stdout)


def shown(x: Any, precision: int = 4) -> str:
    """A table's number as the contract says (docs/html.md): fixed point, no -0, -inf spelled."""
    if isinstance(x, str):
        return x  # "-inf", "inf", "nan" as the JSON trace writes them
    text = f"{x:.{precision}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def in_formula(x: float, precision: int = 4) -> str:
    """A number as a worked line writes it, without its sign: 2, 0.5000, ∞."""
    if math.isinf(x):
        return "∞"
    if x == int(x):
        return str(abs(int(x)))
    return f"{abs(x):.{precision}f}"


def as_factor(x: float, precision: int = 4) -> str:
    """A number as a factor of a worked product: a negative one in parentheses, (−1.5745)."""
    text = in_formula(x, precision)
    negative = x < 0 and text.strip("0.") != ""
    return f"(−{text})" if negative else text


def cells_of(opened: Opened) -> list[tuple[str, str, str]]:
    """Every number cell: (data-stage, data-index, the number's text without its marks)."""
    got: list[tuple[str, str, str]] = opened.page.eval_on_selector_all(
        "td[data-stage]",
        "tds => tds.map(td => [td.dataset.stage, td.dataset.index, td.firstChild.textContent])",
    )
    return got


def at(data: Any, index: tuple[int, ...]) -> Any:
    for i in index:
        data = data[i]
    return data


def elided(shape: list[int]) -> bool:
    """Whether the terminal's bounds cut this stage's tables (present/text.py's limits)."""
    if len(shape) == 1:
        return shape[0] > 10
    lead = math.prod(shape[:-2])
    return lead > 16 or shape[-2] > 12 or shape[-1] > 10


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_page(browser: Any, tmp_path: Path, name: str) -> None:
    path, trace = page_and_json(tmp_path, name)
    opened = Opened(browser, path)
    # 1) every number cell where the contract puts it, equal to the JSON trace as shown
    cells = cells_of(opened)
    seen: dict[str, set[tuple[int, ...]]] = {}
    for stage, index_text, text in cells:
        index = tuple(int(i) for i in index_text.split(","))
        assert text == shown(at(trace["stages"][stage]["data"], index)), (stage, index)
        seen.setdefault(stage, set()).add(index)
    assert list(seen) == list(trace["stages"])  # every stage, in the trace's order
    for stage, body in trace["stages"].items():
        if not elided(body["shape"]):
            assert seen[stage] == set(np.ndindex(*body["shape"])), stage
    # 2) → and ← (and Space, Backspace) move through the stages, named in the title
    names = list(trace["stages"])
    assert opened.title() == names[0]
    opened.page.keyboard.press("ArrowRight")
    assert opened.title() == names[1]
    opened.page.keyboard.press("Space")
    assert opened.title() == names[2]
    opened.page.keyboard.press("Backspace")
    opened.page.keyboard.press("ArrowLeft")
    assert opened.title() == names[0]
    # 3) derivations show the numbers they are computed from (linear attention has no softmax
    # row to work: its cells show their formula)
    check_entry_derivations(opened, trace, name)
    opened.page.keyboard.press("Escape")  # let go of it: below, the last derived is output's
    if "softmax" in trace["stages"]:
        check_derivations(opened, trace)
    # 4) the language switch brings the Chinese texts
    opened.page.click("[data-role='lang']")
    assert opened.page.get_attribute("html", "lang") == "zh-Hans"
    zh = opened.derivation()
    worked = "softmax" in trace["stages"]  # else no cell was derived: the hint is shown
    assert ("单元格演算" if worked else "点击或悬停") in zh and "worked cell" not in zh
    assert opened.page.is_visible("section.stage.current .explain.zh")
    assert not opened.page.is_visible("section.stage.current .explain.en")
    opened.page.click("[data-role='lang']")
    assert ("worked cell" if worked else "Click or hover") in opened.derivation()
    # 5) nothing printed, nothing fetched but the file, nothing popped up
    assert opened.errors() == []
    assert set(opened.requests) == {opened.url}
    assert opened.dialogs == []
    opened.page.close()


def scores_reads(trace: dict[str, Any], what: str) -> str:
    """The stage the scores read: the last Q/K transform's (the temperature after the norm after
    RoPE, RoPE after QK-norm after clip_qkv; differential attention's first halves, Q_1, before
    them), else Q or K."""
    last = ("tuned", "postnorm", "rot", "norm", "clip", "1")
    return next(n for n in (*(f"{what}_{s}" for s in last), what) if n in trace["stages"])


def check_derivations(opened: Opened, trace: dict[str, Any]) -> None:
    """A score, a softmax and an output cell: each derivation holds its inputs' numbers."""
    stages = trace["stages"]
    cfg = trace["config"]
    lead = (0,) if cfg["batch"] is not None else ()
    h = cfg["heads"] - 1  # the last head, to see the head index and the kv head used
    kv = h // (cfg["heads"] // cfg["kv_heads"])
    q, k = trace_cell(stages)
    # a score: q row · k row, term by term
    text = opened.click("scores", (*lead, h, q, k))
    q_row = at(stages[scores_reads(trace, "Q")]["data"], (*lead, h, q))
    k_row = at(stages[scores_reads(trace, "K")]["data"], (*lead, kv, k))
    for a, b in list(zip(q_row, k_row, strict=True))[:6]:
        assert f"{as_factor(a)}×{as_factor(b)}" in text, (a, b, text)
    assert shown(at(stages["scores"]["data"], (*lead, h, q, k))).lstrip("-") in text
    # a softmax weight: its row, the maximum, the sum
    text = opened.click("softmax", (*lead, h, q, k))
    row_name = next(n for n in ("masked", "capped", "scaled") if n in stages)
    row = at(stages[row_name]["data"], (*lead, h, q))
    weight = at(stages["softmax"]["data"], (*lead, h, q, k))
    finite = [x for x in row if not isinstance(x, str)]
    if finite:
        assert "m = " in text and "Σ e^(x − m)" in text, text
        for x in row[:6]:
            assert in_formula(float(x)) in text, (x, text)
        assert shown(weight) in text
    # an output entry: the weights times the V column
    text = opened.click("output", (*lead, h, q, 0))
    weights = at(stages["softmax"]["data"], (*lead, h, q))
    v = at(stages["V"]["data"], (*lead, kv))
    for j, w in list(enumerate(weights))[:6]:
        assert f"{in_formula(w)}×{as_factor(v[j][0])}" in text, (w, v[j][0], text)
    assert shown(at(stages["output"]["data"], (*lead, h, q, 0))).lstrip("-") in text


NOT_X_TIMES_W = {"deepseek_mla", "gated_deltanet"}  # Q, K, V made past X·W (a latent, a conv)


def check_entry_derivations(opened: Opened, trace: dict[str, Any], name: str) -> None:
    """A Q, a concat and a projected entry (issue 26): each derivation holds its inputs."""
    stages = trace["stages"]
    cfg = trace["config"]
    lead = (0,) if cfg["batch"] is not None else ()
    h, t = cfg["heads"] - 1, min(1, stages["Q"]["shape"][-2] - 1)
    text = opened.click("Q", (*lead, h, t, 0))
    if "X" in stages and name not in NOT_X_TIMES_W:  # Q = X·W_Q (+ b_Q): the X row's terms
        x_row = at(stages["X"]["data"], (*lead, t))
        assert "·W_Q[:, " in text, text
        for x in x_row[:6]:
            assert f"{as_factor(x)}×" in text, (x, text)
        assert shown(at(stages["Q"]["data"], (*lead, h, t, 0))).lstrip("-") in text
    else:
        assert "No worked derivation" in text, text  # the formula instead
    if "concat" in stages:  # the last column: the last head's last output column
        col = stages["concat"]["shape"][-1] - 1
        text = opened.click("concat", (*lead, t, col))
        d_v = col + 1 if cfg["heads"] == 1 else (col + 1) // cfg["heads"]
        assert f"head {cfg['heads'] - 1}, " in text and f" = {cfg['heads'] - 1} × {d_v} + " in text
        assert shown(at(stages["concat"]["data"], (*lead, t, col))).lstrip("-") in text
    if "projected" in stages:  # concat row · W_O column: the concat row's terms
        text = opened.click("projected", (*lead, t, 0))
        for c in at(stages["concat"]["data"], (*lead, t))[:6]:
            assert f"{as_factor(c)}×" in text, (c, text)
        assert shown(at(stages["projected"]["data"], (*lead, t, 0))).lstrip("-") in text


def trace_cell(stages: dict[str, Any]) -> tuple[int, int]:
    """A query and key both shown (the last query, key 1, or the first ones when elided)."""
    seq_q, seq_k = stages["softmax"]["shape"][-2:]
    return (seq_q - 1 if seq_q <= 12 else 0), (1 if seq_k > 1 else 0)


def test_a_screenshot_is_not_blank(browser: Any, tmp_path: Path) -> None:
    """The tables are drawn: the screenshot holds the heatmap's colours, not one background."""
    path, _ = page_and_json(tmp_path, "causal_multihead")
    opened = Opened(browser, path)
    opened.page.click("nav.stages button:text-is('softmax')")
    png = opened.page.screenshot()
    blank = browser.new_page()
    colours = blank.evaluate(
        """async (b64) => {
            const img = new Image(); img.src = "data:image/png;base64," + b64; await img.decode();
            const c = document.createElement("canvas"); c.width = img.width; c.height = img.height;
            const g = c.getContext("2d"); g.drawImage(img, 0, 0);
            const px = g.getImageData(0, 0, c.width, c.height).data; const seen = new Set();
            for (let i = 0; i < px.length; i += 28) seen.add(px[i] << 16 | px[i+1] << 8 | px[i+2]);
            return seen.size;
        }""",
        base64.b64encode(png).decode("ascii"),
    )
    assert colours > 50, colours  # a blank or text-only page has a handful
    assert opened.page.is_visible("section.stage.current table.m")
    blank.close()
    opened.page.close()


HOSTILE_TOKENS = [
    "</script><script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "a\u202etxt.exe\u2066",
    "[bold red]x[/]",
    "<!--",
    "\u2028line",
]


def test_hostile_tokens_are_text_and_run_nothing(browser: Any, tmp_path: Path) -> None:
    n = len(HOSTILE_TOKENS)
    fixture = tmp_path / "hostile.json"
    fixture.write_text(
        json.dumps(
            {
                "name": "</script><script>alert(2)</script><img src=x onerror=alert(3)>",
                "tokens": HOSTILE_TOKENS,
                "Q": [[float(i == j) for j in range(2)] for i in range(n)],
                "K": [[float(i % 2), 1.0] for i in range(n)],
                "V": [[float(i), 1.0] for i in range(n)],
                "causal": True,
            }
        ),
        encoding="utf-8",
    )
    page = tmp_path / "hostile.html"
    result = run_cli("trace", str(fixture), "-f", "html", "-o", str(page), "-q")
    assert result.exit_code == 0, result.output
    opened = Opened(browser, page)
    for k in range(n):
        opened.click("softmax", (0, n - 1, k))  # every derivation, each naming a token
    opened.page.click("nav.stages button:text-is('scores')")
    for k in range(n):
        opened.page.hover(f"td[data-stage='scores'][data-index='0,{k},0']")
    opened.page.click("[data-role='lang']")
    labels = opened.page.eval_on_selector_all(
        "section.stage.current table.m tr th:first-child", "ths => ths.map(t => t.textContent)"
    )
    from attn_cli.errors import printable

    assert [printable(t) for t in HOSTILE_TOKENS] == labels[1:]  # shown as text, escaped
    assert opened.page.evaluate("document.images.length") == 0
    assert opened.page.evaluate("document.scripts.length") == 2
    assert opened.dialogs == []
    assert opened.errors() == []
    assert set(opened.requests) == {opened.url}
    opened.page.close()


def big_fixture(path: Path, seq: int, d_model: int, heads: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    d_k = 4
    fixture = {
        "name": f"{seq} tokens",
        "tokens": [f"t{i}" for i in range(seq)],
        "X": rng.standard_normal((seq, d_model)).round(3).tolist(),
        "W_Q": rng.standard_normal((d_model, heads * d_k)).round(3).tolist(),
        "W_K": rng.standard_normal((d_model, heads * d_k)).round(3).tolist(),
        "W_V": rng.standard_normal((d_model, heads * d_k)).round(3).tolist(),
        "heads": heads,
        "causal": True,
    }
    path.write_text(json.dumps(fixture), encoding="utf-8")
    return path


def test_a_64_token_page_is_interactive_within_a_second(
    browser: Any, tmp_path: Path, record_property: Any
) -> None:
    fixture = big_fixture(tmp_path / "t64.json", 64, 16, 4)
    page = tmp_path / "t64.html"
    result = run_cli("trace", str(fixture), "-f", "html", "-o", str(page), "-q")
    assert result.exit_code == 0, result.output
    Opened(browser, page).page.close()  # the browser warmed up once
    times, waited = [], []
    for _ in range(3):
        opened = Opened(browser, page)
        times.append(opened.ready_ms / 1000)
        waited.append(round(opened.seconds, 3))
        opened.page.keyboard.press("ArrowRight")
        assert opened.title() == "Q"
        opened.page.close()
    record_property("seconds_to_interactive", min(times))
    print(
        f"64-token page interactive {min(times) * 1000:.0f} ms after navigation starts "
        f"(best of 3: {times}; as playwright's goto and wait saw it: {waited} s)"
    )
    assert min(times) < 1.0, times


def test_a_4096_token_trace_gives_a_bounded_page(browser: Any, tmp_path: Path) -> None:
    fixture = big_fixture(tmp_path / "t4096.json", 4096, 4, 1)
    page = tmp_path / "t4096.html"
    result = run_cli("trace", str(fixture), "-f", "html", "-o", str(page), "-q")
    assert result.exit_code == 0, result.output
    size = page.stat().st_size
    assert size < 3_000_000, size  # the JSON trace alone would be hundreds of MB
    opened = Opened(browser, page)
    assert "The page embeds" in opened.page.inner_text("main")
    assert opened.page.eval_on_selector_all("td[data-stage='softmax']", "t => t.length") == 36
    opened.click("softmax", (0, 4095, 4094))
    assert "6 of 4096 rows" in opened.page.inner_text("section.stage.current")
    assert "Σ e^(x − m)" in opened.derivation()
    assert "full precision" in opened.derivation()  # the number is in the page's cut data
    assert opened.errors() == []
    opened.page.close()


def visible_tables(opened: Opened) -> list[str]:
    got: list[str] = opened.page.eval_on_selector_all(
        "section.stage.current table.m",
        "ts => ts.filter(t => t.offsetParent !== null).map(t => t.caption.innerText)",
    )
    return got


def test_heads_and_batch_items_are_selectable(browser: Any, tmp_path: Path) -> None:
    path, _ = page_and_json(tmp_path, "llama_rope_gqa")  # 4 query heads reading 2 kv heads
    opened = Opened(browser, path)
    opened.page.click("nav.stages button:text-is('softmax')")
    assert visible_tables(opened) == ["head 0", "head 1", "head 2", "head 3"]
    opened.page.select_option("[data-role='head']", "3")
    assert visible_tables(opened) == ["head 3"]
    opened.page.click("nav.stages button:text-is('K')")  # kv head 3 // 2 = 1
    assert visible_tables(opened) == ["kv head 1"]
    opened.page.select_option("[data-role='head']", "all")
    assert visible_tables(opened) == ["kv head 0", "kv head 1"]
    every = "[data-role='head'] option[value='all']"
    assert opened.page.text_content(every) == "all"
    opened.page.click("[data-role='lang']")
    assert opened.page.text_content(every) == "全部"
    opened.page.close()
    path, _ = page_and_json(tmp_path, "padding_batch")
    opened = Opened(browser, path)
    opened.page.click("nav.stages button:text-is('softmax')")
    opened.page.select_option("[data-role='batch']", "1")
    assert visible_tables(opened) == ["batch 1 · head 0"]
    assert opened.errors() == []
    opened.page.close()


def test_themes_and_the_print_layout(browser: Any, tmp_path: Path) -> None:
    path, trace = page_and_json(tmp_path, "causal_multihead", "--theme", "light")
    opened = Opened(browser, path)
    background = "getComputedStyle(document.body).backgroundColor"
    assert opened.page.evaluate(background) == "rgb(255, 255, 255)"
    opened.page.click("[data-role='theme']")
    assert opened.page.get_attribute("body", "data-theme") == "dark"
    assert opened.page.evaluate(background) == "rgb(22, 22, 29)"
    # printed, every stage shows, one a page, without the controls
    opened.page.emulate_media(media="print")
    shown_sections = opened.page.eval_on_selector_all(
        "section.stage",
        "ss => ss.map(s => [getComputedStyle(s).display, getComputedStyle(s).breakAfter])",
    )
    assert [d for d, _ in shown_sections] == ["block"] * len(trace["stages"])
    assert [b for _, b in shown_sections[:-1]] == ["page"] * (len(trace["stages"]) - 1)
    assert not opened.page.is_visible("nav.stages")
    assert not opened.page.is_visible("[data-role='derivation']")
    pdf = opened.page.pdf()  # one stage a page: as many pages as stages
    assert len(re.findall(rb"/Type\s*/Page(?!s)", pdf)) == len(trace["stages"])
    opened.page.close()


# ---------------------------------------------------------------------------------------------
# attn decode -f html and attn flash -f html (present/html_steps.py): the same checks, a step
# or a tile a section, each cell against the decode or flash JSON (attn decode/flash -f json).


def run_page_and_json(
    tmp_path: Path, command: str, name: str, *extra: str
) -> tuple[Path, dict[str, Any]]:
    """The run's page and its JSON, made separately; skipped where the command refuses the
    example (decoding needs a causal fixture, flash refuses some variants), saying why."""
    result = run_cli(command, name, "-f", "json", *extra)
    if result.exit_code == 2:
        pytest.skip(f"attn {command} refuses {name}: {result.stderr.strip()[:160]}")
    assert result.exit_code == 0, result.output
    page = tmp_path / f"{command}-{name}.html"
    made = run_cli(command, name, "-f", "html", "-o", str(page), "-q", *extra)
    if made.exit_code == 2 and "has no page yet" in made.stderr:  # test_html_page.py: PAGELESS
        pytest.skip(f"attn {command} -f html refuses {name}: {made.stderr.strip()[:160]}")
    assert made.exit_code == 0, made.output
    return page, json.loads(result.stdout)


def step_cells_of(opened: Opened) -> list[dict[str, str]]:
    """Every number cell's data- attributes and its text."""
    got: list[dict[str, str]] = opened.page.eval_on_selector_all(
        "td[data-stage]",
        "tds => tds.map(td => Object.assign({text: td.firstChild.textContent}, td.dataset))",
    )
    return got


def index_of(cell: dict[str, str]) -> tuple[int, ...]:
    return tuple(int(i) for i in cell["index"].split(","))


def steps_navigate(opened: Opened, first: str) -> None:
    """→, Space, Backspace and ← move through the steps or tiles, named in the title."""
    assert opened.title() == "overview"
    opened.page.keyboard.press("ArrowRight")
    assert opened.title().startswith("1: ")
    opened.page.keyboard.press("Space")
    assert opened.title().startswith("2: ") or opened.title() in ("self-check", "O, L")
    opened.page.keyboard.press("Backspace")
    assert opened.title() == first
    opened.page.keyboard.press("ArrowLeft")
    assert opened.title() == "overview"


def click_in(opened: Opened, section: int, selector: str) -> str:
    """Go to a section, click the cell, read the derivation."""
    opened.page.click(f"nav.stages button[data-go='{section}']")
    opened.page.click(f"section.stage.current {selector}")
    return opened.derivation()


def switch_language(opened: Opened, chinese: str) -> None:
    """The language switch brings the Chinese texts, the derivation in view included."""
    opened.page.click("[data-role='lang']")
    assert opened.page.get_attribute("html", "lang") == "zh-Hans"
    assert chinese in opened.derivation()
    opened.page.click("[data-role='lang']")
    assert opened.page.get_attribute("html", "lang") == "en"


def quiet(opened: Opened) -> None:
    assert opened.errors() == []
    assert set(opened.requests) == {opened.url}
    assert opened.dialogs == []


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_decode_page(browser: Any, tmp_path: Path, name: str) -> None:
    path, run = run_page_and_json(tmp_path, "decode", name)
    opened = Opened(browser, path)
    steps = run["steps"]
    # 1) every cell equal to the decode JSON as shown; the full attention's rows to the step's
    full_rows = 0
    for cell in step_cells_of(opened):
        k, index = int(cell["step"]), index_of(cell)
        data = steps[k]["stages"][cell["stage"]]["data"]
        if cell.get("source") == "trace":
            assert index[-2] == steps[k]["index"]
            index = (*index[:-2], 0, index[-1])
            full_rows += 1
        assert cell["text"] == shown(at(data, index)), cell
    if "state_bytes" not in run and "diff" not in steps[0]["stages"]:
        assert full_rows > 0  # a state's and two maps' steps are checked without the row shown
    # 2) the keys
    first = opened.page.text_content("nav.stages button[data-go='1']")
    steps_navigate(opened, str(first))
    # 3) derivations hold their inputs: a score, a weight, an output entry of the first step
    if "state_bytes" in run:
        check_state_derivations(opened, run)
        switch_language(opened, "之后的状态")  # the output's, the last cell clicked
    else:
        check_decode_derivations(opened, run)
    if "diff" in steps[0]["stages"]:
        check_diff_derivations(opened, run)
    if "softmax" in steps[0]["stages"]:
        switch_language(opened, "对各槽求和")  # the output's, the last cell clicked
    quiet(opened)
    opened.page.close()


def check_decode_derivations(opened: Opened, run: dict[str, Any]) -> None:
    step = run["steps"][0]
    stages = step["stages"]
    if not {"scores", "softmax", "K_cache", "V_cache"} <= set(stages):
        return  # a decode without a softmax row over a cache: its cells show their formula
    lead = (0,) if run["config"]["batch"] is not None else ()
    heads = run["config"]["heads"]
    h = heads - 1
    K = stages["K_cache"]["data"]
    if lead:
        K = K[0]
    g = h // (heads // len(K))  # the kv head (a latent cache: one for every head)
    c = step.get("slot", len(K[g]) - 1)  # the slot the step's own token went to (a ring's
    # last slot may be empty: it shows —, no number to derive), or the last
    q = at(stages["Q_rot" if "Q_rot" in stages else "Q"]["data"], (*lead, h, 0))
    text = click_in(
        opened, 1, f"td[data-stage='scores'][data-index='{','.join(map(str, (*lead, h, 0, c)))}']"
    )
    for a, b in list(zip(q, K[g][c], strict=True))[:6]:
        assert f"{as_factor(a)}×{as_factor(b)}" in text, (a, b, text)
    assert shown(at(stages["scores"]["data"], (*lead, h, 0, c))).lstrip("-") in text
    text = click_in(
        opened, 1, f"td[data-stage='softmax'][data-index='{','.join(map(str, (*lead, h, 0, c)))}']"
    )
    row = at(stages["masked"]["data"], (*lead, h, 0))
    assert "m = " in text and "Σ e^(x − m)" in text
    for x in row[:6]:
        assert in_formula(float(x)) in text, (x, text)
    assert shown(at(stages["softmax"]["data"], (*lead, h, 0, c))) in text
    averaged = "output_latent" if "output_latent" in stages else "output"
    text = click_in(
        opened,
        1,
        f"td[data-stage='{averaged}'][data-index='{','.join(map(str, (*lead, h, 0, 0)))}']",
    )
    weights = at(stages["softmax"]["data"], (*lead, h, 0))
    V = at(stages["V_cache"]["data"], (*lead, g))
    for j, w in list(enumerate(weights))[:6]:
        assert f"{in_formula(w)}×{as_factor(V[j][0])}" in text, (w, V[j][0], text)


def check_state_derivations(opened: Opened, run: dict[str, Any]) -> None:
    """The state's update and the output of the second step (its S_{t−1} is the first step's
    state in the JSON): each derivation holds the numbers it is made of."""
    before, step = (s["stages"] for s in run["steps"][:2])
    lead = (0,) if run["config"]["batch"] is not None else ()
    h = run["config"]["heads"] - 1
    i = j = 0
    old = at(before["state.S"]["data"], (*lead, h, i, j))
    text = click_in(opened, 2, f"td[data-stage='state.S'][data-index='{idx(*lead, h, i, j)}']")
    if "phi_k" in step:  # linear attention: S_t = S_{t−1} + φ(k)vᵀ
        assert "S_t = S_{t−1} + φ(k)vᵀ" in text, text
        k, v = at(step["phi_k"]["data"], (*lead, h, i)), at(step["v"]["data"], (*lead, h, j))
        assert f"{as_factor(old)} + {as_factor(k)}×{as_factor(v)}" in text, (old, k, v, text)
        assert old + k * v == pytest.approx(at(step["state.S"]["data"], (*lead, h, i, j)))
        text = click_in(opened, 2, f"td[data-stage='output'][data-index='{idx(*lead, h, 0, j)}']")
        num, den = at(step["num"]["data"], (*lead, h, j)), at(step["den"]["data"], (*lead, h, 0))
        assert "num / den" in text and in_formula(num) in text and in_formula(den) in text, text
        assert num / den == pytest.approx(at(step["output"]["data"], (*lead, h, 0, j)))
    else:  # the delta rule: S_t = S_{t−1}·e^g + k·deltaᵀ
        assert "S_t = S_{t−1}·e^g + k·deltaᵀ" in text, text
        k, d = at(step["k"]["data"], (*lead, h, i)), at(step["delta"]["data"], (*lead, h, j))
        assert as_factor(old) in text and f"{as_factor(k)}×{as_factor(d)}" in text, text
        eg = math.exp(at(step["g"]["data"], (*lead, h, 0)))
        assert old * eg + k * d == pytest.approx(at(step["state.S"]["data"], (*lead, h, i, j)))
        text = click_in(opened, 2, f"td[data-stage='output'][data-index='{idx(*lead, h, 0, j)}']")
        S, q = at(step["state.S"]["data"], (*lead, h)), at(step["q"]["data"], (*lead, h))
        for row, x in list(zip(S, q, strict=True))[:6]:
            assert f"{as_factor(row[j])}×{as_factor(x)}" in text, (row[j], x, text)
        assert "S_t, z_t: this step's state, after its update" in text, text
    text = click_in(opened, 2, f"td[data-stage='state.S'][data-index='{idx(*lead, h, i, j)}']")
    assert "the state after step 1" in text, text  # S_{t−1}: the first step's, in the JSON


def check_diff_derivations(opened: Opened, run: dict[str, Any]) -> None:
    """Differential attention: diff = softmax − λ·softmax_2 cell by cell, the second map's
    weight as exp(x − m)/Σ, diff_output = Σ diff × V_cache; each with its numbers."""
    stages = run["steps"][0]["stages"]
    lead = (0,) if run["config"]["batch"] is not None else ()
    h = run["config"]["heads"] - 1
    c = len(at(stages["diff"]["data"], (*lead, h, 0))) - 1
    a = at(stages["softmax"]["data"], (*lead, h, 0, c))
    lam = at(stages["lambda"]["data"], (*lead, h, 0, 0))
    b = at(stages["softmax_2"]["data"], (*lead, h, 0, c))
    d = at(stages["diff"]["data"], (*lead, h, 0, c))
    assert a - lam * b == pytest.approx(d)
    text = click_in(opened, 1, f"td[data-stage='diff'][data-index='{idx(*lead, h, 0, c)}']")
    assert "diff = softmax − λ·softmax_2" in text, text
    assert f"{in_formula(a)} − {in_formula(lam)}×{as_factor(b)}" in text, (a, lam, b, text)
    text = click_in(opened, 1, f"td[data-stage='softmax_2'][data-index='{idx(*lead, h, 0, c)}']")
    assert "Σ e^(x − m)" in text and shown(b) in text, text
    text = click_in(opened, 1, f"td[data-stage='diff_output'][data-index='{idx(*lead, h, 0, 0)}']")
    weights, V = at(stages["diff"]["data"], (*lead, h, 0)), at(stages["V_cache"]["data"], lead)
    g = h // (run["config"]["heads"] // len(V))
    for j, w in list(enumerate(weights))[:6]:
        assert f"{as_factor(w)}×{as_factor(V[g][j][0])}" in text, (w, text)


def idx(*index: int) -> str:
    return ",".join(map(str, index))


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_flash_page(browser: Any, tmp_path: Path, name: str) -> None:
    path, run = run_page_and_json(tmp_path, "flash", name)
    opened = Opened(browser, path)
    tiles = run["tiles"]
    for cell in step_cells_of(opened):
        if "tile" in cell:
            expected = at(tiles[int(cell["tile"])][cell["stage"]], index_of(cell))
        else:
            assert cell["source"] == "run"
            expected = at(run["stages"][cell["stage"]]["data"], index_of(cell))
        assert cell["text"] == shown(expected), cell
    first = opened.page.text_content("nav.stages button[data-go='1']")
    steps_navigate(opened, str(first))
    check_flash_derivations(opened, run)
    switch_language(opened, "α·l_old")
    quiet(opened)
    opened.page.close()


def check_flash_derivations(opened: Opened, run: dict[str, Any]) -> None:
    """m as max(m_old, the S row), α = exp(m_old − m), l = α·l_old + Σ P, of the first tile
    with a previous tile in its block (else the first computed one)."""
    tiles = run["tiles"]
    same = [
        k
        for k in range(1, len(tiles))
        if not tiles[k]["skipped"]
        and tiles[k - 1]["q_block"] == tiles[k]["q_block"]
        and tiles[k - 1]["head"] == tiles[k]["head"]
    ]
    k = same[0] if same else next(k for k, t in enumerate(tiles) if not t["skipped"])
    tile = tiles[k]
    m_old = tiles[k - 1]["m"][0] if same else None
    exp = "exp2" if run["base2"] else "exp"
    text = click_in(opened, k + 1, f"td[data-stage='m'][data-tile='{k}'][data-index='0']")
    assert "m = max(m_old, max_j S[0, j])" in text
    for x in tile["S"][0][:6]:
        assert in_formula(float(x)) in text, (x, text)
    if m_old is not None:
        assert in_formula(float(m_old)) in text
    assert shown(tile["m"][0]).lstrip("-") in text
    text = click_in(opened, k + 1, "td[data-stage='alpha'][data-index='0']")
    assert f"α = {exp}(m_old − m)" in text and shown(tile["alpha"][0]) in text
    text = click_in(opened, k + 1, "td[data-stage='l'][data-index='0']")
    assert "l = α·l_old + Σ_j P[0, j]" in text
    for p in tile["P"][0][:6]:
        assert in_formula(float(p)) in text, (p, text)
    assert shown(tile["l"][0]) in text


def test_a_long_decode_page_is_bounded_and_opens(browser: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    fixture = tmp_path / "long.json"
    fixture.write_text(
        json.dumps(
            {
                "causal": True,
                **{n: rng.standard_normal((600, 128)).round(3).tolist() for n in "QKV"},
            }
        ),
        encoding="utf-8",
    )
    page = tmp_path / "long.html"
    result = run_cli("decode", str(fixture), "-f", "html", "-o", str(page), "-q")
    assert result.exit_code == 0, result.output
    assert page.stat().st_size < 8_000_000
    opened = Opened(browser, page)
    notes = opened.page.inner_text("main")
    assert "6 of 599 steps shown" in notes and "The page embeds the numbers of" in notes
    opened.page.keyboard.press("End")
    opened.page.keyboard.press("ArrowLeft")
    assert opened.title().startswith("599: ")
    text = click_in(opened, 6, "td[data-stage='softmax'][data-index='0,0,0']")
    assert "Σ e^(x − m)" in text and "…" in text  # 599 slots: the terms elide
    quiet(opened)
    opened.page.close()


@pytest.mark.parametrize("command", ["decode", "flash"])
def test_hostile_tokens_in_decode_and_flash_pages_run_nothing(
    browser: Any, tmp_path: Path, command: str
) -> None:
    n = len(HOSTILE_TOKENS)
    fixture = tmp_path / "hostile.json"
    fixture.write_text(
        json.dumps(
            {
                "name": "</script><script>alert(2)</script><img src=x onerror=alert(3)>",
                "tokens": HOSTILE_TOKENS,
                "causal": True,
                "Q": [[float(i == j) for j in range(2)] for i in range(n)],
                "K": [[float(i % 2), 1.0] for i in range(n)],
                "V": [[float(i), 1.0] for i in range(n)],
            }
        ),
        encoding="utf-8",
    )
    page = tmp_path / "hostile.html"
    result = run_cli(command, str(fixture), "-f", "html", "-o", str(page), "-q")
    assert result.exit_code == 0, result.output
    opened = Opened(browser, page)
    from attn_cli.errors import printable

    for _ in range(1, opened.page.eval_on_selector_all("section.stage", "s => s.length") - 1):
        opened.page.keyboard.press("ArrowRight")
        for td in opened.page.query_selector_all("section.stage.current td[data-stage]")[:40]:
            td.hover()  # every derivation shown, each naming tokens
    opened.page.click("[data-role='lang']")
    text = opened.page.inner_text("body")
    opened.page.click(f"nav.stages button[data-go='{1 if command == 'decode' else 0}']")
    for token in HOSTILE_TOKENS:
        if command == "decode":
            assert printable(token) in opened.page.inner_text("body") or printable(token) in text
    assert opened.page.evaluate("document.images.length") == 0
    assert opened.page.evaluate("document.scripts.length") == 2
    quiet(opened)
    opened.page.close()


@pytest.mark.parametrize("command", ["decode", "flash"])
def test_a_64_token_decode_or_flash_page_is_interactive_within_a_second(
    browser: Any, tmp_path: Path, record_property: Any, command: str
) -> None:
    fixture = big_fixture(tmp_path / "t64.json", 64, 16, 4)
    page = tmp_path / f"{command}64.html"
    result = run_cli(command, str(fixture), "-f", "html", "-o", str(page), "-q")
    assert result.exit_code == 0, result.output
    Opened(browser, page).page.close()  # the browser warmed up once
    times = []
    for _ in range(3):
        opened = Opened(browser, page)
        times.append(opened.ready_ms / 1000)
        opened.page.keyboard.press("ArrowRight")
        assert opened.title().startswith("1: ")
        quiet(opened)
        opened.page.close()
    record_property("seconds_to_interactive", min(times))
    print(
        f"64-token {command} page ({page.stat().st_size:,} bytes) interactive "
        f"{min(times) * 1000:.0f} ms after navigation starts (best of 3: {times})"
    )
    assert min(times) < 1.0, times


# attn decode F1 F2 --batch -f html (present/html_batch.py): a section per step of the batch


def test_a_batch_page_steps_through_the_batch_and_derives_a_weight(
    browser: Any, tmp_path: Path
) -> None:
    """Every number cell equals the batch JSON as shown, the keys step, a weight's derivation
    holds its packed row (the other sequence's keys −∞) and its value, an output entry its
    weights × V, the language switch brings the Chinese derivation."""
    args = ("llama_rope_gqa", "gptoss_sinks", "--batch", "--arrive", "0,2")
    result = run_cli("decode", *args, "-f", "json")
    assert result.exit_code == 0, result.output
    run = json.loads(result.stdout)
    path = tmp_path / "batch.html"
    made = run_cli("decode", *args, "-f", "html", "-o", str(path), "-q")
    assert made.exit_code == 0, made.output
    opened = Opened(browser, path)
    steps = run["steps"]
    cells = step_cells_of(opened)
    for cell in cells:
        data = steps[int(cell["step"])]["stages"][cell["stage"]]["data"]
        assert cell["text"] == shown(at(data, index_of(cell))), cell
    assert {c["stage"] for c in cells} == {"softmax", "output"}
    steps_navigate(opened, str(opened.page.text_content("nav.stages button[data-go='1']")))
    # step 3 (k = 2): gptoss_sinks joins; its row 1 sees only its own key, the sink beside it
    k = 2
    assert [r["sequence"] for r in steps[k]["rows"]] == ["llama_rope_gqa", "gptoss_sinks"]
    masked = steps[k]["stages"]["masked"]["data"][0][1]
    assert masked[:3] == ["-inf"] * 3 and isinstance(masked[3], float)
    text = click_in(opened, k + 1, "td[data-stage='softmax'][data-index='0,1,3']")
    assert "sink" in text and "Σ e^(x − m)" in text and "keys are −∞ (weight 0)" in text, text
    assert shown(steps[k]["stages"]["softmax"]["data"][0][1][3]) in text
    assert in_formula(masked[3]) in text
    text = click_in(opened, k + 1, "td[data-stage='output'][data-index='0,0,0']")
    weights = steps[k]["stages"]["softmax"]["data"][0][0]
    assert "Σ weight × V" in text and all(in_formula(w) in text for w in weights[:3]), text
    switch_language(opened, "的打包键求和")
    quiet(opened)
    opened.page.close()
