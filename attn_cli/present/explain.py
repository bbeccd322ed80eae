"""The explanation layer as plain text: what each stage computes, in English or Chinese.

Pure and free of Rich, so the terminal renderer and the Markdown and LaTeX exporters say the
same thing. Every number shown comes from the trace (stage shapes, the scale, a worked cell's
values); Q, K and V follow the source article's search analogy: the query is what a token is
looking for, the keys are the labels on offer, the values are the content handed back.

This module holds the forward stages' texts; explain_backward.py holds the gradients'. Both
fill the tables of explain_registry.py, which ``explain_stage`` and ``cell_text`` read.
"""

from __future__ import annotations

import math

from attn_cli.core.inputs import Inputs
from attn_cli.core.pipeline import Trace
from attn_cli.core.stages import SPECS, softmax_input
from attn_cli.present import (
    explain_backward,  # noqa: F401  (registers the d_* stages' texts)
    explain_cell,  # noqa: F401  (registers the worked cell's parts)
)
from attn_cli.present.explain_registry import (
    EXPLAINERS,
    Cell,
    CellText,
    Context,
    Explanation,
    Parts,
    cell_part,
    explainer,
    shape_text,
)
from attn_cli.present.i18n import Lang, axis_name, label
from attn_cli.present.text import short_number
from attn_cli.present.variants import active, all_texts, has_extra_logit, modifier_stage
from attn_cli.present.worked import WorkedCell


def _unexplained(c: Context) -> Parts:
    """A stage whose variant registered no explanation (one defined outside attn): its formula
    and what it reads, and a sentence saying that no more is known."""
    spec = SPECS[c.name]
    reads = tuple(c.shape_of(n) for n in spec.needs if n in c.trace)
    said = {
        "en": "No explanation is registered for this stage: its variant was defined outside attn "
        "and gave no texts (present/variant_texts.py VariantTexts).",
        "zh": "这一步没有登记说明：它的变体定义在 attn 之外，没有提供文字"
        "（present/variant_texts.py 的 VariantTexts）。",
    }
    return (c.trace[c.name].formula,), reads, [said[c.lang]]


def explain_stage(trace: Trace, name: str, lang: Lang, precision: int = 4) -> Explanation:
    """The explanation of stage ``name`` of this trace."""
    stage = trace[name]
    explain = explainer(SPECS[name].explain) or _unexplained
    formula, inputs, meaning = explain(Context(trace, name, lang, precision))
    return Explanation(
        stage=name,
        lang=lang,
        formula=formula,
        inputs=inputs,
        output=shape_text(name, stage.axes, stage.shape, lang),
        meaning=tuple(meaning),
    )


def _explain_x(c: Context) -> Parts:
    """The explanation of X."""
    lang = c.lang
    zh = c.lang == "zh"
    formula: tuple[str, ...]
    inputs: tuple[str, ...]
    meaning: list[str] = []
    formula = (
        ("X：输入的嵌入向量，每个词一行",)
        if zh
        else ("X: the input embeddings, one row per token",)
    )
    inputs = (label(lang, "given"),)
    meaning.append(
        "每一行是一个词的嵌入向量：用 d_model 个数字来代表这个词。后面的每一步都从这些行算起。"
        if zh
        else "Each row is one token's embedding: d_model numbers that stand for the word. "
        "Every later stage is computed from these rows."
    )
    return formula, inputs, meaning


def _explain_qkv(c: Context) -> Parts:
    """The explanation of Q, K and V."""
    inp = c.trace.inputs
    for texts in active(inp):  # a front end that makes them itself (MLA) explains them
        if c.name in texts.front_explainers:
            own: Parts = texts.front_explainers[c.name](c)
            return own
    lang, zh, name, shape_of, weight = c.lang, c.lang == "zh", c.name, c.shape_of, c.weight
    formula: tuple[str, ...]
    inputs: tuple[str, ...]
    meaning: list[str] = []
    w_name, b_name = f"W_{name}", f"b_{name}"
    width = {"Q": "heads*d_k", "K": "kv_heads*d_k", "V": "kv_heads*d_v"}[name]
    if inp.mode == "projection":
        bias = f" + {b_name}" if getattr(inp, b_name) is not None else ""
        src = "X_kv" if name in ("K", "V") and inp.X_kv is not None else "X"
        formula = (f"{name} = {src}·{w_name}{bias}",)
        d_in = "d_model_kv" if src == "X_kv" else "d_model"
        inputs = (shape_of(src), weight(w_name, (d_in, width)))
        if bias:
            inputs += (weight(b_name, (width,)),)
    else:
        formula = (f"{name}：由配置文件直接给出" if zh else f"{name}: given in the fixture",)
        inputs = (label(lang, "given"),)
    meaning.append(_QKV[lang][name])
    if name == "Q" and inp.heads > 1:
        meaning.append(
            f"有 {inp.heads} 个头：Q 的列被切成 {inp.heads} 块，每块 d_k = {inp.d_k} 列，"
            "每个头提出自己的问题。"
            if zh
            else f"With {inp.heads} heads, the columns split into {inp.heads} blocks of "
            f"d_k = {inp.d_k}: each head asks its own question."
        )
    if name in ("K", "V") and inp.kv_heads != inp.heads:
        groups = inp.heads // inp.kv_heads
        meaning.append(
            f"分组查询注意力：{inp.heads} 个查询头共用 {inp.kv_heads} 个键值头，"
            f"第 h 个查询头读取第 h // {groups} 个键值头。"
            if zh
            else f"Grouped-query attention: {inp.heads} query heads share {inp.kv_heads} "
            f"key/value head{'s' if inp.kv_heads > 1 else ''}; query head h reads key/value "
            f"head h // {groups}."
        )
    return formula, inputs, meaning


def _explain_scores(c: Context) -> Parts:
    """The explanation of scores."""
    q, k = _query_key(c.trace, "Q"), _query_key(c.trace, "K")
    formula = (f"scores = {q}·{k}ᵀ", f"scores[i, j] = Σ_d {q}[i, d] × {k}[j, d]")
    meaning = (
        "每个查询和每个键有多匹配？scores[i, j] 是第 i 个查询的 Q 行与第 j 个键的 K 行的点积："
        "对应位置的数相乘，再全部加起来。第 i 行对应一个查询，第 j 列对应一个键；"
        "数值越大，搜索词和标签越匹配。"
        if c.lang == "zh"
        else "How well does each query match each key? scores[i, j] is the dot product of "
        "query i's row of Q with key j's row of K: multiply term by term, then add. Row i is "
        "one query, column j one key; the bigger the number, the better the search terms "
        "match the label."
    )
    return formula, (c.shape_of(q), c.shape_of(k)), [meaning]


def _explain_scaled(c: Context) -> Parts:
    """The explanation of scaled."""
    trace, inp, lang, zh = c.trace, c.trace.inputs, c.lang, c.lang == "zh"
    scale, default_scale, shape_of = c.scale, c.default_scale, c.shape_of
    formula: tuple[str, ...]
    inputs: tuple[str, ...]
    meaning: list[str] = []
    d_k = inp.d_k
    if trace.scale_source == "default":
        formula = (f"scaled = scores × 1/√d_k = scores × 1/√{d_k} = scores × {scale}",)
        meaning.append(
            f"每个分数都乘以 1/√d_k = 1/√{d_k} = {scale}，这是默认做法（缩放点积注意力）。"
            if zh
            else f"Every score is multiplied by 1/√d_k = 1/√{d_k} = {scale}, the default of "
            "scaled dot-product attention."
        )
    else:
        formula = (f"scaled = scores × {scale}",)
        if trace.scale == 1:
            meaning.append(
                "配置文件写了 scale: 1，分数原样保留，这正是原文的做法。"
                f"默认值本应是 1/√d_k = {default_scale}。"
                if zh
                else "The fixture sets scale: 1, so the scores pass unchanged, exactly as the "
                f"source article computes them. The default would be 1/√d_k = {default_scale}."
            )
        else:
            meaning.append(
                f"配置文件把缩放系数设为 {scale}（默认值是 1/√d_k = {default_scale}）。"
                if zh
                else f"The fixture sets the scale to {scale} (the default would be "
                f"1/√d_k = {default_scale})."
            )
    inputs = (
        shape_of("scores"),
        f"{scale}（{label(lang, 'scalar')}）" if zh else f"{scale} ({label(lang, 'scalar')})",
    )
    meaning.append(
        "为什么要缩放：点积是 d_k 个乘积之和，它的典型大小大约随 √d_k 增长；分数一大，"
        "softmax 就会把几乎全部权重压到一个键上，梯度也变得极小。"
        if zh
        else "Why scale: a dot product adds up d_k products, so its typical size grows like "
        "√d_k; large scores push softmax to put almost all weight on one key, and its "
        "gradients become tiny."
    )
    if trace.scale_source == "default":
        meaning.append(
            "原文省略了这一步；在配置文件里写 scale: 1 就能复现原文的数字。"
            if zh
            else "The source article leaves this step out; scale: 1 in a fixture reproduces "
            "its numbers."
        )
    return formula, inputs, meaning


def _explain_masked(c: Context) -> Parts:
    """The explanation of masked."""
    trace = c.trace
    inp = c.trace.inputs
    formula = _masked_formula(trace, c.lang)
    inputs: tuple[str, ...] = (c.shape_of(_logits(trace)),)
    if inp.bias is not None:
        inputs += (f"bias {list(inp.bias.shape)}",)
    for stage in _bias_stages(trace):
        inputs += (c.shape_of(stage),)
    return formula, inputs, _masked_meaning(trace, c.lang)


def _explain_softmax(c: Context) -> Parts:
    """The explanation of softmax."""
    trace = c.trace
    zh = c.lang == "zh"
    shape_of = c.shape_of
    formula: tuple[str, ...]
    inputs: tuple[str, ...]
    meaning: list[str] = []
    x = softmax_input(trace.inputs)
    if not has_extra_logit(trace.inputs):
        formula = (
            f"softmax[i, j] = e^({x}[i, j] − m_i) / Σ_k e^({x}[i, k] − m_i)",
            f"m_i = max_k {x}[i, k]" + ("，即第 i 行的最大值" if zh else ", the maximum of row i"),
        )
    else:
        formula = (
            f"softmax[i, j] = e^({x}[i, j] − m_i) / (Σ_k e^({x}[i, k] − m_i) + e^(sink − m_i))",
            f"m_i = max(max_k {x}[i, k], sink)"
            + ("，sink 是这个头学到的 logit" if zh else ", sink the head's learned logit"),
        )
    inputs = (shape_of(x),)
    meaning.append(
        "每一行变成一组权重：先取指数，再除以这一行指数的总和。权重都不小于 0"
        "（被遮盖的键正好是 0），每一行加起来等于 1。"
        if zh
        else "Each row becomes a set of weights: exponentiate, then divide by the row's "
        "total. The weights are never negative (exactly 0 for a masked key) and each row "
        "sums to 1."
    )
    meaning.append(
        "为什么先减去最大值 m：e^(x_j − m) / Σ_k e^(x_k − m) = e^(x_j) / Σ_k e^(x_k)，"
        "因为分子分母里的 e^(−m) 互相抵消，结果完全不变；而减去之后最大的指数是 e^0 = 1，"
        "不会溢出。"
        if zh
        else "Why subtract the maximum m first: e^(x_j − m) / Σ_k e^(x_k − m) = "
        "e^(x_j) / Σ_k e^(x_k), because the factor e^(−m) cancels, so the result is "
        "unchanged; but now the largest exponential is e^0 = 1 and nothing can overflow."
    )
    meaning.append(
        "一行权重说明这个查询把注意力怎样分给各个键：权重越大，"
        "这个键对应的内容在结果里占的比例就越大。"
        if zh
        else "A row of weights says how one query divides its attention among the keys: "
        "the bigger the weight, the larger that key's share of the result."
    )
    meaning += [line for t in active(trace.inputs) for line in t.notes("softmax", c)]
    meaning += _sentinel_meaning(c)
    if trace.empty_rows:
        meaning.append(
            "有的行所有键都被遮住，这个查询没有可看的对象：它的权重全部记为 0，"
            "而不是无意义的非数值。"
            if zh
            else "Some rows have every key masked, so the query has nothing to attend to: "
            "its weights are all 0 (as torch SDPA does since 2.5), never NaN."
        )
    return formula, inputs, meaning


def _sentinel_meaning(c: Context) -> list[str]:
    """With a finite mask_value: how many rows it let weight leak into, from the trace."""
    rows = c.trace.sentinel_rows
    if not rows:
        return []
    v = short_number(c.trace.inputs.mask_value, c.precision)
    uniform = sum(r.uniform for r in rows)
    leaked = (
        short_number(max(r.leaked for r in rows if not r.uniform), c.precision)
        if len(rows) > uniform
        else "0"
    )
    return [
        _en_zh(
            c,
            f"The mask value {v} is a finite sentinel, not −∞: "
            f"{len(rows) - uniform} rows gave hidden "
            f"keys weight (up to {leaked}), and {uniform} rows with no allowed key became uniform "
            "instead of zero. With −∞ every hidden weight is exactly 0.",
            f"遮盖值 {v} 是有限的哨兵值，不是 −∞：有 {len(rows) - uniform} 行把权重分给了不该看的键"
            f"（最多 {leaked}），还有 {uniform} 行没有可看的键，却变成了均匀分布而不是全 0。"
            "用 −∞ 时，被遮住的权重正好是 0。",
        )
    ]


def _explain_output(c: Context) -> Parts:
    """The explanation of output."""
    weights = "softmax" if "softmax" in c.trace else "implicit_weights"  # linear attention
    formula = (f"output[i] = Σ_j {weights}[i, j] × V[j]",)
    meaning = (
        "每个查询的输出是各行 V 按权重加起来的和。这就是“搜索结果”：标签（K）"
        "和查询（Q）越匹配，对应的内容（V）在结果里占得越多。每一行就是这个词"
        "融合了上下文之后的新表示。"
        if c.lang == "zh"
        else "Each query's output is the sum of the value rows, weighted by its softmax row. "
        "This is the search result: the contents (V) blended in proportion to how well "
        "their labels (K) matched the query (Q). Each row is the token's new, "
        "context-aware representation."
    )
    notes = [line for t in active(c.trace.inputs) for line in t.notes("output", c)]
    return formula, (c.shape_of(weights), c.shape_of("V")), [meaning, *notes]


def _joined(inp: Inputs) -> str:
    """The stage concat joins: output, else the last head-output transform's."""
    from attn_cli.core.chain import Chain

    return Chain(inp).joined


def _explain_concat(c: Context) -> Parts:
    """The explanation of concat."""
    inp = c.trace.inputs
    head = axis_name(c.lang, "head")
    joined = _joined(inp)  # output, or a head-output transform's stage (gated)
    formula = (
        f"concat = [{head} 0 | {head} 1 | …]"
        if joined == "output"
        else f"concat = [{joined}[{head} 0] | {joined}[{head} 1] | …]",
    )
    meaning = (
        f"{inp.heads} 个头各自用自己那一份 W_Q、W_K、W_V 做了一次独立的搜索。"
        "把它们的输出并排拼起来：头 0 占前 d_v 列，头 1 占接下来的 d_v 列，依此类推。"
        if c.lang == "zh"
        else f"Each of the {inp.heads} heads ran its own search with its own slice of "
        "W_Q, W_K and W_V. Their outputs sit side by side: head 0 fills the first d_v "
        "columns, head 1 the next d_v, and so on."
    )
    return formula, (c.shape_of(joined if joined in c.trace else "output"),), [meaning]


def _explain_projected(c: Context) -> Parts:
    """The explanation of projected."""
    bias = " + b_O" if c.trace.inputs.b_O is not None else ""
    inputs: tuple[str, ...] = (c.shape_of("concat"), c.weight("W_O", ("heads*d_v", "d_out")))
    if bias:
        inputs += (c.weight("b_O", ("d_out",)),)
    meaning = (
        "W_O 把各个头的结果混合成每个词一个 d_out 维的向量。这就是注意力层交给下一层的结果。"
        if c.lang == "zh"
        else "W_O mixes the heads' results into one vector of d_out numbers per token. This "
        "is what the attention layer hands on to the next layer."
    )
    return (f"projected = concat·W_O{bias}",), inputs, [meaning]


def _query_key(trace: Trace, name: str) -> str:
    """The stage the scores read for Q or K: the last Q/K transform's (rotated, else
    normalised, or differential attention's first half), else plain."""
    from attn_cli.core.chain import Chain

    stages = Chain(trace.inputs).qk_stages(name)
    return next((s for s in reversed(stages) if s in trace.applicable), name)


def _en_zh(c: Context, en: str, zh: str) -> str:
    return zh if c.lang == "zh" else en


def _explain_x_kv(c: Context) -> Parts:
    """The explanation of X_kv, the encoder's output in cross-attention."""
    formula = (
        _en_zh(c, "X_kv: the sequence the keys and values come from", "X_kv：键和值所来自的序列"),
    )
    meaning = [
        _en_zh(
            c,
            "Cross-attention (encoder-decoder): the queries come from X, but the keys and values "
            "come from another sequence, X_kv, such as the encoder's output for the sentence being "
            "translated. Each query searches that other sequence.",
            "交叉注意力（编码器-解码器）：查询来自 X，键和值却来自另一个序列 X_kv，"
            "例如翻译时编码器对原句的输出。每个查询都在那个序列里搜索。",
        )
    ]
    return formula, (label(c.lang, "given"),), meaning


def _explain_lse(c: Context) -> Parts:
    """The explanation of lse (log-sum-exp), what FlashAttention keeps instead of weights."""
    x = softmax_input(c.trace.inputs)
    sink = " + e^sink" if has_extra_logit(c.trace.inputs) else ""
    formula = (f"lse_i = log(Σ_j e^({x}[i, j]){sink})", f"softmax[i, j] = e^({x}[i, j] − lse_i)")
    meaning = [
        _en_zh(
            c,
            "The log-sum-exp of each row: log Σ_j e^(x_j), computed as m + log Σ_j e^(x_j − m). "
            "It is what torch's scaled_dot_product_attention and "
            "FlashAttention keep instead of the "
            "weights: any weight can be rebuilt as exp(x − lse), and the backward pass needs "
            "nothing else.",
            "每一行的 log-sum-exp：log Σ_j e^(x_j)，按 m + log Σ_j e^(x_j − m) 计算。"
            "torch 的 scaled_dot_product_attention 和 FlashAttention 保存的就是它，而不是权重："
            "任何权重都可以用 exp(x − lse) 重建，反向传播也只需要它。",
        )
    ]
    return formula, (c.shape_of(softmax_input(c.trace.inputs)),), meaning


# One explainer per explanation key of the stage table (core/stages.py): the forward stages.
EXPLAINERS.update(
    {
        "X": _explain_x,
        "QKV": _explain_qkv,
        "scores": _explain_scores,
        "scaled": _explain_scaled,
        "masked": _explain_masked,
        "softmax": _explain_softmax,
        "output": _explain_output,
        "concat": _explain_concat,
        "projected": _explain_projected,
        "X_kv": _explain_x_kv,
        "lse": _explain_lse,
    }
)


_QKV: dict[Lang, dict[str, str]] = {
    "en": {
        "Q": "Query: what am I looking for? Think of a search: each token turns its embedding "
        "into a query vector, the search terms it types into the box.",
        "K": "Key: which labels do I offer? Each token's key vector is like the keyword tags on "
        "a document; every query will be matched against these tags.",
        "V": "Value: what do I actually contain? A key only decides how well a token matches; "
        "the value is what gets handed back, the document's content rather than its tags.",
    },
    "zh": {
        "Q": "查询（Q）：我想找什么内容？可以想象在搜索文档：每个词把自己的嵌入向量变成查询向量，"
        "就像在搜索框里输入的搜索词。",
        "K": "键（K）：你提供了哪些“关键词”？每个词的键向量就像一篇文章的关键词标签，"
        "后面每个查询都要拿来和这些标签比对。",
        "V": "值（V）：你具体包含了哪些信息？键只决定匹配得好不好，真正被取走的是值，"
        "相当于文章的正文，而不是它的标签。",
    },
}


def _logits(trace: Trace) -> str:
    """What ``masked`` starts from: the last score modifier's stage (capped), else scaled."""
    return modifier_stage(trace.inputs) or "scaled"


def _bias_stages(trace: Trace) -> list[str]:
    """The additive biases kept as stages of their own (ALiBi's), added in ``masked``."""
    return [t.bias_stage for t in all_texts() if t.bias_stage and t.bias_stage in trace]


def _blocks(trace: Trace) -> bool:
    """Whether the causal rule, a mask or lengths stop a query attending some key."""
    inp = trace.inputs
    return inp.causal is not None or inp.mask is not None or inp.lengths is not None


def _masked_formula(trace: Trace, lang: Lang) -> tuple[str, ...]:
    inp = trace.inputs
    terms = _logits(trace) + (" + bias" if inp.bias is not None else "")
    terms += "".join(f" + {t.bias_stage}" for t in active(inp) if t.bias_stage)
    if not _blocks(trace):
        return (f"masked = {terms}",)
    fill = short_number(inp.mask_value, 6)
    where = (
        f"，不允许看的位置为 {fill}"
        if lang == "zh"
        else f", {fill} where a key may not be attended"
    )
    return (f"masked = {terms}{where}",)


def _masked_meaning(trace: Trace, lang: Lang) -> list[str]:
    zh = lang == "zh"
    return (
        _fill_meaning(trace, zh)
        + _rule_meaning(trace.inputs, zh)
        + _given_meaning(trace.inputs, zh)
    )


def _fill_meaning(trace: Trace, zh: bool) -> list[str]:
    """What a hidden place's score becomes: mask_value, or −∞ (none if nothing is hidden)."""
    inp = trace.inputs
    out = []
    if inp.mask_value != -math.inf and _blocks(trace):
        v = short_number(inp.mask_value, 6)
        out.append(
            f"查询不允许看的位置，分数被换成配置文件的 mask_value {v}，而不是 −∞。"
            f"e^({v} − m) 很小，但不是 0：允许看的分数接近 {v} 时，被遮住的键也会分到权重；"
            "一行里没有可看的键时，这一行会变成均匀分布，而不是全 0。"
            "这正是 −∞ 和“空行记为 0”规则存在的原因。"
            if zh
            else f"Where a query may not look, the score becomes the fixture's mask_value {v}, "
            f"not −∞. e^({v} − m) is tiny but not 0: where the allowed scores come near {v}, "
            "hidden keys get weight, and a row with no allowed key becomes uniform instead of "
            "zero. This is why −∞ and the zero-row rule exist."
        )
    elif _blocks(trace) or inp.bias is not None:
        out.append(
            "查询不允许看的位置，分数被换成 −∞。因为 e^−∞ = 0，"
            "这些键在 softmax 之后的权重正好是 0，它们的内容一点也不会混进结果。"
            if zh
            else "Where a query may not look, the score becomes −∞. Since e^−∞ = 0, those keys "
            "get a weight of exactly 0 after softmax, and none of their content leaks into the "
            "result."
        )
    return out


def _rule_meaning(inp: Inputs, zh: bool) -> list[str]:
    """The rules that hide or penalise keys by position: causal, then each variant's note."""
    out = []
    if inp.causal == "upper-left":
        out.append(
            "因果遮盖：第 i 个词只能看它自己和它前面的词（j ≤ i），不能偷看后面的词。"
            if zh
            else "Causal: token i may look only at itself and earlier tokens (j ≤ i), never at "
            "the future."
        )
    elif inp.causal == "lower-right":
        out.append(
            "因果遮盖（右下对齐）：第 i 个查询只能看 j ≤ i + seq_k − seq_q 的键，"
            "就像新生成的词去读前面已经缓存好的键和值。"
            if zh
            else "Causal, aligned bottom-right: query i sees keys j ≤ i + seq_k − seq_q, as new "
            "tokens do when they read a cache of earlier keys and values."
        )
    for t in active(inp):
        out += t.masked_note(t.setting(inp), zh)
    return out


def _given_meaning(inp: Inputs, zh: bool) -> list[str]:
    """The fixture's own mask, lengths and bias."""
    out = []
    if inp.mask is not None:
        out.append(
            "遮盖矩阵 mask：为 true（或 1）的位置可以看，为 false（或 0）的位置不能看。"
            if zh
            else "mask: true (or 1) means the query may attend that key, false (or 0) means it "
            "may not (torch SDPA's convention)."
        )
    if inp.lengths is not None:
        shown = ", ".join(str(int(n)) for n in inp.lengths)
        out.append(
            f"长度 lengths = [{shown}]：超出每个序列实际长度的键都是填充位，一律挡掉。"
            if zh
            else f"lengths = [{shown}]: the keys past each sequence's length are padding and are "
            "blocked."
        )
    if inp.bias is not None:
        out.append(
            "偏置 bias：在 softmax 之前加到缩放后的分数上，可以提高或降低某些键的分量；"
            "偏置里的 −∞ 会直接挡住对应的键。"
            if zh
            else "bias: added to the scaled scores before softmax, to raise or lower some keys; "
            "a −∞ in the bias blocks that key outright."
        )
    return out


# ---------------------------------------------------------------------------------------------
# The worked cell, stage by stage (its parts: explain_cell.py)


def cell_text(
    trace: Trace,
    cell: WorkedCell,
    stage: str,
    lang: Lang,
    precision: int = 4,
    full: bool = False,
) -> CellText | None:
    """The part of the worked cell that belongs under ``stage``, or None if none does."""
    part = cell_part(stage)
    return None if part is None else part(Cell(trace, cell, lang, precision, full, stage))
