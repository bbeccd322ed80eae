"""DeepSeek V3 and V2: multi-head latent attention (DeepseekV3Attention, DeepseekV2Attention)
read into the fixture's mla key, and their mixtures of experts (the grouped sigmoid router of V3,
the softmax router of V2). The two differ by a table (``DeepSeek``), never by name."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from attn_cli.errors import field_name
from attn_cli.io.families.blocks import Block, TensorOf, decoder_block, decoder_head
from attn_cli.io.families.config import REQUIRED, Config, check_layer, finite, shown
from attn_cli.io.families.experts import each_expert, shared_mlp
from attn_cli.io.families.keys import LLAMA_ASSUMED, LLAMA_READS, Keys, Need
from attn_cli.io.families.plan import (
    Embedding,
    Experts,
    FloatArray,
    Greedy,
    Grouped,
    LayerPlan,
    Norm,
    Tensor,
)
from attn_cli.io.families.registry import Family
from attn_cli.io.families.rope import SCALED_READS, rope_mapping, scaling_note


@dataclass(frozen=True)
class Latent:
    """Multi-head latent attention's sizes (DeepSeek V3): the fixture's mla key."""

    rank: int  # kv_lora_rank: the latent's width
    q_rank: int | None  # q_lora_rank (None: one q_proj)
    nope: int  # qk_nope_head_dim
    rope: int  # qk_rope_head_dim
    v: int  # v_head_dim
    base: float  # the RoPE base of the rope dims
    eps: float = 1e-6  # q_a_layernorm's and kv_a_layernorm's (DeepseekV3RMSNorm's default)
    # yarn of the rope dims as the fixture's mla.scaling (DeepSeek V3's own); None: plain RoPE
    scaling: tuple[tuple[str, Any], ...] | None = None
    mscale: float = 1.0  # yarn_apply_mscale's: the softmax scale times mscale²
    pairs: bool = False  # each rotated RoPE pair in place (deepseek_v2), not split (deepseek_v3)

    variant = "mla"
    softmax = True
    scaled = True  # the fixture's scale: 1/sqrt(nope + rope) times yarn's mscale squared

    def sizes(self, hidden: int) -> str | None:
        """None: heads and head_dim, as any layer's."""
        return None

    def describe(
        self, plan: LayerPlan, label: str, checkpoint: str, given: str
    ) -> tuple[str, str] | None:
        """The fixture's name and description: an attention layer's, as any other."""
        return None

    def fixture(self, heads: int, t: Mapping[str, FloatArray]) -> tuple[dict[str, Any], FloatArray]:
        """The mla key and W_O from DeepseekV3Attention's Linear weights ([out, in], transposed):
        kv_a_proj_with_mqa's rows are the latent's (kv_lora_rank), then the shared RoPE key's;
        kv_b_proj's are per head [qk_nope_head_dim key rows | v_head_dim value rows]."""
        kv_a = t["kv_a.weight"].T  # (hidden, rank + rope)
        kv_b = t["kv_b.weight"].T.reshape(
            self.rank, heads, self.nope + self.v
        )  # per head: key | value
        mla: dict[str, Any] = {
            "W_DKV": kv_a[:, : self.rank],
            "W_KR": kv_a[:, self.rank :],
            "kv_norm": t["kv_a_norm.weight"],
            "W_UK": kv_b[:, :, : self.nope].reshape(self.rank, heads * self.nope),
            "W_UV": kv_b[:, :, self.nope :].reshape(self.rank, heads * self.v),
        }
        if self.q_rank is None:
            mla["W_Q"] = t["q.weight"].T
        else:
            mla |= {
                "W_DQ": t["q_a.weight"].T,
                "q_norm": t["q_a_norm.weight"],
                "W_UQ": t["q_b.weight"].T,
            }
        mla |= {"base": self.base, "eps": self.eps}
        if self.pairs:  # deepseek_v2: each rotated pair in place
            mla["rope_layout"] = "pairs"
        if self.scaling is not None:  # DeepSeek V3's yarn, and its softmax scale's mscale
            mla |= {f"scaling.{k}": v for k, v in self.scaling} | {"mscale": self.mscale}
        return mla, t["o.weight"].T


@dataclass(frozen=True)
class DeepSeek:
    """Where DeepSeek V2 differs from V3."""

    name: str
    config_class: str
    longest: int  # max_position_embeddings' default
    pairs: bool  # each rotated RoPE pair in place (view_as_complex), not de-interleaved
    interleave_key: bool  # rope_interleave read (false: refused)
    layout_note: str


V3 = DeepSeek(
    "deepseek_v3",
    "DeepseekV3Config",
    4096,
    False,
    True,
    "Q and K are [nope | rope] per head, the rope dims in transformers' de-interleaved "
    "layout (its query_states and key_states)",
)
V2 = DeepSeek(
    "deepseek_v2",
    "DeepseekV2Config",
    2048,
    True,
    False,
    "Q and K are [nope | rope] per head, each rotated rope pair in place as deepseek_v2's "
    "view_as_complex leaves it (its query_states and key_states; mla.rope_layout pairs)",
)


def plan(spec: DeepSeek, config: Config, layer: int) -> LayerPlan:
    """DeepSeek V3's multi-head latent attention (DeepseekV3Attention), read into the fixture's
    mla key: q_a_proj, q_a_layernorm, q_b_proj (or q_proj), kv_a_proj_with_mqa (the latent's
    rows, then the shared RoPE key's), kv_a_layernorm, kv_b_proj (per head: the key's rows,
    then the value's), o_proj; input_layernorm RMSNorm before; interleaved RoPE on the rope
    dims only; scale 1/sqrt(qk_nope_head_dim + qk_rope_head_dim). DeepSeek V2
    (DeepseekV2Attention) is the same layer with the same tensor names, its RoPE by
    view_as_complex (each rotated pair in place: mla.rope_layout pairs) and 2,048 as its
    max_position_embeddings default."""
    family = spec.name
    layers = check_layer(config, "num_hidden_layers", layer)
    C = config.whole("hidden_size")
    H = config.whole("num_attention_heads")
    if config.whole("num_key_value_heads", H) != H:  # the latent gives every head its K and V
        raise config.error(
            "num_key_value_heads",
            f"got {config.data['num_key_value_heads']}: transformers' "
            f"{family} expands the latent to every head, and repeats those by "
            "heads / num_key_value_heads",
            f"{H} (num_attention_heads)",
        )
    rank = config.whole("kv_lora_rank")
    q_rank = config.optional_whole("q_lora_rank", 1536)
    nope = config.whole("qk_nope_head_dim")
    rope_dims = config.whole("qk_rope_head_dim", minimum=2)
    if rope_dims % 2:
        raise config.error(
            "qk_rope_head_dim", f"got {rope_dims}: RoPE rotates pairs", "an even number >= 2"
        )
    v = config.whole("v_head_dim")
    D = nope + rope_dims
    _checks(config, rope_dims, D, spec)
    base, scaling, mscale = _rope(config, spec.longest)
    eps = config.number("rms_norm_eps", 1e-6)
    p = f"layers.{layer}."
    tensors = _tensors(p, C, H, (rank, q_rank, nope, rope_dims, v))
    embed = (Tensor("embed.tokens", "embed_tokens.weight", (config.whole("vocab_size"), C)),)
    notes = (
        "kv_a_proj_with_mqa rows split into mla.W_DKV (the first kv_lora_rank) and mla.W_KR "
        "(the last qk_rope_head_dim); kv_b_proj rows per head [key | value] split into mla.W_UK "
        "and mla.W_UV; every Linear transposed",
        spec.layout_note,
    )
    sizes = (layer, layers, C, H, H, D)  # layer, layers, hidden, heads, kv_heads, head_dim
    return LayerPlan(
        family,
        *sizes,
        layout="linear",
        anchor=r"layers\.\d+\.self_attn\.kv_a_proj_with_mqa\.weight",
        tensors=tensors,
        embed_tensors=embed,
        pre_norm=Norm("rms", eps, "norm.weight"),
        embedding=Embedding("embed.tokens"),
        causal=True,
        scale=float(D**-0.5) * mscale * mscale,
        front_end=Latent(
            rank,
            q_rank,
            nope,
            rope_dims,
            v,
            base,
            scaling=scaling,
            mscale=mscale,
            pairs=spec.pairs,
        ),
        notes=(*notes, *filter(None, [scaling_note(scaling)])),
        block=p,
        scopes=("self_attn.", "input_layernorm."),
        unused=r"self_attn\.rotary_emb\.inv_freq",
    )


def _checks(config: Config, rope_dims: int, D: int, spec: DeepSeek) -> None:
    """Keys DeepseekV3Config (DeepseekV2Config) sets itself, and what the mla key has no place
    for: refused."""
    cls = spec.config_class
    for key, want in (("head_dim", rope_dims), ("qk_head_dim", D)):
        if config.has(key) and config.whole(key) != want:  # the config class sets both itself
            raise config.error(
                key,
                f"got {config.data[key]}: {cls} sets it from the other sizes",
                f"{want} (or absent)",
            )
    if config.flag("attention_bias", False):
        raise config.error(
            "attention_bias",
            "got true: biases on q_a_proj, kv_a_proj_with_mqa and o_proj, "
            "which the mla key has no place for",
            "absent or false",
        )
    if spec.interleave_key and not config.flag("rope_interleave", True):
        raise config.error(
            "rope_interleave",
            "got false: RoPE by rotate_half on the rope dims, where the mla "
            "key rotates interleaved pairs (transformers' deepseek_v3 default)",
            "absent or true",
        )


def _tensors(
    p: str, C: int, H: int, sizes: tuple[int, int | None, int, int, int]
) -> tuple[Tensor, ...]:
    """DeepseekV3Attention's Linear weights and norms of one layer, and its input_layernorm."""
    rank, q_rank, nope, rope_dims, v = sizes
    a, D = f"{p}self_attn.", nope + rope_dims
    if q_rank is None:
        query = [Tensor("q.weight", f"{a}q_proj.weight", (H * D, C))]
    else:
        query = [
            Tensor("q_a.weight", f"{a}q_a_proj.weight", (q_rank, C)),
            Tensor("q_a_norm.weight", f"{a}q_a_layernorm.weight", (q_rank,)),
            Tensor("q_b.weight", f"{a}q_b_proj.weight", (H * D, q_rank)),
        ]
    return (
        *query,
        Tensor("kv_a.weight", f"{a}kv_a_proj_with_mqa.weight", (rank + rope_dims, C)),
        Tensor("kv_a_norm.weight", f"{a}kv_a_layernorm.weight", (rank,)),
        Tensor("kv_b.weight", f"{a}kv_b_proj.weight", (H * (nope + v), rank)),
        Tensor("o.weight", f"{a}o_proj.weight", (C, H * v)),
        Tensor("norm.weight", f"{p}input_layernorm.weight", (C,)),
    )


def _rope(
    config: Config, default_longest: int = 4096
) -> tuple[float, tuple[tuple[str, Any], ...] | None, float]:
    """The RoPE base of DeepSeek V3's rope dims, its yarn (DeepSeek V3's own: the fixture's
    mla.scaling, over qk_rope_head_dim dims as DeepseekV3Config's head_dim says) and the
    softmax scale's mscale (transformers' yarn_apply_mscale: yarn_get_mscale(factor,
    mscale_all_dim) where mscale_all_dim is set, else 1). The other scalings are refused:
    DeepSeek ships yarn, and no checkpoint checks the others here."""
    params, key = rope_mapping(config)
    params = {} if params is None else params
    if not isinstance(params, Mapping):
        raise config.error(key, f"got {shown(params)}", "one mapping such as {rope_type: default}")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "yarn"):
        raise config.error(
            key,
            f"rope_type {shown(rope_type)}: the mla key's RoPE scales by yarn only (DeepSeek V3's)",
            "default or yarn",
        )
    reads = SCALED_READS["yarn"] if rope_type == "yarn" else ()
    other = next((k for k in params if k not in ("rope_type", "type", "rope_theta", *reads)), None)
    if other is not None:
        raise config.error(
            f"{key}.{field_name(other)}",
            f"got {shown(params[other])} in a {rope_type} rope",
            "only " + ", ".join(("rope_type", "rope_theta", *reads)),
        )
    given = Config(params, config.source, f"{key}.")
    base = (given if "rope_theta" in params else config).number("rope_theta", 10000.0)
    if rope_type == "default":
        return base, None, 1.0
    found: dict[str, Any] = {k: params[k] for k in reads if params.get(k) is not None}
    original = "original_max_position_embeddings"
    longest = config.whole("max_position_embeddings", default_longest)  # the config class's
    if config.has(original):  # standardize_rope_params: the top-level value wins
        found[original] = config.whole(original)
    found.setdefault(original, longest)
    found["max_position_embeddings"] = longest
    factor: Any = found.get("factor")
    all_dim: Any = found.get("mscale_all_dim")
    if factor is None and type(found[original]) is int and found[original] > 0:
        factor = longest / found[original]
    mscale = 1.0  # a value of the wrong kind: the fixture's mla.scaling says so in one line
    if finite(factor) and finite(all_dim) and all_dim and factor > 1:
        mscale = 0.1 * all_dim * math.log(factor) + 1.0  # yarn_get_mscale(factor, all_dim)
    return base, (("type", "yarn"), *found.items()), mscale


def expert_groups(cfg: Config, E: int, default: tuple[int, int] | None = None) -> tuple[int, int]:
    """n_group and topk_group: groups of the E experts, the best topk_group kept (DeepSeek's
    routers, GLM-4.5's); ``default``: the config class's, else config.json must give them."""
    n, top = (REQUIRED, REQUIRED) if default is None else default
    groups = (cfg.whole("n_group", n), cfg.whole("topk_group", top))
    if E % groups[0] or groups[1] > groups[0]:
        raise cfg.error(
            "n_group",
            f"{groups[0]} groups of {E} experts, the best {groups[1]} kept",
            "a divisor of n_routed_experts, at least topk_group",
        )
    return groups


@dataclass(frozen=True)
class V3MoE:
    """A DeepSeek V3 mixture's config class defaults (DeepseekV3Config's, Glm4MoeConfig's)."""

    first_dense: int  # first_k_dense_replace
    experts: int  # n_routed_experts
    width: int  # moe_intermediate_size
    groups: tuple[int, int]  # n_group, topk_group
    scaling: float  # routed_scaling_factor


def v3_mixture(moe: V3MoE, cfg: Config, plan: LayerPlan, t: TensorOf) -> Experts | None:
    """DeepSeek V3's MoE (DeepseekV3MoE, GLM-4.5's Glm4MoeMoE) from layer first_k_dense_replace
    on (a dense MLP below): the grouped sigmoid router, the routed experts, and the shared
    experts (one MLP n_shared_experts × moe_intermediate_size wide, ungated) added to every
    token."""
    C = plan.hidden
    if plan.layer < cfg.whole("first_k_dense_replace", moe.first_dense, minimum=0):
        return None
    E, F = cfg.whole("n_routed_experts", moe.experts), cfg.whole("moe_intermediate_size", moe.width)
    k = cfg.whole("num_experts_per_tok", 8)
    groups = expert_groups(cfg, E, moe.groups)
    S = F * cfg.whole("n_shared_experts", 1)
    grouped = Grouped(
        t("router.correction", "mlp.gate.e_score_correction_bias", E),
        groups,
        cfg.number("routed_scaling_factor", moe.scaling),
    )
    return Experts(
        t("router", "mlp.gate.weight", E, C),
        each_expert(t, F, C),
        E,
        min(k, E),
        cfg.flag("norm_topk_prob", True),
        grouped=grouped,
        plain_shared=shared_mlp(t, "mlp.shared_experts.", S, C),
    )


def v2_experts(cfg: Config, plan: LayerPlan, t: TensorOf) -> Experts | None:
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
        groups = expert_groups(cfg, E)
    S = F * cfg.whole("n_shared_experts", 2)
    return Experts(
        t("router", "mlp.gate.weight", E, C),
        each_expert(t, F, C),
        E,
        min(k, E),
        False,
        greedy=Greedy(groups, cfg.number("routed_scaling_factor", 1.0)),
        plain_shared=shared_mlp(t, "mlp.shared_experts.", S, C),
    )


KEYS = Keys(
    reads=LLAMA_READS
    | {
        "kv_lora_rank",
        "q_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "qk_head_dim",
        "attention_bias",
        "rope_interleave",
        "vocab_size",
    },
    # the MoE MLP's routing (layers from first_k_dense_replace on), the multi-token
    # prediction layers (DeepSeek V3's own code and transformers'): no attention numbers
    inert=frozenset(
        {
            "first_k_dense_replace",
            "n_group",
            "n_routed_experts",
            "n_shared_experts",
            "num_nextn_predict_layers",
            "num_mtp_layers",
            "routed_scaling_factor",
            "topk_group",
            "topk_method",
            "scoring_func",
            "moe_layer_freq",
            "ep_size",
            "aux_loss_alpha",
            "seq_aux",
        }
    ),
    # read as deepseek_v3 under another model_type: only rope_interleave tells V3's RoPE
    # layout from V2's (each pair in place), which has the same keys and tensors
    needs=(Need(("rope_interleave",)),),
    assumed=LLAMA_ASSUMED,
)
# DeepSeek V2: V3's keys; its RoPE is always by view_as_complex (no rope_interleave to read)
V2_KEYS = replace(KEYS, reads=KEYS.reads - {"rope_interleave"}, needs=())


def _family(spec: DeepSeek, keys: Keys, block: Block, hf_class: str) -> Family:
    return Family(
        spec.name,
        hf_class,
        "multi-head latent attention (the mla key): the latent, the shared RoPE key, yarn",
        keys,
        partial(plan, spec),
        partial(decoder_block, block),
        partial(decoder_head, block),
    )


V3_MOE = V3MoE(3, 256, 2048, (8, 4), 2.5)
FAMILY = _family(V3, KEYS, Block(experts=partial(v3_mixture, V3_MOE)), "DeepseekV3ForCausalLM")
FAMILY_V2 = _family(V2, V2_KEYS, Block(experts=v2_experts), "DeepseekV2ForCausalLM")
