"""``attn import``: one attention layer of a real checkpoint, written as a fixture."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from attn_cli.cli.options import MaxMemoryOption, QuietOption, parse_size
from attn_cli.cli.output import note
from attn_cli.errors import UsageError, printable

CheckpointArgument = Annotated[
    Path,
    typer.Argument(
        help="A Hugging Face model folder (config.json + model.safetensors, or shards with "
        "model.safetensors.index.json), or a .safetensors file with --config.",
        metavar="CHECKPOINT",
        show_default=False,
    ),
]


OutputOption = Annotated[
    Path,
    typer.Option(
        "--output",
        "-o",
        help="The fixture to write (.npz: arrays of any size, nothing pickled).",
        metavar="FILE",
    ),
]
LayerOption = Annotated[int, typer.Option(min=0, help="Which layer (0-based).")]
HiddenOption = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        help="The residual stream entering the layer (.npy [seq, hidden] or [batch, seq, "
        "hidden]), as output_hidden_states[LAYER] gives it.",
        metavar="FILE",
    ),
]
TextOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(help="A text to tokenise and embed (layer 0 only).", metavar="TEXT"),
]
ConfigOption = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(help="config.json, when CHECKPOINT is a .safetensors file.", metavar="FILE"),
]
ArchOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        help="Read a checkpoint whose model_type attn does not know as this family; every "
        "config.json key is then checked against the family's (a model attn knows is refused)."
    ),
]
ForceOption = Annotated[bool, typer.Option("--force", help="Overwrite FILE if it exists.")]


def import_(
    checkpoint: CheckpointArgument,
    output: OutputOption,
    layer: LayerOption = 0,
    hidden: HiddenOption = None,
    text: TextOption = None,
    config: ConfigOption = None,
    arch: ArchOption = None,
    force: ForceOption = False,
    max_memory: MaxMemoryOption = None,
    quiet: QuietOption = False,
) -> None:
    """Import one attention layer of a real checkpoint (safetensors, no torch) as a fixture.

    Needs the optional extra: pip install 'attn-cli[models]'.

    Examples:

      attn import ./MiniLM --text "The cat sat" -o m.npz     # layer 0, a text

      attn import ./gpt2 --layer 5 --hidden h5.npy -o g.npz  # a later layer

      attn trace m.npz --stage softmax                       # then trace it
    """
    from attn_cli.cli.examples import refuse_overwrite
    from attn_cli.io.checkpoint import import_layer, write_npz_fixture

    if output.suffix.lower() != ".npz":
        raise UsageError(str(output), "--output", "is not a .npz file", "FILE.npz")
    refuse_overwrite(output, force)
    budget = None if max_memory is None else parse_size(max_memory)
    imported = import_layer(
        checkpoint, layer=layer, hidden=hidden, text=text, config=config, arch=arch,
        max_memory=budget,
    )  # fmt: skip
    write_npz_fixture(imported.fixture, output)
    for text_of_note in imported.notes:
        note(f"Note: {printable(text_of_note)}", quiet=quiet)
    note(
        f"Wrote {printable(str(output))} ({imported.family}, layer {layer}); trace it with: "
        f"attn trace {printable(str(output))}",
        quiet=quiet,
    )
