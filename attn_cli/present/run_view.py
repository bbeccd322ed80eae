"""What the views of ``attn decode`` and ``attn flash`` share: a label lookup, the note on a
replaced mask_value, and a matrix under a title of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.text import Text

from attn_cli.present.i18n import Lang
from attn_cli.present.options import RenderOptions
from attn_cli.present.render import render_matrix

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


def run_sections(
    steps: int,
    options: RenderOptions,
    overview: Callable[[], RenderableType],
    step: Callable[[int], RenderableType],
    checks: Callable[[], RenderableType],
    more: Callable[[int], str],
) -> Group:
    """A decode's whole view: the overview, every step (the middle ones elided past the table
    limit, ``more(n)`` saying how many), the checks."""
    from attn_cli.present.text import TABLE_EDGE, TABLE_LIMIT, pick

    parts: list[RenderableType] = [overview()]
    for k in pick(steps, TABLE_LIMIT, TABLE_EDGE, options.full):
        if k is None:
            parts.append(Padding(Text(more(steps - 2 * TABLE_EDGE), style="dim"), (0, 0, 1, 2)))
        else:
            parts.append(step(k))
    parts.append(checks())
    return Group(*parts)


def run_pages(
    steps: int,
    overview: Callable[[], RenderableType],
    step: Callable[[int], RenderableType],
    checks: Callable[[], RenderableType],
) -> Iterator[RenderableType]:
    """Step mode's pages of a decode: the overview, every step, the checks."""
    yield overview()
    for k in range(steps):
        yield step(k)
    yield checks()
