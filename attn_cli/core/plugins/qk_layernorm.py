"""q/k LayerNorm (StableLM 2, Phi's ``qk_layernorm``): a LayerNorm of each head of Q and of K
before RoPE, (x − mean(x)) / √(var(x) + eps) × weight (+ bias) over d_k. StableLM has one
LayerNorm per head (``q_layernorm.norms.{h}``, weights (heads, d_k) for Q and (kv_heads, d_k) for
K, no bias); Phi one for every head, with a bias (weights of d_k). A Q/K transform of the chain:
Q -> Q_ln, K -> K_ln. It reads no positions, so decoding and FlashAttention take the trace's
Q_ln and K_ln; the backward pass runs LayerNorm's backward (core/ops.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from attn_cli.core.inputs import FloatArray, Inputs
from attn_cli.core.ops import grad_layer_norm, layer_norm
from attn_cli.core.plugins.parsing import known_entries, positive_number
from attn_cli.core.stage_spec import number_text
from attn_cli.core.variant import (
    Cast,
    FixtureKey,
    NewOption,
    NewSpec,
    QKAt,
    Variant,
    exact,
    register,
)

NAME = "qk_layernorm"
PARTS = ("q_weight", "k_weight", "q_bias", "k_bias")
DOC = "a mapping {q_weight, k_weight, q_bias, k_bias, eps: 1e-5} (the biases optional)"


@dataclass(frozen=True, eq=False)
class QKLayerNorm:
    """The LayerNorms of Q and K: weights (heads, d_k) and (kv_heads, d_k), one per head
    (StableLM), or (d_k,), one for every head (Phi); biases of the same shapes, or None."""

    q_weight: FloatArray  # (H, D) or (D,)
    k_weight: FloatArray  # (Hkv, D) or (D,)
    q_bias: FloatArray | None
    k_bias: FloatArray | None
    eps: float

    def params(self, which: str) -> tuple[FloatArray, FloatArray | None]:
        """Q's or K's (weight, bias) as the fixture gives them."""
        return (self.q_weight, self.q_bias) if which == "Q" else (self.k_weight, self.k_bias)

    def per_head(self, which: str) -> bool:
        """Whether each head of Q (K) has a LayerNorm of its own."""
        return self.params(which)[0].ndim == 2


class QKLayerNormalization(Variant[QKLayerNorm]):
    order = 62  # after QK-norm's RMSNorm, before RoPE
    name = NAME
    array_parts = PARTS
    subkeys = (*PARTS, "eps")
    key_order = 11
    suffix = "ln"
    grad_late = True
    new_options = (
        NewOption(NAME, bool, "LayerNorm of each head of Q and K, one per head (StableLM 2)."),
    )
    new_rank, new_order = 61, 21

    def stage_formula(self, value: QKLayerNorm, inputs: Inputs, stage: str) -> str:
        own = "its own weight per head" if value.per_head(stage[0]) else "one weight for every head"
        eps = number_text(value.eps)
        return f"{formula(value, stage[0])}, over each head's d_k, {own}, eps = {eps}"

    def grad_formula(self, value: QKLayerNorm, inputs: Inputs, d_out: str, x_in: str) -> str:
        return (
            f"(g − mean(g) − x̂ · mean(g ∘ x̂)) / σ, g = w ∘ {d_out}, x̂ = ({x_in} − mean) / σ, "
            f"σ = √(var({x_in}) + eps), w = {x_in[0].lower()}_weight"
        )

    def transform(self, value: QKLayerNorm, at: QKAt, x: FloatArray) -> FloatArray:
        w, b = head_params(value, at.which, at.cast)
        out: FloatArray = layer_norm(x, w, b, value.eps).astype(x.dtype, copy=False)
        return out  # (B, heads, n, D)

    def grad_transform(
        self, value: QKLayerNorm, at: QKAt, d_out: FloatArray, x_in: FloatArray
    ) -> FloatArray:
        """LayerNorm's backward over each head's d_k (the bias passes nothing to x)."""
        w, _ = head_params(value, at.which, at.cast)
        return grad_layer_norm(d_out, x_in, w, value.eps)  # (B, heads, n, D)

    def parse(self, raw: Any, key: FixtureKey) -> QKLayerNorm:
        value = known_entries(raw, key, NAME, self.subkeys, DOC)
        heads = {"q": (key.heads, "heads"), "k": (key.kv_heads, "kv_heads")}
        arrays: dict[str, FloatArray | None] = {}
        for sub in PARTS:
            field = f"{NAME}.{sub}"
            if sub not in value:
                if sub.endswith("_weight"):
                    raise key("missing", f"q_weight and k_weight together in {DOC}", field)
                arrays[sub] = None
                continue
            n, n_name = heads[sub[0]]
            doc = f"[{n_name}, d_k] = [{n}, {key.d_k}] (one per head) or d_k = {key.d_k} (shared)"
            arr = key.floats(value[sub], field, (1, 2), doc)
            if arr.shape not in ((key.d_k,), (n, key.d_k)):
                raise key(f"has shape {list(arr.shape)}", doc, field)
            weight = arrays.get(f"{sub[0]}_weight")
            if weight is not None and arr.shape != weight.shape:
                want = f"the shape of {sub[0]}_weight, {list(weight.shape)}"
                raise key(f"has shape {list(arr.shape)}", want, field)
            arrays[sub] = arr
        eps = 1e-5
        if "eps" in value:
            eps = positive_number(value["eps"], key, "added to var(x)", f"{NAME}.eps")
        q_w, k_w, q_b, k_b = (arrays[p] for p in PARTS)
        assert q_w is not None and k_w is not None
        return QKLayerNorm(q_w, k_w, q_b, k_b, eps)

    def config(self, value: QKLayerNorm, inputs: Inputs) -> dict[str, Any]:
        over = {True: "head", False: "shared"}
        return {
            "eps": value.eps,
            "q_weights": over[value.per_head("Q")],
            "k_weights": over[value.per_head("K")],
            "bias": value.q_bias is not None or value.k_bias is not None,
        }

    def new_members(self, spec: NewSpec, rng: np.random.Generator) -> dict[str, Any]:
        if not spec.options.get(self.name):
            return {}
        kv = spec.kv_heads or spec.heads
        # learned LayerNorm weights start at 1; these are near it, one row per head
        q_weight, k_weight = (
            (1 + 0.1 * rng.normal(size=(n, spec.d_k))).round(2) for n in (spec.heads, kv)
        )
        return {
            f"{NAME}.q_weight": q_weight,
            f"{NAME}.k_weight": k_weight,
            f"{NAME}.eps": np.array(1e-5),
        }

    def new_lines(self, spec: NewSpec, members: Mapping[str, Any]) -> list[str]:
        rows = [
            f"  {sub}:   # [heads, d_k]: a LayerNorm of its own for each head (StableLM 2)"
            if i == 0
            else f"  {sub}:"
            for i, sub in enumerate(("q_weight", "k_weight"))
        ]
        lines = [f"{NAME}:   # LayerNorm of Q and K before RoPE: (x - mean) / sqrt(var + eps) * w"]
        for sub, row in zip(("q_weight", "k_weight"), rows, strict=True):
            lines.append(row)
            lines.extend(
                "    - [" + ", ".join(exact(x) for x in head) + "]"
                for head in members[f"{NAME}.{sub}"]
            )
        return [*lines, "  eps: 1.0e-05"]

    def new_words(self, spec: NewSpec, members: Mapping[str, Any]) -> str:
        return "q/k LayerNorm"


def formula(value: QKLayerNorm, which: str) -> str:
    """Q_ln's (K_ln's) formula, ``Q_ln = (Q − mean(Q)) / √(var(Q) + eps) × q_weight`` (+ bias)."""
    low = which.lower()
    bias = f" + {low}_bias" if value.params(which)[1] is not None else ""
    return f"{which}_ln = ({which} − mean({which})) / √(var({which}) + eps) × {low}_weight{bias}"


def head_params(value: QKLayerNorm, which: str, cast: Cast) -> tuple[FloatArray, Any]:
    """Q's or K's LayerNorm (weight, bias) in the computing dtype, shaped to broadcast against
    (B, heads, n, D): (heads, 1, D) when each head has its own, (D,) when one serves all."""
    w, b = value.params(which)
    low = which.lower()
    w = cast(f"{NAME}.{low}_weight", w)
    b = None if b is None else cast(f"{NAME}.{low}_bias", b)
    if w.ndim == 2:
        return w[:, None, :], None if b is None else b[:, None, :]  # (heads, 1, D)
    return w, b


register(QKLayerNormalization())
