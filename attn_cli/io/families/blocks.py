"""The blocks past attention that families share, for the NumPy forward (io/forward.py): where
the norms sit, the MLP's tensors and activation, the final norm and the LM head. A family gives
a ``Block`` (a table of its differences from Llama's block) or a ``LayerNormBlock``; no builder
here names a family. (transformers 5.24's modeling_<family>.py of each.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from attn_cli.core import forward as fw
from attn_cli.errors import InputError
from attn_cli.io.families.config import Config
from attn_cli.io.families.keys import FINAL_CAP_KEY
from attn_cli.io.families.plan import (
    BlockPlan,
    Experts,
    HeadPlan,
    LayerPlan,
    Norm,
    NormKind,
    Tensor,
)

TensorOf = Callable[..., Tensor]  # (role, name under the layer's prefix, *shape) -> Tensor
ExpertsOf = Callable[[Config, LayerPlan, TensorOf], "Experts | None"]


def act(cfg: Config, key: str, default: str, learned: bool = False) -> str:
    """The activation at ``key`` (transformers' ACT2FN name), one core/forward.py computes;
    ``learned``: the block also reads one with learned parameters (fw.PARAMETRIC: xIELU)."""
    value = cfg.text(key, default)
    known = [*fw.ACTIVATIONS, *(fw.PARAMETRIC if learned else ())]
    if value not in known:
        raise cfg.error(key, f"got {value!r}", "one of " + ", ".join(known))
    return str(value)


def act_tensors(t: TensorOf, activation: str, module: str) -> list[Tensor]:
    """A learned activation's parameters under ``module`` (``mlp.act_fn.``), one value each:
    roles ``act.<name>`` (xIELU's alpha_p and alpha_n of shape (1,), beta and eps scalars)."""
    if activation not in fw.PARAMETRIC:
        return []
    names = fw.PARAMETRIC[activation][1]
    return [t(f"act.{n}", f"{module}{n}", *((1,) if n.startswith("alpha") else ())) for n in names]


def tensor_of(plan: LayerPlan) -> TensorOf:
    """A maker of the layer's tensors: names under its own prefix (``layers.3.``)."""

    def t(role: str, name: str, *shape: int) -> Tensor:
        return Tensor(role, plan.block + name, shape)

    return t


def dense_tensors(
    t: TensorOf, norm: str, mlp: tuple[str, str], sizes: tuple[int, int], conv1d: bool = False
) -> tuple[Tensor, ...]:
    """A LayerNorm's weight and bias (roles n.w, n.b), then a dense MLP's in and out weights and
    biases (``mlp``: the two modules' prefixes; ``conv1d``: GPT-2's [in, out] layout)."""
    C, F = sizes
    shape_in, shape_out = ((C, F), (F, C)) if conv1d else ((F, C), (C, F))
    up, down = mlp
    return (
        t("n.w", f"{norm}.weight", C),
        t("n.b", f"{norm}.bias", C),
        t("in.weight", f"{up}weight", *shape_in),
        t("in.bias", f"{up}bias", F),
        t("out.weight", f"{down}weight", *shape_out),
        t("out.bias", f"{down}bias", C),
    )


_POST_ONLY = (("attn_out", "post_attention_layernorm"), ("mlp_out", "post_feedforward_layernorm"))
_SANDWICH = (
    ("attn_out", "post_attention_layernorm"),
    ("mlp_in", "pre_feedforward_layernorm"),
    ("mlp_out", "post_feedforward_layernorm"),
)


@dataclass(frozen=True)
class Block:
    """A decoder's block past attention; each field's default is what Llama's does."""

    placement: fw.Placement = "pre"
    norms: tuple[tuple[str, str], ...] = (("mlp_in", "post_attention_layernorm"),)
    norm: NormKind = "rms"  # the block's and the final norm's kind (1 + w: Gemma, Qwen3-Next)
    eps: float = 1e-6  # rms_norm_eps's default for the block's norms
    # the attention's norm (its Arch's eps key and default) for the block's too; None: eps above
    eps_key: tuple[str | None, float] | None = None
    weightless: bool = False  # OLMo's LayerNorm without weight or bias
    fused: bool = False  # gate_up_proj's rows: the gate's, then the up's (Phi-3, GLM-4)
    down_first: bool = True  # the order the block lists its tensors in (checks name the first)
    bias_key: str | None = "mlp_bias"  # the key turning the MLP's biases on
    no_bias: str = ""  # refuse mlp_bias true, saying this (Phi-3)
    act: tuple[str, str] = ("hidden_act", "silu")
    act_module: str = ""  # where a learned activation's parameters are (none: none is read)
    ungated: bool = False  # up_proj, the activation, down_proj: no gate (Apertus)
    residual: bool = False  # Granite's residual_multiplier on both branches
    experts: ExpertsOf | None = None  # a mixture of experts in place of the MLP on some layers
    # the head
    final_cap: float = 0.0  # the final logits' cap's default (FINAL_CAP_KEY; Gemma 2: 30)
    divide: bool = False  # Granite's logits_scaling: logits / it


POST_ONLY = Block(placement="post_only", norms=_POST_ONLY)
SANDWICH = Block(placement="sandwich", norms=_SANDWICH)


def _block_norm(spec: Block, cfg: Config) -> Norm:
    """The block's norm, weight role ``w`` (none: OLMo's LayerNorm without parameters)."""
    if spec.eps_key is None:
        return Norm(spec.norm, cfg.number("rms_norm_eps", spec.eps), "w")
    key, default = spec.eps_key
    eps = default if key is None else cfg.number(key, default)
    return Norm("layer", eps, None) if spec.weightless else Norm(spec.norm, eps, "w")


def decoder_block(spec: Block, cfg: Config, plan: LayerPlan) -> BlockPlan:
    """A Llama-like block: a gate/up/down MLP (or a mixture of experts), norms as ``spec``."""
    C, F, t = plan.hidden, cfg.whole("intermediate_size"), tensor_of(plan)
    norm = _block_norm(spec, cfg)
    experts = spec.experts(cfg, plan, t) if spec.experts is not None else None
    activation = act(cfg, *spec.act, learned=bool(spec.act_module))
    if spec.ungated:
        mlp = [
            t("in.weight", "mlp.up_proj.weight", F, C),
            t("out.weight", "mlp.down_proj.weight", C, F),
        ]
    else:
        mlp = [] if experts else _gated_mlp(spec, cfg, (C, F), t)
    mlp += act_tensors(t, activation, spec.act_module)
    names = dict(spec.norms)
    if norm.weight is None:  # OLMo: nothing to read
        norms, weights = dict.fromkeys(names, norm), []
    else:
        norms = {r: replace(norm, weight=f"{r}.weight") for r in names}
        weights = [t(f"{r}.weight", f"{n}.weight", C) for r, n in names.items()]
    residual = cfg.number("residual_multiplier", 1.0) if spec.residual else None
    kind = (
        "moe" if experts else "dense" if spec.ungated else "gated_fused" if spec.fused else "gated"
    )
    tensors = (*mlp, *weights)
    return BlockPlan(spec.placement, norms, kind, False, activation, tensors, experts, residual)


def _gated_mlp(spec: Block, cfg: Config, sizes: tuple[int, int], t: TensorOf) -> list[Tensor]:
    """The MLP's gate, up and down projections (a fused gate_up_proj) and their biases."""
    C, F = sizes
    down = t("down.weight", "mlp.down_proj.weight", C, F)
    if spec.fused:
        mlp = [t("gate_up.weight", "mlp.gate_up_proj.weight", 2 * F, C), down]
    else:
        mlp = [t(f"{x}.weight", f"mlp.{x}_proj.weight", F, C) for x in ("gate", "up")] + [down]
    if spec.down_first:
        mlp = [mlp[-1], *mlp[:-1]]
    if spec.bias_key is not None and cfg.flag(spec.bias_key, False):
        if spec.no_bias:
            raise cfg.error(spec.bias_key, "got true", spec.no_bias)
        mlp += [
            t(f"{x}.bias", f"mlp.{x}_proj.bias", F if x != "down" else C)
            for x in ("gate", "up", "down")
        ]
    return mlp


def decoder_head(
    spec: Block, cfg: Config, plan: LayerPlan, names: set[str], prefix: str
) -> HeadPlan:
    """The final norm (``norm``, as the block's) and the LM head, or the tied embeddings."""
    norm = _block_norm(spec, cfg)
    if norm.weight is not None:
        norm = replace(norm, weight="f.w")
    divide = cfg.number("logits_scaling", 1.0) if spec.divide else None
    norm_names = () if norm.weight is None else ("norm.weight",)
    return final_head(cfg, plan, (names, prefix), (norm, norm_names), spec.final_cap, divide)


def final_head(
    cfg: Config,
    plan: LayerPlan,
    where: tuple[set[str], str],
    final: tuple[Norm, tuple[str, ...]],
    final_cap: float = 0.0,
    divide: float | None = None,
    own: str = "lm_head.weight",
) -> HeadPlan:
    """The final norm (``final``: its roles f.w, f.b and their names), then the LM head ``own``
    (or the tied embeddings); the logits capped by config.json's FINAL_CAP_KEY (``final_cap``
    its default) and divided by ``divide``. ``where``: the tensor names and their prefix."""
    norm, norm_names = final
    roles = ("f.w", "f.b")
    tensors = [Tensor(r, n, (plan.hidden,)) for r, n in zip(roles, norm_names, strict=False)]
    tensors.append(lm_head(cfg, plan, *where, own))
    cap = cfg.optional_number(FINAL_CAP_KEY, final_cap)
    return HeadPlan(norm, tuple(tensors), cap or None, divide=divide)


def lm_head(
    cfg: Config, plan: LayerPlan, names: set[str], prefix: str, own: str = "lm_head.weight"
) -> Tensor:
    """The LM head ``own``, or the token embeddings where tied (by default where it is absent)."""
    C, V = plan.hidden, plan.embed_tensors[0].shape[0]
    outer = prefix[: -len("model.")] if prefix.endswith("model.") else ""  # a wrapper's lm_head
    tied = cfg.flag("tie_word_embeddings", outer + own not in names)
    return Tensor("head", plan.embed_tensors[0].name if tied else own, (V, C))


def no_head(cfg: Config, family: str) -> InputError:
    """An encoder's refusal of the logits: it has no LM head predicting a next token."""
    return InputError(
        cfg.source,
        "model_type",
        f"{family} is an encoder: its checkpoint has no LM head predicting a next token",
        "a decoder checkpoint (for the logits)",
        option="check-logits",
    )


@dataclass(frozen=True)
class LayerNormBlock:
    """A LayerNorm decoder's block (StarCoder2, StableLM, Phi, Cohere): the MLP beside attention
    (parallel) or after a second LayerNorm, a SwiGLU or a dense MLP."""

    parallel: Literal["never", "always", "flag"] = "never"  # flag: use_parallel_residual
    norm_bias: bool = True  # Cohere's LayerNorm has none
    gated: bool = False  # SwiGLU without biases (StableLM, Cohere)
    mlp: tuple[str, str] = ("mlp.fc1.", "mlp.fc2.")  # a dense MLP's in and out (StarCoder2: c_fc)
    always_bias: bool = False  # the dense MLP's biases whatever use_bias says (Phi)
    act: str = "gelu_pytorch_tanh"  # hidden_act's default
    final: str = "norm"  # the final LayerNorm (Phi: final_layernorm)
    head_bias: bool = False  # the LM head's bias (Phi)
    logit_scale: bool = False  # logits times logit_scale (Cohere)


def layer_norm_block(spec: LayerNormBlock, cfg: Config, plan: LayerPlan) -> BlockPlan:
    """Pre-norm (a second LayerNorm before the MLP) or parallel (input_layernorm read again)."""
    C, t = plan.hidden, tensor_of(plan)
    assert plan.pre_norm is not None  # input_layernorm: its eps is the block's norms' eps
    F, eps = cfg.whole("intermediate_size"), plan.pre_norm.eps
    parallel = spec.parallel == "always" or (
        spec.parallel == "flag" and cfg.flag("use_parallel_residual", False)
    )
    # the MLP's norm: a second LayerNorm, or (parallel) input_layernorm read once more
    n = "input_layernorm" if parallel else "post_attention_layernorm"
    bias = spec.norm_bias
    norm_t = (t("n.w", f"{n}.weight", C), *([t("n.b", f"{n}.bias", C)] if bias else []))
    norms = {"mlp_in": Norm("layer", eps, "n.w", "n.b" if bias else None)}
    placement: fw.Placement = "parallel" if parallel else "pre"
    mlp: tuple[Tensor, ...]
    if spec.gated:
        mlp = (
            t("gate.weight", "mlp.gate_proj.weight", F, C),
            t("up.weight", "mlp.up_proj.weight", F, C),
            t("down.weight", "mlp.down_proj.weight", C, F),
        )
        activation = act(cfg, "hidden_act", "silu")
        return BlockPlan(placement, norms, "gated", False, activation, (*norm_t, *mlp))
    up, down = spec.mlp
    mlp = (t("in.weight", f"{up}weight", F, C), t("out.weight", f"{down}weight", C, F))
    if spec.always_bias or cfg.flag("use_bias", True):  # StarCoder2's use_bias
        mlp += (t("in.bias", f"{up}bias", F), t("out.bias", f"{down}bias", C))
    activation = act(cfg, "hidden_act", spec.act)
    return BlockPlan(placement, norms, "dense", False, activation, (*norm_t, *mlp))


def layer_norm_head(
    spec: LayerNormBlock, cfg: Config, plan: LayerPlan, names: set[str], prefix: str
) -> HeadPlan:
    """A LayerNorm (Cohere's without bias; Phi's final_layernorm), then the LM head: Phi's
    with a bias, Cohere's logits times logit_scale; StarCoder2's and Cohere's tied by default."""
    C, V = plan.hidden, plan.embed_tensors[0].shape[0]
    assert plan.pre_norm is not None
    bias = spec.norm_bias
    tensors = [Tensor("f.w", f"{spec.final}.weight", (C,))]
    tensors += [Tensor("f.b", f"{spec.final}.bias", (C,))] if bias else []
    norm = Norm("layer", plan.pre_norm.eps, "f.w", "f.b" if bias else None)
    tensors.append(lm_head(cfg, plan, names, prefix))
    scale = cfg.number("logit_scale", 0.0625) if spec.logit_scale else None
    head_bias = Tensor("head.bias", "lm_head.bias", (V,)) if spec.head_bias else None
    return HeadPlan(norm, tuple(tensors), None, head_bias, scale)
