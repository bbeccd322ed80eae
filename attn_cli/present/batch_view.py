"""``attn decode F1 F2 ... --batch`` as Rich renderables: the sequences, one section per step
(the packed rows, cu_seqlens, who joins and leaves, the block-diagonal mask, each head's
weights over the packed keys, the outputs), the checks; English or Chinese.

Formatting only: every number comes from the :class:`BatchRun` (core/batch.py's steps and the
checks of check/batch_runs.py).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np
from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.text import Text

from attn_cli.present.i18n import Lang, label
from attn_cli.present.options import RenderOptions
from attn_cli.present.render import listing, render_explanation, render_header
from attn_cli.present.run_view import Sections, lookup, titled_matrix
from attn_cli.present.text import safe

if TYPE_CHECKING:
    from attn_cli.check.batch_runs import BatchRun
    from attn_cli.present.explain_registry import Explanation

LABELS: dict[Lang, dict[str, str]] = {
    "en": {
        "title": "continuous batching",
        "overview": "{n} sequences decoded as one batch: each joins at its step with its prompt "
        "(prefill, {chunked}), then adds one query row a step until its last token, and leaves",
        "chunked": "in chunks of {c} rows",
        "whole": "all its rows at once",
        "col_seq": "sequence",
        "col_index": "#",
        "col_tokens": "tokens",
        "col_arrive": "joins at step",
        "col_prefill": "prefill",
        "col_leaves": "leaves after step",
        "seq_title": "the sequences",
        "step": "step {s} · {r} packed query rows, {k} packed keys",
        "cu": "cu_seqlens_q = {q} · cu_seqlens_k = {k}",
        "joins": "joins: {names}",
        "leaves": "leaves (its last row is here): {names}",
        "rows_title": "the packed query rows",
        "col_row": "row",
        "col_token": "token",
        "col_pos": "position",
        "mask_title": "the block-diagonal mask over the packed rows and keys (0: may attend, "
        "−∞: not)",
        "softmax_title": "softmax over the packed keys · head {h}",
        "output_title": "output · head {h} (one row per packed query row)",
        "check": "{name}: max |batch − its own decode| = {solo} {m1} · max |batch − the full "
        "attention's rows| = {full} {m2}",
        "check_title": "self-check of every sequence",
        "col_solo": "vs its own decode",
        "col_full": "vs the full rows",
        "page_overview": "the sequences",
        "page_step": "step {s}: {r} rows",
        "page_checks": "self-check of every sequence",
        "more_steps": "… {n} more steps (--full shows all)",
        "pool": "one pool of {n} pages of {b} tokens for every sequence, each with its block "
        "table; a page goes back to the pool when no sequence holds it",
        "pool_window": "a sliding window of {w} positions: once it has passed every token of "
        "a block, the block is released (−1 in its block table) and its page goes back to the "
        "pool when no other sequence holds it; the step gathers only the live blocks' keys",
        "pool_shared": "prefix sharing: a joining sequence takes the pages that already hold "
        "its prompt's keys and values, whole pages only (a page full of {b} tokens, as vLLM's "
        "prefix caching), block by block from the first; a sequence that writes into a page "
        "another holds copies it first (copy on write)",
        "pool_cost": "pages held at most: {m} ({bytes} bytes) · the same caches contiguous: "
        "{tokens} token slots ({contig} bytes)",
        "tables": "block tables: {tables}",
        "refs": "reference counts (page ×sequences): {refs}",
        "shared": "{name} shares page {page} for its block {block}: its prompt's keys and values "
        "are already there (cached, not written again)",
        "copied": "copy on write: {name} writes into page {page} (another sequence holds it): "
        "copied to page {new}, its block {block} now → page {new}",
        "taken": "pages taken: {pages}",
        "released": "pages back to the pool (no sequence holds them): {pages}",
        "col_contiguous": "vs contiguous caches",
    },
    "zh": {
        "title": "连续批处理",
        "overview": "{n} 个序列作为一个批次解码：每个序列在它的那一步带着提示词加入"
        "（预填充，{chunked}），之后每步增加一行查询，直到最后一个词，然后离开",
        "chunked": "每块 {c} 行",
        "whole": "所有行一次算完",
        "col_seq": "序列",
        "col_index": "#",
        "col_tokens": "词数",
        "col_arrive": "加入的步",
        "col_prefill": "预填充",
        "col_leaves": "离开于该步之后",
        "seq_title": "各个序列",
        "step": "第 {s} 步 · 打包后共 {r} 行查询，{k} 个键",
        "cu": "cu_seqlens_q = {q} · cu_seqlens_k = {k}",
        "joins": "加入：{names}",
        "leaves": "离开（最后一行在这一步）：{names}",
        "rows_title": "打包后的查询行",
        "col_row": "行",
        "col_token": "词",
        "col_pos": "位置",
        "mask_title": "打包行与打包键上的块对角遮盖（0：可以看，−∞：不可以）",
        "softmax_title": "对打包键的 softmax · 头 {h}",
        "output_title": "output · 头 {h}（每个打包查询行一行）",
        "check": "{name}：max |批处理 − 单独解码| = {solo} {m1} · max |批处理 − 完整注意力的"
        "对应各行| = {full} {m2}",
        "check_title": "每个序列的自检",
        "col_solo": "与单独解码之差",
        "col_full": "与完整计算之差",
        "page_overview": "各个序列",
        "page_step": "第 {s} 步：{r} 行",
        "page_checks": "每个序列的自检",
        "more_steps": "… 另有 {n} 步（加 --full 显示全部）",
        "pool": "所有序列共用一个页池：{n} 页，每页 {b} 个词，每个序列有自己的块表；"
        "没有任何序列持有的页还回页池",
        "pool_window": "滑动窗口为 {w} 个位置：窗口越过某块上的所有词后，该块被释放"
        "（块表中记为 −1），没有其他序列持有时它的页还回页池；每一步只收集仍存活的块的键",
        "pool_shared": "前缀共享：新加入的序列直接使用已经存有它提示词键和值的页，只共享整页"
        "（存满 {b} 个词的页，与 vLLM 的前缀缓存相同），从第一块起逐块共享；"
        "序列要写入别的序列也持有的页时，先复制这一页（写时复制）",
        "pool_cost": "同时占用的最多页数：{m}（{bytes} 字节）· 同样的缓存连续存放："
        "{tokens} 个词槽（{contig} 字节）",
        "tables": "块表：{tables}",
        "refs": "引用计数（页 ×序列数）：{refs}",
        "shared": "{name} 的第 {block} 块共享页 {page}：它提示词的键和值已经在那里"
        "（已缓存，不再写入）",
        "copied": "写时复制：{name} 要写入页 {page}（另一个序列也持有它）：先复制到页 {new}，"
        "它的第 {block} 块改为 → 页 {new}",
        "taken": "取出的页：{pages}",
        "released": "还回页池的页（已没有序列持有）：{pages}",
        "col_contiguous": "与连续缓存之差",
    },
}


_t = partial(lookup, LABELS)  # a label of LABELS in a language, filled in


def render_overview(run: BatchRun, options: RenderOptions) -> Group:
    """The first fixture's header, what a step does, the table of sequences."""
    lang = options.lang
    members = run.result.members
    chunk = members[0].chunk
    how = _t(lang, "chunked", c=chunk) if chunk else _t(lang, "whole")
    heads = ("col_index", "col_seq", "col_tokens", "col_arrive", "col_prefill", "col_leaves")
    columns = [(_t(lang, h), "left" if n == 1 else "right") for n, h in enumerate(heads)]
    rows = [
        [str(j), safe(m.name), str(m.tokens), str(m.arrive), str(m.prefill), str(m.leaves - 1)]
        for j, m in enumerate(members)
    ]
    parts: list[RenderableType] = [
        render_header(run.traces[0], lang),
        Rule(Text(_t(lang, "title"), style="bold cyan"), align="left", style="cyan"),
        Text(_t(lang, "overview", n=len(members), chunked=how)),
        Text(""),
        listing(Text(_t(lang, "seq_title"), style="bold"), columns, rows),
    ]
    if options.explain:
        parts += [render_explanation(explain(run, k, lang)) for k in ("packed", "cu_seqlens")]
    parts += pool_lines(run, lang, options.explain)
    return Group(*parts, Text(""))


def pool_notes(run: BatchRun, lang: Lang) -> list[str]:
    """A paged batch's pool: how it works, what it holds at most against contiguous caches."""
    paging = run.result.paging
    if paging is None:
        return []
    b, per_token = paging.block_size, run.per_token
    tokens = sum(m.tokens for m in run.result.members)
    notes = [_t(lang, "pool", n=paging.pages, b=b)]
    window = pool_window(run)
    if window is not None:
        notes.append(_t(lang, "pool_window", w=window))
    if run.result.share:
        notes.append(_t(lang, "pool_shared", b=b))
    held, contig = f"{run.result.peak * b * per_token:,}", f"{tokens * per_token:,}"
    cost = _t(lang, "pool_cost", m=run.result.peak, bytes=held, tokens=tokens, contig=contig)
    return [*notes, cost]


def pool_lines(run: BatchRun, lang: Lang, explained: bool = False) -> list[RenderableType]:
    """:func:`pool_notes` as lines under a blank one, and their explanations when asked."""
    notes = pool_notes(run, lang)
    if not notes:
        return []
    lines: list[RenderableType] = [Text(""), *(Text(note) for note in notes)]
    if explained and run.result.share:
        lines += [render_explanation(explain(run, k, lang)) for k in ("prefix", "cow")]
    return lines


def pool_window(run: BatchRun) -> int | None:
    """The sliding window whose passed blocks a paged batch releases (None: no window)."""
    return next((w for m in run.result.members if (w := m.chain.cache_slots()) is not None), None)


def page_lines(run: BatchRun, k: int, lang: Lang) -> list[str]:
    """A paged step in words: the block tables, reference counts, shares, copies, pages."""
    pages = run.result.steps[k].pages
    if pages is None:
        return []
    names = run.names
    tables = "; ".join(f"{safe(names[j])} → {list(t)}" for j, t in pages.tables)
    refs = ", ".join(f"{p} ×{n}" for p, n in pages.refcounts) or "—"
    lines = [_t(lang, "tables", tables=tables), _t(lang, "refs", refs=refs)]
    lines += [_t(lang, "shared", name=safe(names[j]), block=b, page=p) for j, b, p in pages.shared]
    lines += [
        _t(lang, "copied", name=safe(names[j]), block=b, page=p, new=q)
        for j, b, p, q in pages.copied
    ]
    if pages.allocated:
        lines.append(_t(lang, "taken", pages=", ".join(map(str, pages.allocated))))
    if pages.freed:
        lines.append(_t(lang, "released", pages=", ".join(map(str, pages.freed))))
    return lines


def render_step(run: BatchRun, k: int, options: RenderOptions) -> Group:
    """One step: the packed rows, cu_seqlens, joins and leaves, the mask, weights, outputs."""
    lang = options.lang
    step = run.result.steps[k]
    names = run.names
    title = _t(lang, "step", s=step.step, r=len(step.rows), k=len(step.keys))
    parts: list[RenderableType] = [
        Rule(Text(title, style="bold cyan"), align="left", style="cyan"),
        Text(_t(lang, "cu", q=list(step.cu_seqlens_q), k=list(step.cu_seqlens_k))),
    ]
    for key, who in (("joins", step.entering), ("leaves", step.leaving)):
        if who:
            parts.append(Text(_t(lang, key, names=", ".join(safe(names[j]) for j in who))))
    parts += [Text(line) for line in page_lines(run, k, lang)]
    heads = ("col_row", "col_index", "col_seq", "col_token", "col_pos")
    columns = [(_t(lang, h), "left" if n in (2, 3) else "right") for n, h in enumerate(heads)]
    members = run.result.members
    rows = [
        [
            str(r),
            str(j),
            safe(names[j]),
            safe(run.traces[j].query_labels[t]),
            str(int(members[j].positions[t])),
        ]
        for r, (j, t) in enumerate(step.rows)
    ]
    parts.append(listing(Text(_t(lang, "rows_title"), style="bold"), columns, rows))
    row_labels = [safe(run.label(j, t)) for j, t in step.rows]
    key_labels = [safe(run.label(j, t)) for j, t in step.keys]
    shown = np.where(step.mask, 0.0, -np.inf)  # (R, N)
    parts += titled_matrix(_t(lang, "mask_title"), shown, row_labels, key_labels, "", options)
    if options.explain:
        parts.append(render_explanation(explain(run, "mask", lang)))
    for h in range(step.softmax.shape[0]):
        parts += titled_matrix(
            _t(lang, "softmax_title", h=h), step.softmax[h], row_labels, key_labels, "", options
        )
    d_v = [str(i) for i in range(step.output.shape[-1])]
    for h in range(step.output.shape[0]):
        parts += titled_matrix(
            _t(lang, "output_title", h=h), step.output[h], row_labels, d_v, "", options
        )
    for j in step.present:
        parts.append(_check_line(run, j, [t for i, t in step.rows if i == j], lang))
    if options.explain:
        parts.append(render_explanation(explain(run, "check", lang)))
    return Group(*parts, Text(""))


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def _check_line(run: BatchRun, j: int, tokens: list[int], lang: Lang) -> Text:
    solo = max(run.solo[j][t] for t in tokens)
    full = max(run.full[j][t] for t in tokens)
    ok = max(solo, full) <= run.tolerance
    text = _t(
        lang,
        "check",
        name=safe(run.names[j]),
        solo=f"{solo:.3e}",
        full=f"{full:.3e}",
        m1=_mark(solo <= run.tolerance),
        m2=_mark(full <= run.tolerance),
    )
    return Text(text, style="green" if ok else "bold red")


def render_checks(run: BatchRun, options: RenderOptions) -> Group:
    """Every sequence's largest differences from its own decode and the full rows."""
    lang = options.lang
    heads = ["col_seq", "col_tokens", "col_solo", "col_full"]
    if run.contiguous is not None:
        heads.append("col_contiguous")
    columns = [(_t(lang, h), "left" if n == 0 else "right") for n, h in enumerate(heads)]
    rows: list[list[Text | str]] = []
    for j, name in enumerate(run.names):
        cells: list[Text | str] = [safe(name), str(len(run.solo[j]))]
        near = () if run.contiguous is None else (run.contiguous[j],)
        for diffs in (run.solo[j], run.full[j], *near):
            worst = max(diffs)
            ok = worst <= run.tolerance
            cells.append(Text(f"{worst:.3e} {_mark(ok)}", style="green" if ok else "bold red"))
        rows.append(cells)
    table = listing(Text(_t(lang, "check_title"), style="bold"), columns, rows, no_wrap=True)
    return Group(Rule(style="cyan"), table)


_EXPLAIN: dict[str, dict[Lang, tuple[str, str]]] = {  # key -> lang -> (formula, meaning)
    "packed": {
        "en": (
            "Q_packed = [rows of sequence 0; rows of sequence 1; ...]",
            "A serving engine does not wait for every request to finish before taking new "
            "ones (continuous batching, as vLLM, SGLang and TensorRT-LLM do): at each step it "
            "packs the query rows of every sequence present, a whole prompt for one that "
            "joins (its prefill) and one row for each that is generating, with no padding. "
            "One product then computes the scores of every packed row against every packed "
            "key.",
        ),
        "zh": (
            "Q_packed = [序列 0 的各行; 序列 1 的各行; ...]",
            "推理服务引擎不会等所有请求都结束才接收新的请求（连续批处理，vLLM、SGLang、"
            "TensorRT-LLM 都这样做）：每一步把当前所有序列的查询行打包在一起，刚加入的序列"
            "带上整段提示词（预填充），正在生成的序列各一行，不做填充。然后一次矩阵乘法"
            "算出每个打包行对每个打包键的分数。",
        ),
    },
    "cu_seqlens": {
        "en": (
            "cu_seqlens = [0, n_0, n_0 + n_1, ...]",
            "The cumulative lengths say where each sequence's rows (cu_seqlens_q) and keys "
            "(cu_seqlens_k) start in the pack: rows cu_seqlens_q[i] to cu_seqlens_q[i + 1] "
            "belong to sequence i, as FlashAttention's varlen functions take them.",
        ),
        "zh": (
            "cu_seqlens = [0, n_0, n_0 + n_1, ...]",
            "累计长度给出每个序列的查询行（cu_seqlens_q）和键（cu_seqlens_k）在打包中从哪里"
            "开始：第 cu_seqlens_q[i] 到 cu_seqlens_q[i + 1] 行属于序列 i，"
            "与 FlashAttention 的变长函数的参数相同。",
        ),
    },
    "mask": {
        "en": (
            "mask[r, c] = 0 if row r and key c are of the same sequence and c may be seen, else −∞",
            "Each sequence's causal mask (and its window) sits on the diagonal; everything "
            "between two sequences is −∞, so no row ever attends to another request's keys. "
            "A single causal mask over the packed rows would leak: a row would see the keys "
            "of every sequence packed before it.",
        ),
        "zh": (
            "mask[r, c] = 0，若第 r 行与键 c 属于同一序列且该键可以看；否则为 −∞",
            "每个序列自己的因果遮盖（以及窗口）位于对角线上；两个序列之间全是 −∞，"
            "所以任何一行都不会看到另一个请求的键。如果对打包后的所有行只用一个因果遮盖，"
            "就会泄漏：一行会看到排在它前面的所有序列的键。",
        ),
    },
    "check": {
        "en": (
            "max |batch row − the same token decoded alone| ≤ 1e-12",
            "Batching changes which rows share a product, not the numbers: every row of "
            "every sequence must equal its own decode (attn decode of that fixture alone) "
            "and the full attention's row.",
        ),
        "zh": (
            "max |批处理中的一行 − 同一个词单独解码的结果| ≤ 1e-12",
            "批处理只改变哪些行一起做矩阵乘法，不改变数值：每个序列的每一行都必须等于它的"
            "单独解码（只对该配置文件做 attn decode）以及完整注意力的对应行。",
        ),
    },
    "prefix": {
        "en": (
            "block_table[b] = a page that already holds the prompt's block b (refcount + 1)",
            "Requests often start with the same prompt (a system prompt, a shared document). "
            "Their keys and values are the same numbers, so a serving engine keeps them once: "
            "a joining sequence's block table points at the pages that already hold its "
            "prompt, and each page counts the sequences holding it. Only whole pages are "
            "shared, as vLLM's prefix caching does: a page is matched when it is full and "
            "its rows equal the prompt's, block by block from the first.",
        ),
        "zh": (
            "块表[b] = 已经存有提示词第 b 块的页（引用计数 + 1）",
            "很多请求以同样的提示词开头（系统提示词、共同的文档）。它们的键和值是同样的数，"
            "所以推理服务引擎只存一份：新加入序列的块表直接指向已经存有它提示词的页，"
            "每一页记录有多少个序列持有它。只共享整页，与 vLLM 的前缀缓存相同："
            "页必须已存满，并且各行与提示词的相同，从第一块起逐块匹配。",
        ),
    },
    "cow": {
        "en": (
            "if refcount[page] > 1: copy the page, point the block at the copy, then write",
            "A shared page is read by several sequences; writing a sequence's own next token "
            "into it would change what the others read. So the writer first copies the page "
            "to a free one (copy on write), moves its block table entry there and lowers the "
            "old page's count; the others keep the original.",
        ),
        "zh": (
            "若 引用计数[页] > 1：先复制这一页，让块指向副本，再写入",
            "共享的页被几个序列同时读取；把某个序列自己的下一个词写进去，会改变其他序列读到"
            "的数。所以写入者先把这一页复制到一个空闲页（写时复制），把块表中的这一项改为"
            "指向副本，并把原页的计数减一；其他序列继续使用原页。",
        ),
    },
}


def explain(run: BatchRun, key: str, lang: Lang) -> Explanation:
    """The explanation of one quantity of the batch."""
    from attn_cli.present.explain_registry import Explanation  # --explain only

    formula, meaning = _EXPLAIN[key][lang]
    inputs = {
        "packed": ("Q",),
        "cu_seqlens": ("n_i",),
        "mask": ("cu_seqlens_q", "cu_seqlens_k"),
        "check": ("output",),
        "prefix": ("block_table", "refcount"),
        "cow": ("refcount", "block_table"),
    }[key]
    out = label(lang, "scalar") if key == "check" else key
    return Explanation(key, lang, (formula,), inputs, out, (meaning,))


def _page_title(run: BatchRun, k: int, lang: Lang) -> str:
    """A step's page title: its number and how many rows it computes."""
    s = run.result.steps[k]
    return _t(lang, "page_step", s=s.step, r=len(s.rows))


SECTIONS = Sections(render_overview, render_step, render_checks, LABELS, _page_title)
render_batch = SECTIONS.whole  # the sequences, every step (the middle ones elided), the checks
batch_pages = SECTIONS.pages  # step mode's pages: the sequences, every step, the checks
batch_titles = SECTIONS.titles  # step mode's page titles, as batch_pages
