"""Step-mode pages that fit any terminal: a pinned title, a scrolling body, sticky table headers.

Pure layout and key handling, no terminal I/O (``step.py`` reads keys and draws). A page from
:func:`render_step_page` is rendered once per width into lines: its first part is the title,
pinned at the top; its last part (the key hint) gives way to the pager's status line; the rest is
the body, shown ``height - title - 1`` lines at a time. When the top of a table scrolls away
while its rows are still shown, the table's title and column-header row are pinned under the
page title, as a spreadsheet freezes its header row.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from attn_cli.present.i18n import Lang, label
from attn_cli.present.options import RenderOptions
from attn_cli.present.render import Matrix, render_step_page, step_names

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace

Line = list[Segment]
Action = Literal[
    "next", "back", "down", "up", "pgdn", "pgup", "home", "end", "goto", "help", "quit"
]

# The pager's own words; they belong in i18n.LABELS beside step_keys (asked of the lead).
WORDS: dict[Lang, dict[str, str]] = {
    "en": {
        "help": "? help",
        "goto": "go to stage: {typed}_   (1–{n} or a name, then Enter; Esc cancels)",
        "no_stage": "no stage {typed!r}: 1–{n} or one of {names}",
        "help_title": "step mode: keys",
        "help_close": "any key closes this help",
    },
    "zh": {
        "help": "? 帮助",
        "goto": "跳到第几步：{typed}_   （1–{n} 或步骤名，回车确认；Esc 取消）",
        "no_stage": "没有步骤 {typed!r}：1–{n} 或 {names}",
        "help_title": "逐步模式：按键",
        "help_close": "按任意键关闭帮助",
    },
}
HELP: dict[Lang, tuple[tuple[str, str], ...]] = {
    "en": (
        ("Enter  Space  →  n", "next stage"),
        ("←  b  Backspace", "previous stage"),
        ("↓ ↑  j k", "scroll one line"),
        ("PgDn  PgUp", "scroll one screen; past the end, the next (previous) stage"),
        ("Home  End", "top / bottom of this stage"),
        ("1 … 9", "go to that stage (two digits: type both)"),
        ("g", "go to a stage by number or name (g soft Enter: softmax)"),
        ("?", "this help"),
        ("q  Esc  Ctrl-C", "quit"),
    ),
    "zh": (
        ("回车  空格  →  n", "下一步"),
        ("←  b  退格", "上一步"),
        ("↓ ↑  j k", "滚动一行"),
        ("PgDn  PgUp", "滚动一屏；到头后进入下一步（上一步）"),
        ("Home  End", "本步的顶部 / 底部"),
        ("1 … 9", "跳到该步（两位数：连续输入）"),
        ("g", "按编号或名称跳转（g soft 回车：softmax）"),
        ("?", "本帮助"),
        ("q  Esc  Ctrl-C", "退出"),
    ),
}


@dataclass(frozen=True)
class Sticky:
    """A table in the body: lines ``start:end`` are its title and header, rows up to ``stop``."""

    start: int
    end: int
    stop: int


@dataclass(frozen=True)
class Page:
    """One step page rendered at one width: pinned title lines, body lines, the tables in it."""

    title: tuple[Line, ...]
    body: tuple[Line, ...]
    stickies: tuple[Sticky, ...]  # in order, not overlapping


@dataclass(frozen=True)
class View:
    """What a screen shows of a page: the pinned table header, then ``body[first:last]``."""

    pinned: Sticky | None
    first: int
    last: int


@dataclass(frozen=True)
class State:
    """Where the pager is: the stage, the first body line shown, and any prompt or help."""

    k: int = 0
    top: int = 0
    typed: str | None = None  # what was typed after `g` or a digit, until Enter
    help: bool = False
    note: str = ""  # a message shown once in the status line


# ---------------------------------------------------------------------------------------------
# Laying out a page


def _leaves(renderable: RenderableType) -> Iterator[RenderableType]:
    """The parts of nested Groups in order; a Group renders as its parts one under another."""
    if isinstance(renderable, Group):
        for part in renderable.renderables:
            yield from _leaves(part)
    else:
        yield renderable


def _plain(line: Line) -> str:
    return "".join(s.text for s in line)


def _sticky(lines: list[Line], at: int) -> Sticky | None:
    """A matrix table's title and header: the lines down to the rule under the header row."""
    texts = [_plain(line).strip() for line in lines]
    rule = next((n for n, t in enumerate(texts) if t and set(t) == {"─"}), None)
    rows = [n for n, t in enumerate(texts) if t]
    if rule is None or rows[-1] <= rule:
        return None
    return Sticky(at, at + rule + 1, at + rows[-1] + 1)


def lay_out(page: Group, console: Console, width: int) -> Page:
    """A step page as lines ``width`` cells wide: first part the title; the last part dropped."""
    options = console.options.update(width=width, height=None)
    parts = list(_leaves(page))
    title = console.render_lines(parts[0], options, pad=True)
    body: list[Line] = []
    stickies: list[Sticky] = []
    for part in parts[1:-1]:  # the last part is the key hint; the status line replaces it
        lines = console.render_lines(part, options, pad=True)
        found = _sticky(lines, len(body)) if isinstance(part, Matrix) else None
        if found is not None:
            stickies.append(found)
        body.extend(lines)
    while body and not _plain(body[-1]).strip():  # End shows the last line at the bottom
        body.pop()
    return Page(tuple(title), tuple(body), tuple(stickies))


def view(page: Page, height: int, top: int) -> View:
    """The body lines a screen of ``height`` lines shows from ``top``, with the table header
    pinned when the top of a table has scrolled away and its rows have not."""
    room = max(1, height - len(page.title) - 1)  # the status line takes one
    s = _sticky_at(page, top)
    if s is not None and s.start < top < s.stop and s.end - s.start < room:
        first = max(top, s.end)
        return View(s, first, min(len(page.body), first + room - (s.end - s.start)))
    return View(None, top, min(len(page.body), top + room))


def _sticky_at(page: Page, top: int) -> Sticky | None:
    """The last table that starts at or above ``top``."""
    n = bisect.bisect_right([s.start for s in page.stickies], top)
    return page.stickies[n - 1] if n else None


def _skipped(page: Page, top: int) -> Sticky | None:
    """The table whose header ``top`` is inside: those tops show what its start shows."""
    s = _sticky_at(page, top)
    return s if s is not None and s.start < top <= s.end else None


def last_top(page: Page, height: int) -> int:
    """The first top from which the last body line is on screen (End goes there)."""
    top = 0
    while view(page, height, top).last < len(page.body):
        top += 1
    return top


def scroll(page: Page, height: int, top: int, by: int) -> int:
    """``top`` moved ``by`` lines (a header's own lines count as none), kept on the page."""
    end = last_top(page, height)
    for _ in range(abs(by)):
        if (by > 0 and top >= end) or (by < 0 and top <= 0):
            break
        top += 1 if by > 0 else -1
        s = _skipped(page, top)
        if s is not None:
            top = s.end + 1 if by > 0 else s.start
    return max(0, min(top, end))


# ---------------------------------------------------------------------------------------------
# Keys


class Pages:
    """Step-mode pages by number, each rendered by ``render(k)`` (a Group: title first, key hint
    last) and laid out for a width when first shown; ``names`` are what go-to matches."""

    def __init__(
        self, names: list[str], render: Callable[[int], Group], lang: Lang, console: Console
    ) -> None:
        self.names = names
        self.render = render
        self.lang = lang
        self.console = console
        self._pages: dict[tuple[int, int], Page] = {}

    def page(self, k: int, width: int) -> Page:
        """Page ``k`` (0-based) at ``width``."""
        if (k, width) not in self._pages:
            self._pages[k, width] = lay_out(self.render(k), self.console, width)
        return self._pages[k, width]


class Deck(Pages):
    """The pages of a trace in step mode: one explained stage each."""

    def __init__(self, trace: Trace, options: RenderOptions, console: Console) -> None:
        names = step_names(trace, options)
        super().__init__(names, self._render, options.lang, console)
        self.trace = trace
        self.options = options

    def _render(self, k: int) -> Group:
        return render_step_page(self.trace, k, self.options)


def press(deck: Pages, state: State, action: Action, width: int, height: int) -> State:
    """The state after ``action``, on a screen ``width`` x ``height``."""
    k, top, n = state.k, state.top, len(deck.names)
    page = deck.page(k, width)
    screen = max(1, height - len(page.title) - 2)  # a screen less one line of overlap
    if action == "next":
        return State(k + 1) if k < n - 1 else state
    if action == "back":
        return State(k - 1) if k > 0 else state
    if action in ("down", "up"):
        return replace(state, top=scroll(page, height, top, 1 if action == "down" else -1))
    if action == "pgdn":
        if top >= last_top(page, height) and k < n - 1:
            return State(k + 1)  # a presenter's clicker sends PgDn: on to the next stage
        return replace(state, top=scroll(page, height, top, screen))
    if action == "pgup":
        if top <= 0 and k > 0:  # back to the previous stage, at its bottom
            return State(k - 1, top=last_top(deck.page(k - 1, width), height))
        return replace(state, top=scroll(page, height, top, -screen))
    if action in ("home", "end"):
        return replace(state, top=0 if action == "home" else last_top(page, height))
    if action == "goto":
        return replace(state, typed="")
    if action == "help":
        return replace(state, help=True)
    return state


def type_key(deck: Pages, state: State, key: str) -> State:
    """A key typed at the go-to prompt: a character, Backspace, Enter or Esc."""
    typed = state.typed or ""
    if key == "\x1b":
        return replace(state, typed=None)
    if key in ("\x7f", "\b"):
        return replace(state, typed=typed[:-1])
    if key in ("\r", "\n"):
        return go_to(deck, state, typed)
    if len(key) != 1 or not key.isprintable():
        return state
    typed += key
    if typed.isdigit() and int(typed) * 10 > len(deck.names):  # no longer number starts so
        return go_to(deck, state, typed)
    return replace(state, typed=typed)


def go_to(deck: Pages, state: State, typed: str) -> State:
    """Stage ``typed`` (a number from 1, or a name or the start of one), or a note why not."""
    k = stage_index(typed, deck.names)
    if k is not None:
        return State(k)
    words, n = WORDS[deck.lang], len(deck.names)
    note = words["no_stage"].format(typed=typed, n=n, names=", ".join(deck.names))
    return replace(state, typed=None, note=note)


def stage_index(typed: str, names: list[str]) -> int | None:
    """The 0-based stage that ``typed`` names: ``3``, ``softmax``, ``Soft``; None if none."""
    t = typed.strip()
    if t.isdigit():
        return int(t) - 1 if 1 <= int(t) <= len(names) else None
    if not t:
        return None
    for found in (
        [n for n, s in enumerate(names) if s == t],
        [n for n, s in enumerate(names) if s.lower() == t.lower()],
        [n for n, s in enumerate(names) if s.lower().startswith(t.lower())],
    ):
        if found:
            return found[0]
    return None


# ---------------------------------------------------------------------------------------------
# The screen


def frame(deck: Pages, state: State, width: int, height: int) -> list[Line]:
    """The ``height`` lines of the screen for ``state``: title, pinned header, body, status."""
    console, lang = deck.console, deck.lang
    options = console.options.update(width=width, height=None)
    if state.help:
        return _help(console, lang, width)
    page = deck.page(state.k, width)
    state = replace(state, top=min(state.top, last_top(page, height)))  # after a resize
    v = view(page, height, state.top)
    lines = list(page.title)
    if v.pinned is not None:
        lines += page.body[v.pinned.start : v.pinned.end]
    lines += page.body[v.first : v.last]
    lines += [[] for _ in range(height - 1 - len(lines))]
    status = _status(deck, state, page, v, (width, height))
    lines += console.render_lines(status, options, pad=True)[:1]
    return lines


def _status(deck: Pages, state: State, page: Page, v: View, size: tuple[int, int]) -> Text:
    """The bottom line: where we are, how far scrolled, the keys; or the prompt or a note.
    The keys are shortened to fit the width, so that the one that quits always shows."""
    (width, height), lang, n = size, deck.lang, len(deck.names)
    words = WORDS[lang]
    # numbers padded to their largest width: the bar keeps its place from page to page
    position = label(lang, "step_position", k=f"{state.k + 1:>{len(str(n))}}", n=n)
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(position, style="bold reverse")
    text.append(" ")
    if state.typed is not None:
        return text.append(words["goto"].format(typed=state.typed, n=n), style="bold")
    if state.note:
        return text.append(state.note, style="bold red")
    if last_top(page, height) > 0:
        arrows = ("↑" if state.top > 0 else " ") + ("↓" if v.last < len(page.body) else " ")
        w = len(str(len(page.body)))
        text.append(f"{arrows} {v.first + 1:>{w}}–{v.last:>{w}}/{len(page.body)}", style="bold")
        text.append(" · ")
    keys = "step_last" if state.k == n - 1 else "step_keys"
    short = label(lang, keys + "_short")
    quit_key = short.rsplit(" · ", 1)[-1]  # "q quit": the one that must show
    hints = [
        words["help"] + " · " + label(lang, keys),
        words["help"] + " · " + short,
        short,
        quit_key,
    ]
    room = width - text.cell_len
    text.append(next((h for h in hints if cell_len(h) <= room), hints[-1]), style="dim")
    return text


def _help(console: Console, lang: Lang, width: int) -> list[Line]:
    """The help screen: every key and what it does."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 3))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for keys, meaning in HELP[lang]:
        grid.add_row(keys, meaning)
    words = WORDS[lang]
    parts = Group(
        Text(words["help_title"], style=Style(bold=True, reverse=True)),
        Text(""),
        grid,
        Text(""),
        Text(words["help_close"], style="dim"),
    )
    return console.render_lines(parts, console.options.update(width=width, height=None), pad=True)
