"""BERT: nn.Linear query/key/value and attention.output.dense, post-norm, learned positions and
token types; RoBERTa, XLM-R and CamemBERT are the same layer, positions counted from
pad_token_id + 1."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from attn_cli.io.families.blocks import act, no_head, tensor_of
from attn_cli.io.families.config import Config, check_layer, heads
from attn_cli.io.families.keys import Keys, Rule
from attn_cli.io.families.plan import BlockPlan, Embedding, HeadPlan, LayerPlan, Norm, Tensor
from attn_cli.io.families.registry import Family

ROBERTA_LIKE = ("roberta", "xlm-roberta", "camembert")  # BERT with positions from pad + 1


def plan(family: str, config: Config, layer: int) -> LayerPlan:
    """BERT: nn.Linear query/key/value/attention.output.dense, post-norm, learned positions
    (RoBERTa, XLM-R, CamemBERT: the same layer, positions counted from pad_token_id + 1)."""
    kind = config.text("position_embedding_type", "absolute")
    if kind != "absolute":
        raise config.error(
            "position_embedding_type", f"{kind!r} is not supported", "'absolute' (learned table)"
        )
    if config.flag("is_decoder", False):
        raise config.error("is_decoder", "a decoder BERT is not supported", "false (an encoder)")
    layers = check_layer(config, "num_hidden_layers", layer)
    C = config.whole("hidden_size")
    H = heads(config, C, "num_attention_heads")
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


def block(config: Config, plan: LayerPlan) -> BlockPlan:
    """BertLayer past attention: the residual add, a LayerNorm, the dense MLP, another."""
    C, t = plan.hidden, tensor_of(plan)
    F = config.whole("intermediate_size", 3072)
    eps = config.number("layer_norm_eps", 1e-12)
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
    return BlockPlan("post", norms, "dense", False, act(config, "hidden_act", "gelu"), tensors)


def head(family: str, config: Config, plan: LayerPlan, names: set[str], prefix: str) -> HeadPlan:
    """An encoder's: refused."""
    raise no_head(config, family)


KEYS = Keys(
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
)
# RoBERTa's: BERT's keys, pad_token_id read (the positions start after it)
ROBERTA_KEYS = replace(KEYS, reads=KEYS.reads | {"pad_token_id"}, ignored={})


def _family(name: str, hf_class: str) -> Family:
    return Family(
        name,
        hf_class,
        "post-norm: X is the residual stream as is; learned positions"
        + (" from pad_token_id + 1" if name in ROBERTA_LIKE else ""),
        ROBERTA_KEYS if name in ROBERTA_LIKE else KEYS,
        partial(plan, name),
        block,
        partial(head, name),
        stems=("roberta",) if name in ROBERTA_LIKE else (),
        encoder=True,
    )


FAMILY = _family("bert", "BertModel")
ROBERTA = _family("roberta", "RobertaModel")
XLM_ROBERTA = _family("xlm-roberta", "XLMRobertaModel")
CAMEMBERT = _family("camembert", "CamembertModel")
