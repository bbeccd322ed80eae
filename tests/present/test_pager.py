"""Step-mode pages at projector sizes, in this process: every screen of every stage at 80x24 and
120x40 keeps the stage title and the column headers of the table it shows, and scrolling from
the top to End shows every line of the page.

The reference is independent of the pager: the page as Rich prints it whole (plain text), where a
table is a header row, a rule of ``─`` under it, then rows down to a blank line.
"""

from __future__ import annotations

import io
from functools import cache

import pytest
from rich.console import Console

from attn_cli.api import trace_file
from attn_cli.core.pipeline import Trace
from attn_cli.present.options import RenderOptions
from attn_cli.present.pager import Deck, Line, State, frame, last_top, press, stage_index
from attn_cli.present.render import render_step_page
from attn_cli.present.step import on_key
from attn_cli.present.worked import parse_cell

SIZES = [(80, 24), (120, 40)]
CASES = {  # name: (fixture, --cell, --lang)
    "one head": ("the_cat_sat", None, "en"),
    "two heads, --cell": ("causal_multihead", "1,0", "en"),
    "chinese": ("causal_multihead", "1,0", "zh"),
}


@cache
def _trace(fixture: str) -> Trace:
    return trace_file(fixture, keep_all=True)


def deck(case: str) -> Deck:
    fixture, cell, lang = CASES[case]
    trace = _trace(fixture)
    ref = None if cell is None else parse_cell(cell, trace.query_labels, trace.key_labels)
    options = RenderOptions(explain=True, cell=ref, lang=lang)  # type: ignore[arg-type]
    return Deck(trace, options, Console(width=80, color_system=None, file=io.StringIO()))


def text(lines: list[Line]) -> list[str]:
    return ["".join(s.text for s in line).rstrip() for line in lines]


def whole_page(d: Deck, k: int, width: int) -> list[str]:
    """The page as Rich prints it in one piece: the reference."""
    file = io.StringIO()
    Console(width=width, color_system=None, file=file).print(
        render_step_page(d.trace, k, d.options)
    )
    return [line.rstrip() for line in file.getvalue().splitlines()]


def is_rule(line: str) -> bool:
    return bool(line.strip()) and set(line.strip()) == {"─"}


def tables(page: list[str]) -> tuple[set[str], set[str]]:
    """The header rows and the data rows of the page's tables (Rich's SIMPLE_HEAD layout)."""
    headers: set[str] = set()
    rows: set[str] = set()
    for n, line in enumerate(page):
        if is_rule(line) and n > 0 and not page[n - 1].startswith("│"):  # not in a panel
            headers.add(page[n - 1])
            for row in page[n + 1 :]:
                if not row.strip():
                    break
                rows.add(row)
    return headers, rows


def screens(d: Deck, k: int, width: int, height: int) -> list[list[str]]:
    """Every screen of stage ``k`` from the top, one line down at a time, to End."""
    state = State(k)
    shown = [text(frame(d, state, width, height))]
    while True:
        after = press(d, state, "down", width, height)
        if after == state:
            return shown
        state = after
        shown.append(text(frame(d, state, width, height)))


@pytest.mark.parametrize(("width", "height"), SIZES)
@pytest.mark.parametrize("case", CASES)
def test_every_screen_keeps_the_title_and_the_column_headers(
    case: str, width: int, height: int
) -> None:
    d = deck(case)
    n = len(d.names)
    for k, name in enumerate(d.names):
        page = whole_page(d, k, width)
        headers, rows = tables(page)
        assert headers and rows, f"stage {name} shows no table"
        for screen in screens(d, k, width, height):
            assert len(screen) == height
            assert screen[0] == page[0]  # "stage 7 of 11  masked": pinned
            assert name in screen[0] and str(n) in screen[0]
            assert page[-1].split()[0] in screen[-1]  # the status line: where we are
            for i, line in enumerate(screen):
                if line in rows:  # a row: its header row and rule above, no blank between
                    marks = [j for j in range(1, i) if is_rule(screen[j]) or not screen[j].strip()]
                    j = marks[-1] if marks else 0
                    assert is_rule(screen[j]) and screen[j - 1] in headers, (name, screen)


@pytest.mark.parametrize(("width", "height"), SIZES)
@pytest.mark.parametrize("case", CASES)
def test_scrolling_to_the_end_shows_every_line(case: str, width: int, height: int) -> None:
    d = deck(case)
    for k in range(len(d.names)):
        page = whole_page(d, k, width)
        body = [line for line in page[1:-1] if line.strip()]  # the key hint gives way
        seen = {line for screen in screens(d, k, width, height) for line in screen}
        assert not [line for line in body if line not in seen]
        end = text(frame(d, press(d, State(k), "end", width, height), width, height))
        assert body[-1] in end  # End reveals the last row
        assert [line for line in end[:-1] if line.strip()][-1] == body[-1]  # nothing under it


def test_a_page_that_fits_does_not_scroll() -> None:
    d = deck("one head")
    k = d.names.index("Q")
    assert last_top(d.page(k, 120), 40) == 0
    assert press(d, State(k), "down", 120, 40) == State(k)
    assert "↓" not in text(frame(d, State(k), 120, 40))[-1]


def test_the_pinned_header_is_the_table_scrolled_through() -> None:
    d = deck("two heads, --cell")  # tables "head 0" then "head 1", 4 rows each
    k = d.names.index("masked")
    state = State(k)
    for _ in range(5):
        state = press(d, state, "down", 80, 24)
    screen = text(frame(d, state, 80, 24))
    assert screen[1] == "head 0"
    assert screen[2].split() == ["query", "I", "like", "green", "tea"]
    assert is_rule(screen[3])
    assert screen[4].split()[0] == "green"  # I and like scrolled away under the header


MOVES = [  # keys typed from stage 1 of causal_multihead's 11; the stage shown after them
    ([b"\r"], 2),
    ([b"\r", b"b"], 1),
    ([b"b"], 1),  # holds at the first
    ([b"7"], 7),  # 7 cannot start 70: at once
    ([b"1", b"1"], 11),
    ([b"1", b"\r"], 1),
    ([b"1", b"0"], 10),  # 10 cannot start 100
    ([b"g", b"s", b"o", b"f", b"t", b"\r"], 8),  # softmax
    ([b"g", b"V", b"\r"], 4),
    ([b"g", b"c", b"\r"], 10),  # concat
    ([b"g", b"z", b"\r"], 1),  # no such stage: a note, and stays
    ([b"g", b"s", b"\x1b"], 1),  # Esc cancels
    ([b"8", b"\x1b[6~"], 8),  # PgDn scrolls a page that does not fit
    ([b"8", b"\x1b[F", b"\x1b[6~"], 9),  # End, then PgDn (a clicker): the next stage
    ([b"1", b"1", b"\r"], 11),  # holds at the last
]


@pytest.mark.parametrize(("keys", "expected"), MOVES)
def test_keys_move_between_stages(keys: list[bytes], expected: int) -> None:
    d = deck("two heads, --cell")
    state: State | None = State()
    for key in keys:
        assert state is not None
        state = on_key(d, state, key, 80, 24)
    assert state is not None
    assert state.k + 1 == expected


def test_page_up_at_the_top_goes_to_the_bottom_of_the_stage_before() -> None:
    d = deck("two heads, --cell")
    state = press(d, State(5), "pgup", 80, 24)
    assert state == State(4, top=last_top(d.page(4, 80), 24))
    assert state.top > 0


def test_a_wrong_stage_says_which_there_are() -> None:
    d = deck("two heads, --cell")
    state: State | None = State()
    for key in (b"g", b"z", b"\r"):
        assert state is not None
        state = on_key(d, state, key, 80, 24)
    assert state is not None
    assert "no stage 'z': 1–11 or one of X, Q, K" in text(frame(d, state, 80, 24))[-1]


def test_help_lists_the_keys_and_any_key_closes_it() -> None:
    d = deck("two heads, --cell")
    state = on_key(d, State(2), b"?", 80, 24)
    assert state is not None and state.help
    screen = "\n".join(text(frame(d, state, 80, 24)))
    for keys in ("PgDn  PgUp", "Home  End", "q  Esc  Ctrl-C", "g "):
        assert keys in screen
    assert on_key(d, state, b"x", 80, 24) == State(2)
    assert on_key(d, State(2), b"q", 80, 24) is None


def test_a_resize_keeps_the_place_on_the_page() -> None:
    d = deck("two heads, --cell")
    state = press(d, State(7), "end", 80, 24)
    tall = text(frame(d, state, 80, 60))  # top past what 60 rows need: shows the end
    assert tall[0].startswith("stage 8 of 11") and len(tall) == 60


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("1", 0),
        ("11", 10),
        ("12", None),
        ("0", None),
        ("softmax", 7),
        ("SOFT", 7),
        ("x", 0),
        ("s", 4),
        ("", None),
    ],
)
def test_stage_index(typed: str, expected: int | None) -> None:
    names = [
        "X",
        "Q",
        "K",
        "V",
        "scores",
        "scaled",
        "masked",
        "softmax",
        "output",
        "concat",
        "projected",
    ]
    assert stage_index(typed, names) == expected
