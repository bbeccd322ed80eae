"""What present/ says about each variant attn ships: one module per variant (its labels,
header lines, explainers, worked-cell parts and notes in the decode and flash views), each with
a ``TEXTS`` object (``ALL_TEXTS``, a module of variants that share their texts: linear
attention's two), and the questions the presenters ask of them all.

The modules load the first time they are needed: when a variant is on in the inputs shown, or
when a view asks for every variant's texts. A trace with none on (the default example) never
imports them, which keeps start-up light. They register (variant_texts.py) in the order of
their ``order``, the header's; a variant defined outside attn registers its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attn_cli.core.variant import REGISTRY
from attn_cli.discover import submodules
from attn_cli.present.variant_texts import TEXTS, VariantTexts, register

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.present.i18n import Lang

_loaded: list[bool] = []  # one item once the modules here are imported


def all_texts() -> list[VariantTexts]:
    """Every registered variant's texts, attn's own loaded, in their order."""
    if not _loaded:
        _loaded.append(True)
        modules = submodules(__name__, __path__)
        every = (
            t for m in modules for t in (m.ALL_TEXTS if hasattr(m, "ALL_TEXTS") else (m.TEXTS,))
        )
        for texts in sorted(every, key=_order):
            register(texts)
    return sorted(TEXTS.values(), key=_order)


def texts(inp: Inputs) -> list[VariantTexts]:
    """The texts to consult for these inputs, in their order: every registered one (each says
    nothing when its variant is off), attn's own loaded when some variant is on."""
    if any(v.value(inp) is not None for v in REGISTRY.values()):
        return all_texts()
    return sorted(TEXTS.values(), key=_order)


def _order(t: VariantTexts) -> int:
    return t.order


def active(inp: Inputs) -> list[VariantTexts]:
    """The variants set in these inputs, in their order."""
    return [t for t in texts(inp) if t.setting(inp) is not None]


def modifier(inp: Inputs) -> VariantTexts | None:
    """The last score modifier in force (its stage is what masked starts from), or None."""
    modifiers = [t for t in active(inp) if t.stage is not None]
    return modifiers[-1] if modifiers else None


def modifier_stage(inp: Inputs) -> str | None:
    """The last score modifier's stage in force, or None."""
    t = modifier(inp)
    return None if t is None else t.stage


def extra_logit(inp: Inputs, head: int) -> float | None:
    """The extra logit joined to the softmax rows of ``head`` (a sink), or None."""
    return next((x for t in active(inp) if (x := t.extra_logit(inp, head)) is not None), None)


def has_extra_logit(inp: Inputs) -> bool:
    """Whether some variant joins a logit to every softmax row."""
    return inp.heads > 0 and extra_logit(inp, 0) is not None


def ring_slots(inp: Inputs) -> int | None:
    """The slots of the KV cache's ring buffer, as core's chain counts them (the cache rules
    capped to the sequence); None: the cache grows."""
    from attn_cli.core.chain import Chain

    return Chain(inp).cache_slots()


def math_names() -> set[str]:
    """Every variant's words that are math in a formula."""
    return {n for t in all_texts() for n in t.math_names}


def view_notes(view: str) -> dict[str, dict[Lang, tuple[str, str]]]:
    """The variants' notes in ``view`` (decode, flash), by key."""
    return {k: v for t in all_texts() for k, v in t.view_notes.get(view, {}).items()}


def view_inputs(view: str) -> dict[str, tuple[str, ...]]:
    """What the variants' notes in ``view`` are computed from, by key."""
    return {k: v for t in all_texts() for k, v in t.view_inputs.get(view, {}).items()}


def view_asides(view: str, key: str, lang: Lang) -> str:
    """What the variants add to the note ``key`` of ``view``, in their order."""
    return "".join(t.view_asides.get(view, {}).get(key, {}).get(lang, "") for t in all_texts())
