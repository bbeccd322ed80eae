"""EXAONE 4: QK-norm, norms after attention, sliding layers with RoPE and full ones without."""

from __future__ import annotations

from dataclasses import replace

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import POST_ONLY
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import (
    FULL_ROPE,
    LLAMA_ASSUMED,
    LLAMA_READS,
    NO_BIAS,
    PATTERN,
    WINDOWED,
    Keys,
    Need,
)
from attn_cli.io.families.models.qwen3 import QK_RMS_NORM

ARCH = Arch(
    eps=("rms_norm_eps", 1e-5),
    norm=None,
    qkv_bias=False,
    o_bias=False,
    variants=(QK_RMS_NORM,),
    window="types",
    pattern=4,
    nope="full",
    unwindowed="rope",
    pattern_keys=True,
)
KEYS = Keys(
    reads=LLAMA_READS | WINDOWED | PATTERN,
    ignored={"partial_rotary_factor": FULL_ROPE, "attention_bias": NO_BIAS},
    needs=(Need(("sliding_window",)), Need(("layer_types", *PATTERN))),
    assumed=LLAMA_ASSUMED,
)
BLOCK = replace(POST_ONLY, eps_key=ARCH.eps, down_first=False, bias_key=None)
FAMILY = family(
    "exaone4",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="Exaone4ForCausalLM",
    shows="QK-norm, windows, full layers without RoPE",
)
