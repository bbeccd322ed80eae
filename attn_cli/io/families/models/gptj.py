"""GPT-J: q/k/v/out projections without biases, RoPE on interleaved pairs (2i, 2i+1) of the first
rotary_dim dims of each head (base 10000, no key), ln_1 before attention and the MLP beside it
(transformers 5.25's modeling_gptj.py: GPTJAttention, GPTJBlock)."""

from __future__ import annotations

from attn_cli.io.families.blocks import act, dense_tensors, lm_head, tensor_of
from attn_cli.io.families.config import Config, check_layer, heads
from attn_cli.io.families.keys import Keys
from attn_cli.io.families.plan import BlockPlan, Embedding, HeadPlan, LayerPlan, Norm, Tensor
from attn_cli.io.families.registry import Family

THETA = 10000.0  # create_sinusoidal_positions' base: no config key sets it


def _rotary_dim(config: Config, head_dim: int) -> int:
    """rotary_dim (GPTJConfig's default 64), even and at most head_dim; null is refused, as
    GPTJConfig 5.25 refuses it (older versions rotated the whole head)."""
    if "rotary_dim" in config.data and config.data["rotary_dim"] is None:
        raise config.error("rotary_dim", "got null", f"an even number of dims <= {head_dim}")
    dims = config.whole("rotary_dim", 64, minimum=2)
    if dims > head_dim or dims % 2:
        raise config.error("rotary_dim", f"got {dims}", f"an even number of dims <= {head_dim}")
    return dims


def plan(config: Config, layer: int) -> LayerPlan:
    """One GPTJBlock's attention: q_proj, k_proj, v_proj, out_proj; ln_1 before; causal."""
    layers = check_layer(config, "n_layer", layer)
    C = config.whole("n_embd")
    H = heads(config, C, "n_head")
    D = C // H
    dims = _rotary_dim(config, D)
    p = f"h.{layer}."
    eps = config.number("layer_norm_epsilon", 1e-5)
    a = f"{p}attn."
    tensors = (
        *(Tensor(f"{x}.weight", f"{a}{x}_proj.weight", (C, C)) for x in "qkv"),
        Tensor("o.weight", f"{a}out_proj.weight", (C, C)),
        Tensor("norm.weight", f"{p}ln_1.weight", (C,)),
        Tensor("norm.bias", f"{p}ln_1.bias", (C,)),
    )
    embed = (Tensor("embed.tokens", "wte.weight", (config.whole("vocab_size"), C)),)
    sizes = (layer, layers, C, H, H, D)  # layer, layers, hidden, heads, kv_heads, head_dim
    rope = {"base": THETA, "layout": "interleaved", "dims": dims}
    return LayerPlan(
        "gptj",
        *sizes,
        layout="linear",
        anchor=r"h\.\d+\.attn\.q_proj\.weight",
        tensors=tensors,
        embed_tensors=embed,
        pre_norm=Norm("layer", eps, "norm.weight", "norm.bias"),
        embedding=Embedding("embed.tokens"),
        causal=True,
        scale=D**-0.5,
        variants={"rope": rope},
        positions=True,
        notes=(f"RoPE on interleaved pairs of the first {dims} of {D} dims of each head",),
        block=p,
        scopes=("attn.", "ln_1."),
        unused=r"attn\.(bias|masked_bias)",  # mask buffers older versions saved
    )


def block(config: Config, plan: LayerPlan) -> BlockPlan:
    """GPTJBlock past attention: the MLP (fc_in, fc_out) on ln_1's output, beside attention."""
    C, t = plan.hidden, tensor_of(plan)
    F = config.whole("n_inner", 4 * C)  # null: 4 * n_embd
    eps = config.number("layer_norm_epsilon", 1e-5)
    tensors = dense_tensors(t, "ln_1", ("mlp.fc_in.", "mlp.fc_out."), (C, F))
    activation = act(config, "activation_function", "gelu_new")
    norms = {"mlp_in": Norm("layer", eps, "n.w", "n.b")}
    return BlockPlan("parallel", norms, "dense", False, activation, tensors)


def head(config: Config, plan: LayerPlan, names: set[str], prefix: str) -> HeadPlan:
    """ln_f, then lm_head with its bias (untied by default)."""
    C, V = plan.hidden, plan.embed_tensors[0].shape[0]
    eps = config.number("layer_norm_epsilon", 1e-5)
    tensors = (
        Tensor("f.w", "ln_f.weight", (C,)),
        Tensor("f.b", "ln_f.bias", (C,)),
        lm_head(config, plan, names, prefix),
    )
    bias = Tensor("head.bias", "lm_head.bias", (V,))
    return HeadPlan(Norm("layer", eps, "f.w", "f.b"), tensors, None, bias)


FAMILY = Family(
    "gptj",
    "GPTJForCausalLM",
    "RoPE on interleaved pairs of the first rotary_dim dims of each head; a parallel block",
    Keys(
        reads=frozenset(
            {"n_embd", "n_head", "n_layer", "rotary_dim", "layer_norm_epsilon", "n_inner"}
        ),
        # n_positions sizes the sinusoid table, a buffer not saved
        inert=frozenset({"n_positions"}),
        assumed=("layer_norm_epsilon",),
    ),
    plan,
    block,
    head,
)
