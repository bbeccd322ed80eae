"""The language of the explanation layer (English or Chinese) and its short labels.

Costs nothing to import. Longer explanations live in :mod:`attn_cli.present.explain`; this
module holds the labels shared by the explanations, the worked cell, the heatmap legend and
step mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

Lang = Literal["en", "zh"]
LANGS: tuple[Lang, ...] = ("en", "zh")
LOCALE_VARIABLES = ("LC_ALL", "LC_MESSAGES", "LANG")  # POSIX precedence: the first set one wins


def default_lang(environ: Mapping[str, str]) -> Lang:
    """Chinese when the locale says so (``LANG=zh_CN.UTF-8``, ``LC_ALL=zh_TW``...), else English."""
    for name in LOCALE_VARIABLES:
        value = environ.get(name, "")
        if value:
            return "zh" if value.lower().startswith("zh") else "en"
    return "en"


LABELS: dict[Lang, dict[str, str]] = {
    "en": {
        "explain_title": "what this step does",
        "formula": "formula",
        "shapes": "shapes",
        "meaning": "meaning",
        "in": "in",
        "out": "out",
        "given": "(from the fixture)",
        "scalar": "a number",
        "cell_title": "worked cell: query {query}, key {key}",
        "cell_title_values": "worked cell: query {query}, every value row V",
        "cell_where": " ({where})",
        "sep": "; ",
        "head": "head",
        "kv_head": "kv head",
        "batch": "batch",
        "cell_dot": "dot product, term by term:",
        "cell_scale": "scaling:",
        "cell_bias": "plus the bias:",
        "cell_blocked": "this key may not be attended: −∞, so its weight will be exactly 0",
        "cell_open": "this key may be attended: the value passes unchanged",
        "cell_blocked_value": (
            "this key may not be attended, but the fixture fills it with {v}, not −∞: its "
            "weight will be small, yet not 0"
        ),
        "cell_row_sink": (
            "softmax over the row of {query} with the head's sink {sink} joined: m = the "
            "maximum of the row and the sink = {m}"
        ),
        "cell_sink_dropped": (
            "the sink took {d} of the row and is dropped: the kept weights sum to {kept}"
        ),
        "col_sink": "(sink)",
        "cell_row": "softmax over the row of {query}: m = the row maximum = {m}",
        "cell_row_empty": "every key of the row of {query} is masked: all its weights are 0",
        "cell_exp_sum": "Σ e^(x − m) = {total}; softmax[{query}, {key}] = {e} / {total} = {weight}",
        "cell_output": "output of {query}: the weights times the V rows, summed:",
        "col_key": "key",
        "col_weight": "weight",
        "heat_low": "low",
        "heat_high": "high",
        "heat_max": "row maximum",
        "heat_masked": "masked",
        "heat_row_sum": "row sum",
        "heat_title": "attention weights (softmax)",
        "focus": "focus: query {query}",
        "step_position": "stage {k} of {n}",
        "step_keys": "Enter/Space/→ next · ←/b back · q/Esc quit",
        "step_last": "last stage · ←/b back · q/Esc quit",
        "step_keys_short": "→ next · ← back · q quit",  # when the full hint does not fit
        "step_last_short": "last stage · ← back · q quit",
        # the renderers' own words: titles, the configuration panel, table chrome
        "trace_title": "attention trace",
        "traced_by": "Traced by attn {version}.",
        "more_tables": "{n} more tables",
        "full_hint": "{e} --full shows all",
        "scale_note": "  (scale = {scale})",
        "md_bold": "bold",
        "h_about": "about",
        "h_source": "source",
        "h_mode": "mode",
        "h_shapes": "shapes",
        "h_heads": "heads",
        "h_scale": "scale",
        "h_masking": "masking",
        "h_note": "note",
        "mode_projection": "projection: Q = X·W_Q (X @ W; a torch nn.Linear weight is Wᵀ)",
        "mode_direct": "direct: Q, K, V given",
        "dim_batch": "batch {n}",
        "dim_no_batch": "no batch axis",
        "dim_seq": "seq {n}",
        "list_sep": ", ",
        "heads_grouped": "{heads} query heads, {kv} key/value heads (grouped-query: head h reads "
        "kv head h // {group})",
        "heads_one_kv": "{heads} query heads, 1 key/value head (multi-query: every head reads "
        "kv head 0)",
        "scale_default": "{scale} = 1/√d_k (default, as torch SDPA)",
        "scale_given": "{scale} (from the fixture; 1/√d_k would be {default})",
        "scale_unscaled": ", unscaled as in the source article",
        "mask_upper_left": "causal upper-left: query i sees keys j ≤ i (torch is_causal=True)",
        "mask_lower_right": "causal lower-right: query i sees keys j ≤ i + seq_k − seq_q "
        "(KV cache)",
        "mask_mask": "mask: true = may attend (torch SDPA's convention; nn.MultiheadAttention's "
        "is the opposite)",
        "mask_bias": "bias: added to the scaled scores (−∞ blocks a key)",
        "mask_lengths": "lengths {lengths}: keys past each length are padding",
        "mask_combine": "these combine (torch SDPA refuses attn_mask with is_causal; attn "
        "allows it)",
        "note_empty_rows": "rows with nothing to attend to get all-zero weights (torch ≥ 2.5)",
        "h_conventions": "variants",
        "conv_cross": "cross-attention: Q from X, K and V from X_kv (d_model_kv {d})",
        "conv_positions": "positions: queries {q}, keys {k}",
        "conv_mask_value": (
            "mask value {v} instead of −∞ where a key may not be attended (a sentinel: it "
            "can leak weight)"
        ),
    },
    "zh": {
        "explain_title": "这一步在做什么",
        "formula": "公式",
        "shapes": "形状",
        "meaning": "含义",
        "in": "输入",
        "out": "输出",
        "given": "（由配置文件给出）",
        "scalar": "一个数",
        "cell_title": "单元格演算：查询 {query}，键 {key}",
        "cell_title_values": "单元格演算：查询 {query}，值 V 的每一行",
        "cell_where": "（{where}）",
        "sep": "；",
        "head": "头",
        "kv_head": "键值头",
        "batch": "批",
        "cell_dot": "点积逐项展开：",
        "cell_scale": "缩放：",
        "cell_bias": "加上偏置：",
        "cell_blocked": "这个键不允许看：记为 −∞，它的权重将正好是 0",
        "cell_open": "这个键允许看：数值原样保留",
        "cell_blocked_value": (
            "这个键不允许看，但配置文件填的是 {v} 而不是 −∞：它的权重很小，却不是 0"
        ),
        "cell_row_sink": (
            "对 {query} 这一行做 softmax，并入这个头的 sink {sink}："
            "m = 这一行与 sink 中的最大值 = {m}"
        ),
        "cell_sink_dropped": "sink 拿走了这一行的 {d}，随后被丢掉：保留的权重之和为 {kept}",
        "col_sink": "（sink）",
        "cell_row": "对 {query} 这一行做 softmax：m = 这一行的最大值 = {m}",
        "cell_row_empty": "{query} 这一行的键全被遮住：权重全部为 0",
        "cell_exp_sum": "Σ e^(x − m) = {total}；softmax[{query}, {key}] = {e} / {total} = {weight}",
        "cell_output": "{query} 的输出：权重乘以各行的 V，再相加：",
        "col_key": "键",
        "col_weight": "权重",
        "heat_low": "低",
        "heat_high": "高",
        "heat_max": "行内最大值",
        "heat_masked": "被遮盖",
        "heat_row_sum": "行和",
        "heat_title": "注意力权重（softmax）",
        "focus": "聚焦：查询 {query}",
        "step_position": "第 {k} 步，共 {n} 步",
        "step_keys": "回车/空格/→ 下一步 · ←/b 上一步 · q/Esc 退出",
        "step_last": "已是最后一步 · ←/b 上一步 · q/Esc 退出",
        "step_keys_short": "→ 下一步 · ← 上一步 · q 退出",
        "step_last_short": "已是最后一步 · ← 上一步 · q 退出",
        "trace_title": "注意力计算过程",
        "traced_by": "由 attn {version} 生成。",
        "more_tables": "另有 {n} 个表",
        "full_hint": "{e} 加 --full 显示全部",
        "scale_note": "（scale = {scale}）",
        "md_bold": "粗体",
        "h_about": "简介",
        "h_source": "来源",
        "h_mode": "模式",
        "h_shapes": "形状",
        "h_heads": "头数",
        "h_scale": "缩放",
        "h_masking": "遮盖",
        "h_note": "注意",
        "mode_projection": "投影：Q = X·W_Q（X @ W；torch nn.Linear 的权重是 Wᵀ）",
        "mode_direct": "直接给出：Q、K、V",
        "dim_batch": "批 {n}",
        "dim_no_batch": "没有批维度",
        "dim_seq": "词 {n}",
        "list_sep": "，",
        "heads_grouped": "{heads} 个查询头，{kv} 个键值头（分组查询：第 h 个头读取第 h // {group} "
        "个键值头）",
        "heads_one_kv": "{heads} 个查询头，1 个键值头（多查询：每个头都读取键值头 0）",
        "scale_default": "{scale} = 1/√d_k（默认值，与 torch SDPA 相同）",
        "scale_given": "{scale}（由配置文件给出；1/√d_k 应为 {default}）",
        "scale_unscaled": "，与原文一样不缩放",
        "mask_upper_left": "因果遮盖（左上对齐）：查询 i 只看键 j ≤ i（torch is_causal=True）",
        "mask_lower_right": "因果遮盖（右下对齐）：查询 i 只看键 j ≤ i + seq_k − seq_q（KV 缓存）",
        "mask_mask": "mask：true 表示可以看（torch SDPA 的约定；nn.MultiheadAttention 正好相反）",
        "mask_bias": "bias：加到缩放后的分数上（−∞ 挡住这个键）",
        "mask_lengths": "lengths {lengths}：超出各自长度的键是填充位",
        "mask_combine": "以上几种可以叠加（torch SDPA 不允许 attn_mask 与 is_causal 同时使用，"
        "attn 允许）",
        "note_empty_rows": "无键可看的行，权重全部为 0（torch ≥ 2.5）",
        "h_conventions": "变体",
        "conv_cross": "交叉注意力：Q 来自 X，K 和 V 来自 X_kv（d_model_kv {d}）",
        "conv_positions": "位置：查询 {q}，键 {k}",
        "conv_mask_value": "不允许看的位置填 {v} 而不是 −∞（哨兵值：可能漏出权重）",
    },
}

# Axis names as the explanation layer shows them; sizes such as d_k stay math symbols.
AXES: dict[Lang, dict[str, str]] = {
    "en": {},
    "zh": {
        "batch": "批",
        "head": "头",
        "kv_head": "键值头",
        "query": "查询",
        "key": "键",
        "seq": "词",
    },
}


def label(lang: Lang, key: str, /, **values: object) -> str:
    """The label ``key`` in ``lang``, with ``{placeholders}`` filled in."""
    text = LABELS[lang][key]
    return text.format(**values) if values else text


def axis_name(lang: Lang, axis: str) -> str:
    """An axis name (``query``, ``kv_head``...) in ``lang``."""
    return AXES[lang].get(axis, axis)


def axis_title(lang: Lang, axis: str) -> str:
    """An axis as a table title names it: ``kv head 1``, ``头 1``."""
    if lang == "en":
        return {"kv_head": "kv head"}.get(axis, axis)
    return axis_name(lang, axis)


def dims_text(lang: Lang, axes: Sequence[str], shape: Sequence[int]) -> str:
    """``seq=3, d_model=4`` with the axis names in ``lang``."""
    return ", ".join(f"{axis_name(lang, a)}={n}" for a, n in zip(axes, shape, strict=True))


# The stage table's formulas (core/stages.py) are English; these rewrite their words in
# Chinese, in order, leaving the math alone. A new formula with new words needs a row here
# (tests/present/test_i18n_render.py finds any English left).
FORMULA_ZH: tuple[tuple[str, str], ...] = (
    (r"^X \(the input embeddings\)$", "X（输入的嵌入向量）"),
    (r"^X_kv \(the states keys and values are projected from\)$", "X_kv（键和值由它投影而来）"),
    (r"^(\w+) \(given\)$", r"\1（由配置文件给出）"),
    (
        r" over keys with the head's sink joined, then dropped$",
        "（沿键方向，先并入该头的 sink 再去掉）",
    ),
    (r" over keys$", "（沿键方向）"),
    (r", (\S+) where not allowed \((.*)\)$", r"，不允许的位置为 \1（\2）"),
    (r"causal upper-left", "因果·左上对齐"),
    (r"causal lower-right", "因果·右下对齐"),
    (
        r": (\w+) layout, base (\S+), (\d+) of (\d+) dims(?=,|$)",
        r"：\1 布局，基数 \2，旋转 \4 维中的 \3 维",
    ),
    (r"\bkey positions?\b", "键位置"),
    (r"\bquery position\b", "查询位置"),
    (r"\bpositions\b", "位置"),
    (r", over each head, ", "，按每个头，"),
    (r", over the whole projection, ", "，按整个投影，"),
    (r"\bhead (\d+)", r"头 \1"),
)
# the variants' rows (present/variant_texts.py's ``register`` adds each one's ``formula_zh``)
FORMULA_ZH_MORE: list[tuple[str, str]] = []


def formula_text(lang: Lang, formula: str) -> str:
    """A stage's formula in ``lang``: as the stage table says it, or its words in Chinese."""
    if lang == "en":
        return formula
    import re

    for pattern, replacement in (*FORMULA_ZH, *FORMULA_ZH_MORE):
        formula = re.sub(pattern, replacement, formula)
    return formula


class _InALanguage(Protocol):
    @property
    def lang(self) -> Lang: ...


def en_zh(c: _InALanguage, en: str, zh: str) -> str:
    """``zh`` in Chinese, else ``en``."""
    return zh if c.lang == "zh" else en
