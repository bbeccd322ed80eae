"""``attn flash``: the FlashAttention-2 forward of a fixture, tile by tile."""

from typing import Annotated, Optional

import typer

from attn_cli.cli.options import (
    PRECISION,
    ColorOption,
    Dtype,
    DtypeOption,
    FixtureArgument,
    LangOption,
    MaxElementsOption,
    MaxMemoryOption,
    OutputOption,
    PrecisionOption,
    QuietOption,
    WidthOption,
    memory_budget,
    shown,
)
from attn_cli.cli.output import note
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
from attn_cli.errors import UsageError

MAX_TILES = 64  # as check/runs.py's default
FLASH_VIEW = RunView(
    "attn_cli.present.flash_view",
    "flash_pages",
    "flash_titles",
    "render_flash",
    "flash_dumps",
    "attn_cli.present.html_flash:flash_page",
)

BlockQOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--block-q",
        min=1,
        metavar="N",
        show_default=False,
        help="Query rows per tile (default: a third of seq_q, from 2 to 64).",
    ),
]
BlockKOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--block-k",
        min=1,
        metavar="N",
        show_default=False,
        help="Keys per tile (default: a third of seq_k, from 2 to 64).",
    ),
]
Base2Option = Annotated[
    bool,
    typer.Option(
        "--base2",
        help="Compute as Triton's fused-attention tutorial: exp2, scale × log2(e), L in base 2.",
    ),
]
MaxTilesOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        min=0,
        metavar="N",
        show_default=False,
        help=f"Show (and keep) at most N tiles (default {MAX_TILES}); O, L and the checks still "
        "cover every tile.",
    ),
]
SplitKVOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--split-kv",
        metavar="S",
        show_default=False,
        help="Flash-decoding: each query's keys in S chunks run on their own (m, l, O, lse "
        "each), then merged by log-sum-exp, in two orders (docs/flash.md).",
    ),
]
SPLIT_VIEW = RunView(
    "attn_cli.present.split_kv_view",
    "split_pages",
    "split_titles",
    "render_split",
    "attn_cli.io.split_kv_json:split_dumps",
    "attn_cli.present.html_split:split_page",
)


def flash(
    fixture: FixtureArgument = None,
    block_q: BlockQOption = None,
    block_k: BlockKOption = None,
    base2: Base2Option = False,
    max_tiles: MaxTilesOption = None,
    split_kv: SplitKVOption = None,
    fmt: RunFormatOption = RunFormat.table,
    output: OutputOption = None,
    dtype: DtypeOption = Dtype.float64,
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
    """Run the FlashAttention-2 forward tile by tile: S, the running max m, alpha, P, the running
    sum l and the accumulator, then O = acc / l and L = m + log l.

    Under causal, tiles wholly above the diagonal are shown as skipped. O and L are checked
    against plain softmax rows, exp(S − L) against `attn trace` (float64: 1e-12; float32: shown
    in ulps).

    Examples:

      attn flash causal_multihead                     # 2 x 2 tiles per head

      attn flash llama_rope_gqa --block-q 4 --block-k 2 --explain

      attn flash the_cat_sat --base2                  # as Triton computes it

      attn flash mistral_sliding_window --step        # one tile at a time (q quits)

      attn flash my.yaml -f json --max-tiles 8 -o flash.json

      attn flash causal_multihead --split-kv 2        # flash-decoding's merge
    """
    from attn_cli.check.runs import flash_failure, run_flash

    refuse_step(step, fmt, output)
    budget = memory_budget(max_memory)
    out = RunOutput(fmt, output, precision, full, width, color, explain, lang, quiet, step)
    if split_kv is not None:
        _split(
            fixture,
            split_kv,
            (block_q, block_k, base2, max_tiles),
            dtype,
            out,
            (max_elements, budget),
        )
        return
    run = run_flash(
        fixture,
        block_q=block_q,
        block_k=block_k,
        base2=base2,
        dtype=dtype.value,
        max_tiles=MAX_TILES if max_tiles is None else max_tiles,
        max_elements=max_elements,
        max_memory=budget,
    )
    failure = flash_failure(run)
    show_run(run, FLASH_VIEW, out, failure)
    if run.cut:
        note(
            f"Note: showing {len(run.tiles)} of {run.tiles_total:,} tiles (--max-tiles N shows "
            "more; O, L and the checks cover them all)",
            quiet=quiet,
        )
    if failure is not None:
        raise failure


def parse_splits(text: str) -> int:
    """--split-kv's S: ASCII digits, at least 1 (the fixture's key count is checked later)."""
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 19 or int(digits) < 1:
        raise UsageError(
            "",
            "--split-kv",
            f"got {shown(text)}",
            "a whole number of chunks, at least 1 (and at most the fixture's keys)",
        )
    return int(digits)


def _split(
    fixture: Optional[str],  # noqa: UP045
    text: str,
    flash_options: tuple[Optional[int], Optional[int], bool, Optional[int]],  # noqa: UP045
    dtype: Dtype,
    out: RunOutput,
    limits: tuple[int, Optional[int]],  # noqa: UP045
) -> None:
    """``--split-kv S``: the chunks and their merge, checked against the trace."""
    from attn_cli.check.split_runs import run_split, split_failure

    splits = parse_splits(text)
    block_q, block_k, base2, max_tiles = flash_options
    if max_tiles is not None:
        raise UsageError(
            "",
            "--max-tiles",
            "does not apply with --split-kv (it shows chunks, not tiles)",
            "one of --split-kv, --max-tiles",
        )
    max_elements, budget = limits
    run = run_split(
        fixture,
        splits=splits,
        block_q=block_q,
        block_k=block_k,
        base2=base2,
        dtype=dtype.value,
        max_elements=max_elements,
        max_memory=budget,
    )
    failure = split_failure(run)
    show_run(run, SPLIT_VIEW, out, failure)
    if failure is not None:
        raise failure
