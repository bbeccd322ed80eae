"""``attn flash --split-kv S`` as Rich renderables: chunk by chunk (its keys, m, l, lse, O_s),
then the merge (m*, the weights exp(lse_s − lse), O and lse), then the checks, with
explanations in English or Chinese.

Formatting only: every number comes from the :class:`SplitRun` (core/split_kv.py's chunks and
merges, check/split_runs.py's checks). ``split_pages`` yields one renderable per page for step
mode: the overview, each chunk, the merge, the checks; ``split_titles`` names them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.text import Text

from attn_cli.present.explain_registry import Explanation
from attn_cli.present.flash_view import render_checks
from attn_cli.present.i18n import Lang
from attn_cli.present.options import RenderOptions
from attn_cli.present.render import render_explanation, render_header
from attn_cli.present.run_view import Sections, lookup, sentinel_note, titled_matrix
from attn_cli.present.text import TABLE_EDGE, pick_tables

if TYPE_CHECKING:
    from attn_cli.check.split_runs import SplitRun

LABELS: dict[Lang, dict[str, str]] = {
    "en": {
        "title": "Split-KV (flash-decoding): {n} chunks of keys, merged by log-sum-exp",
        "bounds": "chunks (keys): {bounds}; as even as possible, the first ones one key longer",
        "blocks": "each chunk is FlashAttention's tile loop: blocks {bq} queries × {bk} keys",
        "whole": "each chunk in one block of its keys",
        "base2": "--base2: every lse in base 2, merged with exp2 and log2",
        "extra": "the sink logit joins the merge once, as a state with lse = the logit, O = 0",
        "chunk": "chunk {s} of {n} · keys {s0}..{s1}",
        "merge": "the merge of {n} chunks",
        "state": "{where}m, l, lse = m + log l, O_s = acc / l",
        "weights": "{where}m* = max lse_s, the weights w_s = exp(lse_s − lse), lse",
        "merged_O": "{where}O = Σ w_s·O_s",
        "sink": "sink",
        "query": "query",
        "where": "batch {b} · head {h} · ",
        "where_h": "head {h} · ",
        "more": "… {n} more (--full)",
        "check_title": "self-check against plain softmax attention",
        "check_output": "O (one-shot merge) vs plain softmax rows' output",
        "check_lse": "lse (one-shot merge) vs plain softmax rows' lse (base e)",
        "check_softmax": "exp(x − lse) vs the trace's softmax",
        "check_output_fold": "O, merged left to right (a fold) vs plain rows",
        "check_lse_fold": "lse, merged left to right (a fold) vs plain rows",
        "check_output_tree": "O, merged right to left in pairs (a tree) vs plain rows",
        "check_lse_tree": "lse, merged right to left in pairs (a tree) vs plain rows",
        "check_orders_output": "O: the fold vs the tree",
        "check_orders_lse": "lse: the fold vs the tree",
        "page_overview": "overview",
        "page_chunk": "chunk {s}: keys {s0}..{s1}",
        "page_merge": "the merge",
        "page_checks": "the self-check",
    },
    "zh": {
        "title": "拆分 KV（flash-decoding）：键分成 {n} 段，按 log-sum-exp 合并",
        "bounds": "各段（键）：{bounds}；尽量均分，前面的段多一个键",
        "blocks": "每一段都是 FlashAttention 的分块循环：每块 {bq} 个查询 × {bk} 个键",
        "whole": "每一段的键作为一块处理",
        "base2": "--base2：所有 lse 以 2 为底，用 exp2 和 log2 合并",
        "extra": "sink 的 logit 只在合并时加入一次：作为 lse = 该 logit、O = 0 的一个状态",
        "chunk": "第 {s} 段，共 {n} 段 · 键 {s0}..{s1}",
        "merge": "{n} 段的合并",
        "state": "{where}m、l、lse = m + log l、O_s = acc / l",
        "weights": "{where}m* = max lse_s，权重 w_s = exp(lse_s − lse)，lse",
        "merged_O": "{where}O = Σ w_s·O_s",
        "sink": "sink",
        "query": "查询",
        "where": "批 {b} · 头 {h} · ",
        "where_h": "头 {h} · ",
        "more": "… 还有 {n} 项（--full）",
        "check_title": "与普通 softmax 注意力对比的自检",
        "check_output": "O（一次合并）对比逐行普通 softmax 的 output",
        "check_lse": "lse（一次合并）对比逐行普通 softmax 的 lse（以 e 为底）",
        "check_softmax": "exp(x − lse) 对比 trace 的 softmax",
        "check_output_fold": "O：从左到右逐个合并（折叠）对比逐行结果",
        "check_lse_fold": "lse：从左到右逐个合并（折叠）对比逐行结果",
        "check_output_tree": "O：从右到左两两合并（树）对比逐行结果",
        "check_lse_tree": "lse：从右到左两两合并（树）对比逐行结果",
        "check_orders_output": "O：折叠对比树",
        "check_orders_lse": "lse：折叠对比树",
        "page_overview": "概览",
        "page_chunk": "第 {s} 段：键 {s0}..{s1}",
        "page_merge": "合并",
        "page_checks": "自检",
    },
}


_t = partial(lookup, LABELS)  # a label of LABELS in a language, filled in


def render_overview(run: SplitRun, options: RenderOptions) -> Group:
    """The configuration, the chunks' keys, the blocks, the base, the sink."""
    lang = options.lang
    result = run.result
    bounds = ", ".join(f"{c.keys[0]}..{c.keys[1] - 1}" for c in result.chunks)
    bk = "whole" if run.block_k is None else ""
    parts: list[RenderableType] = [
        render_header(run.trace, lang),
        Rule(
            Text(_t(lang, "title", n=len(result.chunks)), style="bold cyan"),
            align="left",
            style="cyan",
        ),
        Text(_t(lang, "bounds", bounds=bounds)),
        Text(_t(lang, bk) if bk else _t(lang, "blocks", bq=run.block_q, bk=run.block_k)),
    ]
    if result.base2:
        parts.append(Text(_t(lang, "base2"), style="bold"))
    if result.extra is not None:
        parts.append(Text(_t(lang, "extra"), style="bold"))
    parts += sentinel_note(run.sentinel, lang)
    if options.explain:
        parts.append(render_explanation(explain(run, "split", lang)))
    return Group(*parts, Text(""))


def _section(run: SplitRun, k: int, options: RenderOptions) -> Group:
    """Chunk k, or the merge after the last chunk."""
    if k < len(run.result.chunks):
        return render_chunk(run, k, options)
    return render_merge(run, options)


def _heads(
    run: SplitRun,
    options: RenderOptions,
    table: Callable[[int, int, str], None],
    parts: list[RenderableType],
) -> None:
    """``table(b, h, where)`` for every (batch, head), the middle ones elided in ``parts``."""
    inp = run.trace.inputs
    pairs = [(b, h) for b in range(inp.batch) for h in range(inp.heads)]
    lang = options.lang
    for n in pick_tables(len(pairs), options.full):
        if n is None:
            parts.append(Text(_t(lang, "more", n=len(pairs) - 2 * TABLE_EDGE), style="dim"))
            continue
        b, h = pairs[n]
        where = _t(lang, "where", b=b, h=h) if inp.has_batch else _t(lang, "where_h", h=h)
        table(b, h, where)


def render_chunk(run: SplitRun, s: int, options: RenderOptions) -> Group:
    """One chunk: per (batch, head), each query's m, l, lse and O_s."""
    lang = options.lang
    chunk = run.result.chunks[s]
    s0, s1 = chunk.keys
    title = _t(lang, "chunk", s=s, n=len(run.result.chunks), s0=s0, s1=s1 - 1)
    parts: list[RenderableType] = [Rule(Text(title, style="bold cyan"), align="left", style="cyan")]
    queries = list(run.trace.query_labels)
    cols = ["m", "l", "lse", *(f"O_s {i}" for i in range(chunk.output.shape[-1]))]

    def table(b: int, h: int, where: str) -> None:
        state = np.stack([chunk.m[b, h], chunk.l[b, h], chunk.lse[b, h]], axis=1)  # (T, 3)
        matrix = np.concatenate([state, chunk.output[b, h]], axis=1)  # (T, 3 + Dv)
        parts.extend(
            titled_matrix(
                _t(lang, "state", where=where), matrix, queries, cols, _t(lang, "query"), options
            )
        )

    _heads(run, options, table, parts)
    if options.explain:
        parts.append(render_explanation(explain(run, "chunk", lang)))
    return Group(*parts, Text(""))


def render_merge(run: SplitRun, options: RenderOptions) -> Group:
    """The merge: per (batch, head), each query's m*, weights, lse and O."""
    lang = options.lang
    result = run.result
    m = result.merged
    n = len(result.chunks)
    title = _t(lang, "merge", n=n)
    parts: list[RenderableType] = [Rule(Text(title, style="bold cyan"), align="left", style="cyan")]
    queries = list(run.trace.query_labels)
    sink = [] if result.extra is None else [f"w {_t(lang, 'sink')}"]
    cols = ["m*", *(f"w {s}" for s in range(n)), *sink, "lse"]
    o_cols = [f"O {i}" for i in range(m.output.shape[-1])]
    q_axis = _t(lang, "query")

    def table(b: int, h: int, where: str) -> None:
        weights = m.weights[:, b, h].T  # (T, n [+ 1])
        matrix = np.concatenate([m.m_star[b, h][:, None], weights, m.lse[b, h][:, None]], axis=1)
        parts.extend(
            titled_matrix(_t(lang, "weights", where=where), matrix, queries, cols, q_axis, options)
        )
        parts.extend(
            titled_matrix(
                _t(lang, "merged_O", where=where), m.output[b, h], queries, o_cols, q_axis, options
            )
        )

    _heads(run, options, table, parts)
    if options.explain:
        parts += [render_explanation(explain(run, key, lang)) for key in ("merge", "weights")]
    return Group(*parts, Text(""))


def render_split_checks(run: SplitRun, options: RenderOptions) -> Group:
    """The one-shot merge, the fold and the tree against the trace, and against each other."""
    parts: list[RenderableType] = [render_checks(run, options.lang, LABELS)]
    if options.explain:
        parts.append(render_explanation(explain(run, "orders", options.lang)))
    return Group(*parts)


# ---------------------------------------------------------------------------------------------
# Explanations (en and zh)

_EXPLAIN: dict[str, dict[Lang, tuple[str, str]]] = {  # key -> lang -> (formula, meaning)
    "split": {
        "en": (
            "keys 0..S−1 → n chunks; each chunk: flash's loop → m_s, l_s, O_s, lse_s",
            "A long KV cache is cut into chunks that different workers (thread blocks, "
            "GPUs) attend to at the same time, each knowing nothing of the others; their "
            "partial answers are merged at the end. This is flash-decoding, and FlashInfer's "
            "merge_state: it keeps a GPU busy when one query meets many keys.",
        ),
        "zh": (
            "键 0..S−1 → n 段；每一段：flash 的循环 → m_s、l_s、O_s、lse_s",
            "很长的 KV 缓存被切成几段，由不同的工作单元（线程块、GPU）同时处理，彼此互不知晓；"
            "最后再把各自的部分结果合并。这就是 flash-decoding，也是 FlashInfer 的 merge_state："
            "一个查询面对很多键时，它让 GPU 保持忙碌。",
        ),
    },
    "chunk": {
        "en": (
            "lse_s = m_s + log l_s,  O_s = acc_s / l_s",
            "Each chunk is an ordinary softmax over its own keys only: O_s is normalised by "
            "the chunk's own sum, and lse_s records how large that sum was. A chunk whose "
            "keys a query may not see (later keys under causal) has lse_s = −∞ and O_s = 0.",
        ),
        "zh": (
            "lse_s = m_s + log l_s，O_s = acc_s / l_s",
            "每一段只是在自己的键上做普通的 softmax：O_s 用这一段自己的和归一化，"
            "lse_s 记下这个和有多大。若某个查询看不到这一段的任何键（因果遮盖下靠后的键），"
            "则 lse_s = −∞，O_s = 0。",
        ),
    },
    "merge": {
        "en": (
            "m* = max_s lse_s,  lse = m* + log Σ_s exp(lse_s − m*)",
            "The log-sum-exp of the chunks' log-sum-exps is the whole row's: exp(lse) is the "
            "sum over all keys. Subtracting the largest, m*, first keeps every exp at most 1, "
            "so large scores never overflow; a chunk at −∞ adds exp(−∞) = 0.",
        ),
        "zh": (
            "m* = max_s lse_s，lse = m* + log Σ_s exp(lse_s − m*)",
            "各段 log-sum-exp 的 log-sum-exp 就是整行的：exp(lse) 是对所有键的求和。"
            "先减去最大的 m*，每个 exp 都不超过 1，大分数也不会溢出；处于 −∞ 的段贡献 "
            "exp(−∞) = 0。",
        ),
    },
    "weights": {
        "en": (
            "w_s = exp(lse_s − lse),  O = Σ_s w_s · O_s",
            "Chunk s holds the share w_s of the row's softmax mass, so its normalised output "
            "counts that much. The weights of a row sum to 1 (with a sink, the sink takes its "
            "own share and its O is 0).",
        ),
        "zh": (
            "w_s = exp(lse_s − lse)，O = Σ_s w_s · O_s",
            "第 s 段占这一行 softmax 总量的 w_s，所以它归一化后的输出按这个比例计入。一行的权重"
            "之和为 1（有 sink 时，sink 占去自己的一份，它的 O 为 0）。",
        ),
    },
    "orders": {
        "en": (
            "(a ⊕ b) ⊕ c = a ⊕ (b ⊕ c),  a ⊕ b = b ⊕ a",
            "Merging two states gives a state of the same kind, and the merge is associative "
            "and commutative: workers may finish in any order and be merged as they arrive. "
            "attn merges left to right (a fold) and right to left in pairs (a tree); both "
            "equal plain attention to rounding (1e-12 in float64).",
        ),
        "zh": (
            "(a ⊕ b) ⊕ c = a ⊕ (b ⊕ c)，a ⊕ b = b ⊕ a",
            "两个状态合并后仍是同一种状态，而且合并满足结合律和交换律："
            "各工作单元可以按任意顺序完成，到一个合并一个。attn 从左到右逐个合并（折叠），"
            "又从右到左两两合并（树）；两者都与普通注意力相等，只差舍入（float64 下 1e-12）。",
        ),
    },
}


def explain(run: SplitRun, key: str, lang: Lang) -> Explanation:
    """The explanation of one quantity of the split and the merge."""
    formula, meaning = _EXPLAIN[key][lang]
    n, Dv = len(run.result.chunks), run.trace.inputs.d_v
    inputs = {
        "split": ("Q", "K", "V"),
        "chunk": ("m_s", "l_s", "acc_s"),
        "merge": ("lse_0", "…", f"lse_{n - 1}"),
        "weights": ("lse_s", "lse", "O_s"),
        "orders": ("(lse_s, O_s)",),
    }[key]
    shape = {
        "split": f"{n} × (m, l, lse [seq_q], O_s [seq_q, d_v={Dv}])",
        "chunk": f"lse_s [seq_q], O_s [seq_q, d_v={Dv}]",
        "merge": "m*, lse [seq_q]",
        "weights": f"w [seq_q, {n}], O [seq_q, d_v={Dv}]",
        "orders": f"lse [seq_q], O [seq_q, d_v={Dv}]",
    }[key]
    return Explanation(key, lang, (formula,), inputs, shape, (meaning,))


def _page_title(run: SplitRun, k: int, lang: Lang) -> str:
    """A section's page title: a chunk's keys, or the merge after the last chunk."""
    if k == len(run.result.chunks):
        return _t(lang, "page_merge")
    c = run.result.chunks[k]
    return _t(lang, "page_chunk", s=k, s0=c.keys[0], s1=c.keys[1] - 1)


SECTIONS = Sections(
    render_overview,
    _section,
    render_split_checks,
    LABELS,
    _page_title,
    steps=lambda run: len(run.result.chunks) + 1,  # each chunk, then the merge
    more="more",
)
render_split = SECTIONS.whole  # the overview, each chunk (the middle ones elided), merge, checks
split_pages = SECTIONS.pages  # step mode's pages: the overview, each chunk, the merge, checks
split_titles = SECTIONS.titles  # step mode's page titles, as split_pages
