"""``attn decode``: a causal fixture generated one token at a time against a KV cache."""

from typing import Annotated, Any, Optional

import typer

from attn_cli.cli.options import (
    PRECISION,
    ColorOption,
    FixtureArgument,
    LangOption,
    MaxElementsOption,
    MaxMemoryOption,
    OutputOption,
    PrecisionOption,
    QuietOption,
    WidthOption,
    memory_budget,
)
from attn_cli.cli.runs import (
    ExplainOption,
    FullOption,
    RunFormat,
    RunFormatOption,
    RunOutput,
    RunView,
    StepOption,
    refuse_step,
    show_run,
)
from attn_cli.core.limits import DEFAULT_MAX_ELEMENTS

PrefillOption = Annotated[
    int,
    typer.Option(
        "--prefill",
        "-p",
        min=1,
        metavar="P",
        help="Tokens computed at once before decoding starts (1 to the fixture's length).",
    ),
]
PagedFlag = Annotated[
    bool,
    typer.Option(
        "--paged",
        help="Keep the cache in pages of a pool, read through a block table (PagedAttention), "
        "each step checked against the contiguous cache.",
    ),
]
BlockSizeOption = Annotated[
    int | None,
    typer.Option(
        "--block-size",
        min=1,
        metavar="B",
        help="Tokens a page with --paged (default: a third of the sequence, 2 to 16).",
    ),
]
PagesOption = Annotated[
    int | None,
    typer.Option(
        "--pages",
        min=1,
        metavar="N",
        help="Pages in the pool with --paged (default: as many as the sequence holds at once).",
    ),
]
MoreFixtures = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Argument(
        help="With --batch: more fixtures, each one sequence of the batch.",
        show_default=False,
        metavar="[FIXTURE...]",
    ),
]
BatchFlag = Annotated[
    bool,
    typer.Option(
        "--batch",
        help="Decode the fixtures as one continuous batch: packed query rows, cu_seqlens, one "
        "block-diagonal mask; each sequence checked against its own decode.",
    ),
]
ArriveOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--arrive",
        metavar="S1,S2,...",
        help="With --batch: the step at which each fixture joins (default: all at step 0).",
    ),
]
ChunkOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--chunk",
        min=1,
        metavar="C",
        help="With --batch: prefill a joining prompt C rows a step (default: all at once).",
    ),
]
SharePrefixFlag = Annotated[
    bool,
    typer.Option(
        "--share-prefix",
        help="With --batch --paged: a joining sequence shares the whole pages that already hold "
        "its prompt's keys and values (reference counts), copying a shared page before writing.",
    ),
]
BATCH_VIEW = RunView(
    "attn_cli.present.batch_view",
    "batch_pages",
    "batch_titles",
    "render_batch",
    "batch_dumps",
    "attn_cli.present.html_batch:batch_page",
)
DECODE_VIEW = RunView(
    "attn_cli.present.decode_view",
    "decode_pages",
    "decode_titles",
    "render_decode",
    "decode_dumps",
    "attn_cli.present.html_decode:decode_page",
)
STATE_VIEW = RunView(  # linear attention: a recurrent state in place of the cache
    "attn_cli.present.state_view",
    "state_pages",
    "state_titles",
    "render_state_decode",
    "state_dumps",
    "attn_cli.present.html_state:state_page",
)


def decode(
    fixture: FixtureArgument = None,
    more: MoreFixtures = None,
    prefill: PrefillOption = 1,
    fmt: RunFormatOption = RunFormat.table,
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
    paged: PagedFlag = False,
    block_size: BlockSizeOption = None,
    pages: PagesOption = None,
    batch: BatchFlag = False,
    arrive: ArriveOption = None,
    chunk: ChunkOption = None,
    share_prefix: SharePrefixFlag = False,
) -> None:
    """Decode a causal fixture token by token against a KV cache, checking every step.

    After a prefill of the first P tokens, each step shows the new token's query, the cache as
    it is (which position each slot holds, K and V), the scores, softmax and output, and the
    largest difference from the full attention's row (an error above 1e-12 times the rows'
    largest value, at least 1e-12). Then the cache's cost in bytes, for this model, MHA and
    MQA. Linear attention decodes with its recurrent state instead: the state after every
    token, its bytes (constant in the length) beside the KV cache of softmax attention with
    the same heads, each step checked against the chunked form.

    Examples:

      attn decode causal_multihead                   # every step

      attn decode mistral_sliding_window --prefill 2 --explain  # a ring buffer

      attn decode gated_deltanet                     # a state, no cache

      attn decode llama_rope_gqa --step              # one step at a time (q quits)

      attn decode mistral_sliding_window --paged --block-size 2  # pages, a block table

      attn decode llama_rope_gqa llama_rope_interleaved --batch --arrive 0,2  # continuous batching

      attn decode llama_rope_gqa llama_rope_gqa --batch --arrive 0,1 --paged --share-prefix

      attn examples                                  # every variant to decode

      attn decode llama_rope_gqa -f json -o dec.json # every number, for scripts
    """
    from attn_cli.errors import UsageError

    refuse_step(step, fmt, output)
    refuse_paging(paged, block_size, pages)
    budget = memory_budget(max_memory)
    out = RunOutput(fmt, output, precision, full, width, color, explain, lang, quiet, step)
    if share_prefix and not (batch and paged):
        raise UsageError(
            "",
            "share-prefix",
            "shares the pages of a paged batch",
            "--batch and --paged beside it",
            option="share-prefix",
        )
    if batch or more or arrive is not None or chunk is not None:
        fixtures = [fixture or "the_cat_sat", *(more or [])]
        pool = (block_size, pages) if paged else None
        run_batch_cli(
            fixtures, batch, (pool, share_prefix), arrive, prefill, chunk, out, max_elements, budget
        )
        return
    every = full or step or fmt is RunFormat.json  # every step shown: every state kept
    pool = (block_size, pages) if paged else None
    _decode_one(fixture, prefill, (out, fmt), every, (max_elements, budget), pool)


def _decode_one(
    fixture: str | None,
    prefill: int,
    shown: tuple[RunOutput, RunFormat],
    every: bool,
    limits: tuple[int, int | None],
    pool: tuple[int | None, int | None] | None,
) -> None:
    """One fixture's decode, shown; its failure raised after the tables (every step is kept
    when ``every``, else the table's edges)."""
    from attn_cli.check.state_runs import StateRun, run_decode_any, state_failure
    from attn_cli.present.text import TABLE_EDGE, TABLE_LIMIT

    run = run_decode_any(
        fixture,
        prefill,
        edges=None if every else (TABLE_LIMIT, TABLE_EDGE),
        max_elements=limits[0],
        max_memory=limits[1],
        paged=pool,
    )
    out, fmt = shown
    refuse_page(run, fmt)
    failure = state_failure(run)
    show_run(run, STATE_VIEW if isinstance(run, StateRun) else DECODE_VIEW, out, failure)
    if failure is not None:
        raise failure


def refuse_page(run: Any, fmt: RunFormat) -> None:
    """-f html draws the KV cache's steps (one softmax map, or differential attention's two and
    their difference) and a recurrent state's; a decode with rows the page does not know (a
    third map) is refused in one line rather than drawn with derivations that are not its own."""
    from attn_cli.check.state_runs import StateRun

    if fmt is not RunFormat.html or isinstance(run, StateRun):
        return
    from attn_cli.errors import UsageError
    from attn_cli.present.html_maps import MAP_ROWS  # the page's: imported for pages only

    steps = run.result.steps
    unknown = [n for s in steps[:1] for n in s.rows if n not in MAP_ROWS]
    if unknown:
        raise UsageError(
            run.trace.inputs.source,
            "--format",
            f"html: a decode of the rows {', '.join(unknown)} has no page yet",
            "table, plain or json (they show every step of it)",
        )


def refuse_paging(paged: bool, block_size: int | None, pages: int | None) -> None:
    """--block-size and --pages size the pool of --paged: alone they are refused in one line."""
    from attn_cli.errors import UsageError

    given = [name for name, x in (("block-size", block_size), ("pages", pages)) if x is not None]
    if given and not paged:
        raise UsageError(
            "", given[0], "sizes the pool of a paged cache", "--paged beside it", option=given[0]
        )


def run_batch_cli(
    fixtures: list[str],
    batch: bool,
    paged: tuple[tuple[int | None, int | None] | None, bool],
    arrive: str | None,
    prefill: int,
    chunk: int | None,
    out: RunOutput,
    max_elements: int,
    budget: int | None,
) -> None:
    """``--batch``: the fixtures as one continuous batch (check/batch_runs.py)."""
    from attn_cli.check.batch_runs import (
        MAX_SEQUENCES,
        batch_failure,
        parse_arrive,
        run_batch,
    )
    from attn_cli.errors import UsageError

    if not batch:
        what = "more than one fixture" if len(fixtures) > 1 else "--arrive or --chunk"
        raise UsageError(
            "",
            "batch",
            f"{what} given without --batch",
            "--batch to decode them as one batch",
            option="batch",
        )
    if len(fixtures) > MAX_SEQUENCES:
        raise UsageError(
            "",
            "batch",
            f"{len(fixtures):,} fixtures",
            f"1 to {MAX_SEQUENCES} sequences in a batch",
            option="batch",
        )
    steps = parse_arrive(arrive, len(fixtures))
    pool, share = paged
    run = run_batch(
        list(fixtures),
        steps,
        prefill,
        chunk,
        max_elements=max_elements,
        max_memory=budget,
        paged=pool,
        share=share,
    )
    failure = batch_failure(run)
    show_run(run, BATCH_VIEW, out, failure)
    if failure is not None:
        raise failure
