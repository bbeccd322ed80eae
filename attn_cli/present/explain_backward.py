"""The explanations of the backward pass's stages and its worked cells, in English and Chinese.

Registers its entries in explain_registry.py's ``EXPLAINERS`` (keyed by the stage table's
explanation keys) and ``CELL_TEXTS`` (keyed by stage) when imported; explain.py imports it. Every
number comes from the trace: a worked cell takes one entry of dS = P ∘ (dP − Delta) apart
into the trace's own P, dP and Delta, and the terms of the row sums that make Delta.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from attn_cli.core.pipeline import Trace
from attn_cli.core.stages import softmax_input
from attn_cli.present.explain_registry import (
    CELL_TEXTS,
    EXPLAINERS,
    Cell,
    CellText,
    Context,
    Parts,
    sum_terms,
)
from attn_cli.present.text import factor
from attn_cli.present.variants import all_texts, has_extra_logit, modifier, modifier_stage


def _t(c: Context | Cell, en: str, zh: str) -> str:
    return zh if c.lang == "zh" else en


def shaped(c: Context, name: str) -> str:
    """A stage's shape when the trace kept it, else its name alone."""
    return c.shape_of(name) if name in c.trace else name


# ---------------------------------------------------------------------------------------------
# Explanations


def gradient_meaning(c: Context) -> str:
    """The one sentence every gradient stage shares."""
    return _t(
        c,
        f"d_X for any stage X means ∂L/∂X, laid out exactly like X: how much L would change per "
        f"unit change of each entry. Here {c.trace.loss}.",
        f"任何一步 X 的 d_X 都表示 ∂L/∂X，排布和 X 完全一样：X 的每个数改变一个单位，"
        f"L 大约改变多少。这里 {c.trace.loss}。",
    )


def _gradient(c: Context, en: str, zh: str, *reads: str) -> Parts:
    """A gradient stage's parts: its formula, the stages it ``reads`` (shaped), and the sentence
    every gradient shares followed by why (``en``, ``zh``)."""
    meaning = [gradient_meaning(c), _t(c, en, zh)]
    return (c.trace[c.name].formula,), tuple(shaped(c, name) for name in reads), meaning


def _explain_final(c: Context) -> Parts:
    """d_projected, or d_output when it is the final stage: the upstream gradient."""
    return explain_upstream(c)


def explain_upstream(c: Context) -> Parts:
    """The final stage's gradient (d_projected, d_output, a variant's d_gated): the upstream."""
    meaning = [gradient_meaning(c)]
    if c.trace.upstream == "grad":
        meaning.append(
            _t(
                c,
                "The fixture's grad is this gradient: the backward pass starts from it, as "
                "loss.backward() starts from the gradient the next layer hands back.",
                "配置文件里的 grad 就是这个梯度：反向传播从它出发，就像 loss.backward() "
                "从下一层传回来的梯度出发。",
            )
        )
    else:
        meaning.append(
            _t(
                c,
                "Without a grad in the fixture, L is the plain sum of the final stage, so its "
                "gradient is 1 everywhere (what out.sum().backward() does in PyTorch).",
                "配置文件没有 grad 时，L 就是最后一步所有数之和，所以梯度处处为 1"
                "（相当于 PyTorch 里的 out.sum().backward()）。",
            )
        )
    return (c.trace[c.name].formula,), (shaped(c, c.name.removeprefix("d_")),), meaning


def _explain_weight(c: Context) -> Parts:
    """d_W_O, d_W_Q, d_W_K, d_W_V: input transposed times the output's gradient."""
    name = c.name.removeprefix("d_W_")
    stage = "projected" if name == "O" else name
    source = c.trace[c.name].formula.split("= ")[1].split("ᵀ")[0]
    return _gradient(
        c,
        "out = x·W, so each weight W[i, j] multiplies input "
        "column i into output column j: its "
        f"gradient is Σ over every token (and batch item) of x[i] × d_out[j], i.e. "
        f"{source}ᵀ·d_{stage}. The transpose puts the tokens "
        "on the summed axis; the result has "
        "W's shape, and a weight shared by every token adds up every token's share.",
        f"out = x·W，权重 W[i, j] 把输入的第 i 列乘到输出的第 j 列，所以它的梯度是对每个词"
        f"（和每个批次）把 x[i] × d_out[j] 加起来，即 {source}ᵀ·d_{stage}。转置把词放到求和的"
        "那一维上，结果的形状和 W 一样；所有词共用同一个权重，所以每个词的贡献都要加起来。",
        source,
        f"d_{stage}",
    )


def _explain_bias(c: Context) -> Parts:
    """d_b_*: a bias is added to every token, so its gradient sums over tokens."""
    stage = c.trace[c.name].formula.split("Σ_")[1].split(" ")[1].split("[")[0]
    return _gradient(
        c,
        "A bias is added to every token's row, so each token's gradient flows into it: the "
        "sum of the gradient over the tokens (and batch items).",
        "偏置加在每个词的那一行上，所以每个词的梯度都流向它：把梯度沿词（和批次）加起来。",
        stage,
    )


def _explain_concat(c: Context) -> Parts:
    """d_concat: back through W_O, or the heads' gradients side by side."""
    inp = c.trace.inputs
    if inp.W_O is not None:
        return _gradient(
            c,
            "projected = concat·W_O, so the gradient goes back through W_O transposed: "
            "each concat column collects the output columns it fed, weighted by W_O.",
            "projected = concat·W_O，所以梯度经过 W_O 的转置传回：concat 的每一列收集它"
            "参与计算的各个输出列的梯度，按 W_O 加权。",
            "d_projected",
        )
    return _gradient(
        c,
        "concat only puts the heads side by side, so its gradient is the heads' gradients "
        "side by side: the same numbers, rearranged.",
        "concat 只是把各头并排放，所以它的梯度就是各头的梯度并排放：数字相同，只是排列不同。",
        f"d_{_joined(c.trace)}",
    )


def _joined(trace: Trace) -> str:
    """The stage concat joined: output, or a head-output transform's (gated)."""
    from attn_cli.core.chain import Chain

    return Chain(trace.inputs).joined


def _explain_output(c: Context) -> Parts:
    """d_output: the final stage's gradient, d_concat cut into heads, or back through a
    head-output transform (the gate)."""
    joined = _joined(c.trace)
    if joined != "output":
        return _gradient(
            c,
            f"output became {joined} before the heads were joined, so its gradient comes back "
            f"from d_{joined} through that step.",
            f"output 在各头拼接之前先变成了 {joined}，所以它的梯度从 d_{joined} 经过这一步传回。",
            f"d_{joined}",
        )
    if c.trace.inputs.W_O is None:
        return _explain_final(c)
    return _gradient(
        c,
        "Head h's output filled columns h·d_v to (h+1)·d_v of concat, so its gradient is "
        "those columns of d_concat.",
        "第 h 个头的输出占 concat 的第 h·d_v 到 (h+1)·d_v 列，所以它的梯度就是 d_concat 的这几列。",
        "d_concat",
    )


def _explain_softmax(c: Context) -> Parts:
    """d_softmax = dP = dO·Vᵀ."""
    formula, inputs, meaning = _gradient(
        c,
        "output[i] = Σ_j P[i, j] × V[j], so weight P[i, j] changes output row i by V row j: "
        "dP[i, j] = d_output[i] · V[j], a dot product. Over all i, j that is d_output·Vᵀ.",
        "output[i] = Σ_j P[i, j] × V[j]，权重 P[i, j] 让输出的第 i 行按 V 的第 j 行变化，"
        "所以 dP[i, j] = d_output[i] · V[j]，是一个点积；对所有 "
        "i、j 写在一起就是 d_output·Vᵀ。",
        "d_output",
        "V",
    )
    cell = "dP[i, j] = Σ_d d_output[i, d] × V[j, d]"
    return (*formula, cell), inputs, meaning + _gqa(c, reads=True)


def _explain_v(c: Context) -> Parts:
    """d_V = Pᵀ·dO, summed over a GQA group."""
    formula, inputs, meaning = _gradient(
        c,
        "V row j reaches output row i with weight P[i, j], so d_V[j] = Σ_i P[i, j] × "
        "d_output[i]: the sum runs over the queries, the first axis of P, hence Pᵀ·d_output "
        "and not P·d_output.",
        "V 的第 j 行以权重 P[i, j] 进入输出的第 i 行，所以 d_V[j] = Σ_i P[i, j] × d_output[i]："
        "求和是沿查询（P 的第一维）进行的，所以是 Pᵀ·d_output，而不是 P·d_output。",
        "softmax",
        "d_output",
    )
    return formula, inputs, meaning + _gqa(c, reads=False)


def _gqa(c: Context, reads: bool) -> list[str]:
    """Why a key/value gradient sums over its group of query heads (GQA), or reads its head."""
    inp = c.trace.inputs
    if inp.heads == inp.kv_heads:
        return []
    g = inp.heads // inp.kv_heads
    if reads:
        return [
            _t(
                c,
                f"Grouped-query attention: query head h reads key/value head h // {g}.",
                f"分组查询注意力：第 h 个查询头读取第 h // {g} 个键值头。",
            )
        ]
    return [
        _t(
            c,
            f"Grouped-query attention: key/value head g is read by {g} query heads, so its "
            "gradient is the sum of what each of them sends back (a weight used several times "
            "collects every use's gradient). Taking one head's share alone is a classic mistake.",
            f"分组查询注意力：第 g 个键值头被 {g} 个查询头读取，所以它的梯度是这些头各自传回的"
            "梯度之和（一个量被用了几次，就要把每次的梯度都加起来）。只取其中一个头是常见错误。",
        )
    ]


def _explain_delta(c: Context) -> Parts:
    """Delta = rowsum(dO ∘ O) = rowsum(dP ∘ P): FlashAttention-2's form."""
    meaning = [
        _t(
            c,
            "Delta[i] = Σ_j P[i, j] × dP[i, j], the weighted mean of row i of dP: the softmax "
            "Jacobian subtracts it from every dP[i, j].",
            "Delta[i] = Σ_j P[i, j] × dP[i, j]，是 dP 第 i 行按权重的平均：softmax 的雅可比矩阵"
            "要从每个 dP[i, j] 里减去它。",
        ),
        _t(
            c,
            "Why it needs no stored weights: dP[i, j] = d_output[i] · V[j], so Σ_j P[i, j] × "
            "dP[i, j] = d_output[i] · Σ_j P[i, j] × V[j] = "
            "d_output[i] · output[i]. FlashAttention-2 "
            "computes Delta from the output it already has, one row at a time, and never keeps the "
            "T × S weights; it rebuilds each block of P from the "
            "saved log-sum-exp when it needs it.",
            "为什么不需要保存权重：dP[i, j] = d_output[i] · V[j]，所以 Σ_j P[i, j] × dP[i, j] = "
            "d_output[i] · Σ_j P[i, j] × V[j] = d_output[i] · "
            "output[i]。FlashAttention-2 用已有的输出"
            "逐行算出 Delta，从不保存 T × S 的权重；需要 P "
            "的某一块时，再用保存的 log-sum-exp 重建。",
        ),
    ]
    formula = (c.trace[c.name].formula,)
    return formula, (shaped(c, "d_output"), shaped(c, "output")), meaning


def _explain_logits(c: Context) -> Parts:
    """dS at the softmax's input (d_masked, d_capped or d_scaled), or a step before it."""
    inp = c.trace.inputs
    formula = (c.trace[c.name].formula,)
    if c.name != f"d_{softmax_input(inp)}":
        return formula, (shaped(c, _upstream_of(c)),), [gradient_meaning(c), _passed(c)]
    meaning = [
        gradient_meaning(c),
        _t(
            c,
            "The softmax Jacobian: ∂P[i, j]/∂S[i, k] = P[i, j] × (δ_jk − P[i, k]). Applied to "
            "dP it gives dS[i, k] = P[i, k] × (dP[i, k] − Σ_j P[i, j] × dP[i, j]) = P ∘ (dP − "
            "Delta). Raising one logit raises its own weight and takes weight from the others; "
            "the −Delta term is that second effect. Leaving it out (dS = P ∘ dP) is a classic "
            "mistake.",
            "softmax 的雅可比矩阵：∂P[i, j]/∂S[i, k] = P[i, j] × "
            "(δ_jk − P[i, k])。作用在 dP 上得到 "
            "dS[i, k] = P[i, k] × (dP[i, k] − Σ_j P[i, j] × dP[i, j]) = P ∘ (dP − Delta)。"
            "一个对数几率变大，自己的权重变大，同时从其他键那里拿走权重；−Delta 这一项就是后一个"
            "效应。漏掉它（dS = P ∘ dP）是常见错误。",
        ),
    ]
    if not has_extra_logit(inp):
        meaning.append(
            _t(
                c,
                "Each row of dS sums to 0: adding the same number to a whole row of logits "
                "changes no weight.",
                "dS 的每一行之和都是 0：给整行对数几率加上同一个数，权重不会改变。",
            )
        )
    if c.name == "d_masked":
        meaning.append(
            _t(
                c,
                "Where a query may not attend, the logit is a constant (−∞ or the mask value): "
                "no gradient goes there, exactly 0, and a row with nothing allowed gets none.",
                "查询不允许看的位置，对数几率是常数（−∞ 或遮盖值）：那里没有梯度，正好是 0；"
                "一行全被遮住时整行梯度都是 0。",
            )
        )
    inputs = (shaped(c, "softmax"), shaped(c, "d_softmax"), shaped(c, "delta"))
    return formula, inputs, meaning


def _upstream_of(c: Context) -> str:
    """The gradient stage this one is computed from (d_scaled from d_capped or d_masked)."""
    stage = modifier_stage(c.trace.inputs)
    return f"d_{stage}" if c.name == "d_scaled" and stage is not None else "d_masked"


def _passed(c: Context) -> str:
    """Why the gradient passes a step unchanged, or scaled by tanh's slope."""
    texts = modifier(c.trace.inputs)
    if c.name == "d_scaled" and texts is not None and c.lang in texts.grad_note:
        return texts.grad_note[c.lang]
    return _t(
        c,
        "masked = this stage + bias (+ ALiBi), constants that take no gradient: it passes "
        "unchanged, and is already 0 where the mask blocks.",
        "masked = 这一步 + 偏置（+ ALiBi），这些常数没有梯度：梯度原样通过，被遮住的位置已经是 0。",
    )


def _explain_scores(c: Context) -> Parts:
    """d_scores = d_scaled × scale."""
    return _gradient(
        c,
        f"scaled = scores × {c.scale}, so every gradient is multiplied by the same "
        f"{c.scale}. This is where 1/√d_k enters d_Q and d_K: both are computed from d_scores. "
        "Leaving it out, or applying it twice, is a classic mistake.",
        f"scaled = scores × {c.scale}，所以每个梯度都乘以同一个 {c.scale}。1/√d_k 就是从这里"
        "进入 d_Q 和 d_K 的：两者都由 d_scores 算出。漏掉它或乘两次都是常见错误。",
        "d_scaled",
    )


def _explain_query_key(c: Context) -> Parts:
    """d_Q, d_K (and their _rot, _norm steps)."""
    formula = (c.trace[c.name].formula,)
    text = formula[0]
    for texts in all_texts():
        undone = texts.grad_transform(c.name, text, c.lang)
        if undone is not None:
            note, upstream = undone
            return formula, (shaped(c, upstream),), [gradient_meaning(c), note]
    if "rms(" in text:
        which = c.name.removeprefix("d_")[0]  # Q or K
        return _gradient(
            c,
            "RMSNorm divides each row by its root mean square, which itself depends on the "
            "whole row: besides w ∘ d / rms, every entry loses the part of the gradient along "
            "the row's own direction (the mean term).",
            "RMSNorm 把每一行除以它的均方根，而均方根又取决于整行：除了 w ∘ d / rms 之外，"
            "每个数还要减去梯度在这一行自身方向上的分量（mean 那一项）。",
            which,
            f"d_{which}_norm",
        )
    return formula, (shaped(c, "d_scores"),), [gradient_meaning(c), *_query_key_meaning(c)]


def _query_key_meaning(c: Context) -> list[str]:
    """Why dQ = dS·K, why dK = dSᵀ·Q (the transpose), where the scale comes in."""
    if c.name.startswith("d_Q"):
        out = [
            _t(
                c,
                "scores[i, j] = Q[i] · K[j], so Q row i gets Σ_j d_scores[i, j] × K[j]: "
                "d_scores·K, summed over the keys of its row.",
                "scores[i, j] = Q[i] · K[j]，所以 Q 的第 i 行得到 Σ_j d_scores[i, j] × K[j]，"
                "即 d_scores·K，沿它那一行的键求和。",
            )
        ]
    else:
        out = [
            _t(
                c,
                "K row j appears in a whole column of scores, once per query, so it gets "
                "Σ_i d_scores[i, j] × Q[i]: the sum runs down column j, over the queries. That is "
                "why it is d_scoresᵀ·Q; d_scores·Q would sum along rows, and only runs at all when "
                "seq_q = seq_k.",
                "K 的第 j 行出现在 scores 的一整列里，每个查询一次，所以它得到 "
                "Σ_i d_scores[i, j] × "
                "Q[i]：沿第 j 列、对查询求和。所以是 d_scoresᵀ·Q；d_scores·Q 沿行求和，"
                "只有 seq_q = seq_k 时才算得出来。",
            )
        ]
        out += _gqa(c, reads=False)
    out.append(
        _t(
            c,
            f"The scale {c.scale} is already inside d_scores (= d_scaled × scale), so it "
            "appears once in both d_Q and d_K.",
            f"缩放系数 {c.scale} 已经在 d_scores（= d_scaled × scale）里了，所以它在 d_Q 和 d_K "
            "里各出现一次。",
        )
    )
    return out


def _explain_x(c: Context) -> Parts:
    """d_X (and d_X_kv): the sum of the paths through Q, K and V."""
    paths = "d_K·W_Kᵀ + d_V·W_Vᵀ" if c.name == "d_X_kv" else c.trace[c.name].formula[6:]
    formula, inputs, meaning = _gradient(
        c,
        f"X feeds {paths.count('W_')} projection(s), so its gradient is the sum over the "
        f"paths: {paths}. Dropping one path (say V's) is a classic mistake.",
        f"X 参与了 {paths.count('W_')} 个投影，所以它的梯度是各条路径之和：{paths}。"
        "漏掉一条路径（比如 V 的）是常见错误。",
        "d_Q",
        "d_K",
        "d_V",
    )
    if c.name == "d_X" and c.trace.inputs.X_kv is not None:
        meaning.append(
            _t(
                c,
                "Cross-attention: K and V come from X_kv, so their paths go to d_X_kv instead.",
                "交叉注意力：K 和 V 来自 X_kv，所以这两条路径的梯度流向 d_X_kv。",
            )
        )
    return formula, inputs, meaning


EXPLAINERS.update(
    {
        "d_final": _explain_final,
        "d_weight": _explain_weight,
        "d_bias": _explain_bias,
        "d_concat": _explain_concat,
        "d_output": _explain_output,
        "d_softmax": _explain_softmax,
        "d_V": _explain_v,
        "delta": _explain_delta,
        "d_logits": _explain_logits,
        "d_scores": _explain_scores,
        "d_query_key": _explain_query_key,
        "d_X": _explain_x,
    }
)


# ---------------------------------------------------------------------------------------------
# Worked cells: one entry of dP, of dS and of d_scores, from the trace's own numbers


@dataclass(frozen=True)
class GradientCell:
    """One (query, key) entry of dS taken apart, every number read from the trace."""

    p: float  # softmax[i, j]
    dp: float  # d_softmax[i, j]
    row_p: tuple[float, ...]  # softmax[i, :]
    row_dp: tuple[float, ...]  # d_softmax[i, :]
    d_output: tuple[float, ...]  # d_output[i, :]
    output: tuple[float, ...]  # output[i, :]
    values: tuple[float, ...]  # V[j, :], this head's key/value head
    delta: float  # delta[i] from the trace
    ds: float  # the dS stage's entry (d_masked, d_capped or d_scaled) from the trace
    allowed: bool  # False where the mask blocks: dS is exactly 0

    @property
    def rowsum_terms(self) -> tuple[float, ...]:
        """P[i, k] × dP[i, k] for every key k: their sum is Delta."""
        return tuple(p * d for p, d in zip(self.row_p, self.row_dp, strict=True))

    @property
    def flash_terms(self) -> tuple[float, ...]:
        """d_output[i, d] × output[i, d]: their sum is Delta too (FlashAttention-2)."""
        return tuple(a * b for a, b in zip(self.d_output, self.output, strict=True))

    @property
    def dp_terms(self) -> tuple[float, ...]:
        """d_output[i, d] × V[j, d]: their sum is dP[i, j]."""
        return tuple(a * b for a, b in zip(self.d_output, self.values, strict=True))


def gradient_cell(trace: Trace, batch: int | None, head: int, query: int, key: int) -> GradientCell:
    """The dS entry at (batch, head, query, key), read from the trace (kept with backward)."""
    inp = trace.inputs
    lead = () if batch is None else (batch,)
    row, cell = (*lead, head, query), (*lead, head, query, key)
    kv = (*lead, head // (inp.heads // inp.kv_heads), key)
    ds_stage = f"d_{softmax_input(inp)}"
    allowed = "masked" not in trace or trace["masked"].data[cell] != inp.mask_value
    return GradientCell(
        p=float(trace["softmax"].data[cell]),
        dp=float(trace["d_softmax"].data[cell]),
        row_p=tuple(float(x) for x in trace["softmax"].data[row]),
        row_dp=tuple(float(x) for x in trace["d_softmax"].data[row]),
        d_output=tuple(float(x) for x in trace["d_output"].data[row]),
        output=tuple(float(x) for x in trace["output"].data[row]),
        values=tuple(float(x) for x in trace["V"].data[kv]),
        delta=float(trace["delta"].data[row]),
        ds=float(trace[ds_stage].data[cell]),
        allowed=bool(allowed),
    )


def _cell_of(c: Cell) -> GradientCell | None:
    need = ("softmax", "d_softmax", "d_output", "output", "V", "delta")
    if not all(n in c.trace for n in need) or f"d_{softmax_input(c.trace.inputs)}" not in c.trace:
        return None
    w = c.cell
    return gradient_cell(c.trace, w.batch, w.head, w.query, w.key)


def _cell_d_softmax(c: Cell) -> CellText | None:
    """dP[i, j] = d_output[i] · V[j], term by term."""
    g = _cell_of(c)
    if g is None:
        return None
    terms = [
        f"{factor(a, c.precision)}×{factor(b, c.precision)}"
        for a, b in zip(g.d_output, g.values, strict=True)
    ]
    return CellText(
        c.title,
        (
            _t(c, "dP = d_output · V row, term by term:", "dP = d_output · V 的一行，逐项相乘："),
            f"d_softmax{c.at} = {sum_terms(terms, c.full)} = {c.n(g.dp)}",
        ),
    )


def _cell_ds(c: Cell, name: str) -> CellText | None:
    """dS[i, j] = P[i, j] × (dP[i, j] − Delta[i]), with Delta's two sums."""
    if f"d_{softmax_input(c.trace.inputs)}" != name:
        return None  # under d_scaled, say, when d_masked received dS
    g = _cell_of(c)
    if g is None:
        return None
    n, full = c.n, c.full
    rowsum = [f"{n(p)}×{n(d)}" for p, d in zip(g.row_p, g.row_dp, strict=True)]
    flash = [f"{n(a)}×{n(b)}" for a, b in zip(g.d_output, g.output, strict=True)]
    lines = [
        _t(c, "Delta = rowsum(P ∘ dP) over the row:", "Delta = 这一行的 rowsum(P ∘ dP)："),
        f"Delta[{c.q_label}] = {sum_terms(rowsum, full)} = {n(g.delta)}",
        _t(
            c,
            "the same from the output (FlashAttention-2, no weights stored):",
            "用输出也能算出同一个数（FlashAttention-2，不保存权重）：",
        ),
        f"Delta[{c.q_label}] = rowsum(d_output ∘ output) = {sum_terms(flash, full)} = "
        f"{n(math.fsum(g.flash_terms))}",
    ]
    if not g.allowed:
        lines.append(
            _t(
                c,
                f"{name}{c.at} = 0: this key may not be attended",
                f"{name}{c.at} = 0：这个键不允许被看",
            )
        )
    else:
        lines.append(
            f"{name}{c.at} = P × (dP − Delta) = {n(g.p)} × ({n(g.dp)} − {n(g.delta)}) = {n(g.ds)}"
        )
    return CellText(c.title, tuple(lines))


def _cell_d_scores(c: Cell) -> CellText | None:
    """d_scores[i, j] = d_scaled[i, j] × scale."""
    if "d_scaled" not in c.trace or "d_scores" not in c.trace:
        return None
    w = c.cell
    at = (*(() if w.batch is None else (w.batch,)), w.head, w.query, w.key)
    d_scaled = float(c.trace["d_scaled"].data[at])
    d_scores = float(c.trace["d_scores"].data[at])
    scale = c.n(c.trace.scale)
    return CellText(
        c.title,
        (
            f"d_scores{c.at} = d_scaled{c.at} × {scale} = {c.n(d_scaled)} × {scale} = "
            f"{c.n(d_scores)}",
        ),
    )


def _ds_under(stage: str) -> Callable[[Cell], CellText | None]:
    """The dS cell under ``stage``: shown only when that stage is the one receiving dS."""
    return lambda c: _cell_ds(c, stage)


CELL_TEXTS.update(
    {
        "d_softmax": _cell_d_softmax,
        "d_masked": _ds_under("d_masked"),
        "d_capped": _ds_under("d_capped"),
        "d_scaled": _ds_under("d_scaled"),
        "d_scores": _cell_d_scores,
    }
)
