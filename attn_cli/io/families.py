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

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from attn_cli.errors import InputError

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
        raise InputError(
            source, key, f"model type {name!r} is not supported", "one of " + ", ".join(FAMILIES),
            option=option,
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
    )  # fmt: skip


# Defaults of the transformers config classes where they differ between llama-like families.
_HEAD_DIM = {"qwen3": 128, "gemma2": 256, "gpt_oss": 64}
_THETA = {"gpt_oss": 150000.0}
_EPS = {"gpt_oss": 1e-5}
_BIAS = {"gpt_oss": True}  # attention_bias default; qwen2's q/k/v always have biases


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
    bias = config.flag("attention_bias", _BIAS.get(family, False))
    tensors = _llama_tensors(family, f"layers.{layer}.", (C, H, Hkv, D), bias)
    eps = config.number("rms_norm_eps", _EPS.get(family, 1e-6))
    gemma = family == "gemma2"
    embed = (Tensor("embed.tokens", "embed_tokens.weight", (config.whole("vocab_size"), C)),)
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


def _rope(config: Config, family: str, head_dim: int) -> tuple[Rope, str]:
    """RoPE base and rotated dims from ``rope_parameters`` (transformers 5) or the legacy keys."""
    params = config.data.get("rope_parameters")
    key = "rope_parameters"
    if params is None:
        params, key = config.data.get("rope_scaling"), "rope_scaling"
    params = {} if params is None else params
    if not isinstance(params, Mapping) or any(isinstance(v, Mapping) for v in params.values()):
        raise config.error(key, f"got {params!r}", "one mapping such as {rope_type: default}")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if family == "gpt_oss" and key == "rope_scaling" and not params:
        rope_type = "yarn"  # GptOssConfig's default when the config says nothing
    if rope_type != "default":
        raise config.error(
            key, f"rope_type {rope_type!r} is not supported (a fixture's rope is base and dims)",
            "none or 'default'",
        )  # fmt: skip
    given = Config(params, config.source)
    base = (given if "rope_theta" in params else config).number(
        "rope_theta", _THETA.get(family, 10000.0)
    )
    factor = (given if "partial_rotary_factor" in params else config).number(
        "partial_rotary_factor", 1.0
    )
    if family not in _PARTIAL_ROTARY:
        note = "" if factor == 1 else (
            f"partial_rotary_factor {factor} ignored: transformers' {family} rotates all "
            f"{head_dim} dims of each head"
        )  # fmt: skip
        return Rope(base=base, dims=head_dim), note
    dims = int(head_dim * factor)
    if dims < 2 or dims % 2 or factor > 1:
        raise config.error(
            "partial_rotary_factor", f"{factor} gives {dims} rotated dims of {head_dim}",
            "a factor in (0, 1] giving an even number of dims",
        )  # fmt: skip
    return Rope(base=base, dims=dims), f"partial rotary: {dims} of {head_dim} dims rotate"


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
