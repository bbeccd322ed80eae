"""``attn examples``: the bundled examples, and copies of them to edit."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from attn_cli.cli.options import ForceOption, QuietOption
from attn_cli.cli.output import console, note
from attn_cli.errors import UsageError, printable
from attn_cli.io.gate import kind_of

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs

CopyOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--copy", metavar="NAME", help="Copy the bundled example NAME to FILE."),
]
FileArgument = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Argument(
        help="Where --copy writes (default: NAME.yaml here).", show_default=False, metavar="[FILE]"
    ),
]


def examples(
    copy: CopyOption = None,
    file: FileArgument = None,
    force: ForceOption = False,
    quiet: QuietOption = False,
) -> None:
    """List the bundled examples: name, description and shapes.

    Each one traces by name (attn trace NAME), and --copy makes a copy to edit.

    Examples:

      attn examples                             # the list

      attn trace causal_multihead               # trace one

      attn examples --copy the_cat_sat my.yaml  # copy one to edit
    """
    if copy is not None or file is not None:
        _copy_example(copy, file, force, quiet)
        return
    from rich.table import Table
    from rich.text import Text

    from attn_cli.io.examples import DEFAULT_EXAMPLE, example_paths
    from attn_cli.io.fixture import parse_fixture

    table = Table(title="Bundled examples (attn trace NAME)", title_justify="left")
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("description", ratio=3)
    table.add_column("shapes", ratio=2)
    for name, path in example_paths().items():
        inputs = parse_fixture(path.read_bytes(), path.name)
        label = name + (" (default)" if name == DEFAULT_EXAMPLE else "")
        table.add_row(label, Text(printable(inputs.description)), shape_summary(inputs))
    console(None, plain=False, color=None).print(table)


def _copy_example(
    name: Optional[str],  # noqa: UP045
    file: Optional[Path],  # noqa: UP045
    force: bool,
    quiet: bool,
) -> None:
    from attn_cli.io.examples import example_paths, find_example
    from attn_cli.io.files import write_atomic

    if name is None:
        raise UsageError(
            str(file), "FILE", "given without --copy", "attn examples --copy NAME FILE"
        )
    bundled = find_example(name)
    if bundled is None:
        names = ", ".join(example_paths()) or "none installed"
        raise UsageError("", f"--copy {name}", "no such bundled example", f"one of {names}")
    target = file if file is not None else Path(name + bundled.suffix)
    refuse_overwrite(target, force)
    write_atomic(target, bundled.read_text(encoding="utf-8"), option="FILE", force=force)
    note(
        f"Wrote {printable(str(target))} (a copy of {name}; trace it with: "
        f"attn trace {printable(str(target))})",
        quiet=quiet,
    )


def refuse_overwrite(target: Path, force: bool) -> None:
    """An existing file is kept unless --force."""
    if kind_of(target) in ("file", "other") and not force:
        raise UsageError(str(target), "", "already exists", "a new file name, or --force")


def shape_summary(inputs: "Inputs") -> str:
    """``projection, seq 3, d_model 4, heads 1, d_k 2``: the shapes of a fixture in a line."""
    parts: list[str] = [inputs.mode]
    if inputs.has_batch:
        parts.append(f"batch {inputs.batch}")
    seq = inputs.seq_q if inputs.seq_q == inputs.seq_k else f"{inputs.seq_q}x{inputs.seq_k}"
    parts.append(f"seq {seq}")
    if inputs.d_model is not None:
        parts.append(f"d_model {inputs.d_model}")
    heads = f"heads {inputs.heads}"
    if inputs.kv_heads != inputs.heads:
        heads += f"/{inputs.kv_heads} kv"
    parts += [heads, f"d_k {inputs.d_k}"]
    if inputs.causal:
        parts.append("causal")
    if inputs.W_O is not None:
        parts.append("W_O")
    return ", ".join(parts)
