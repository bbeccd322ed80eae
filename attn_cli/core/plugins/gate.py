"""Gated attention (Qwen3-Next, HF ``Qwen3NextAttention``): a gate projected from the same X as the
queries, gate = X·W_G + b_G, squeezed by a sigmoid and multiplied into each head's output, per
head and per dimension, before the heads are joined and W_O projects them:
gated = output ⊙ σ(gate). A head-output transform of the chain: output -> gate, gated; its
backward gives d_gated, d_gate, d_W_G, d_b_G and the gate's path into d_X. Decoding and
FlashAttention stop at softmax·V and refuse it.

In transformers' checkpoint the gate's columns are interleaved with the queries' in q_proj
(per head: d_k query rows, then d_k gate rows); here W_G is a weight of its own, as W_Q is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from attn_cli.core.heads import merge_heads, split_heads
from attn_cli.core.inputs import Inputs
from attn_cli.core.ops import sigmoid
from attn_cli.core.plugins.parsing import known_entries, plain
from attn_cli.core.stage_spec import OUT_AXES, StageSpec
from attn_cli.core.variant import (
    FixtureKey,
    FloatArray,
    NewOption,
    NewSpec,
    OutTransform,
    Traced,
    exact,
    register,
)

DOC = "a mapping {W_G: [d_model, heads*d_v] weight, b_G: optional [heads*d_v] bias}"


@dataclass(frozen=True, eq=False)
class Gate:
    """The gate's projection: gate = X·W_G + b_G, split into heads as Q is."""

    W_G: FloatArray  # (d_model, H*Dv)
    b_G: FloatArray | None  # (H*Dv,)


class GatedAttention(OutTransform[Gate]):
    order = 80
    name = "gate"
    array_parts = ("W_G", "b_G")
    subkeys = ("W_G", "b_G")
    key_order = 70
    out_stages = ("gate", "gated")
    out_gradients = ("d_gated", "d_gate", "d_W_G", "d_b_G")
    new_options = (
        NewOption(
            "gate",
            bool,
            "A random output gate W_G: each head's output times "
            "sigmoid(X·W_G), before W_O (Qwen3-Next).",
        ),
    )
    new_rank, new_order = 65, 70

    def parse(self, raw: Any, key: FixtureKey) -> Gate:
        value = known_entries(raw, key, self.name, self.subkeys, DOC)
        if key.d_model is None:
            raise key(
                "given with Q, K and V directly",
                "X and W_Q alongside it (the gate is projected from X, as the queries are)",
            )
        width, d_model = key.heads * key.d_v, key.d_model
        shape = f"[d_model, heads*d_v] = [{d_model}, {key.heads}*{key.d_v}]"
        if "W_G" not in value:
            raise key("missing", f"W_G in {DOC}", "gate.W_G")
        W_G = key.floats(_numbers(value["W_G"]), "gate.W_G", (2,), f"a matrix {shape}")
        if W_G.shape != (d_model, width):
            raise key(f"has shape {list(W_G.shape)}", shape, "gate.W_G")
        b_G = None
        if "b_G" in value:
            b_G = key.floats(_numbers(value["b_G"]), "gate.b_G", (1,), f"a vector of {width}")
            if b_G.shape != (width,):
                raise key(f"has length {b_G.shape[0]}", f"heads*d_v = {width}", "gate.b_G")
        return Gate(W_G, b_G)

    def config(self, value: Gate, inputs: Inputs) -> dict[str, Any]:
        return {"bias": value.b_G is not None}

    def out_needs(self, stage: str) -> tuple[str, ...]:
        return ("X",) if stage == "gate" else ("output", "gate")

    def stage_rows(self) -> tuple[StageSpec, ...]:
        """gate and gated, then the gradients: d_gated, d_gate, d_W_G, d_b_G (with a bias)."""
        on, formula = self.applies, self.formula_of

        def biased(inputs: Inputs) -> bool:
            gate = self.value(inputs)
            return gate is not None and gate.b_G is not None

        return (
            *super().stage_rows(),
            StageSpec(
                "d_gated",
                ("d_concat",),
                OUT_AXES,
                False,
                "d_gated",
                on,
                formula("d_gated"),
                gradient=True,
            ),
            StageSpec(
                "d_gate",
                ("d_gated", "output", "gate"),
                OUT_AXES,
                False,
                "d_gate",
                on,
                formula("d_gate"),
                gradient=True,
            ),
            StageSpec(
                "d_W_G",
                ("d_gate", "X"),
                ("d_model", "heads*d_v"),
                False,
                "d_W_G",
                on,
                formula("d_W_G"),
                gradient=True,
            ),
            StageSpec(
                "d_b_G",
                ("d_gate",),
                ("heads*d_v",),
                False,
                "d_b_G",
                biased,
                formula("d_b_G"),
                gradient=True,
            ),
        )

    def stage_formula(self, value: Gate, inputs: Inputs, stage: str) -> str:
        over = "b, t" if inputs.has_batch else "t"
        formulas = {
            "gate": "gate = X·W_G" + (" + b_G" if value.b_G is not None else ""),
            "gated": "gated = output ⊙ σ(gate), σ(x) = 1 / (1 + e^(−x))",
            "d_gated": _d_gated(inputs),
            "d_gate": "d_gate = d_gated ⊙ output ⊙ σ(gate) ⊙ (1 − σ(gate))",
            "d_W_G": "d_W_G = Xᵀ·d_gate",
            "d_b_G": f"d_b_G = Σ_{over} d_gate[{over}]",
        }
        return formulas[stage]

    def formula_part(self, value: Gate, inputs: Inputs, stage: str) -> str:
        return {"concat": ", each head gated", "d_X": " + d_gate·W_Gᵀ"}.get(stage, "")

    def grad_formula(self, value: Gate, inputs: Inputs, d_out: str, x_in: str) -> str:
        return f"{d_out} ⊙ σ(gate)"  # d_output, from d_gated

    def grad_out(
        self, value: Gate, run: Traced, d_out: FloatArray, made: Mapping[str, FloatArray]
    ) -> tuple[FloatArray, dict[str, FloatArray], FloatArray | None]:
        """gated = output ⊙ σ(gate)  =>  d_output = d_gated ⊙ σ(gate), d_gate = d_gated ⊙
        output ⊙ σ'(gate), σ' = σ(1 − σ); gate = X·W_G + b_G  =>  d_W_G = Xᵀ·d_gate,
        d_b_G = Σ d_gate, and d_gate·W_Gᵀ joins d_X."""
        X = run.arrays["X"]  # the gate is parsed only with X
        s = sigmoid(made["gate"])  # (B, H, T, Dv)
        d_gate = d_out * made["output"] * s * (1.0 - s)  # (B, H, T, Dv)
        flat = merge_heads(d_gate)  # (B, T, H*Dv)
        grads = {
            "d_gated": d_out,
            "d_gate": d_gate,
            "d_W_G": np.einsum("btc,bto->co", X, flat),
        }  # (d_model, H*Dv)
        if value.b_G is not None:
            grads["d_b_G"] = flat.sum(axis=(0, 1))  # (H*Dv,)
        return d_out * s, grads, flat @ run.cast("gate.W_G", value.W_G).T  # (B, T, d_model)

    def out_transform(self, value: Gate, run: Traced, output: FloatArray) -> dict[str, FloatArray]:
        X, cast = run.arrays["X"], run.cast  # the gate is parsed only with X
        W_G = cast("gate.W_G", value.W_G)
        b_G = None if value.b_G is None else cast("gate.b_G", value.b_G)
        flat = X @ W_G if b_G is None else X @ W_G + b_G  # (B, T, d_model) -> (B, T, H*Dv)
        gate = split_heads(flat, run.inputs.heads)  # (B, H, T, Dv)
        return {"gate": gate, "gated": output * sigmoid(gate)}  # (B, H, T, Dv)

    def refuses(self, value: Gate, inputs: Inputs, what: str) -> tuple[str, str, str] | None:
        """FlashAttention stops at softmax·V; decoding gates each step's output and the backward
        pass goes through the gate."""
        gives = {
            "FlashAttention": "FlashAttention's tiles give softmax·V, not the gated output",
        }
        if what not in gives:
            return None
        return self.name, gives[what], "a fixture without gate (attn trace shows gate and gated)"

    def new_members(self, spec: NewSpec, rng: np.random.Generator) -> dict[str, Any]:
        if not spec.options.get(self.name):
            return {}
        width = spec.heads * spec.d_k
        return {
            "gate.W_G": (rng.normal(size=(spec.d_model, width)) / np.sqrt(spec.d_model)).round(2)
        }

    def new_lines(self, spec: NewSpec, members: Mapping[str, Any]) -> list[str]:
        W_G = members["gate.W_G"]
        return [
            "gate:   # gated = output * sigmoid(X·W_G), each head and dimension, before W_O "
            "(Qwen3-Next)",
            f"  W_G:   # [d_model, heads*d_v] = {list(W_G.shape)}",
            *("    - [" + ", ".join(exact(x) for x in row) + "]" for row in W_G),
        ]

    def new_words(self, spec: NewSpec, members: Mapping[str, Any]) -> str:
        return "output gate"


def _d_gated(inputs: Inputs) -> str:
    """d_gated: the upstream gradient when gated is the final stage, else d_concat's columns."""
    if inputs.W_O is None:
        return "d_gated (given)" if inputs.grad is not None else "d_gated = 1, L = Σ gated"
    if inputs.heads == 1:
        return "d_gated = d_concat"
    return "d_gated[h] = d_concat[:, h·d_v:(h+1)·d_v]"


def _numbers(raw: Any) -> Any:
    """A NumPy array as it is (floats checks it), anything else as lists and numbers."""
    numeric = isinstance(raw, np.ndarray) and raw.dtype.kind in "iuf"
    return raw if numeric else plain(raw)


register(GatedAttention())
