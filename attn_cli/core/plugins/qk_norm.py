"""QK-norm (Qwen3, Gemma 3, OLMo 2): RMSNorm of Q and K before RoPE, x / sqrt(mean(x²) + eps)
× weight, per head (a weight of d_k) or over the whole projection (heads*d_k). A Q/K transform
of the chain: Q -> Q_norm, K -> K_norm."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from attn_cli.core.heads import merge_heads, split_heads
from attn_cli.core.inputs import Inputs, QKNorm
from attn_cli.core.ops import grad_rms_norm, rms_norm
from attn_cli.core.plugins.parsing import known_entries, positive_number
from attn_cli.core.stage_spec import number_text
from attn_cli.core.variant import (
    Cast,
    FixtureKey,
    FloatArray,
    NewOption,
    NewSpec,
    QKAt,
    Variant,
    exact,
    register,
)

DOC = "a mapping {q_weight, k_weight, eps: 1e-6}"


class QKNormalization(Variant[QKNorm]):
    order = 60
    name = "qk_norm"
    array_parts = ("q_weight", "k_weight")
    subkeys = ("q_weight", "k_weight", "eps")
    key_order = 10
    suffix = "norm"
    grad_late = True
    new_options = (
        NewOption("qk_norm", bool, "RMSNorm of each head of Q and K, with random weights (Qwen3)."),
    )
    new_rank, new_order = 60, 20

    def stage_formula(self, value: QKNorm, inputs: Inputs, stage: str) -> str:
        name = stage[0]  # Q or K
        weight = value.q_weight if name == "Q" else value.k_weight
        over = "each head" if weight.shape[0] == inputs.d_k else "the whole projection"
        return (
            f"{name}_norm = {name} / √(mean({name}²) + eps) × {name.lower()}_weight, over "
            f"{over}, eps = {number_text(value.eps)}"
        )

    def grad_formula(self, value: QKNorm, inputs: Inputs, d_out: str, x_in: str) -> str:
        return (
            f"(w ∘ {d_out} − x̂ · mean(x̂ ∘ w ∘ {d_out})) / rms({x_in}), "
            f"x̂ = {x_in} / rms({x_in}), w = {x_in[0].lower()}_weight"
        )

    def transform(self, value: QKNorm, at: QKAt, x: FloatArray) -> FloatArray:
        return norm_heads(x, _weight(value, at.which, at.cast), value.eps)  # (B, heads, n, D)

    def grad_transform(
        self, value: QKNorm, at: QKAt, d_out: FloatArray, x_in: FloatArray
    ) -> FloatArray:
        """RMSNorm's backward, per head (weight (D,)) or over the whole projection (heads*D,)."""
        w = _weight(value, at.which, at.cast)
        if w.shape[0] == x_in.shape[-1]:
            return grad_rms_norm(d_out, x_in, w, value.eps)  # (B, heads, n, D)
        flat = grad_rms_norm(merge_heads(d_out), merge_heads(x_in), w, value.eps)  # (B, n, heads*D)
        return split_heads(flat, x_in.shape[1])  # (B, heads, n, D)

    def parse(self, raw: Any, key: FixtureKey) -> QKNorm:
        value = known_entries(raw, key, self.name, self.subkeys, DOC)
        weights = []
        for sub, n, n_name in (
            ("q_weight", key.heads, "heads"),
            ("k_weight", key.kv_heads, "kv_heads"),
        ):
            field = f"qk_norm.{sub}"
            if sub not in value:
                raise key("missing", f"q_weight and k_weight together in {DOC}", field)
            doc = f"a vector of length d_k or {n_name}*d_k"
            w = key.floats(value[sub], field, (1,), doc)
            if w.shape[0] not in (key.d_k, n * key.d_k):
                raise key(
                    f"has length {w.shape[0]}",
                    f"d_k = {key.d_k} (each head) or {n_name}*d_k = {n * key.d_k} (the whole "
                    "projection)",
                    field,
                )
            weights.append(w)
        eps = 1e-6
        if "eps" in value:
            eps = positive_number(value["eps"], key, "added to mean(x²)", "qk_norm.eps")
        return QKNorm(weights[0], weights[1], eps)

    def config(self, value: QKNorm, inputs: Inputs) -> dict[str, Any]:
        scope = {True: "head", False: "projection"}
        return {
            "eps": value.eps,
            "q_over": scope[value.q_weight.shape[0] == inputs.d_k],
            "k_over": scope[value.k_weight.shape[0] == inputs.d_k],
        }

    def new_members(self, spec: NewSpec, rng: np.random.Generator) -> dict[str, Any]:
        if not spec.options.get(self.name):
            return {}
        # learned RMSNorm weights start at 1; these are near it
        q_weight, k_weight = ((1 + 0.1 * rng.normal(size=spec.d_k)).round(2) for _ in "qk")
        return {
            "qk_norm.q_weight": q_weight,
            "qk_norm.k_weight": k_weight,
            "qk_norm.eps": np.array(1e-6),
        }

    def new_lines(self, spec: NewSpec, members: Mapping[str, Any]) -> list[str]:
        return [
            "qk_norm:   # RMSNorm of Q and K before RoPE: x / sqrt(mean(x^2) + eps) * weight",
            "  # weights of length d_k: each head is normalised on its own (Qwen3, Gemma 3)",
            *(
                f"  {sub}: [" + ", ".join(exact(x) for x in members[f"qk_norm.{sub}"]) + "]"
                for sub in ("q_weight", "k_weight")
            ),
            "  eps: 1.0e-06",
        ]

    def new_words(self, spec: NewSpec, members: Mapping[str, Any]) -> str:
        return "QK-norm"


def norm_heads(x: FloatArray, weight: FloatArray, eps: float) -> FloatArray:
    """RMSNorm of each head (weight (D,)) or of the whole projection (weight (H*D,))."""
    if weight.shape[0] == x.shape[-1]:
        return rms_norm(x, weight, eps)  # (B, H, T, D), each head on its own (Qwen3)
    return split_heads(rms_norm(merge_heads(x), weight, eps), x.shape[1])  # (B, H, T, D) (OLMo 2)


def _weight(value: QKNorm, which: str, cast: Cast) -> FloatArray:
    """The weight of Q's or K's norm in the computing dtype (float32 overflow named)."""
    w = value.q_weight if which == "Q" else value.k_weight
    return cast(f"qk_norm.{which.lower()}_weight", w)


register(QKNormalization())
