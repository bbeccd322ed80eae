"""Model families for ``attn import``: a checkpoint's config.json read into the plan of one layer.

A plan names every tensor that layer L's attention reads (without the checkpoint's prefix, such
as ``model.`` or ``bert.``), the shape config.json implies for it, and each convention the fixture
must carry: heads and key/value heads, the scale, causal masking, RoPE, the sliding window,
softcapping, QK-norm and sinks. Defaults for keys a config.json leaves out are those of the
transformers config class of the family (read from transformers 5.24's ``configuration_*.py``).

Families and their layouts (``X @ W`` is the fixture's convention):
    bert        ``query/key/value`` and ``attention.output.dense``: nn.Linear [out, in], transposed.
                Post-norm: layer L's input is the residual stream as it is.
    gpt2        Conv1D [in, out], used as is; ``c_attn`` is Q|K|V side by side; ``ln_1`` pre-norm.
    llama-like  ``q_proj/k_proj/v_proj/o_proj`` (nn.Linear, transposed), ``input_layernorm``
                RMSNorm (Gemma: ``1 + weight``), RoPE ``rotate_half`` (the fixture's ``half``):
                llama, mistral, qwen2, qwen3 (``q_norm/k_norm``), gemma2 (softcap,
                ``query_pre_attn_scalar``), gpt_oss (``sinks``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from attn_cli.errors import InputError, field_name

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gpt_oss")
FAMILIES = ("bert", "gpt2", *LLAMA_LIKE)

NormKind = Literal["layer", "rms", "rms1p"]
_REQUIRED: Any = object()


@dataclass(frozen=True)
class Tensor:
    """One tensor the import reads: role, name (no prefix), the shape config.json implies."""

    role: str
    name: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Norm:
    """A norm over the last axis: LayerNorm, RMSNorm, or Gemma's RMSNorm with 1 + weight."""

    kind: NormKind
    eps: float
    weight: str  # role of the weight tensor
    bias: str | None = None  # role of the bias tensor (LayerNorm)


@dataclass(frozen=True)
class Embedding:
    """How layer 0's input is made from token ids: tables, BERT's LayerNorm, Gemma's scale."""

    tokens: str
    positions: str | None = None
    types: str | None = None
    norm: Norm | None = None
    scale: float | None = None


@dataclass(frozen=True)
class Rope:
    """Rotary embedding of Q and K: base, rotated dims per head, HF ``rotate_half`` layout."""

    base: float
    dims: int
    layout: Literal["half"] = "half"
    # RoPE scaling as a fixture's rope.scaling: {type: llama3, factor: 8, ...}; None: none
    scaling: tuple[tuple[str, Any], ...] | None = None


@dataclass(frozen=True)
class LayerPlan:
    """What layer ``layer`` of a checkpoint is: its tensors, sizes and attention conventions."""

    family: str
    layer: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layout: Literal["linear", "conv1d"]
    anchor: str  # a regex of a tensor of every layer; its match finds the checkpoint's prefix
    tensors: tuple[Tensor, ...]  # the layer's tensors, all required
    embed_tensors: tuple[Tensor, ...]  # read only to embed --text
    pre_norm: Norm | None
    embedding: Embedding
    causal: bool
    scale: float
    rope: Rope | None = None
    window: int | None = None
    softcap: float | None = None
    qk_norm_eps: float | None = None
    sinks: bool = False
    notes: tuple[str, ...] = ()
    block: str = ""  # the layer's own prefix (``layers.3.``): its modules below are checked
    scopes: tuple[str, ...] = ()  # modules of the block whose every tensor the plan reads
    unused: str = "$^"  # a regex (after ``block``) of tensors there the model never uses


class Config:
    """config.json as read: typed getters whose errors name the file and the key."""

    def __init__(self, data: Mapping[str, Any], source: str) -> None:
        self.data = data
        self.source = source

    def error(self, key: str, what: str, expected: str) -> InputError:
        return InputError(self.source, key, what, expected)

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def whole(self, key: str, default: Any = _REQUIRED, minimum: int = 1) -> int:
        value = self.data.get(key)
        if value is None:
            if default is _REQUIRED:
                raise self.error(key, "missing", f"a whole number >= {minimum}")
            return int(default)
        if type(value) is not int or value < minimum:
            raise self.error(key, f"got {value!r}", f"a whole number >= {minimum}")
        return value

    def number(self, key: str, default: float, *, positive: bool = True) -> float:
        value = self.data.get(key)
        if value is None:
            return default
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or (positive and value <= 0):
            raise self.error(key, f"got {value!r}", "a finite number > 0")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key)
        if value is None:  # transformers writes null for an option left at its default
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"got {value!r}", "true or false")
        return value

    def optional_number(self, key: str, default: float) -> float | None:
        """The number, or None where config.json says null (the default where it says nothing)."""
        if key in self.data and self.data[key] is None:
            return None
        return self.number(key, default)

    def optional_whole(self, key: str, default: int) -> int | None:
        """The whole number, or None where config.json says null."""
        if key in self.data and self.data[key] is None:
            return None
        return self.whole(key, default)


def family_of(config: Config, arch: str | None) -> str:
    """The family: ``arch`` if given, else config.json's ``model_type``; others refused."""
    name = arch if arch is not None else config.data.get("model_type")
    source, key = ("", "arch") if arch is not None else (config.source, "model_type")
    option = "arch" if arch is not None else None
    if not isinstance(name, str):
        what = "a model type: " + ", ".join(FAMILIES)
        raise InputError(source, key, f"got {name!r}", what, option=option)
    if name not in FAMILIES:
        why = f" ({KNOWN_TYPES[name]})" if name in KNOWN_TYPES else ""
        raise InputError(
            source, key, f"model type {name!r} is not supported{why}",
            "one of " + ", ".join(FAMILIES), option=option,
        )  # fmt: skip
    return name


def plan_layer(config: Config, family: str, layer: int) -> LayerPlan:
    """The plan of layer ``layer`` of a checkpoint of ``family`` described by ``config``."""
    if family == "bert":
        return _bert(config, layer)
    if family == "gpt2":
        return _gpt2(config, layer)
    return _llama_like(config, family, layer)


def _check_layer(config: Config, key: str, layer: int) -> int:
    layers = config.whole(key)
    if not 0 <= layer < layers:
        raise config.error(
            key, f"the model has {layers} layers, layer {layer} is out of range",
            f"a layer between 0 and {layers - 1}",
        )  # fmt: skip
    return layers


def _heads(config: Config, hidden: int, heads_key: str) -> int:
    heads = config.whole(heads_key)
    if hidden % heads:
        raise config.error(
            heads_key, f"{heads} does not divide the hidden size {hidden}", "a divisor"
        )
    return heads


def _bert(config: Config, layer: int) -> LayerPlan:
    """BERT: nn.Linear query/key/value/attention.output.dense, post-norm, learned positions."""
    kind = config.data.get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise config.error(
            "position_embedding_type", f"{kind!r} is not supported", "'absolute' (learned table)"
        )
    if config.flag("is_decoder", False):
        raise config.error("is_decoder", "a decoder BERT is not supported", "false (an encoder)")
    layers = _check_layer(config, "num_hidden_layers", layer)
    C = config.whole("hidden_size")
    H = _heads(config, C, "num_attention_heads")
    eps = config.number("layer_norm_eps", 1e-12)
    p = f"encoder.layer.{layer}.attention."
    tensors = tuple(
        Tensor(role, f"{p}{name}", shape)
        for role, name, shape in (
            ("q.weight", "self.query.weight", (C, C)), ("q.bias", "self.query.bias", (C,)),
            ("k.weight", "self.key.weight", (C, C)), ("k.bias", "self.key.bias", (C,)),
            ("v.weight", "self.value.weight", (C, C)), ("v.bias", "self.value.bias", (C,)),
            ("o.weight", "output.dense.weight", (C, C)), ("o.bias", "output.dense.bias", (C,)),
        )
    )  # fmt: skip
    positions = config.whole("max_position_embeddings", 512)
    embed = (
        Tensor("embed.tokens", "embeddings.word_embeddings.weight",
               (config.whole("vocab_size"), C)),
        Tensor("embed.positions", "embeddings.position_embeddings.weight", (positions, C)),
        Tensor("embed.types", "embeddings.token_type_embeddings.weight",
               (config.whole("type_vocab_size", 2), C)),
        Tensor("embed.norm.weight", "embeddings.LayerNorm.weight", (C,)),
        Tensor("embed.norm.bias", "embeddings.LayerNorm.bias", (C,)),
    )  # fmt: skip
    return LayerPlan(
        family="bert", layer=layer, layers=layers, hidden=C, heads=H, kv_heads=H,
        head_dim=C // H, layout="linear",
        anchor=r"encoder\.layer\.\d+\.attention\.self\.query\.weight",
        tensors=tensors, embed_tensors=embed, pre_norm=None,
        embedding=Embedding(
            "embed.tokens", "embed.positions", "embed.types",
            Norm("layer", eps, "embed.norm.weight", "embed.norm.bias"),
        ),
        causal=False, scale=(C // H) ** -0.5,
        block=f"encoder.layer.{layer}.", scopes=("attention.",),
        unused=r"attention\.output\.LayerNorm\.(weight|bias)",  # after the residual add
    )  # fmt: skip


def _gpt2(config: Config, layer: int) -> LayerPlan:
    """GPT-2: Conv1D [in, out]; c_attn holds Q|K|V side by side; ln_1 before attention; causal."""
    if config.flag("add_cross_attention", False):
        raise config.error("add_cross_attention", "cross-attention is not supported", "false")
    layers = _check_layer(config, "n_layer", layer)
    C = config.whole("n_embd")
    H = _heads(config, C, "n_head")
    D = C // H
    scale = D**-0.5 if config.flag("scale_attn_weights", True) else 1.0
    notes = ["c_attn [C, 3C] is split into W_Q | W_K | W_V in that order; Conv1D is not transposed"]
    if config.flag("scale_attn_by_inverse_layer_idx", False):
        scale /= layer + 1
        notes.append(f"scale divided by layer + 1 = {layer + 1} (scale_attn_by_inverse_layer_idx)")
    p = f"h.{layer}."
    eps = config.number("layer_norm_epsilon", 1e-5)
    tensors = (
        Tensor("qkv.weight", f"{p}attn.c_attn.weight", (C, 3 * C)),
        Tensor("qkv.bias", f"{p}attn.c_attn.bias", (3 * C,)),
        Tensor("o.weight", f"{p}attn.c_proj.weight", (C, C)),
        Tensor("o.bias", f"{p}attn.c_proj.bias", (C,)),
        Tensor("norm.weight", f"{p}ln_1.weight", (C,)),
        Tensor("norm.bias", f"{p}ln_1.bias", (C,)),
    )
    embed = (
        Tensor("embed.tokens", "wte.weight", (config.whole("vocab_size"), C)),
        Tensor("embed.positions", "wpe.weight", (config.whole("n_positions", 1024), C)),
    )
    return LayerPlan(
        family="gpt2", layer=layer, layers=layers, hidden=C, heads=H, kv_heads=H, head_dim=D,
        layout="conv1d", anchor=r"h\.\d+\.attn\.c_attn\.weight",
        tensors=tensors, embed_tensors=embed,
        pre_norm=Norm("layer", eps, "norm.weight", "norm.bias"),
        embedding=Embedding("embed.tokens", "embed.positions"),
        causal=True, scale=scale, notes=tuple(notes),
        block=p, scopes=("attn.", "ln_1."), unused=r"attn\.(bias|masked_bias)",  # mask buffers
    )  # fmt: skip


# Defaults of the transformers config classes where they differ between llama-like families.
_HEAD_DIM = {"qwen3": 128, "gemma2": 256, "gpt_oss": 64}
_THETA = {"gpt_oss": 150000.0}
_EPS = {"gpt_oss": 1e-5}
_BIAS = {"gpt_oss": True}  # attention_bias default; qwen2's q/k/v always have biases
# Families whose attention reads attention_bias; Mistral has no biases, Qwen2 only q/k/v ones.
_READS_BIAS = ("llama", "qwen3", "gemma2", "gpt_oss")


def _llama_like(config: Config, family: str, layer: int) -> LayerPlan:
    """Llama, Mistral, Qwen2, Qwen3, Gemma 2, gpt-oss: q/k/v/o_proj, GQA, RMSNorm, RoPE."""
    layers = _check_layer(config, "num_hidden_layers", layer)
    C = config.whole("hidden_size")
    H = config.whole("num_attention_heads")
    Hkv = config.whole("num_key_value_heads", H)
    if H % Hkv:
        raise config.error("num_key_value_heads", f"{Hkv} does not divide {H} heads", "a divisor")
    given = config.data.get("head_dim", _HEAD_DIM.get(family))
    D = (
        C // _heads(config, C, "num_attention_heads")
        if given is None
        else config.whole("head_dim", given)
    )
    bias = family in _READS_BIAS and config.flag("attention_bias", _BIAS.get(family, False))
    tensors = _llama_tensors(family, f"layers.{layer}.", (C, H, Hkv, D), bias)
    eps = config.number("rms_norm_eps", _EPS.get(family, 1e-6))
    gemma = family == "gemma2"
    embed = (Tensor("embed.tokens", "embed_tokens.weight", (config.whole("vocab_size"), C)),)
    if "layer_types" in KEYS[family].reads and config.has("layer_types"):
        _layer_type(config, family, layer, layers)  # the whole list checked, window or not
    window, window_note = _window(config, family, layer, layers)
    scale = config.number("query_pre_attn_scalar", 256.0) ** -0.5 if gemma else D**-0.5
    softcap = config.optional_number("attn_logit_softcapping", 50.0) if gemma else None
    if gemma and config.flag("use_bidirectional_attention", False):
        raise config.error("use_bidirectional_attention", "is not supported", "false (causal)")
    rope, rope_note = _rope(config, family, D)
    notes = [n for n in (window_note, rope_note) if n]
    if gemma:
        notes.append(
            "Gemma 2 applies post_attention_layernorm to o_proj's output before the residual "
            "add: projected is o_proj's output, before that norm"
        )
    return LayerPlan(
        family=family, layer=layer, layers=layers, hidden=C, heads=H, kv_heads=Hkv, head_dim=D,
        layout="linear", anchor=r"layers\.\d+\.self_attn\.q_proj\.weight",
        tensors=tensors, embed_tensors=embed,
        pre_norm=Norm("rms1p" if gemma else "rms", eps, "norm.weight"),
        embedding=Embedding("embed.tokens", scale=math.sqrt(C) if gemma else None),
        causal=True, scale=scale, rope=rope, window=window,
        softcap=softcap, qk_norm_eps=eps if family == "qwen3" else None,
        sinks=family == "gpt_oss", notes=tuple(notes),
        block=f"layers.{layer}.", scopes=("self_attn.", "input_layernorm."),
        unused=r"self_attn\.rotary_emb\.inv_freq",  # a buffer older checkpoints saved
    )  # fmt: skip


def _llama_tensors(
    family: str, p: str, sizes: tuple[int, int, int, int], bias: bool
) -> tuple[Tensor, ...]:
    """The attention tensors of one llama-like layer; biases where the architecture has them.

    As transformers builds the layer: q/k/v biases with ``attention_bias`` (Qwen2: always), an
    o_proj bias with ``attention_bias``; a bias a checkpoint holds beyond that is not used.
    """
    C, H, Hkv, D = sizes
    a = f"{p}self_attn."
    tensors = [
        Tensor("q.weight", f"{a}q_proj.weight", (H * D, C)),
        Tensor("k.weight", f"{a}k_proj.weight", (Hkv * D, C)),
        Tensor("v.weight", f"{a}v_proj.weight", (Hkv * D, C)),
        Tensor("o.weight", f"{a}o_proj.weight", (C, H * D)),
        Tensor("norm.weight", f"{p}input_layernorm.weight", (C,)),
    ]
    if bias or family == "qwen2":
        tensors += [
            Tensor("q.bias", f"{a}q_proj.bias", (H * D,)),
            Tensor("k.bias", f"{a}k_proj.bias", (Hkv * D,)),
            Tensor("v.bias", f"{a}v_proj.bias", (Hkv * D,)),
        ]
    if bias:
        tensors.append(Tensor("o.bias", f"{a}o_proj.bias", (C,)))
    if family == "qwen3":
        tensors += [
            Tensor("q_norm.weight", f"{a}q_norm.weight", (D,)),
            Tensor("k_norm.weight", f"{a}k_norm.weight", (D,)),
        ]
    if family == "gpt_oss":
        tensors.append(Tensor("sinks", f"{a}sinks", (H,)))
    return tuple(tensors)


# Families whose transformers code rotates only partial_rotary_factor * head_dim dims. None of
# the llama-like ones does (their compute_default_rope_parameters uses the whole head_dim),
# so for them the factor is ignored, as transformers ignores it, and a note says so.
_PARTIAL_ROTARY: frozenset[str] = frozenset()


_ROPE_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")  # of a default rope


def _rope_mapping(config: Config) -> tuple[Any, str]:
    """The RoPE mapping and its key: ``rope_scaling`` where it is set, as transformers 5 takes
    it over ``rope_parameters`` (``convert_rope_params_to_dict``), else ``rope_parameters``."""
    if config.data.get("rope_scaling"):
        return config.data["rope_scaling"], "rope_scaling"
    if config.data.get("rope_parameters") is not None:
        return config.data["rope_parameters"], "rope_parameters"
    return config.data.get("rope_scaling"), "rope_scaling"


# GptOssConfig's rope_parameters when config.json has none (transformers 5.24)
_GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                 "truncate": False, "original_max_position_embeddings": 4096}  # fmt: skip
# What transformers' ROPE_INIT_FUNCTIONS read of each kind besides rope_theta, and from where:
# the rope mapping, or config.json's max_position_embeddings (core/rope_scaling.py's KINDS).
_SCALED_READS = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "attention_factor", "truncate"),
    "longrope": ("short_factor", "long_factor", "factor", "original_max_position_embeddings",
                 "attention_factor"),
}  # fmt: skip
_WITH_ORIGINAL = ("llama3", "yarn", "longrope")  # standardize_rope_params fills it in


def _scaling(
    config: Config, key: str, params: Mapping[str, Any], rope_type: Any
) -> tuple[tuple[str, Any], ...] | None:
    """The fixture's rope.scaling from the rope mapping, as transformers' rope init functions
    read it; any other key of the mapping is refused (a rope attn would silently not apply)."""
    reads = _SCALED_READS.get(rope_type, ()) if isinstance(rope_type, str) else ()
    if rope_type != "default" and not reads:
        raise config.error(
            key, f"rope_type {_shown(rope_type)} is not supported",
            "default, " + ", ".join(_SCALED_READS) + " (transformers' ROPE_INIT_FUNCTIONS)",
        )  # fmt: skip
    other = next((k for k in params if k not in (*_ROPE_KEYS, *reads)), None)
    if other is not None:  # mrope_section, ...: a rope attn would silently not apply
        kind = "a default rope" if rope_type == "default" else f"a {rope_type} rope"
        raise config.error(
            f"{key}.{field_name(other)}", f"got {_shown(params[other])} in {kind}",
            "only " + ", ".join((*_ROPE_KEYS[:3], "partial_rotary_factor", *reads)),
        )  # fmt: skip
    if rope_type == "default":
        return None
    found = {k: params[k] for k in reads if params.get(k) is not None}
    if rope_type in _WITH_ORIGINAL:
        found.setdefault("original_max_position_embeddings", config.whole(
            "max_position_embeddings"))  # fmt: skip
    if rope_type not in ("linear", "llama3"):  # dynamic's length; yarn's, longrope's factor
        found["max_position_embeddings"] = config.whole("max_position_embeddings")
    return (("type", rope_type), *found.items())


def _scaling_note(scaling: tuple[tuple[str, Any], ...] | None) -> str:
    if scaling is None:
        return ""
    kind = dict(scaling)["type"]
    return f"RoPE scaling {kind}, as transformers' {kind} rope init computes it"


def _rope(config: Config, family: str, head_dim: int) -> tuple[Rope, str]:
    """RoPE base and rotated dims from ``rope_parameters`` (transformers 5) or the legacy keys."""
    params, key = _rope_mapping(config)
    params = {} if params is None else params
    if not isinstance(params, Mapping) or any(isinstance(v, Mapping) for v in params.values()):
        raise config.error(key, f"got {_shown(params)}", "one mapping such as {rope_type: default}")
    if family == "gpt_oss" and key == "rope_scaling" and not params:
        params = _GPT_OSS_ROPE  # GptOssConfig's default when the config says nothing
    rope_type = params.get("rope_type", params.get("type", "default"))
    scaling = _scaling(config, key, params, rope_type)
    given = Config(params, config.source)
    base = (given if "rope_theta" in params else config).number(
        "rope_theta", _THETA.get(family, 10000.0)
    )
    factor = (given if "partial_rotary_factor" in params else config).number(
        "partial_rotary_factor", 1.0
    )
    if family not in _PARTIAL_ROTARY:  # check_keys notes (or refuses) the factor it ignores
        return Rope(base=base, dims=head_dim, scaling=scaling), _scaling_note(scaling)
    dims = int(head_dim * factor)
    if dims < 2 or dims % 2 or factor > 1:
        raise config.error(
            "partial_rotary_factor", f"{factor} gives {dims} rotated dims of {head_dim}",
            "a factor in (0, 1] giving an even number of dims",
        )  # fmt: skip
    note = f"partial rotary: {dims} of {head_dim} dims rotate"
    return Rope(base=base, dims=dims, scaling=scaling), note


_MAX_WINDOW = (1 << 63) - 1  # a fixture's window is an int64, as its positions are


def _window(config: Config, family: str, layer: int, layers: int) -> tuple[int | None, str]:
    """The sliding window of this layer (HF ``sliding_window``) and a note saying why."""
    if family == "llama":
        return None, ""
    defaults = {"mistral": 4096, "qwen2": 4096, "qwen3": 4096, "gemma2": 4096, "gpt_oss": 128}
    window = config.optional_whole("sliding_window", defaults[family])
    if family in ("qwen2", "qwen3") and not config.flag("use_sliding_window", False):
        return None, ""
    if window is None:
        return None, ""
    if family == "mistral":  # MistralModel masks every layer with sliding_window
        where = "on every layer (Mistral)"
    elif _layer_type(config, family, layer, layers) == "full_attention":
        return None, f"layer {layer} is a full-attention layer (layer_types)"
    else:
        where = f"on layer {layer} (layer_types: a sliding-window layer)"
    if window > _MAX_WINDOW:  # longer than any sequence: the window hides no key
        digits = len(str(window))
        shown = str(window) if digits <= 30 else f"of {digits:,} digits"
        return None, f"sliding window {shown} {where}: longer than any sequence, plain causal"
    return window, f"sliding window {window} {where}"


def _layer_type(config: Config, family: str, layer: int, layers: int) -> str:
    """``layer_types[layer]``, or the default of the family's config class (no list is built)."""
    types = config.data.get("layer_types")
    if types is None:
        if family in ("qwen2", "qwen3"):
            first = config.whole("max_window_layers", 28, minimum=0)
            return "sliding_attention" if layer >= first else "full_attention"
        return "sliding_attention" if (layer + 1) % 2 else "full_attention"  # even layers slide
    kinds = ("sliding_attention", "full_attention")
    if not isinstance(types, list) or len(types) != layers or any(t not in kinds for t in types):
        raise config.error(
            "layer_types", f"got {_shown(types)}",
            f"a list of {layers} entries, each 'sliding_attention' or 'full_attention'",
        )  # fmt: skip
    kind: str = types[layer]
    return kind


def _shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut short for a one-line error (a list may hold thousands of entries)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def prefix_of(names: list[str], plan: LayerPlan, source: str) -> str:
    """The prefix of the family's tensor names (``model.``, ``bert.``, ``transformer.``, none)."""
    pattern = re.compile(rf"(.*?){plan.anchor}")
    found = sorted({m.group(1) for n in names if (m := pattern.fullmatch(n))})
    if len(found) > 1:
        raise InputError(
            source, "", f"attention tensors under several prefixes ({', '.join(found)})",
            "one model per checkpoint",
        )  # fmt: skip
    return found[0] if found else ""


# ---------------------------------------------------------------------------------------------
# What a config.json may hold: an allowlist per family
#
# A key of config.json is accepted when the family's plan reads it (and checks its value), when
# it cannot change one attention layer's numbers (INERT), or when its value is the neutral one
# (a Rule). Any other key is refused unless it is null: attn does not guess what a key it does
# not know does to the attention. Built from transformers 5.24's configuration_*.py of each
# family (and of the families people mistake for them), and from the keys older versions wrote.


@dataclass(frozen=True)
class Rule:
    """A key accepted at its neutral values only; ``does`` says what any other value does."""

    neutral: tuple[Any, ...]
    does: str


@dataclass(frozen=True)
class Need:
    """Keys one of which a checkpoint read as the family must give (when ``when`` is true):
    the family's default for them turns something on that another model may not have."""

    keys: tuple[str, ...]
    when: str | None = None


@dataclass(frozen=True)
class Keys:
    """One family's config.json keys: read by its plan, inert for it, or neutral-only.

    ``ignored`` keys are ones transformers' class of the family leaves unused: with that
    model_type they are noted as ignored; read as the family (a model_type attn does not know),
    their model's own code may use them, so they must be neutral. Read so, the keys of ``needs``
    must be given, and those of ``assumed`` (an epsilon, a RoPE base) are noted when absent.
    """

    reads: frozenset[str]
    inert: frozenset[str] = frozenset()
    neutral: Mapping[str, Rule] = field(default_factory=dict)
    ignored: Mapping[str, Rule] = field(default_factory=dict)
    needs: tuple[Need, ...] = ()
    assumed: tuple[str, ...] = ()


# Keys that change no attention layer's numbers: bookkeeping, tokens, the MLP, the LM head.
INERT = frozenset({
    # PreTrainedConfig and what earlier versions of it saved
    "model_type", "_name_or_path", "name_or_path", "_commit_hash", "architectures", "auto_map",
    "custom_pipelines", "transformers_version", "torch_dtype", "dtype", "use_bfloat16",
    "id2label", "label2id", "num_labels", "problem_type", "finetuning_task", "tokenizer_class",
    "prefix", "task_specific_params", "return_dict", "use_return_dict", "output_attentions",
    "output_hidden_states", "torchscript", "xla_device", "chunk_size_feed_forward",
    "attn_implementation", "_attn_implementation", "_attn_implementation_autoset",
    "experts_implementation", "use_cache", "cache_implementation", "gradient_checkpointing",
    "initializer_range", "initializer_factor", "init_std", "vocab_size",
    "max_position_embeddings", "tie_word_embeddings", "tie_encoder_decoder",
    # token ids
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "cls_token_id",
    "mask_token_id", "unk_token_id", "decoder_start_token_id", "eod_token_id",
    # generation settings (GenerationConfig._get_default_generation_params)
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "encoder_repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "epsilon_cutoff", "eta_cutoff", "assistant_confidence_threshold",
    "assistant_lookbehind", "target_lookbehind", "num_assistant_tokens",
    "num_assistant_tokens_schedule",
    # the MLP (traced by no stage), mixture-of-experts routing, the LM head
    "hidden_act", "hidden_activation", "activation_function", "intermediate_size", "n_inner",
    "mlp_bias", "pretraining_tp", "num_local_experts", "num_experts", "num_experts_per_tok",
    "experts_per_token", "moe_intermediate_size", "shared_expert_intermediate_size",
    "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob", "output_router_logits",
    "router_aux_loss_coef", "router_jitter_noise", "swiglu_alpha", "swiglu_limit",
    "final_logit_softcapping", "logit_scale", "logits_scaling",
    # quantized attention tensors are refused by their dtype, or as tensors the layout lacks
    "quantization_config",
})  # fmt: skip
_DROPOUT = ("dropout", "_pdrop", "dropout_prob")  # key endings: dropout is off when tracing

_OFF = (None, False)
# Keys of other families that change the attention: accepted at their neutral value only.
NEUTRAL = {
    "pruned_heads": Rule((None, {}), "heads pruned from layers"),
    "is_decoder": Rule(_OFF, "a decoder (causal) layer"),
    "is_encoder_decoder": Rule(_OFF, "an encoder-decoder model"),
    "add_cross_attention": Rule(_OFF, "cross-attention layers"),
    "per_layer_config": Rule((None,), "settings that differ per layer"),
    "position_embedding_type": Rule((None,), "the kind of position embedding"),
    "use_qk_norm": Rule(_OFF, "a norm of each query and key (Cohere, Llama 4)"),
    "qk_layernorm": Rule(_OFF, "a LayerNorm of each query and key (Phi, StableLM)"),
    "clip_qkv": Rule((None,), "Q, K and V clamped to +-clip_qkv (OLMo)"),
    "attention_multiplier": Rule((None,), "the attention scale in place of 1/sqrt(head_dim) "
                                          "(Granite)"),
    "embedding_multiplier": Rule((None, 1, 1.0), "a factor on the embeddings (Granite)"),
    "attn_logit_softcapping": Rule((None,), "scores softcapped (Gemma 2)"),
    "query_pre_attn_scalar": Rule((None,), "the scale 1/sqrt(query_pre_attn_scalar) (Gemma)"),
    "use_bidirectional_attention": Rule(_OFF, "attention without the causal mask"),
    "sliding_window": Rule((None,), "a sliding window"),
    "use_sliding_window": Rule(_OFF, "a sliding window"),
    "max_window_layers": Rule((None,), "which layers slide (Qwen)"),
    "layer_types": Rule((None,), "attention that differs per layer"),
    "sliding_window_pattern": Rule((None,), "sliding and global layers alternating"),
    "_sliding_window_pattern": Rule((None,), "sliding and global layers alternating"),
    "rope_local_base_freq": Rule((None,), "a second RoPE base for sliding layers (Gemma 3)"),
    "no_rope_layers": Rule((None,), "layers without RoPE (SmolLM3, Llama 4)"),
    "no_rope_layer_interval": Rule((None,), "layers without RoPE (SmolLM3, Llama 4)"),
    "attention_chunk_size": Rule((None,), "chunked attention (Llama 4)"),
    "attn_temperature_tuning": Rule(_OFF, "queries scaled by position (Llama 4)"),
    "partial_rotary_factor": Rule((None, 1, 1.0), "RoPE on part of each head"),
    "rotary_pct": Rule((None, 1, 1.0), "RoPE on part of each head (GPT-NeoX)"),
    "rotary_dim": Rule((None,), "RoPE on part of each head (GPT-J)"),
    "rope_interleave": Rule(_OFF, "RoPE on interleaved pairs"),
    "rope_theta": Rule((None,), "rotary position embeddings"),
    "rope_scaling": Rule((None,), "rotary position embeddings"),
    "rope_parameters": Rule((None,), "rotary position embeddings"),
    "alibi": Rule(_OFF, "ALiBi position biases"),
    "use_mrope": Rule(_OFF, "multimodal RoPE (Qwen2-VL)"),
    "num_key_value_heads": Rule((None,), "grouped key/value heads"),
    "head_dim": Rule((None,), "a head size other than hidden / heads"),
    "attention_bias": Rule(_OFF, "biases on the projections"),
    "layer_norm_eps": Rule((None,), "LayerNorm where this family's norm is RMSNorm"),
    "layer_norm_epsilon": Rule((None,), "LayerNorm where this family's norm is RMSNorm"),
    "norm_epsilon": Rule((None,), "a LayerNorm (StarCoder 2)"),
    "rms_norm_eps": Rule((None,), "RMSNorm where this family's norm is LayerNorm"),
}  # fmt: skip

_ROTARY = frozenset({"rope_parameters", "rope_scaling", "rope_theta"})
_LLAMA_READS = _ROTARY | {
    "hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
    "head_dim", "rms_norm_eps",
}  # fmt: skip
_WINDOWED = frozenset({"sliding_window", "layer_types"})
_QWEN_NEEDS = (
    Need(("sliding_window",), when="use_sliding_window"),
    Need(("max_window_layers", "layer_types"), when="use_sliding_window"),
)
_LLAMA_ASSUMED = ("rms_norm_eps", "rope_theta")
_FULL_ROPE = Rule((None, 1, 1.0), "transformers' {family} rotates every dim of each head")
_NO_BIAS = Rule(_OFF, "transformers' {family} reads no attention_bias")

KEYS: dict[str, Keys] = {
    "bert": Keys(
        reads=frozenset({"hidden_size", "num_hidden_layers", "num_attention_heads",
                         "layer_norm_eps", "type_vocab_size", "is_decoder"}),
        inert=frozenset({"directionality", "pooler_fc_size", "pooler_num_attention_heads",
                         "pooler_num_fc_layers", "pooler_size_per_head", "pooler_type"}),
        neutral={"position_embedding_type": Rule((None, "absolute"), "relative positions")},
        ignored={"pad_token_id": Rule((None, 0), "transformers' bert starts positions at 0 "
                                              "(RoBERTa's at pad_token_id + 1)")},
        assumed=("layer_norm_eps",),
    ),
    "gpt2": Keys(
        reads=frozenset({"n_embd", "n_head", "n_layer", "n_positions", "layer_norm_epsilon",
                         "scale_attn_weights", "scale_attn_by_inverse_layer_idx"}),
        # n_ctx: unused since transformers 2; reorder_and_upcast_attn: the same product in float32
        inert=frozenset({"n_ctx", "summary_type", "summary_use_proj", "summary_activation",
                         "summary_proj_to_labels", "summary_first_dropout",
                         "reorder_and_upcast_attn"}),
        assumed=("layer_norm_epsilon",),
    ),
    "llama": Keys(
        reads=_LLAMA_READS | {"attention_bias"},
        ignored={"partial_rotary_factor": _FULL_ROPE,
                 "sliding_window": Rule((None,), "transformers' llama has no sliding window")},
        assumed=_LLAMA_ASSUMED,
    ),
    "mistral": Keys(
        reads=_LLAMA_READS | {"sliding_window"},
        ignored={"partial_rotary_factor": _FULL_ROPE, "attention_bias": _NO_BIAS,
                 "layer_types": Rule((None,), "transformers' mistral slides every layer")},
        needs=(Need(("sliding_window",)),), assumed=_LLAMA_ASSUMED,
    ),
    "qwen2": Keys(
        reads=_LLAMA_READS | _WINDOWED | {"use_sliding_window", "max_window_layers"},
        ignored={"partial_rotary_factor": _FULL_ROPE, "attention_bias": _NO_BIAS},
        needs=_QWEN_NEEDS, assumed=_LLAMA_ASSUMED,
    ),
    "qwen3": Keys(
        reads=_LLAMA_READS | _WINDOWED | {"use_sliding_window", "max_window_layers",
                                          "attention_bias"},
        ignored={"partial_rotary_factor": _FULL_ROPE},
        needs=(*_QWEN_NEEDS, Need(("head_dim",))), assumed=_LLAMA_ASSUMED,
    ),
    "gemma2": Keys(
        reads=_LLAMA_READS | _WINDOWED | {"attention_bias", "query_pre_attn_scalar",
                                          "attn_logit_softcapping", "use_bidirectional_attention"},
        inert=frozenset({"sliding_window_size"}),  # early configs; the model reads sliding_window
        ignored={"partial_rotary_factor": _FULL_ROPE},
        needs=tuple(Need((k,)) for k in ("head_dim", "query_pre_attn_scalar",
                                         "attn_logit_softcapping", "sliding_window",
                                         "layer_types")),
        assumed=_LLAMA_ASSUMED,
    ),
    "gpt_oss": Keys(
        reads=_LLAMA_READS | _WINDOWED | {"attention_bias"},
        inert=frozenset({"initial_context_length"}),  # the yarn rope's, which is refused
        ignored={"partial_rotary_factor": _FULL_ROPE},
        needs=tuple(Need((k,)) for k in ("head_dim", "attention_bias", "sliding_window",
                                         "layer_types")),
        assumed=_LLAMA_ASSUMED,
    ),
}  # fmt: skip

# Model types attn knows and does not import, with what their attention does that a family's
# plan would miss: --arch never reads one of them as a family.
KNOWN_TYPES = {
    "roberta": "position ids start at padding_idx + 1",
    "xlm-roberta": "position ids start at padding_idx + 1",
    "camembert": "position ids start at padding_idx + 1",
    "distilbert": "q_lin/k_lin/v_lin/out_lin tensors and no token types",
    "opt": "learned positions offset by 2",
    "gemma": "a Gemma layer: RMSNorm with 1 + weight, embeddings times sqrt(hidden)",
    "gemma3": "q/k RMSNorm and a second RoPE base for sliding layers",
    "gemma3_text": "q/k RMSNorm and a second RoPE base for sliding layers",
    "cohere": "LayerNorm, RoPE on interleaved pairs, an optional q/k norm",
    "cohere2": "RoPE on interleaved pairs on sliding layers and none on global ones, LayerNorm",
    "ernie4_5": "RoPE on interleaved pairs",
    "granite": "attention_multiplier as the scale, multipliers on embeddings and residuals",
    "granitemoe": "attention_multiplier as the scale, multipliers on embeddings and residuals",
    "qwen2_moe": "its own defaults and experts (attention as Qwen2's)",
    "qwen3_moe": "its own defaults and experts (attention as Qwen3's, with q/k norm)",
    "mixtral": "its own defaults and experts (attention as Mistral's, sliding_window default "
               "none)",
    "ministral": "sliding and global layers alternating (layer_types)",
    "smollm3": "no RoPE on every fourth layer (no_rope_layers)",
    "starcoder2": "LayerNorm with biases, biases on every projection, a sliding window",
    "olmo": "Q, K and V clamped (clip_qkv), LayerNorm without weights",
    "olmo2": "q/k RMSNorm over all heads together, norms after attention and not before",
    "olmo3": "q/k RMSNorm over all heads together, norms after attention, sliding layers",
    "phi": "RoPE on part of each head, LayerNorm, biases, an optional q/k LayerNorm",
    "phi3": "a fused qkv_proj (its longrope scaling is understood)",
    "gpt_neox": "a fused per-head query_key_value and RoPE on 25% of each head",
    "gptj": "RoPE on interleaved pairs of part of each head",
    "stablelm": "RoPE on part of each head, LayerNorm, an optional q/k LayerNorm",
    "exaone4": "no RoPE on global layers, q/k norm, norms after attention",
    "glm4": "RoPE on interleaved pairs of half of each head, q/k/v biases",
    "hunyuan_v1_dense": "q/k norm after RoPE, dynamic NTK scaling",
    "llama4_text": "chunked attention, layers without RoPE, q/k L2 norm, temperature tuning",
    "deepseek_v3": "multi-head latent attention",
    "falcon": "a fused query_key_value, multi-query heads, parallel attention, optional ALiBi",
    "bloom": "ALiBi position biases and a fused query_key_value",
    "mpt": "ALiBi position biases and a fused Wqkv",
}  # fmt: skip


def resolve_family(config: Config, arch: str | None) -> tuple[str, tuple[str, ...]]:
    """The family (config.json's model_type, or ``arch``) and a note of what ``arch`` overrode.

    ``arch`` reads a model_type attn does not know (a fine-tune's own name, or none) as that
    family, every key then checked against the family's allowlist; a model_type attn knows
    as another family, or as a model it does not import, is refused.
    """
    family = family_of(config, arch)
    model_type = config.data.get("model_type")
    if arch is None or model_type == family:
        return family, ()
    if isinstance(model_type, str) and (model_type in FAMILIES or model_type in KNOWN_TYPES):
        why = KNOWN_TYPES.get(model_type, f"attn imports it as {model_type}, with its own defaults")
        raise InputError(
            config.source, "model_type", f"{model_type!r} is not {family}: {why}",
            f"a {family} checkpoint, or one whose model_type attn does not know", option="arch",
        )  # fmt: skip
    _check_architectures(config, family)
    shown = "no model_type" if model_type is None else f"model_type {_shown(model_type)}"
    return family, (
        f"{shown} read as {family}, as asked: every config.json key is one {family} reads, "
        "one that cannot change the attention, or at its neutral value",
    )


def _normal(name: str) -> str:
    """A model type or class name without case, ``_`` and ``-``: ``xlm-roberta`` -> xlmroberta."""
    return re.sub(r"[_\-]", "", name).lower()


_KNOWN = {_normal(t): t for t in (*FAMILIES, *KNOWN_TYPES)}
_CLASS = re.compile(r"(.+?)(Model|LMHeadModel|PreTrainedModel|For[A-Z]\w*)")


def _check_architectures(config: Config, family: str) -> None:
    """``architectures`` names no class of a model type attn knows as other than ``family``."""
    classes = config.data.get("architectures")
    for name in classes if isinstance(classes, list) else []:
        match = _CLASS.fullmatch(name) if isinstance(name, str) else None
        known = _KNOWN.get(_normal(match.group(1))) if match else None
        if known is not None and known != family:
            why = KNOWN_TYPES.get(known, f"attn imports it as {known}")
            raise InputError(
                config.source, "architectures", f"names {name!r}, a {known} model: {why}",
                f"a {family} checkpoint", option="arch",
            )  # fmt: skip


def check_keys(config: Config, family: str) -> tuple[str, ...]:
    """Every config.json key is read by the family, inert, or neutral; notes of keys ignored.

    A key that is none of these is refused with its value and what attn expected: a key that
    changes the attention and is not understood is never ignored.
    """
    keys = KEYS[family]
    native = config.data.get("model_type") == family
    notes: list[str] = []
    for key, value in config.data.items():
        if key in keys.reads or key in keys.inert:
            continue
        ignored = keys.ignored.get(key)
        own = ignored or keys.neutral.get(key)  # the family's rule before the shared tables
        if own is None and (key in INERT or key.endswith(_DROPOUT)):
            continue
        rule = own or NEUTRAL.get(key) or _UNKNOWN
        if _is_neutral(value, rule):
            continue
        if ignored is not None and native:
            notes.append(f"{key} {_spelled(value)} ignored: {rule.does.format(family=family)}")
            continue
        raise _refusal(config, key, value, rule, family, ignored is not None)
    notes += _nested_partial_rotary(config, family, native)
    if not native:
        notes += _defaults_given(config, family)
    return tuple(notes)


def _defaults_given(config: Config, family: str) -> list[str]:
    """Read as ``family``, a checkpoint gives each key whose default turns something on (a
    window, a softcap, a scale); an epsilon or RoPE base left out is noted as assumed."""
    model_type = config.data.get("model_type")

    def given(key: str) -> bool:
        params = _rope_mapping(config)[0] if key == "rope_theta" else None
        return key in config.data or (isinstance(params, Mapping) and key in params)

    keys = KEYS[family]
    for need in keys.needs:
        if (need.when is None or config.data.get(need.when) is True) and not any(
            given(k) for k in need.keys
        ):
            raise InputError(
                config.source, need.keys[0], f"missing: model_type {_spelled(model_type)} is "
                f"not {family}, so {family}'s default cannot be assumed",
                "the key, as the model sets it", option="arch",
            )  # fmt: skip
    absent = [k for k in keys.assumed if not given(k)]
    return [f"{', '.join(absent)} absent: {family}'s default assumed"] if absent else []


_UNKNOWN = Rule((None,), "a key attn's {family} import does not know (it may change the attention)")


def _nested_partial_rotary(config: Config, family: str, native: bool) -> list[str]:
    """partial_rotary_factor inside the rope mapping, under the family's rule for the key."""
    params, key = _rope_mapping(config)
    if not isinstance(params, Mapping) or "partial_rotary_factor" not in params:
        return []
    value = params["partial_rotary_factor"]
    rule = KEYS[family].ignored.get("partial_rotary_factor") or NEUTRAL["partial_rotary_factor"]
    if _is_neutral(value, rule):
        return []
    name = f"{key}.partial_rotary_factor"
    ignored = "partial_rotary_factor" in KEYS[family].ignored
    if native and ignored:
        return [f"{name} {_spelled(value)} ignored: {rule.does.format(family=family)}"]
    raise _refusal(config, name, value, rule, family, ignored)


def _is_neutral(value: Any, rule: Rule) -> bool:
    """``value`` is one of the rule's neutral values (true is not 1, as JSON tells them apart)."""
    return any(
        type(value) is type(n) and value == n
        if isinstance(value, bool) or isinstance(n, bool)
        else value == n
        for n in rule.neutral
    )


def _refusal(
    config: Config, key: str, value: Any, rule: Rule, family: str, ignored: bool
) -> InputError:
    """One line naming the key, its value, what it does, and the values attn accepts."""
    does = rule.does.format(family=family)
    if ignored:  # a key the family's class leaves unused, in a checkpoint of another model type
        model_type = config.data.get("model_type")
        does += f", but model_type {_spelled(model_type)} is not {family} and may use it"
    elif rule is not _UNKNOWN:
        does += f", which attn's {family} import does not model"
    accepted = "absent or " + " or ".join(json.dumps(n) for n in rule.neutral)
    return config.error(field_name(key), f"got {_spelled(value)}: {does}", accepted)


def _spelled(value: Any, limit: int = 60) -> str:
    """``value`` as JSON spells it (true, null), cut short for a one-line message."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_tensors(names: list[str], prefix: str, plan: LayerPlan, source: str) -> None:
    """Every tensor of the layer's attention and pre-norm modules is one the plan reads.

    A q_norm, a bias or a scale the family's layout has no place for means another model:
    refused, never left out of the trace. A prefix naming another model type is refused too.
    """
    stem = _KNOWN.get(_normal(prefix.rstrip(".").rsplit(".", 1)[-1])) if prefix else None
    if stem is not None and stem != plan.family:
        raise InputError(
            source, "", f"tensors under {prefix!r}, a {stem} model",
            f"a {plan.family} checkpoint", option="arch",
        )  # fmt: skip
    read = {prefix + t.name for t in plan.tensors}
    block = prefix + plan.block
    unused = re.compile(plan.unused)
    for name in names:
        inside = name.startswith(block) and name[len(block) :].startswith(plan.scopes)
        if inside and name not in read and not unused.fullmatch(name[len(block) :]):
            raise InputError(
                source, name, f"a tensor of layer {plan.layer}'s attention that the "
                f"{plan.family} layout has no place for",
                "only " + ", ".join(sorted(n[len(block) :] for n in read if n.startswith(block))),
            )  # fmt: skip
