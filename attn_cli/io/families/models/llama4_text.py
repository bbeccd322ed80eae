"""Llama 4 (text; transformers 5.25 modeling_llama4.py, Llama4ForCausalLM): Llama's attention
with four conventions, each a variant shown as its own stage:

- chunked attention (``chunk``): on chunked_attention layers (layer_types; by default every
  layer with RoPE while attention_chunk_size is set) a query sees the keys of its own chunk of
  attention_chunk_size positions only, causally within it;
- layers without RoPE (no_rope_layers[i] 0; by default every no_rope_layer_interval-th): no
  rotation, full causal attention;
- the q/k "L2 norm" (``post_rope_norm`` without weights, eps rms_norm_eps): x / √(mean x² + eps)
  over each head AFTER the rotation, only on layers with RoPE, when use_qk_norm;
- attention temperature tuning (``temperature``, offset 1): only on layers without RoPE, the
  queries × (1 + attn_scale · ln(1 + ⌊(pos + 1) / floor_scale⌋)).

RoPE rotates interleaved pairs of every dim (a complex multiply), llama3-scaled as given. Past
attention: a dense MLP under feed_forward. (intermediate_size_mlp wide), or on moe_layers (by
default every interleave_moe_layer_step-th) Llama4TextMoe (experts.py's ``Llama4Mixture``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from attn_cli.io.families.arch import Arch
from attn_cli.io.families.blocks import Block, TensorOf, act, tensor_of
from attn_cli.io.families.config import Config, shown
from attn_cli.io.families.decoder import family, llama_like, rope_listed
from attn_cli.io.families.experts import Llama4Mixture, shared_mlp
from attn_cli.io.families.keys import FULL_ROPE, LLAMA_ASSUMED, LLAMA_READS, Keys
from attn_cli.io.families.plan import BlockPlan, Experts, LayerPlan, Norm

NAME = "llama4_text"
ARCH = Arch(theta=5e5, eps=("rms_norm_eps", 1e-5), layout="interleaved", nope="listed")
KINDS = ("chunked_attention", "full_attention")


def _chunk(config: Config, layer: int, layers: int) -> int | None:
    """The layer's chunk size (attention_chunk_size, 8192 where config.json leaves it out), or
    None on a full_attention layer; layer_types' default: chunked where the layer has RoPE."""
    size = config.optional_whole("attention_chunk_size", 8192)
    types = config.data.get("layer_types")
    if types is None:
        return size if rope_listed(config, layer) else None
    if not isinstance(types, list) or len(types) != layers or any(t not in KINDS for t in types):
        each = " or ".join(repr(k) for k in KINDS)
        raise config.error("layer_types", f"got {shown(types)}", f"a list of {layers}, each {each}")
    if size is None and KINDS[0] in types:  # transformers' chunked mask raises
        raise config.error(
            "attention_chunk_size", "null beside chunked_attention layers", "a whole number >= 1"
        )
    return size if types[layer] == KINDS[0] else None


def _temperature(config: Config) -> dict[str, Any] | None:
    """The temperature's setting (read, and checked, on every layer), None when it is off."""
    floor = config.number("floor_scale", 8192.0)
    scale = config.number("attn_scale", 0.1, positive=False)
    if not config.flag("attn_temperature_tuning", True):
        return None
    return {"floor_scale": floor, "attn_scale": scale, "offset": 1}


def plan(config: Config, layer: int) -> LayerPlan:
    """Layer ``layer``'s attention: Llama's with interleaved RoPE where no_rope_layers keeps it,
    then the chunk mask, the L2 norm after RoPE or the temperature, as the layer has them."""
    # layer_types is read here: the base reads windows from it, and Llama 4 has none
    data = {k: v for k, v in config.data.items() if k != "layer_types"}
    base = llama_like(ARCH, NAME, Config(data, config.source, config.path), layer)
    layers = base.layers  # the layer checked against them
    chunk = _chunk(config, layer, layers)
    temperature = _temperature(config)
    qk_norm = config.flag("use_qk_norm", True)
    variants, notes = dict(base.variants), list(base.notes)
    if chunk is not None:
        variants["chunk"] = chunk
        notes.append(f"chunked attention on layer {layer}: chunks of {chunk} positions")
    if "rope" in variants and qk_norm:
        assert base.pre_norm is not None  # its eps is rms_norm_eps, the L2 norm's
        variants["post_rope_norm"] = {"eps": base.pre_norm.eps}
        notes.append(f"q/k L2 norm after RoPE on layer {layer} (weightless RMS over head_dim)")
    if "rope" not in variants and temperature is not None:
        variants["temperature"] = temperature
        notes.append(
            f"attention temperature tuning on layer {layer}'s queries (a layer without RoPE)"
        )
    if layer in _moe_layers(config, layers):  # past attention: not traced, in the forward
        notes.append(
            f"layer {layer}'s MLP is a mixture of experts (moe_layers): each chosen expert takes "
            "the token scaled by sigmoid(its router logit), plus a shared expert"
        )
    return replace(base, variants=variants, positions=True, notes=tuple(notes))


def _moe_layers(config: Config, layers: int) -> list[int]:
    """moe_layers, else every interleave_moe_layer_step-th layer (Llama4TextConfig's default)."""
    step = config.whole("interleave_moe_layer_step", 1)
    given = config.data.get("moe_layers")
    if given is None:
        return list(range(step - 1, layers, step))
    if not isinstance(given, list) or any(type(i) is not int or not 0 <= i < layers for i in given):
        raise config.error(
            "moe_layers", f"got {shown(given)}", f"a list of layer numbers 0 to {layers - 1}"
        )
    return given


def _experts(cfg: Config, plan: LayerPlan, t: TensorOf) -> Experts:
    """Llama4TextMoe: the router, the experts stacked (gate_up_proj [E, C, 2F], down_proj
    [E, F, C], F = intermediate_size), the shared expert (F wide) on every token."""
    C, a = plan.hidden, "feed_forward."
    E, F = cfg.whole("num_local_experts", 16), cfg.whole("intermediate_size", 8192)
    k = min(cfg.whole("num_experts_per_tok", 1), E)
    router = t("router", f"{a}router.weight", E, C)
    mixture = Llama4Mixture(
        router,
        t("experts.gate_up", f"{a}experts.gate_up_proj", E, C, 2 * F),
        t("experts.down", f"{a}experts.down_proj", E, F, C),
        shared_mlp(t, f"{a}shared_expert.", F, C),
        k,
    )
    return Experts(router, lambda e: (), E, k, False, own=mixture)


def block(cfg: Config, plan: LayerPlan) -> BlockPlan:
    """Llama4TextDecoderLayer past attention: post_attention_layernorm, then the mixture on a
    MoE layer, else the dense MLP intermediate_size_mlp wide (Llama4TextMLP)."""
    C, t = plan.hidden, tensor_of(plan)
    norms = {"mlp_in": Norm("rms", cfg.number("rms_norm_eps", 1e-5), "mlp_in.weight")}
    weight = t("mlp_in.weight", "post_attention_layernorm.weight", C)
    activation = act(cfg, "hidden_act", "silu")
    if plan.layer in _moe_layers(cfg, plan.layers):
        experts = _experts(cfg, plan, t)
        return BlockPlan("pre", norms, "moe", False, activation, (weight,), experts)
    F, a = cfg.whole("intermediate_size_mlp", 16384), "feed_forward."
    mlp = (
        t("gate.weight", f"{a}gate_proj.weight", F, C),
        t("up.weight", f"{a}up_proj.weight", F, C),
        t("down.weight", f"{a}down_proj.weight", C, F),
    )
    return BlockPlan("pre", norms, "gated", False, activation, (*mlp, weight))


KEYS = Keys(
    reads=LLAMA_READS
    | {
        "attention_bias",
        "attention_chunk_size",
        "layer_types",
        "no_rope_layers",
        "no_rope_layer_interval",
        "use_qk_norm",
        "attn_temperature_tuning",
        "floor_scale",
        "attn_scale",
        "interleave_moe_layer_step",
        "moe_layers",
        "intermediate_size_mlp",
    },
    ignored={"partial_rotary_factor": FULL_ROPE},
    assumed=LLAMA_ASSUMED,
)
FAMILY = replace(
    family(
        NAME,
        ARCH,
        KEYS,
        Block(eps_key=ARCH.eps),
        hf_class="Llama4ForCausalLM",
        shows="chunked attention, layers without RoPE, the q/k L2 norm after RoPE, attention "
        "temperature tuning; the MoE (expert inputs scaled by the sigmoid router) in the forward",
        arch_refused="llama4_text's RoPE on interleaved pairs shows in no config.json key, so "
        "--arch llama4_text cannot tell a Llama 4 from a Llama",
    ),
    plan=plan,
    block=block,
)
