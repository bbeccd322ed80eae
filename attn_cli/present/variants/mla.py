"""Multi-head latent attention (DeepSeek V2/V3), what present/ says about it: the naive form's
stages, the absorbed form's, and why they are equal."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import Lang, en_zh, formula_text, label
from attn_cli.present.variant_texts import VariantTexts, stage_explainer

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.present.explain_registry import Context, Parts

# stage -> (the stages it reads, English, Chinese)
_MEANINGS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "c_Q": (
        ("X",),
        "q LoRA: every token squeezed into a small query latent first (q_a_proj).",
        "q LoRA：先把每个词元压缩成一个小的查询潜向量（q_a_proj）。",
    ),
    "c_Q_norm": (
        ("c_Q",),
        "RMSNorm of the query latent (q_a_layernorm), before it is expanded.",
        "查询潜向量的 RMSNorm（q_a_layernorm），在展开之前。",
    ),
    "q_nope": (
        ("c_Q_norm",),
        "Each head's query without position: the part that meets K_nope, d_nope numbers per head.",
        "每个头不带位置的查询：与 K_nope 相乘的部分，每个头 d_nope 个数。",
    ),
    "q_rope": (
        ("c_Q_norm",),
        "Each head's query part that RoPE turns: d_rope numbers per head.",
        "每个头中由 RoPE 旋转的查询部分：每个头 d_rope 个数。",
    ),
    "c_KV": (
        ("X",),
        "The latent: all a token's keys and values compressed into kv_lora_rank "
        "numbers, one vector for every head. This, with k_rope, is what the KV cache holds.",
        "潜向量：一个词元的全部键和值被压缩成 kv_lora_rank 个数，所有头共用一个。"
        "KV 缓存里存的就是它和 k_rope。",
    ),
    "c_KV_norm": (
        ("c_KV",),
        "RMSNorm of the latent (kv_a_layernorm).",
        "潜向量的 RMSNorm（kv_a_layernorm）。",
    ),
    "k_rope": (
        ("X",),
        "The decoupled RoPE key: d_rope numbers per token, shared by all heads "
        "(the last columns of kv_a_proj_with_mqa). RoPE cannot pass through W_UK, so "
        "position lives here, outside the latent.",
        "解耦的 RoPE 键：每个词元 d_rope 个数，所有头共享（kv_a_proj_with_mqa 的最后几列）。"
        "RoPE 无法穿过 W_UK，所以位置信息放在这里，潜向量之外。",
    ),
    "K_nope": (
        ("c_KV_norm",),
        "Each head's key without position, decompressed from the latent "
        "by W_UK (kv_b_proj's key rows).",
        "每个头不带位置的键，由 W_UK（kv_b_proj 中键的行）从潜向量解压得到。",
    ),
    "q_rope_rot": (
        ("q_rope",),
        "RoPE on the query's rope part only, in DeepSeek's interleaved "
        "pairs (x0, x1), (x2, x3), ...; transformers' deepseek_v3 writes the pairs' first "
        "numbers, then their second numbers; its deepseek_v2 (rope_layout: pairs) keeps each "
        "rotated pair in place. The scores are the same either way.",
        "只对查询的 rope 部分做 RoPE，按 DeepSeek 的交错成对 (x0, x1), (x2, x3), ...；"
        "transformers 的 deepseek_v3 先写各对的第一个数，再写第二个数；它的 deepseek_v2"
        "（rope_layout: pairs）让每一对旋转后留在原位。两种写法的分数相同。",
    ),
    "k_rope_rot": (
        ("k_rope",),
        "RoPE on the shared key part, the same rotation as the query's.",
        "对共享的键部分做同样的 RoPE。",
    ),
    "q_absorbed": (
        ("q_nope",),
        "The absorbed form: W_UK folded into the query, so the query "
        "meets the latent itself: q_nope·K_nopeᵀ = q_nope·(c_KV_norm·W_UK)ᵀ = "
        "(q_nope·W_UKᵀ)·c_KV_normᵀ. Inference never decompresses K.",
        "吸收形式：把 W_UK 并入查询，查询直接与潜向量相乘：q_nope·K_nopeᵀ = "
        "q_nope·(c_KV_norm·W_UK)ᵀ = (q_nope·W_UKᵀ)·c_KV_normᵀ。推理时从不解压 K。",
    ),
    "scores_absorbed": (
        ("q_absorbed", "c_KV_norm"),
        "The scores of the absorbed form: the "
        "latent part plus the RoPE part. attn checks they equal scores to "
        "rounding on every run that shows them.",
        "吸收形式的分数：潜向量部分加 RoPE 部分。只要显示它们，attn 每次运行都检查它们与 "
        "scores 在舍入误差内相等。",
    ),
    "output_latent": (
        ("softmax", "c_KV_norm"),
        "The weights applied to the latent directly: "
        "one weighted sum of kv_lora_rank numbers per head.",
        "权重直接作用于潜向量：每个头得到 kv_lora_rank 个数的加权和。",
    ),
    "output_absorbed": (
        ("output_latent",),
        "W_UV applied after attention: softmax·(c·W_UV) = "
        "(softmax·c)·W_UV. attn checks it equals output to rounding.",
        "注意力之后再乘 W_UV：softmax·(c·W_UV) = (softmax·c)·W_UV。attn 检查"
        "它与 output 在舍入误差内相等。",
    ),
    "Q": (
        ("q_nope", "q_rope_rot"),
        "Each head's query: the part without position joined to "
        "the rotated part, d_nope + d_rope numbers, what DeepSeek's query_states holds.",
        "每个头的查询：不带位置的部分接上旋转后的部分，共 d_nope + d_rope 个数，"
        "即 DeepSeek 的 query_states。",
    ),
    "K": (
        ("K_nope", "k_rope_rot"),
        "Each head's key: its own K_nope joined to the one "
        "k_rope_rot every head shares (expand_kv in transformers).",
        "每个头的键：自己的 K_nope 接上所有头共享的同一个 k_rope_rot（transformers 的 "
        "expand_kv）。",
    ),
    "V": (
        ("c_KV_norm",),
        "Each head's values, decompressed from the same latent by W_UV (kv_b_proj's value rows).",
        "每个头的值，由 W_UV（kv_b_proj 中值的行）从同一个潜向量解压得到。",
    ),
}
_QKV = ("Q", "K", "V")

# the backward's rows: stage -> (the stages it reads, English, Chinese)
_GRAD_MEANINGS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "d_q_nope": (
        ("d_Q",),
        "Q joined q_nope and q_rope_rot side by side, so its gradient splits "
        "the same way: the first d_nope columns of each head go to q_nope.",
        "Q 是把 q_nope 和 q_rope_rot 并排接起来的，所以梯度也同样切开：每个头的前 "
        "d_nope 列归 q_nope。",
    ),
    "d_q_rope_rot": (
        ("d_Q",),
        "The last d_rope columns of each head's d_Q: the rotated part.",
        "每个头 d_Q 的后 d_rope 列：旋转过的部分。",
    ),
    "d_K_nope": (
        ("d_K",),
        "The first d_nope columns of each head's d_K go to that head's K_nope.",
        "每个头 d_K 的前 d_nope 列归这个头的 K_nope。",
    ),
    "d_k_rope_rot": (
        ("d_K",),
        "Every head's key ends in the same k_rope_rot, so its gradient "
        "is the sum of every head's last d_rope columns of d_K, as a GQA key sums "
        "its group.",
        "每个头的键都以同一个 k_rope_rot 结尾，所以它的梯度是所有头 d_K 后 d_rope "
        "列之和，就像 GQA 的键要对组内求和。",
    ),
    "d_q_rope": (
        ("d_q_rope_rot",),
        "RoPE is a rotation, so its gradient is the rotation back: "
        "each pair turned by −angle, then written in the interleaved order again.",
        "RoPE 是旋转，所以它的梯度就是转回去：每一对按 −角度 旋转，再按交错顺序写回。",
    ),
    "d_k_rope": (
        ("d_k_rope_rot",),
        "The shared RoPE key's gradient rotated back, as the query's.",
        "共享 RoPE 键的梯度，和查询的一样转回去。",
    ),
    "d_W_UK": (
        ("c_KV_norm", "d_K_nope"),
        "K_nope = c_KV_norm·W_UK: the latent transposed times "
        "the gradient of every head's K_nope, summed over the tokens.",
        "K_nope = c_KV_norm·W_UK：潜向量的转置乘以每个头 K_nope 的梯度，对所有词元求和。",
    ),
    "d_W_UV": (
        ("c_KV_norm", "d_V"),
        "V = c_KV_norm·W_UV: the latent transposed times d_V.",
        "V = c_KV_norm·W_UV：潜向量的转置乘以 d_V。",
    ),
    "d_c_KV_norm": (
        ("d_K_nope", "d_V"),
        "The latent feeds every head's K_nope and V, so its "
        "gradient gathers all of them: MLA's keys and values learn through one "
        "small vector per token.",
        "潜向量产生了每个头的 K_nope 和 V，所以它的梯度把这些全部收集起来：MLA 的键"
        "和值都通过每个词元的一个小向量来学习。",
    ),
    "d_c_KV": (
        ("d_c_KV_norm", "c_KV"),
        "Back through the RMSNorm: the gradient scaled by 1/ρ, "
        "minus its part along c_KV itself, since making c_KV longer changes ρ too.",
        "反向穿过 RMSNorm：梯度乘以 1/ρ，再减去沿 c_KV 自身方向的部分，因为把 c_KV "
        "变长也会改变 ρ。",
    ),
    "d_kv_norm": (
        ("d_c_KV_norm", "c_KV"),
        "The norm's weight multiplies every token's normed "
        "latent, so its gradient sums d_c_KV_norm ⊙ c_KV/ρ over the tokens.",
        "归一化的权重乘在每个词元归一化后的潜向量上，所以它的梯度是 "
        "d_c_KV_norm ⊙ c_KV/ρ 对所有词元求和。",
    ),
    "d_W_UQ": (
        ("c_Q_norm", "d_q_nope", "d_q_rope"),
        "q = c_Q_norm·W_UQ, each head's columns "
        "[q_nope | q_rope]: the query latent transposed times that gradient.",
        "q = c_Q_norm·W_UQ，每个头的列是 [q_nope | q_rope]：查询潜向量的转置乘以这个梯度。",
    ),
    "d_c_Q_norm": (
        ("d_q_nope", "d_q_rope"),
        "The query latent's gradient: every head's "
        "[d_q_nope | d_q_rope] brought back through W_UQ.",
        "查询潜向量的梯度：每个头的 [d_q_nope | d_q_rope] 经 W_UQ 传回。",
    ),
    "d_c_Q": (
        ("d_c_Q_norm", "c_Q"),
        "Back through q LoRA's RMSNorm, as for the latent c_KV.",
        "反向穿过 q LoRA 的 RMSNorm，和潜向量 c_KV 的一样。",
    ),
    "d_q_norm": (
        ("d_c_Q_norm", "c_Q"),
        "The query norm's weight: d_c_Q_norm ⊙ c_Q/ρ summed over the tokens.",
        "查询归一化的权重：d_c_Q_norm ⊙ c_Q/ρ 对所有词元求和。",
    ),
    "d_W_DQ": (
        ("X", "d_c_Q"),
        "c_Q = X·W_DQ: Xᵀ times the query latent's gradient.",
        "c_Q = X·W_DQ：Xᵀ 乘以查询潜向量的梯度。",
    ),
    "d_W_DKV": (
        ("X", "d_c_KV"),
        "c_KV = X·W_DKV: Xᵀ times the latent's gradient.",
        "c_KV = X·W_DKV：Xᵀ 乘以潜向量的梯度。",
    ),
    "d_W_KR": (
        ("X", "d_k_rope"),
        "k_rope = X·W_KR: Xᵀ times the shared RoPE key's gradient.",
        "k_rope = X·W_KR：Xᵀ 乘以共享 RoPE 键的梯度。",
    ),
}


def _grad_explainer(stage: str) -> Callable[[Context], Parts]:
    reads, en, zh = _GRAD_MEANINGS[stage]

    def explain(c: Context) -> Parts:
        from attn_cli.present.explain_backward import gradient_meaning, shaped

        formula = (formula_text(c.lang, c.trace[stage].formula),)
        return formula, tuple(shaped(c, s) for s in reads), [gradient_meaning(c), en_zh(c, en, zh)]

    return explain


def _explainer(stage: str) -> Callable[[Context], Parts]:
    return stage_explainer(*_MEANINGS[stage], stage=stage)


class MLATexts(VariantTexts):
    name = "mla"
    order = 5
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "mode_mla": "latent (mla): Q, K, V made from X through the latent c_KV (DeepSeek)",
            "scale_mla": "{scale} = mscale²/√(d_nope + d_rope) (DeepSeek's)",
            "conv_mla": "mla: kv_lora_rank {rank}, d_rope {rope} shared by all heads, "
            "q LoRA {lora}; naive and absorbed forms checked equal",
        },
        "zh": {
            "mode_mla": "潜向量（mla）：Q、K、V 经潜向量 c_KV 由 X 得到（DeepSeek）",
            "scale_mla": "{scale} = mscale²/√(d_nope + d_rope)（DeepSeek 的缩放）",
            "conv_mla": "mla：kv_lora_rank {rank}，所有头共享 d_rope {rope}，q LoRA {lora}；"
            "朴素形式与吸收形式已核对相等",
        },
    }
    explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {
        **{s: _explainer(s) for s in _MEANINGS if s not in _QKV},
        **{s: _grad_explainer(s) for s in _GRAD_MEANINGS},
    }
    front_explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {s: _explainer(s) for s in _QKV}
    math_names = tuple(s for s in _MEANINGS if s not in _QKV)
    formula_zh: ClassVar[tuple[tuple[str, str], ...]] = (
        (r" per head$", " 每个头"),
        (r" \(one for all heads\)$", "（所有头共用）"),
        (r", interleaved pairs$", "，交错成对"),
        (r", interleaved pairs kept in place", "，交错成对、各对留在原位"),
        (r", interleaved pairs(?=, )", "，交错成对"),
        (r" on every head\]$", " 在每个头上]"),
        (r" \(W_UK absorbed into the query\)$", "（W_UK 并入查询）"),
        (r" \(one key for all heads\)$", "（所有头共用一个键）"),
        (r", each pair turned back by its angle$", "，每一对按它的角度转回"),
        (r" \(heads side by side\)$", "（各头并排）"),
        (r" \(every head's\)$", "（所有头的）"),
    )

    # attn decode: the cache holds the latent, W_UK absorbed into the query, W_UV after
    view_notes: ClassVar[dict[str, dict[str, dict[Lang, tuple[str, str]]]]] = {
        "decode": {
            "Q_latent": {
                "en": (
                    "q = [q_nope·W_UKᵀ | q_rope_rot] (W_UK absorbed into the query)",
                    "The absorbed form DeepSeek runs at inference: each head's q_nope is "
                    "multiplied by its W_UK once, so the query meets the latent directly "
                    "and no key is ever decompressed. q_rope_rot keeps the position.",
                ),
                "zh": (
                    "q = [q_nope·W_UKᵀ | q_rope_rot]（W_UK 并入查询）",
                    "DeepSeek 推理时用的吸收形式：每个头的 q_nope 先乘上它的 W_UK，"
                    "查询直接与潜向量相乘，键从不解压。q_rope_rot 保留位置信息。",
                ),
            },
            "K_latent": {
                "en": (
                    "cache[slot] = [c_KV_norm | k_rope_rot] of the token held there",
                    "What MLA caches: the token's normed latent and its rotated RoPE key, "
                    "kv_lora_rank + d_rope numbers for all heads together, instead of "
                    "every head's K and V. Every query head reads the same cache.",
                ),
                "zh": (
                    "cache[槽] = 该槽中那个词的 [c_KV_norm | k_rope_rot]",
                    "MLA 缓存的内容：词元归一化后的潜向量和旋转过的 RoPE 键，所有头合计 "
                    "kv_lora_rank + d_rope 个数，而不是每个头的 K 和 V。"
                    "所有查询头读同一份缓存。",
                ),
            },
            "output_latent": {
                "en": (
                    "output_latent = softmax · c_KV_norm; output = output_latent · W_UV",
                    "The values are the latent itself (the cache's first kv_lora_rank "
                    "columns, not stored again): each head averages the latents, then its "
                    "W_UV turns the average into its output, as the naive form's softmax·V.",
                ),
                "zh": (
                    "output_latent = softmax · c_KV_norm；output = output_latent · W_UV",
                    "值就是潜向量本身（缓存的前 kv_lora_rank 列，不另存）：每个头先对潜向量"
                    "加权平均，再由它的 W_UV 变成输出，与朴素形式的 softmax·V 相同。",
                ),
            },
        },
    }
    view_inputs: ClassVar[dict[str, dict[str, tuple[str, ...]]]] = {
        "decode": {
            "Q_latent": ("q_nope", "q_rope_rot"),
            "K_latent": ("c_KV_norm", "k_rope_rot"),
            "output_latent": ("softmax", "c_KV_norm"),
        },
    }
    cost: ClassVar[dict[Lang, str]] = {
        "en": "MLA caches the latent and the RoPE key: kv_lora_rank + d_rope = {n} numbers a "
        "token for all heads, {x}x fewer than the same heads' K and V (MHA's row)",
        "zh": "MLA 缓存潜向量和 RoPE 键：所有头合计每个词 kv_lora_rank + d_rope = {n} 个数，"
        "是同样多头的 K 和 V（MHA 一行）的 1/{x}",
    }

    def cost_notes(self, value: Any, per_token: int, seq: int, lang: Lang) -> list[str]:
        n = value.rank + value.d_rope
        return [self.cost[lang].format(n=n, x=f"{_mha_numbers(value) / n:.1f}")]

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        lora = "—" if value.W_DQ is None else str(value.W_DQ.shape[1])
        return [label(lang, "conv_mla", rank=value.rank, rope=value.d_rope, lora=lora)]


def _mha_numbers(value: Any) -> int:
    """The numbers a token's K and V take over every head: heads · (d_nope + d_rope + d_v)."""
    return int(value.W_UK.shape[1] + value.W_UV.shape[1]) + _heads(value) * int(value.d_rope)


def _heads(value: Any) -> int:
    """The heads, from W_UQ's or W_Q's columns: heads · (d_nope + d_rope)."""
    q = value.W_UQ if value.W_UQ is not None else value.W_Q
    d_nope_all = int(value.W_UK.shape[1])
    return (int(q.shape[1]) - d_nope_all) // int(value.d_rope)


TEXTS = MLATexts()
