"""HunYuan dense (hunyuan_v1_dense, Hunyuan-7B): Llama's layer with an RMSNorm of each head of q
and k AFTER RoPE (query_layernorm, key_layernorm: the post_rope_norm variant, eps rms_norm_eps)
and RoPE whose "dynamic" rope_parameters carry a fixed ``alpha``: the static NTK-alpha base
theta·alpha^(d/(d−2)), d = head_dim (transformers' HunYuanDenseV1RotaryEmbedding renames it
ntk_alpha; without an alpha it is transformers' dynamic NTK)."""

from __future__ import annotations

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, LLAMA_ASSUMED, LLAMA_READS, Keys, Need, Rule
from attn_cli.io.families.models.qwen3 import qk_rms_norm

ARCH = Arch(
    eps=("rms_norm_eps", 1e-5),
    ntk_alpha=True,
    # the rope mapping's keys transformers never reads on the alpha path (yarn's, left in the
    # shipped config), and alpha where it is 0 or null (then: dynamic NTK, which reads factor)
    rope_extra=("alpha", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "factor"),
    # query_layernorm and key_layernorm: each head's RMSNorm, after RoPE
    variants=(qk_rms_norm(variant="post_rope_norm", names=("query_layernorm", "key_layernorm")),),
)
KEYS = Keys(
    reads=LLAMA_READS | {"attention_bias"},
    # transformers' HunYuanDenseV1 builds query_layernorm and key_layernorm whatever use_qk_norm
    # says, has no cross-layer attention (use_cla) and sizes heads by head_dim alone
    inert=frozenset({"use_qk_norm", "use_cla", "attention_head_dim", "pretraining_tp"}),
    ignored={
        "partial_rotary_factor": FULL_ROPE,
        "sliding_window": Rule((None,), "transformers' hunyuan_v1_dense has no sliding window"),
    },
    # transformers reads config.head_dim itself (None fails): a checkpoint must say it
    needs=(Need(("head_dim",)),),
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block()
FAMILY = family(
    "hunyuan_v1_dense",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="HunYuanDenseV1ForCausalLM",
    shows=(
        "q/k RMSNorm per head after RoPE (post_rope_norm: Q_postnorm, K_postnorm), NTK-alpha "
        "RoPE (ntk_alpha; the rope mapping's factor, beta_fast, beta_slow, mscale and "
        "mscale_all_dim are not read on its alpha path)"
    ),
)
