"""What the views of ``attn decode`` and ``attn flash`` share: a label lookup, the note on a
replaced mask_value, a matrix under a title of its own, and the sections of a run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.rule import Rule
from rich.text import Text

from attn_cli.present.i18n import Lang
from attn_cli.present.options import RenderOptions
from attn_cli.present.render import listing, render_header, render_matrix
from attn_cli.present.text import pick_steps, pick_tables, safe

R = TypeVar("R")  # a run: a decode's, a batch's, a state decode's, a split-KV flash's

SENTINEL: dict[Lang, str] = {
    "en": "mask_value {v} replaced by −∞, as a KV cache and FlashAttention mask "
    "(attn trace shows what the sentinel lets through)",
    "zh": "mask_value {v} 已换成 −∞，与 KV 缓存和 FlashAttention 的遮盖方式相同"
    "（attn trace 会显示这个哨兵值漏过去的权重）",
}


def lookup(labels: dict[Lang, dict[str, str]], lang: Lang, key: str, **values: object) -> str:
    """The label ``key`` of ``labels`` in ``lang``, with ``{placeholders}`` filled in."""
    text = labels[lang][key]
    return text.format(**values) if values else text


def sentinel_note(sentinel: float | None, lang: Lang) -> list[Text]:
    """The note that the fixture's finite mask_value was replaced by −∞ (none if it was not)."""
    if sentinel is None:
        return []
    return [Text(SENTINEL[lang].format(v=f"{sentinel:g}"), style="yellow")]


def mark(ok: bool) -> str:
    """✓ for a check that passed, ✗ for one that failed."""
    return "✓" if ok else "✗"


def check_style(ok: bool) -> str:
    """A check's colour: green when it passed, bold red when it failed."""
    return "green" if ok else "bold red"


def shown_diff(diff: float, tolerance: float) -> Text:
    """A check's largest difference and its mark, in the check's colour."""
    ok = diff <= tolerance
    return Text(f"{diff:.3e} {mark(ok)}", style=check_style(ok))


def step_check(run: Any, k: int, labels: dict[Lang, dict[str, str]], lang: Lang) -> Text:
    """A decode step's self-check line: its row's largest difference from the reference."""
    step, diff = run.result.steps[k], run.diffs[k]
    ok = diff <= run.tolerance
    text = lookup(
        labels,
        lang,
        "check",
        token=repr(safe(run.label(step.index))),
        diff=f"{diff:.3e}",
        mark=mark(ok),
        tol=f"{run.tolerance:g}",
        stage=run.checked,
    )
    return Text(text, style=check_style(ok))


def prefill_check(run: Any, labels: dict[Lang, dict[str, str]], lang: Lang) -> Text:
    """A decode's self-check line for its prefill."""
    ok = run.prefill_diff <= run.tolerance
    diff = f"{run.prefill_diff:.3e}"
    text = lookup(labels, lang, "check_prefill", diff=diff, mark=mark(ok), stage=run.checked)
    return Text(text, style=check_style(ok))


def step_checks(
    run: Any,
    options: RenderOptions,
    labels: dict[Lang, dict[str, str]],
    heads: Sequence[str],
    cells: Callable[[int], list[Text | str]],
) -> Group:
    """A decode's checks: a row a step (the middle ones elided), its number, token and position,
    then ``cells(k)`` under the rest of ``heads``; the prefill's check line under the table."""
    lang = options.lang
    columns = [
        (lookup(labels, lang, h), "left" if n == 1 else "right") for n, h in enumerate(heads)
    ]
    steps = run.result.steps
    rows: list[list[Text | str]] = []
    for k in pick_steps(len(steps), options.full):
        if k is None:
            rows.append(["…"] * len(heads))
            continue
        s = steps[k]
        rows.append([str(k + 1), safe(run.label(s.index)), str(s.position), *cells(k)])
    table = listing(Text(lookup(labels, lang, "check_title"), style="bold"), columns, rows, True)
    return Group(Rule(style="cyan"), table, prefill_check(run, labels, lang))


def decode_opening(
    run: Any, labels: dict[Lang, dict[str, str]], lang: Lang
) -> list[RenderableType]:
    """The opening of a decode's overview: the configuration, the title, what the prefill
    covered, the number of steps, the note on a replaced mask_value, a blank line."""
    P = run.result.prefill
    tokens = ", ".join(safe(run.label(i)) for i in range(P))
    return [
        render_header(run.trace, lang),
        Rule(Text(lookup(labels, lang, "title"), style="bold cyan"), align="left", style="cyan"),
        Text(lookup(labels, lang, "overview", p=P, tokens=tokens)),
        Text(lookup(labels, lang, "steps", n=len(run.result.steps))),
        *sentinel_note(run.sentinel, lang),
        Text(""),
    ]


def titled_matrix(
    title: str,
    matrix: Any,
    rows: list[str],
    cols: list[str],
    axis: str,
    options: RenderOptions,
    none: Callable[[int, int], bool] | None = None,
) -> list[RenderableType]:
    """A matrix with its title above it, on a line of its own: a title never wraps narrow;
    ``none(i, j)``: no number in that cell (render_matrix)."""
    return [
        Text(title, style="bold"),
        render_matrix(
            matrix,
            row_labels=rows,
            col_labels=cols,
            row_axis=axis,
            title=None,
            options=options,
            spaced=True,
            none=none,
        ),
    ]


def count_steps(run: Any) -> int:
    """A run's number of steps, one section each (a decode's, a batch's)."""
    return len(run.result.steps)


@dataclass(frozen=True)
class Sections(Generic[R]):
    """A run's view in sections: its overview, a section per step, its checks. ``more`` is the
    key in ``labels`` of the line that stands for the steps elided past the table limit; the
    overview's and the checks' page titles are ``page_overview`` and ``page_checks``."""

    overview: Callable[[R, RenderOptions], RenderableType]
    step: Callable[[R, int, RenderOptions], RenderableType]
    checks: Callable[[R, RenderOptions], RenderableType]
    labels: dict[Lang, dict[str, str]]
    title: Callable[[R, int, Lang], str]  # a step's page title in step mode
    steps: Callable[[R], int] = count_steps
    more: str = "more_steps"

    def whole(self, run: R, options: RenderOptions | None = None) -> Group:
        """The whole view: the overview, every step (the middle ones elided), the checks."""
        from attn_cli.present.text import TABLE_EDGE

        o = options or RenderOptions()
        n = self.steps(run)
        parts: list[RenderableType] = [self.overview(run, o)]
        for k in pick_tables(n, o.full):
            if k is None:
                more = lookup(self.labels, o.lang, self.more, n=n - 2 * TABLE_EDGE)
                parts.append(Padding(Text(more, style="dim"), (0, 0, 1, 2)))
            else:
                parts.append(self.step(run, k, o))
        parts.append(self.checks(run, o))
        return Group(*parts)

    def pages(self, run: R, options: RenderOptions | None = None) -> Iterator[RenderableType]:
        """Step mode's pages, one renderable each: the overview, every step, the checks."""
        o = options or RenderOptions()
        yield self.overview(run, o)
        for k in range(self.steps(run)):
            yield self.step(run, k, o)
        yield self.checks(run, o)

    def titles(self, run: R, lang: Lang) -> list[str]:
        """Step mode's page titles, as ``pages``: the overview, every step, the checks."""
        steps = [self.title(run, k, lang) for k in range(self.steps(run))]
        first, last = (lookup(self.labels, lang, key) for key in ("page_overview", "page_checks"))
        return [first, *steps, last]
