"""Linear attention (Katharopoulos et al.) and Gated DeltaNet (Qwen3-Next), what present/ says
about them: each stage, the state the recurrence carries, and why its three forms agree."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import Lang, en_zh, label
from attn_cli.present.variant_texts import VariantTexts, stage_explainer

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs

# stage -> (the stages it reads, English, Chinese); the shared stages' texts by variant below
_PLAIN: dict[str, tuple[tuple[str, ...], str, str]] = {
    "phi_Q": (
        ("Q",),
        "The feature map φ(x) = elu(x) + 1 on every query number: x + 1 above "
        "0, eˣ below, so always positive. It stands in for softmax's exp: φ(q)·φ(k) is "
        "a positive similarity that splits into a part of q times a part of k.",
        "特征映射 φ(x) = elu(x) + 1 作用于查询的每个数：大于 0 时为 x + 1，否则为 eˣ，"
        "因此总为正。它代替 softmax 的 exp：φ(q)·φ(k) 是一个正的相似度，可以拆成 q 的部分"
        "乘以 k 的部分。",
    ),
    "phi_K": (
        ("K",),
        "The same feature map on every key number.",
        "同样的特征映射作用于键的每个数。",
    ),
    "normaliser": (
        ("phi_K",),
        "The running sum z_t of φ(k) over the tokens so far: "
        "φ(q_t)·z_t is the sum of query t's similarities, what divides its output "
        "as softmax's denominator does.",
        "到当前为止 φ(k) 的累加和 z_t：φ(q_t)·z_t 是查询 t 所有相似度之和，"
        "像 softmax 的分母一样用来除它的输出。",
    ),
}
_DELTA: dict[str, tuple[tuple[str, ...], str, str]] = {
    "qkv": (
        ("X",),
        "q, k and v projected from X side by side (in_proj_qkvz without z), the "
        "channels the convolution runs over.",
        "由 X 投影得到并排放在一起的 q、k、v（in_proj_qkvz 去掉 z），卷积在这些通道上进行。",
    ),
    "qkv_conv": (
        ("qkv",),
        "A causal depthwise convolution over the tokens, each channel its "
        "own kernel reading this token and the few before it, then SiLU "
        "(causal_conv1d_fn's torch fallback).",
        "沿词元方向的因果逐通道卷积：每个通道有自己的卷积核，读取当前词元和它之前的"
        "几个词元，然后做 SiLU（causal_conv1d_fn 的 torch 回退实现）。",
    ),
    "beta": (
        ("X",),
        "beta = σ(b), per head and token, between 0 and 1: how strongly this "
        "token writes into the state (the delta rule's learning rate).",
        "beta = σ(b)，每个头每个词元一个，在 0 和 1 之间：这个词元写入状态的力度"
        "（delta 规则的学习率）。",
    ),
    "g": (
        ("X",),
        "The log decay g = −exp(A_log)·softplus(a + dt_bias) ≤ 0: the state is "
        "multiplied by e^g before each token, so old memories fade.",
        "对数衰减 g = −exp(A_log)·softplus(a + dt_bias) ≤ 0：每个词元之前状态乘以 e^g，"
        "旧的记忆逐渐淡去。",
    ),
    "q_l2": (
        ("Q",),
        "The query L2-normalised (eps 1e-6 inside the root, as FLA) and divided "
        "by √d_k: the kernel's own scale.",
        "查询做 L2 归一化（根号内加 eps 1e-6，与 FLA 相同）再除以 √d_k：核函数自带的缩放。",
    ),
    "k_l2": (
        ("K",),
        "The key L2-normalised: a unit direction, so the delta rule's write "
        "replaces what the state held along it instead of growing without bound.",
        "键做 L2 归一化成单位方向，这样 delta 规则的写入会替换状态在这个方向上原有的内容，"
        "而不会无限增长。",
    ),
    "z": (
        ("X",),
        "The output gate's input z = X·W_z (in_proj_qkvz's z columns).",
        "输出门的输入 z = X·W_z（in_proj_qkvz 中 z 的列）。",
    ),
    "normed": (
        ("output", "z"),
        "Qwen3NextRMSNormGated: each head's output RMS-normalised, "
        "times the norm weight, times SiLU(z); this is what out_proj (W_O) reads.",
        "Qwen3NextRMSNormGated：每个头的输出做 RMSNorm 归一化，乘以归一化权重，再乘以 "
        "SiLU(z)；out_proj（W_O）读取的就是它。",
    ),
    "Q": (
        ("qkv_conv",),
        "Each key head's query, from the conv's q channels, repeated to the "
        "value heads it serves (repeat_interleave).",
        "每个键头的查询，取自卷积后的 q 通道，并重复给它服务的各个值头（repeat_interleave）。",
    ),
    "K": (
        ("qkv_conv",),
        "Each key head's key, from the conv's k channels, repeated likewise.",
        "每个键头的键，取自卷积后的 k 通道，同样重复。",
    ),
    "V": (
        ("qkv_conv",),
        "Each value head's values, from the conv's v channels.",
        "每个值头的值，取自卷积后的 v 通道。",
    ),
}
_SHARED = {
    "implicit_weights": (
        ("Q", "K"),
        (
            "The T×T weights the recurrence amounts to (the parallel form): "
            "output = implicit_weights·V, exactly. Compare them with softmax attention's "
            "heatmap: they are causal, but nothing makes a row peak, and under the delta rule "
            "they may be negative.",
            "递推等价的 T×T 权重（并行形式）：output = implicit_weights·V 完全成立。可以与 softmax "
            "注意力的热力图对比：它们同样是因果的，但没有什么让一行变得尖锐；在 delta 规则下"
            "它们还可以是负的。",
        ),
    ),
    "state": (
        ("K", "V"),
        (
            "The state after each token, d_k × d_v per head: all the model keeps of the past, the "
            "same size at token 1 and token 1,000,000 (a softmax layer's KV cache grows instead).",
            "每个词元之后的状态，每个头 d_k × d_v：模型对过去保留的全部内容，在第 1 个词元和"
            "第 1,000,000 个词元时大小相同（softmax 层的 KV 缓存则不断增长）。",
        ),
    ),
    "output_recurrent": (
        ("state", "Q"),
        (
            "The recurrent form, token by token as decoding runs it; attn checks it equals output "
            "to rounding on every run.",
            "递推形式，像解码那样逐个词元计算；attn 每次运行都检查它与 output 在舍入误差内相等。",
        ),
    ),
    "output_chunked": (
        ("Q", "K", "V"),
        (
            "The chunked form, as training kernels run it: the state carried from chunk to chunk, "
            "attention inside each chunk; attn checks it equals output to rounding on every run.",
            "分块形式，像训练用的核函数那样计算：状态在块与块之间传递，块内做注意力；attn 每次"
            "运行都检查它与 output 在舍入误差内相等。",
        ),
    ),
}
_OUTPUT_NOTE = {
    "linear_attention": (
        "Here the weights are linear attention's: the same numbers as "
        "φ(q_t)ᵀS_t / φ(q_t)ᵀz_t from the state, token by token.",
        "这里的权重是线性注意力的：与由状态逐词元算出的 φ(q_t)ᵀS_t / φ(q_t)ᵀz_t 是同一组数。",
    ),
    "gated_deltanet": (
        "Here the weights are Gated DeltaNet's: the same numbers as S_tᵀq_t "
        "from the state the delta rule writes, token by token.",
        "这里的权重是 Gated DeltaNet 的：与由 delta 规则写入的状态逐词元算出的 "
        "S_tᵀq_t 是同一组数。",
    ),
}


_explainer = stage_explainer  # the stage's own formula, the shapes it reads, or X's


class _Texts(VariantTexts):
    def notes(self, stage: str, c: Any) -> list[str]:
        if stage != "output" or self.name not in _OUTPUT_NOTE:
            return []
        return [en_zh(c, *_OUTPUT_NOTE[self.name])]


class PlainTexts(_Texts):
    name = "linear_attention"
    order = 7
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "scale_linear_attention": "none: φ(q)·φ(k) is not scaled (no softmax)",
            "conv_linear_attention": "linear_attention: φ = elu + 1, chunks of {chunk}; "
            "recurrent, chunked and parallel forms checked equal",
        },
        "zh": {
            "scale_linear_attention": "无：φ(q)·φ(k) 不缩放（没有 softmax）",
            "conv_linear_attention": "linear_attention：φ = elu + 1，块大小 {chunk}；"
            "递推、分块与并行三种形式已核对相等",
        },
    }
    explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {
        **{s: _explainer(*m) for s, m in _PLAIN.items()},
        **{s: _explainer(reads, *texts) for s, (reads, texts) in _SHARED.items()},
    }
    math_names = ("phi_Q", "phi_K", "normaliser", "state", "implicit_weights")
    formula_zh: ClassVar[tuple[tuple[str, str], ...]] = (
        (r" \(the parallel form\)$", "（并行形式）"),
        (
            r"chunks of (\d+): carried state \+ causal within the chunk$",
            r"每块 \1 个：传入的状态 + 块内因果注意力",
        ),
    )

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        return [label(lang, "conv_linear_attention", chunk=value.chunk)]


class DeltaTexts(_Texts):
    name = "gated_deltanet"
    order = 6
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "scale_gated_deltanet": "{scale} = 1/√d_k, multiplied into q_l2 (Qwen3-Next's)",
            "mode_gated_deltanet": "Gated DeltaNet (gated_deltanet): q, k, v, z, beta and g "
            "made from X (Qwen3-Next's linear attention)",
            "conv_gated_deltanet": "gated_deltanet: {k} key heads, {v} value heads, conv "
            "kernel {kernel}, chunks of {chunk}; recurrent, chunked and parallel forms checked "
            "equal",
        },
        "zh": {
            "scale_gated_deltanet": "{scale} = 1/√d_k，乘进 q_l2（Qwen3-Next 的做法）",
            "mode_gated_deltanet": "Gated DeltaNet（gated_deltanet）：q、k、v、z、beta 和 g "
            "由 X 得到（Qwen3-Next 的线性注意力）",
            "conv_gated_deltanet": "gated_deltanet：{k} 个键头，{v} 个值头，卷积核 {kernel}，"
            "块大小 {chunk}；递推、分块与并行三种形式已核对相等",
        },
    }
    explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {
        s: _explainer(*m) for s, m in _DELTA.items() if s not in ("Q", "K", "V")
    }
    front_explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {
        s: _explainer(*_DELTA[s]) for s in ("Q", "K", "V")
    }
    math_names = ("qkv", "qkv_conv", "beta", "q_l2", "k_l2", "normed")
    formula_zh: ClassVar[tuple[tuple[str, str], ...]] = (
        (r", depthwise over tokens$", "，沿词元逐通道"),
        (r"\(causal conv1d\(", "(因果 conv1d("),
        (
            r"'s (\w) columns per key head, repeated to the value heads$",
            r" 的 \1 列，每个键头，重复给各值头",
        ),
        (r"'s v columns, split into heads$", " 的 v 列，按头拆分"),
        (
            r"chunks of (\d+): the UT transform within, the state carried$",
            r"每块 \1 个：块内 UT 变换，状态传递",
        ),
    )

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        return [
            label(
                lang,
                "conv_gated_deltanet",
                k=value.k_heads,
                v=inp.heads,
                kernel=int(value.conv.shape[1]),
                chunk=value.chunk,
            )
        ]


ALL_TEXTS = (PlainTexts(), DeltaTexts())
