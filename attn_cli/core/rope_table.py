"""RoPE pair by pair: what a learner reads to see where positions go (``attn rope``).

For each rotated pair of a fixture's RoPE: its dimensions, the plain frequency base^(−2i/dims)
and wavelength 2π/θ (tokens per full turn), the band the RoPE scaling puts it in and the
frequency it is left with, and the angle, cos and sin at one position. Every number is the one
core/plugins/rope.py rotates by (the same ``frequencies``); the renderer only formats them.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from attn_cli.core.inputs import FloatArray, IntArray, Rope
from attn_cli.core.rope_scaling import bands, dynamic_base, ntk_alpha_base, trained_length
from attn_cli.core.rope_scaling import frequencies as scaled_frequencies
from attn_cli.core.variants import rope_pairs

MAX_POSITION = 1 << 53  # positions beyond this are not whole numbers in float64


class RopeTable(NamedTuple):
    """A RoPE's rotated pairs at one position, for a sequence of ``length`` positions."""

    rope: Rope
    d_k: int
    length: int  # the frequencies are the ones of a sequence this long (dynamic, longrope)
    position: int  # the angle, cos and sin columns are at this position
    trained: int | None  # the context the plain frequencies were trained for, if the scaling says
    base: float  # the base the frequencies come from (dynamic: grown past max)
    attention: float  # the factor on cos and sin (yarn's mscale, longrope's); logits × its square
    first: IntArray  # (P,) the pair's first dimension
    second: IntArray  # (P,) its second
    inv_freq: FloatArray  # (P,) θ_i = base^(−2i/dims), radians per position
    wavelength: FloatArray  # (P,) 2π/θ_i, positions per full turn
    over_trained: FloatArray  # (P,) λ_i / trained: above 1, no full turn in training (NaN: unknown)
    band: tuple[str, ...]  # (P,) core/rope_scaling.py's ``bands``
    mix: FloatArray  # (P,) share of "÷ factor" (0 kept .. 1 scaled), NaN where none mixes
    scaled: FloatArray  # (P,) θ'_i, what RoPE rotates by
    divisor: FloatArray  # (P,) θ_i / θ'_i
    scaled_wavelength: FloatArray  # (P,) 2π/θ'_i
    angle: FloatArray  # (P,) position × θ'_i, radians
    cos: FloatArray  # (P,) cos(angle), before the attention factor
    sin: FloatArray  # (P,)


def rope_table(rope: Rope, d_k: int, length: int, position: int, source: str = "") -> RopeTable:
    """The pairs of ``rope`` at ``position`` in a sequence of ``length`` positions; the
    frequencies are checked finite by ``frequencies`` (a ComputeError naming ``source``)."""
    if not 1 <= length <= MAX_POSITION or not 0 <= position < length:
        raise ValueError(f"need 0 <= position < length <= 2**53, got {position} and {length}")
    first, second = rope_pairs(rope.dims, rope.layout)  # (P,), (P,)
    plain, _ = scaled_frequencies(None, rope.dims, rope.base, length, source)  # (P,)
    scaled, attention = scaled_frequencies(
        rope.scaling, rope.dims, rope.base, length, source
    )  # (P,)
    band, mix = bands(rope.scaling, rope.dims, rope.base, length)
    base = rope.base
    if rope.scaling is not None and rope.scaling.kind == "dynamic":
        base = dynamic_base(rope.scaling, rope.dims, rope.base, length)
    if rope.scaling is not None and rope.scaling.kind == "ntk_alpha":
        base = ntk_alpha_base(rope.scaling, rope.dims, rope.base)
    angle = position * scaled  # (P,)
    wavelength = 2 * math.pi / plain  # (P,)
    trained = trained_length(rope.scaling)
    over = wavelength / trained if trained is not None else np.full_like(plain, math.nan)
    return RopeTable(
        rope,
        d_k,
        length,
        position,
        trained,
        base,
        attention,
        first,
        second,
        plain,
        wavelength,
        over,
        band,
        mix,
        scaled,
        plain / scaled,
        2 * math.pi / scaled,
        angle,
        np.cos(angle),
        np.sin(angle),
    )
