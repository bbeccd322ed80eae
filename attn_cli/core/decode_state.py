"""Decoding with a recurrent state in place of a KV cache (linear attention).

A linear-attention variant hands decoding a :class:`Recurrence`: the state it starts from
(Katharopoulos' S and z; Gated DeltaNet's S and the causal conv's rolling window) and one step,
which takes token t, updates the state and returns the token's output. Nothing grows with the
tokens: the state's bytes (:class:`StateBytes`) are the same after the first token and after the
millionth, where softmax attention's KV cache of the same heads grows by a row per token.

Axes: B batch, H heads, T tokens, d_k and d_v per head.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

FloatArray = np.ndarray[Any, Any]  # float64 or float32
State = dict[str, FloatArray]  # the state's parts by name: "S" (B, H, d_k, d_v), ...


class Recurrence:
    """One linear-attention layer as decoding runs it: a state, and one token at a time."""

    heads: int = 1
    d_k: int = 1
    d_v: int = 1
    tokens: int = 1  # T
    # each part of the state and each number a step reads: its formula
    formulas: ClassVar[Mapping[str, str]] = {}

    def init(self) -> State:
        """The state before the first token (zeros)."""
        raise NotImplementedError

    def step(self, state: State, t: int) -> tuple[State, dict[str, FloatArray], FloatArray]:
        """Token t against ``state``: the new state (fresh arrays, the old ones untouched), the
        numbers of this token the step read (``phi_q``, ``g``, ..., (B, H, ·)) and its output
        (B, H, d_v)."""
        raise NotImplementedError

    def reference(self) -> FloatArray:
        """Every token's output (B, H, T, d_v) by another form of the same math (the chunked
        one: the parallel form a chunk of rows at a time, the state carried between chunks)."""
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class StateStep:
    """One generated token: the numbers it read, the state after it (None when not kept) and
    its output."""

    index: int
    position: int
    read: Mapping[str, FloatArray]  # (B, H, ·) each
    state: Mapping[str, FloatArray] | None
    output: FloatArray  # (B, H, 1, d_v)
    outs: Mapping[str, FloatArray] = field(default_factory=dict)  # the head-output transforms'


@dataclass(frozen=True, eq=False)
class StateDecode:
    """The prefill (the same recurrence, its steps not shown) and the steps that follow."""

    prefill: int
    prefill_output: FloatArray  # (B, H, P, d_v)
    prefill_state: Mapping[str, FloatArray]  # the state after the prefill
    steps: tuple[StateStep, ...]
    prefill_outs: Mapping[str, FloatArray] = field(default_factory=dict)


After = Callable[[slice, FloatArray], dict[str, FloatArray]]


def decode_state(
    rec: Recurrence,
    prefill: int,
    positions: Any,
    *,
    keep: Callable[[int], bool] = lambda k: True,
    after: After | None = None,
) -> StateDecode:
    """Run ``rec`` over the first ``prefill`` tokens, then one step per token; the state of
    step k (0-based after the prefill) is kept when ``keep(k)``, so that a long decode holds
    the outputs and a few states, never one state per token."""
    if not 1 <= prefill <= rec.tokens:
        raise ValueError(f"prefill must be 1..{rec.tokens}, not {prefill}")
    pos = np.asarray(positions, dtype=np.int64).reshape(rec.tokens)
    state = rec.init()
    outs = []
    for t in range(prefill):
        state, _, o = rec.step(state, t)
        outs.append(o)
    prefill_output = np.stack(outs, axis=2)  # (B, H, P, d_v)
    prefill_outs = {} if after is None else after(slice(0, prefill), prefill_output)
    prefill_state = state
    steps = []
    for k, step in enumerate(iter_steps(rec, state, prefill, pos, after)):
        steps.append(step if keep(k) else _without_state(step))
    return StateDecode(prefill, prefill_output, prefill_state, tuple(steps), prefill_outs)


def iter_steps(
    rec: Recurrence, state: State, start: int, positions: Any, after: After | None = None
) -> Iterator[StateStep]:
    """Tokens ``start``..T−1 one at a time from ``state``: what a generation loop holds is the
    state and this token's numbers (a caller that drops the steps decodes in O(1) memory)."""
    for t in range(start, rec.tokens):
        state, read, o = rec.step(state, t)
        output = o[:, :, None]  # (B, H, 1, d_v)
        made = {} if after is None else after(slice(t, t + 1), output)
        yield StateStep(t, int(positions[t]), read, state, output, made)


def _without_state(step: StateStep) -> StateStep:
    return StateStep(step.index, step.position, {}, None, step.output, step.outs)


@dataclass(frozen=True)
class StateBytes:
    """What the state costs per layer and sequence, against softmax attention's KV cache with
    the same heads: the state is constant in the tokens, the cache grows by ``kv_per_token``."""

    parts: tuple[tuple[str, tuple[int, ...]], ...]  # each part of the state: name, shape
    itemsize: int
    heads: int
    d_k: int
    d_v: int
    seq: int

    @property
    def numbers(self) -> int:
        return sum(int(np.prod(shape)) for _, shape in self.parts)

    @property
    def state(self) -> int:
        """Bytes of the whole state, whatever the number of tokens."""
        return self.numbers * self.itemsize

    @property
    def kv_per_token(self) -> int:
        """Bytes softmax attention's cache adds per token: heads × (d_k + d_v) numbers."""
        return self.heads * (self.d_k + self.d_v) * self.itemsize

    def kv_at(self, tokens: int) -> int:
        """Bytes of softmax attention's KV cache holding ``tokens`` tokens."""
        return self.kv_per_token * tokens

    def break_even(self) -> int:
        """The fewest tokens whose KV cache outweighs the state."""
        return -(-self.state // self.kv_per_token)


def state_bytes(
    state: Mapping[str, FloatArray], heads: int, d_k: int, d_v: int, seq: int, itemsize: int = 8
) -> StateBytes:
    """The ledger of a state (its parts per batch item: the batch axis dropped)."""
    parts = tuple((name, tuple(int(n) for n in a.shape[1:])) for name, a in state.items())
    return StateBytes(parts, itemsize, heads, d_k, d_v, seq)
