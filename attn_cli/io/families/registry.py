"""The families ``attn import`` reads, found by model_type the way a variant is found by its name
(core/variant.py's REGISTRY): each is one ``Family`` object, defined in one module of
``attn_cli/io/families/models/`` and registered here; a family registered from outside (a
test, a plug-in) imports with no edit to the package.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from attn_cli.io.families.config import Config
from attn_cli.io.families.keys import Keys
from attn_cli.io.families.plan import BlockPlan, HeadPlan, LayerPlan

PlanLayer = Callable[[Config, int], LayerPlan]  # config.json, layer -> the layer's plan
PlanBlock = Callable[[Config, LayerPlan], BlockPlan]  # the block past attention (NumPy forward)
# config.json, layer 0's plan, the checkpoint's tensor names, their prefix -> final norm, LM head
PlanHead = Callable[[Config, LayerPlan, set[str], str], HeadPlan]


@dataclass(frozen=True)
class Wrapper:
    """An image-text model type whose text model is a family attn imports: config.json holds
    that model's config under ``text_config``, the checkpoint its tensors under a prefix."""

    text: str  # the text_config's model_type: the family the layers are read as
    prefixes: tuple[str, ...]  # where the text model's tensors are; the first one is assumed


@dataclass(frozen=True)
class Family:
    """One checkpoint family: its config.json keys, layer plan, block and head, by model_type.

    ``plan`` names the layer's tensors and each variant's setting; ``block`` and ``head`` give
    the NumPy forward (None: layer 0 only; an encoder's head refuses the logits); ``wrapper`` reads
    the family as the text model it wraps."""

    name: str  # config.json's model_type
    hf_class: str  # transformers' class of the model (docs/families.md)
    shows: str  # what attn shows of it, one line (docs/families.md)
    keys: Keys
    plan: PlanLayer
    block: PlanBlock | None = None
    head: PlanHead | None = None
    wrapper: Wrapper | None = None
    # why --arch NAME cannot tell this family from another (its conventions show in no key)
    arch_refused: str = ""
    stems: tuple[str, ...] = ()  # other models' names its tensors' prefix may carry
    plain_rms: bool = False  # an RMSNorm scaling by the weight: a GELU MLP marks a Gemma instead
    reads_partial: bool = False  # its plan reads partial_rotary_factor


REGISTRY: dict[str, Family] = {}  # by model_type, in the order they were registered


def register(family: Family) -> Family:
    """Make ``family`` importable by its model_type (a second one of a name replaces the first)."""
    REGISTRY[family.name] = family
    return family


def unregister(name: str) -> None:
    """Forget the family of model_type ``name`` (a test's own)."""
    REGISTRY.pop(name, None)


@contextmanager
def registered(family: Family) -> Iterator[Family]:
    """``family`` registered for the ``with`` block, then forgotten."""
    register(family)
    try:
        yield family
    finally:
        unregister(family.name)


def names() -> tuple[str, ...]:
    """Every registered model_type, in registration order."""
    return tuple(REGISTRY)


def get(name: str) -> Family:
    """The family of model_type ``name`` (registered: family_of checks it first)."""
    return REGISTRY[name]
