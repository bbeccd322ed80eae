"""``attn new``: a random, commented fixture to edit, as YAML or as a whole-fixture ``.npz``.

The flags of the modern variants are their plug-ins' ``new_options`` (core/variant.py), made
into Typer options here when the command is built (this module is imported only when ``attn
new`` runs or shows its help); the variants check them, draw and write their keys.
"""

import inspect
import shlex
from collections.abc import Callable
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional, cast

import typer

from attn_cli.cli.examples import refuse_overwrite
from attn_cli.cli.options import ForceOption, QuietOption
from attn_cli.cli.output import note
from attn_cli.core.variant import NewOption
from attn_cli.errors import InputError, UsageError, printable
from attn_cli.io.new import (
    FIXTURE_SUFFIXES,
    MAX_SEQ,
    NewFixture,
    listed,
    new_fixture,
    new_fixture_npz,
    new_variants,
)

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
        min=1,
        max=MAX_SEQ,
        metavar="N",
        show_default=False,
        help="Tokens (positions; default: 5, or as many as --tokens).",
    ),
]
KvHeadsOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        min=1,
        max=16,
        metavar="N",
        show_default=False,
        help="Key/value heads, dividing --heads (grouped-query; default: as many as --heads).",
    ),
]
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


_VARIANTS = "Modern variants"


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
    **flags: Any,
) -> None:
    """Write a random, commented fixture to edit (tokens included), then trace it.

    The numbers are rounded to read easily; the same options and seed give the same fixture.

    Examples:

      attn new mine.yaml                              # 5 tokens, 2 heads

      attn new mine.yaml --tokens I,like,green,tea    # your own tokens

      attn new gqa.yaml --heads 4 --kv-heads 2 --w-o  # grouped-query, projected

      attn new big.npz --seq 256 --d-model 1024       # big: NumPy, not YAML
    """
    _check_file(file)
    names = _tokens(tokens, seq)
    _check_kv_heads(heads, kv_heads)
    given = {k: v.value if isinstance(v, Enum) else v for k, v in flags.items()}
    spec = NewFixture(
        seq=len(names) if names else seq or 5,
        d_model=d_model,
        d_k=d_k,
        heads=heads,
        batch=batch,
        causal=causal,
        seed=seed,
        tokens=names,
        kv_heads=kv_heads,
        w_o=w_o,
        options={k: v for k, v in given.items() if v is not None and v is not False},
    )
    _check_variants(spec)
    refuse_overwrite(file, force)
    _check_loads(file, spec, names)
    _write(file, spec, force)
    shown = shlex.quote(printable(str(file)))
    note(f"Wrote {shown}; trace it with: attn trace {shown} --explain", quiet=quiet)


def _flag(name: str) -> str:
    """A parameter's command-line flag: rope_base -> --rope-base."""
    return "--" + name.replace("_", "-")


def _parameter(option: NewOption) -> inspect.Parameter:
    """A variant's flag as a parameter of :func:`new`: a switch (off by default) or a value
    (None: not given), in the help's variants panel."""
    if option.kind is bool:
        info = typer.Option(_flag(option.name), rich_help_panel=_VARIANTS, help=option.help)
        kind: Any = bool
    else:
        info = typer.Option(
            _flag(option.name),
            min=option.min,
            max=option.max,
            metavar=option.metavar,
            show_default=False,
            rich_help_panel=_VARIANTS,
            help=option.help,
        )
        values = [(c, c) for c in option.choices]
        choice = cast(Any, Enum)(option.name, values, type=str) if values else option.kind
        kind = cast(Any, Optional)[choice]
    return inspect.Parameter(
        option.name,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        annotation=cast(Any, Annotated)[kind, info],
        default=False if kind is bool else None,
    )


def _with_variant_flags(command: Callable[..., None]) -> None:
    """Give :func:`new` the variants' flags as parameters (before --force; they reach it as
    ``**flags``) and their examples in its help, as ``attn new`` lists the variants."""
    params = [p for p in inspect.signature(command).parameters.values() if p.kind != p.VAR_KEYWORD]
    at = next(i for i, p in enumerate(params) if p.name == "force")
    flags = [_parameter(o) for _, options in listed() for o in options]
    command.__signature__ = inspect.Signature([*params[:at], *flags, *params[at:]])  # type: ignore[attr-defined]
    examples = [o.example for _, options in listed() for o in options if o.example is not None]
    examples.append(("seq2seq.yaml --cross 6 --w-o", "encoder-decoder"))  # X_kv is no plug-in
    rows = "".join(f"\n\n      {'attn new ' + args:<46}  # {what}" for args, what in examples)
    command.__doc__ = (command.__doc__ or "").rstrip() + rows + "\n    "


_with_variant_flags(new)


def _check_file(file: Path) -> None:
    """FILE must name a fixture format attn new writes."""
    suffix = file.suffix.lower()
    if suffix not in FIXTURE_SUFFIXES:
        raise UsageError(
            printable(str(file)), "FILE", "is not a .yaml, .yml or .npz file", "FILE.yaml"
        )


def _check_kv_heads(heads: int, kv_heads: Optional[int]) -> None:  # noqa: UP045
    """--kv-heads must divide --heads (grouped-query attention)."""
    if kv_heads is not None and heads % kv_heads:
        raise UsageError(
            "",
            "--kv-heads",
            f"{kv_heads} does not divide --heads {heads}",
            "a number of key/value heads that divides the number of heads",
        )


def _check_loads(
    file: Path,
    spec: NewFixture,
    names: Optional[tuple[str, ...]],  # noqa: UP045
) -> None:
    """What we write must load; a refused field becomes a usage error naming its option."""
    from attn_cli.io.fixture import parse_fixture

    # The tokens and settings, checked on a copy with 1-wide rows (the numbers are repr()s of
    # floats; parsing 256 x 1024 of them back would take 20 s).
    # d_k stays: the variants' settings (RoPE's dims, QK-norm's weights) are checked against it.
    small = new_fixture(replace(spec, d_model=1), file.name)
    try:
        parse_fixture(small, str(file), fmt="yaml")
    except InputError as e:
        # a fixture field the loader refuses, and the flag that set it
        fields = [("tokens", "--tokens")] + [
            (o.field, _flag(o.name)) for _, options in listed() for o in options if o.field
        ]
        option = next((o for f, o in fields if e.field.startswith(f)), None)
        if option is None or (option == "--tokens" and names is None):
            raise
        raise UsageError("", option, e.what, e.expected) from None


def _check_variants(spec: NewFixture) -> None:
    """The combinations that make no sense, as one-line usage errors naming the flag."""
    for variant in new_variants():
        problem = variant.new_problem(spec)
        if problem is not None:
            name, what, expected = problem
            raise UsageError("", _flag(name), what, expected)


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


def _write(file: Path, spec: NewFixture, force: bool) -> None:
    """YAML text, or the same numbers as a whole-fixture .npz; atomically either way."""
    from attn_cli.io.files import write_atomic, write_atomic_with

    if file.suffix.lower() != ".npz":
        write_atomic(file, new_fixture(spec, file.name), option="FILE", force=force)
        return
    import numpy as np

    arrays = new_fixture_npz(spec)
    write_atomic_with(file, lambda f: np.savez(f, **arrays), option="FILE", force=force)  # type: ignore[arg-type]
