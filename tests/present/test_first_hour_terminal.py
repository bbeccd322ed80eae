"""Issue 40, "The first hour", the terminal's side: an empty cache slot says "no key here" (—)
where it read as a computed 0.0000, "1 key/value head", the output cell's part names V's rows,
a flash skipped tile's rule in words, --help prose re-flowed to the width, --theme auto.

Each expectation is read from an independent source: the decode JSON's ``cache_positions`` (−1
for an empty slot, as docs/decode.md says), the command's docstring, or the bytes of the same
export made with --theme dark."""

from __future__ import annotations

import itertools
import json
import re

import pytest
from conftest import run_cli

from attn_cli.cli.app import COMMANDS, implementation

NONE = "—"


def _decode_json(name: str) -> dict[str, object]:
    result = run_cli("decode", name, "-f", "json")
    assert result.exit_code == 0, result.stderr
    doc: dict[str, object] = json.loads(result.stdout)
    return doc


def _attention_rows(out: str, step: int, head: int) -> dict[str, list[str]]:
    """The rows of step ``step``'s attention table of ``head`` (1-based step), by stage."""
    section = out.split(f"step {step} of ")[1]
    block = section.split(f"attention · head {head} ")[1].split("\n\n")[0]
    rows = {}
    for line in block.splitlines()[3:]:  # the title's tail, the header, the rule
        name, *cells = line.split()
        rows[name] = cells
    return rows


@pytest.mark.slow  # about 0.4 s: a decode run twice
def test_an_empty_ring_slot_shows_no_number_where_the_json_says_it_is_empty() -> None:
    doc = _decode_json("gemma2_softcap")  # window 4 over 5 tokens: a ring of 4 slots
    steps = doc["steps"]
    assert isinstance(steps, list)
    result = run_cli("decode", "gemma2_softcap", "--no-color", "--width", "80", "--lang", "en")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    checked = 0
    for k, step in enumerate(steps, start=1):
        empty = [s for s, at in enumerate(step["cache_positions"]) if at < 0]
        for head in (0, 1):
            rows = _attention_rows(out, k, head)
            for name in ("scores", "scaled", "capped", "softmax"):
                shown = [s for s, cell in enumerate(rows[name]) if cell == NONE]
                assert shown == empty, (k, head, name)
            assert [rows["masked"][s] for s in empty] == ["-inf"] * len(empty)  # the fill
            checked += len(empty)
        # the JSON keeps its numbers there (backward compatible): 0 before the mask, −∞ in it
        for s in empty:
            assert step["stages"]["scores"]["data"][0][0][s] == 0.0
            assert step["stages"]["masked"]["data"][0][0][s] == "-inf"
    assert checked == 2 * (2 + 1)  # step 1: slots 2 and 3 empty, step 2: slot 3, both heads
    legend = "—: an empty slot, no key there yet: masked −∞, no weight, nothing computed"
    assert out.count(legend) == 2  # on the steps with an empty slot, and only there


def test_an_empty_slot_in_chinese_has_its_legend_too() -> None:
    result = run_cli("decode", "gemma2_softcap", "--no-color", "--lang", "zh")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("—：空槽，里面还没有键") == 2
    assert "（空）" not in result.stdout


def test_the_cache_line_lists_its_slots_on_a_line_of_their_own_within_80_columns() -> None:
    result = run_cli("decode", "gemma2_softcap", "--no-color", "--width", "80")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    at = lines.index("cache: 4 slots · slot: token@position")
    assert lines[at + 1] == "  0: The@0, 1: cat@1, 2: —, 3: —"
    assert max(len(line) for line in lines) <= 80


@pytest.mark.parametrize(
    ("name", "line"),
    [
        (
            "gemma2_softcap",
            "2 query heads, 1 key/value head (multi-query: every head reads kv head 0)",
        ),
        (
            "gptoss_sinks",
            "4 query heads, 2 key/value heads (grouped-query: head h reads kv head h // 2)",
        ),
    ],
)
def test_one_key_value_head_is_singular(name: str, line: str) -> None:
    result = run_cli("trace", name, "--no-color", "--width", "120", "--stage", "X")
    assert result.exit_code == 0, result.stderr
    assert line in result.stdout
    assert "1 key/value heads" not in result.stdout


def test_the_output_part_of_a_worked_cell_names_the_value_rows() -> None:
    result = run_cli("trace", "causal_multihead", "--cell", "like,green", "-f", "plain")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    panels = re.findall(r"worked cell: query like, ([^(]*) \(head 0\)[^\n]*\n[^\n]*\n", out)
    assert panels.count("every value row V") == 1
    at = out.index("worked cell: query like, every value row V (head 0)")
    assert "output of like: the weights times the V rows, summed:" in out[at : at + 300]


def test_a_skipped_flash_tile_says_its_rule_in_words() -> None:
    result = run_cli("flash", "causal_multihead", "--explain", "--no-color", "--width", "100")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "a key block is skipped when its first key comes after the last" in out
    assert not re.search(r"\bs0\b|\bt1\b", out.split("skipped when")[1][:200])
    skipped = out.split("under causal: a key block is skipped")[1].split("╰")[0]
    assert "out a number" not in skipped  # a skipped tile makes no array: its shapes line says so
    assert "in q_block; k_block  →  out nothing: m, l and acc carry over" in out


def _prose(docstring: str) -> list[str]:
    """The docstring's prose paragraphs (not its examples), each as one line of words."""
    import inspect

    paragraphs = inspect.cleandoc(docstring).split("\n\n")
    return [" ".join(p.split()) for p in paragraphs if not p.startswith(" ")]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_reflows_a_docstrings_prose_to_the_width(command: str) -> None:
    import importlib

    module, function = implementation(command)
    doc = getattr(importlib.import_module(f"attn_cli.cli.{module}"), function).__doc__
    assert doc, command
    result = run_cli(command, "--help", env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.stderr
    text = result.stdout.split("╭", 1)[0]  # the description, before the option boxes
    body = " ".join(text.split())
    for paragraph in _prose(doc):
        if paragraph.startswith("Examples:"):
            continue
        assert paragraph in body, (command, paragraph[:60])
        # re-flowed: no line of a paragraph but its last is much shorter than the width
        words = paragraph.split()
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        first = next(n for n, line in enumerate(lines) if line.startswith(" ".join(words[:3])))
        taken, n = 0, first
        while taken < len(words):
            line = lines[n]
            taken += len(line.split())
            if taken < len(words):
                assert len(line) >= 60, (command, line)
            n += 1


def test_theme_auto_is_the_default_page_and_draws_dark_elsewhere(tmp_path: object) -> None:
    page = run_cli("trace", "causal_multihead", "-f", "html", "-q")
    assert page.exit_code == 0, page.stderr
    assert '<body data-lang="en" data-theme="auto"' in page.stdout
    light = run_cli("trace", "causal_multihead", "-f", "html", "-q", "--theme", "light")
    assert '<body data-lang="en" data-theme="light"' in light.stdout
    made = [
        run_cli("trace", "the_cat_sat", "--stage", "softmax", "-f", "svg", *theme).stdout
        for theme in ((), ("--theme", "dark"), ("--theme", "auto"))
    ]
    assert made[0] == made[1] == made[2]  # a terminal's export has no "auto": it draws dark


@pytest.mark.parametrize("command", ["decode", "flash"])
def test_decode_and_flash_pages_follow_the_system_theme(command: str) -> None:
    page = run_cli(command, "causal_multihead", "-f", "html", "-q")
    assert page.exit_code == 0, page.stderr
    assert 'data-theme="auto"' in page.stdout
    assert "@media (prefers-color-scheme: dark)" in page.stdout


@pytest.mark.parametrize("value", ["", "Auto", "dark ", "светлый", "1e308", "\udcff"])
def test_a_bad_theme_is_one_error_line(value: str) -> None:
    result = run_cli("trace", "causal_multihead", "-f", "html", "--theme", value)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.stderr
    assert "--theme" in lines[0] and "auto" in lines[0], lines[0]


def test_the_step_mode_status_bar_keeps_its_columns_from_page_to_page() -> None:
    """Its spacing jumped: "stage 9 of 11 ↓ 1–20/145" then "stage 10 of 11 ↓ 100–119/145"."""
    import io

    from rich.console import Console

    from attn_cli.api import trace_file
    from attn_cli.present.options import RenderOptions
    from attn_cli.present.pager import Deck, State, frame, press

    trace = trace_file("causal_multihead", keep_all=True)
    console = Console(width=80, color_system=None, file=io.StringIO())
    deck = Deck(trace, RenderOptions(explain=True), console)
    n = len(deck.names)
    assert n >= 10  # two-digit stage numbers: the case that jumped
    bars = []
    for k in range(n):
        state = State(k)
        for _ in range(12):  # down the page: the line numbers grow a digit
            bars.append("".join(s.text for s in frame(deck, state, 80, 24)[-1]).rstrip())
            state = press(deck, state, "down", 80, 24)
    after_position = {m.end() for bar in bars if (m := re.search(r"of \d+ ", bar))}
    assert len(after_position) == 1, sorted(after_position)  # "stage  9 of 11", "stage 10 of 11"
    ranges = {m.end() for bar in bars if (m := re.search(r"\d+/\d+ ·", bar))}
    assert len(ranges) == 1, sorted(ranges)  # " 1–20/145", "100–119/145"


def test_slide_borders_are_unbroken_bars_the_height_of_a_line() -> None:
    """A │ drawn as text is as high as the font, not the line (24.4 px at 20 px): the border
    came out as a broken line. Each vertical stroke is now a bar; the bars of one column meet."""
    from attn_cli.api import trace_file
    from attn_cli.present.options import RenderOptions
    from attn_cli.present.slides import slides

    trace = trace_file("causal_multihead")
    svg = slides(trace, RenderOptions(), "svg")[0].text
    assert "│</text>" not in svg  # no vertical stroke left as a glyph
    bars = re.findall(
        r'<rect class="[^"]+" x="([\d.]+)" y="([\d.]+)" width="[\d.]+" '
        r'height="([\d.]+)"',
        svg,
    )
    by_x: dict[str, list[tuple[float, float]]] = {}
    for x, y, h in bars:
        by_x.setdefault(x, []).append((float(y), float(y) + float(h)))
    left = sorted(by_x[min(by_x, key=float)])  # the panel's left border, top to bottom
    assert len(left) >= 8
    for (_, end), (start, _) in itertools.pairwise(left):
        assert abs(start - end) < 1e-6, (end, start)  # each bar starts where the last ended


def test_the_output_worked_cell_breaks_before_an_equals_sign_at_80_columns() -> None:
    """Rich broke it wherever the width ran out: "= 0.0434 + 0 +" then "0.0434 + 0 = 0.0868"."""
    result = run_cli(
        "trace",
        "causal_multihead",
        "--cell",
        "tea,tea",
        "--stage",
        "output",
        "--width",
        "80",
        "--no-color",
    )
    assert result.exit_code == 0, result.stderr
    panel = result.stdout.split("every value row V (head 1)")[1].split("╰")[0]
    lines = [line.strip("│ ") for line in panel.splitlines()[1:] if line.strip()]
    assert lines[0] == "output of tea: the weights times the V rows, summed:"
    # the row's two entries, each on two lines: weights × V from the JSON trace, written here
    doc = json.loads(run_cli("trace", "causal_multihead", "-f", "json").stdout)
    w = doc["stages"]["softmax"]["data"][1][3]  # head 1, query tea
    V = doc["stages"]["V"]["data"][1]  # kv head 1

    def num(x: float) -> str:
        return str(int(x)) if x == int(x) else f"{x:.4f}"

    expected = []
    for col in (0, 1):
        terms = " + ".join(f"{num(a)}×{num(V[j][col])}" for j, a in enumerate(w))
        products = " + ".join(num(a * V[j][col]) for j, a in enumerate(w))
        total = sum(a * V[j][col] for j, a in enumerate(w))
        expected += [f"output[tea, {col}] = {terms}", f"= {products} = {num(total)}"]
    assert lines[1:] == expected
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
