"""The backward pass against torch.autograd's float64 gradients, stored once (no torch needed).

tests/reference/torch_backward.json was written by tests/reference/torch_backward.py in a
throwaway venv with torch 2.13.0: projection mode, GQA (4 query heads on 2 key/value heads),
causal, W_O and every bias, a random upstream gradient of `projected`. The forward stages come
from torch too, so nothing here is computed by attn_cli except the gradients under test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attn_cli.core.backward import GRADIENT_STAGES, ForwardArrays, attention_backward

REFERENCE = Path(__file__).parent.parent / "reference" / "torch_backward.json"
RTOL = 1e-10
ATOL = 1e-13  # for entries that are zero in theory (d_b_K, masked positions): rounding only


def _load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(REFERENCE.read_text())
    return {k: np.array(v) if isinstance(v, list) else v for k, v in data.items()}


REF = _load()
TORCH_GRADIENTS = sorted(k for k in REF if k in GRADIENT_STAGES)


def _forward() -> ForwardArrays:
    T = REF["X"].shape[1]
    causal = np.tril(np.ones((T, T), dtype=bool))  # (T, S), upper-left: key j <= query i
    return ForwardArrays(
        q=REF["forward_Q"],
        k=REF["forward_K"],
        v=REF["forward_V"],
        weights=REF["forward_softmax"],
        output=REF["forward_output"],
        scale=REF["scale"],
        allowed=causal,
        X=REF["X"],
        **{n: REF[n] for n in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")},
    )


def test_the_reference_has_every_gradient_of_this_fixture() -> None:
    grads = attention_backward(_forward(), REF["grad"])
    assert set(grads.stages()) == set(TORCH_GRADIENTS)
    assert REF["heads"] == 4 and REF["kv_heads"] == 2  # GQA is exercised


@pytest.mark.parametrize("name", TORCH_GRADIENTS)
def test_gradient_matches_torch_autograd(name: str) -> None:
    grads = attention_backward(_forward(), REF["grad"])
    np.testing.assert_allclose(getattr(grads, name), REF[name], rtol=RTOL, atol=ATOL)
