"""Differential attention (Differential Transformer), what present/ says about it: the two halves
of Q and K, both softmax maps, λ, the difference map, the head output, its norm and scale."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import Lang, en_zh, formula_text, label
from attn_cli.present.variant_texts import VariantTexts

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


def _explainer(stage: str) -> Callable[[Context], Parts]:
    reads, en, zh = _MEANINGS[stage]

    def explain(c: Context) -> Parts:
        formula = (formula_text(c.lang, c.trace[stage].formula),)
        shapes = tuple(c.shape_of(s) for s in reads if s in c.trace) or (c.shape_of("lambda"),)
        return formula, shapes, [en_zh(c, en, zh)]

    return explain


class DiffTexts(VariantTexts):
    name = "diff"
    order = 72
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "scale_diff": "{scale} = 1/√(d_k/2) (each half's width, the reference's)",
            "conv_diff": "diff: two softmax maps from the halves of Q and K, A1 − λ·A2 with "
            "λ_init {init}, RMSNorm per head, × (1 − λ_init) (Differential Transformer)",
        },
        "zh": {
            "scale_diff": "{scale} = 1/√(d_k/2)（每一半的宽度，参考代码的做法）",
            "conv_diff": "差分注意力：Q、K 的两半给出两张 softmax 图，A1 − λ·A2，λ_init {init}，"
            "每个头 RMSNorm，× (1 − λ_init)（Differential Transformer）",
        },
    }
    explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {s: _explainer(s) for s in _MEANINGS}
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
        "decode": {"lambda": ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"),
                   "diff_output": ("softmax", "softmax_2", "V_cache"),
                   "diff_norm": ("diff_output",), "diff_scaled": ("diff_norm",)},
    }  # fmt: skip
    math_names = ("Q_1", "K_1", "scores_2", "softmax_2", "diff", "diff_output", "diff_norm",
                  "diff_scaled")  # fmt: skip
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
    )

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        return [label(lang, "conv_diff", init=f"{value.lambda_init:.4g}")]


TEXTS = DiffTexts()
