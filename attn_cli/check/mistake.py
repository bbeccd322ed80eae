"""What a grader mistake is: one object, registered by the name of the variant it belongs to.

A module of ``check/mistakes/`` holds the mistakes of one variant (a score modifier applied
after the mask, a bias with its sign flipped) and registers each in :data:`TABLE` under the
variant's name (its fixture key, as core/variant.py's ``REGISTRY`` has it); the mistakes of
plain attention go under :data:`PLAIN`. The grader tries those of plain attention and of the
variants that are on, in ``order``, and names a mistake only when its recomputation
(check/recompute.py) reproduces the user's numbers. A mistake that does not apply to a
fixture returns no candidates.

Each module also says in Chinese what its mistakes are and how to fix them (:data:`ZH`, by the
mistake's name, :func:`register_zh`); the English is the mistake's own detail, which carries
the fixture's numbers.

A variant that reads token positions registers a :class:`Reader` too: the mistake of reading
positions one off (mistakes/positions.py) asks each reader that is on what it changes.

A variant's mistakes in a KV-cache decode loop or a FlashAttention kernel are
:class:`LoopMistake` objects in :data:`DECODE` and :data:`FLASH`, by the variant's name: core's
loop run again with some of its generic bugs switched on (core/decode.py's ``DecodeBugs``,
core/flash.py's ``FlashBugs``); the mistakes of the loop itself stay in core.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from attn_cli.check.recompute import Candidate, Change, allowed, candidate, masked_with
from attn_cli.core.chain import Chain
from attn_cli.core.stages import STAGE_NAMES

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.core.pipeline import Trace

PLAIN = ""  # the key of the mistakes of plain attention: tried on every fixture


@dataclass(frozen=True)
class Mistake:
    """A named mistake: ``candidates(trace)`` is empty when it does not apply to the fixture."""

    name: str
    title: str
    candidates: Callable[[Trace], list[Candidate]]
    order: int = 500  # where it is tried among the others, lowest first
    fallback: bool = False  # tried only when no other mistake fits


@dataclass(frozen=True)
class Reader:
    """A variant that reads token positions, as the mistake of reading them one off sees it.

    ``moved(trace, dq, dk)`` is its own stages with the query positions moved by dq and the key
    positions by dk (detail left empty), None when that changes nothing; a reader without
    ``moved`` (an allowed-keys rule) only joins the others when all read the moved positions."""

    label: str  # how a diagnosis names it: "RoPE"
    stage: str  # the first stage it changes: readers are listed in stage order
    moved: Callable[[Trace, int, int], Change | None] | None = None


@dataclass(frozen=True)
class LoopMistake:
    """A variant's mistake in a decode loop or a flash kernel: core's loop run with ``bugs``
    where ``applies(chain, options)`` (``options``: the loop's keyword arguments)."""

    name: str
    description: str  # what the recomputed loop does
    bugs: Any  # core.decode.DecodeBugs or core.flash.FlashBugs
    applies: Callable[[Chain, Mapping[str, Any]], bool] = lambda chain, options: True
    title: str = ""  # how the grader lists it, when not the description

    @property
    def heading(self) -> str:
        return self.title or self.description


TABLE: dict[str, list[Mistake]] = {}  # by variant name (PLAIN: plain attention)
ZH: dict[str, tuple[str, str]] = {}  # by mistake name: (title, what it is and the fix) in Chinese
READERS: dict[str, Reader] = {}  # by variant name
DECODE: dict[str, list[LoopMistake]] = {}  # by variant name
FLASH: dict[str, list[LoopMistake]] = {}  # by variant name
# a decode or flash loop's mistake, by name: (the fix in English, title and explanation in Chinese)
LOOP_TEXTS: dict[str, tuple[str, str, str]] = {}


def moved_positions(inputs: Inputs, dq: int, dk: int) -> Inputs:
    """The inputs with the query positions moved by ``dq`` and the key positions by ``dk``."""
    pos_q, pos_k = inputs.token_positions()
    return replace(inputs, positions=pos_q + dq, key_positions=pos_k + dk)


def register(variant: str, *mistakes: Mistake) -> None:
    """Add mistakes under a variant's name (one mistake may belong to several variants)."""
    TABLE.setdefault(variant, []).extend(mistakes)


def register_zh(texts: Mapping[str, tuple[str, str]]) -> None:
    """Say in Chinese what mistakes are and how to fix them: name -> (title, explanation)."""
    ZH.update(texts)


def register_loop_texts(texts: Mapping[str, tuple[str, str, str]]) -> None:
    """Say how to fix a loop's mistake (core's decode and flash mistakes, the variants'):
    name -> (the fix in English, the title in Chinese, what it is and the fix in Chinese)."""
    LOOP_TEXTS.update(texts)


def register_reader(variant: str, reader: Reader) -> None:
    """Say how a variant reads token positions (see :class:`Reader`)."""
    READERS[variant] = reader


def register_loop(table: dict[str, list[LoopMistake]], variant: str, *m: LoopMistake) -> None:
    """Add a variant's decode (``DECODE``) or flash (``FLASH``) mistakes."""
    table.setdefault(variant, []).extend(m)


def loop_mistakes(
    table: dict[str, list[LoopMistake]], chain: Chain, options: Mapping[str, Any]
) -> list[LoopMistake]:
    """The decode or flash mistakes of the chain's variants that apply, in registry order."""
    on = [m for v, _ in chain.on for m in table.get(v.name, [])]
    return [m for m in on if m.applies(chain, options)]


def every_loop_mistake(table: dict[str, list[LoopMistake]]) -> list[LoopMistake]:
    """Every registered decode or flash mistake, whatever variant it belongs to."""
    return [m for mistakes in table.values() for m in mistakes]


def _sorted(mistakes: list[Mistake]) -> list[Mistake]:
    """Each mistake once, in ``order``, the fallbacks last."""
    once = list({id(m): m for m in mistakes}.values())
    return sorted(once, key=lambda m: (m.fallback, m.order))


def mistakes_for(inputs: Inputs) -> list[Mistake]:
    """The mistakes of plain attention and of each variant that is on, in the order tried."""
    on = Chain(inputs).on
    names = [PLAIN, *(v.name for v, _ in on)]
    mixers = [v.name for v, _ in on if v.mixer_stages]
    if mixers:  # the others' mistakes are softmax's: a mixer (linear attention) replaces it
        names = mixers
    return _sorted([m for name in names for m in TABLE.get(name, [])])


def bias_alone(trace: Trace) -> bool:
    """Whether one additive bias alone comes between the scaled scores and the mask: no score
    modifier before it, no second bias beside it (so scores · scale + bias is all there is)."""
    chain = Chain(trace.inputs)
    return not chain.modifiers and len(chain.biases) == 1


def scaled_with_bias(trace: Trace, detail: str) -> list[Candidate]:
    """``masked`` as a bias added before the scale makes it, (scores + bias) · scale, when one
    bias alone comes between the scaled scores and the mask and the scale is not 1; ``detail``
    says which bias and why it goes after."""
    if trace.scale == 1 or not bias_alone(trace):
        return []
    masked = masked_with(trace, allowed(trace.inputs), before="scores") * trace.scale  # (B,H,T,S)
    return [candidate(trace, detail, "masked", {"masked": masked})]


def every_mistake() -> tuple[Mistake, ...]:
    """Every registered mistake, in the order tried."""
    return tuple(_sorted([m for mistakes in TABLE.values() for m in mistakes]))


def readers_for(inputs: Inputs) -> list[Reader]:
    """The readers of token positions that are on, in the order of the stages they change."""
    on = [READERS[v.name] for v, _ in Chain(inputs).on if v.name in READERS]
    return sorted(on, key=lambda r: STAGE_NAMES.index(r.stage))
