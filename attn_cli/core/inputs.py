"""The validated inputs of one attention computation: arrays of known shape, nothing loose.

Array layouts (``B`` is 1 when the fixture has no batch axis):

- projection mode: ``X`` (B, seq, d_model), ``W_Q`` (d_model, heads*d_k), ``W_K`` (d_model,
  kv_heads*d_k), ``W_V`` (d_model, kv_heads*d_v), biases as vectors; with cross-attention
  ``X_kv`` (B, seq_k, d_model_kv) and ``W_K``, ``W_V`` with d_model_kv rows;
- direct mode: ``Q`` (B, heads, seq_q, d_k), ``K`` (B, kv_heads, seq_k, d_k), ``V`` (B, kv_heads,
  seq_k, d_v).

``grad`` (the backward pass's upstream gradient) is laid out like the final stage: ``projected``
(B, seq, d_out) when there is ``W_O``, else ``output`` (B, heads, seq, d_v).

RoPE, the window and the mask sentinel are optional fields (``None``: off), with the conventions of
core/variants.py; every other variant's setting is in ``extra`` under the variant's name, parsed
and read by the variant itself (core/variant.py ``parse``, ``value``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from attn_cli.core.variants import RopeLayout, default_positions

if TYPE_CHECKING:
    from attn_cli.core.rope_scaling import RopeScaling

Causal = Literal["upper-left", "lower-right"]
FloatArray = np.ndarray[Any, np.dtype[np.float64]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]


@dataclass(frozen=True)
class Rope:
    """Rotary position embedding: ``dims`` (even, <= d_k) dimensions of each head rotate."""

    base: float
    layout: RopeLayout
    dims: int
    scaling: RopeScaling | None = None  # long-context frequencies (core/rope_scaling.py)


@dataclass(frozen=True, eq=False)
class QKNorm:
    """RMSNorm of Q and K before RoPE: a weight of length d_k normalises each head separately
    (Qwen3, Gemma 3); of length heads*d_k (kv_heads*d_k for K) the whole projection (OLMo 2)."""

    q_weight: FloatArray  # (D,) or (H*D,)
    k_weight: FloatArray  # (D,) or (Hkv*D,)
    eps: float


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
    X_kv: FloatArray | None = None  # cross-attention: K and V projected from X_kv
    positions: IntArray | None = None  # (T,) as given; None: the default positions
    key_positions: IntArray | None = None  # (S,) as given; None: 0..S-1
    rope: Rope | None = None
    window: int | None = None  # 0 <= pos_q - pos_k < window
    mask_value: float = -math.inf  # what fills the places a query may not attend
    grad: FloatArray | None = None  # dL/d(final stage) for the backward pass, batch axis first
    # the settings of the variants torch's SDPA has no argument for (ALiBi, a cap, sink logits,
    # QK-norm, those registered from outside), by name: each variant parses and reads its own
    extra: Mapping[str, Any] = field(default_factory=dict)

    def setting(self, name: str) -> Any:
        """The setting of the variant ``name`` (``inputs.extra[name]``), None when it is off."""
        return self.extra.get(name)

    def with_setting(self, name: str, value: Any) -> Inputs:
        """These inputs with the variant ``name`` set to ``value`` (None: turned off)."""
        extra = {k: v for k, v in self.extra.items() if k != name}
        return replace(self, extra=extra if value is None else {**extra, name: value})

    def token_positions(self) -> tuple[IntArray, IntArray]:
        """(pos_q (T,), pos_k (S,)): as given, else keys 0..S-1 and queries per ``causal``."""
        pos_q, pos_k = default_positions(self.seq_q, self.seq_k, self.causal)
        given_q = pos_q if self.positions is None else self.positions
        given_k = pos_k if self.key_positions is None else self.key_positions
        return given_q, given_k

    @property
    def d_model(self) -> int | None:
        return None if self.X is None else int(self.X.shape[-1])

    @property
    def d_model_kv(self) -> int | None:
        """The width of ``X_kv`` (cross-attention), or None."""
        return None if self.X_kv is None else int(self.X_kv.shape[-1])

    @property
    def d_out(self) -> int | None:
        return None if self.W_O is None else int(self.W_O.shape[1])
