"""StableLM: LayerNorm, a quarter of each head rotated, use_parallel_residual; with
qk_layernorm a LayerNorm of each head of q and k before RoPE, one per head (the qk_layernorm
variant). Phi reads the same key with one LayerNorm for all heads (``qk_layer_norm`` here)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from itertools import count
from typing import Any

import numpy as np

from attn_cli.io.families.arch import LAYER_NORM, Arch, FamilyVariant
from attn_cli.io.families.blocks import LayerNormBlock
from attn_cli.io.families.config import Config
from attn_cli.io.families.decoder import family, llama_like
from attn_cli.io.families.keys import ROTARY, SIZES, Keys, Need
from attn_cli.io.families.plan import FloatArray, FromTensors, LayerPlan, Tensor
from attn_cli.io.families.registry import PlanLayer


def qk_layer_norm(*, per_head: bool, bias: bool, suffix: str = "layernorm") -> FamilyVariant:
    """The qk_layernorm variant as its families read it: a LayerNorm of q and of k over each
    head's head_dim, before RoPE, with the layer norms' eps. ``per_head``: one LayerNorm per
    head (StableLM's ``q_layernorm.norms.{h}``), else one for all heads (Phi's
    ``q_layernorm``); ``bias``: each has a bias (Phi's). With ``suffix`` "norm" the modules are
    Cohere's ``q_norm`` and ``k_norm``, each one LayerNorm over (heads, head_dim): a weight a
    head, stored as one (heads, head_dim) tensor."""
    parts = ("weight", "bias") if bias else ("weight",)
    one_tensor = suffix == "norm"  # Cohere's: the heads' weights in one tensor

    def stacked(t: Mapping[str, FloatArray], side: str, part: str) -> FloatArray:
        if one_tensor or not per_head:
            return t[f"{side}.{part}"].astype(np.float64)  # (D,) or (heads, D)
        rows = []
        for h in count():
            if f"{side}.norms.{h}.{part}" not in t:
                break
            rows.append(t[f"{side}.norms.{h}.{part}"])
        return np.stack(rows).astype(np.float64)  # (heads, D)

    def setting(config: Config, eps: float) -> FromTensors:
        def make(t: Mapping[str, FloatArray], w: Mapping[str, FloatArray]) -> dict[str, Any]:
            made: dict[str, Any] = {"eps": eps}
            for side in ("q", "k"):
                made.update((f"{side}_{p}", stacked(t, f"{side}_{suffix}", p)) for p in parts)
            return made

        return FromTensors(make)

    def tensors(a: str, sizes: tuple[int, int, int, int]) -> tuple[Tensor, ...]:
        _, H, Hkv, D = sizes
        out = []
        for side, n in ((f"q_{suffix}", H), (f"k_{suffix}", Hkv)):
            if one_tensor:
                out += [Tensor(f"{side}.{p}", f"{a}{side}.{p}", (n, D)) for p in parts]
                continue
            for name in [f"{side}.norms.{h}" for h in range(n)] if per_head else [side]:
                out += [Tensor(f"{name}.{p}", f"{a}{name}.{p}", (D,)) for p in parts]
        return tuple(out)

    return FamilyVariant("qk_layernorm", setting, tensors)


def flagged(arch: Arch, variant: FamilyVariant, name: str, key: str = "qk_layernorm") -> PlanLayer:
    """The plan of a family whose ``variant`` config.json's ``key`` turns on (its tensors are
    read only then: a checkpoint saved with them and the key off is refused)."""
    on = replace(arch, variants=(*arch.variants, variant))

    def plan(config: Config, layer: int) -> LayerPlan:
        return llama_like(on if config.flag(key, False) else arch, name, config, layer)

    return plan


NAME = "stablelm"
ARCH = replace(
    LAYER_NORM,
    eps=("layer_norm_eps", 1e-5),
    qkv_bias="use_qkv_bias",
    o_bias=False,
    partial=0.25,
    reads_head_dim=False,
)
KEYS = Keys(
    reads=SIZES - {"head_dim"}
    | ROTARY
    | {"layer_norm_eps", "use_qkv_bias", "partial_rotary_factor", "qk_layernorm"},
    inert=frozenset({"use_parallel_residual"}),  # the MLP beside attention, or after it
    needs=(Need(("partial_rotary_factor",)),),
    assumed=("layer_norm_eps", "rope_theta"),
)
BLOCK = LayerNormBlock(parallel="flag", gated=True)
FAMILY = replace(
    family(
        NAME,
        ARCH,
        KEYS,
        BLOCK,
        hf_class="StableLmForCausalLM",
        shows="partial rotary, q/k/v biases (use_qkv_bias), q/k LayerNorm per head (qk_layernorm)",
    ),
    plan=flagged(ARCH, qk_layer_norm(per_head=True, bias=False), NAME),
)
