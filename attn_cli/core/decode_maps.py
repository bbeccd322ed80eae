"""Decoding with more than one softmax map per head over one KV cache (differential attention).

A variant whose head output is made of several softmax maps (``Variant.decode_maps``) hands
decoding a :class:`MapsForm`: each map's query and key (differential attention: the halves of
Q and K), the values, and how the maps' rows make the head output. Each map is decoded by
core/decode.py's loop over the same cache slots (the chain's scale, modifiers and mask), and
every step combines their rows: differential attention's diff = softmax − λ·softmax_2, diff·V,
the per-head norm and the (1 − λ_init) scale.

Axes: B batch, H heads, Hkv key/value heads, T tokens, C cache slots, d_v per head.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from attn_cli.core.chain import Chain
from attn_cli.core.decode import DecodeResult, DecodeStep, decode, grouped

FloatArray = Any  # np.ndarray of float64 or float32
Rows = Callable[[Sequence[FloatArray]], dict[str, FloatArray]]


@dataclass(frozen=True, eq=False)
class MapsForm:
    """Each map's query (B, H, T, d) and key (B, Hkv, T, d), the values (B, Hkv, T, d_v);
    ``rows``: the maps' weights (B, H, n, C) -> the score-like rows they make (``diff``);
    ``outs``: the combined weights (B, H, n, C) times V (B, H, n, d_v) -> the head-output
    stages, the last the one the heads join; ``combine``: the maps' softmax·V (B, H, n, d_v)
    each -> the same weighted sum, for the prefill and the reference rows."""

    pairs: tuple[tuple[FloatArray, FloatArray], ...]
    v: FloatArray
    rows: Rows
    outs: Callable[[FloatArray], dict[str, FloatArray]]
    combine: Callable[[Sequence[FloatArray]], FloatArray]
    mixed: str  # the row of ``rows`` whose product with V ``outs`` reads (``diff``)
    scores: tuple[str, ...]  # the names of the maps after the first: scores_2, softmax_2


class _Rows(Mapping[str, FloatArray]):
    """A step's extra rows, computed again when read (as a step's own score rows are)."""

    def __init__(self, steps: Sequence[DecodeStep], form: MapsForm) -> None:
        self.steps, self.form = steps, form

    def _made(self) -> dict[str, FloatArray]:
        out: dict[str, FloatArray] = {}
        for n, s in enumerate(self.steps[1:], start=2):
            out[f"scores_{n}"], out[f"softmax_{n}"] = s.scores, s.softmax
        return out | self.form.rows([s.softmax for s in self.steps])

    def __getitem__(self, name: str) -> FloatArray:
        return self._made()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._made())

    def __len__(self) -> int:
        return len(self._made())


def decode_maps(
    form: MapsForm, *, chain: Chain, scale: float, prefill: int, positions: Any
) -> DecodeResult:
    """Each map decoded over the cache, then each step's rows and head output combined."""
    runs = [
        decode(q, k, form.v, chain=chain, scale=scale, prefill=prefill, positions=positions)
        for q, k in form.pairs
    ]
    first = runs[0]
    prefill_mixed = form.combine([r.prefill_output for r in runs])  # (B, H, P, d_v)
    steps = []
    for at in zip(*(r.steps for r in runs), strict=True):
        mixed = form.rows([s.softmax for s in at])[form.mixed]  # (B, H, 1, C)
        outs = form.outs(grouped(mixed, at[0].V_cache))  # (B, H, 1, d_v) each
        steps.append(replace(at[0], outs=outs, rows=_Rows(at, form)))
    return DecodeResult(prefill, first.prefill_output, tuple(steps), form.outs(prefill_mixed))
