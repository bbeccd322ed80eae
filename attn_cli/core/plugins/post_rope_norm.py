"""A norm of each head of Q and K AFTER RoPE: x / sqrt(mean(x²) + eps) × weight over head_dim.

HunYuan dense (transformers' HunYuanDenseV1Attention: ``query_layernorm``, ``key_layernorm``
applied to the rotated q and k) carries a learned weight for Q and one for K; Llama 4's "L2
norm" (Llama4TextL2Norm) is the same RMS over head_dim without a weight, eps = rms_norm_eps.
A Q/K transform of the chain after the rotation: Q_rot -> Q_postnorm, K_rot -> K_postnorm.

It reads no position, but it runs on rotated rows: decoding applies it as each token arrives,
after the rotation (``positional``), so the cache holds keys rotated, then normalised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attn_cli.core.inputs import Inputs
from attn_cli.core.ops import grad_rms_norm, rms_norm
from attn_cli.core.plugins.parsing import known_entries, positive_number
from attn_cli.core.stage_spec import number_text
from attn_cli.core.variant import FixtureKey, FloatArray, QKAt, Variant, before, register

DOC = "a mapping {q_weight, k_weight, eps} (HunYuan) or {eps} alone (no weight, Llama 4)"


@dataclass(frozen=True, eq=False)
class PostRopeNorm:
    """The setting: a weight of length d_k for Q and one for K (both None: no weight), and
    the eps added to mean(x²)."""

    q_weight: FloatArray | None  # (D,)
    k_weight: FloatArray | None  # (D,)
    eps: float

    def weight(self, which: str) -> FloatArray | None:
        """Q's or K's weight (None: the norm has none)."""
        return self.q_weight if which == "Q" else self.k_weight


class PostRopeNormalization(Variant[PostRopeNorm]):
    order = 80  # after RoPE (70), before a position-dependent query scale (Llama 4's order)
    name = "post_rope_norm"
    array_parts = ("q_weight", "k_weight")
    subkeys = ("q_weight", "k_weight", "eps")
    key_order = 22  # beside rope's
    suffix = "postnorm"  # its stages: Q_postnorm, K_postnorm (and their gradients)
    positional = True  # decoding runs it on each token after the rotation, not up front

    def parse(self, raw: Any, key: FixtureKey) -> PostRopeNorm:
        value = known_entries(raw, key, self.name, self.subkeys, DOC)
        if "eps" not in value:
            raise key("has no eps", DOC, f"{self.name}.eps")
        eps = positive_number(value["eps"], key, "added to mean(x²)", f"{self.name}.eps")
        given = [sub for sub in ("q_weight", "k_weight") if sub in value]
        if len(given) == 1:
            missing = "k_weight" if given == ["q_weight"] else "q_weight"
            raise key(
                "missing",
                f"q_weight and k_weight together, or neither: {DOC}",
                f"{self.name}.{missing}",
            )
        if not given:
            return PostRopeNorm(None, None, eps)
        q_weight, k_weight = (
            _parse_weight(value[sub], key, sub) for sub in ("q_weight", "k_weight")
        )
        return PostRopeNorm(q_weight, k_weight, eps)

    def config(self, value: PostRopeNorm, inputs: Inputs) -> dict[str, Any]:
        return {"eps": value.eps, "weight": value.q_weight is not None}

    def stage_formula(self, value: PostRopeNorm, inputs: Inputs, stage: str) -> str:
        src = before(inputs, stage)
        times = f" × {stage[0].lower()}_weight" if value.q_weight is not None else ""
        return (
            f"{stage} = {src} / √(mean({src}²) + eps){times}, over each head, after RoPE, "
            f"eps = {number_text(value.eps)}"
        )

    def grad_formula(self, value: PostRopeNorm, inputs: Inputs, d_out: str, x_in: str) -> str:
        w = f"{x_in[0].lower()}_weight" if value.q_weight is not None else "1"
        return (
            f"(w ∘ {d_out} − x̂ · mean(x̂ ∘ w ∘ {d_out})) / rms({x_in}), "
            f"x̂ = {x_in} / rms({x_in}), w = {w}"
        )

    def transform(self, value: PostRopeNorm, at: QKAt, x: FloatArray) -> FloatArray:
        return rms_norm(x, _weight(value, at, x.shape[-1]), value.eps)  # (B, heads, n, D)

    def grad_transform(
        self, value: PostRopeNorm, at: QKAt, d_out: FloatArray, x_in: FloatArray
    ) -> FloatArray:
        """RMSNorm's backward over each head's D."""
        w = _weight(value, at, x_in.shape[-1]).astype(d_out.dtype, copy=False)
        return grad_rms_norm(d_out, x_in, w, value.eps)  # (B, heads, n, D)


def _parse_weight(raw: Any, key: FixtureKey, sub: str) -> FloatArray:
    """A weight of length d_k: each head is normalised on its own."""
    field = f"post_rope_norm.{sub}"
    w = key.floats(raw, field, (1,), "a vector of length d_k")
    if w.shape[0] != key.d_k:
        raise key(f"has length {w.shape[0]}", f"d_k = {key.d_k} (one weight per head dim)", field)
    return w


def _weight(value: PostRopeNorm, at: QKAt, d: int) -> FloatArray:
    """Q's or K's weight in the computing dtype; ones (D,) when the norm has none."""
    w = value.weight(at.which)
    if w is None:
        return np.ones(d)
    return at.cast(f"post_rope_norm.{at.which.lower()}_weight", w)


register(PostRopeNormalization())
