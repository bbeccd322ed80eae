"""``attn decode``: a causal fixture generated one token at a time against a KV cache."""

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from attn_cli.cli.options import (
    NON_TERMINAL_WIDTH,
    PRECISION,
    ColorOption,
    FixtureArgument,
    Format,
    Lang,
    LangOption,
    MaxElementsOption,
    MaxMemoryOption,
    OutputOption,
    PrecisionOption,
    QuietOption,
    WidthOption,
    parse_size,
    plain_wanted,
)
from attn_cli.cli.output import console, emit, plain_text
from attn_cli.core.limits import DEFAULT_MAX_ELEMENTS
from attn_cli.errors import UsageError

if TYPE_CHECKING:
    from attn_cli.present.options import RenderOptions

PrefillOption = Annotated[
    int,
    typer.Option(
        "--prefill", "-p", min=1, metavar="P",
        help="Tokens computed at once before decoding starts (1 to the fixture's length).",
    ),
]  # fmt: skip
FormatOption = Annotated[
    Format,
    typer.Option("--format", "-f", help="table (Rich), plain (no colour) or json (every step)."),
]
FullOption = Annotated[bool, typer.Option(help="Show every step, row and column; no elision.")]
ExplainOption = Annotated[
    bool, typer.Option("--explain", help="Explain every quantity: the query, the cache, ...")
]
StepOption = Annotated[
    bool,
    typer.Option(
        "--step", help="One step at a time, explained: Enter/Space/→ next, ←/b back, q quit."
    ),
]


def decode(
    fixture: FixtureArgument = None,
    prefill: PrefillOption = 1,
    fmt: FormatOption = Format.table,
    output: OutputOption = None,
    precision: PrecisionOption = PRECISION,
    full: FullOption = False,
    width: WidthOption = None,
    color: ColorOption = None,
    explain: ExplainOption = False,
    lang: LangOption = None,
    max_elements: MaxElementsOption = DEFAULT_MAX_ELEMENTS,
    max_memory: MaxMemoryOption = None,
    quiet: QuietOption = False,
    step: StepOption = False,
) -> None:
    """Decode a causal fixture token by token against a KV cache, checking every step.

    After a prefill of the first P tokens, each step shows the new token's query, the cache as
    it is (which position each slot holds, K and V), the scores, softmax and output, and the
    largest difference from the full `attn trace` (an error above 1e-12). Then the cache's
    cost in bytes, for this model, MHA and MQA.

    Examples:

      attn decode causal_multihead                   # every step

      attn decode gptoss_sinks --prefill 2 --explain # RoPE, GQA, a ring buffer, sinks

      attn decode gemma2_softcap --step              # one step at a time (q quits)

      attn decode llama_rope_gqa -f json -o dec.json # every number, for scripts
    """
    from attn_cli.check.grade_decode import decode_failure, run_decode

    refuse_step(step, fmt, output)
    budget = None if max_memory is None else parse_size(max_memory)
    run = run_decode(fixture, prefill, max_elements=max_elements, max_memory=budget)
    if step:
        from attn_cli.present.decode_view import decode_pages, decode_titles

        options = render_options(precision, full, True, lang)
        code = step_through(decode_pages(run, options), decode_titles(run, options.lang),
                            options, fmt, width, color)  # fmt: skip
        failure = decode_failure(run)
        if failure is not None:
            raise failure
        raise typer.Exit(code)
    if fmt is Format.json:
        from attn_cli.io.decode_json import decode_dumps

        emit(decode_dumps(run), output, quiet=quiet)
    else:
        from attn_cli.present.decode_view import render_decode

        options = render_options(precision, full, explain, lang)
        show(render_decode(run, options), fmt, output, width, color, full, quiet)
    failure = decode_failure(run)
    if failure is not None:
        raise failure


def refuse_step(step: bool, fmt: Format, output: Optional[Path]) -> None:  # noqa: UP045
    """--step pages through the terminal: refused, as attn trace does, with -o or --format json."""
    if step and (output is not None or fmt is Format.json):
        raise UsageError("", "--step", "works only in the terminal", "no --format json/-o")


def step_through(
    pages: Iterable[Any],
    titles: Sequence[str],
    options: "RenderOptions",
    fmt: Format,
    width: Optional[int],  # noqa: UP045
    color: Optional[bool],  # noqa: UP045
) -> int:
    """Page through ``pages`` in attn trace's step-mode pager; the exit code."""
    from attn_cli.present.step import run_pages

    plain = plain_wanted(fmt, color)
    out = console(width, plain=plain, color=False if plain else color)
    return run_pages(pages, titles, options.lang, out)


def render_options(
    precision: int,
    full: bool,
    explain: bool,
    lang: Optional[Lang],  # noqa: UP045
) -> "RenderOptions":
    """Render options with the language resolved (LANG/LC_ALL when --lang is not given)."""
    import os

    from attn_cli.present.i18n import default_lang
    from attn_cli.present.options import RenderOptions

    language = default_lang(os.environ) if lang is None else lang.value
    return RenderOptions(precision, None, full, explain=explain, lang=language)


def show(
    renderable: Any,
    fmt: Format,
    output: Optional[Path],  # noqa: UP045
    width: Optional[int],  # noqa: UP045
    color: Optional[bool],  # noqa: UP045
    full: bool,
    quiet: bool,
) -> None:
    """Tables as plain text (a file, a pipe, --format plain) or coloured on the terminal."""
    if output is not None or plain_wanted(fmt, color):
        if width is None and (output is not None or not sys.stdout.isatty()):
            width = NON_TERMINAL_WIDTH
        emit(plain_text(renderable, width, crop=not full), output, quiet=quiet)
        return
    console(width, plain=False, color=color).print(renderable, crop=not full)
