"""``attn new``: a random, commented fixture to edit, as YAML or as a whole-fixture ``.npz``."""

import shlex
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from attn_cli.cli.examples import refuse_overwrite
from attn_cli.cli.options import QuietOption
from attn_cli.cli.output import note
from attn_cli.errors import InputError, UsageError, printable

if TYPE_CHECKING:
    from attn_cli.io.new import NewFixture

MAX_SEQ = 256

FileArgument = Annotated[
    Path,
    typer.Argument(
        help="The fixture to write: .yaml or .yml (commented, to edit), or .npz (NumPy arrays: "
        "fast to write and to read at any size).",
        metavar="FILE",
        show_default=False,
    ),
]
TokensOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        metavar="A,B,C",
        help="The tokens, comma-separated (sets --seq). Default: The, cat, sat, on, my, ...",
        show_default=False,
    ),
]


SeqOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        min=1, max=MAX_SEQ, metavar="N", show_default=False,
        help="Tokens (positions; default: 5, or as many as --tokens).",
    ),
]  # fmt: skip
KvHeadsOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        min=1, max=16, metavar="N", show_default=False,
        help="Key/value heads, dividing --heads (grouped-query; default: as many as --heads).",
    ),
]  # fmt: skip
SizeOption = Annotated[int, typer.Option(min=1, max=1024, metavar="N", help="Embedding size.")]
DkOption = Annotated[
    int, typer.Option(min=1, max=256, metavar="N", help="Query/key/value size per head.")
]
HeadsOption = Annotated[int, typer.Option(min=1, max=16, metavar="N", help="Attention heads.")]
WoOption = Annotated[
    bool, typer.Option("--w-o", help="Add an output projection W_O [heads*d_k, d_model].")
]
BatchOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(min=1, max=16, metavar="N", help="Add a batch axis of this size."),
]
CausalOption = Annotated[bool, typer.Option("--causal", help="Causal (decoder) masking.")]
SeedOption = Annotated[
    int, typer.Option(min=0, metavar="N", help="Random seed: same seed, same fixture.")
]
ForceOption = Annotated[
    bool, typer.Option("--force", help="Overwrite FILE if it exists, even write-protected.")
]


def new(
    file: FileArgument,
    seq: SeqOption = None,
    d_model: SizeOption = 8,
    d_k: DkOption = 4,
    heads: HeadsOption = 2,
    kv_heads: KvHeadsOption = None,
    w_o: WoOption = False,
    tokens: TokensOption = None,
    batch: BatchOption = None,
    causal: CausalOption = False,
    seed: SeedOption = 0,
    force: ForceOption = False,
    quiet: QuietOption = False,
) -> None:
    """Write a random, commented fixture to edit (tokens included), then trace it.

    The numbers are rounded to read easily; the same options and seed give the same fixture.

    Examples:

      attn new mine.yaml                              # 5 tokens, 2 heads

      attn new mine.yaml --tokens I,like,green,tea    # your own tokens

      attn new gqa.yaml --heads 4 --kv-heads 2 --w-o  # grouped-query, projected

      attn new big.npz --seq 256 --d-model 1024       # big: NumPy, not YAML
    """
    from attn_cli.io.fixture import parse_fixture
    from attn_cli.io.new import FIXTURE_SUFFIXES, NewFixture, new_fixture

    suffix = file.suffix.lower()
    if suffix not in FIXTURE_SUFFIXES:
        raise UsageError(
            printable(str(file)), "FILE", "is not a .yaml, .yml or .npz file", "FILE.yaml"
        )
    names = _tokens(tokens, seq)
    if kv_heads is not None and heads % kv_heads:
        raise UsageError(
            "", "--kv-heads", f"{kv_heads} does not divide --heads {heads}",
            "a number of key/value heads that divides the number of heads",
        )  # fmt: skip
    refuse_overwrite(file, force)
    spec = NewFixture(
        seq=len(names) if names else seq or 5, d_model=d_model, d_k=d_k, heads=heads,
        batch=batch, causal=causal, seed=seed, tokens=names, kv_heads=kv_heads, w_o=w_o,
    )  # fmt: skip
    # What we write must load: the tokens and settings, checked on a copy with 1-wide arrays
    # (the numbers are repr()s of floats; parsing 256 x 1024 of them back would take 20 s).
    small = new_fixture(replace(spec, d_model=1, d_k=1), file.name)
    try:
        parse_fixture(small, str(file), fmt="yaml")
    except InputError as e:
        if names is None or not e.field.startswith("tokens"):
            raise
        raise UsageError("", "--tokens", e.what, e.expected) from None
    _write(file, spec, force)
    shown = shlex.quote(printable(str(file)))
    note(f"Wrote {shown}; trace it with: attn trace {shown} --explain", quiet=quiet)


def _tokens(text: Optional[str], seq: Optional[int]) -> Optional[tuple[str, ...]]:  # noqa: UP045
    """``--tokens A,B,C`` as tokens (blanks around each dropped), checked against ``--seq``."""
    if text is None:
        return None
    if text.count(",") >= MAX_SEQ:
        raise UsageError(
            "", "--tokens", f"{text.count(',') + 1:,} tokens", f"at most {MAX_SEQ} tokens"
        )
    names = tuple(t.strip() for t in text.split(","))
    empty = next((i for i, t in enumerate(names) if not t), None)
    if empty is not None:
        raise UsageError(
            "", "--tokens", f"token {empty} is empty", "tokens separated by single commas"
        )
    if seq is not None and seq != len(names):
        raise UsageError(
            "", "--seq", f"{seq} given with {len(names)} --tokens", "one of them, or both agreeing"
        )
    return names


def _write(file: Path, spec: "NewFixture", force: bool) -> None:
    """YAML text, or the same numbers as a whole-fixture .npz; atomically either way."""
    from attn_cli.io.files import write_atomic, write_atomic_with
    from attn_cli.io.new import new_fixture

    if file.suffix.lower() != ".npz":
        write_atomic(file, new_fixture(spec, file.name), option="FILE", force=force)
        return
    import numpy as np

    from attn_cli.io.new import new_fixture_npz

    arrays = new_fixture_npz(spec)
    write_atomic_with(file, lambda f: np.savez(f, **arrays), option="FILE", force=force)  # type: ignore[arg-type]
