"""``attn probe`` for people: a table of the conventions, then the findings in the grader's words.

A finding the grader's catalogue knows (check/mistakes/) takes its title and its Chinese title
and explanation (``check.mistake.ZH``); the probe's own findings have theirs here. ``explain``
adds what each finding means and how to fix it, in English or (``lang`` "zh") Chinese.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attn_cli.errors import printable

if TYPE_CHECKING:
    from rich.console import RenderableType

    from attn_cli.check.probe import ProbeReport, Value

# What a finding means and the fix, in English (the grader's own English carries a fixture's
# numbers, so the probe says it in general here).
EXPLAIN_EN = {
    "scaled_by_d_k": "The scores are divided by d instead of √d. Fix: / math.sqrt(d).",
    "no_scaling": "The scores enter the softmax unscaled. Fix: multiply by 1 / math.sqrt(d).",
    "scale_constant": "The scale is a number that does not follow the head size (0.125 is "
    "1/√64 only at d = 64). Fix: 1 / math.sqrt(q.shape[-1]).",
    "scale_option_ignored": "A scale passed in is not used. Fix: use it when it is not None.",
    "causal_corner": "With seq_q < seq_k the mask is aligned to the other corner: SDPA's "
    "is_causal is upper-left (query i sees keys j <= i). Fix: tril(ones(T, S)).",
    "causal_shifted": "A query does not see itself (triu(diagonal=0) masks the diagonal too). "
    "Fix: mask j > i, i.e. triu(ones, diagonal=1).",
    "causal_missing": "causal=True changes nothing. Fix: hide the keys j > i.",
    "causal_other": "The keys hidden follow none of the causal alignments.",
    "mask_inverted": "True hides a key here (nn.MultiheadAttention's convention); in SDPA's "
    "bool mask True means 'may attend'. Fix: masked_fill(~mask, -inf).",
    "mask_ignored": "The mask passed in changes nothing. Fix: apply it before the softmax.",
    "mask_zero_fill": "Hidden places are set to 0 (scores * mask): exp(0) = 1 keeps a weight. "
    "Fix: masked_fill(~mask, float('-inf')).",
    "mask_other": "The mask changes the output, but hides no key the way it says.",
    "empty_row_nan": "A query with every key masked gets nan (-inf - -inf); SDPA (torch >= "
    "2.5) gives zeros. Fix: set such rows to 0.",
    "mask_finite_sentinel": "A finite fill (-1e9) makes a row with every key masked uniform, "
    "not zero. Fix: fill with -inf and give empty rows zeros.",
    "empty_row_other": "A row with every key masked gives neither zeros nor nan nor uniform "
    "weights (a sentinel added to the scores, not filled in?).",
    "gqa_tiled": "Query head h reads K/V head h % kv_heads (tile); sharing heads are adjacent "
    "in SDPA's enable_gqa and HF's repeat_kv. Fix: repeat_interleave(groups, dim=1).",
    "gqa_other": "The query heads read the K/V heads in an order that is neither.",
    "softmax_wrong_axis": "The softmax runs over the queries: columns sum to 1, not rows. "
    "Fix: softmax over the last axis (the keys).",
    "no_max_subtraction": "exp(x) overflows for large logits: inf / inf = nan. Fix: subtract "
    "each row's maximum first.",
    "zero_scores_masked": "Masked places are found as scores == 0 (after scores * mask), so a "
    "score that is exactly 0 is masked too. Fix: masked_fill(~mask, -inf) from the mask itself.",
    "not_deterministic": "Two calls with the same inputs give different outputs: dropout is "
    "on (dropout_p > 0, or the module in training mode). Fix: dropout_p=0 when not training.",
    "batch_dependent": "An item's output changes with the other items of the batch (a "
    "normalisation or softmax over the batch axis). Fix: reduce over the keys only.",
    "window_off_by_one": "A query sees W + 1 keys; HF and Mistral's window is W keys, itself "
    "included (0 <= i - j < W). Fix: i - j < window.",
    "window_ignored": "window changes nothing beyond causal. Fix: hide keys with i - j >= W.",
    "window_other": "The keys the window hides follow neither W nor W + 1 keys.",
    "mutates_inputs": "The function writes into the arrays it was given (q *= scale, an "
    "in-place masked_fill_): the caller's arrays change. Fix: q = q * scale.",
    "output_differs": "Every convention above matches, yet the output of random inputs does "
    "not: Q and K swapped, V misused, a wrong projection? Grade its stages with attn check.",
}

# The Chinese title and explanation of the probe's own findings (the catalogue's are its ZH).
PROBE_ZH = {
    "scale_constant": (
        "缩放用了固定常数而不是 1/√d_k",
        "缩放因子不随头的维度变化（0.125 只在 d = 64 时等于 1/√d）。修正：1 / math."
        "sqrt(q.shape[-1])。",
    ),
    "scale_option_ignored": ("传入的 scale 没有被使用", "修正：scale 不为 None 时就用它。"),
    "causal_other": ("因果遮蔽的形状不对", "被遮蔽的键不符合任何一种对齐方式。"),
    "mask_ignored": ("遮蔽没有被应用", "传入的遮蔽不改变输出。修正：在 softmax 之前应用它。"),
    "mask_other": ("遮蔽以别的方式被应用", "遮蔽改变了输出，但没有按它说的屏蔽键。"),
    "empty_row_other": (
        "全部被遮蔽的行既不是 0 也不是 nan",
        "可能把哨兵值加到了分数上而不是填充。",
    ),
    "gqa_other": ("K/V 头以另一种顺序分配", "查询头读取 K/V 头的顺序既不是分组也不是平铺。"),
    "zero_scores_masked": (
        "恰好为 0 的分数也被遮蔽了（scores * mask，再 == 0 -> -inf）",
        "用分数是否为 0 来判断遮蔽位置，恰好为 0 的分数也被屏蔽。修正：直接用遮"
        "蔽本身 masked_fill(~mask, -inf)。",
    ),
    "not_deterministic": (
        "两次相同的调用结果不同（dropout 没关？）",
        "修正：不训练时 dropout_p=0。",
    ),
    "batch_dependent": (
        "一个样本的输出依赖批中的其他样本",
        "在批的轴上做了归一化或 softmax。修正：只沿键的轴归约。",
    ),
    "window_other": ("滑动窗口的形状不对", "被窗口屏蔽的键既不是 W 个也不是 W + 1 个。"),
    "mutates_inputs": (
        "函数修改了传入的数组",
        "原地操作（q *= scale、masked_fill_）改变了调用者的数组。修正：q = q * scale。",
    ),
    "output_differs": (
        "输出的差别无法用任何约定解释",
        "每个约定都一致，但随机输入的输出不一致：Q 与 K 交换了？V 用错了？用 "
        "attn check 逐阶段检查。",
    ),
}


def zh_texts(finding_id: str) -> tuple[str, str]:
    """The Chinese title and explanation of a finding (the catalogue's, else the probe's)."""
    if finding_id in PROBE_ZH:
        return PROBE_ZH[finding_id]
    import attn_cli.check.mistakes  # noqa: F401 - registers the catalogue and its ZH
    from attn_cli.check.mistake import ZH

    return ZH.get(finding_id, ("", ""))


def shown(value: Value) -> str:
    """A convention's value as the JSON has it: true, false, a number, a name."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


def render_probe(report: ProbeReport, *, lang: str = "en", explain: bool = False) -> RenderableType:
    """The conventions table, then each finding (title, evidence, and the fix if explained)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"attn probe {printable(report.target)}", title_justify="left")
    for column in ("convention", "found", "reference", "evidence"):
        table.add_column(column, overflow="fold")
    for d in report.decisions:
        style = "bold red" if d.differs else ""
        table.add_row(
            d.name,
            Text(shown(d.found), style=style),
            shown(d.reference),
            printable(_short(d.evidence)),
        )
    parts: list[RenderableType] = [table, Text("")]
    for f in report.findings:
        title_zh, text_zh = zh_texts(f.id) if lang == "zh" else ("", "")
        if title_zh:
            parts.append(
                Text.assemble(
                    ("发现：", "bold"), (title_zh, "bold yellow"), f" [{f.id}: {f.title}]"
                )
            )
            parts.append(Text(text_zh))
        else:
            parts.append(
                Text.assemble(("finding: ", "bold"), (f.title, "bold yellow"), f" [{f.id}]")
            )
            if explain:
                parts.append(Text(EXPLAIN_EN.get(f.id, "")))
        parts.append(Text(f"evidence: {printable(f.evidence)}"))
        parts.append(Text(""))
    verdict = (
        "verdict: matches (PyTorch SDPA's semantics on every convention it supports)"
        if report.verdict == "matches"
        else f"verdict: differs ({len(report.findings)} finding"
        f"{'s' if len(report.findings) != 1 else ''})"
    )
    parts.append(Text(verdict, style="bold green" if report.verdict == "matches" else "bold red"))
    return Group(*parts)


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
