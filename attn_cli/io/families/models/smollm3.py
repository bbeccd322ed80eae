"""SmolLM3: Llama with RoPE left out of every no_rope_layer_interval-th layer."""

from __future__ import annotations

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.keys import FULL_ROPE, LLAMA_ASSUMED, LLAMA_READS, WINDOWED, Keys, Need

# no window_flag: its eager mask follows layer_types whatever use_sliding_window says (that flag
# only builds the default layer_types, and sets a kwarg eager ignores)
ARCH = Arch(theta=2e6, window="no_rope_layers", window_default=None, nope="listed")
KEYS = Keys(
    reads=LLAMA_READS
    | WINDOWED
    | {"use_sliding_window", "attention_bias", "no_rope_layers", "no_rope_layer_interval"},
    # SmolLM3-3B's config.json carries Qwen's max_window_layers; transformers' smollm3 never reads
    # it (its layer_types come from use_sliding_window, sliding_window and no_rope_layers)
    inert=frozenset({"max_window_layers"}),
    ignored={"partial_rotary_factor": FULL_ROPE},
    needs=(Need(("no_rope_layers", "no_rope_layer_interval")),),
    assumed=LLAMA_ASSUMED,
)
BLOCK = Block(eps_key=ARCH.eps, down_first=False)
FAMILY = family(
    "smollm3",
    ARCH,
    KEYS,
    BLOCK,
    hf_class="SmolLM3ForCausalLM",
    shows="layers without RoPE (NoPE)",
)
