"""OLMo 3: OLMo 2 with sliding and full layers."""

from __future__ import annotations

from dataclasses import replace

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import POST_ONLY
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, LLAMA_ASSUMED, LLAMA_READS, WINDOWED, Keys, Need
from attn_cli.io.families.models.qwen3 import qk_rms_norm

ARCH = Arch(
    theta=5e5,
    eps=("rms_norm_eps", 1e-5),
    norm=None,
    variants=(qk_rms_norm(whole=True),),
    window="types",
    pattern=4,
    by_type=(5e5, 5e5),
)
KEYS = Keys(
    reads=LLAMA_READS | WINDOWED | {"attention_bias"},
    ignored={"partial_rotary_factor": FULL_ROPE},
    needs=(Need(("sliding_window",)), Need(("layer_types",))),
    assumed=LLAMA_ASSUMED,
)
BLOCK = replace(POST_ONLY, eps_key=ARCH.eps, down_first=False, bias_key=None)
FAMILY = family(
    "olmo3",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="Olmo3ForCausalLM",
    shows="QK-norm over the whole projection, windows",
)
