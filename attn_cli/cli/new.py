"""``attn new``: a random, commented fixture to edit, as YAML or as a whole-fixture ``.npz``."""

import shlex
from dataclasses import replace
from enum import Enum
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


class RopeLayout(str, Enum):
    """The two ways of pairing dimensions for RoPE."""

    half = "half"
    interleaved = "interleaved"


_VARIANTS = "Modern variants"
RopeOption = Annotated[
    Optional[RopeLayout],  # noqa: UP045
    typer.Option(
        "--rope", metavar="half|interleaved", show_default=False, rich_help_panel=_VARIANTS,
        help="Rotary position embedding of Q and K: half pairs i with i + d_k/2 (HF), "
        "interleaved pairs 2i with 2i+1 (Meta's llama).",
    ),
]  # fmt: skip
RopeBaseOption = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        "--rope-base", metavar="B", show_default=False, rich_help_panel=_VARIANTS,
        help="RoPE base (default 10000): angle = position × B^(−2i/dims). Needs --rope.",
    ),
]  # fmt: skip
RopeDimsOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--rope-dims", metavar="N", show_default=False, rich_help_panel=_VARIANTS,
        help="Rotate only the first N (even) dimensions of each head (partial rotary). "
        "Needs --rope.",
    ),
]  # fmt: skip
WindowOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--window", min=1, metavar="N", show_default=False, rich_help_panel=_VARIANTS,
        help="Sliding window: each query sees at most N keys, itself included (Mistral). "
        "Needs --causal.",
    ),
]  # fmt: skip
SoftcapOption = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        "--softcap", metavar="C", show_default=False, rich_help_panel=_VARIANTS,
        help="Logit soft-capping: C·tanh(scaled/C) before the mask (Gemma 2 uses 50).",
    ),
]  # fmt: skip
SinksOption = Annotated[
    bool, typer.Option("--sinks", rich_help_panel=_VARIANTS,
                       help="A random sink logit per head, joined to each softmax row (gpt-oss).")
]  # fmt: skip
QkNormOption = Annotated[
    bool, typer.Option("--qk-norm", rich_help_panel=_VARIANTS,
                       help="RMSNorm of each head of Q and K, with random weights (Qwen3).")
]  # fmt: skip
AlibiOption = Annotated[
    bool, typer.Option("--alibi", rich_help_panel=_VARIANTS,
                       help="ALiBi: a distance penalty per head instead of positions (BLOOM).")
]  # fmt: skip
CrossOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--cross", min=1, max=MAX_SEQ, metavar="N", show_default=False,
        rich_help_panel=_VARIANTS,
        help="Cross-attention: keys and values from X_kv, N encoder tokens.",
    ),
]  # fmt: skip
MaskValueOption = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        "--mask-value", metavar="V", show_default=False, rich_help_panel=_VARIANTS,
        help="Fill hidden places with V (e.g. -1e4) instead of −∞, to see it leak. "
        "Needs --causal.",
    ),
]  # fmt: skip


def new(
    file: FileArgument, seq: SeqOption = None, d_model: SizeOption = 8, d_k: DkOption = 4,
    heads: HeadsOption = 2, kv_heads: KvHeadsOption = None, w_o: WoOption = False,
    tokens: TokensOption = None, batch: BatchOption = None, causal: CausalOption = False,
    seed: SeedOption = 0, rope: RopeOption = None, rope_base: RopeBaseOption = None,
    rope_dims: RopeDimsOption = None, window: WindowOption = None,
    softcap: SoftcapOption = None, sinks: SinksOption = False, qk_norm: QkNormOption = False,
    alibi: AlibiOption = False, cross: CrossOption = None,
    mask_value: MaskValueOption = None, force: ForceOption = False,
    quiet: QuietOption = False,
) -> None:  # fmt: skip
    """Write a random, commented fixture to edit (tokens included), then trace it.

    The numbers are rounded to read easily; the same options and seed give the same fixture.

    Examples:

      attn new mine.yaml                              # 5 tokens, 2 heads

      attn new mine.yaml --tokens I,like,green,tea    # your own tokens

      attn new gqa.yaml --heads 4 --kv-heads 2 --w-o  # grouped-query, projected

      attn new big.npz --seq 256 --d-model 1024       # big: NumPy, not YAML

      attn new llama.yaml --rope half --causal        # Llama: RoPE, causal

      attn new mistral.yaml --causal --window 3       # a sliding window of 3

      attn new gemma.yaml --softcap 50                # Gemma 2 logit capping

      attn new leak.yaml --causal --mask-value -1e4   # a sentinel that leaks

      attn new seq2seq.yaml --cross 6 --w-o           # encoder-decoder
    """
    from attn_cli.io.new import NewFixture

    _check_file(file)
    names = _tokens(tokens, seq)
    _check_kv_heads(heads, kv_heads)
    _check_variants(causal, rope, rope_base, rope_dims, window, softcap, mask_value)
    refuse_overwrite(file, force)
    spec = NewFixture(
        seq=len(names) if names else seq or 5, d_model=d_model, d_k=d_k, heads=heads,
        batch=batch, causal=causal, seed=seed, tokens=names, kv_heads=kv_heads, w_o=w_o,
        rope=None if rope is None else rope.value, rope_base=rope_base, rope_dims=rope_dims,
        window=window, softcap=softcap, sinks=sinks, qk_norm=qk_norm, alibi=alibi,
        cross=cross, mask_value=mask_value,
    )  # fmt: skip
    _check_loads(file, spec, names)
    _write(file, spec, force)
    shown = shlex.quote(printable(str(file)))
    note(f"Wrote {shown}; trace it with: attn trace {shown} --explain", quiet=quiet)


def _check_file(file: Path) -> None:
    """FILE must name a fixture format attn new writes."""
    from attn_cli.io.new import FIXTURE_SUFFIXES

    suffix = file.suffix.lower()
    if suffix not in FIXTURE_SUFFIXES:
        raise UsageError(
            printable(str(file)), "FILE", "is not a .yaml, .yml or .npz file", "FILE.yaml"
        )


def _check_kv_heads(heads: int, kv_heads: Optional[int]) -> None:  # noqa: UP045
    """--kv-heads must divide --heads (grouped-query attention)."""
    if kv_heads is not None and heads % kv_heads:
        raise UsageError(
            "", "--kv-heads", f"{kv_heads} does not divide --heads {heads}",
            "a number of key/value heads that divides the number of heads",
        )  # fmt: skip


def _check_loads(
    file: Path,
    spec: "NewFixture",
    names: Optional[tuple[str, ...]],  # noqa: UP045
) -> None:
    """What we write must load; a refused field becomes a usage error naming its option."""
    from attn_cli.io.fixture import parse_fixture
    from attn_cli.io.new import new_fixture

    # The tokens and settings, checked on a copy with 1-wide rows (the numbers are repr()s of
    # floats; parsing 256 x 1024 of them back would take 20 s).
    # d_k stays: RoPE's dims and QK-norm's weights are checked against it.
    small = new_fixture(replace(spec, d_model=1), file.name)
    try:
        parse_fixture(small, str(file), fmt="yaml")
    except InputError as e:
        option = next((o for f, o in _FIELD_OPTIONS if e.field.startswith(f)), None)
        if option is None or (option == "--tokens" and names is None):
            raise
        raise UsageError("", option, e.what, e.expected) from None


# A fixture field the loader refuses, and the option that set it.
_FIELD_OPTIONS = (
    ("tokens", "--tokens"), ("rope.dims", "--rope-dims"), ("rope.base", "--rope-base"),
    ("window", "--window"), ("softcap", "--softcap"), ("mask_value", "--mask-value"),
)  # fmt: skip


def _check_variants(
    causal: bool,
    rope: Optional[RopeLayout],  # noqa: UP045
    rope_base: Optional[float],  # noqa: UP045
    rope_dims: Optional[int],  # noqa: UP045
    window: Optional[int],  # noqa: UP045
    softcap: Optional[float],  # noqa: UP045
    mask_value: Optional[float],  # noqa: UP045
) -> None:
    """The combinations that make no sense, as one-line usage errors naming the option."""
    import math

    for option, value in (("--rope-base", rope_base), ("--softcap", softcap)):
        if value is not None and not math.isfinite(value):
            raise UsageError("", option, f"is {value}", "a finite number > 0")
    if mask_value is not None and math.isnan(mask_value):
        raise UsageError("", "--mask-value", "is nan", "-inf or a negative number such as -1e4")
    if rope is None:
        for option, given in (("--rope-base", rope_base), ("--rope-dims", rope_dims)):
            if given is not None:
                raise UsageError(
                    "", option, "given without --rope", f"--rope half|interleaved with {option}"
                )
    if not causal:
        if window is not None:
            raise UsageError(
                "", "--window", "given without --causal",
                "--causal alongside --window (a sliding window looks back only)",
            )  # fmt: skip
        if mask_value is not None:
            raise UsageError(
                "", "--mask-value", "given but nothing is masked",
                "--causal alongside --mask-value (it fills the places a query may not see)",
            )  # fmt: skip


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
