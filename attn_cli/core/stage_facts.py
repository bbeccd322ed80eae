"""What the stage table's rows (core/stages.py, core/gradient_rows.py) ask of the chain of a
fixture, and the marker of a slot the variants' rows fill. No NumPy at import."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from attn_cli.core.chain import Chain
    from attn_cli.core.inputs import Inputs


def chain_of(inputs: Inputs) -> Chain:
    """The chain of the fixture's variants."""
    from attn_cli.core.chain import Chain  # NumPy: not on the path of `attn --help`

    return Chain(inputs)


def final_stage(inputs: Inputs) -> str:
    """The stage L is taken over: ``projected`` when there is W_O, else what concat joins
    (``output``, or a head-output transform's stage: ``gated``)."""
    return "projected" if inputs.W_O is not None else chain_of(inputs).joined


def has_masked(inputs: Inputs) -> bool:
    """Whether anything masks or biases the scores (the chain's biases and allowed-keys rules:
    causal, window, mask, lengths, bias, ALiBi, any registered variant), i.e. whether
    ``masked`` applies."""
    return chain_of(inputs).masks


def not_allowed_by(inputs: Inputs) -> list[str]:
    """What hides keys from a query: ``causal upper-left``, ``window 3``, ``mask``, ``lengths``."""
    return chain_of(inputs).hides()


def parts(inputs: Inputs, stage: str) -> str:
    """What the variants that are on add to a base stage's formula (a sink joined ...)."""
    return "".join(v.formula_part(x, inputs, stage) for v, x in chain_of(inputs).on)


def always(inputs: Inputs) -> bool:
    """A row that applies to every fixture."""
    return True


class Slot(NamedTuple):
    """Where the variants' rows of one kind go among the base rows."""

    kind: str  # "front", "transform", "modifier", "bias", "out", "side"; "d_out", "extra", ...
