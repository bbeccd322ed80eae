"""QK-norm (Qwen3, Gemma 3, OLMo 2): RMSNorm of Q and K before RoPE, x / sqrt(mean(x²) + eps)
× weight. Its fixture key here; it still runs in core/pipeline.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attn_cli.core.inputs import Inputs, QKNorm
from attn_cli.core.plugins.parsing import known_subkeys, positive_number
from attn_cli.core.variant import FixtureKey, Variant, register

DOC = "a mapping {q_weight, k_weight, eps: 1e-6}"


class QKNormalization(Variant):
    name = "qk_norm"
    array_parts = ("q_weight", "k_weight")
    subkeys = ("q_weight", "k_weight", "eps")
    key_order = 10

    def parse(self, raw: Any, key: FixtureKey) -> QKNorm:
        if not isinstance(raw, Mapping):
            raise key(f"got {key.describe(raw)}", DOC)
        value = {k: v for k, v in raw.items() if v is not None}
        known_subkeys(value, key, self.name, self.subkeys)
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
                    "projection)", field,
                )  # fmt: skip
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


register(QKNormalization())
