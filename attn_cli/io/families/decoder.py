"""The base of the decoders with q/k/v/o projections (or a fused qkv), GQA, a norm and RoPE:
Llama and the families that differ from it only by a table (``Arch``), each field's default
being what Llama does. A family module gives its ``Arch``; ``llama_like`` makes its plan of a
layer, with the window, the RoPE and the layers without RoPE read as the Arch says, by no name.
(transformers 5.24's configuration_*.py defaults and modeling_*.py attention.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any, Literal

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import (
    Block,
    LayerNormBlock,
    decoder_block,
    decoder_head,
    layer_norm_block,
    layer_norm_head,
)
from attn_cli.io.families.config import Config, check_layer, heads, shown
from attn_cli.io.families.keys import Keys
from attn_cli.io.families.plan import (
    Embedding,
    FloatArray,
    FromTensors,
    LayerPlan,
    Norm,
    Rope,
    Tensor,
)
from attn_cli.io.families.registry import Family
from attn_cli.io.families.rope import LAYER_TYPES, rope_of


def family(
    name: str,
    arch: Arch,
    keys: Keys,
    block: Block | LayerNormBlock,
    *,
    hf_class: str,
    shows: str,
    arch_refused: str = "",
) -> Family:
    """A decoder family: its plan ``llama_like`` with ``arch``, its block and head ``block``'s."""
    if isinstance(block, LayerNormBlock):
        plan_block, plan_head = partial(layer_norm_block, block), partial(layer_norm_head, block)
    else:
        plan_block, plan_head = partial(decoder_block, block), partial(decoder_head, block)
    return Family(
        name,
        hf_class,
        shows,
        keys,
        partial(llama_like, arch, name),
        plan_block,
        plan_head,
        arch_refused=arch_refused,
        plain_rms=arch.norm == "rms",
        reads_partial=arch.partial is not None,
    )


def llama_like(arch: Arch, family: str, config: Config, layer: int) -> LayerPlan:
    """The plan of layer ``layer`` of a decoder of ``family``, whose differences from Llama are
    ``arch``."""
    layers = check_layer(config, "num_hidden_layers", layer, arch.size("num_hidden_layers"))
    if arch.embed == "sqrt" and config.flag("use_bidirectional_attention", False):
        raise config.error("use_bidirectional_attention", "is not supported", "false (causal)")
    C = config.whole("hidden_size", arch.size("hidden_size"))
    H = config.whole("num_attention_heads", arch.size("num_attention_heads"))
    Hkv = config.whole("num_key_value_heads", arch.size("num_key_value_heads", H))
    if H % Hkv:
        raise config.error("num_key_value_heads", f"{Hkv} does not divide {H} heads", "a divisor")
    D = _head_dim(config, arch, C)
    key, eps_default = arch.eps
    eps = eps_default if key is None else config.number(key, eps_default)
    p = f"layers.{layer}."
    tensors = _llama_tensors(config, arch, p, (C, H, Hkv, D))
    vocab = config.whole("vocab_size", arch.size("vocab_size"))
    embed = (Tensor("embed.tokens", f"{arch.embed_name}.weight", (vocab, C)),)
    kind = _layer_type(config, arch, layer, layers)  # the whole list checked, used or not
    embedding = Embedding(
        "embed.tokens",
        scale=math.sqrt(C) if arch.embed == "sqrt" else None,
        multiplier=_multiplier(config, arch),
    )
    if kind == "linear_attention":
        assert arch.linear_plan is not None
        return arch.linear_plan(config, family, (layer, layers, C), eps, (embed, embedding))
    window, window_note = _window(config, arch, family, layer, layers)
    rope, rope_note = _rope(config, arch, family, D, layer, kind)
    notes = [n for n in (window_note, rope_note) if n]
    notes += _arch_notes(family, arch)
    norm_roles = (
        "norm.weight" if arch.norm_weight else None,
        "norm.bias" if arch.norm_bias else None,
    )
    sizes = (layer, layers, C, H, Hkv, D)  # layer, layers, hidden, heads, kv_heads, head_dim
    return LayerPlan(
        family,
        *sizes,
        layout=_LAYOUTS[arch.fused],
        anchor=rf"layers\.\d+\.{arch.attn}\.{arch.qkv_name if arch.fused else 'q_proj'}\.weight",
        tensors=tensors,
        embed_tensors=embed,
        pre_norm=None if arch.norm is None else Norm(arch.norm, eps, *norm_roles),
        embedding=embedding,
        causal=True,
        scale=_scale(config, arch, D),
        variants=_variants(config, arch, rope, window, eps),
        positions=rope is not None or window is not None,
        q_gate_rows=arch.gate,
        notes=tuple(notes),
        block=p,
        scopes=(f"{arch.attn}.", f"{arch.norm_name}."),
        unused=rf"{arch.attn}\.(rotary_emb\.inv_freq|masked_bias|bias)",  # buffers once saved
    )


def _variants(
    config: Config, arch: Arch, rope: Rope | None, window: int | None, eps: float
) -> dict[str, Any]:
    """Each variant's setting, by its name, as the fixture takes it (in the fixture's order)."""
    out: dict[str, Any] = {}
    if rope is not None:
        out["rope"] = {"base": rope.base, "layout": rope.layout, "dims": rope.dims}
        out["rope"].update((f"scaling.{k}", v) for k, v in rope.scaling or ())
    if window is not None:
        out["window"] = window
    if arch.gate:
        out["gate"] = FromTensors(_gate)
    for variant in arch.variants:  # the family's own, by no name here
        setting = variant.setting(config, eps)
        if setting is not None:
            out[variant.name] = setting
    return out


def _gate(t: Mapping[str, FloatArray], w: Mapping[str, FloatArray]) -> dict[str, FloatArray]:
    """The output gate's weights, split from q_proj's rows (checkpoint.split_gate)."""
    gate = {"W_G": w["W_G"]}
    if "b_G" in w:
        gate["b_G"] = w["b_G"]
    return gate


_LAYOUTS: dict[str, Literal["linear", "qkv_rows", "qkv_heads"]] = {
    "": "linear",
    "rows": "qkv_rows",
    "heads": "qkv_heads",
}


def _head_dim(config: Config, arch: Arch, hidden: int) -> int:
    """config.json's head_dim, else the config class's default, else hidden / heads."""
    if not arch.reads_head_dim:  # the family's code computes hidden / heads whatever is given
        return hidden // heads(config, hidden, "num_attention_heads")
    given = config.data.get("head_dim", arch.head_dim)
    if given is None:
        return hidden // heads(config, hidden, "num_attention_heads")
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


def _bias(config: Config, which: str | bool, default: bool) -> bool:
    return which if isinstance(which, bool) else config.flag(which, default)


def _llama_tensors(
    config: Config, arch: Arch, p: str, sizes: tuple[int, int, int, int]
) -> tuple[Tensor, ...]:
    """The attention tensors of one layer, with the biases the family's code builds.

    A bias a checkpoint holds beyond those is not used by transformers: check_tensors refuses it.
    """
    C, H, Hkv, D = sizes
    a = f"{p}{arch.attn}."
    o_default = arch.bias_default if arch.o_bias_default is None else arch.o_bias_default
    qkv_bias = _bias(config, arch.qkv_bias, arch.bias_default)
    o_bias = _bias(config, arch.o_bias, o_default)
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
        tensors.append(Tensor("norm.weight", f"{p}{arch.norm_name}.weight", (C,)))
    if arch.norm_bias:
        tensors.append(Tensor("norm.bias", f"{p}{arch.norm_name}.bias", (C,)))
    for variant in arch.variants:
        tensors += variant.tensors(a, sizes)
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
    elif arch.post_norm:
        notes.append(
            f"{family} applies post_attention_layernorm to o_proj's output before the residual "
            "add: projected is o_proj's output, before that norm"
        )
    notes += [v.note(family) for v in arch.variants if v.note is not None]
    if arch.gate:
        notes.append(
            "q_proj rows are per head [query | gate] (head_dim each): split into W_Q and gate.W_G; "
            "gated = output * sigmoid(gate) before o_proj, as transformers' Qwen3NextAttention"
        )
    return notes


def _rope(
    config: Config, arch: Arch, family: str, head_dim: int, layer: int, kind: str
) -> tuple[Rope | None, str]:
    """The layer's RoPE and its note; None, and why, on a layer without RoPE."""
    nope = _nope(config, arch, family, layer, kind)
    if nope:
        return None, nope
    return rope_of(config, arch, head_dim, kind)


def _nope(config: Config, arch: Arch, family: str, layer: int, kind: str) -> str:
    """Why this layer has no RoPE (transformers skips apply_rotary_pos_emb there), or ''."""
    if arch.nope == "listed" and not rope_listed(config, layer):
        return f"layer {layer} has no RoPE (no_rope_layers)"
    no_window = "sliding_window" in config.data and config.data["sliding_window"] is None
    if arch.nope != "full" or (no_window and arch.unwindowed == "rope"):
        return ""
    if arch.unwindowed == "nope" and no_window:
        return f"layer {layer} has no RoPE ({family} rotates only with a sliding_window)"
    if kind == "full_attention":
        return f"layer {layer} is a full-attention layer: no RoPE ({family})"
    return ""


def rope_listed(config: Config, layer: int) -> bool:
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
            "no_rope_layers", f"got {shown(given)}", f"a list of {layers} entries, each 0 or 1"
        )
    return bool(given[layer])


_MAX_WINDOW = (1 << 63) - 1  # a fixture's window is an int64, as its positions are


def _window(
    config: Config, arch: Arch, family: str, layer: int, layers: int
) -> tuple[int | None, str]:
    """The sliding window of this layer (HF ``sliding_window``) and a note saying why."""
    if arch.window == "none":
        return None, ""
    window = config.optional_whole("sliding_window", arch.window_default or 0, minimum=0)
    if arch.window_default is None and "sliding_window" not in config.data:
        window = None
    if arch.window_flag and not config.flag("use_sliding_window", False):
        return None, ""
    if window is None or (arch.window == "even_below_max_window_layers" and window == 0):
        return None, ""
    if window == 0:
        raise config.error("sliding_window", "got 0", "a whole number >= 1, or null")
    if arch.window == "all":  # the model masks every layer with sliding_window
        where = f"on every layer ({family})"
    elif _layer_type(config, arch, layer, layers) == "full_attention":
        return None, f"layer {layer} is a full-attention layer (layer_types)"
    else:
        where = f"on layer {layer} (layer_types: a sliding-window layer)"
    if window > _MAX_WINDOW:  # longer than any sequence: the window hides no key
        digits = len(str(window))
        shown = str(window) if digits <= 30 else f"of {digits:,} digits"
        return None, f"sliding window {shown} {where}: longer than any sequence, plain causal"
    return window, f"sliding window {window} {where}"


def _layer_type(config: Config, arch: Arch, layer: int, layers: int) -> str:
    """``layer_types[layer]``, or the default of the family's config class (no list is built)."""
    types = config.data.get("layer_types")
    linear = arch.linear
    kinds = ("linear_attention", "full_attention") if linear else LAYER_TYPES
    if types is not None:
        if (
            not isinstance(types, list)
            or len(types) != layers
            or any(t not in (*kinds, "attention") for t in types)
        ):
            raise config.error(
                "layer_types",
                f"got {shown(types)}",
                f"a list of {layers} entries, each {kinds[0]!r} or {kinds[1]!r}",
            )
        kind: str = types[layer]
        return "full_attention" if kind == "attention" else kind  # transformers' legacy name
    if linear:  # Qwen3NextConfig: full attention every full_attention_interval-th layer
        every = config.whole("full_attention_interval", linear)
        return "full_attention" if (layer + 1) % every == 0 else "linear_attention"
    return "sliding_attention" if _slides(config, arch, layer) else "full_attention"


def _slides(config: Config, arch: Arch, layer: int) -> bool:
    """Whether the config class's default layer_types makes this layer a sliding one."""
    if arch.window == "from_max_window_layers":
        return layer >= config.whole("max_window_layers", 28, minimum=0)
    if arch.window == "even_below_max_window_layers":
        first = config.whole("max_window_layers", 28, minimum=0)
        return config.flag("use_sliding_window", False) and layer < first and layer % 2 == 0
    if arch.window == "no_rope_layers":
        return (
            config.flag("use_sliding_window", False)
            and config.has("sliding_window")
            and (not rope_listed(config, layer))
        )
    if arch.window == "when_given":
        return config.has("sliding_window") or "sliding_window" not in config.data
    if arch.window != "types":
        return False
    unset = "sliding_window" in config.data and not config.has("sliding_window")
    if arch.unwindowed == "rope" and unset:
        return False  # no window: EXAONE 4's pattern is 0 (its class then fails on layer_types)
    pattern = arch.pattern
    for key in ("sliding_window_pattern", "_sliding_window_pattern"):
        if arch.pattern_keys and config.has(key):
            pattern = config.whole(key)
    return (layer + 1) % pattern != 0
