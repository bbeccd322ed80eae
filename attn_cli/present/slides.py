"""A trace as slides: one file per stage (``01-X.svg``, ``02-Q.svg``...), optionally a Marp deck.

The whole trace in one SVG is a 3600-px scroll, not a slide deck. Here each stage is its own
image, sized by its content, in the dark terminal theme or the light one for projectors. The
``marp`` format adds ``slides.md``: a Marp deck (Markdown slides; ``marp slides.md --pptx``
gives PowerPoint, ``--pdf`` a PDF) with one slide per image and each stage's explanation as the
speaker's notes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from attn_cli.errors import UsageError
from attn_cli.io.gate import kind_of

if TYPE_CHECKING:
    from rich.console import RenderableType

    from attn_cli.core.pipeline import Trace
    from attn_cli.present.options import RenderOptions
    from attn_cli.present.svg import Theme

SlideFormat = Literal["svg", "html", "marp"]
SLIDE_FORMATS: tuple[SlideFormat, ...] = ("svg", "html", "marp")
SLIDE_WIDTH = 100  # columns; a 16:9 slide holds about 100 columns of the projector's text
DECK = "slides.md"  # the Marp deck's file name


@dataclass(frozen=True)
class Slide:
    """One file of a slide set: its name in the folder and its text."""

    name: str
    text: str


def slides(
    trace: Trace,
    options: RenderOptions,
    fmt: SlideFormat = "svg",
    *,
    width: int = SLIDE_WIDTH,
    theme: Theme = "dark",
) -> list[Slide]:
    """The files of a slide set: ``00-setup`` (the configuration), then one per stage."""
    from attn_cli.present.render import render_header, render_stage, to_html, to_svg
    from attn_cli.present.worked import worked_cells

    export, ext = (to_html, "html") if fmt == "html" else (to_svg, "svg")
    lang = options.lang
    name = trace.inputs.name or trace.inputs.source
    pages: list[tuple[str, RenderableType]] = [("setup", render_header(trace, options.lang))]
    cells = [] if options.cell is None else worked_cells(trace, options.cell)
    stages = [s for s in trace if options.stages is None or s.name in options.stages]
    pages += [(s.name, render_stage(trace, s, options, cells)) for s in stages]
    out = [
        Slide(f"{k:02d}-{page}.{ext}", export(renderable, width, f"{name} · {page}", theme, lang))
        for k, (page, renderable) in enumerate(pages)
    ]
    if fmt == "marp":
        out.append(Slide(DECK, marp_deck(trace, options, [s.name for s in out], theme)))
    return out


def write_slides(
    trace: Trace,
    options: RenderOptions,
    folder: Path,
    fmt: SlideFormat = "svg",
    *,
    width: int = SLIDE_WIDTH,
    theme: Theme = "dark",
) -> list[Path]:
    """Write :func:`slides` into ``folder`` (made if missing), each file atomically."""
    from attn_cli.io.files import write_atomic

    if kind_of(folder) not in (None, "dir"):
        raise UsageError(str(folder), "", "is not a folder", "a folder (made if missing)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as e:  # too long a name, no permission, a file on the way
        what = f"cannot make the folder ({getattr(e, 'strerror', None) or e})"
        raise UsageError(str(folder)[:200], "", what, "a folder that can be made") from None
    written = []
    for slide in slides(trace, options, fmt, width=width, theme=theme):
        write_atomic(folder / slide.name, slide.text)
        written.append(folder / slide.name)
    return written


def marp_deck(trace: Trace, options: RenderOptions, images: list[str], theme: Theme) -> str:
    """A Marp deck showing ``images`` one per slide, the explanations as speaker's notes."""
    from attn_cli.core.stages import SPECS
    from attn_cli.present.explain import explain_stage  # (fills EXPLAINERS)
    from attn_cli.present.explain_registry import explainer
    from attn_cli.present.i18n import label

    title = trace.inputs.name or label(options.lang, "trace_title")
    colours = "class: invert\n" if theme == "dark" else ""
    out = ["---", "marp: true", "paginate: true", f"title: {_yaml_string(title)}"]
    out += [colours.rstrip()] if colours else []
    out += ["---", ""]
    for n, image in enumerate(images):
        if n:
            out += ["---", ""]
        out += [f"![bg contain]({image})", ""]
        stage = image.split("-", 1)[1].rsplit(".", 1)[0]
        if stage in SPECS and explainer(SPECS[stage].explain) is not None:
            expl = explain_stage(trace, stage, options.lang, options.precision)
            out += ["<!--", *(_note(line) for line in (*expl.formula, *expl.meaning)), "-->", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def _note(text: str) -> str:
    """A line of speaker's notes: nothing in it may close the HTML comment."""
    return text.replace("--", "- -")


def _yaml_string(text: str) -> str:
    """A YAML double-quoted scalar: JSON's, non-printable characters as ``\\u`` escapes."""
    from attn_cli.io.trace_json import json_text

    return json_text(text)
