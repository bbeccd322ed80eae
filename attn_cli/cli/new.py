"""``attn new``: a random, commented fixture to edit."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from attn_cli.cli.examples import refuse_overwrite
from attn_cli.errors import UsageError, printable


def new(
    file: Annotated[
        Path, typer.Argument(help="The fixture to write (.yaml or .yml).", metavar="FILE")
    ],
    seq: Annotated[int, typer.Option(min=1, max=256, help="Tokens (positions).")] = 5,
    d_model: Annotated[int, typer.Option(min=1, max=1024, help="Embedding size.")] = 8,
    d_k: Annotated[int, typer.Option(min=1, max=256, help="Query/key/value size per head.")] = 4,
    heads: Annotated[int, typer.Option(min=1, max=16, help="Attention heads.")] = 2,
    batch: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(min=1, max=16, help="Add a batch axis of this size."),
    ] = None,
    causal: Annotated[bool, typer.Option("--causal", help="Causal (decoder) masking.")] = False,
    seed: Annotated[int, typer.Option(min=0, help="Random seed: same seed, same fixture.")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Overwrite FILE if it exists.")] = False,
) -> None:
    """Write a random, commented fixture to edit (tokens included), then trace it.

    Examples:

      attn new mine.yaml                                  # seq 5, d_model 8, 2 heads of d_k 4

      attn new mine.yaml --seq 4 --d-model 6 --d-k 3 --heads 1 --causal --seed 7
    """
    from attn_cli.io.files import write_atomic
    from attn_cli.io.fixture import parse_fixture
    from attn_cli.io.new import FIXTURE_SUFFIXES, NewFixture, new_fixture

    if file.suffix.lower() not in FIXTURE_SUFFIXES:
        raise UsageError(str(file), "FILE", "is not a .yaml or .yml file", "FILE.yaml")
    refuse_overwrite(file, force)
    text = new_fixture(NewFixture(seq, d_model, d_k, heads, batch, causal, seed))
    parse_fixture(text, str(file), fmt="yaml")  # what we write must load
    write_atomic(file, text, option="FILE")
    typer.echo(
        f"Wrote {printable(str(file))}; trace it with: attn trace {printable(str(file))} --explain",
        err=True,
    )
