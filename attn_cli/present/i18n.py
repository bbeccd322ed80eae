"""The language of the explanation layer (English or Chinese) and its short labels.

Costs nothing to import. Longer explanations live in :mod:`attn_cli.present.explain`; this
module holds the labels shared by the explanations, the worked cell, the heatmap legend and
step mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

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
