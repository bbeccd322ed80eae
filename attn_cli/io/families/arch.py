"""A decoder family's differences from Llama's attention, as a table (``Arch``): each field's
default is what Llama does (transformers 5.24's configuration_*.py defaults and modeling_*.py
attention). decoder.py plans a layer from it, rope.py reads RoPE as it says. The variants a
family's attention has beyond RoPE and the window are the family's own data (``FamilyVariant``:
how it reads each one's setting and tensors), which decoder.py iterates by no name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from attn_cli.io.families.config import REQUIRED, Config
from attn_cli.io.families.plan import Embedding, LayerPlan, NormKind, Tensor

# config, family, (layer, layers, hidden), eps, (embed tensors, embedding) -> the layer's plan
LinearPlan = Callable[
    [Config, str, tuple[int, int, int], float, tuple[tuple[Tensor, ...], Embedding]], LayerPlan
]

# Which layers slide: none; all; by layer_types (else every pattern-th is full); Qwen's: from
# max_window_layers on; Qwen2-MoE's: the even layers below it; SmolLM3's: its layers without
# RoPE; Ministral's: every layer when sliding_window is given (or left out)
WindowRule = Literal[
    "none",
    "all",
    "types",
    "from_max_window_layers",
    "even_below_max_window_layers",
    "no_rope_layers",
    "when_given",
]
# config.json and the layer's norm eps -> a variant's setting as the fixture takes it (or a
# FromTensors making it from the layer's tensors); None: the variant is off in this config
SettingOf = Callable[[Config, float], Any]
# the attention module's prefix (``layers.3.self_attn.``) and the layer's (hidden, heads,
# kv_heads, head_dim) -> the tensors the variant reads, after the attention's own
TensorsOf = Callable[[str, tuple[int, int, int, int]], tuple[Tensor, ...]]


def no_tensors(prefix: str, sizes: tuple[int, int, int, int]) -> tuple[Tensor, ...]:
    """A variant read from config.json alone."""
    return ()


@dataclass(frozen=True)
class FamilyVariant:
    """A variant a family's attention has, as the family reads it: ``name`` (the variant's
    fixture key), its setting, the tensors it reads from each layer, and the note of what the
    trace shows differently from the model's own layer (given the family's name), if any."""

    name: str
    setting: SettingOf
    tensors: TensorsOf = no_tensors
    note: Callable[[str], str] | None = None


@dataclass(frozen=True)
class Arch:
    """One decoder family's attention; each field's default is what Llama does."""

    head_dim: int | None = None  # the config class's head_dim (None: hidden / heads)
    reads_head_dim: bool = True  # False: hidden / heads whatever config.json says
    theta: float = 10000.0  # the config class's default_theta
    eps: tuple[str | None, float] = ("rms_norm_eps", 1e-6)  # the norms' eps key (None: fixed)
    norm: NormKind | None = "rms"  # the pre-attention norm; None: none (norms after attention)
    norm_bias: bool = False  # a LayerNorm with a bias (StarCoder 2, Phi, StableLM, GPT-NeoX)
    norm_weight: bool = True  # OLMo's LayerNorm has no parameters
    norm_name: str = "input_layernorm"  # the pre-attention norm's module (Apertus: its own)
    qkv_bias: str | bool = "attention_bias"  # the key turning q/k/v biases on, or always / never
    o_bias: str | bool = "attention_bias"  # the same for the output projection
    bias_default: bool = False  # the default of those keys
    o_bias_default: bool | None = None  # o_bias's key's own default (None: bias_default)
    layout: Literal["half", "interleaved"] = "half"  # rotate_half, or pairs (2i, 2i+1)
    partial: float | None = None  # partial_rotary_factor's default, where the family reads it
    window: WindowRule = "none"  # which layers slide (see _window)
    window_default: int | None = 4096
    pattern: int = 2  # the default layer_types: sliding iff (layer + 1) % pattern
    nope: Literal["", "full", "listed"] = ""  # layers without RoPE: full ones, no_rope_layers
    by_type: tuple[float, float] | None = None  # RoPE per layer type: sliding, full theta
    scale: Literal["head_dim", "query_pre_attn_scalar", "attention_multiplier"] = "head_dim"
    embed: Literal["", "sqrt", "multiplier"] = ""  # Gemma's sqrt(hidden), Granite's multiplier
    gate: bool = False  # Qwen3-Next: an output gate inside q_proj (per head: query, then gate)
    linear: int | None = None  # full_attention_interval's default: the other layers are linear
    fused: Literal["", "rows", "heads"] = ""  # Phi-3's qkv_proj Q|K|V; GPT-NeoX's [H, 3, D]
    attn: str = "self_attn"  # the attention module
    qkv_name: str = "qkv_proj"
    o_name: str = "o_proj"
    embed_name: str = "embed_tokens"  # GPT-NeoX: embed_in
    # The config class's defaults of sizes config.json may leave out (the text_config of Gemma 3
    # 4B on the Hub gives neither heads nor vocab_size); none: config.json must give them. The
    # tensors' names and shapes then check them.
    sizes: tuple[tuple[str, int], ...] = ()
    # RoPE read as the config class reads it
    theta_key: str = "rope_theta"  # the legacy key of the base (GPT-NeoX: rotary_emb_base)
    partial_key: str = (
        "partial_rotary_factor"  # the legacy key of the factor (GPT-NeoX: rotary_pct)
    )
    default_rope: tuple[tuple[str, Any], ...] = ()  # the class's rope_parameters where none given
    renamed_ropes: tuple[tuple[str, str], ...] = ()  # rope types the class renames (Phi-3)
    fixed_original: bool = False  # the class always sets original_max_position_embeddings (4096)
    local_theta: str = ""  # the key of the sliding layers' base (Gemma 3: rope_local_base_freq)
    ntk_alpha: bool = False  # a "dynamic" rope with an alpha is the static NTK-alpha (HunYuan)
    # keys of the rope mapping the family reads elsewhere (a variant's) or never reads: accepted
    rope_extra: tuple[str, ...] = ()
    # windows and layer kinds
    window_flag: bool = False  # use_sliding_window turns the window on (Qwen, SmolLM3)
    pattern_keys: bool = False  # sliding_window_pattern sets the pattern (Gemma 3, Cohere 2)
    # a null sliding_window: every layer full with RoPE (EXAONE 4), or without RoPE (Cohere 2)
    unwindowed: Literal["", "rope", "nope"] = ""
    # notes of what the trace shows differently from the model's own layer
    post_norm: bool = False  # post_attention_layernorm on o_proj's output (Gemma 2, Gemma 3)
    # the variants the family's attention has beyond RoPE and the window, in the fixture's order
    # (after the output gate): a score modifier, an extra logit, a Q/K transform, ...
    variants: tuple[FamilyVariant, ...] = ()
    # a linear_attention layer's plan (Qwen3-Next's Gated DeltaNet), given the layer's embedding
    linear_plan: LinearPlan | None = None

    def size(self, key: str, default: Any = REQUIRED) -> Any:
        """The family's default of a size config.json leaves out, else ``default``."""
        return dict(self.sizes).get(key, default)


LAYER_NORM = Arch(norm="layer", norm_bias=True)  # a LayerNorm with weight and bias
