"""OLMo 2: no norm before attention (after it), an RMSNorm of the whole q and k."""

from __future__ import annotations

from dataclasses import replace

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import POST_ONLY
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, LLAMA_ASSUMED, LLAMA_READS, Keys
from attn_cli.io.families.models.qwen3 import qk_rms_norm

ARCH = Arch(eps=("rms_norm_eps", 1e-5), norm=None, variants=(qk_rms_norm(whole=True),))
KEYS = Keys(
    reads=LLAMA_READS | {"attention_bias"},
    ignored={"partial_rotary_factor": FULL_ROPE},
    assumed=LLAMA_ASSUMED,
)
BLOCK = replace(POST_ONLY, eps=1e-5)
FAMILY = family(
    "olmo2",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="Olmo2ForCausalLM",
    shows="QK-norm over the whole projection; norms after attention",
)
