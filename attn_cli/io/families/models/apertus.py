"""Apertus: Llama's attention with an RMSNorm of each head's q and k before RoPE (always: its
qk_norm key is not read), llama3 RoPE scaling by default; its own norms' names
(attention_layernorm, feedforward_layernorm) and an MLP without a gate whose activation is
xIELU, with learned parameters per layer (mlp.act_fn.alpha_p, alpha_n, beta, eps)."""

from __future__ import annotations

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, LLAMA_ASSUMED, LLAMA_READS, Keys, Rule
from attn_cli.io.families.models.qwen3 import QK_RMS_NORM

# ApertusConfig's rope_parameters when config.json gives none
APERTUS_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 12000000.0,
    "factor": 8.0,
    "original_max_position_embeddings": 8192,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
}
ARCH = Arch(
    theta=12000000.0,
    eps=("rms_norm_eps", 1e-5),
    norm_name="attention_layernorm",
    variants=(QK_RMS_NORM,),
    default_rope=tuple(APERTUS_ROPE.items()),
)
KEYS = Keys(
    reads=LLAMA_READS | {"attention_bias"},
    inert=frozenset({"qk_norm"}),  # q_norm and k_norm are built whatever it says
    ignored={
        "partial_rotary_factor": FULL_ROPE,
        "sliding_window": Rule((None,), "transformers' apertus has no sliding window"),
    },
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block(
    norms=(("mlp_in", "feedforward_layernorm"),),
    eps=1e-5,
    act=("hidden_act", "xielu"),
    act_module="mlp.act_fn.",
    ungated=True,
)
FAMILY = family(
    "apertus",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="ApertusForCausalLM",
    shows="QK-norm (RMSNorm per head), llama3 RoPE; the xIELU MLP in the forward",
)
