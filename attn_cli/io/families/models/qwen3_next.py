"""Qwen3-Next: full_attention layers (an output gate inside q_proj, per head query then gate;
QK-norm and RMSNorms scaling by 1 + weight; a quarter of each head rotated) every
full_attention_interval-th layer, Gated DeltaNet (linear_attention) layers between, read into
the fixture's gated_deltanet key; a sparse MLP with a gated shared expert."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.config import Config, shown
from attn_cli.io.families.decoder import family
from attn_cli.io.families.experts import QwenMoE, qwen_experts
from attn_cli.io.families.keys import LLAMA_ASSUMED, LLAMA_READS, Keys, Need
from attn_cli.io.families.models.qwen3 import qk_rms_norm
from attn_cli.io.families.plan import Embedding, FloatArray, LayerPlan, Norm, Tensor


@dataclass(frozen=True)
class DeltaNet:
    """Gated DeltaNet's sizes (Qwen3-Next's linear_attention layers): the fixture's
    gated_deltanet key."""

    k_heads: int  # linear_num_key_heads
    v_heads: int  # linear_num_value_heads (a multiple of k_heads)
    d_k: int  # linear_key_head_dim
    d_v: int  # linear_value_head_dim
    kernel: int  # linear_conv_kernel_dim
    eps: float  # rms_norm_eps: the gated RMSNorm's

    variant = "gated_deltanet"
    softmax = False  # a linear layer: no softmax map
    scaled = False  # its scale is 1/sqrt(d_k), the variant's own

    def fixture(self, heads: int, t: Mapping[str, FloatArray]) -> tuple[dict[str, Any], FloatArray]:
        """The gated_deltanet key and W_O from Qwen3NextGatedDeltaNet's weights, as transformers'
        fix_query_key_value_ordering reads them: in_proj_qkvz's rows per key head are [q (d_k) | k
        (d_k) | v, z (d_v for each of its v_heads / k_heads value heads)], in_proj_ba's [b | a] (one
        row per value head each); Linear weights transposed, conv1d.weight [channels, 1, kernel]."""
        r = self.v_heads // self.k_heads  # value heads per key head
        qkvz = t["qkvz.weight"].reshape(
            self.k_heads, 2 * self.d_k + 2 * r * self.d_v, -1
        )  # (Hk, rows, C)
        q, k, v, z = np.split(qkvz, [self.d_k, 2 * self.d_k, 2 * self.d_k + r * self.d_v], axis=1)
        ba = t["ba.weight"].reshape(self.k_heads, 2 * r, -1)  # (Hk, b | a, C)
        b, a = np.split(ba, [r], axis=1)

        def columns(x: FloatArray) -> FloatArray:
            out: FloatArray = x.reshape(-1, x.shape[-1]).T  # (Hk, rows, C) -> (C, Hk·rows)
            return out

        key: dict[str, Any] = {
            "W_q": columns(q),
            "W_k": columns(k),
            "W_v": columns(v),
            "W_z": columns(z),
            "W_b": columns(b),
            "W_a": columns(a),
            "conv": t["conv.weight"][:, 0, :],
            "A_log": t["A_log"],
            "dt_bias": t["dt_bias"],
            "norm": t["gated_norm.weight"],
            "k_heads": self.k_heads,
            "eps": self.eps,
        }
        return key, t["o.weight"].T

    def sizes(self, hidden: int) -> str | None:
        """The sizes an error about the layer's tensors names."""
        return (
            f"hidden {hidden}, linear_num_key_heads {self.k_heads}, linear_num_value_heads "
            f"{self.v_heads}, linear_key_head_dim {self.d_k}, linear_value_head_dim {self.d_v}, "
            f"linear_conv_kernel_dim {self.kernel}"
        )

    def describe(
        self, plan: LayerPlan, label: str, checkpoint: str, given: str
    ) -> tuple[str, str] | None:
        """The fixture's name and description: a linear attention layer's."""
        return (
            f"{label}: layer {plan.layer} linear attention ({plan.family})",
            f"Layer {plan.layer} of {plan.layers} of {checkpoint} ({plan.family}: a Gated "
            f"DeltaNet layer, {self.v_heads} value heads, {self.k_heads} key heads, d_k "
            f"{self.d_k}, d_v {self.d_v}), X from the {given}",
        )


def gated_deltanet(
    config: Config,
    family: str,
    where: tuple[int, int, int],
    eps: float,
    embeds: tuple[tuple[Tensor, ...], Embedding],
) -> LayerPlan:
    """A linear_attention layer (Qwen3NextGatedDeltaNet), read into the fixture's gated_deltanet
    key: in_proj_qkvz (per key head: q, k, then v and z of its value heads), in_proj_ba (per key
    head: b, then a), conv1d (depthwise, no bias), A_log, dt_bias, the gated RMSNorm's weight,
    out_proj; input_layernorm RMSNorm (1 + weight) before."""
    layer, layers, C = where
    Hk = config.whole("linear_num_key_heads", 16)
    Hv = config.whole("linear_num_value_heads", 32)
    if Hv % Hk:
        raise config.error(
            "linear_num_value_heads",
            f"{Hv} is not a multiple of linear_num_key_heads {Hk}: "
            "transformers splits in_proj_qkvz per key head",
            "a multiple of linear_num_key_heads",
        )
    dk, dv = config.whole("linear_key_head_dim", 128), config.whole("linear_value_head_dim", 128)
    kernel = config.whole("linear_conv_kernel_dim", 4)
    act = config.text("hidden_act", "silu")
    if act not in ("silu", "swish"):  # the activation after linear_attn's conv1d
        raise config.error(
            "hidden_act",
            f"got {shown(act)}: the activation after linear_attention's conv1d, "
            "where the gated_deltanet key applies SiLU",
            "absent or 'silu'",
        )
    p = f"layers.{layer}."
    a, conv = f"{p}linear_attn.", 2 * Hk * dk + Hv * dv
    tensors = (
        Tensor("qkvz.weight", f"{a}in_proj_qkvz.weight", (conv + Hv * dv, C)),
        Tensor("ba.weight", f"{a}in_proj_ba.weight", (2 * Hv, C)),
        Tensor("conv.weight", f"{a}conv1d.weight", (conv, 1, kernel)),
        Tensor("A_log", f"{a}A_log", (Hv,)),
        Tensor("dt_bias", f"{a}dt_bias", (Hv,)),
        Tensor("gated_norm.weight", f"{a}norm.weight", (dv,)),
        Tensor("o.weight", f"{a}out_proj.weight", (C, Hv * dv)),
        Tensor("norm.weight", f"{p}input_layernorm.weight", (C,)),
    )
    notes = (
        f"layer {layer} is a linear_attention layer (Gated DeltaNet): read into the "
        "gated_deltanet key; in_proj_qkvz's rows per key head [q | k | v | z] and in_proj_ba's "
        "[b | a] split into W_q, W_k, W_v, W_z, W_b, W_a (fix_query_key_value_ordering), every "
        "Linear transposed, conv1d.weight[:, 0, :]",
    )
    sizes = (layer, layers, C, Hv, Hv, dk)  # layer, layers, hidden, heads, kv_heads, head_dim
    return LayerPlan(
        family,
        *sizes,
        layout="linear",
        anchor=ANCHOR_LINEAR,
        tensors=tensors,
        embed_tensors=embeds[0],
        pre_norm=Norm("rms1p", eps, "norm.weight"),
        embedding=embeds[1],
        causal=True,
        scale=float(dk**-0.5),
        front_end=DeltaNet(Hk, Hv, dk, dv, kernel, eps),
        notes=notes,
        block=p,
        scopes=("linear_attn.", "input_layernorm."),
    )


# a tensor every Qwen3-Next layer has, full or linear: it finds the checkpoint's prefix
ANCHOR_LINEAR = r"layers\.\d+\.(?:self_attn\.q_proj|linear_attn\.in_proj_qkvz)\.weight"

ARCH = Arch(
    head_dim=256,
    norm="rms1p",
    partial=0.25,
    gate=True,
    variants=(qk_rms_norm(plus_one=True),),
    linear=4,
    linear_plan=gated_deltanet,
)
KEYS = Keys(
    # the full_attention layers' keys and the Gated DeltaNet (linear_attention) layers'
    reads=LLAMA_READS
    | {
        "attention_bias",
        "partial_rotary_factor",
        "layer_types",
        "full_attention_interval",
        "linear_conv_kernel_dim",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
    },
    needs=(
        Need(("head_dim",)),
        Need(("layer_types", "full_attention_interval")),
        Need(("partial_rotary_factor",)),
    ),
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block(norm="rms1p", experts=partial(qwen_experts, QwenMoE(512, 10, True)))
FAMILY = family(
    "qwen3_next",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="Qwen3NextForCausalLM",
    shows="the output gate, QK-norm (1 + weight), Gated DeltaNet layers; the MoE in the forward",
)
