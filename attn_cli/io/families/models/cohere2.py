"""Cohere 2: Cohere's block, sliding layers with RoPE and full ones without."""

from __future__ import annotations

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, PATTERN, ROTARY, SIZES, WINDOWED, Keys, Need
from attn_cli.io.families.models.cohere import COHERE_BLOCK

ARCH = Arch(
    eps=("layer_norm_eps", 1e-5),
    norm="layer",
    layout="interleaved",
    window="types",
    pattern=4,
    nope="full",
    unwindowed="nope",
    pattern_keys=True,
)
KEYS = Keys(
    reads=SIZES | ROTARY | WINDOWED | PATTERN | {"layer_norm_eps", "attention_bias"},
    # in Command R7B's config.json, never read by transformers' cohere2 (its q/k have no norm)
    inert=frozenset({"layer_switch", "use_qk_norm"}),
    ignored={"partial_rotary_factor": FULL_ROPE},
    needs=(Need(("sliding_window",)), Need(("layer_types", *PATTERN))),
    assumed=("layer_norm_eps", "rope_theta"),
)
BLOCK = COHERE_BLOCK
FAMILY = family(
    "cohere2",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="Cohere2ForCausalLM",
    shows="windows, full layers without RoPE",
)
