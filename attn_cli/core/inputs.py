"""The validated inputs of one attention computation: arrays of known shape, nothing loose.

Array layouts (``B`` is 1 when the fixture has no batch axis):

- projection mode: ``X`` (B, seq, d_model), ``W_Q`` (d_model, heads*d_k), ``W_K`` (d_model,
  kv_heads*d_k), ``W_V`` (d_model, kv_heads*d_v), biases as vectors;
- direct mode: ``Q`` (B, heads, seq_q, d_k), ``K`` (B, kv_heads, seq_k, d_k), ``V`` (B, kv_heads,
  seq_k, d_v).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

Causal = Literal["upper-left", "lower-right"]
FloatArray = np.ndarray[Any, np.dtype[np.float64]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]


@dataclass(frozen=True, eq=False)
class Inputs:
    """A validated fixture: every array float64 and in the layout of the module docstring."""

    source: str
    mode: Literal["projection", "direct"]
    has_batch: bool
    batch: int
    seq_q: int
    seq_k: int
    heads: int
    kv_heads: int
    d_k: int
    d_v: int
    name: str = ""
    description: str = ""
    tokens: tuple[str, ...] | None = None
    key_tokens: tuple[str, ...] | None = None
    X: FloatArray | None = None
    W_Q: FloatArray | None = None
    W_K: FloatArray | None = None
    W_V: FloatArray | None = None
    b_Q: FloatArray | None = None
    b_K: FloatArray | None = None
    b_V: FloatArray | None = None
    Q: FloatArray | None = None
    K: FloatArray | None = None
    V: FloatArray | None = None
    W_O: FloatArray | None = None
    b_O: FloatArray | None = None
    scale: float | None = None
    causal: Causal | None = None
    mask: BoolArray | None = None
    bias: FloatArray | None = None
    lengths: IntArray | None = None
    expected: Mapping[str, FloatArray] = field(default_factory=dict)

    @property
    def d_model(self) -> int | None:
        return None if self.X is None else int(self.X.shape[-1])

    @property
    def d_out(self) -> int | None:
        return None if self.W_O is None else int(self.W_O.shape[1])
