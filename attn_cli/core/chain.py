"""The one chain of attention, as the variants that are on make it (core/variant.py):

    Q, K -> the Q/K transforms (Q_norm, Q_rot) -> scores -> scaled -> score modifiers (capped)
    -> masked = + biases (the fixture's, ALiBi), the fill where no key is allowed (causal,
    window, mask, lengths, an empty cache slot) -> softmax with extra logits (a sink per head)
    -> output = weights·V -> the head-output transforms (a gate) -> the heads joined

``Chain`` holds the hooks; core/steps.py ``attention`` is the chain, composed once. The block
engine, KV-cache decoding, FlashAttention-2 tiles, the backward pass and the grader each call it
over their own cells (core/variant.py ``Cells``); none of them names a variant.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

import attn_cli.core.plugins  # noqa: F401 (registers the variants attn ships)
from attn_cli.core.variant import REGISTRY as REGISTRY  # with the variants above registered
from attn_cli.core.variant import (
    BoolArray,
    CacheRule,
    Cast,
    Cells,
    ExtraLogit,
    FloatArray,
    FrontEnd,
    IntArray,
    OutTransform,
    QKAt,
    ScoreModifier,
    Traced,
    Variant,
    own_loop,
    refuse_clash,
    same,
)
from attn_cli.errors import UsageError

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs

Into = Callable[[str], "FloatArray | None"]  # where a stage's cells go (a kept array), or None


def _overrides(variant: Variant, hook: str) -> bool:
    return getattr(type(variant), hook) is not getattr(Variant, hook)


class Chain:
    """The variants of ``inputs`` that are on, at each hook, in registry order."""

    def __init__(self, inputs: Inputs) -> None:
        self.inputs = inputs
        self.on = on = [(v, x) for v in REGISTRY.values() if (x := v.value(inputs)) is not None]
        refuse_clash(inputs, [v for v, _ in on])  # what the variants declare runs together
        self.transforms = [(v, x) for v, x in on if v.suffix is not None]
        self.modifiers = [(v, x) for v, x in on if isinstance(v, ScoreModifier)]
        self.biases = [(v, x) for v, x in on if _overrides(v, "bias")]
        self.rules = [(v, x) for v, x in on if _overrides(v, "allowed")]
        self.extras = [(v, x) for v, x in on if isinstance(v, ExtraLogit)]
        self.outs = [(v, x) for v, x in on if isinstance(v, OutTransform)]
        self.cache_rules = [(v, x) for v, x in on if isinstance(v, CacheRule)]
        self.fill = inputs.mask_value  # -inf, or a finite sentinel as real code uses

    # -- what the chain has ---------------------------------------------------------------------

    @property
    def front(self) -> tuple[FrontEnd[Any], Any] | None:
        """The variant that makes Q, K and V from X itself (MLA), and its setting; None."""
        return next(((v, x) for v, x in self.on if isinstance(v, FrontEnd)), None)

    @property
    def stages(self) -> tuple[str, ...]:
        """The score modifiers' stages, in order (``capped``)."""
        return tuple(str(v.stage) for v, _ in self.modifiers)

    @property
    def masks(self) -> bool:
        """Whether anything biases or hides keys: the `masked` stage applies."""
        return bool(self.biases or self.rules)

    @property
    def extra(self) -> bool:
        """Whether the softmax joins extra logits (a sink per head)."""
        return bool(self.extras)

    def hides(self) -> list[str]:
        """What hides keys, as `masked`'s formula says it (``causal upper-left``, ``window 3``)."""
        return [h for v, x in self.rules if (h := v.hides(x)) is not None]

    # -- the Q/K transforms (QK-norm, RoPE), in chain order --------------------------------------

    def transforms_of(self, which: str) -> list[tuple[Variant, Any]]:
        """The transforms of Q or K (``which``) that are on, in the order they run."""
        return [(v, x) for v, x in self.transforms if which in v.transforms]

    def qk_stages(self, which: str) -> tuple[str, ...]:
        """Q or K and each transform's stage, in order: ``("Q", "Q_norm", "Q_rot")``."""
        return (which, *(f"{which}_{v.suffix}" for v, _ in self.transforms_of(which)))

    def query_key(self, which: str) -> str:
        """The stage the scores read for Q or K: the last transform's, else Q or K itself."""
        return self.qk_stages(which)[-1]

    def before_positional(self, which: str) -> str:
        """The stage of Q or K before the first transform that reads positions: what a decode
        loop takes whole, to transform each token as it arrives (by that transform and every
        one after it)."""
        stages = self.qk_stages(which)
        for i, (v, _) in enumerate(self.transforms_of(which)):
            if v.positional:
                return stages[i]
        return stages[-1]

    def transform(
        self,
        which: str,
        x: FloatArray,
        positions: IntArray,
        cast: Cast = same,
        into: Callable[[str, FloatArray], None] | None = None,
        positional: bool | None = None,
    ) -> FloatArray:
        """Q or K (B, heads, n, D) at ``positions`` (n,) through its transforms in turn (only
        the positional ones, or only the others, when ``positional`` says), each result handed
        to ``into(stage, array)``."""
        at = QKAt(self.inputs, which, positions, cast)
        for v, value in self.transforms_of(which):
            if positional is not None and v.positional != positional:
                continue
            x = v.transform(value, at, x)
            if into is not None:
                into(f"{which}_{v.suffix}", x)
        return x

    # -- the head-output transforms (a gate), after softmax·V, before the heads are joined ------

    @property
    def out_stages(self) -> tuple[str, ...]:
        """The head-output transforms' stages, in order (``gate``, ``gated``)."""
        return tuple(s for v, _ in self.outs for s in v.out_stages)

    @property
    def joined(self) -> str:
        """The stage concat joins: the last head-output transform's, else ``output``."""
        return self.outs[-1][0].out_stages[-1] if self.outs else "output"

    def transform_out(
        self,
        output: FloatArray,
        X: FloatArray | None,
        cast: Cast = same,
        into: Callable[[str, FloatArray], None] | None = None,
        seen: Mapping[str, FloatArray] | None = None,
    ) -> FloatArray:
        """The attention output (B, H, T, Dv) through each head-output transform in turn, each
        one's stages handed to ``into(stage, array)``; the last transform's output. ``seen``:
        the chain's stages the transforms read (their ``out_reads``)."""
        read = {**(seen or {}), **({} if X is None else {"X": X})}
        run = Traced(self.inputs, read, cast)
        for v, value in self.outs:
            made = v.out_transform(value, run, output)
            if into is not None:
                for stage in v.out_stages:
                    into(stage, made[stage])
            output = made[v.out_stages[-1]]
        return output

    # -- the hooks, run over cells --------------------------------------------------------------

    def bias_terms(self, cells: Cells, dtype: Any, into: Into) -> list[FloatArray]:
        """Each additive bias of the cells, (b, h, R, S)-broadcastable; a bias that is a stage
        (ALiBi) is written where ``into`` says, and that array is the term."""
        terms = []
        for v, value in self.biases:
            term = v.bias(value, self.inputs, cells, dtype)
            if term is None:
                continue
            kept = None if v.bias_stage is None else into(v.bias_stage)
            if kept is not None:
                np.copyto(kept, term)
                term = kept
            terms.append(term)
        return terms

    @property
    def bias_stages(self) -> tuple[str, ...]:
        """The biases that are stages of their own (ALiBi's)."""
        return tuple(str(v.bias_stage) for v, _ in self.biases if v.bias_stage is not None)

    def bias_stage(self, name: str, cells: Cells, dtype: Any) -> FloatArray:
        """One bias stage over the cells, (b, h, R, S)-broadcastable."""
        [(variant, value)] = [(v, x) for v, x in self.biases if v.bias_stage == name]
        term = variant.bias(value, self.inputs, cells, dtype)
        assert term is not None, name
        return term

    def allowed(self, cells: Cells) -> BoolArray | None:
        """True where a query may attend, (b, h, R, S)-broadcastable; None when every key may."""
        parts = [a for v, x in self.rules if (a := v.allowed(x, self.inputs, cells)) is not None]
        if cells.keys.size and int(cells.keys.min()) < 0:  # an empty cache slot holds no key
            parts.append(cells.keys[None, None, None, :] >= 0)
        if not parts:
            return None
        allowed = parts[0]
        for part in parts[1:]:
            allowed = allowed & part
        return allowed

    def masked(
        self,
        x: FloatArray,
        cells: Cells,
        out: FloatArray | None,
        into: Into,
        fill: float | None = None,
    ) -> tuple[FloatArray, BoolArray | None, list[FloatArray]]:
        """masked = x + the biases, ``fill`` where not allowed: (masked, allowed, the biases).

        ``fill`` overrides the fixture's ``mask_value`` (FlashAttention and a KV cache hide
        with -inf whatever the fixture says)."""
        terms = self.bias_terms(cells, x.dtype, into)
        if out is None:  # a copy of x as wide as the cells (x may broadcast to them)
            masked: FloatArray = (
                x.copy() if x.shape == cells.shape else np.broadcast_to(x, cells.shape).copy()
            )
        else:
            masked = out
            if out is not x:
                np.copyto(out, x)
        for term in terms:
            np.add(masked, term, out=masked)
        allowed = self.allowed(cells)
        if allowed is not None:
            np.copyto(masked, self.fill if fill is None else fill, where=~allowed)
        return masked, allowed, terms

    def extra_logit(self, cells: Cells, dtype: Any) -> FloatArray | None:
        """The extra logit of each row, (1, h, 1, 1); None when there is none. Several join as
        one: log Σ exp."""
        logits = [v.extra_logit(x, cells, dtype) for v, x in self.extras]
        found = [np.asarray(l, dtype=dtype) for l in logits if l is not None]  # noqa: E741
        if not found:
            return None
        total = found[0] if len(found) == 1 else np.logaddexp.reduce(np.stack(found), axis=0)
        out: FloatArray = total.reshape(1, -1, 1, 1)
        return out

    def refuse_own_loop(self, why: str, expected: str, option: str | None = None) -> None:
        """A loop of one softmax map over a KV cache (decoding, a batch, a paged cache) cannot
        run a variant whose decode has a loop of its own: refused in one line naming it."""
        for v, _ in self.on:
            if own_loop(v):
                raise UsageError(self.inputs.source, v.name, why, expected, option=option)

    # -- the cache rules (KV-cache decoding) ------------------------------------------------------

    def cache_slots(self) -> int | None:
        """How many slots a KV cache needs (the fewest any variant asks for); None: it grows."""
        asked = [n for v, x in self.cache_rules if (n := v.cache_slots(x, self.inputs)) is not None]
        return min(asked) if asked else None

    def without_cache_rules(self) -> Chain:
        """This chain as a loop that trusts its cache to apply the cache rules: the allowed-keys
        rules of the variants with a cache rule left out (a ring one slot too big shows)."""
        ruled = {v.name for v, x in self.cache_rules if v.cache_slots(x, self.inputs) is not None}
        trusting = copy.copy(self)
        trusting.rules = [(v, x) for v, x in self.rules if v.name not in ruled]
        return trusting

    # -- bounds for the overflow checks, and gradients ------------------------------------------

    def bound_logits(self, bound: float) -> float:
        """The largest |logit| after the modifiers, given the largest |scaled|."""
        for v, value in self.modifiers:
            bound = v.bound_modify(value, bound)
        return bound

    def bound_biases(self) -> float:
        """The largest finite |bias| the biases add, summed."""
        return sum((v.bound_bias(x, self.inputs) for v, x in self.biases), 0.0)

    def grad_modifiers(self, d: FloatArray, before: list[FloatArray]) -> list[FloatArray]:
        """Back through the modifiers: the gradient of each modifier's input, last first;
        ``before`` holds each modifier's input (scaled for the first)."""
        grads = []
        for (v, value), x_in in zip(reversed(self.modifiers), reversed(before), strict=True):
            d = v.grad_modify(value, d, x_in)
            grads.append(d)
        return grads

    def grad_extras(self, weights: FloatArray, delta: FloatArray) -> dict[str, FloatArray]:
        """The gradient stage of each extra logit (``d_<name>``), by stage name."""
        return {str(v.gradient): v.grad_extra(x, weights, delta) for v, x in self.extras}


def cells_of(
    inputs: Inputs,
    batch: IntArray | slice,
    heads: IntArray | slice,
    queries: IntArray | slice,
    keys: IntArray | slice | None = None,
) -> Cells:
    """The cells of a block or tile of the fixture's own (T, S) grid, at its token positions."""
    pos_q, pos_k = inputs.token_positions()
    T, S = inputs.seq_q, inputs.seq_k
    q_idx = np.arange(T)[queries]
    k_idx = np.arange(S)[slice(None) if keys is None else keys]
    return Cells(
        np.arange(inputs.batch)[batch],
        np.arange(inputs.heads)[heads],
        q_idx,
        k_idx,
        pos_q[q_idx],
        pos_k[k_idx],
    )


def allowed_span(chain: Chain, cells: Cells) -> tuple[int, int]:
    """The keys s0:s1 (indices into ``cells.keys``) from the first that any of the cells may
    attend to the last, by the chain's allowed-keys rules: with −∞ as the fill, every weight
    outside them is exactly 0."""
    allowed = chain.allowed(cells)  # (b, h, R, S)-broadcastable, None: every key
    if allowed is None:
        return 0, len(cells.keys)
    if 0 in cells.shape:
        return 0, 0
    # any over its own leading axes (where it broadcasts they are 1: no need to repeat them)
    own = np.asarray(allowed).reshape((1,) * (4 - np.ndim(allowed)) + np.shape(allowed))
    found = np.flatnonzero(np.broadcast_to(own.any(axis=(0, 1, 2)), (cells.shape[3],)))  # (S,)
    if not found.size:
        return 0, 0
    return int(found[0]), int(found[-1]) + 1
