"""ERNIE 4.5 MoE: ERNIE 4.5's attention (RoPE on interleaved pairs); past attention, Llama's block
with a dense MLP outside moe_layer_start_index..moe_layer_end_index (every
moe_layer_interval-th layer), inside it a mixture: the softmax router whose choice
e_score_correction_bias moves (always: moe_use_aux_free is not read), the weights over
max(their sum, moe_norm_min), plus the shared experts on every token."""

from __future__ import annotations

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block, TensorOf
from attn_cli.io.families.config import Config
from attn_cli.io.families.decoder import family
from attn_cli.io.families.experts import each_expert, shared_mlp
from attn_cli.io.families.keys import LLAMA_ASSUMED, LLAMA_READS, OFF, Keys, Rule
from attn_cli.io.families.plan import Corrected, Experts, LayerPlan

ARCH = Arch(
    theta=5e5, eps=("rms_norm_eps", 1e-5), qkv_bias=False, o_bias=False, layout="interleaved"
)


def _either(cfg: Config, key: str, alias: str, default: int) -> int:
    """A size config.json may give by its own name or by the one attribute_map maps to it."""
    return cfg.whole(key if cfg.has(key) or not cfg.has(alias) else alias, default)


def experts(cfg: Config, plan: LayerPlan, t: TensorOf) -> Experts | None:
    """Ernie4_5_MoeSparseMoeBlock on the layers the moe_layer_* keys pick (a dense MLP on the
    others): the corrected softmax router, the routed experts, the shared experts (one MLP
    moe_num_shared_experts × moe_intermediate_size wide, none when 0) on every token."""
    C, layer = plan.hidden, plan.layer
    start = cfg.whole("moe_layer_start_index", 1, minimum=0)
    end = cfg.whole("moe_layer_end_index", -1, minimum=-1)
    end = cfg.whole("num_hidden_layers") - 1 if end == -1 else end
    interval = cfg.whole("moe_layer_interval", 1)
    if (layer + 1) % interval or not start <= layer <= end:
        return None
    E = _either(cfg, "moe_num_experts", "num_experts", 64)
    k = _either(cfg, "moe_k", "num_experts_per_tok", 6)
    F = cfg.whole("moe_intermediate_size", 1536)
    S = F * cfg.whole("moe_num_shared_experts", 2, minimum=0)
    corrected = Corrected(
        t("router.correction", "mlp.moe_statics.e_score_correction_bias", 1, E),
        cfg.number("moe_norm_min", 1e-12),
    )
    return Experts(
        t("router", "mlp.gate.weight", E, C),
        each_expert(t, F, C),
        E,
        min(k, E),
        True,
        corrected=corrected,
        plain_shared=shared_mlp(t, "mlp.shared_experts.", S, C) if S else None,
    )


KEYS = Keys(
    reads=LLAMA_READS
    | {
        "moe_num_experts",
        "moe_k",
        "moe_intermediate_size",
        "moe_num_shared_experts",
        "moe_layer_start_index",
        "moe_layer_end_index",
        "moe_layer_interval",
        "moe_norm_min",
        "num_experts",
        "num_experts_per_tok",
    },
    # the correction bias is applied whatever moe_use_aux_free says; moe_gate names the top-k
    # router, the only one; the multi-token prediction layers draft, outside the forward
    inert=frozenset({"moe_use_aux_free", "moe_gate", "num_mtp_layers", "num_nextn_predict_layers"}),
    neutral={
        "use_bias": Rule(OFF, "biases on the projections and on the shared experts' MLP"),
    },
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block(eps_key=ARCH.eps, down_first=False, bias_key=None, experts=experts)
FAMILY = family(
    "ernie4_5_moe",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="Ernie4_5_MoeForCausalLM",
    shows="interleaved RoPE; the MoE with shared experts and the corrected softmax router in "
    "the forward",
    arch_refused="ernie4_5_moe's RoPE on interleaved pairs shows in no config.json key, so "
    "--arch ernie4_5_moe cannot tell an ERNIE 4.5 MoE from a Llama",
)
