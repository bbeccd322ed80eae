"""Differential attention (Differential Transformer), what present/ says about it: the two halves
of Q and K, both softmax maps, λ, the difference map, the head output, its norm and scale."""

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
    "Q_1": (
        ("Q",),
        "Each head's query is cut in two halves of d_k/2 numbers: Q1, the first half, makes the "
        "first map; Q2, the second, the second map (the reference views q_proj's output as "
        "2·heads halves of head_dim).",
        "每个头的查询被切成两半，每半 d_k/2 个数：前一半 Q1 生成第一张图，后一半 Q2 生成第二张"
        "图（参考代码把 q_proj 的输出看成 2·heads 个 head_dim 宽的半头）。",
    ),
    "K_1": (
        ("K",),
        "Each head's key cut the same way: K1 meets Q1, K2 meets Q2.",
        "每个头的键也这样切开：K1 与 Q1 相乘，K2 与 Q2 相乘。",
    ),
    "scores_2": (
        ("Q", "K"),
        "The second score map: the second halves' dot products. The chain's scores, scaled, "
        "masked and softmax above are the first map's, from Q1 and K1.",
        "第二张分数图：后一半的点积。上面链中的 scores、scaled、masked 和 softmax 是第一张图的，"
        "由 Q1 和 K1 得到。",
    ),
    "softmax_2": (
        ("scores_2",),
        "The second map's weights: the same scale 1/√(d_k/2) and the same mask as the first, "
        "each row summing to 1. Both maps put weight on noise; their difference cancels it.",
        "第二张图的权重：与第一张图用同样的缩放 1/√(d_k/2) 和同样的掩码，每行之和为 1。两张图"
        "都会把一些权重放在噪声上，二者相减就把它抵消了。",
    ),
    "lambda": (
        (),
        "λ, one number for the layer (the same for every head, as the reference has it): "
        "re-parameterised as exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init, so the four learned "
        "vectors move it smoothly around λ_init, which grows with the layer's depth.",
        "λ，整层一个数（参考代码中所有头相同）：重新参数化为 exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + "
        "λ_init，四个可学习的向量让它在 λ_init 附近平滑变化，λ_init 随层深增大。",
    ),
    "diff": (
        ("softmax", "softmax_2", "lambda"),
        "The difference map A1 − λ·A2: what each query really reads. Its rows sum to 1 − λ, and "
        "a cell can be negative: the second map subtracts the attention both maps give to "
        "irrelevant keys, as a differential amplifier cancels common-mode noise.",
        "差分图 A1 − λ·A2：每个查询真正读取的权重。它的每行之和为 1 − λ，单个格子可以为负："
        "第二张图减去两张图都分给无关键的注意力，就像差分放大器抵消共模噪声。",
    ),
    "diff_output": (
        ("diff", "V"),
        "Each head's output: the difference map times V. V has d_v = d_k numbers per head, "
        "twice the width of each half of Q and K.",
        "每个头的输出：差分图乘以 V。V 每个头有 d_v = d_k 个数，是 Q、K 每一半宽度的两倍。",
    ),
    "diff_norm": (
        ("diff_output",),
        "RMSNorm of each head's output on its own (the reference's subln, eps 1e-5, with its "
        "weight): the difference map's rows no longer sum to 1, so each head is brought back "
        "to one scale.",
        "每个头的输出各自做 RMSNorm（参考代码中的 subln，eps 1e-5，带权重）：差分图的行之和不再"
        "是 1，所以要把每个头拉回同一尺度。",
    ),
    "diff_scaled": (
        ("diff_norm",),
        "Times (1 − λ_init), a fixed number per layer, so that the gradients flow as in an "
        "ordinary Transformer; concat joins these heads and W_O projects them.",
        "乘以 (1 − λ_init)，每层一个固定的数，使梯度像普通 Transformer 一样流动；concat 拼接这些"
        "头，W_O 再投影。",
    ),
}


# the backward's rows: stage -> (the stages it reads, English, Chinese)
_GRAD_MEANINGS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "d_diff_scaled": (
        ("d_concat",),
        "concat joined each head's diff_scaled, so head h's gradient is d_concat's columns "
        "h·d_v to (h+1)·d_v (the upstream gradient itself without W_O).",
        "concat 拼接的是每个头的 diff_scaled，所以第 h 个头的梯度就是 d_concat 的第 h·d_v 到 "
        "(h+1)·d_v 列（没有 W_O 时就是上游梯度本身）。",
    ),
    "d_diff_norm": (
        ("d_diff_scaled",),
        "The (1 − λ_init) scale is a constant of the layer: the gradient is multiplied by it "
        "and it takes none.",
        "（1 − λ_init）是这一层的常数：梯度乘以它，它自己没有梯度。",
    ),
    "d_norm": (
        ("d_diff_norm", "diff_output"),
        "subln's weight multiplies every head's normed output, so its gradient sums over the "
        "heads as well as the tokens.",
        "subln 的权重乘在每个头归一化后的输出上，所以它的梯度要对所有头和所有词元求和。",
    ),
    "d_diff_output": (
        ("d_diff_norm", "diff_output"),
        "Back through the per-head RMSNorm: the gradient scaled by 1/ρ minus its part along the "
        "head's output, since a longer output changes ρ too. It is also d_output: output = "
        "softmax·V is the first term of diff_output = softmax·V − λ·softmax_2·V.",
        "反向穿过每个头的 RMSNorm：梯度乘以 1/ρ，再减去沿该头输出方向的部分，因为输出变长也会"
        "改变 ρ。它也就是 d_output：output = softmax·V 是 diff_output = softmax·V − "
        "λ·softmax_2·V 的第一项。",
    ),
    "d_diff": (
        ("d_diff_output", "V"),
        "diff_output = diff·V, so the difference map's gradient is d_diff_output·Vᵀ, as "
        "d_softmax is for one map. The first map receives it as it is.",
        "diff_output = diff·V，所以差分图的梯度是 d_diff_output·Vᵀ，和一张图时的 d_softmax "
        "一样。第一张图原样收到它。",
    ),
    "d_lambda": (
        ("d_diff", "softmax_2"),
        "diff = softmax − λ·softmax_2, so λ's gradient is −Σ d_diff ⊙ softmax_2 over the head's "
        "cells. λ is shared by all heads in the reference, so its one gradient is the sum of "
        "this row.",
        "diff = softmax − λ·softmax_2，所以 λ 的梯度是该头所有格子上 −Σ d_diff ⊙ softmax_2。"
        "参考代码中 λ 是所有头共用的一个数，所以它唯一的梯度就是这一行之和。",
    ),
    "d_lambda_q1": (
        ("d_lambda",),
        "Through the re-parameterisation λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init: the "
        "chain rule through exp and the dot product. Vectors shared by the heads take every "
        "head's d_λ.",
        "穿过重新参数化 λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init：对 exp 和点积用链式"
        "法则。所有头共用的向量收到每个头的 d_λ 之和。",
    ),
    "d_lambda_k1": (
        ("d_lambda",),
        "As d_λ_q1, with λ_q1 and λ_k1 swapping places.",
        "和 d_λ_q1 一样，只是 λ_q1 与 λ_k1 互换位置。",
    ),
    "d_lambda_q2": (
        ("d_lambda",),
        "The second exponential enters λ with a minus sign, so its vectors' gradients do too.",
        "第二个指数以负号进入 λ，所以它的向量的梯度也带负号。",
    ),
    "d_lambda_k2": (
        ("d_lambda",),
        "As d_λ_q2, with λ_q2 and λ_k2 swapping places.",
        "和 d_λ_q2 一样，只是 λ_q2 与 λ_k2 互换位置。",
    ),
    "d_softmax_2": (
        ("d_diff", "lambda"),
        "The second map enters diff times −λ, so its gradient is −λ·d_diff.",
        "第二张图以 −λ 倍进入 diff，所以它的梯度是 −λ·d_diff。",
    ),
    "d_scores_2": (
        ("d_softmax_2", "softmax_2"),
        "Back through the second map's softmax (0 where a key is not allowed) and the scale: "
        "the same steps as the first map's d_masked and d_scores. Then d_scores_2·K_2 fills the "
        "second half of d_Q, d_scores_2ᵀ·Q_2 the second half of d_K.",
        "反向穿过第二张图的 softmax（不允许的键处为 0）和缩放：与第一张图的 d_masked、"
        "d_scores 步骤相同。然后 d_scores_2·K_2 填入 d_Q 的后一半，d_scores_2ᵀ·Q_2 填入 d_K "
        "的后一半。",
    ),
}


def _grad_explainer(stage: str) -> Callable[[Context], Parts]:
    reads, en, zh = _GRAD_MEANINGS[stage]

    def explain(c: Context) -> Parts:
        from attn_cli.present.explain_backward import explain_upstream, gradient_meaning, shaped

        if stage == "d_diff_scaled" and c.trace.inputs.W_O is None:
            return explain_upstream(c)
        formula = (formula_text(c.lang, c.trace[stage].formula),)
        return formula, tuple(shaped(c, s) for s in reads), [gradient_meaning(c), en_zh(c, en, zh)]

    return explain


def _explainer(stage: str) -> Callable[[Context], Parts]:
    return stage_explainer(*_MEANINGS[stage], "lambda", stage=stage)


class DiffTexts(VariantTexts):
    name = "diff"
    order = 72
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "scale_diff": "{scale} = 1/√(d_k/2) (each half's width, the reference's)",
            "conv_diff": "diff: two softmax maps from the halves of Q and K, A1 − λ·A2 with "
            "λ_init {init}, RMSNorm per head, × (1 − λ_init) (Differential Transformer)",
            "check_output_2": "second map's O (Q2, K2) vs plain softmax rows",
            "check_lse_2": "second map's L vs plain softmax rows' lse (base e)",
            "check_diff_output": "O − λ·O_2 vs the trace's diff_output",
        },
        "zh": {
            "scale_diff": "{scale} = 1/√(d_k/2)（每一半的宽度，参考代码的做法）",
            "conv_diff": "差分注意力：Q、K 的两半给出两张 softmax 图，A1 − λ·A2，λ_init {init}，"
            "每个头 RMSNorm，× (1 − λ_init)（Differential Transformer）",
            "check_output_2": "第二张图的 O（Q2、K2）对比逐行普通 softmax",
            "check_lse_2": "第二张图的 L 对比逐行普通 softmax 的 lse（以 e 为底）",
            "check_diff_output": "O − λ·O_2 对比完整计算的 diff_output",
        },
    }
    explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {
        **{s: _explainer(s) for s in _MEANINGS},
        **{s: _grad_explainer(s) for s in _GRAD_MEANINGS},
    }
    view_notes: ClassVar[dict[str, dict[str, dict[Lang, tuple[str, str]]]]] = {
        "decode": {
            "lambda": {
                "en": (
                    "λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init, one per head",
                    "A learned number of the layer, the same at every step: nothing of it "
                    "is cached.",
                ),
                "zh": (
                    "λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init，每个头一个",
                    "层里学到的数，每一步都相同：不需要缓存。",
                ),
            },
            "diff_output": {
                "en": (
                    "diff_output = (softmax − λ·softmax_2)·V_cache",
                    "The step's two softmax rows come from the halves of its query against "
                    "the halves of the same cached keys (one cache of K and V serves both "
                    "maps); their difference, the diff row above, averages the cached "
                    "values.",
                ),
                "zh": (
                    "diff_output = (softmax − λ·softmax_2)·V_cache",
                    "这一步的两行 softmax 来自查询的两半与同一份缓存键的两半（一份 K、V "
                    "缓存同时服务两张图）；两者之差（上表的 diff 行）对缓存的值求加权和。",
                ),
            },
            "diff_norm": {
                "en": (
                    "diff_norm = norm ⊙ diff_output / √(mean(diff_output²) + eps)",
                    "Each head's row normalised on its own (the reference's subln), as in "
                    "the full computation.",
                ),
                "zh": (
                    "diff_norm = norm ⊙ diff_output / √(mean(diff_output²) + eps)",
                    "每个头的这一行单独归一化（参考代码的 subln），与完整计算相同。",
                ),
            },
            "diff_scaled": {
                "en": (
                    "diff_scaled = diff_norm × (1 − λ_init)",
                    "What the heads join for this token. It must equal the row of "
                    "diff_scaled in the full computation.",
                ),
                "zh": (
                    "diff_scaled = diff_norm × (1 − λ_init)",
                    "各头拼接的就是它。它必须等于完整计算中 diff_scaled 的那一行。",
                ),
            },
        },
    }
    view_inputs: ClassVar[dict[str, dict[str, tuple[str, ...]]]] = {
        "decode": {
            "lambda": ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"),
            "diff_output": ("softmax", "softmax_2", "V_cache"),
            "diff_norm": ("diff_output",),
            "diff_scaled": ("diff_norm",),
        },
    }
    math_names = (
        "Q_1",
        "K_1",
        "scores_2",
        "softmax_2",
        "diff",
        "diff_output",
        "diff_norm",
        "diff_scaled",
    )
    formula_zh: ClassVar[tuple[tuple[str, str], ...]] = (
        (r" per head \(Q1; Q2 = Q\[:, d_k/2:\]\)$", " 每个头（Q1；Q2 = Q[:, d_k/2:]）"),
        (r" per head \(K1; K2 = K\[:, d_k/2:\]\)$", " 每个头（K1；K2 = K[:, d_k/2:]）"),
        (r", K_2 = K\[:, d_k/2:\] per head$", "，K_2 = K[:, d_k/2:] 每个头"),
        (r" over keys \(as softmax\)$", " 沿键（同 softmax）"),
        (
            r" / √\(mean\(diff_output²\) \+ eps\), per head$",
            " / √(mean(diff_output²) + eps)，每个头",
        ),
        (r", each head's diff_scaled$", "，每个头的 diff_scaled"),
        (r"\] per head$", "] 每个头"),
        (
            r" \(output = softmax·V is diff_output's first term\)$",
            "（output = softmax·V 是 diff_output 的第一项）",
        ),
    )

    def grad_transform(self, stage: str, formula: str, lang: Lang) -> tuple[str, str] | None:
        if stage not in ("d_Q", "d_K") or "_2" not in formula:
            return None
        half = "d_Q_1" if stage == "d_Q" else "d_K_1"
        if lang == "zh":
            return (
                f"前一半来自第一张图（{half}），后一半来自第二张图（d_scores_2）：每一半只在"
                "自己的那张图里出现。",
                half,
            )
        note = (
            f"The first half comes from the first map ({half}), the second half from the "
            "second map (d_scores_2): each half appears in its own map only."
        )
        return note, half

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        return [label(lang, "conv_diff", init=f"{value.lambda_init:.4g}")]


TEXTS = DiffTexts()
