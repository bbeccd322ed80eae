"""gpt-oss: attention sinks (a learned logit per head), yarn RoPE by default, sliding and full
layers, and a mixture of experts on every layer (stacked experts, the clamped swiglu)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attn_cli.io.families.arch import Arch, FamilyVariant
from attn_cli.io.families.blocks import Block, TensorOf
from attn_cli.io.families.config import Config
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, LLAMA_ASSUMED, LLAMA_READS, WINDOWED, Keys, Need
from attn_cli.io.families.plan import Experts, FloatArray, FromTensors, LayerPlan, Stacked, Tensor

# GptOssConfig's rope_parameters when config.json has none (transformers 5.24)
GPT_OSS_ROPE: dict[str, Any] = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}


def _sink_logits(t: Mapping[str, FloatArray], w: Mapping[str, FloatArray]) -> FloatArray:
    return t["sinks"]


def _sinks_tensor(a: str, sizes: tuple[int, int, int, int]) -> tuple[Tensor, ...]:
    """self_attn.sinks: one learned logit per head."""
    return (Tensor("sinks", f"{a}sinks", (sizes[1],)),)


# the sinks variant: a learned logit per head joined to each softmax row, read from the layer
SINKS = FamilyVariant("sinks", lambda config, eps: FromTensors(_sink_logits), _sinks_tensor)
ARCH = Arch(
    head_dim=64,
    theta=150000.0,
    eps=("rms_norm_eps", 1e-5),
    bias_default=True,
    window="types",
    window_default=128,
    variants=(SINKS,),
    default_rope=tuple(GPT_OSS_ROPE.items()),
)
KEYS = Keys(
    reads=LLAMA_READS | WINDOWED | {"attention_bias"},
    inert=frozenset({"initial_context_length"}),  # the yarn rope's, which is refused
    ignored={"partial_rotary_factor": FULL_ROPE},
    needs=tuple(
        Need((k,)) for k in ("head_dim", "attention_bias", "sliding_window", "layer_types")
    ),
    assumed=LLAMA_ASSUMED,
)


def experts(cfg: Config, plan: LayerPlan, t: TensorOf) -> Experts:
    """gpt-oss's MLP on every layer (GptOssMLP): the router with its bias, the top k logits'
    softmax, each chosen expert a row of the stacked tensors with biases, the clamped swiglu."""
    C = plan.hidden
    E, F = cfg.whole("num_local_experts", 128), cfg.whole("intermediate_size", 2880)
    k = cfg.whole("num_experts_per_tok", 4)
    a = "mlp.experts."
    stacked = Stacked(
        t("experts.gate_up", f"{a}gate_up_proj", E, C, 2 * F),
        t("experts.gate_up_bias", f"{a}gate_up_proj_bias", E, 2 * F),
        t("experts.down", f"{a}down_proj", E, F, C),
        t("experts.down_bias", f"{a}down_proj_bias", E, C),
        cfg.number("swiglu_alpha", 1.702),
        cfg.number("swiglu_limit", 7.0),
    )
    return Experts(
        t("router", "mlp.router.weight", E, C),
        lambda e: (),
        E,
        min(k, E),
        True,
        router_bias=t("router.bias", "mlp.router.bias", E),
        stacked=stacked,
    )


FAMILY = family(
    "gpt_oss",
    ARCH,
    KEYS,
    Block(eps=1e-5, experts=experts),
    hf_class="GptOssForCausalLM",
    shows="sinks (a learned logit per head), windows, yarn; the MoE in the forward",
)
