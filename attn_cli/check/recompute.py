"""The grader's recomputation: attn's stages again from any stage on, as the one chain makes them
(core/chain.py), with a mistake's stages or inputs in place of attn's (``downstream``).

It works on whole arrays in the internal layout, float64 and batch axis first (B, H, T, S), and
only ever starts from the trace's own stages. A mistake (check/mistakes/) says only what the
mistaken code changes (a :class:`Change`); this recomputes everything after it. The Q/K
transforms, score modifiers, biases, allowed-keys rules and extra logits are the chain's: no
variant is named here. Axis names as in core/steps.py.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli.core.chain import Chain, cells_of
from attn_cli.core.heads import merge_heads, split_heads
from attn_cli.core.inputs import BoolArray, FloatArray, Inputs
from attn_cli.core.stages import SPECS, STAGE_NAMES, softmax_input
from attn_cli.core.steps import (
    Way,
    attention,
    project,
    repeat_kv,
    softmax_rows,
)
from attn_cli.core.variant import Cells, QKAt, Traced, Variant

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace

Weights = Callable[[FloatArray], FloatArray]  # a softmax of (B, H, T, S)
Expand = Callable[[FloatArray, int], FloatArray]  # kv heads (B, Hkv, S, D) -> (B, H, S, D)
Rule = Callable[[Cells], BoolArray]  # an allowed-keys rule done another way (a mistake's)


@dataclass(frozen=True, eq=False)
class Change:
    """What a mistaken computation changes: from ``start`` on, ``values`` replace stages and
    ``inputs`` the fixture's inputs (positions, a variant's setting, weights); ``expand`` maps
    kv heads to query heads, when the mistake is there. Whether a row the mistake empties is nan
    or 0 is not said here: the grader follows the user's own softmax."""

    detail: str
    start: str
    values: Mapping[str, FloatArray] = field(default_factory=dict)
    inputs: Inputs | None = None
    expand: Expand | None = None


@dataclass(frozen=True)
class Candidate:
    """The stages a mistaken computation produces (internal layout), and how it went wrong.

    ``rerun`` recomputes the same stages with another softmax (the user's, where it gives nan
    rows); ``note`` is said after the confirmation."""

    detail: str
    stages: Mapping[str, FloatArray]
    rerun: Callable[[Weights], Mapping[str, FloatArray]] | None = None
    note: str = ""


# ---------------------------------------------------------------------------------------------
# Whole arrays through the chain


def internal(trace: Trace, name: str) -> FloatArray:
    """A stage of the trace in the internal layout: float64, batch axis first."""
    data = trace[name].data.astype(np.float64)
    return data if trace.inputs.has_batch or SPECS[name].axes[0] != "batch" else data[None]


def whole(inputs: Inputs) -> Cells:
    """Every cell of the fixture: all batch items, query heads, queries and keys."""
    return cells_of(inputs, slice(None), slice(None), slice(None))


def extra_logit(inputs: Inputs) -> FloatArray | None:
    """The chain's extra logit of each head, (1, H, 1, 1); None when there is none."""
    return Chain(inputs).extra_logit(whole(inputs), np.float64)


def softmax_and_lse(x: FloatArray, extra: FloatArray | None) -> tuple[FloatArray, FloatArray]:
    """The pipeline's softmax of (B, H, T, S) with the chain's ``extra`` logit joined to every
    row (see :func:`extra_logit`), and each row's lse."""
    lse = np.empty(x.shape[:3], dtype=x.dtype)  # (B, H, T)
    weights, _ = softmax_rows(x, None, sink=extra, lse=lse)  # (B, H, T, S)
    return weights, lse


def bias_stage(inputs: Inputs, name: str) -> FloatArray:
    """A bias that is a stage of its own (ALiBi), (B, H, T, S), from ``inputs``."""
    cells = whole(inputs)
    term = Chain(inputs).bias_stage(name, cells, np.dtype(np.float64))  # (1, H, T, S)
    return np.ascontiguousarray(np.broadcast_to(term, cells.shape))  # (B, H, T, S)


class _Handed(Variant):
    """A hook's result as the recomputation was handed it (a mistake's bias stage, a mistake's
    allowed keys), standing in for its variant in a copy of the chain."""

    name = "handed"

    def bias(self, value: Any, inputs: Inputs, cells: Cells, dtype: Any) -> FloatArray:
        given: FloatArray = value
        return given

    def allowed(self, value: Any, inputs: Inputs, cells: Cells) -> BoolArray:
        rule: Rule = value
        return rule(cells)


_HANDED = _Handed()


def _handed(
    chain: Chain, stages: Mapping[str, FloatArray], rules: Sequence[Rule] | None = None
) -> Chain:
    """The chain with each bias that is a stage taken from ``stages`` (the trace's own, or a
    mistake's), and with ``rules`` in place of its allowed-keys rules when they are given."""
    out = copy.copy(chain)
    out.biases = [
        (_HANDED, stages[v.bias_stage])
        if v.bias_stage is not None and v.bias_stage in stages
        else (v, x)
        for v, x in chain.biases
    ]
    if rules is not None:
        out.rules = [(_HANDED, rule) for rule in rules]
    return out


def allowed(inputs: Inputs, swap: Mapping[str, Rule | None] | None = None) -> BoolArray:
    """Where a query may attend (B, H, T, S), as the chain's allowed-keys rules say; the rule of
    each variant named in ``swap`` done that way instead (None: left out)."""
    swap = swap or {}
    chain = copy.copy(Chain(inputs))
    chain.rules = [
        (v, x) if v.name not in swap else (_HANDED, swap[v.name])
        for v, x in chain.rules
        if v.name not in swap or swap[v.name] is not None
    ]
    cells = whole(inputs)
    ok = chain.allowed(cells)
    return np.ones(cells.shape, bool) if ok is None else np.broadcast_to(ok, cells.shape).copy()


def logits_before_mask(trace: Trace) -> FloatArray:
    """What the mask is applied to: the last score modifier's stage (capped), else scaled."""
    return internal(trace, ("scaled", *Chain(trace.inputs).stages)[-1])


def masked_with(trace: Trace, ok: BoolArray | None, before: str | None = None) -> FloatArray:
    """masked recomputed from the trace's logits (its stage ``before``, by default the one the
    mask is applied to) and bias stages, with the allowed places ``ok`` (B, H, T, S) in place of
    the chain's rules (None: every key allowed)."""
    chain = Chain(trace.inputs)
    given = {name: internal(trace, name) for name in chain.bias_stages}
    rules: list[Rule] = []
    if ok is not None:
        where: BoolArray = ok
        rules.append(lambda cells: where)
    masked, _, _ = _handed(chain, given, rules).masked(
        logits_before_mask(trace) if before is None else internal(trace, before),
        whole(trace.inputs),
        None,
        _nowhere,
    )
    return masked


def _nowhere(stage: str) -> None:
    """No stage is kept while recomputing: each hook returns a new array."""
    return None


def projections(inputs: Inputs, X: FloatArray, X_kv: FloatArray | None) -> dict[str, FloatArray]:
    """Q, K and V from X (K, V from X_kv in cross-attention), split into heads."""
    out = {}
    for name, heads in (("Q", inputs.heads), ("K", inputs.kv_heads), ("V", inputs.kv_heads)):
        W, b = getattr(inputs, f"W_{name}"), getattr(inputs, f"b_{name}")
        source = X if name == "Q" or X_kv is None else X_kv
        out[name] = split_heads(project(source, W, b), heads)  # (B, heads, T, d)
    return out


# ---------------------------------------------------------------------------------------------
# From a stage on


def downstream(
    trace: Trace,
    start: str,
    values: Mapping[str, FloatArray],
    *,
    weights: Weights | None = None,
    merge: Callable[[FloatArray], FloatArray] = merge_heads,
    inputs: Inputs | None = None,
    expand: Expand = repeat_kv,
) -> dict[str, FloatArray]:
    """Recompute every stage from ``start`` on as the pipeline does, with ``values`` replacing
    the trace's stages and ``inputs`` its inputs (positions, a variant's setting, weights).

    Mistakes enter as ``weights`` (the softmax; default the pipeline's, with the extra logits),
    ``merge`` (heads side by side) and ``expand`` (kv heads to query heads; default grouped).
    """
    inp = inputs or trace.inputs
    applicable = trace.applicable  # a property that walks the stage table: read it once
    order = [n for n in STAGE_NAMES if n in applicable]
    todo = order[order.index(start) :]
    redo = _Recompute(trace, inp, Chain(inp), dict(values), weights, merge, expand)
    qkv = {"V", *redo.chain.qk_stages("Q"), *redo.chain.qk_stages("K")}
    logits = {"scores", "scaled", *redo.chain.stages, *redo.chain.bias_stages, "masked"}
    for name in todo:
        if name in redo.s or name in ("X", "X_kv", "lse"):
            continue  # lse comes with the softmax
        if name in qkv:
            redo.qkv(name)
        elif name in redo.chain.out_stages:
            redo.out(name)
        elif name in logits:
            redo.logits(name)
        else:
            redo.mix(name)
    return {n: redo.s[n] for n in todo if n in redo.s}


@dataclass(frozen=True)
class _Recompute:
    """downstream's walk: each stage recomputed into ``s`` from the stages before it."""

    trace: Trace
    inp: Inputs
    chain: Chain
    s: dict[str, FloatArray]
    weights: Weights | None
    merge: Callable[[FloatArray], FloatArray]
    expand: Expand

    def get(self, name: str) -> FloatArray:
        return self.s[name] if name in self.s else internal(self.trace, name)

    def qkv(self, name: str) -> None:
        """Q, K, V (projected), and each Q/K transform from the stage before it."""
        inp, s, get = self.inp, self.s, self.get
        if name in ("Q", "K", "V"):
            if any(v.front_stages for v, _ in self.chain.on):
                return  # made by a front end (MLA): the change's values or the trace's
            if inp.mode == "projection":
                X_kv = get("X_kv") if "X_kv" in self.trace.applicable else None
                made = projections(inp, get("X"), X_kv)
                s.update({n: a for n, a in made.items() if n not in s})
            return
        which = name[0]  # Q_norm -> Q
        stages = self.chain.qk_stages(which)
        i = stages.index(name)
        variant, value = self.chain.transforms_of(which)[i - 1]
        pos_q, pos_k = inp.token_positions()
        at = QKAt(inp, which, pos_q if which == "Q" else pos_k)
        s[name] = variant.transform(value, at, get(stages[i - 1]))

    def logits(self, name: str) -> None:
        """The scores, scaled, the score modifiers' stages, the bias stages and masked."""
        inp, s, get, chain = self.inp, self.s, self.get, self.chain
        if name in chain.bias_stages:
            s[name] = bias_stage(inp, name)  # (B, H, T, S)
        elif name == "scores":
            q, k = get(chain.query_key("Q")), get(chain.query_key("K"))
            s[name] = self.step(chain, name, self.expand(k, inp.heads // inp.kv_heads), q=q)
        elif name == "masked":  # the bias stages as the trace (or a change) holds them
            given = _handed(chain, {n: get(n) for n in chain.bias_stages})
            s[name] = self.step(given, name, before=("scaled", *chain.stages)[-1])
        else:
            order = ("scores", "scaled", *chain.stages)
            s[name] = self.step(chain, name, before=order[order.index(name) - 1])

    def step(
        self,
        chain: Chain,
        name: str,
        keys: FloatArray | None = None,
        q: FloatArray | None = None,
        before: str | None = None,
        lse: FloatArray | None = None,
    ) -> FloatArray:
        """One step of the one chain (steps.attention): stage ``name`` from ``before`` (the
        trace's, or recomputed), over every cell; ``keys`` are K for the scores, V for the
        output."""
        v = keys if name == "output" else None
        k = keys if name == "scores" else None
        start = None if before is None else (before, self.get(before))
        way = Way(runs={name}, last=name)
        made = attention(
            chain, q, k, v, whole(self.inp), self.trace.scale, way, lse=lse, start=start
        )
        stage = {"scores": made.scores, "scaled": made.scaled, "masked": made.masked}.get(name)
        stage = {"softmax": made.weights, "output": made.output}.get(name, stage)
        out = made.modified.get(name, stage)
        assert out is not None, name
        return out

    def out(self, name: str) -> None:
        """A head-output transform's stages (gate, gated), from the output before it."""
        outs, before = self.chain.outs, "output"
        for variant, value in outs:
            if name in variant.out_stages:
                reads = (*variant.out_reads, *(() if self.inp.X is None else ("X",)))
                run = Traced(self.inp, {n: self.get(n) for n in reads})
                made = variant.out_transform(value, run, self.get(before))
                self.s.update({n: a for n, a in made.items() if n not in self.s})
                return
            before = variant.out_stages[-1]

    def mix(self, name: str) -> None:
        """The softmax (and lse), the output, the heads merged and projected."""
        inp, s, get = self.inp, self.s, self.get
        if name == "softmax" and self.weights is not None:
            s[name] = self.weights(get(softmax_input(inp)))
        elif name == "softmax":
            lse = np.empty((inp.batch, inp.heads, inp.seq_q))  # (B, H, T)
            s[name] = self.step(self.chain, name, before=softmax_input(inp), lse=lse)
            if "lse" in self.trace.applicable and "lse" not in s:
                s["lse"] = lse
        elif name == "output":
            v = self.expand(get("V"), inp.heads // inp.kv_heads)
            s[name] = self.step(self.chain, name, v, before="softmax")  # (B, H, T, Dv)
        elif name == "concat":
            s[name] = self.merge(get(self.chain.joined))  # (B, T, H*Dv)
        elif name == "projected":
            assert inp.W_O is not None
            s[name] = project(get("concat"), inp.W_O, inp.b_O)  # (B, T, E)


def candidate(
    trace: Trace,
    detail: str,
    start: str,
    values: Mapping[str, FloatArray],
    **how: Any,
) -> Candidate:
    """The stages from ``start`` recomputed with ``values`` (``how``: see ``downstream``), and
    the way to recompute them with another softmax; an extra logit keeps every row finite:
    no nan to follow."""

    def rerun(weights: Weights) -> dict[str, FloatArray]:
        return downstream(trace, start, values, weights=weights, **how)

    stages = downstream(trace, start, values, **how)
    return Candidate(detail, stages, None if Chain(trace.inputs).extra else rerun)


def masked_candidate(trace: Trace, detail: str, ok: BoolArray | None) -> Candidate:
    """The stages from masked on with the allowed places ``ok`` (B, H, T, S) in place of the
    chain's rules (None: every key allowed)."""
    return candidate(trace, detail, "masked", {"masked": masked_with(trace, ok)})


def band(reach: int, *, two_sided: bool) -> Rule:
    """A rule allowing the keys fewer than ``reach`` positions before a query, and after it too
    where ``two_sided``; no causal part."""

    def near(cells: Cells) -> BoolArray:
        apart = cells.pos_q[:, None] - cells.pos_k[None, :]  # (R, S)
        ok: BoolArray = (abs(apart) if two_sided else apart) < reach  # (R, S)
        return ok[None, None]  # (1, 1, R, S)

    return near


def recomputed(changes: Callable[[Trace], list[Change]]) -> Callable[[Trace], list[Candidate]]:
    """A mistake's candidates from its changes: each recomputed downstream by the chain (and,
    where the user's softmax gives nan rows, with it)."""

    def candidates(trace: Trace) -> list[Candidate]:
        return [
            candidate(
                trace, c.detail, c.start, c.values, inputs=c.inputs, expand=c.expand or repeat_kv
            )
            for c in changes(trace)
        ]

    return candidates
