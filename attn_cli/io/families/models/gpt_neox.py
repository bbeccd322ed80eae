"""GPT-NeoX (Pythia): query_key_value rows per head [heads, 3, head_dim], a quarter of each head
rotated (rotary_pct), LayerNorms with biases, attention and MLP in parallel by default."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from attn_cli.core.forward import Placement
from attn_cli.io.families.arch import LAYER_NORM
from attn_cli.io.families.blocks import act, dense_tensors, final_head, tensor_of
from attn_cli.io.families.config import Config
from attn_cli.io.families.decoder import llama_like
from attn_cli.io.families.keys import ROTARY, SIZES, Keys, Need
from attn_cli.io.families.plan import BlockPlan, HeadPlan, LayerPlan, Norm
from attn_cli.io.families.registry import Family

ARCH = replace(
    LAYER_NORM,
    eps=("layer_norm_eps", 1e-5),
    bias_default=True,
    partial=0.25,
    fused="heads",
    attn="attention",
    qkv_name="query_key_value",
    o_name="dense",
    embed_name="embed_in",
    reads_head_dim=False,
    theta_key="rotary_emb_base",
    partial_key="rotary_pct",
)
KEYS = Keys(
    reads=SIZES - {"head_dim", "num_key_value_heads"}
    | ROTARY
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
)


def block(config: Config, plan: LayerPlan) -> BlockPlan:
    """GPTNeoXLayer past attention: post_attention_layernorm, the dense MLP (dense_h_to_4h,
    dense_4h_to_h), beside attention when use_parallel_residual."""
    C, t = plan.hidden, tensor_of(plan)
    F = config.whole("intermediate_size")
    eps = config.number("layer_norm_eps", 1e-5)
    mlp = ("mlp.dense_h_to_4h.", "mlp.dense_4h_to_h.")
    tensors = dense_tensors(t, "post_attention_layernorm", mlp, (C, F))
    placement: Placement = "parallel" if config.flag("use_parallel_residual", True) else "pre"
    norms = {"mlp_in": Norm("layer", eps, "n.w", "n.b")}
    activation = act(config, "hidden_act", "gelu")
    return BlockPlan(placement, norms, "dense", False, activation, tensors)


def head(config: Config, plan: LayerPlan, names: set[str], prefix: str) -> HeadPlan:
    """final_layer_norm, then embed_out (the LM head)."""
    eps = config.number("layer_norm_eps", 1e-5)
    norm = Norm("layer", eps, "f.w", "f.b")
    final = (norm, ("final_layer_norm.weight", "final_layer_norm.bias"))
    return final_head(config, plan, (names, prefix), final, own="embed_out.weight")


FAMILY = Family(
    "gpt_neox",
    "GPTNeoXForCausalLM",
    "the fused query_key_value split per head, partial rotary (rotary_pct)",
    KEYS,
    partial(llama_like, ARCH, "gpt_neox"),
    block,
    head,
    reads_partial=True,
)
