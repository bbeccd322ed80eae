"""DistilBERT: q_lin/k_lin/v_lin/out_lin, post-norm, learned positions, no token types."""

from __future__ import annotations

from attn_cli.io.families.blocks import no_head
from attn_cli.io.families.config import Config, check_layer, heads
from attn_cli.io.families.keys import Keys
from attn_cli.io.families.models.bert import encoder_plan, post_norm_block, tables
from attn_cli.io.families.plan import BlockPlan, Embedding, HeadPlan, LayerPlan, Norm, Tensor
from attn_cli.io.families.registry import Family


def plan(config: Config, layer: int) -> LayerPlan:
    """DistilBERT: q_lin/k_lin/v_lin/out_lin, post-norm, learned positions, no token types."""
    if config.flag("sinusoidal_pos_embds", False):
        raise config.error(
            "sinusoidal_pos_embds", "is not supported", "false (a learned position table)"
        )
    layers = check_layer(config, "n_layers", layer)
    C = config.whole("dim")
    H = heads(config, C, "n_heads")
    p = f"transformer.layer.{layer}.attention."
    tensors = tuple(
        Tensor(f"{x}.{part}", f"{p}{name}.{part}", (C, C) if part == "weight" else (C,))
        for x, name in (("q", "q_lin"), ("k", "k_lin"), ("v", "v_lin"), ("o", "out_lin"))
        for part in ("weight", "bias")
    )
    embed = tables(config, C)
    embedding = Embedding(
        "embed.tokens",
        "embed.positions",
        norm=Norm("layer", 1e-12, "embed.norm.weight", "embed.norm.bias"),
    )
    where = ("transformer.layer.", r"transformer\.layer\.\d+\.attention\.q_lin\.weight")
    return encoder_plan("distilbert", (layer, layers, C, H), where, (tensors, embed), embedding)


def block(config: Config, plan: LayerPlan) -> BlockPlan:
    """TransformerBlock past attention: its LayerNorms' eps is fixed at 1e-12."""
    F = config.whole("hidden_dim", 4 * plan.hidden)
    names = ("sa_layer_norm", "ffn.lin1", "ffn.lin2", "output_layer_norm")
    return post_norm_block(plan, names, F, 1e-12, ("activation", "gelu"), config)


def head(config: Config, plan: LayerPlan, names: set[str], prefix: str) -> HeadPlan:
    """An encoder's: refused."""
    raise no_head(config, "distilbert")


FAMILY = Family(
    "distilbert",
    "DistilBertModel",
    "post-norm: X is the residual stream as is; learned positions",
    Keys(
        reads=frozenset({"dim", "n_heads", "n_layers", "sinusoidal_pos_embds"}),
        inert=frozenset({"hidden_dim", "activation", "tie_weights_"}),
    ),
    plan,
    block,
    head,
)
