"""GLM-4: half of each head rotated on interleaved pairs, four norms, a fused MLP."""

from __future__ import annotations

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import LLAMA_ASSUMED, LLAMA_READS, Keys, Need

ARCH = Arch(
    head_dim=128,
    eps=("rms_norm_eps", 1.5625e-7),
    o_bias=False,
    bias_default=True,
    layout="interleaved",
    partial=0.5,
)
KEYS = Keys(
    reads=LLAMA_READS | {"attention_bias", "partial_rotary_factor"},
    needs=tuple(Need((k,)) for k in ("head_dim", "attention_bias", "partial_rotary_factor")),
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block(
    placement="sandwich",
    norms=(
        ("attn_out", "post_self_attn_layernorm"),
        ("mlp_in", "post_attention_layernorm"),
        ("mlp_out", "post_mlp_layernorm"),
    ),
    eps_key=ARCH.eps,
    fused=True,
    down_first=False,
    bias_key=None,
)
FAMILY = family(
    "glm4",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="Glm4ForCausalLM",
    shows="partial interleaved RoPE, q/k/v biases",
)
