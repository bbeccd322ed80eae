"""``attn import``: one attention layer of a real checkpoint, written as a fixture."""

from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from attn_cli.cli.options import (
    LangOption,
    MaxMemoryOption,
    QuietOption,
    Theme,
    ThemeOption,
    WidthOption,
    memory_budget,
)
from attn_cli.cli.output import emit, note
from attn_cli.errors import UsageError, printable

CheckpointArgument = Annotated[
    Path,
    typer.Argument(
        help="A Hugging Face model folder (config.json + model.safetensors, or shards with "
        "model.safetensors.index.json), a .safetensors file with --config, or a bundled tiny "
        "checkpoint by name (tiny_llama, tiny_gpt2: no download).",
        metavar="CHECKPOINT",
        show_default=False,
    ),
]


OutputOption = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--output",
        "-o",
        help="The fixture to write (.npz: arrays of any size, nothing pickled); not with "
        "--layer all, which prints the model view.",
        metavar="FILE",
    ),
]
LayerOption = Annotated[
    str,
    typer.Option(
        metavar="L|all",
        help="Which layer (0-based); with --text any layer (the layers below computed in "
        "NumPy), or all: the model view, every layer x head as a small map of its weights.",
    ),
]
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
    typer.Option(
        help="A text to tokenise and embed; for a layer past 0 the layers below are computed in "
        "NumPy (no torch).",
        metavar="TEXT",
    ),
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
CheckLogitsOption = Annotated[
    bool,
    typer.Option(
        "--check-logits",
        help="With --text: run every layer, the final norm and the LM head, and print the five "
        "most likely next tokens.",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="The model view (--layer all) as JSON.")]


class ViewFormat(str, Enum):
    """How --layer all writes the model view."""

    text = "text"
    json = "json"
    html = "html"


ViewFormatOption = Annotated[
    ViewFormat,
    typer.Option(
        "--format",
        "-f",
        help="The model view (--layer all): text, json (as --json), or html: one "
        "self-contained page, every layer x head a thumbnail that opens its layer's trace "
        "(with -o FILE.html).",
    ),
]


def import_(
    checkpoint: CheckpointArgument,
    output: OutputOption = None,
    layer: LayerOption = "0",
    hidden: HiddenOption = None,
    text: TextOption = None,
    config: ConfigOption = None,
    arch: ArchOption = None,
    force: ForceOption = False,
    max_memory: MaxMemoryOption = None,
    check_logits: CheckLogitsOption = False,
    as_json: JsonOption = False,
    view_format: ViewFormatOption = ViewFormat.text,
    theme: ThemeOption = Theme.auto,
    width: WidthOption = None,
    lang: LangOption = None,
    quiet: QuietOption = False,
) -> None:
    """Import one attention layer of a real checkpoint (safetensors, no torch) as a fixture.

    Needs the optional extra: pip install 'attn-cli[models]'.

    Examples:

      attn import tiny_llama --text "a b" -o t.npz            # bundled

      attn import ./MiniLM --text "The cat" -o m.npz          # layer 0

      attn import ./gpt2 --text "The cat" --layer 5 -o g.npz  # 0-4 in NumPy

      attn import ./gpt2 --text "The cat" --layer all         # every head

      attn import ./gpt2 --text "The" --layer all -f html     # as a page

      attn import ./gpt2 --layer 5 --hidden h5.npy -o g.npz   # X given

      attn trace m.npz --stage softmax                        # then trace it
    """
    from attn_cli.io.examples import find_checkpoint
    from attn_cli.io.forward import check_layer_choice

    checkpoint = find_checkpoint(checkpoint)
    budget = memory_budget(max_memory)
    chosen = check_layer_choice(layer)
    fmt = ViewFormat.json if as_json else view_format
    if chosen is None or check_logits:
        _whole_model(
            checkpoint,
            output,
            chosen,
            text,
            hidden,
            config,
            arch,
            budget,
            (check_logits, fmt, width, lang, quiet, theme),
        )
        if chosen is None:
            return
    if as_json:
        raise UsageError("", "--json", "is for the model view", "--layer all")
    if view_format is not ViewFormat.text:
        raise UsageError(
            "", "--format", f"{view_format.value} is for the model view", "--layer all"
        )
    if output is None:
        raise UsageError("", "--output", "missing", "the fixture to write, FILE.npz")
    _import_one(checkpoint, output, chosen, hidden, text, config, arch, force, budget, quiet)


def _import_one(
    checkpoint: Path,
    output: Path,
    layer: int,
    hidden: Path | None,
    text: Optional[str],  # noqa: UP045
    config: Path | None,
    arch: str | None,
    force: bool,
    budget: Optional[int],  # noqa: UP045
    quiet: bool,
) -> None:
    """One layer as a fixture .npz (X from hidden states, or from the text and the forward)."""
    from attn_cli.cli.examples import refuse_overwrite
    from attn_cli.io.checkpoint import import_layer, write_npz_fixture
    from attn_cli.io.forward import import_deep

    if output.suffix.lower() != ".npz":
        raise UsageError(str(output), "--output", "is not a .npz file", "FILE.npz")
    refuse_overwrite(output, force)
    if text is not None and hidden is None and layer > 0:  # the layers below, in NumPy
        imported = import_deep(
            checkpoint, layer=layer, text=text, config=config, arch=arch, max_memory=budget
        )
    else:
        imported = import_layer(
            checkpoint,
            layer=layer,
            hidden=hidden,
            text=text,
            config=config,
            arch=arch,
            max_memory=budget,
        )
    write_npz_fixture(imported.fixture, output)
    for text_of_note in imported.notes:
        note(f"Note: {printable(text_of_note)}", quiet=quiet)
    note(
        f"Wrote {printable(str(output))} ({imported.family}, layer {layer}); trace it with: "
        f"attn trace {printable(str(output))}",
        quiet=quiet,
    )


def _whole_model(
    checkpoint: Path,
    output: Path | None,
    layer: int | None,
    text: Optional[str],  # noqa: UP045
    hidden: Path | None,
    config: Path | None,
    arch: Optional[str],  # noqa: UP045
    budget: int | None,
    how: tuple[bool, ViewFormat, Optional[int], Any, bool, Theme],  # noqa: UP045
) -> None:
    """Every layer from the text: the model view (--layer all) and/or the top-5 next tokens."""
    import os

    from attn_cli.io.forward import top_tokens, walk
    from attn_cli.present.i18n import Lang, default_lang

    check_logits, fmt, width, lang, quiet, theme = how
    what = "--layer all" if layer is None else "--check-logits"
    if text is None or hidden is not None:
        got = "missing" if text is None else "given with --hidden"
        raise UsageError("", "--text", got, f"a text ({what} computes every layer from it)")
    if layer is None and output is not None and fmt is not ViewFormat.html:
        raise UsageError(
            str(output),
            "--output",
            "is given with --layer all",
            "no --output: the model view is printed (a fixture holds one layer; "
            "-f html writes a page)",
        )
    language: Lang = (
        default_lang(os.environ) if lang is None else ("zh" if str(lang.value) == "zh" else "en")
    )
    pages = None
    if layer is None and fmt is ViewFormat.html:  # each layer's trace page, as it is made
        from attn_cli.present.model_page import LayerPages
        from attn_cli.present.options import RenderOptions

        pages = LayerPages(RenderOptions(lang=language), theme.value)
    w = walk(
        checkpoint,
        text,
        through=None,
        config=config,
        arch=arch,
        max_memory=budget,
        logits=check_logits,
        each_trace=pages,
    )
    for text_of_note in w.notes:
        note(f"Note: {printable(text_of_note)}", quiet=quiet)
    top = None if w.logits is None else top_tokens(checkpoint, config, w.logits)
    if layer is None:
        from attn_cli.present.modelview import ModelView, render_json, render_text

        view = ModelView.of(w.family, [printable(t) for t in w.tokens], w.weights)
        if pages is not None:
            from attn_cli.present.model_page import model_page

            page = model_page(view, pages, printable(str(checkpoint)), language, theme.value)
            emit(page, output, quiet=quiet)
            if output is None:  # standard output stays one document
                return
        elif fmt is ViewFormat.json:  # the top next tokens inside the JSON: one document
            emit(render_json(view, next_tokens=top), None, escape="json")
            return
        else:
            columns = width if width is not None else _terminal_width()
            emit(render_text(view, columns, language), None)
    if top is not None:
        lines = [f"Next token after {printable(w.tokens[-1])!r} (final norm, LM head in NumPy):"]
        lines += [f"  {p:8.4f}  {printable(tok)!r} (id {i})" for tok, i, p in top]
        emit("\n".join(lines) + "\n", None)


def _terminal_width() -> int:
    import shutil
    import sys

    from attn_cli.cli.options import NON_TERMINAL_WIDTH

    if not sys.stdout.isatty():
        return NON_TERMINAL_WIDTH
    return shutil.get_terminal_size((NON_TERMINAL_WIDTH, 24)).columns
