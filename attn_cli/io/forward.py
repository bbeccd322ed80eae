"""A checkpoint's forward pass from a text, in NumPy: the residual stream entering any layer.

The text is embedded as for layer 0 (``checkpoint.embed_tokens``); each layer below is then computed
whole: its attention is attn's own traced layer (the fixture ``attn import`` writes, run through
the one pipeline, so RoPE and its scaling, GQA, windows, softcaps, QK-norm are the traced ones),
its MLP and norms by ``core/forward.py``. One layer's tensors are read at a time (the attention's,
then the MLP's) and dropped before the next layer's are read.

Families whose whole block is written here and checked against transformers
(tests/reference/forward/): BLOCK_FAMILIES (the LayerNorm decoders StarCoder2, StableLM, Phi,
Cohere and the encoder DistilBERT in ``_dense_b_block``; the dense decoders of _DENSE_A with
their own norms and multipliers in ``_dense_a_block``: OLMo's LayerNorm without parameters,
OLMo 3's and EXAONE 4's post-norms, GLM-4's four norms and fused MLP, Granite's
residual_multiplier and logits_scaling). Qwen3-Next's linear_attention layers run as their
gated_deltanet fixture (no softmax map: such a layer's weights hold no heads); its MoE,
gpt-oss's (stacked experts with biases, the clamped swiglu, the router's bias), DeepSeek V3's
(dense below first_k_dense_replace, then the grouped sigmoid router and shared experts) and
DeepSeek V2's (the same with its softmax router, greedy or group-limited) are ``Experts``;
Cohere 2 runs Cohere's block. Any other family is refused in one line for a layer past 0
(its layer 0 needs no forward).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from attn_cli.core import forward as fw
from attn_cli.errors import InputError, UsageError
from attn_cli.io import checkpoint as ck
from attn_cli.io import gate
from attn_cli.io.families import (
    ARCHS,
    ROBERTA_LIKE,
    WRAPPERS,
    Config,
    LayerPlan,
    Norm,
    NormKind,
    Tensor,
    check_keys,
    check_tensors,
    plan_layer,
    prefix_of,
    resolve_family,
    text_config,
)

FloatArray = np.ndarray[Any, np.dtype[np.floating[Any]]]

# StarCoder2, StableLM, Phi, Cohere (LayerNorm decoders, Phi's and Cohere's parallel blocks)
# and DistilBERT (a post-norm encoder): _dense_b_block, _dense_b_head
_DENSE_B = ("starcoder2", "stablelm", "phi", "cohere", "distilbert", "cohere2")
_COHERE = ("cohere", "cohere2")  # one parallel block, Cohere 2's sliding windows in its attention
# Dense decoders whose blocks differ from Llama's in norms, multipliers or a fused MLP.
_DENSE_A = ("ministral", "smollm3", "olmo", "olmo3", "exaone4", "granite", "glm4", "ernie4_5")
# The families whose blocks (norm placement, MLP) are written and checked against transformers.
BLOCK_FAMILIES: tuple[str, ...] = (
    "bert",
    *ROBERTA_LIKE,
    "gpt2",
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "gemma3",
    "olmo2",
    "phi3",
    "gpt_neox",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    *_DENSE_B,
    *_DENSE_A,
)
# the mixture-of-experts families of issue 25's third group, each checked as the others are
BLOCK_FAMILIES += ("qwen3_next", "gpt_oss", "deepseek_v3", "deepseek_v2")
# 1 + w RMSNorms (Gemma's, Qwen3-Next's zero-centred ones) around the MLP and at the end
_RMS1P = ("gemma", "gemma2", "gemma3_text", "qwen3_next")
_ENCODERS = ("bert", *ROBERTA_LIKE)


@dataclass(frozen=True)
class BlockPlan:
    """One block past its attention: where the norms sit, the MLP's tensors and activation."""

    placement: fw.Placement
    norms: Mapping[str, Norm]  # by role: attn_out, mlp_in, mlp_out
    mlp: str  # "dense", "gated", "gated_fused", "moe"
    conv1d: bool  # GPT-2's Conv1D is [in, out] already
    act: str
    tensors: tuple[Tensor, ...]
    experts: Experts | None = None  # a mixture of experts in place of the MLP (mlp "moe")
    residual: float | None = None  # Granite's residual_multiplier on both branches


@dataclass(frozen=True)
class Experts:
    """A mixture of experts: the router's tensor, each expert's gate/up/down (read only when a
    token chooses it), top-k, renormalised or not, and Qwen2-MoE's gated shared expert."""

    router: Tensor
    each: Callable[[int], tuple[Tensor, ...]]  # expert e's gate, up, down (none: stacked)
    count: int
    k: int
    normalize: bool
    shared: tuple[Tensor, Tensor, Tensor, Tensor] | None = None  # gate, up, down, its sigmoid gate
    router_bias: Tensor | None = None  # gpt-oss: added to the router's logits
    stacked: Stacked | None = None  # gpt-oss: every expert in one tensor each
    grouped: Grouped | None = None  # DeepSeek V3's sigmoid router
    plain_shared: tuple[Tensor, Tensor, Tensor] | None = None  # DeepSeek V3: gate, up, down
    greedy: Greedy | None = None  # DeepSeek V2's softmax router


@dataclass(frozen=True)
class Stacked:
    """gpt-oss's experts (GptOssExperts): expert e is row e of each tensor, [in, out] already;
    gate_up's columns interleave gate and up; biases; the clamped swiglu."""

    gate_up: Tensor  # (E, C, 2F)
    gate_up_bias: Tensor  # (E, 2F)
    down: Tensor  # (E, F, C)
    down_bias: Tensor  # (E, C)
    alpha: float  # swiglu_alpha
    limit: float  # swiglu_limit

    def tensors(self) -> tuple[Tensor, ...]:
        return (self.gate_up, self.gate_up_bias, self.down, self.down_bias)


@dataclass(frozen=True)
class Grouped:
    """DeepSeek V3's router (DeepseekV3TopkRouter): sigmoid scores, the choice moved by
    e_score_correction_bias and kept to the best topk_group of n_group groups."""

    correction: Tensor  # e_score_correction_bias (E,)
    groups: tuple[int, int]  # n_group, topk_group
    scale: float  # routed_scaling_factor


@dataclass(frozen=True)
class Greedy:
    """DeepSeek V2's router (DeepseekV2TopkRouter): softmax over every expert, the top k
    (topk_method greedy) or the top k within the topk_group best of n_group groups, a group
    worth its best score (group_limited_greedy); the weights not renormalised, times
    routed_scaling_factor."""

    groups: tuple[int, int] | None  # n_group, topk_group; None: greedy
    scale: float  # routed_scaling_factor


@dataclass(frozen=True)
class HeadPlan:
    """The final norm and the LM head."""

    norm: Norm | None
    tensors: tuple[Tensor, ...]  # the norm's, then "head" (the LM head or the tied embeddings)
    softcap: float | None
    bias: Tensor | None = None  # the LM head's bias (Phi)
    logit_scale: float | None = None  # logits times this (Cohere's logit_scale)
    divide: float | None = None  # Granite's logits_scaling: logits / it


@dataclass
class Walk:
    """What the forward computed: tokens, each layer's attention weights, the residual stream."""

    family: str
    layers: int
    tokens: list[str]
    ids: list[int]
    weights: list[FloatArray] = field(default_factory=list)  # per layer (heads, T, T)
    residual: FloatArray | None = None  # entering layer ``through`` (or leaving the last)
    entering: list[FloatArray] = field(default_factory=list)  # per layer, when kept
    logits: FloatArray | None = None  # (T, vocab)
    notes: list[str] = field(default_factory=list)
    head_types: list[str] = field(default_factory=list)
    # called with each layer's whole trace (every stage kept) when set: the model view's page
    each_trace: Callable[[int, Any], None] | None = None


def _refuse_family(source: str, family: str, what: str) -> None:
    if family in BLOCK_FAMILIES:
        return
    why = "its block (norm placement, MLP) is not written and checked against transformers"
    raise InputError(
        source,
        "model_type",
        f"{family}: computing {what} takes the forward through the layers below, and {why}",
        "one of " + ", ".join(BLOCK_FAMILIES) + " (or layer 0)",
        option="layer",
    )


def _block_config(cfg: Config, family: str) -> tuple[Config, str]:
    """The config and family of the text model (a wrapper's text_config)."""
    if family in WRAPPERS:
        return text_config(cfg, family), WRAPPERS[family].text
    return cfg, family


def _act(cfg: Config, key: str, default: str) -> str:
    value = cfg.text(key, default)
    if value not in fw.ACTIVATIONS:
        raise cfg.error(key, f"got {value!r}", "one of " + ", ".join(fw.ACTIVATIONS))
    return str(value)


def block_plan(cfg: Config, family: str, plan: LayerPlan) -> BlockPlan:
    """The block of ``plan``'s layer past its attention, from config.json (family's defaults)."""
    cfg, family = _block_config(cfg, family)
    C, p = plan.hidden, plan.block

    def t(role: str, name: str, *shape: int) -> Tensor:
        return Tensor(role, p + name, shape)

    if family in _ENCODERS:
        F = cfg.whole("intermediate_size", 3072)
        eps = cfg.number("layer_norm_eps", 1e-12)
        tensors: tuple[Tensor, ...] = (
            t("a.w", "attention.output.LayerNorm.weight", C),
            t("a.b", "attention.output.LayerNorm.bias", C),
            t("in.weight", "intermediate.dense.weight", F, C),
            t("in.bias", "intermediate.dense.bias", F),
            t("out.weight", "output.dense.weight", C, F),
            t("out.bias", "output.dense.bias", C),
            t("m.w", "output.LayerNorm.weight", C),
            t("m.b", "output.LayerNorm.bias", C),
        )
        norms = {
            "attn_out": Norm("layer", eps, "a.w", "a.b"),
            "mlp_out": Norm("layer", eps, "m.w", "m.b"),
        }
        return BlockPlan("post", norms, "dense", False, _act(cfg, "hidden_act", "gelu"), tensors)
    if family == "gpt2":
        F = cfg.whole("n_inner", 4 * C)
        eps = cfg.number("layer_norm_epsilon", 1e-5)
        tensors = (
            t("n.w", "ln_2.weight", C),
            t("n.b", "ln_2.bias", C),
            t("in.weight", "mlp.c_fc.weight", C, F),
            t("in.bias", "mlp.c_fc.bias", F),
            t("out.weight", "mlp.c_proj.weight", F, C),
            t("out.bias", "mlp.c_proj.bias", C),
        )
        act = _act(cfg, "activation_function", "gelu_new")
        return BlockPlan(
            "pre", {"mlp_in": Norm("layer", eps, "n.w", "n.b")}, "dense", True, act, tensors
        )
    if family == "gpt_neox":
        F = cfg.whole("intermediate_size")
        eps = cfg.number("layer_norm_eps", 1e-5)
        tensors = (
            t("n.w", "post_attention_layernorm.weight", C),
            t("n.b", "post_attention_layernorm.bias", C),
            t("in.weight", "mlp.dense_h_to_4h.weight", F, C),
            t("in.bias", "mlp.dense_h_to_4h.bias", F),
            t("out.weight", "mlp.dense_4h_to_h.weight", C, F),
            t("out.bias", "mlp.dense_4h_to_h.bias", C),
        )
        placement: fw.Placement = "parallel" if cfg.flag("use_parallel_residual", True) else "pre"
        return BlockPlan(
            placement,
            {"mlp_in": Norm("layer", eps, "n.w", "n.b")},
            "dense",
            False,
            _act(cfg, "hidden_act", "gelu"),
            tensors,
        )
    if family in _DENSE_A:
        return _dense_a_block(cfg, family, plan, t)
    if family in _DENSE_B:
        return _dense_b_block(cfg, family, plan, t)
    return _decoder_block(cfg, family, plan, t)


def _dense_a_block(
    cfg: Config, family: str, plan: LayerPlan, t: Callable[..., Tensor]
) -> BlockPlan:
    """_DENSE_A's blocks (transformers' modeling_<family>.py): a gate/up/down MLP (GLM-4's
    fused gate_up_proj, rows gate then up), biases by mlp_bias (SmolLM3, Granite) or use_bias
    (ERNIE 4.5); norms as the attention's (OLMo: LayerNorm without parameters)."""
    C, F = plan.hidden, cfg.whole("intermediate_size")
    norm = _dense_a_norm(cfg, family)
    if family == "glm4":
        mlp = [
            t("gate_up.weight", "mlp.gate_up_proj.weight", 2 * F, C),
            t("down.weight", "mlp.down_proj.weight", C, F),
        ]
    else:
        mlp = [
            t(f"{x}.weight", f"mlp.{x}_proj.weight", *((C, F) if x == "down" else (F, C)))
            for x in ("gate", "up", "down")
        ]
    bias = {"smollm3": "mlp_bias", "granite": "mlp_bias", "ernie4_5": "use_bias"}.get(family)
    if bias is not None and cfg.flag(bias, False):
        mlp += [
            t(f"{x}.bias", f"mlp.{x}_proj.bias", F if x != "down" else C)
            for x in ("gate", "up", "down")
        ]
    placement: fw.Placement
    if family in ("olmo3", "exaone4"):  # norms after attention and MLP only, as OLMo 2's
        placement = "post_only"
        names = {"attn_out": "post_attention_layernorm", "mlp_out": "post_feedforward_layernorm"}
    elif family == "glm4":  # input_layernorm (the attention's), then three more
        placement = "sandwich"
        names = {
            "attn_out": "post_self_attn_layernorm",
            "mlp_in": "post_attention_layernorm",
            "mlp_out": "post_mlp_layernorm",
        }
    else:
        placement, names = "pre", {"mlp_in": "post_attention_layernorm"}
    if norm.weight is None:  # OLMo: nothing to read
        norms, weights = dict.fromkeys(names, norm), []
    else:
        norms = {r: Norm(norm.kind, norm.eps, f"{r}.weight") for r in names}
        weights = [t(f"{r}.weight", f"{n}.weight", C) for r, n in names.items()]
    residual = cfg.number("residual_multiplier", 1.0) if family == "granite" else None
    kind = "gated_fused" if family == "glm4" else "gated"
    act = _act(cfg, "hidden_act", "silu")
    return BlockPlan(placement, norms, kind, False, act, (*mlp, *weights), residual=residual)


def _dense_a_norm(cfg: Config, family: str) -> Norm:
    """The family's norm, as its attention plan reads it: RMSNorm with the class's eps default,
    OLMo's LayerNorm with eps 1e-5 and no weight or bias (weight role "w" otherwise)."""
    key, default = ARCHS[family].eps
    eps = default if key is None else cfg.number(key, default)
    return Norm("layer", eps, None) if family == "olmo" else Norm("rms", eps, "w")


def _dense_b_block(
    cfg: Config, family: str, plan: LayerPlan, t: Callable[..., Tensor]
) -> BlockPlan:
    """StarCoder2 and StableLM (pre-norm; StableLM's use_parallel_residual), Phi and Cohere
    (attention and MLP in parallel from the one input_layernorm), DistilBERT (post-norm)."""
    C = plan.hidden
    if family == "distilbert":  # TransformerBlock: its LayerNorms' eps is fixed at 1e-12
        F = cfg.whole("hidden_dim", 4 * C)
        tensors: tuple[Tensor, ...] = (
            t("a.w", "sa_layer_norm.weight", C),
            t("a.b", "sa_layer_norm.bias", C),
            t("in.weight", "ffn.lin1.weight", F, C),
            t("in.bias", "ffn.lin1.bias", F),
            t("out.weight", "ffn.lin2.weight", C, F),
            t("out.bias", "ffn.lin2.bias", C),
            t("m.w", "output_layer_norm.weight", C),
            t("m.b", "output_layer_norm.bias", C),
        )
        norms = {
            "attn_out": Norm("layer", 1e-12, "a.w", "a.b"),
            "mlp_out": Norm("layer", 1e-12, "m.w", "m.b"),
        }
        return BlockPlan("post", norms, "dense", False, _act(cfg, "activation", "gelu"), tensors)
    assert plan.pre_norm is not None  # input_layernorm: its eps is the block's norms' eps
    F, eps = cfg.whole("intermediate_size"), plan.pre_norm.eps
    parallel = family in ("phi", *_COHERE) or (
        family == "stablelm" and cfg.flag("use_parallel_residual", False)
    )
    # the MLP's norm: a second LayerNorm, or (parallel) input_layernorm read once more
    n = "input_layernorm" if parallel else "post_attention_layernorm"
    bias = family not in _COHERE  # Cohere's LayerNorm has no bias
    norm_t = (t("n.w", f"{n}.weight", C), *([t("n.b", f"{n}.bias", C)] if bias else []))
    norms = {"mlp_in": Norm("layer", eps, "n.w", "n.b" if bias else None)}
    placement: fw.Placement = "parallel" if parallel else "pre"
    mlp: tuple[Tensor, ...]
    if family in ("stablelm", *_COHERE):  # SwiGLU without biases
        mlp = (
            t("gate.weight", "mlp.gate_proj.weight", F, C),
            t("up.weight", "mlp.up_proj.weight", F, C),
            t("down.weight", "mlp.down_proj.weight", C, F),
        )
        act = _act(cfg, "hidden_act", "silu")
        return BlockPlan(placement, norms, "gated", False, act, (*norm_t, *mlp))
    up, down = ("mlp.c_fc.", "mlp.c_proj.") if family == "starcoder2" else ("mlp.fc1.", "mlp.fc2.")
    mlp = (t("in.weight", f"{up}weight", F, C), t("out.weight", f"{down}weight", C, F))
    if family == "phi" or cfg.flag("use_bias", True):  # StarCoder2's use_bias
        mlp += (t("in.bias", f"{up}bias", F), t("out.bias", f"{down}bias", C))
    act = _act(cfg, "hidden_act", "gelu_new" if family == "phi" else "gelu_pytorch_tanh")
    return BlockPlan(placement, norms, "dense", False, act, (*norm_t, *mlp))


def _decoder_block(
    cfg: Config, family: str, plan: LayerPlan, t: Callable[..., Tensor]
) -> BlockPlan:
    """Llama-like blocks: gate/up/down MLP (Phi-3's fused gate_up_proj), RMSNorms."""
    C = plan.hidden
    F = cfg.whole("intermediate_size")
    kind: NormKind = "rms1p" if family in _RMS1P else "rms"
    eps = cfg.number("rms_norm_eps", 1e-5 if family in ("olmo2", "phi3", "gpt_oss") else 1e-6)
    experts = _experts(cfg, family, plan, t)
    mlp = [] if experts else [t("down.weight", "mlp.down_proj.weight", C, F)]
    if experts:
        pass
    elif family == "phi3":
        mlp.append(t("gate_up.weight", "mlp.gate_up_proj.weight", 2 * F, C))
    else:
        mlp += [
            t("gate.weight", "mlp.gate_proj.weight", F, C),
            t("up.weight", "mlp.up_proj.weight", F, C),
        ]
    if cfg.flag("mlp_bias", False) and not experts:
        if family == "phi3":
            raise cfg.error("mlp_bias", "got true", "false (Phi-3's MLP has no biases)")
        mlp += [
            t(f"{x}.bias", f"mlp.{x}_proj.bias", F if x != "down" else C)
            for x in ("gate", "up", "down")
        ]
    names = {
        "attn_out": "post_attention_layernorm",
        "mlp_in": "pre_feedforward_layernorm",
        "mlp_out": "post_feedforward_layernorm",
    }
    placement: fw.Placement
    roles: tuple[str, ...]
    if family in ("gemma2", "gemma3_text"):
        placement, roles = "sandwich", ("attn_out", "mlp_in", "mlp_out")
    elif family == "olmo2":
        placement, roles = "post_only", ("attn_out", "mlp_out")
    else:
        placement, roles = "pre", ("mlp_in",)
        names["mlp_in"] = "post_attention_layernorm"
    norms = {r: Norm(kind, eps, f"{r}.weight") for r in roles}
    tensors = (*mlp, *(t(f"{r}.weight", f"{names[r]}.weight", C) for r in roles))
    if family in ("gemma2", "gemma3_text"):
        act = _act(cfg, "hidden_activation", "gelu_pytorch_tanh")
    else:
        act = _act(cfg, "hidden_act", "silu")
    fused = "moe" if experts else "gated_fused" if family == "phi3" else "gated"
    return BlockPlan(placement, norms, fused, False, act, tensors, experts)


def _experts(cfg: Config, family: str, plan: LayerPlan, t: Callable[..., Tensor]) -> Experts | None:
    """The layer's mixture of experts (Mixtral's block_sparse_moe, Qwen's sparse mlp), or None
    for a dense MLP (every other family; Qwen's mlp_only_layers and decoder_sparse_step)."""
    C, layer = plan.hidden, plan.layer
    if family in _OWN_EXPERTS:
        return _OWN_EXPERTS[family](cfg, plan, t)
    if family == "mixtral":
        E, F = cfg.whole("num_local_experts", 8), cfg.whole("intermediate_size")
        k = cfg.whole("num_experts_per_tok", 2)
        a = "block_sparse_moe."
        return Experts(
            t("router", f"{a}gate.weight", E, C),
            lambda e: (
                t(f"e{e}.gate", f"{a}experts.{e}.w1.weight", F, C),
                t(f"e{e}.up", f"{a}experts.{e}.w3.weight", F, C),
                t(f"e{e}.down", f"{a}experts.{e}.w2.weight", C, F),
            ),
            E,
            min(k, E),
            True,
        )
    if family not in _QWEN_MOE:
        return None
    E_default, k_default, normalize = _QWEN_MOE[family]
    key = "num_local_experts" if cfg.has("num_local_experts") else "num_experts"  # 5's and 4's
    E = cfg.whole(key, E_default, minimum=0)
    only = cfg.data.get("mlp_only_layers") or []
    if not isinstance(only, list) or any(type(i) is not int for i in only):
        raise cfg.error("mlp_only_layers", f"got {only!r}", "a list of layer numbers")
    if layer in only or E == 0 or (layer + 1) % cfg.whole("decoder_sparse_step", 1) != 0:
        return None
    F = cfg.whole("moe_intermediate_size")
    k = cfg.whole("num_experts_per_tok", k_default)
    shared = None
    if family != "qwen3_moe":  # Qwen2-MoE's and Qwen3-Next's gated shared expert
        S = cfg.whole("shared_expert_intermediate_size")
        shared = (
            t("s.gate", "mlp.shared_expert.gate_proj.weight", S, C),
            t("s.up", "mlp.shared_expert.up_proj.weight", S, C),
            t("s.down", "mlp.shared_expert.down_proj.weight", C, S),
            t("s.sigmoid", "mlp.shared_expert_gate.weight", 1, C),
        )
    return Experts(
        t("router", "mlp.gate.weight", E, C),
        lambda e: (
            t(f"e{e}.gate", f"mlp.experts.{e}.gate_proj.weight", F, C),
            t(f"e{e}.up", f"mlp.experts.{e}.up_proj.weight", F, C),
            t(f"e{e}.down", f"mlp.experts.{e}.down_proj.weight", C, F),
        ),
        E,
        min(k, E),
        cfg.flag("norm_topk_prob", normalize),
        shared,
    )


# Qwen's sparse MLPs: the config classes' defaults of num_experts, num_experts_per_tok and
# norm_topk_prob
_QWEN_MOE = {
    "qwen2_moe": (60, 4, False),
    "qwen3_moe": (128, 8, False),
    "qwen3_next": (512, 10, True),
}


def _gpt_oss_experts(cfg: Config, plan: LayerPlan, t: Callable[..., Tensor]) -> Experts:
    """gpt-oss's MLP on every layer (GptOssMLP): the router with its bias, the top k logits'
    softmax, each chosen expert a row of the stacked tensors with biases, the clamped swiglu."""
    C = plan.hidden
    E, F = cfg.whole("num_local_experts", 128), cfg.whole("intermediate_size", 2880)
    k = cfg.whole("num_experts_per_tok", 4)
    a = "mlp.experts."
    stacked = Stacked(
        t("experts.gate_up", f"{a}gate_up_proj", E, C, 2 * F),
        t("experts.gate_up_bias", f"{a}gate_up_proj_bias", E, 2 * F),
        t("experts.down", f"{a}down_proj", E, F, C),
        t("experts.down_bias", f"{a}down_proj_bias", E, C),
        cfg.number("swiglu_alpha", 1.702),
        cfg.number("swiglu_limit", 7.0),
    )
    return Experts(
        t("router", "mlp.router.weight", E, C),
        lambda e: (),
        E,
        min(k, E),
        True,
        router_bias=t("router.bias", "mlp.router.bias", E),
        stacked=stacked,
    )


def _deepseek_experts(cfg: Config, plan: LayerPlan, t: Callable[..., Tensor]) -> Experts | None:
    """DeepSeek V3's MoE (DeepseekV3MoE) from layer first_k_dense_replace on (a dense MLP
    below): the grouped sigmoid router, the routed experts, and the shared experts (one MLP
    n_shared_experts × moe_intermediate_size wide, ungated) added to every token."""
    C = plan.hidden
    if plan.layer < cfg.whole("first_k_dense_replace", 3, minimum=0):
        return None
    E, F = cfg.whole("n_routed_experts", 256), cfg.whole("moe_intermediate_size", 2048)
    k = cfg.whole("num_experts_per_tok", 8)
    groups = (cfg.whole("n_group", 8), cfg.whole("topk_group", 4))
    if E % groups[0] or groups[1] > groups[0]:
        raise cfg.error(
            "n_group",
            f"{groups[0]} groups of {E} experts, the best {groups[1]} kept",
            "a divisor of n_routed_experts, at least topk_group",
        )
    S = F * cfg.whole("n_shared_experts", 1)
    grouped = Grouped(
        t("router.correction", "mlp.gate.e_score_correction_bias", E),
        groups,
        cfg.number("routed_scaling_factor", 2.5),
    )
    return Experts(
        t("router", "mlp.gate.weight", E, C),
        lambda e: (
            t(f"e{e}.gate", f"mlp.experts.{e}.gate_proj.weight", F, C),
            t(f"e{e}.up", f"mlp.experts.{e}.up_proj.weight", F, C),
            t(f"e{e}.down", f"mlp.experts.{e}.down_proj.weight", C, F),
        ),
        E,
        min(k, E),
        cfg.flag("norm_topk_prob", True),
        grouped=grouped,
        plain_shared=(
            t("s.gate", "mlp.shared_experts.gate_proj.weight", S, C),
            t("s.up", "mlp.shared_experts.up_proj.weight", S, C),
            t("s.down", "mlp.shared_experts.down_proj.weight", C, S),
        ),
    )


def _deepseek_v2_experts(cfg: Config, plan: LayerPlan, t: Callable[..., Tensor]) -> Experts | None:
    """DeepSeek V2's MoE (DeepseekV2Moe) from layer first_k_dense_replace on: the softmax
    router (``Greedy``), the routed experts and the shared experts, ungated, on every token."""
    C = plan.hidden
    if plan.layer < cfg.whole("first_k_dense_replace", 0, minimum=0):
        return None
    E, F = cfg.whole("n_routed_experts", 64), cfg.whole("moe_intermediate_size", 1407)
    k = cfg.whole("num_experts_per_tok")
    method = cfg.text("topk_method", "greedy")
    if method not in ("greedy", "group_limited_greedy"):
        raise cfg.error("topk_method", f"got {method!r}", "greedy or group_limited_greedy")
    groups = None
    if method == "group_limited_greedy":
        groups = (cfg.whole("n_group"), cfg.whole("topk_group"))
        if E % groups[0] or groups[1] > groups[0]:
            raise cfg.error(
                "n_group",
                f"{groups[0]} groups of {E} experts, the best {groups[1]} kept",
                "a divisor of n_routed_experts, at least topk_group",
            )
    S = F * cfg.whole("n_shared_experts", 2)
    return Experts(
        t("router", "mlp.gate.weight", E, C),
        lambda e: (
            t(f"e{e}.gate", f"mlp.experts.{e}.gate_proj.weight", F, C),
            t(f"e{e}.up", f"mlp.experts.{e}.up_proj.weight", F, C),
            t(f"e{e}.down", f"mlp.experts.{e}.down_proj.weight", C, F),
        ),
        E,
        min(k, E),
        False,
        greedy=Greedy(groups, cfg.number("routed_scaling_factor", 1.0)),
        plain_shared=(
            t("s.gate", "mlp.shared_experts.gate_proj.weight", S, C),
            t("s.up", "mlp.shared_experts.up_proj.weight", S, C),
            t("s.down", "mlp.shared_experts.down_proj.weight", C, S),
        ),
    )


_OWN_EXPERTS: dict[str, Callable[[Config, LayerPlan, Callable[..., Tensor]], Experts | None]] = {
    "gpt_oss": _gpt_oss_experts,
    "deepseek_v3": _deepseek_experts,
    "deepseek_v2": _deepseek_v2_experts,
}


def head_plan(cfg: Config, family: str, plan: LayerPlan, names: set[str], prefix: str) -> HeadPlan:
    """The final norm and the LM head (or the tied embeddings) of a decoder."""
    cfg, family = _block_config(cfg, family)
    C, V = plan.hidden, plan.embed_tensors[0].shape[0]
    if family in _ENCODERS or family == "distilbert":
        raise InputError(
            cfg.source,
            "model_type",
            f"{family} is an encoder: its checkpoint has no LM head predicting a next token",
            "a decoder checkpoint (for the logits)",
            option="check-logits",
        )
    if family in _DENSE_B:
        return _dense_b_head(cfg, family, plan, names, prefix)
    norm_t: tuple[str, ...]
    if family == "gpt2":
        eps = cfg.number("layer_norm_epsilon", 1e-5)
        norm, norm_t = Norm("layer", eps, "f.w", "f.b"), ("ln_f.weight", "ln_f.bias")
    elif family == "gpt_neox":
        eps = cfg.number("layer_norm_eps", 1e-5)
        norm = Norm("layer", eps, "f.w", "f.b")
        norm_t = ("final_layer_norm.weight", "final_layer_norm.bias")
    elif family in _DENSE_A:
        norm = _dense_a_norm(cfg, family)
        norm, norm_t = (
            (norm, ()) if norm.weight is None else (replace(norm, weight="f.w"), ("norm.weight",))
        )
    else:
        kind: NormKind = "rms1p" if family in _RMS1P else "rms"
        eps = cfg.number("rms_norm_eps", 1e-5 if family in ("olmo2", "phi3", "gpt_oss") else 1e-6)
        norm, norm_t = Norm(kind, eps, "f.w"), ("norm.weight",)
    tensors = [Tensor(role, name, (C,)) for role, name in zip(("f.w", "f.b"), norm_t, strict=False)]
    own = "embed_out.weight" if family == "gpt_neox" else "lm_head.weight"
    outer = prefix[: -len("model.")] if prefix.endswith("model.") else ""  # a wrapper's lm_head
    tied = cfg.flag("tie_word_embeddings", outer + own not in names)
    head = plan.embed_tensors[0].name if tied else own
    tensors.append(Tensor("head", head, (V, C)))
    cap = cfg.optional_number("final_logit_softcapping", 30.0 if family == "gemma2" else 0.0)
    divide = cfg.number("logits_scaling", 1.0) if family == "granite" else None
    return HeadPlan(norm, tuple(tensors), cap or None, divide=divide)


def _dense_b_head(
    cfg: Config, family: str, plan: LayerPlan, names: set[str], prefix: str
) -> HeadPlan:
    """A LayerNorm (Cohere's without bias; Phi's final_layernorm), then the LM head: Phi's
    with a bias, Cohere's logits times logit_scale; StarCoder2's and Cohere's tied by default."""
    C, V = plan.hidden, plan.embed_tensors[0].shape[0]
    assert plan.pre_norm is not None
    name = "final_layernorm" if family == "phi" else "norm"
    bias = family not in _COHERE
    tensors = [Tensor("f.w", f"{name}.weight", (C,))]
    tensors += [Tensor("f.b", f"{name}.bias", (C,))] if bias else []
    norm = Norm("layer", plan.pre_norm.eps, "f.w", "f.b" if bias else None)
    outer = prefix[: -len("model.")] if prefix.endswith("model.") else ""
    tied = cfg.flag("tie_word_embeddings", outer + "lm_head.weight" not in names)
    tensors.append(Tensor("head", plan.embed_tensors[0].name if tied else "lm_head.weight", (V, C)))
    scale = cfg.number("logit_scale", 0.0625) if family in _COHERE else None
    head_bias = Tensor("head.bias", "lm_head.bias", (V,)) if family == "phi" else None
    return HeadPlan(norm, tuple(tensors), None, head_bias, scale)


# ---------------------------------------------------------------------------------------------
# The walk

_LITTLE = {"F32": "<f4", "F64": "<f8", "F16": "<f2"}


class _LeanReader(ck.Reader):
    """A reader whose tensors are read from the file into memory of their own, not mapped:
    pages of a memory-mapped file stay resident (and counted) after their tensor is dropped,
    so a walk through every layer would hold the whole checkpoint."""

    def __enter__(self) -> _LeanReader:
        return self

    def read(self, prefix: str, t: Tensor, plan: LayerPlan) -> FloatArray:
        _, _, entry = self.entry(prefix, t, plan)
        return self.block(prefix, t, plan, 0, entry.shape[0] if entry.shape else 1)

    def block(self, prefix: str, t: Tensor, plan: LayerPlan, row: int, n: int) -> FloatArray:
        """Rows ``row`` .. ``row + n`` of tensor ``t`` (all of a 1-axis one), finite."""
        name, path, entry = self.entry(prefix, t, plan)
        n = max(0, min(n, (entry.shape[0] if entry.shape else 1) - row))
        if entry.dtype == "BF16":
            arr = self.bf16(path, entry, row, n, name)
        else:
            per_row = math.prod(entry.shape[1:]) * ck.ITEMSIZE[entry.dtype]
            with gate.open_regular(
                path, str(path), "a .safetensors file", max_bytes=ck.MAX_CHECKPOINT_BYTES
            ) as f:
                f.seek(entry.begin + row * per_row)
                buf = bytearray(f.read(n * per_row))
            if len(buf) != n * per_row:
                raise InputError(str(path), name, "data is cut short", "a complete file")
            shape = (n, *entry.shape[1:]) if entry.shape else ()
            arr = self.widen(entry.dtype, np.frombuffer(buf, dtype=_LITTLE[entry.dtype]))
            arr = arr.reshape(shape)
        if not np.isfinite(arr).all():
            raise InputError(str(path), name, "holds inf or NaN", "finite weights")
        return arr


def walk(
    checkpoint: Path,
    text: str,
    *,
    through: int | None,
    config: Path | None = None,
    arch: str | None = None,
    max_memory: int | None = None,
    logits: bool = False,
    keep_residuals: bool = False,
    each_trace: Callable[[int, Any], None] | None = None,
) -> Walk:
    """Embed ``text`` and run layers 0 .. through-1 (None: every layer), keeping each layer's
    attention weights; ``residual`` is then the stream entering layer ``through`` (or, with
    None, leaving the last layer); ``logits`` adds the final norm and the LM head;
    ``keep_residuals`` keeps the stream entering each layer (``entering``); ``each_trace``
    is called with each layer's whole trace (its tokens as labels), made once.

    With ``through`` None and no ``logits``, the last layer's attention is all that is asked
    of it: its MLP is not computed (``residual`` is then None)."""
    ck.check_inputs(0, None, text)
    folder, files, config_path = ck.locate(Path(checkpoint), config)
    cfg = Config(ck.read_json(config_path, "config.json"), str(config_path))
    family, overridden = resolve_family(cfg, arch)
    ignored = check_keys(cfg, family)
    plan0 = plan_layer(cfg, family, 0)
    n = plan0.layers
    if logits:
        _refuse_family(str(config_path), family, "the logits")
    elif n > 1 if through is None else through > 0:
        _refuse_family(str(config_path), family, "a layer past 0")
    ids, tokens, types = ck.encode_text(folder / "tokenizer.json", text)
    out = Walk(family, n, tokens, ids, notes=[*overridden, *ignored], each_trace=each_trace)
    with _LeanReader(files) as reader:
        prefix = prefix_of(reader.names, plan0, reader.source)
        head = head_plan(cfg, family, plan0, set(reader.names), prefix) if logits else None
        x: FloatArray | None = ck.embed_tokens(reader, prefix, plan0, ids, types)  # (T, C) float64
        for layer in range(n if through is None else through):
            assert x is not None
            if keep_residuals:
                out.entering.append(x)
            whole = through is not None or logits or layer < n - 1
            x = _layer(reader, prefix, cfg, family, layer, x, ids, out, max_memory, whole)
        if head is not None:
            assert x is not None
            out.logits = _logits(reader, prefix, head, plan0, x)
    out.residual = x
    out.notes += _no_map_note(out.weights)
    return out


def _no_map_note(weights: list[FloatArray]) -> list[str]:
    """Qwen3-Next's linear_attention layers: computed whole, with no softmax map to show."""
    linear = [str(i) for i, w in enumerate(weights) if w.shape[0] == 0]
    if not linear:
        return []
    return [
        f"layer{'s' * (len(linear) > 1)} {', '.join(linear)}: linear attention (Gated "
        "DeltaNet), no softmax map: its weights hold no heads (blank in the model view)"
    ]


def _layer(
    reader: ck.Reader,
    prefix: str,
    cfg: Config,
    family: str,
    layer: int,
    x: FloatArray,
    ids: list[int],
    out: Walk,
    max_memory: int | None,
    whole: bool = True,
) -> FloatArray | None:
    """The residual stream leaving ``layer``, from the one entering it (None: only the
    attention weights were asked for, not ``whole``)."""
    plan = plan_layer(cfg, family, layer)
    check_tensors(reader.names, prefix, plan, reader.source)
    ck.check_budget(reader, prefix, plan, len(ids), None, max_memory)
    if not whole:
        out.weights.append(_attention(reader, prefix, plan, x, out)[0])
        return None
    bp = block_plan(cfg, family, plan)
    _check_block_tensors(reader.names, prefix, plan, bp, reader.source)
    _check_block_budget(reader, prefix, plan, bp, x.shape[0], max_memory)
    weights, attention = _attention(reader, prefix, plan, x, out)
    out.weights.append(weights)
    t = {tensor.role: reader.read(prefix, tensor, plan).astype(np.float64) for tensor in bp.tensors}
    norms = {role: _norm_of(norm, t) for role, norm in bp.norms.items()}

    def mlp(h: FloatArray) -> FloatArray:
        if bp.experts is not None:
            return _moe(reader, prefix, plan, bp, h)
        out = _mlp(bp, t, h)
        return out if bp.residual is None else bp.residual * out

    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        if bp.residual is not None:  # Granite: each branch times residual_multiplier, then added
            attention = bp.residual * attention
        leaving = fw.block(x, bp.placement, attention, mlp, norms)
    if not np.isfinite(leaving).all():  # checked here, before the next layer's norm reads it
        raise InputError(
            cfg.source,
            f"{cfg.path}num_hidden_layers",
            f"the residual stream leaving layer {layer} is not finite (float64 overflow in its "
            "block: a multiplier such as routed_scaling_factor or residual_multiplier, or a "
            "weight, too large)",
            "config values and weights of an ordinary size",
        )
    return leaving


def _moe(
    reader: ck.Reader, prefix: str, plan: LayerPlan, bp: BlockPlan, h: FloatArray
) -> FloatArray:
    """The mixture of experts on h [T, C]: the router, then each chosen expert, read when
    chosen; Qwen2-MoE adds its shared expert, scaled by sigmoid(h W)."""
    x = bp.experts
    assert x is not None
    act = fw.ACTIVATIONS[bp.act]

    def read(tensor: Tensor) -> FloatArray:
        return reader.read(prefix, tensor, plan).astype(np.float64)

    chosen, weights = _route(x, h, read)  # (T, k) each

    def expert(e: int, rows: FloatArray) -> FloatArray:
        if x.stacked is not None:
            return _stacked_expert(reader, prefix, plan, x.stacked, e, rows)
        gate, up, down = (read(tensor) for tensor in x.each(e))
        return fw.gated_mlp(rows, gate.T, up.T, down.T, act)

    out = fw.mixture(h, chosen, weights, expert)
    if x.shared is not None:
        gate, up, down, sigmoid = (read(tensor) for tensor in x.shared)
        shared = fw.gated_mlp(h, gate.T, up.T, down.T, act)  # (T, C)
        out = out + 1.0 / (1.0 + np.exp(-(h @ sigmoid.T))) * shared  # (T, 1) gate per token
    if x.plain_shared is not None:  # DeepSeek V3's shared experts, on every token, ungated
        gate, up, down = (read(tensor) for tensor in x.plain_shared)
        out = out + fw.gated_mlp(h, gate.T, up.T, down.T, act)
    return out


def _route(
    x: Experts, h: FloatArray, read: Callable[[Tensor], FloatArray]
) -> tuple[np.ndarray[Any, np.dtype[np.intp]], FloatArray]:
    """Each token's chosen experts and their weights [T, k]: a softmax router (gpt-oss's with
    its bias; DeepSeek V2's greedy one), or DeepSeek V3's grouped sigmoid one."""
    logits = h @ read(x.router).T  # (T, E)
    if x.router_bias is not None:
        logits = logits + read(x.router_bias)
    if x.greedy is not None:
        return fw.route_greedy(logits, x.k, x.greedy.groups, x.greedy.scale)
    if x.grouped is None:
        return fw.route_logits(logits, x.k, x.normalize)
    g = x.grouped
    return fw.route_grouped(logits, x.k, read(g.correction), g.groups, x.normalize, g.scale)


def _stacked_expert(
    reader: ck.Reader, prefix: str, plan: LayerPlan, s: Stacked, e: int, rows: FloatArray
) -> FloatArray:
    """gpt-oss's expert ``e`` on the tokens that chose it [n, C]: its row of each stacked
    tensor read alone, (clamped swiglu(rows W_gate_up + b)) W_down + b."""
    assert isinstance(reader, _LeanReader)
    gate_up, gate_up_b, down, down_b = (
        reader.block(prefix, tensor, plan, e, 1)[0].astype(np.float64) for tensor in s.tensors()
    )  # (C, 2F), (2F,), (F, C), (C,)
    out: FloatArray = fw.clamped_swiglu(rows @ gate_up + gate_up_b, s.alpha, s.limit) @ down
    out = out + down_b  # (n, C)
    return out


def _attention(
    reader: ck.Reader, prefix: str, plan: LayerPlan, x: FloatArray, out: Walk | None = None
) -> tuple[FloatArray, FloatArray]:
    """The layer's attention weights (heads, T, T) and output projection (T, C): attn's trace
    of the fixture ``attn import`` makes from this residual stream (whole, and handed to
    ``out.each_trace``, when that is set)."""
    from attn_cli.core.pipeline import run
    from attn_cli.io.validate import validate

    found = {t.role: reader.read(prefix, t, plan) for t in plan.tensors}
    X = x if plan.pre_norm is None else ck.normalize_rows(x, plan.pre_norm, found)
    ck.require_finite(X, reader.source)
    hook = None if out is None else out.each_trace
    tokens = None if hook is None or out is None else out.tokens
    fixture = ck.layer_fixture(plan, found, X, tokens, Path(reader.source), None, Path("-"))
    if hook is not None:
        below = f" through layers 0-{plan.layer - 1} in NumPy" if plan.layer else ""
        fixture["description"] = fixture["description"].replace(
            "X from the hidden states -", f"X from the text's embeddings{below}"
        )
    keep = ("projected",) if plan.delta is not None else ("softmax", "projected")
    trace = run(
        validate(fixture, f"{reader.source} (layer {plan.layer})"),
        keep=None if hook is not None else keep,
    )
    if hook is not None:
        hook(plan.layer, trace)
    projected = np.asarray(trace["projected"].data)
    if plan.delta is not None:  # linear attention: no softmax map, a layer of no heads
        return np.zeros((0, len(x), len(x))), projected  # (0, T, T)
    return np.asarray(trace["softmax"].data), projected


def _norm_of(norm: Norm, t: Mapping[str, FloatArray]) -> fw.Norm:
    return lambda h: ck.normalize_rows(h, norm, t)


def _mlp(bp: BlockPlan, t: Mapping[str, FloatArray], h: FloatArray) -> FloatArray:
    act = fw.ACTIVATIONS[bp.act]
    if bp.mlp == "dense":
        W_in, W_out = (t["in.weight"], t["out.weight"])
        if not bp.conv1d:  # nn.Linear [out, in]
            W_in, W_out = W_in.T, W_out.T
        return fw.dense_mlp(h, W_in, t.get("in.bias"), W_out, t.get("out.bias"), act)
    if bp.mlp == "gated_fused":  # Phi-3: gate_up_proj's rows are the gate's, then the up's
        W_gate, W_up = np.split(t["gate_up.weight"], 2, axis=0)
    else:
        W_gate, W_up = t["gate.weight"], t["up.weight"]
    biases = (t.get("gate.bias"), t.get("up.bias"), t.get("down.bias"))
    return fw.gated_mlp(h, W_gate.T, W_up.T, t["down.weight"].T, act, biases)


def _logits(
    reader: _LeanReader, prefix: str, head: HeadPlan, plan: LayerPlan, x: FloatArray
) -> FloatArray:
    """The final norm, then the LM head (tied: the token embeddings): [T, vocab]."""
    outer = prefix[: -len("model.")] if prefix.endswith("model.") else ""
    t: dict[str, FloatArray] = {}
    for tensor in head.tensors[:-1]:  # the final norm's
        t[tensor.role] = reader.read(prefix, tensor, plan)
    h = x if head.norm is None else ck.normalize_rows(x, head.norm, t)
    W = head.tensors[-1]  # (vocab, C): read and widened a block of rows at a time
    at = prefix if W.name == plan.embed_tensors[0].name else outer
    logits = np.empty((h.shape[0], W.shape[0]))  # (T, vocab)
    for start in range(0, W.shape[0], _HEAD_ROWS):
        rows = reader.block(at, W, plan, start, _HEAD_ROWS).astype(np.float64)  # (rows, C)
        logits[:, start : start + rows.shape[0]] = h @ rows.T
    if head.bias is not None:  # Phi's LM head
        logits += reader.read(outer, head.bias, plan).astype(np.float64)
    if head.logit_scale is not None:  # Cohere
        logits *= head.logit_scale
    if head.divide is not None:  # Granite's logits_scaling
        logits = logits / head.divide
    return fw.softcap(logits, head.softcap)


_HEAD_ROWS = 4096  # LM head rows widened at once


def _check_block_budget(
    reader: ck.Reader,
    prefix: str,
    plan: LayerPlan,
    bp: BlockPlan,
    tokens: int,
    budget: int | None,
) -> None:
    """Refuse, before the layer is read, a block whose norms and MLP would hold more than
    ``budget`` bytes: its tensors widened to float64 (a mixture: the router, k experts, the
    shared one), the float32 read beside the largest, and the MLP's activations (float64)."""
    from attn_cli.core.memory import default_max_memory, format_bytes

    limit = default_max_memory() if budget is None else budget
    tensors = list(bp.tensors)
    if bp.experts is not None:
        x = bp.experts
        tensors += [x.router, *(t for e in range(x.k) for t in x.each(e)), *(x.shared or ())]
        tensors += [*(x.plain_shared or ()), *(x.stacked.tensors() if x.stacked else ())]
    sizes = [math.prod(t.shape) for t in tensors]
    if bp.experts is not None and bp.experts.stacked is not None:  # k rows of each stacked one
        x = bp.experts
        sizes[-4:] = [size // x.count * x.k for size in sizes[-4:]]
    widest = max((t.shape[0] for t in tensors if len(t.shape) == 2), default=0)
    need = 8 * sum(sizes) + 4 * max(sizes, default=0) + 3 * 8 * tokens * max(widest, plan.hidden)
    if need > limit:
        at = max(range(len(sizes)), key=sizes.__getitem__)
        raise InputError(
            reader.source,
            prefix + tensors[at].name,
            f"computing layer {plan.layer}'s MLP would need about {format_bytes(need)} of "
            f"memory (its tensors in float64; the largest, {list(tensors[at].shape)})",
            f"at most {format_bytes(limit)}",
            option="max-memory",
        )


def _expert_tensors(bp: BlockPlan) -> list[Tensor]:
    """Every tensor of a mixture of experts (the check's list: only chosen ones are read)."""
    x = bp.experts
    if x is None:
        return []
    more = [*(x.plain_shared or ()), *(x.stacked.tensors() if x.stacked else ())]
    more += [t for t in (x.router_bias, x.grouped and x.grouped.correction) if t is not None]
    return [x.router, *(t for e in range(x.count) for t in x.each(e)), *(x.shared or ()), *more]


def _check_block_tensors(
    names: list[str], prefix: str, plan: LayerPlan, bp: BlockPlan, source: str
) -> None:
    """Every tensor of the layer is read by its attention plan or its block plan: an MoE
    router, an extra norm or a bias no block here has means another model, refused."""
    block = prefix + plan.block
    read = {prefix + t.name for t in (*plan.tensors, *bp.tensors, *_expert_tensors(bp))}
    unused = re.compile(plan.unused)
    for name in names:
        if name.startswith(block) and name not in read:
            rest = name[len(block) :]
            if bp.experts is not None and bp.experts.stacked is not None:
                _refuse_mxfp4(source, name)
            if not unused.fullmatch(rest):
                raise InputError(
                    source,
                    name,
                    f"a tensor of layer {plan.layer} that the {plan.family} block has no place for",
                    "only the attention's, the norms' and the MLP's",
                )


def _refuse_mxfp4(source: str, name: str) -> None:
    """gpt-oss as OpenAI released it: each expert tensor as MXFP4 blocks and scales."""
    if name.endswith(("_proj_blocks", "_proj_scales")):
        raise InputError(
            source,
            name,
            "gpt-oss's experts quantized to MXFP4 (blocks and scales), which the "
            "forward does not dequantize",
            "float experts (gate_up_proj, down_proj: a BF16 or dequantized copy of the checkpoint)",
        )


# ---------------------------------------------------------------------------------------------
# What the CLI asks for


def import_deep(
    checkpoint: Path,
    *,
    layer: int,
    text: str,
    config: Path | None = None,
    arch: str | None = None,
    max_memory: int | None = None,
) -> ck.ImportedLayer:
    """Layer ``layer``'s attention as a fixture, X from ``text`` through layers 0 .. layer-1."""
    ck.check_inputs(0, None, text)  # the text's checks (layer 0: the text embeds it)
    _, files, config_path = ck.locate(Path(checkpoint), config)
    cfg = Config(ck.read_json(config_path, "config.json"), str(config_path))
    family, _ = resolve_family(cfg, arch)
    plan = plan_layer(cfg, family, layer)  # the layer exists, before any is computed
    w = walk(checkpoint, text, through=layer, config=config, arch=arch, max_memory=max_memory)
    assert w.residual is not None
    with _LeanReader(files) as reader:
        prefix = prefix_of(reader.names, plan, reader.source)
        check_tensors(reader.names, prefix, plan, reader.source)
        ck.check_budget(reader, prefix, plan, len(w.ids), None, max_memory)
        found = {t.role: reader.read(prefix, t, plan) for t in plan.tensors}
        widened = sorted(reader.widened)
    X = w.residual if plan.pre_norm is None else ck.normalize_rows(w.residual, plan.pre_norm, found)
    ck.require_finite(X, str(checkpoint))
    fixture = ck.layer_fixture(plan, found, X, w.tokens, Path(checkpoint), text, None)
    fixture["description"] = fixture["description"].replace(
        "X from the text", f"X from layers 0-{layer - 1} computed in NumPy on the text"
    )
    ck.check_fixture(fixture, str(config_path))
    notes = [*w.notes, *plan.notes, _deep_note(plan, layer)]
    if widened:
        notes.append(f"{', '.join(widened)} tensors widened to float32 (exact)")
    return ck.ImportedLayer(fixture=fixture, family=w.family, notes=tuple(notes))


def _deep_note(plan: LayerPlan, layer: int) -> str:
    after = " then the layer's norm," if plan.pre_norm is not None else ""
    return (
        f"X = the text's embeddings through layers 0-{layer - 1} (attention by attn's chain, "
        f"norms and MLP in NumPy),{after} computed in float64"
    )


def check_layer_choice(layer: str) -> int | None:
    """``--layer``: a whole number >= 0, or ``all`` (None)."""
    if layer.strip().lower() == "all":
        return None
    try:
        value = int(layer)
    except ValueError:
        value = -1
    if value < 0:
        raise UsageError(
            "", "layer", f"got {layer!r}", "a layer number >= 0, or all", option="layer"
        )
    return value


def top_tokens(
    checkpoint: Path, config: Path | None, logits: FloatArray, k: int = 5
) -> list[tuple[str, int, float]]:
    """The ``k`` most likely next tokens after the last position: (token, id, probability),
    each token's text from the checkpoint's tokenizer.json."""
    folder = ck.locate(Path(checkpoint), config)[0]
    path = folder / "tokenizer.json"
    tokenizers = ck.require("tokenizers")
    raw = gate.read_bytes(path, str(path), "tokenizer.json", max_bytes=ck.MAX_JSON_BYTES)
    tokenizer = ck.tokenizer_call(
        path,
        lambda: tokenizers.Tokenizer.from_str(raw.decode("utf-8", "replace")),
        "unreadable tokenizer",
        "a tokenizer.json",
    )
    last = logits[-1]
    p = np.exp(last - last.max())  # (vocab,) softmax of the last position
    p /= p.sum()
    out = []
    for i in np.argsort(-p, kind="stable")[:k]:
        name = tokenizer.id_to_token(int(i))
        out.append((f"<id {int(i)}>" if name is None else str(name), int(i), float(p[i])))
    return out
