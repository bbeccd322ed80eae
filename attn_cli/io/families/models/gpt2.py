"""GPT-2: Conv1D [in, out] used as is; c_attn holds Q | K | V side by side; ln_1 before
attention; learned positions; causal."""

from __future__ import annotations

from attn_cli.io.families.blocks import act, dense_tensors, final_head, tensor_of
from attn_cli.io.families.config import Config, check_layer, heads
from attn_cli.io.families.keys import Keys
from attn_cli.io.families.plan import BlockPlan, Embedding, HeadPlan, LayerPlan, Norm, Tensor
from attn_cli.io.families.registry import Family


def plan(config: Config, layer: int) -> LayerPlan:
    """GPT-2: Conv1D [in, out]; c_attn holds Q|K|V side by side; ln_1 before attention; causal."""
    if config.flag("add_cross_attention", False):
        raise config.error("add_cross_attention", "cross-attention is not supported", "false")
    layers = check_layer(config, "n_layer", layer)
    C = config.whole("n_embd")
    H = heads(config, C, "n_head")
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
    sizes = (layer, layers, C, H, H, D)  # layer, layers, hidden, heads, kv_heads, head_dim
    return LayerPlan(
        "gpt2",
        *sizes,
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


def block(config: Config, plan: LayerPlan) -> BlockPlan:
    """GPT2Block past attention: ln_2, then the Conv1D MLP (c_fc, c_proj)."""
    C, t = plan.hidden, tensor_of(plan)
    F = config.whole("n_inner", 4 * C)
    eps = config.number("layer_norm_epsilon", 1e-5)
    tensors = dense_tensors(t, "ln_2", ("mlp.c_fc.", "mlp.c_proj."), (C, F), conv1d=True)
    activation = act(config, "activation_function", "gelu_new")
    return BlockPlan(
        "pre", {"mlp_in": Norm("layer", eps, "n.w", "n.b")}, "dense", True, activation, tensors
    )


def head(config: Config, plan: LayerPlan, names: set[str], prefix: str) -> HeadPlan:
    """ln_f, then the LM head (tied to wte by default)."""
    eps = config.number("layer_norm_epsilon", 1e-5)
    final = (Norm("layer", eps, "f.w", "f.b"), ("ln_f.weight", "ln_f.bias"))
    return final_head(config, plan, (names, prefix), final)


FAMILY = Family(
    "gpt2",
    "GPT2LMHeadModel",
    "c_attn split into W_Q, W_K, W_V; learned positions; scale_attn_by_inverse_layer_idx",
    Keys(
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
    plan,
    block,
    head,
)
