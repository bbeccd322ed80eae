"""llama3 RoPE scaling with high_freq_factor = low_freq_factor (Llama 4 Scout ships 1 and 1):
transformers 5.25 warns and computes it (modeling_rope_utils.py _compute_llama3_parameters): no
pair is between the bands, so each is kept or divided by factor. A loop reference of that."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attn_cli.core.rope_scaling import RopeScaling, bands, frequencies


def _loop_reference(
    dims: int, base: float, factor: float, bound: float, original: int
) -> list[float]:
    out = []
    for i in range(0, dims, 2):
        inv = 1.0 / base ** (i / dims)
        wavelen = 2 * math.pi / inv
        out.append(inv / factor if wavelen > original / bound else inv)  # kept below, else scaled
    return out


@pytest.mark.parametrize(("dims", "base", "factor"), [(128, 5e5, 8.0), (8, 5e5, 16.0)])
def test_equal_bands_keep_or_divide_each_pair(dims: int, base: float, factor: float) -> None:
    params = (
        ("factor", factor),
        ("low_freq_factor", 1.0),
        ("high_freq_factor", 1.0),
        ("original_max_position_embeddings", 8192),
    )
    scaling = RopeScaling("llama3", params)
    inv, attention = frequencies(scaling, dims, base, 16)
    want = _loop_reference(dims, base, factor, 1.0, 8192)
    np.testing.assert_allclose(inv, want, rtol=1e-15)
    assert attention == 1.0
    assert any(w != 1.0 / base ** (i * 2 / dims) for i, w in enumerate(want))  # some scaled
    names, _ = bands(scaling, dims, base, 16)
    assert set(names) <= {"kept", "scaled"}
