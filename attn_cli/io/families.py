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
                ``query_pre_attn_scalar``), gpt_oss (``sinks``), qwen3_next (q_proj rows per
                head: the query's, then its output gate's; its linear_attention layers, Gated
                DeltaNet, into the fixture's ``gated_deltanet`` key: in_proj_qkvz and
                in_proj_ba split per key head as ``fix_query_key_value_ordering`` does).
    deepseek_v3 multi-head latent attention into the fixture's ``mla`` key: q LoRA (or q_proj),
                ``kv_a_proj_with_mqa`` split into the latent's and the RoPE key's rows,
                ``kv_b_proj`` per head into the key's and the value's; default RoPE or yarn.
    deepseek_v2 the same, each rotated RoPE pair kept in place (``mla.rope_layout: pairs``).
    wrappers    an image-text model whose text model is a family (gemma3: gemma3_text under
                ``text_config``, its layers under ``language_model.model.``): read as that family.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from attn_cli.errors import InputError, field_name

ROBERTA_LIKE = ("roberta", "xlm-roberta", "camembert")  # BERT with positions from pad + 1
FAMILIES = (
    "bert",
    *ROBERTA_LIKE,
    "distilbert",
    "gpt2",
    "llama",
    "mistral",
    "mixtral",
    "ministral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3_text",
    "gemma3",
    "gpt_oss",
    "granite",
    "smollm3",
    "starcoder2",
    "olmo",
    "olmo2",
    "olmo3",
    "exaone4",
    "phi3",
    "phi",
    "stablelm",
    "gpt_neox",
    "cohere",
    "cohere2",
    "ernie4_5",
    "glm4",
    "qwen3_next",
    "deepseek_v3",
    "deepseek_v2",
)

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
    weight: str | None  # role of the weight tensor (None: OLMo's LayerNorm has none)
    bias: str | None = None  # role of the bias tensor (LayerNorm)


@dataclass(frozen=True)
class Embedding:
    """How layer 0's input is made from token ids: tables, BERT's LayerNorm, Gemma's scale."""

    tokens: str
    positions: str | None = None
    types: str | None = None
    norm: Norm | None = None
    scale: float | None = None  # Gemma: sqrt(hidden), rounded to the table's dtype
    multiplier: float | None = None  # Granite's embedding_multiplier
    position_offset: int | None = None  # RoBERTa: positions start at pad_token_id + 1


@dataclass(frozen=True)
class Rope:
    """Rotary embedding of Q and K: base, rotated dims per head, HF ``rotate_half`` layout."""

    base: float
    dims: int
    layout: Literal["half", "interleaved"] = "half"
    # RoPE scaling as a fixture's rope.scaling: {type: llama3, factor: 8, ...}; None: none
    scaling: tuple[tuple[str, Any], ...] | None = None


@dataclass(frozen=True)
class Latent:
    """Multi-head latent attention's sizes (DeepSeek V3): the fixture's mla key."""

    rank: int  # kv_lora_rank: the latent's width
    q_rank: int | None  # q_lora_rank (None: one q_proj)
    nope: int  # qk_nope_head_dim
    rope: int  # qk_rope_head_dim
    v: int  # v_head_dim
    base: float  # the RoPE base of the rope dims
    eps: float = 1e-6  # q_a_layernorm's and kv_a_layernorm's (DeepseekV3RMSNorm's default)
    # yarn of the rope dims as the fixture's mla.scaling (DeepSeek V3's own); None: plain RoPE
    scaling: tuple[tuple[str, Any], ...] | None = None
    mscale: float = 1.0  # yarn_apply_mscale's: the softmax scale times mscale²
    pairs: bool = False  # each rotated RoPE pair in place (deepseek_v2), not split (deepseek_v3)


@dataclass(frozen=True)
class DeltaNet:
    """Gated DeltaNet's sizes (Qwen3-Next's linear_attention layers): the fixture's
    gated_deltanet key."""

    k_heads: int  # linear_num_key_heads
    v_heads: int  # linear_num_value_heads (a multiple of k_heads)
    d_k: int  # linear_key_head_dim
    d_v: int  # linear_value_head_dim
    kernel: int  # linear_conv_kernel_dim
    eps: float  # rms_norm_eps: the gated RMSNorm's


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
    layout: Literal["linear", "conv1d", "qkv_rows", "qkv_heads"]
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
    qk_norm_kind: Literal["rms", "rms1p"] = "rms"  # Gemma 3's q/k norms scale by 1 + weight
    sinks: bool = False
    gate: bool = False  # q_proj's rows per head: head_dim query rows, then head_dim gate rows
    latent: Latent | None = None  # multi-head latent attention (the fixture's mla key)
    delta: DeltaNet | None = None  # Gated DeltaNet (the fixture's gated_deltanet key)
    notes: tuple[str, ...] = ()
    block: str = ""  # the layer's own prefix (``layers.3.``): its modules below are checked
    # where the layers may be (a wrapper's text model: the first is what transformers saves);
    # none: any prefix
    prefixes: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()  # modules of the block whose every tensor the plan reads
    unused: str = "$^"  # a regex (after ``block``) of tensors there the model never uses


# Counts that a list or a loop is built over before the checkpoint's tensors are checked
# against them (the experts' tensor names, the router's groups): bounded where they are read,
# as a config claiming 2**63 experts built a list of their names until memory ran out.
MOST: dict[str, int] = dict.fromkeys(
    (
        "num_local_experts",
        "num_experts",
        "n_routed_experts",
        "num_experts_per_tok",
        "n_group",
        "topk_group",
        "n_shared_experts",
    ),
    1 << 16,
)


class Config:
    """config.json as read: typed getters whose errors name the file and the key.

    ``path`` is where the mapping sits in config.json (``text_config.``), prefixed to each key
    an error names."""

    def __init__(self, data: Mapping[str, Any], source: str, path: str = "") -> None:
        self.data = data
        self.source = source
        self.path = path

    def error(self, key: str, what: str, expected: str) -> InputError:
        return InputError(self.source, self.path + key, what, expected)

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def whole(self, key: str, default: Any = _REQUIRED, minimum: int = 1) -> int:
        value = self.data.get(key)
        if value is None:
            if default is _REQUIRED:
                raise self.error(key, "missing", f"a whole number >= {minimum}")
            return int(default)
        most = MOST.get(key)
        if type(value) is not int or value < minimum or (most is not None and value > most):
            expected = f"a whole number >= {minimum}"
            if most is not None:
                expected = f"a whole number from {minimum} to {most:,} ({key} of a model)"
            raise self.error(key, f"got {_shown(value)}", expected)
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

    def mapping(self, key: str) -> Mapping[str, Any] | None:
        """The mapping at ``key`` (rope_parameters, rope_scaling, ...), None where config.json
        says nothing or null; any other type is one line naming the key."""
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise self.error(key, f"got {_shown(value)}", "a mapping {name: value, ...}")
        return value

    def text(self, key: str, default: str) -> str:
        """The string at ``key`` (an activation, a method's name), ``default`` where
        config.json says nothing or null; any other type is one line naming the key."""
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(key, f"got {_shown(value)}", "a string")
        return value

    def optional_whole(self, key: str, default: int, minimum: int = 1) -> int | None:
        """The whole number, or None where config.json says null."""
        if key in self.data and self.data[key] is None:
            return None
        return self.whole(key, default, minimum)


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
            source,
            key,
            f"model type {name!r} is not supported{why}",
            "one of " + ", ".join(FAMILIES),
            option=option,
        )
    return name


def plan_layer(config: Config, family: str, layer: int) -> LayerPlan:
    """The plan of layer ``layer`` of a checkpoint of ``family`` described by ``config``."""
    wrapper = WRAPPERS.get(family)
    if wrapper is not None:  # the text model's layer, found only under the wrapper's prefixes
        plan = plan_layer(text_config(config, family), wrapper.text, layer)
        return replace(plan, family=family, prefixes=wrapper.prefixes)
    if family == "bert" or family in ROBERTA_LIKE:
        return _bert(config, layer, family)
    if family == "distilbert":
        return _distilbert(config, layer)
    if family == "gpt2":
        return _gpt2(config, layer)
    if family in ("deepseek_v3", "deepseek_v2"):
        return _deepseek(config, layer, family)
    return _llama_like(config, family, layer)


def _check_layer(config: Config, key: str, layer: int, default: Any = _REQUIRED) -> int:
    layers = config.whole(key, default)
    if not 0 <= layer < layers:
        raise config.error(
            key,
            f"the model has {layers} layers, layer {layer} is out of range",
            f"a layer between 0 and {layers - 1}",
        )
    return layers


def _heads(config: Config, hidden: int, heads_key: str) -> int:
    heads = config.whole(heads_key)
    if hidden % heads:
        raise config.error(
            heads_key, f"{heads} does not divide the hidden size {hidden}", "a divisor"
        )
    return heads


def _bert(config: Config, layer: int, family: str = "bert") -> LayerPlan:
    """BERT: nn.Linear query/key/value/attention.output.dense, post-norm, learned positions
    (RoBERTa, XLM-R, CamemBERT: the same layer, positions counted from pad_token_id + 1)."""
    kind = config.text("position_embedding_type", "absolute")
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
            ("q.weight", "self.query.weight", (C, C)),
            ("q.bias", "self.query.bias", (C,)),
            ("k.weight", "self.key.weight", (C, C)),
            ("k.bias", "self.key.bias", (C,)),
            ("v.weight", "self.value.weight", (C, C)),
            ("v.bias", "self.value.bias", (C,)),
            ("o.weight", "output.dense.weight", (C, C)),
            ("o.bias", "output.dense.bias", (C,)),
        )
    )
    positions = config.whole("max_position_embeddings", 512)
    embed = (
        Tensor(
            "embed.tokens", "embeddings.word_embeddings.weight", (config.whole("vocab_size"), C)
        ),
        Tensor("embed.positions", "embeddings.position_embeddings.weight", (positions, C)),
        Tensor(
            "embed.types",
            "embeddings.token_type_embeddings.weight",
            (config.whole("type_vocab_size", 2), C),
        ),
        Tensor("embed.norm.weight", "embeddings.LayerNorm.weight", (C,)),
        Tensor("embed.norm.bias", "embeddings.LayerNorm.bias", (C,)),
    )
    return LayerPlan(
        layer=layer,
        layers=layers,
        hidden=C,
        heads=H,
        kv_heads=H,
        head_dim=C // H,
        layout="linear",
        anchor=r"encoder\.layer\.\d+\.attention\.self\.query\.weight",
        tensors=tensors,
        embed_tensors=embed,
        pre_norm=None,
        embedding=Embedding(
            "embed.tokens",
            "embed.positions",
            "embed.types",
            Norm("layer", eps, "embed.norm.weight", "embed.norm.bias"),
            position_offset=config.whole("pad_token_id", 1, minimum=0)
            if family in ROBERTA_LIKE
            else None,
        ),
        causal=False,
        scale=(C // H) ** -0.5,
        family=family,
        block=f"encoder.layer.{layer}.",
        scopes=("attention.",),
        unused=r"attention\.output\.LayerNorm\.(weight|bias)",  # after the residual add
    )


def _distilbert(config: Config, layer: int) -> LayerPlan:
    """DistilBERT: q_lin/k_lin/v_lin/out_lin, post-norm, learned positions, no token types."""
    if config.flag("sinusoidal_pos_embds", False):
        raise config.error(
            "sinusoidal_pos_embds", "is not supported", "false (a learned position table)"
        )
    layers = _check_layer(config, "n_layers", layer)
    C = config.whole("dim")
    H = _heads(config, C, "n_heads")
    p = f"transformer.layer.{layer}.attention."
    tensors = tuple(
        Tensor(f"{x}.{part}", f"{p}{name}.{part}", (C, C) if part == "weight" else (C,))
        for x, name in (("q", "q_lin"), ("k", "k_lin"), ("v", "v_lin"), ("o", "out_lin"))
        for part in ("weight", "bias")
    )
    embed = (
        Tensor(
            "embed.tokens", "embeddings.word_embeddings.weight", (config.whole("vocab_size"), C)
        ),
        Tensor(
            "embed.positions",
            "embeddings.position_embeddings.weight",
            (config.whole("max_position_embeddings", 512), C),
        ),
        Tensor("embed.norm.weight", "embeddings.LayerNorm.weight", (C,)),
        Tensor("embed.norm.bias", "embeddings.LayerNorm.bias", (C,)),
    )
    return LayerPlan(
        family="distilbert",
        layer=layer,
        layers=layers,
        hidden=C,
        heads=H,
        kv_heads=H,
        head_dim=C // H,
        layout="linear",
        anchor=r"transformer\.layer\.\d+\.attention\.q_lin\.weight",
        tensors=tensors,
        embed_tensors=embed,
        pre_norm=None,
        embedding=Embedding(
            "embed.tokens",
            "embed.positions",
            norm=Norm("layer", 1e-12, "embed.norm.weight", "embed.norm.bias"),
        ),
        causal=False,
        scale=(C // H) ** -0.5,
        block=f"transformer.layer.{layer}.",
        scopes=("attention.",),
    )


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
        family="gpt2",
        layer=layer,
        layers=layers,
        hidden=C,
        heads=H,
        kv_heads=H,
        head_dim=D,
        layout="conv1d",
        anchor=r"h\.\d+\.attn\.c_attn\.weight",
        tensors=tensors,
        embed_tensors=embed,
        pre_norm=Norm("layer", eps, "norm.weight", "norm.bias"),
        embedding=Embedding("embed.tokens", "embed.positions"),
        causal=True,
        scale=scale,
        notes=tuple(notes),
        block=p,
        scopes=("attn.", "ln_1."),
        unused=r"attn\.(bias|masked_bias)",  # mask buffers
    )


def _deepseek(config: Config, layer: int, family: str = "deepseek_v3") -> LayerPlan:
    """DeepSeek V3's multi-head latent attention (DeepseekV3Attention), read into the fixture's
    mla key: q_a_proj, q_a_layernorm, q_b_proj (or q_proj), kv_a_proj_with_mqa (the latent's
    rows, then the shared RoPE key's), kv_a_layernorm, kv_b_proj (per head: the key's rows,
    then the value's), o_proj; input_layernorm RMSNorm before; interleaved RoPE on the rope
    dims only; scale 1/sqrt(qk_nope_head_dim + qk_rope_head_dim). DeepSeek V2
    (DeepseekV2Attention) is the same layer with the same tensor names, its RoPE by
    view_as_complex (each rotated pair in place: mla.rope_layout pairs) and 2,048 as its
    max_position_embeddings default."""
    layers = _check_layer(config, "num_hidden_layers", layer)
    C = config.whole("hidden_size")
    H = config.whole("num_attention_heads")
    if config.whole("num_key_value_heads", H) != H:  # the latent gives every head its K and V
        raise config.error(
            "num_key_value_heads",
            f"got {config.data['num_key_value_heads']}: transformers' "
            f"{family} expands the latent to every head, and repeats those by "
            "heads / num_key_value_heads",
            f"{H} (num_attention_heads)",
        )
    rank = config.whole("kv_lora_rank")
    q_rank = config.optional_whole("q_lora_rank", 1536)
    nope = config.whole("qk_nope_head_dim")
    rope_dims = config.whole("qk_rope_head_dim", minimum=2)
    if rope_dims % 2:
        raise config.error(
            "qk_rope_head_dim", f"got {rope_dims}: RoPE rotates pairs", "an even number >= 2"
        )
    v = config.whole("v_head_dim")
    D = nope + rope_dims
    _deepseek_checks(config, rope_dims, D, family)
    base, scaling, mscale = _deepseek_rope(config, 2048 if family == "deepseek_v2" else 4096)
    eps = config.number("rms_norm_eps", 1e-6)
    p = f"layers.{layer}."
    tensors = _deepseek_tensors(p, C, H, (rank, q_rank, nope, rope_dims, v))
    embed = (Tensor("embed.tokens", "embed_tokens.weight", (config.whole("vocab_size"), C)),)
    notes = (
        "kv_a_proj_with_mqa rows split into mla.W_DKV (the first kv_lora_rank) and mla.W_KR "
        "(the last qk_rope_head_dim); kv_b_proj rows per head [key | value] split into mla.W_UK "
        "and mla.W_UV; every Linear transposed",
        "Q and K are [nope | rope] per head, the rope dims in transformers' de-interleaved "
        "layout (its query_states and key_states)"
        if family == "deepseek_v3"
        else "Q and K are [nope | rope] per head, each rotated rope pair in place as deepseek_v2's "
        "view_as_complex leaves it (its query_states and key_states; mla.rope_layout pairs)",
    )
    return LayerPlan(
        family=family,
        layer=layer,
        layers=layers,
        hidden=C,
        heads=H,
        kv_heads=H,
        head_dim=D,
        layout="linear",
        anchor=r"layers\.\d+\.self_attn\.kv_a_proj_with_mqa\.weight",
        tensors=tensors,
        embed_tensors=embed,
        pre_norm=Norm("rms", eps, "norm.weight"),
        embedding=Embedding("embed.tokens"),
        causal=True,
        scale=float(D**-0.5) * mscale * mscale,
        latent=Latent(
            rank,
            q_rank,
            nope,
            rope_dims,
            v,
            base,
            scaling=scaling,
            mscale=mscale,
            pairs=family == "deepseek_v2",
        ),
        notes=(*notes, *filter(None, [_scaling_note(scaling)])),
        block=p,
        scopes=("self_attn.", "input_layernorm."),
        unused=r"self_attn\.rotary_emb\.inv_freq",
    )


def _deepseek_checks(config: Config, rope_dims: int, D: int, family: str) -> None:
    """Keys DeepseekV3Config (DeepseekV2Config) sets itself, and what the mla key has no place
    for: refused."""
    cls = "DeepseekV2Config" if family == "deepseek_v2" else "DeepseekV3Config"
    for key, want in (("head_dim", rope_dims), ("qk_head_dim", D)):
        if config.has(key) and config.whole(key) != want:  # the config class sets both itself
            raise config.error(
                key,
                f"got {config.data[key]}: {cls} sets it from the other sizes",
                f"{want} (or absent)",
            )
    if config.flag("attention_bias", False):
        raise config.error(
            "attention_bias",
            "got true: biases on q_a_proj, kv_a_proj_with_mqa and o_proj, "
            "which the mla key has no place for",
            "absent or false",
        )
    if family == "deepseek_v3" and not config.flag("rope_interleave", True):
        raise config.error(
            "rope_interleave",
            "got false: RoPE by rotate_half on the rope dims, where the mla "
            "key rotates interleaved pairs (transformers' deepseek_v3 default)",
            "absent or true",
        )


def _deepseek_tensors(
    p: str, C: int, H: int, sizes: tuple[int, int | None, int, int, int]
) -> tuple[Tensor, ...]:
    """DeepseekV3Attention's Linear weights and norms of one layer, and its input_layernorm."""
    rank, q_rank, nope, rope_dims, v = sizes
    a, D = f"{p}self_attn.", nope + rope_dims
    if q_rank is None:
        query = [Tensor("q.weight", f"{a}q_proj.weight", (H * D, C))]
    else:
        query = [
            Tensor("q_a.weight", f"{a}q_a_proj.weight", (q_rank, C)),
            Tensor("q_a_norm.weight", f"{a}q_a_layernorm.weight", (q_rank,)),
            Tensor("q_b.weight", f"{a}q_b_proj.weight", (H * D, q_rank)),
        ]
    return (
        *query,
        Tensor("kv_a.weight", f"{a}kv_a_proj_with_mqa.weight", (rank + rope_dims, C)),
        Tensor("kv_a_norm.weight", f"{a}kv_a_layernorm.weight", (rank,)),
        Tensor("kv_b.weight", f"{a}kv_b_proj.weight", (H * (nope + v), rank)),
        Tensor("o.weight", f"{a}o_proj.weight", (C, H * v)),
        Tensor("norm.weight", f"{p}input_layernorm.weight", (C,)),
    )


def _deepseek_rope(
    config: Config, default_longest: int = 4096
) -> tuple[float, tuple[tuple[str, Any], ...] | None, float]:
    """The RoPE base of DeepSeek V3's rope dims, its yarn (DeepSeek V3's own: the fixture's
    mla.scaling, over qk_rope_head_dim dims as DeepseekV3Config's head_dim says) and the
    softmax scale's mscale (transformers' yarn_apply_mscale: yarn_get_mscale(factor,
    mscale_all_dim) where mscale_all_dim is set, else 1). The other scalings are refused:
    DeepSeek ships yarn, and no checkpoint checks the others here."""
    params, key = _rope_mapping(config)
    params = {} if params is None else params
    if not isinstance(params, Mapping):
        raise config.error(key, f"got {_shown(params)}", "one mapping such as {rope_type: default}")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "yarn"):
        raise config.error(
            key,
            f"rope_type {_shown(rope_type)}: the mla key's RoPE scales by yarn only "
            "(DeepSeek V3's)",
            "default or yarn",
        )
    reads = _SCALED_READS["yarn"] if rope_type == "yarn" else ()
    other = next((k for k in params if k not in ("rope_type", "type", "rope_theta", *reads)), None)
    if other is not None:
        raise config.error(
            f"{key}.{field_name(other)}",
            f"got {_shown(params[other])} in a {rope_type} rope",
            "only " + ", ".join(("rope_type", "rope_theta", *reads)),
        )
    given = Config(params, config.source, f"{key}.")
    base = (given if "rope_theta" in params else config).number("rope_theta", 10000.0)
    if rope_type == "default":
        return base, None, 1.0
    found: dict[str, Any] = {k: params[k] for k in reads if params.get(k) is not None}
    original = "original_max_position_embeddings"
    longest = config.whole("max_position_embeddings", default_longest)  # the config class's
    if config.has(original):  # standardize_rope_params: the top-level value wins
        found[original] = config.whole(original)
    found.setdefault(original, longest)
    found["max_position_embeddings"] = longest
    factor: Any = found.get("factor")
    all_dim: Any = found.get("mscale_all_dim")
    if factor is None and type(found[original]) is int and found[original] > 0:
        factor = longest / found[original]
    mscale = 1.0  # a value of the wrong kind: the fixture's mla.scaling says so in one line
    if _finite(factor) and _finite(all_dim) and all_dim and factor > 1:
        mscale = 0.1 * all_dim * math.log(factor) + 1.0  # yarn_get_mscale(factor, all_dim)
    return base, (("type", "yarn"), *found.items()), mscale


def _finite(x: Any) -> bool:
    return type(x) in (int, float) and math.isfinite(x)


# ---------------------------------------------------------------------------------------------
# Decoders with q/k/v/o projections: where each family's transformers 5.24 code differs from
# Llama's (its configuration_*.py defaults and modeling_*.py attention)

WindowRule = Literal["none", "all", "types", "qwen", "qwen2_moe", "smollm3", "ministral"]
QKNorm = Literal["", "rms", "rms1p"]


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
    qkv_bias: str | bool = "attention_bias"  # the key turning q/k/v biases on, or always / never
    o_bias: str | bool = "attention_bias"  # the same for the output projection
    bias_default: bool = False  # the default of those keys
    qk_norm: QKNorm = ""  # an RMSNorm of q and k before RoPE (per head, or OLMo's whole)
    qk_whole: bool = False  # over the whole projection (OLMo 2 and 3), not each head
    layout: Literal["half", "interleaved"] = "half"  # rotate_half, or pairs (2i, 2i+1)
    partial: float | None = None  # partial_rotary_factor's default, where the family reads it
    window: WindowRule = "none"  # which layers slide (see _window)
    window_default: int | None = 4096
    pattern: int = 2  # the default layer_types: sliding iff (layer + 1) % pattern
    nope: Literal["", "full", "smollm3"] = ""  # layers without RoPE
    by_type: tuple[float, float] | None = None  # RoPE per layer type: sliding, full theta
    scale: Literal["head_dim", "query_pre_attn_scalar", "attention_multiplier"] = "head_dim"
    embed: Literal["", "sqrt", "multiplier"] = ""  # Gemma's sqrt(hidden), Granite's multiplier
    softcap: bool = False
    sinks: bool = False
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


_MISTRAL = Arch(qkv_bias=False, o_bias=False, window="all")
_GEMMA = Arch(head_dim=256, norm="rms1p", embed="sqrt")
_LN = Arch(norm="layer", norm_bias=True)  # a LayerNorm with weight and bias
ARCHS: dict[str, Arch] = {
    "llama": Arch(),
    "mistral": _MISTRAL,
    "mixtral": replace(_MISTRAL, theta=1e6, eps=("rms_norm_eps", 1e-5), window_default=None),
    "ministral": replace(_MISTRAL, window="ministral"),
    "qwen2": Arch(qkv_bias=True, o_bias=False, window="qwen"),
    "qwen2_moe": Arch(qkv_bias="qkv_bias", o_bias=False, bias_default=True, window="qwen2_moe"),
    "qwen3": Arch(head_dim=128, qk_norm="rms", window="qwen"),
    "qwen3_moe": Arch(qk_norm="rms", window="all"),
    "gemma": _GEMMA,
    "gemma2": replace(_GEMMA, scale="query_pre_attn_scalar", softcap=True, window="types"),
    "gemma3_text": replace(
        _GEMMA,
        scale="query_pre_attn_scalar",
        qk_norm="rms1p",
        window="types",
        pattern=6,
        by_type=(1e4, 1e6),
        sizes=(
            ("vocab_size", 262_208),
            ("hidden_size", 2304),
            ("num_hidden_layers", 26),
            ("num_attention_heads", 8),
            ("num_key_value_heads", 4),
            ("max_position_embeddings", 131_072),
        ),
    ),
    "gpt_oss": Arch(
        head_dim=64,
        theta=150000.0,
        eps=("rms_norm_eps", 1e-5),
        bias_default=True,
        window="types",
        window_default=128,
        sinks=True,
    ),
    "granite": Arch(scale="attention_multiplier", embed="multiplier"),
    "smollm3": Arch(theta=2e6, window="smollm3", window_default=None, nope="smollm3"),
    "starcoder2": replace(
        _LN,
        eps=("norm_epsilon", 1e-5),
        qkv_bias="use_bias",
        o_bias="use_bias",
        bias_default=True,
        window="all",
        window_default=None,
    ),
    "olmo": Arch(eps=(None, 1e-5), norm="layer", norm_weight=False),
    "olmo2": Arch(eps=("rms_norm_eps", 1e-5), norm=None, qk_norm="rms", qk_whole=True),
    "olmo3": Arch(
        theta=5e5,
        eps=("rms_norm_eps", 1e-5),
        norm=None,
        qk_norm="rms",
        qk_whole=True,
        window="types",
        pattern=4,
        by_type=(5e5, 5e5),
    ),
    "exaone4": Arch(
        eps=("rms_norm_eps", 1e-5),
        norm=None,
        qkv_bias=False,
        o_bias=False,
        qk_norm="rms",
        window="types",
        pattern=4,
        nope="full",
    ),
    "phi3": Arch(
        eps=("rms_norm_eps", 1e-5),
        qkv_bias=False,
        o_bias=False,
        partial=1.0,
        window="all",
        window_default=None,
        fused="rows",
    ),
    "phi": replace(
        _LN, eps=("layer_norm_eps", 1e-5), qkv_bias=True, o_bias=True, partial=0.5, o_name="dense"
    ),
    "stablelm": replace(
        _LN,
        eps=("layer_norm_eps", 1e-5),
        qkv_bias="use_qkv_bias",
        o_bias=False,
        partial=0.25,
        reads_head_dim=False,
    ),
    "gpt_neox": replace(
        _LN,
        eps=("layer_norm_eps", 1e-5),
        bias_default=True,
        partial=0.25,
        fused="heads",
        attn="attention",
        qkv_name="query_key_value",
        o_name="dense",
        embed_name="embed_in",
        reads_head_dim=False,
    ),
    "cohere": Arch(theta=5e5, eps=("layer_norm_eps", 1e-5), norm="layer", layout="interleaved"),
    "cohere2": Arch(
        eps=("layer_norm_eps", 1e-5),
        norm="layer",
        layout="interleaved",
        window="types",
        pattern=4,
        nope="full",
        reads_head_dim=False,
    ),
    "ernie4_5": Arch(
        head_dim=128,
        theta=5e5,
        eps=("rms_norm_eps", 1e-5),
        qkv_bias="use_bias",
        o_bias="use_bias",
        layout="interleaved",
    ),
    "glm4": Arch(
        head_dim=128,
        eps=("rms_norm_eps", 1.5625e-7),
        o_bias=False,
        bias_default=True,
        layout="interleaved",
        partial=0.5,
    ),
    "qwen3_next": Arch(
        head_dim=256, norm="rms1p", qk_norm="rms1p", partial=0.25, gate=True, linear=4
    ),
}


def _llama_like(config: Config, family: str, layer: int) -> LayerPlan:
    """A decoder with q/k/v/o projections (or a fused qkv), GQA, a norm, RoPE: ARCHS[family]."""
    arch = ARCHS[family]
    layers = _check_layer(config, "num_hidden_layers", layer, _size(arch, "num_hidden_layers"))
    if arch.embed == "sqrt" and config.flag("use_bidirectional_attention", False):
        raise config.error("use_bidirectional_attention", "is not supported", "false (causal)")
    C = config.whole("hidden_size", _size(arch, "hidden_size"))
    H = config.whole("num_attention_heads", _size(arch, "num_attention_heads"))
    Hkv = config.whole("num_key_value_heads", _size(arch, "num_key_value_heads", H))
    if H % Hkv:
        raise config.error("num_key_value_heads", f"{Hkv} does not divide {H} heads", "a divisor")
    D = _head_dim(config, family, arch, C)
    key, eps_default = arch.eps
    eps = eps_default if key is None else config.number(key, eps_default)
    p = f"layers.{layer}."
    tensors = _llama_tensors(config, arch, p, (C, H, Hkv, D))
    vocab = config.whole("vocab_size", _size(arch, "vocab_size"))
    embed = (Tensor("embed.tokens", f"{arch.embed_name}.weight", (vocab, C)),)
    kind = _layer_type(config, family, layer, layers)  # the whole list checked, used or not
    embedding = Embedding(
        "embed.tokens",
        scale=math.sqrt(C) if arch.embed == "sqrt" else None,
        multiplier=_multiplier(config, arch),
    )
    if kind == "linear_attention":
        return _gated_deltanet(config, family, (layer, layers, C), eps, (embed, embedding))
    window, window_note = _window(config, family, layer, layers)
    rope, rope_note = _rope(config, family, D, layer, kind)
    notes = [n for n in (window_note, rope_note) if n]
    notes += _arch_notes(family, arch)
    norm_roles = (
        "norm.weight" if arch.norm_weight else None,
        "norm.bias" if arch.norm_bias else None,
    )
    return LayerPlan(
        family=family,
        layer=layer,
        layers=layers,
        hidden=C,
        heads=H,
        kv_heads=Hkv,
        head_dim=D,
        layout=_LAYOUTS[arch.fused],
        anchor=rf"layers\.\d+\.{arch.attn}\.{arch.qkv_name if arch.fused else 'q_proj'}\.weight",
        tensors=tensors,
        embed_tensors=embed,
        pre_norm=None if arch.norm is None else Norm(arch.norm, eps, *norm_roles),
        embedding=embedding,
        causal=True,
        scale=_scale(config, arch, D),
        rope=rope,
        window=window,
        softcap=config.optional_number("attn_logit_softcapping", 50.0) if arch.softcap else None,
        qk_norm_eps=eps if arch.qk_norm else None,
        qk_norm_kind=arch.qk_norm or "rms",
        sinks=arch.sinks,
        gate=arch.gate,
        notes=tuple(notes),
        block=p,
        scopes=(f"{arch.attn}.", "input_layernorm."),
        unused=rf"{arch.attn}\.(rotary_emb\.inv_freq|masked_bias|bias)",  # buffers once saved
    )


def _size(arch: Arch, key: str, default: Any = _REQUIRED) -> Any:
    """The family's default of a size config.json leaves out, else ``default``."""
    return dict(arch.sizes).get(key, default)


_LAYOUTS: dict[str, Literal["linear", "qkv_rows", "qkv_heads"]] = {
    "": "linear",
    "rows": "qkv_rows",
    "heads": "qkv_heads",
}


def _head_dim(config: Config, family: str, arch: Arch, hidden: int) -> int:
    """config.json's head_dim, else the config class's default, else hidden / heads."""
    if not arch.reads_head_dim:  # the family's code computes hidden / heads whatever is given
        return hidden // _heads(config, hidden, "num_attention_heads")
    given = config.data.get("head_dim", arch.head_dim)
    if given is None:
        return hidden // _heads(config, hidden, "num_attention_heads")
    return config.whole("head_dim", given)


def _scale(config: Config, arch: Arch, head_dim: int) -> float:
    if arch.scale == "query_pre_attn_scalar":
        return float(config.number("query_pre_attn_scalar", 256.0) ** -0.5)
    if arch.scale == "attention_multiplier":
        return config.number("attention_multiplier", 1.0)
    return float(head_dim**-0.5)


def _multiplier(config: Config, arch: Arch) -> float | None:
    """Granite's embedding_multiplier (transformers multiplies the embeddings by it)."""
    return config.number("embedding_multiplier", 1.0) if arch.embed == "multiplier" else None


def _bias(config: Config, arch: Arch, which: str | bool) -> bool:
    return which if isinstance(which, bool) else config.flag(which, arch.bias_default)


def _llama_tensors(
    config: Config, arch: Arch, p: str, sizes: tuple[int, int, int, int]
) -> tuple[Tensor, ...]:
    """The attention tensors of one layer, with the biases the family's code builds.

    A bias a checkpoint holds beyond those is not used by transformers: check_tensors refuses it.
    """
    C, H, Hkv, D = sizes
    a = f"{p}{arch.attn}."
    qkv_bias, o_bias = _bias(config, arch, arch.qkv_bias), _bias(config, arch, arch.o_bias)
    tensors: list[Tensor] = []
    if arch.fused:
        rows = (H + 2 * Hkv) * D
        tensors.append(Tensor("qkv.weight", f"{a}{arch.qkv_name}.weight", (rows, C)))
        if qkv_bias:
            tensors.append(Tensor("qkv.bias", f"{a}{arch.qkv_name}.bias", (rows,)))
    else:
        for x, n in (("q", H), ("k", Hkv), ("v", Hkv)):
            rows = n * D * (2 if x == "q" and arch.gate else 1)  # Qwen3-Next: query | gate
            tensors.append(Tensor(f"{x}.weight", f"{a}{x}_proj.weight", (rows, C)))
            if qkv_bias:
                tensors.append(Tensor(f"{x}.bias", f"{a}{x}_proj.bias", (rows,)))
    tensors.append(Tensor("o.weight", f"{a}{arch.o_name}.weight", (C, H * D)))
    if o_bias:
        tensors.append(Tensor("o.bias", f"{a}{arch.o_name}.bias", (C,)))
    if arch.norm is not None and arch.norm_weight:
        tensors.append(Tensor("norm.weight", f"{p}input_layernorm.weight", (C,)))
    if arch.norm_bias:
        tensors.append(Tensor("norm.bias", f"{p}input_layernorm.bias", (C,)))
    if arch.qk_norm:
        q, k = ((H * D,), (Hkv * D,)) if arch.qk_whole else ((D,), (D,))
        tensors += [
            Tensor("q_norm.weight", f"{a}q_norm.weight", q),
            Tensor("k_norm.weight", f"{a}k_norm.weight", k),
        ]
    if arch.sinks:
        tensors.append(Tensor("sinks", f"{a}sinks", (H,)))
    return tuple(tensors)


def _arch_notes(family: str, arch: Arch) -> list[str]:
    """What the trace shows differently from the model's own layer, said once."""
    notes = []
    if arch.fused == "rows":
        notes.append(f"{arch.qkv_name} rows are split into W_Q | W_K | W_V in that order")
    if arch.fused == "heads":
        notes.append(f"{arch.qkv_name} rows are per head [heads, 3, head_dim]: q_h, k_h, v_h")
    if arch.norm is None:
        notes.append(
            f"{family} has no norm before attention (it normalises the attention output): "
            "projected is the output projection's, before that norm"
        )
    elif family.startswith("gemma2") or family.startswith("gemma3"):
        notes.append(
            f"{family} applies post_attention_layernorm to o_proj's output before the residual "
            "add: projected is o_proj's output, before that norm"
        )
    if arch.qk_norm == "rms1p":
        who = "Gemma" if family.startswith("gemma") else family
        notes.append(f"q_norm / k_norm scale by 1 + weight ({who}): the fixture holds 1 + weight")
    if arch.gate:
        notes.append(
            "q_proj rows are per head [query | gate] (head_dim each): split into W_Q and gate.W_G; "
            "gated = output * sigmoid(gate) before o_proj, as transformers' Qwen3NextAttention"
        )
    return notes


_ROPE_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")  # of a default rope


def _rope_mapping(config: Config) -> tuple[Any, str]:
    """The RoPE mapping and its key: ``rope_scaling`` where it is set, as transformers 5 takes
    it over ``rope_parameters`` (``convert_rope_params_to_dict``), else ``rope_parameters``."""
    scaling = config.mapping("rope_scaling")
    if scaling:
        return scaling, "rope_scaling"
    params = config.mapping("rope_parameters")
    if params is not None:
        return params, "rope_parameters"
    return scaling, "rope_scaling"


# GptOssConfig's rope_parameters when config.json has none (transformers 5.24)
_GPT_OSS_ROPE: dict[str, Any] = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
# What transformers' ROPE_INIT_FUNCTIONS read of each kind besides rope_theta, and from where:
# the rope mapping, or config.json's max_position_embeddings (core/rope_scaling.py's KINDS).
_SCALED_READS = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": (
        "factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "attention_factor",
        "truncate",
    ),
    "longrope": (
        "short_factor",
        "long_factor",
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
    ),
}
_WITH_ORIGINAL = ("llama3", "yarn", "longrope")  # standardize_rope_params fills it in
_LAYER_TYPES = ("sliding_attention", "full_attention")
_PHI3_RENAMED = {"su": "longrope", "yarn": "longrope"}  # Phi3Config renames both to longrope


def _scaling(
    config: Config, key: str, params: Mapping[str, Any], rope_type: Any, family: str
) -> tuple[tuple[str, Any], ...] | None:
    """The fixture's rope.scaling from the rope mapping, as transformers' rope init functions
    read it; any other key of the mapping is refused (a rope attn would silently not apply).

    A top-level original_max_position_embeddings wins over the mapping's, as in transformers'
    standardize_rope_params (Phi3Config has one whatever config.json says: 4096)."""
    reads = _SCALED_READS.get(rope_type, ()) if isinstance(rope_type, str) else ()
    if rope_type != "default" and not reads:
        raise config.error(
            key,
            f"rope_type {_shown(rope_type)} is not supported",
            "default, " + ", ".join(_SCALED_READS) + " (transformers' ROPE_INIT_FUNCTIONS)",
        )
    other = next((k for k in params if k not in (*_ROPE_KEYS, *reads)), None)
    if other is not None:  # mrope_section, ...: a rope attn would silently not apply
        kind = "a default rope" if rope_type == "default" else f"a {rope_type} rope"
        raise config.error(
            f"{key}.{field_name(other)}",
            f"got {_shown(params[other])} in {kind}",
            "only " + ", ".join((*_ROPE_KEYS[:3], "partial_rotary_factor", *reads)),
        )
    if rope_type == "default":
        return None
    found = {k: params[k] for k in reads if params.get(k) is not None}
    original = "original_max_position_embeddings"

    def longest() -> int:  # read only where the rope needs it
        key = "max_position_embeddings"
        return config.whole(key, _size(ARCHS[family], key))

    if rope_type in _WITH_ORIGINAL and (config.has(original) or family == "phi3"):
        found[original] = config.whole(original, 4096)
    elif rope_type in _WITH_ORIGINAL:
        found.setdefault(original, longest())
    if rope_type not in ("linear", "llama3"):  # dynamic's length; yarn's, longrope's factor
        found["max_position_embeddings"] = longest()
    return (("type", rope_type), *found.items())


def _scaling_note(scaling: tuple[tuple[str, Any], ...] | None) -> str:
    if scaling is None:
        return ""
    kind = dict(scaling)["type"]
    return f"RoPE scaling {kind}, as transformers' {kind} rope init computes it"


def _typed_rope(config: Config, family: str, kind: str) -> tuple[dict[str, Any], str, float]:
    """Gemma 3's and OLMo 3's RoPE of one layer type: rope_parameters keyed by layer type (as
    transformers 5 writes it), or the legacy keys (rope_theta and rope_scaling for full layers,
    Gemma 3's rope_local_base_freq for sliding ones); with the type's default theta."""
    arch = ARCHS[family]
    assert arch.by_type is not None
    default = arch.by_type[kind == "full_attention"]
    params = config.mapping("rope_parameters")  # on every layer type: a list is one line
    if params is not None and set(params) & set(_LAYER_TYPES):
        if config.mapping("rope_scaling") or set(params) - set(_LAYER_TYPES):
            raise config.error(
                "rope_parameters",
                f"got {_shown(params)} beside rope_scaling or other keys",
                "a mapping per layer type (sliding_attention, full_attention) alone",
            )
        one = params.get(kind) or {}
        if not isinstance(one, Mapping):
            raise config.error(f"rope_parameters.{kind}", f"got {_shown(one)}", "a mapping")
        return dict(one), f"rope_parameters.{kind}", default
    if kind == "full_attention":
        one, key = _rope_mapping(config)
        one = dict(one or {})
        one.setdefault("rope_theta", config.number("rope_theta", default))
        return one, key, default
    theta = config.number("rope_local_base_freq", default) if family == "gemma3_text" else default
    return {"rope_type": "default", "rope_theta": theta}, "rope_local_base_freq", default


def _rope(
    config: Config, family: str, head_dim: int, layer: int, kind: str
) -> tuple[Rope | None, str]:
    """RoPE of this layer: base, rotated dims, layout, scaling, from ``rope_parameters``
    (transformers 5) or the legacy keys; None on a family's layers without RoPE."""
    arch = ARCHS[family]
    nope = _nope(config, family, layer, kind)
    if nope:
        return None, nope
    if arch.by_type is not None:
        params, key, theta = _typed_rope(config, family, kind)
    else:
        params, key = _rope_mapping(config)
        params, theta = ({} if params is None else params), arch.theta
    if not isinstance(params, Mapping) or any(isinstance(v, Mapping) for v in params.values()):
        raise config.error(key, f"got {_shown(params)}", "one mapping such as {rope_type: default}")
    if family == "gpt_oss" and key == "rope_scaling" and not params:
        params = dict(_GPT_OSS_ROPE)  # GptOssConfig's default when the config says nothing
    rope_type = params.get("rope_type", params.get("type", "default"))
    if family == "phi3":
        rope_type = _PHI3_RENAMED.get(rope_type, rope_type)
    scaling = _scaling(config, key, params, rope_type, family)
    given = Config(params, config.source)
    legacy = "rotary_emb_base" if family == "gpt_neox" else "rope_theta"
    base = (given if "rope_theta" in params else config).number(
        "rope_theta" if "rope_theta" in params else legacy, theta
    )
    if arch.partial is None:  # check_keys notes (or refuses) the factor it ignores
        note = _scaling_note(scaling)
        return Rope(base=base, dims=head_dim, layout=arch.layout, scaling=scaling), note
    pct = "rotary_pct" if family == "gpt_neox" else "partial_rotary_factor"
    nested = "partial_rotary_factor" in params
    factor = (given if nested else config).number(
        "partial_rotary_factor" if nested else pct, arch.partial
    )
    dims = int(head_dim * factor)
    if dims < 2 or dims % 2 or factor > 1:
        raise config.error(
            f"{key}.partial_rotary_factor" if nested else pct,
            f"{factor} gives {dims} rotated dims of {head_dim}",
            "a factor in (0, 1] giving an even number of dims",
        )
    note = "; ".join(
        n
        for n in (
            _scaling_note(scaling),
            (
                f"partial rotary: the first {dims} of {head_dim} dims rotate"
                if dims < head_dim
                else ""
            ),
        )
        if n
    )
    return Rope(base=base, dims=dims, layout=arch.layout, scaling=scaling), note


def _nope(config: Config, family: str, layer: int, kind: str) -> str:
    """Why this layer has no RoPE (transformers skips apply_rotary_pos_emb there), or ''."""
    arch = ARCHS[family]
    if arch.nope == "smollm3" and not _smollm3_rope(config, layer):
        return f"layer {layer} has no RoPE (no_rope_layers)"
    no_window = "sliding_window" in config.data and config.data["sliding_window"] is None
    if arch.nope != "full" or (no_window and family == "exaone4"):
        return ""
    if family == "cohere2" and no_window:
        return f"layer {layer} has no RoPE (cohere2 rotates only with a sliding_window)"
    if kind == "full_attention":
        return f"layer {layer} is a full-attention layer: no RoPE ({family})"
    return ""


def _smollm3_rope(config: Config, layer: int) -> bool:
    """SmolLM3's no_rope_layers[layer] (1: RoPE), or its default from no_rope_layer_interval."""
    layers = config.whole("num_hidden_layers")
    given = config.data.get("no_rope_layers")
    if given is None:
        every = config.whole("no_rope_layer_interval", 4)
        return (layer + 1) % every != 0
    if (
        not isinstance(given, list)
        or len(given) != layers
        or any(type(v) is not int or v not in (0, 1) for v in given)
    ):
        raise config.error(
            "no_rope_layers", f"got {_shown(given)}", f"a list of {layers} entries, each 0 or 1"
        )
    return bool(given[layer])


_MAX_WINDOW = (1 << 63) - 1  # a fixture's window is an int64, as its positions are
_GATED = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "smollm3")  # use_sliding_window


def _window(config: Config, family: str, layer: int, layers: int) -> tuple[int | None, str]:
    """The sliding window of this layer (HF ``sliding_window``) and a note saying why."""
    arch = ARCHS[family]
    if arch.window == "none":
        return None, ""
    window = config.optional_whole("sliding_window", arch.window_default or 0, minimum=0)
    if arch.window_default is None and "sliding_window" not in config.data:
        window = None
    if family in _GATED and not config.flag("use_sliding_window", False):
        return None, ""
    if window is None or (family == "qwen2_moe" and window == 0):
        return None, ""
    if window == 0:
        raise config.error("sliding_window", "got 0", "a whole number >= 1, or null")
    if arch.window == "all":  # the model masks every layer with sliding_window
        where = f"on every layer ({family})"
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
    linear = ARCHS[family].linear
    kinds = ("linear_attention", "full_attention") if linear else _LAYER_TYPES
    if types is not None:
        if (
            not isinstance(types, list)
            or len(types) != layers
            or any(t not in (*kinds, "attention") for t in types)
        ):
            raise config.error(
                "layer_types",
                f"got {_shown(types)}",
                f"a list of {layers} entries, each {kinds[0]!r} or {kinds[1]!r}",
            )
        kind: str = types[layer]
        return "full_attention" if kind == "attention" else kind  # transformers' legacy name
    if linear:  # Qwen3NextConfig: full attention every full_attention_interval-th layer
        every = config.whole("full_attention_interval", linear)
        return "full_attention" if (layer + 1) % every == 0 else "linear_attention"
    return "sliding_attention" if _slides(config, family, layer) else "full_attention"


def _gated_deltanet(
    config: Config,
    family: str,
    where: tuple[int, int, int],
    eps: float,
    embeds: tuple[tuple[Tensor, ...], Embedding],
) -> LayerPlan:
    """A linear_attention layer (Qwen3NextGatedDeltaNet), read into the fixture's gated_deltanet
    key: in_proj_qkvz (per key head: q, k, then v and z of its value heads), in_proj_ba (per key
    head: b, then a), conv1d (depthwise, no bias), A_log, dt_bias, the gated RMSNorm's weight,
    out_proj; input_layernorm RMSNorm (1 + weight) before."""
    layer, layers, C = where
    Hk = config.whole("linear_num_key_heads", 16)
    Hv = config.whole("linear_num_value_heads", 32)
    if Hv % Hk:
        raise config.error(
            "linear_num_value_heads",
            f"{Hv} is not a multiple of linear_num_key_heads {Hk}: "
            "transformers splits in_proj_qkvz per key head",
            "a multiple of linear_num_key_heads",
        )
    dk, dv = config.whole("linear_key_head_dim", 128), config.whole("linear_value_head_dim", 128)
    kernel = config.whole("linear_conv_kernel_dim", 4)
    act = config.text("hidden_act", "silu")
    if act not in ("silu", "swish"):  # the activation after linear_attn's conv1d
        raise config.error(
            "hidden_act",
            f"got {_shown(act)}: the activation after linear_attention's conv1d, "
            "where the gated_deltanet key applies SiLU",
            "absent or 'silu'",
        )
    p = f"layers.{layer}."
    a, conv = f"{p}linear_attn.", 2 * Hk * dk + Hv * dv
    tensors = (
        Tensor("qkvz.weight", f"{a}in_proj_qkvz.weight", (conv + Hv * dv, C)),
        Tensor("ba.weight", f"{a}in_proj_ba.weight", (2 * Hv, C)),
        Tensor("conv.weight", f"{a}conv1d.weight", (conv, 1, kernel)),
        Tensor("A_log", f"{a}A_log", (Hv,)),
        Tensor("dt_bias", f"{a}dt_bias", (Hv,)),
        Tensor("gated_norm.weight", f"{a}norm.weight", (dv,)),
        Tensor("o.weight", f"{a}out_proj.weight", (C, Hv * dv)),
        Tensor("norm.weight", f"{p}input_layernorm.weight", (C,)),
    )
    notes = (
        f"layer {layer} is a linear_attention layer (Gated DeltaNet): read into the "
        "gated_deltanet key; in_proj_qkvz's rows per key head [q | k | v | z] and in_proj_ba's "
        "[b | a] split into W_q, W_k, W_v, W_z, W_b, W_a (fix_query_key_value_ordering), every "
        "Linear transposed, conv1d.weight[:, 0, :]",
    )
    return LayerPlan(
        family=family,
        layer=layer,
        layers=layers,
        hidden=C,
        heads=Hv,
        kv_heads=Hv,
        head_dim=dk,
        layout="linear",
        anchor=_ANCHOR_LINEAR,
        tensors=tensors,
        embed_tensors=embeds[0],
        pre_norm=Norm("rms1p", eps, "norm.weight"),
        embedding=embeds[1],
        causal=True,
        scale=float(dk**-0.5),
        delta=DeltaNet(Hk, Hv, dk, dv, kernel, eps),
        notes=notes,
        block=p,
        scopes=("linear_attn.", "input_layernorm."),
    )


# a tensor every Qwen3-Next layer has, full or linear: it finds the checkpoint's prefix
_ANCHOR_LINEAR = r"layers\.\d+\.(?:self_attn\.q_proj|linear_attn\.in_proj_qkvz)\.weight"


def _slides(config: Config, family: str, layer: int) -> bool:
    """Whether the config class's default layer_types makes this layer a sliding one."""
    arch = ARCHS[family]
    if arch.window == "qwen":
        return layer >= config.whole("max_window_layers", 28, minimum=0)
    if arch.window == "qwen2_moe":
        first = config.whole("max_window_layers", 28, minimum=0)
        return config.flag("use_sliding_window", False) and layer < first and layer % 2 == 0
    if arch.window == "smollm3":
        return (
            config.flag("use_sliding_window", False)
            and config.has("sliding_window")
            and (not _smollm3_rope(config, layer))
        )
    if arch.window == "ministral":
        return config.has("sliding_window") or "sliding_window" not in config.data
    if arch.window != "types":
        return False
    if family == "exaone4" and "sliding_window" in config.data and not config.has("sliding_window"):
        return False  # no window: EXAONE 4's pattern is 0 (its class then fails on layer_types)
    pattern = arch.pattern
    for key in ("sliding_window_pattern", "_sliding_window_pattern"):
        if family in ("gemma3_text", "cohere2", "exaone4") and config.has(key):
            pattern = config.whole(key)
    return (layer + 1) % pattern != 0


def _shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut short for a one-line error (a list may hold thousands of entries)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def prefix_of(names: list[str], plan: LayerPlan, source: str) -> str:
    """The prefix of the family's tensor names (``model.``, ``bert.``, ``transformer.``, none)."""
    pattern = re.compile(rf"(.*?){plan.anchor}")
    found = sorted({m.group(1) for n in names if (m := pattern.fullmatch(n))})
    if plan.prefixes:  # a wrapper's text model: the layers of its vision tower are not its
        found = [p for p in found if p in plan.prefixes] or [plan.prefixes[0]]
    if len(found) > 1:
        raise InputError(
            source,
            "",
            f"attention tensors under several prefixes ({', '.join(found)})",
            "one model per checkpoint",
        )
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
INERT = frozenset(
    {
        # PreTrainedConfig and what earlier versions of it saved
        "model_type",
        "_name_or_path",
        "name_or_path",
        "_commit_hash",
        "architectures",
        "auto_map",
        "custom_pipelines",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "use_bfloat16",
        "id2label",
        "label2id",
        "num_labels",
        "problem_type",
        "finetuning_task",
        "tokenizer_class",
        "prefix",
        "task_specific_params",
        "return_dict",
        "use_return_dict",
        "output_attentions",
        "output_hidden_states",
        "torchscript",
        "xla_device",
        "chunk_size_feed_forward",
        "attn_implementation",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "experts_implementation",
        "use_cache",
        "cache_implementation",
        "gradient_checkpointing",
        "initializer_range",
        "initializer_factor",
        "init_std",
        "vocab_size",
        "max_position_embeddings",
        "tie_word_embeddings",
        "tie_encoder_decoder",
        # token ids
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "cls_token_id",
        "mask_token_id",
        "unk_token_id",
        "decoder_start_token_id",
        "eod_token_id",
        # generation settings (GenerationConfig._get_default_generation_params)
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "encoder_repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "epsilon_cutoff",
        "eta_cutoff",
        "assistant_confidence_threshold",
        "assistant_lookbehind",
        "target_lookbehind",
        "num_assistant_tokens",
        "num_assistant_tokens_schedule",
        # the MLP (traced by no stage), mixture-of-experts routing, the LM head
        "hidden_act",
        "hidden_activation",
        "activation_function",
        "intermediate_size",
        "n_inner",
        "mlp_bias",
        "pretraining_tp",
        "num_local_experts",
        "num_experts",
        "num_experts_per_tok",
        "experts_per_token",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "decoder_sparse_step",
        "mlp_only_layers",
        "norm_topk_prob",
        "output_router_logits",
        "router_aux_loss_coef",
        "router_jitter_noise",
        "swiglu_alpha",
        "swiglu_limit",
        "final_logit_softcapping",
        "logit_scale",
        "logits_scaling",
        # quantized attention tensors are refused by their dtype, or as tensors the layout lacks
        "quantization_config",
    }
)
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
    "attention_multiplier": Rule(
        (None,), "the attention scale in place of 1/sqrt(head_dim) (Granite)"
    ),
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
}

_ROTARY = frozenset({"rope_parameters", "rope_scaling", "rope_theta"})
_LLAMA_READS = _ROTARY | {
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "head_dim",
    "rms_norm_eps",
}
_WINDOWED = frozenset({"sliding_window", "layer_types"})
_QWEN_NEEDS = (
    Need(("sliding_window",), when="use_sliding_window"),
    Need(("max_window_layers", "layer_types"), when="use_sliding_window"),
)
_LLAMA_ASSUMED = ("rms_norm_eps", "rope_theta")
_SIZES = frozenset(
    {"hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "head_dim"}
)
_PATTERN = frozenset({"sliding_window_pattern", "_sliding_window_pattern"})
_NO_WINDOW = Rule((None,), "transformers' {family} has no sliding window")
_EVERY_LAYER = Rule((None,), "transformers' {family} slides every layer or none")
_FULL_ROPE = Rule((None, 1, 1.0), "transformers' {family} rotates every dim of each head")
_NO_BIAS = Rule(_OFF, "transformers' {family} reads no attention_bias")

KEYS: dict[str, Keys] = {
    "bert": Keys(
        reads=frozenset(
            {
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "layer_norm_eps",
                "type_vocab_size",
                "is_decoder",
            }
        ),
        inert=frozenset(
            {
                "directionality",
                "pooler_fc_size",
                "pooler_num_attention_heads",
                "pooler_num_fc_layers",
                "pooler_size_per_head",
                "pooler_type",
            }
        ),
        neutral={"position_embedding_type": Rule((None, "absolute"), "relative positions")},
        ignored={
            "pad_token_id": Rule(
                (None, 0),
                "transformers' bert starts positions at 0 (RoBERTa's at pad_token_id + 1)",
            )
        },
        assumed=("layer_norm_eps",),
    ),
    "gpt2": Keys(
        reads=frozenset(
            {
                "n_embd",
                "n_head",
                "n_layer",
                "n_positions",
                "layer_norm_epsilon",
                "scale_attn_weights",
                "scale_attn_by_inverse_layer_idx",
            }
        ),
        # n_ctx: unused since transformers 2; reorder_and_upcast_attn: the same product in float32
        inert=frozenset(
            {
                "n_ctx",
                "summary_type",
                "summary_use_proj",
                "summary_activation",
                "summary_proj_to_labels",
                "summary_first_dropout",
                "reorder_and_upcast_attn",
            }
        ),
        assumed=("layer_norm_epsilon",),
    ),
    "llama": Keys(
        reads=_LLAMA_READS | {"attention_bias"},
        ignored={
            "partial_rotary_factor": _FULL_ROPE,
            "sliding_window": Rule((None,), "transformers' llama has no sliding window"),
        },
        assumed=_LLAMA_ASSUMED,
    ),
    "mistral": Keys(
        reads=_LLAMA_READS | {"sliding_window"},
        ignored={
            "partial_rotary_factor": _FULL_ROPE,
            "attention_bias": _NO_BIAS,
            "layer_types": Rule((None,), "transformers' mistral slides every layer"),
        },
        needs=(Need(("sliding_window",)),),
        assumed=_LLAMA_ASSUMED,
    ),
    "qwen2": Keys(
        reads=_LLAMA_READS | _WINDOWED | {"use_sliding_window", "max_window_layers"},
        ignored={"partial_rotary_factor": _FULL_ROPE, "attention_bias": _NO_BIAS},
        needs=_QWEN_NEEDS,
        assumed=_LLAMA_ASSUMED,
    ),
    "qwen3": Keys(
        reads=_LLAMA_READS
        | _WINDOWED
        | {"use_sliding_window", "max_window_layers", "attention_bias"},
        ignored={"partial_rotary_factor": _FULL_ROPE},
        needs=(*_QWEN_NEEDS, Need(("head_dim",))),
        assumed=_LLAMA_ASSUMED,
    ),
    "gemma2": Keys(
        reads=_LLAMA_READS
        | _WINDOWED
        | {
            "attention_bias",
            "query_pre_attn_scalar",
            "attn_logit_softcapping",
            "use_bidirectional_attention",
        },
        inert=frozenset({"sliding_window_size"}),  # early configs; the model reads sliding_window
        ignored={"partial_rotary_factor": _FULL_ROPE},
        needs=tuple(
            Need((k,))
            for k in (
                "head_dim",
                "query_pre_attn_scalar",
                "attn_logit_softcapping",
                "sliding_window",
                "layer_types",
            )
        ),
        assumed=_LLAMA_ASSUMED,
    ),
    "gpt_oss": Keys(
        reads=_LLAMA_READS | _WINDOWED | {"attention_bias"},
        inert=frozenset({"initial_context_length"}),  # the yarn rope's, which is refused
        ignored={"partial_rotary_factor": _FULL_ROPE},
        needs=tuple(
            Need((k,)) for k in ("head_dim", "attention_bias", "sliding_window", "layer_types")
        ),
        assumed=_LLAMA_ASSUMED,
    ),
    "mixtral": Keys(
        reads=_LLAMA_READS | {"sliding_window"},
        ignored={
            "partial_rotary_factor": _FULL_ROPE,
            "attention_bias": _NO_BIAS,
            "layer_types": Rule((None,), "transformers' mixtral slides every layer"),
        },
        assumed=_LLAMA_ASSUMED,
    ),
    "ministral": Keys(
        reads=_LLAMA_READS | _WINDOWED,
        ignored={"partial_rotary_factor": _FULL_ROPE, "attention_bias": _NO_BIAS},
        needs=(Need(("head_dim",)), Need(("sliding_window",))),
        assumed=_LLAMA_ASSUMED,
    ),
    "qwen2_moe": Keys(
        reads=_LLAMA_READS | _WINDOWED | {"use_sliding_window", "max_window_layers", "qkv_bias"},
        ignored={"partial_rotary_factor": _FULL_ROPE, "attention_bias": _NO_BIAS},
        needs=(*_QWEN_NEEDS, Need(("qkv_bias",))),
        assumed=_LLAMA_ASSUMED,
    ),
    "qwen3_moe": Keys(
        reads=_LLAMA_READS | {"use_sliding_window", "sliding_window", "attention_bias"},
        ignored={
            "partial_rotary_factor": _FULL_ROPE,
            "max_window_layers": _EVERY_LAYER,
            "layer_types": _EVERY_LAYER,
        },
        needs=(Need(("sliding_window",), when="use_sliding_window"),),
        assumed=_LLAMA_ASSUMED,
    ),
    "gemma": Keys(
        reads=_LLAMA_READS | {"attention_bias", "use_bidirectional_attention"},
        ignored={"partial_rotary_factor": _FULL_ROPE},
        needs=(Need(("head_dim",)),),
        assumed=_LLAMA_ASSUMED,
    ),
    "gemma3_text": Keys(
        reads=_LLAMA_READS
        | _WINDOWED
        | _PATTERN
        | {
            "attention_bias",
            "query_pre_attn_scalar",
            "use_bidirectional_attention",
            "rope_local_base_freq",
        },
        ignored={
            "partial_rotary_factor": _FULL_ROPE,
            "attn_logit_softcapping": Rule(
                (None,), "transformers' gemma3_text passes no softcap to its attention"
            ),
        },
        needs=(
            *(Need((k,)) for k in ("head_dim", "query_pre_attn_scalar", "sliding_window")),
            Need(("layer_types", *_PATTERN)),
        ),
        assumed=_LLAMA_ASSUMED,
    ),
    "granite": Keys(
        reads=_LLAMA_READS | {"attention_bias", "attention_multiplier", "embedding_multiplier"},
        inert=frozenset({"residual_multiplier"}),  # on the residual branches, after attention
        ignored={"partial_rotary_factor": _FULL_ROPE, "sliding_window": _NO_WINDOW},
        needs=(Need(("attention_multiplier",)),),
        assumed=_LLAMA_ASSUMED,
    ),
    "smollm3": Keys(
        reads=_LLAMA_READS
        | _WINDOWED
        | {"use_sliding_window", "attention_bias", "no_rope_layers", "no_rope_layer_interval"},
        ignored={"partial_rotary_factor": _FULL_ROPE},
        needs=(Need(("no_rope_layers", "no_rope_layer_interval")),),
        assumed=_LLAMA_ASSUMED,
    ),
    "starcoder2": Keys(
        reads=_SIZES | _ROTARY | {"norm_epsilon", "use_bias", "sliding_window"},
        ignored={"partial_rotary_factor": _FULL_ROPE, "attention_bias": _NO_BIAS},
        needs=(Need(("use_bias",)),),
        assumed=("norm_epsilon", "rope_theta"),
    ),
    "olmo": Keys(
        reads=_SIZES | _ROTARY | {"attention_bias"},
        ignored={"partial_rotary_factor": _FULL_ROPE},
        assumed=("rope_theta",),
    ),
    "olmo2": Keys(
        reads=_LLAMA_READS | {"attention_bias"},
        ignored={"partial_rotary_factor": _FULL_ROPE},
        assumed=_LLAMA_ASSUMED,
    ),
    "olmo3": Keys(
        reads=_LLAMA_READS | _WINDOWED | {"attention_bias"},
        ignored={"partial_rotary_factor": _FULL_ROPE},
        needs=(Need(("sliding_window",)), Need(("layer_types",))),
        assumed=_LLAMA_ASSUMED,
    ),
    "exaone4": Keys(
        reads=_LLAMA_READS | _WINDOWED | _PATTERN,
        ignored={"partial_rotary_factor": _FULL_ROPE, "attention_bias": _NO_BIAS},
        needs=(Need(("sliding_window",)), Need(("layer_types", *_PATTERN))),
        assumed=_LLAMA_ASSUMED,
    ),
    "phi3": Keys(
        reads=_LLAMA_READS
        | {"sliding_window", "original_max_position_embeddings", "partial_rotary_factor"},
        ignored={"attention_bias": _NO_BIAS},
        assumed=_LLAMA_ASSUMED,
    ),
    "phi": Keys(
        reads=_SIZES | _ROTARY | {"layer_norm_eps", "partial_rotary_factor"},
        needs=(Need(("partial_rotary_factor",)),),
        assumed=("layer_norm_eps", "rope_theta"),
    ),
    "stablelm": Keys(
        reads=_SIZES - {"head_dim"}
        | _ROTARY
        | {"layer_norm_eps", "use_qkv_bias", "partial_rotary_factor"},
        inert=frozenset({"use_parallel_residual"}),  # the MLP beside attention, or after it
        needs=(Need(("partial_rotary_factor",)),),
        assumed=("layer_norm_eps", "rope_theta"),
    ),
    "gpt_neox": Keys(
        reads=_SIZES - {"head_dim", "num_key_value_heads"}
        | _ROTARY
        | {
            "layer_norm_eps",
            "attention_bias",
            "rotary_pct",
            "rotary_emb_base",
            "partial_rotary_factor",
        },
        inert=frozenset({"use_parallel_residual", "is_decoder"}),  # GPT-NeoX is always causal
        needs=(Need(("rotary_pct", "partial_rotary_factor")),),
        assumed=("layer_norm_eps", "rotary_emb_base"),
    ),
    "cohere": Keys(
        reads=_SIZES | _ROTARY | {"layer_norm_eps", "attention_bias"},
        ignored={"partial_rotary_factor": _FULL_ROPE},
        assumed=("layer_norm_eps", "rope_theta"),
    ),
    "cohere2": Keys(
        reads=_SIZES | _ROTARY | _WINDOWED | _PATTERN | {"layer_norm_eps", "attention_bias"},
        ignored={"partial_rotary_factor": _FULL_ROPE},
        needs=(Need(("sliding_window",)), Need(("layer_types", *_PATTERN))),
        assumed=("layer_norm_eps", "rope_theta"),
    ),
    "ernie4_5": Keys(
        reads=_LLAMA_READS | {"use_bias"},
        ignored={"partial_rotary_factor": _FULL_ROPE, "attention_bias": _NO_BIAS},
        needs=(Need(("head_dim",)),),
        assumed=_LLAMA_ASSUMED,
    ),
    "glm4": Keys(
        reads=_LLAMA_READS | {"attention_bias", "partial_rotary_factor"},
        needs=tuple(Need((k,)) for k in ("head_dim", "attention_bias", "partial_rotary_factor")),
        assumed=_LLAMA_ASSUMED,
    ),
    "qwen3_next": Keys(
        # the full_attention layers' keys and the Gated DeltaNet (linear_attention) layers'
        reads=_LLAMA_READS
        | {
            "attention_bias",
            "partial_rotary_factor",
            "layer_types",
            "full_attention_interval",
            "linear_conv_kernel_dim",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_num_key_heads",
            "linear_num_value_heads",
        },
        needs=(
            Need(("head_dim",)),
            Need(("layer_types", "full_attention_interval")),
            Need(("partial_rotary_factor",)),
        ),
        assumed=_LLAMA_ASSUMED,
    ),
    "deepseek_v3": Keys(
        reads=_LLAMA_READS
        | {
            "kv_lora_rank",
            "q_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "qk_head_dim",
            "attention_bias",
            "rope_interleave",
            "vocab_size",
        },
        # the MoE MLP's routing (layers from first_k_dense_replace on), the multi-token
        # prediction layers (DeepSeek V3's own code and transformers'): no attention numbers
        inert=frozenset(
            {
                "first_k_dense_replace",
                "n_group",
                "n_routed_experts",
                "n_shared_experts",
                "num_nextn_predict_layers",
                "num_mtp_layers",
                "routed_scaling_factor",
                "topk_group",
                "topk_method",
                "scoring_func",
                "moe_layer_freq",
                "ep_size",
                "aux_loss_alpha",
                "seq_aux",
            }
        ),
        # read as deepseek_v3 under another model_type: only rope_interleave tells V3's RoPE
        # layout from V2's (each pair in place), which has the same keys and tensors
        needs=(Need(("rope_interleave",)),),
        assumed=_LLAMA_ASSUMED,
    ),
    "distilbert": Keys(
        reads=frozenset({"dim", "n_heads", "n_layers", "sinusoidal_pos_embds"}),
        inert=frozenset({"hidden_dim", "activation", "tie_weights_"}),
    ),
}
# DeepSeek V2: V3's keys; its RoPE is always by view_as_complex (no rope_interleave to read)
KEYS["deepseek_v2"] = replace(
    KEYS["deepseek_v3"], reads=KEYS["deepseek_v3"].reads - {"rope_interleave"}, needs=()
)
for _name in ROBERTA_LIKE:  # BERT's keys, pad_token_id read: the positions start after it
    KEYS[_name] = replace(KEYS["bert"], reads=KEYS["bert"].reads | {"pad_token_id"}, ignored={})


@dataclass(frozen=True)
class Wrapper:
    """An image-text model type whose text model is a family attn imports: config.json holds
    that model's config under ``text_config``, the checkpoint its tensors under a prefix."""

    text: str  # the text_config's model_type: the family the layers are read as
    prefixes: tuple[str, ...]  # where the text model's tensors are; the first one is assumed
    keys: Keys  # the outer config.json's keys (text_config's are the text family's)


# The image side (the vision tower's config, the image tokens) changes no text layer's numbers.
# Gemma 3's image_token_index is replaced by id 0 only where it is past the vocabulary, where
# attn's --text refuses the id.
_IMAGE_SIDE = frozenset(
    {
        "vision_config",
        "mm_tokens_per_image",
        "boi_token_index",
        "eoi_token_index",
        "image_token_index",
        "boi_token_id",
        "eoi_token_id",
        "image_token_id",
    }
)
WRAPPERS = {
    # Gemma3ForConditionalGeneration (Gemma 3 4B, 12B, 27B): its module names the text layers
    # model.language_model.layers.N; save_pretrained (5.24) writes them as the Hub's checkpoints
    # do, language_model.model.layers.N, which the conversion mapping ("llava": ^language_model
    # -> model.language_model, then Gemma3Model's ^language_model.model -> language_model)
    # renames on loading. transformers loads either.
    "gemma3": Wrapper(
        "gemma3_text",
        ("language_model.model.", "model.language_model."),
        Keys(reads=frozenset({"text_config"}), inert=_IMAGE_SIDE),
    ),
}
KEYS |= {name: wrapper.keys for name, wrapper in WRAPPERS.items()}


def text_config(config: Config, family: str) -> Config:
    """A wrapper's ``text_config``: a mapping whose model_type is the wrapper's text family."""
    text = WRAPPERS[family].text
    data = config.data.get("text_config")
    if not isinstance(data, Mapping):
        raise config.error(
            "text_config",
            "missing" if data is None else f"got {_spelled(data)}",
            f"the text model's config: a mapping with model_type {text!r}",
        )
    model_type = data.get("model_type")
    if model_type != text:
        got = "missing" if model_type is None else f"got {_spelled(model_type)}"
        raise config.error(
            "text_config.model_type",
            f"{got}: attn reads a {family} checkpoint's text model as {text}",
            repr(text),
        )
    return Config(data, config.source, f"{config.path}text_config.")


# Model types attn knows and does not import, with what their attention does that a family's
# plan would miss: --arch never reads one of them as a family.
KNOWN_TYPES = {
    "opt": "learned positions offset by 2",
    "granitemoe": "attention_multiplier as the scale, multipliers on embeddings and residuals",
    "gptj": "RoPE on interleaved pairs of part of each head",
    "hunyuan_v1_dense": "q/k norm after RoPE (attn's q/k norm comes before it), NTK alpha",
    "llama4_text": "chunked attention, layers without RoPE, q/k L2 norm, temperature tuning",
    "falcon": "a fused query_key_value, multi-query heads, parallel attention, optional ALiBi",
    "bloom": "ALiBi position biases and a fused query_key_value",
    "mpt": "ALiBi position biases and a fused Wqkv",
}


# Families whose conventions no config.json key or tensor name shows: read as one of them, a
# checkpoint of another model would import with numbers that are not its own.
ARCH_REFUSED = {
    "gemma": "gemma's RMSNorm (1 + weight) and embedding scale show in no config.json key, so "
    "--arch gemma cannot tell a Gemma from a Llama",
    "ernie4_5": "ernie4_5's RoPE on interleaved pairs shows in no config.json key, so "
    "--arch ernie4_5 cannot tell an ERNIE 4.5 from a Llama",
}


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
            config.source,
            "model_type",
            f"{model_type!r} is not {family}: {why}",
            f"a {family} checkpoint, or one whose model_type attn does not know",
            option="arch",
        )
    if family in ARCH_REFUSED:
        raise InputError(
            config.source,
            "model_type",
            f"got {_spelled(model_type)}: {ARCH_REFUSED[family]}",
            f"model_type {family!r} (the checkpoint's own)",
            option="arch",
        )
    _check_architectures(config, family)
    shown = "no model_type" if model_type is None else f"model_type {_shown(model_type)}"
    return family, (
        f"{shown} read as {family}, as asked: every config.json key is one {family} reads, "
        "one that cannot change the attention, or at its neutral value",
    )


def _check_gemma_like(config: Config, family: str) -> None:
    """A GELU MLP marks a Gemma, whose RMSNorm scales by 1 + weight (a key no Gemma 1 config
    has otherwise): read as a family whose RMSNorm scales by the weight, it is refused."""
    arch = ARCHS.get(family)
    if arch is None or arch.norm != "rms":
        return
    for key in ("hidden_act", "hidden_activation"):
        value = config.data.get(key)
        if isinstance(value, str) and value.startswith("gelu"):
            raise config.error(
                key,
                f"got {_spelled(value)}: the MLP of a Gemma, whose RMSNorm scales by "
                f"1 + weight where {family}'s scales by the weight",
                f"a {family} checkpoint's activation (silu), or the checkpoint's own model_type",
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
                config.source,
                "architectures",
                f"names {name!r}, a {known} model: {why}",
                f"a {family} checkpoint",
                option="arch",
            )


def check_keys(config: Config, family: str) -> tuple[str, ...]:
    """Every config.json key is read by the family, inert, or neutral; notes of keys ignored.

    A key that is none of these is refused with its value and what attn expected: a key that
    changes the attention and is not understood is never ignored.
    """
    keys = KEYS[family]
    native = config.data.get("model_type") == family
    # a wrapper's text model first: a checkpoint without one is no wrapper, whatever else it has
    text = text_config(config, family) if family in WRAPPERS else None
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
        _check_gemma_like(config, family)
        notes += _defaults_given(config, family)
    if text is not None:  # text_config's keys, against its family's allowlist
        notes += check_keys(text, WRAPPERS[family].text)
    return tuple(notes)


def _defaults_given(config: Config, family: str) -> list[str]:
    """Read as ``family``, a checkpoint gives each key whose default turns something on (a
    window, a softcap, a scale); an epsilon or RoPE base left out is noted as assumed."""
    model_type = config.data.get("model_type")

    def given(key: str) -> bool:
        params = _rope_mapping(config)[0] if key in _ROPE_KEYS else None
        return key in config.data or (isinstance(params, Mapping) and key in params)

    keys = KEYS[family]
    for need in keys.needs:
        if (need.when is None or config.data.get(need.when) is True) and not any(
            given(k) for k in need.keys
        ):
            raise InputError(
                config.source,
                need.keys[0],
                f"missing: model_type {_spelled(model_type)} is "
                f"not {family}, so {family}'s default cannot be assumed",
                "the key, as the model sets it",
                option="arch",
            )
    absent = [k for k in keys.assumed if not given(k)]
    return [f"{', '.join(absent)} absent: {family}'s default assumed"] if absent else []


_UNKNOWN = Rule((None,), "a key attn's {family} import does not know (it may change the attention)")


def _nested_partial_rotary(config: Config, family: str, native: bool) -> list[str]:
    """partial_rotary_factor inside the rope mapping, under the family's rule for the key."""
    params, key = _rope_mapping(config)
    if not isinstance(params, Mapping) or "partial_rotary_factor" not in params:
        return []
    if family in ARCHS and ARCHS[family].partial is not None:  # read by _rope
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
    same = stem == plan.family or (stem == "roberta" and plan.family in ROBERTA_LIKE)
    if stem is not None and not same:
        raise InputError(
            source,
            "",
            f"tensors under {prefix!r}, a {stem} model",
            f"a {plan.family} checkpoint",
            option="arch",
        )
    read = {prefix + t.name for t in plan.tensors}
    block = prefix + plan.block
    unused = re.compile(plan.unused)
    for name in names:
        inside = name.startswith(block) and name[len(block) :].startswith(plan.scopes)
        if inside and name not in read and not unused.fullmatch(name[len(block) :]):
            raise InputError(
                source,
                name,
                f"a tensor of layer {plan.layer}'s attention that the "
                f"{plan.family} layout has no place for",
                "only " + ", ".join(sorted(n[len(block) :] for n in read if n.startswith(block))),
            )
