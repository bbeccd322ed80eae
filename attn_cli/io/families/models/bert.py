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


def plan(family: str, padded: bool, config: Config, layer: int) -> LayerPlan:
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
    word, place, *norm = tables(config, C, positions)
    types = (config.whole("type_vocab_size", 2), C)
    embed = (
        word,
        place,
        Tensor("embed.types", "embeddings.token_type_embeddings.weight", types),
        *norm,
    )
    embedding = Embedding(
        "embed.tokens",
        "embed.positions",
        "embed.types",
        Norm("layer", eps, "embed.norm.weight", "embed.norm.bias"),
        position_offset=config.whole("pad_token_id", 1, minimum=0) if padded else None,
    )
    where = ("encoder.layer.", r"encoder\.layer\.\d+\.attention\.self\.query\.weight")
    plan = encoder_plan(family, (layer, layers, C, H), where, (tensors, embed), embedding)
    return replace(plan, unused=r"attention\.output\.LayerNorm\.(weight|bias)")  # after the add


def encoder_plan(
    family: str,
    sizes: tuple[int, int, int, int],
    where: tuple[str, str],
    tensors: tuple[tuple[Tensor, ...], tuple[Tensor, ...]],
    embedding: Embedding,
) -> LayerPlan:
    """A post-norm encoder's layer (BERT's, DistilBERT's): X is the residual stream as it is,
    no mask, the scale 1/sqrt(head_dim); ``sizes``: layer, layers, hidden, heads; ``tensors``:
    the layer's and the embeddings'; ``where``: the layers' prefix and the anchor's regex."""
    layer, layers, C, H = sizes
    prefix, anchor = where
    return LayerPlan(
        family,
        *(layer, layers, C, H, H, C // H),
        layout="linear",
        anchor=anchor,
        tensors=tensors[0],
        embed_tensors=tensors[1],
        pre_norm=None,
        embedding=embedding,
        causal=False,
        scale=(C // H) ** -0.5,
        block=f"{prefix}{layer}.",
        scopes=("attention.",),
    )


def block(config: Config, plan: LayerPlan) -> BlockPlan:
    """BertLayer past attention: the residual add, a LayerNorm, the dense MLP, another."""
    F = config.whole("intermediate_size", 3072)
    eps = config.number("layer_norm_eps", 1e-12)
    names = ("attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm")
    return post_norm_block(plan, names, F, eps, ("hidden_act", "gelu"), config)


def tables(config: Config, C: int, positions: int | None = None) -> tuple[Tensor, ...]:
    """The word and position tables and the embedding LayerNorm (BERT's and DistilBERT's names);
    ``positions``: the table's rows, when already read."""
    vocab = config.whole("vocab_size")
    rows = config.whole("max_position_embeddings", 512) if positions is None else positions
    return (
        Tensor("embed.tokens", "embeddings.word_embeddings.weight", (vocab, C)),
        Tensor("embed.positions", "embeddings.position_embeddings.weight", (rows, C)),
        Tensor("embed.norm.weight", "embeddings.LayerNorm.weight", (C,)),
        Tensor("embed.norm.bias", "embeddings.LayerNorm.bias", (C,)),
    )


def post_norm_block(
    plan: LayerPlan,
    names: tuple[str, str, str, str],
    F: int,
    eps: float,
    activation: tuple[str, str],
    config: Config,
) -> BlockPlan:
    """A post-norm encoder's block: the attention's LayerNorm, the dense MLP, its LayerNorm
    (``names``: the four modules)."""
    C, t = plan.hidden, tensor_of(plan)
    a, up, down, m = names
    tensors: tuple[Tensor, ...] = (
        t("a.w", f"{a}.weight", C),
        t("a.b", f"{a}.bias", C),
        t("in.weight", f"{up}.weight", F, C),
        t("in.bias", f"{up}.bias", F),
        t("out.weight", f"{down}.weight", C, F),
        t("out.bias", f"{down}.bias", C),
        t("m.w", f"{m}.weight", C),
        t("m.b", f"{m}.bias", C),
    )
    norms = {
        "attn_out": Norm("layer", eps, "a.w", "a.b"),
        "mlp_out": Norm("layer", eps, "m.w", "m.b"),
    }
    return BlockPlan("post", norms, "dense", False, act(config, *activation), tensors)


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


def _family(name: str, hf_class: str, padded: bool = True) -> Family:
    """BERT (``padded`` false), or a RoBERTa-like: positions from pad_token_id + 1."""
    return Family(
        name,
        hf_class,
        "post-norm: X is the residual stream as is; learned positions"
        + (" from pad_token_id + 1" if padded else ""),
        ROBERTA_KEYS if padded else KEYS,
        partial(plan, name, padded),
        block,
        partial(head, name),
        stems=("roberta",) if padded else (),
    )


FAMILY = _family("bert", "BertModel", padded=False)
ROBERTA = _family("roberta", "RobertaModel")
XLM_ROBERTA = _family("xlm-roberta", "XLMRobertaModel")
CAMEMBERT = _family("camembert", "CamembertModel")
