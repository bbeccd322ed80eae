"""``attn decode`` as Rich renderables: the prefill, one section per generated token, the
self-check and the KV-cache cost, with explanations in English or Chinese.

Formatting only: every number comes from the :class:`DecodeRun` (core/decode.py's steps and
the checks of check/runs.py). ``decode_pages`` yields one renderable per page for
step mode: the overview, each step, the summary; ``decode_titles`` names them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.text import Text

from attn_cli.core.chain import Chain
from attn_cli.core.inputs import Inputs
from attn_cli.core.stages import SPECS
from attn_cli.present.decode_explain import explain
from attn_cli.present.i18n import Lang
from attn_cli.present.options import RenderOptions
from attn_cli.present.render import listing, render_explanation
from attn_cli.present.run_view import (
    Sections,
    check_style,
    decode_opening,
    lookup,
    mark,
    shown_diff,
    step_check,
    step_checks,
    titled_matrix,
)
from attn_cli.present.text import pick_rows, safe
from attn_cli.present.variants import active, ring_slots

if TYPE_CHECKING:
    from attn_cli.check.runs import DecodeRun
    from attn_cli.core.decode import DecodeStep

LABELS: dict[Lang, dict[str, str]] = {
    "en": {
        "title": "KV-cache decoding",
        "overview": "prefill: the first {p} token(s) at once ({tokens}); then one step per "
        "token, each against the cache of keys and values",
        "steps": "{n} decoding steps",
        "step": "step {k} of {n} · token {token} at position {pos} → cache slot {slot}",
        "cache": "cache: {c} slots · slot: token@position",
        "empty": "—",
        "none": "—: an empty slot, no key there yet: masked −∞, no weight, nothing computed",
        "ring": "ring buffer of {w} slots: slot = position mod {w}; the token {w} positions "
        "back is overwritten",
        "grow": "the cache grows by one slot per token",
        "unused": "{n} of the {w} slots stay empty in this run ({t} tokens) and are not shown",
        "Q": "Q: the new token's query (one row per head)",
        "Q_rot": "Q_rot: the query rotated at position {pos}",
        "Q_read": "{stage}: the query at position {pos}, as the scores read it (the trace's "
        "{stage} row)",
        "K_cache": "K_cache · kv head {g}",
        "V_cache": "V_cache · kv head {g}",
        "attn": "attention · head {h} (reads kv head {g})",
        "output": "output: one row per head",
        "out_stage": "{formula}: one row per head",
        "Q_latent": "Q: the new token's query as the latent cache reads it, [q_nope·W_UKᵀ | "
        "q_rope_rot] (one row per head)",
        "K_latent": "cache {parts} · one for every head",
        "V_latent": "V_cache: the cache's first {r} columns, the latent itself (not stored again)",
        "attn_latent": "attention · head {h} (reads the latent cache)",
        "output_latent": "softmax · V_cache: the latent averaged, one row per head",
        "output_finish": "output = that · W_UV of each head: one row per head",
        "this_latent": "this model (MLA latent)",
        "latent_formula": "bytes per token per layer = {parts}: {n} numbers × 8 = {b}, for "
        "every head together",
        "row": "stage",
        "slot": "slot",
        "head_row": "head {h}",
        "check": "self-check: max |{stage} − the full attention's row {token}| = {diff} {mark} "
        "(≤ {tol})",
        "check_prefill": "self-check of the prefill: max |{stage} − the full attention's rows| = "
        "{diff} "
        "{mark}",
        "check_title": "self-check: each step against the full attention's row",
        "col_step": "step",
        "col_token": "token",
        "col_pos": "position",
        "col_slots": "cache slots",
        "col_diff": "max abs diff",
        "cost_title": "KV-cache cost per layer (K and V, from this fixture's shapes)",
        "col_layout": "layout",
        "col_kv": "kv_heads",
        "col_per_token": "bytes per token (float64)",
        "col_bf16": "at bf16",
        "col_total": "for {t} tokens",
        "this": "this model ({kind})",
        "mha": "MHA (kv_heads = heads)",
        "mqa": "MQA (kv_heads = 1)",
        "cost_formula": "bytes per token per layer = kv_heads × (d_k + d_v) × itemsize = "
        "{kv} × ({dk} + {dv}) × 8 = {n}",
        "batch": "batch {b} · ",
        "more_steps": "… {n} more steps (--full shows all)",
        "batch_note": "(per batch item; {b} items)",
        "page_overview": "overview and KV-cache cost",
        "page_step": "{token}@{pos} → slot {slot}",
        "page_checks": "self-check of every step",
        "paged": "paged cache: pages of {b} tokens from a pool of {n}; token i goes to logical "
        "block i // {b}, slot i mod {b} of that block's page; each step gathers the live "
        "blocks' pages in logical order",
        "paged_window": "a page goes back to the pool once the window ({w} positions) has "
        "passed every token on it; a token still on a live page but outside the window is "
        "hidden (−∞)",
        "block_table": "block table (logical block → page): {table}",
        "freed": "freed",
        "placed": "token {token} → logical block {block} = {index} // {b} → page {page}, slot "
        "{slot} = {index} mod {b}",
        "taken": "page {pages} taken from the pool (lowest free)",
        "released": "page {pages} back to the pool (the window has passed it)",
        "gather": "gather: pages {pages} in block order → {c} cache slots ({filled} hold a "
        "token, {empty} empty: the last page's, read as zeros and hidden)",
        "prefill_table": "after the prefill: block table {table}",
        "pool_title": "paged pool per layer (float64)",
        "col_slots_pool": "token slots",
        "col_bytes": "bytes",
        "pool_row": "pool: {n} pages × {b} tokens",
        "used_row": "pages held at most: {m}",
        "contiguous_row": "contiguous cache",
        "ring_row": "contiguous ring of {w}",
        "waste_row": "waste: the last page's empty slots",
        "pool_formula": "bytes per token slot = {per_token}; the pool holds pages × block size "
        "slots, a contiguous cache one slot per token it keeps",
        "col_contiguous": "vs contiguous",
        "check_paged": "same step against a contiguous cache: max |Δ| = {diff} {mark}",
    },
    "zh": {
        "title": "KV 缓存解码",
        "overview": "预填充：前 {p} 个词一次算完（{tokens}）；之后每个词一步，"
        "每一步都只和缓存中的键、值计算",
        "steps": "共 {n} 个解码步",
        "step": "第 {k} 步，共 {n} 步 · 词 {token}，位置 {pos} → 缓存槽 {slot}",
        "cache": "缓存：{c} 个槽 · 槽：词@位置",
        "empty": "—",
        "none": "—：空槽，里面还没有键：masked 为 −∞，权重为 0，不做计算",
        "ring": "{w} 个槽的环形缓冲区：槽 = 位置 mod {w}；覆盖 {w} 个位置之前的那个词",
        "grow": "每来一个词，缓存增加一个槽",
        "unused": "{w} 个槽中有 {n} 个在本次运行（{t} 个词）中始终为空，不显示",
        "Q": "Q：新词的查询（每个头一行）",
        "Q_rot": "Q_rot：在位置 {pos} 旋转后的查询",
        "Q_read": "{stage}：位置 {pos} 的查询，即分数所用的查询（trace 中 {stage} 的那一行）",
        "K_cache": "K_cache · 键值头 {g}",
        "V_cache": "V_cache · 键值头 {g}",
        "attn": "注意力 · 头 {h}（读取键值头 {g}）",
        "output": "output：每个头一行",
        "row": "阶段",
        "slot": "槽",
        "out_stage": "{formula}：每个头一行",
        "Q_latent": "Q：新词的查询，按潜向量缓存读取的形式 [q_nope·W_UKᵀ | q_rope_rot]"
        "（每个头一行）",
        "K_latent": "缓存 {parts} · 所有头共用一份",
        "V_latent": "V_cache：缓存的前 {r} 列，即潜向量本身（不另存）",
        "attn_latent": "注意力 · 头 {h}（读取潜向量缓存）",
        "output_latent": "softmax · V_cache：潜向量的加权平均，每个头一行",
        "output_finish": "output = 上一行 · 各头的 W_UV：每个头一行",
        "this_latent": "本模型（MLA 潜向量）",
        "latent_formula": "每层每个词的字节数 = {parts}：{n} 个数 × 8 = {b}，所有头合计",
        "head_row": "头 {h}",
        "check": "自检：max |{stage} − 完整注意力中 {token} 那一行| = {diff} {mark}（≤ {tol}）",
        "check_prefill": "预填充自检：max |{stage} − 完整注意力的对应各行| = {diff} {mark}",
        "check_title": "自检：每一步与完整计算对比",
        "col_step": "步",
        "col_token": "词",
        "col_pos": "位置",
        "col_slots": "缓存槽数",
        "col_diff": "最大绝对误差",
        "cost_title": "每层 KV 缓存开销（K 和 V，按本配置文件的形状计算）",
        "col_layout": "结构",
        "col_kv": "kv_heads",
        "col_per_token": "每词字节数（float64）",
        "col_bf16": "bf16 时",
        "col_total": "{t} 个词合计",
        "this": "本模型（{kind}）",
        "mha": "MHA（kv_heads = heads）",
        "mqa": "MQA（kv_heads = 1）",
        "cost_formula": "每层每个词的字节数 = kv_heads × (d_k + d_v) × 每个数的字节数 = "
        "{kv} × ({dk} + {dv}) × 8 = {n}",
        "batch": "批 {b} · ",
        "more_steps": "… 另有 {n} 步（加 --full 显示全部）",
        "batch_note": "（每个批元素；共 {b} 个）",
        "page_overview": "概览与 KV 缓存开销",
        "page_step": "{token}@{pos} → 槽 {slot}",
        "page_checks": "每一步的自检",
        "paged": "分页缓存：页池共 {n} 页，每页 {b} 个词；第 i 个词进入逻辑块 i // {b}，"
        "放在该块所在页的第 i mod {b} 个槽；每一步按逻辑块顺序把仍在使用的页收集起来",
        "paged_window": "当窗口（{w} 个位置）越过某页上的所有词后，该页还回页池；"
        "仍在使用的页上、但已在窗口之外的词被遮盖（−∞）",
        "block_table": "块表（逻辑块 → 物理页）：{table}",
        "freed": "已释放",
        "placed": "词 {token} → 逻辑块 {block} = {index} // {b} → 页 {page}，槽 {slot} = "
        "{index} mod {b}",
        "taken": "从页池取出页 {pages}（编号最小的空闲页）",
        "released": "页 {pages} 还回页池（窗口已越过它）",
        "gather": "收集：按块顺序读取页 {pages} → {c} 个缓存槽（{filled} 个存有词，{empty} "
        "个为空：最后一页的空槽，读作零并被遮盖）",
        "prefill_table": "预填充之后：块表 {table}",
        "pool_title": "每层分页页池（float64）",
        "col_slots_pool": "词槽数",
        "col_bytes": "字节数",
        "pool_row": "页池：{n} 页 × 每页 {b} 个词",
        "used_row": "同时占用的最多页数：{m}",
        "contiguous_row": "连续缓存",
        "ring_row": "{w} 个槽的连续环形缓存",
        "waste_row": "浪费：最后一页的空槽",
        "pool_formula": "每个词槽的字节数 = {per_token}；页池有 页数 × 每页词数 个槽，"
        "连续缓存为保留的每个词各一个槽",
        "col_contiguous": "与连续缓存之差",
        "check_paged": "同一步与连续缓存对比：max |Δ| = {diff} {mark}",
    },
}


_t = partial(lookup, LABELS)  # a label of LABELS in a language, filled in


def render_overview(run: DecodeRun, options: RenderOptions) -> Group:
    """The configuration, what the prefill covered, the notes and the cache's cost."""
    lang = options.lang
    parts = [*decode_opening(run, LABELS, lang), render_cost(run, lang)]
    if options.explain:
        parts.append(render_explanation(explain(run, "cost", lang)))
    if run.paged is not None:
        parts.append(render_pool(run, lang))
        if options.explain:
            parts.append(render_explanation(explain(run, "pool", lang)))
    return Group(*parts)


def render_pool(run: DecodeRun, lang: Lang) -> Group:
    """The paged pool's bytes beside a contiguous cache's, and the prefill's block table."""
    assert run.paged is not None and run.result.prefill_pages is not None
    c = run.paged.pool
    heads = ("col_layout", "col_slots_pool", "col_bytes")
    columns = [(_t(lang, h), "left" if n == 0 else "right") for n, h in enumerate(heads)]
    cells = [[name, f"{n:,}", f"{b:,}"] for name, n, b in pool_rows(run, lang)]
    table = listing(Text(_t(lang, "pool_title"), style="bold"), columns, cells)
    formula = Text(_t(lang, "pool_formula", per_token=f"{c.per_token:,}"), style="italic")
    table_line = _t(lang, "prefill_table", table=block_table(run.result.prefill_pages.table, lang))
    return Group(table, formula, Text(table_line), Text(""))


def pool_rows(run: DecodeRun, lang: Lang) -> list[tuple[str, int, int]]:
    """(what, token slots, bytes): the pool, the pages held at most, a contiguous cache, the
    last page's empty slots."""
    assert run.paged is not None
    c = run.paged.pool
    ring = ring_slots(run.trace.inputs)
    contiguous = _t(lang, "contiguous_row") if ring is None else _t(lang, "ring_row", w=ring)
    return [
        (_t(lang, "pool_row", n=c.pages, b=c.block_size), c.pages * c.block_size, c.pool),
        (_t(lang, "used_row", m=c.pages_used), c.pages_used * c.block_size, c.used),
        (contiguous, c.contiguous // c.per_token, c.contiguous),
        (_t(lang, "waste_row"), c.waste_slots, c.waste),
    ]


def block_table(table: tuple[int, ...], lang: Lang) -> str:
    """``0 → 2, 1 → freed, ...``: each logical block and its page."""
    return ", ".join(f"{b} → {_t(lang, 'freed') if p < 0 else p}" for b, p in enumerate(table))


def paged_lines(run: DecodeRun, step: DecodeStep, lang: Lang) -> list[str]:
    """A paged step in words: how the pool works, where the token went, the block table, the
    pages taken and released, the gather."""
    pages, paging = step.pages, run.result.paging
    assert pages is not None and paging is not None
    b = paging.block_size
    ring = ring_slots(run.trace.inputs)
    how = _t(lang, "paged", b=b, n=paging.pages)
    if ring is not None:
        how += ("；" if lang == "zh" else "; ") + _t(lang, "paged_window", w=ring)
    lines = [how]
    for index, page, slot in pages.placed:
        token = repr(safe(run.label(index)))
        lines.append(
            _t(
                lang,
                "placed",
                token=token,
                block=index // b,
                index=index,
                b=b,
                page=page,
                slot=slot,
            )
        )
    if pages.allocated:
        lines.append(_t(lang, "taken", pages=", ".join(map(str, pages.allocated))))
    if pages.freed:
        lines.append(_t(lang, "released", pages=", ".join(map(str, pages.freed))))
    lines.append(_t(lang, "block_table", table=block_table(pages.table, lang)))
    live = [str(p) for p in pages.table if p >= 0]
    empty = sum(1 for at in step.cache_positions if at < 0)
    lines.append(
        _t(
            lang,
            "gather",
            pages=", ".join(live),
            c=step.slots,
            filled=step.slots - empty,
            empty=empty,
        )
    )
    return lines


def render_cost(run: DecodeRun, lang: Lang) -> Group:
    """Bytes of K and V per token per layer: this model, MHA, MQA, and for the sequence."""
    c = run.cost
    inp = run.trace.inputs
    kind = "MHA" if c.kv_heads == c.heads else "MQA" if c.kv_heads == 1 else "GQA"
    # headers wrap at 80 columns (a long one was cut to "kv_hea…"); numbers are one word each
    columns = [(_t(lang, "col_layout"), "left")]
    columns += [(_t(lang, head), "right") for head in ("col_kv", "col_per_token", "col_bf16")]
    columns.append((_t(lang, "col_total", t=c.seq), "right"))
    this = _t(lang, "this", kind=kind) if c.latent is None else _t(lang, "this_latent")
    rows = (
        (this, 1 if c.latent is not None else c.kv_heads, c.per_token, c.total),
        (_t(lang, "mha"), c.heads, c.per_token_mha, c.total_mha),
        (_t(lang, "mqa"), 1, c.per_token_mqa, c.total_mqa),
    )
    cells = [
        [name, str(kv), f"{per_token:,}", f"{per_token // 4:,}", f"{total:,}"]
        for name, kv, per_token, total in rows
    ]
    table = listing(Text(_t(lang, "cost_title"), style="bold"), columns, cells)
    parts: list[RenderableType] = [table]
    formula = _t(lang, "cost_formula", kv=c.kv_heads, dk=inp.d_k, dv=inp.d_v, n=c.per_token)
    if c.latent is not None:
        formula = _t(lang, "latent_formula", parts=run.cache_parts, n=c.latent, b=c.per_token)
    parts.append(Text(formula, style="italic"))
    for t in active(inp):
        parts += [Text(n) for n in t.cost_notes(t.setting(inp), c.per_token, c.seq, lang)]
    if inp.has_batch:
        parts.append(Text(_t(lang, "batch_note", b=inp.batch), style="dim"))
    return Group(*parts, Text(""))


def shown_slots(run: DecodeRun, step: DecodeStep) -> list[int]:
    """The cache slots of ``step`` that a view shows: those some token fills in this run.

    A ring buffer with more slots than the sequence has tokens (4096 for a 6-token fixture)
    fills only as many slots as there are tokens; the rest stay empty to the end. The last
    step's cache holds every slot ever filled (a ring never empties one; a cache that is no
    ring only grows).
    """
    if step.pages is not None:  # a paged cache: this step's pages, empty slots too
        return list(range(step.slots))
    last = run.result.steps[-1].cache_positions
    return [s for s in range(step.slots) if last[s] >= 0]


def _slot_labels(run: DecodeRun, step: DecodeStep, lang: Lang, shown: list[int]) -> list[str]:
    """``slot: token@position`` for each shown cache slot, ``(empty)`` for one unused yet."""
    tokens = step.cache.held.tolist()  # the token index each slot holds
    where, paging = step.cache.where, run.result.paging
    out = []
    for s in shown:
        pos = step.cache_positions[s]
        held = _t(lang, "empty") if pos < 0 else f"{run.label(tokens[s])}@{pos}"
        if where is not None and paging is not None:  # the page and slot the gather read
            page, at = divmod(int(where[s]), paging.block_size)
            out.append(f"{s} (p{page}.{at}): {held}")
        else:
            out.append(f"{s}: {held}")
    return out


def _held_line(slots: list[str], full: bool) -> str:
    """The slot labels joined, elided as the cache tables' rows are (first and last rows, an
    ellipsis between) unless ``full``: a 4,096-token cache is not a 4,096-entry line."""
    picked = pick_rows(len(slots), full)
    return ", ".join("…" if i is None else safe(slots[i]) for i in picked)


def render_step(run: DecodeRun, k: int, options: RenderOptions) -> Group:
    """One generated token: its query, the cache now, scores to output, the self-check."""
    lang = options.lang
    step = run.result.steps[k]
    inp = run.trace.inputs
    token = repr(safe(run.label(step.index)))
    shown = shown_slots(run, step)
    slots = _slot_labels(run, step, lang, shown)
    title = _t(
        lang,
        "step",
        k=k + 1,
        n=len(run.result.steps),
        token=token,
        pos=step.position,
        slot=step.slot,
    )
    ring = ring_slots(inp)
    how = _t(lang, "ring", w=ring) if ring is not None else _t(lang, "grow")
    parts: list[RenderableType] = [
        Rule(Text(title, style="bold cyan"), align="left", style="cyan"),
        Text(_t(lang, "cache", c=step.slots)),
        Text("  " + _held_line(slots, options.full)),  # a line of its own: it wraps less
    ]
    if step.pages is None:
        parts.append(Text(how, style="dim"))
    else:
        lines = paged_lines(run, step, lang)
        parts += [Text(lines[0], style="dim"), *(Text(line) for line in lines[1:])]
        if options.explain:
            parts += [
                render_explanation(explain(run, key, lang, step))
                for key in ("block_table", "gather")
            ]
    if any(step.cache_positions[s] < 0 for s in shown):
        parts.append(Text(_t(lang, "none"), style="dim"))
    if len(shown) < step.slots:
        unused = _t(lang, "unused", n=step.slots - len(shown), w=step.slots, t=inp.seq_k)
        parts.append(Text(unused, style="dim"))
    for b in range(inp.batch):
        parts += _step_tables(run, step, b, (shown, slots), options)
    parts.append(_check_line(run, k, lang))
    if options.explain:
        parts.append(render_explanation(explain(run, "check", lang, step)))
    return Group(*parts, Text(""))


def _query_read(inp: Inputs, position: int, lang: Lang) -> tuple[str, bool]:
    """The title of a step's query as the scores read it, and whether that is Q_rot: RoPE's
    rotation may be followed by a norm (post_rope_norm) or a temperature, or be absent."""
    read = Chain(inp).qk_stages("Q")[-1]  # Q_rot, or Q_postnorm, Q_tuned, ... after it
    if read == "Q_rot":
        return _t(lang, "Q_rot", pos=position), True
    return _t(lang, "Q_read", stage=read, pos=position), False


def _step_tables(
    run: DecodeRun,
    step: DecodeStep,
    b: int,
    slots: tuple[list[int], list[str]],
    options: RenderOptions,
) -> list[RenderableType]:
    """Batch item b of a step: Q (Q_rot), the caches, each head's scores to softmax, output;
    ``slots`` are the cache slots shown and their labels."""
    lang = options.lang
    shown, slot_labels = slots
    inp = run.trace.inputs
    prefix = _t(lang, "batch", b=b) if inp.has_batch else ""
    heads = [_t(lang, "head_row", h=h) for h in range(inp.heads)]
    groups = inp.heads // inp.kv_heads
    parts: list[RenderableType] = []

    empty = {n for n, s in enumerate(shown) if step.cache_positions[s] < 0}  # no key there

    def table(
        matrix: Any,
        rows: list[str],
        cols: list[str],
        axis: str,
        title: str,
        none: Callable[[int, int], bool] | None = None,
    ) -> None:
        parts.extend(titled_matrix(prefix + title, matrix, rows, cols, axis, options, none))

    def explained(*keys: str) -> None:
        if options.explain:
            parts.extend(render_explanation(explain(run, key, lang, step)) for key in keys)

    if run.cache_parts is not None:
        _latent_tables(run, step, b, slots, options, (parts, table, explained))
        return parts
    # d_k as the step's query has it (differential attention's first map: d_k/2)
    d_k, d_v = [str(i) for i in range(step.Q.shape[-1])], [str(i) for i in range(inp.d_v)]
    table(step.Q[b, :, 0], heads, d_k, "", _t(lang, "Q"))  # (H, D)
    explained("Q")
    if step.Q_rot is not None:  # the query as the scores read it: rotated, then what follows
        label, rotated = _query_read(inp, step.position, lang)
        table(step.Q_rot[b, :, 0], heads, d_k, "", label)
        if rotated:
            explained("Q_rot")
    for name, cols in (("K_cache", d_k), ("V_cache", d_v)):
        cache = getattr(step, name)[:, :, shown]  # (B, Hkv, shown C, D)
        for g in range(inp.kv_heads):
            table(
                cache[b, g],
                slot_labels,
                cols,
                _t(lang, "slot"),
                _t(lang, name, g=g),
                lambda i, j: i in empty,
            )
        explained(name)
    capped = ["capped"] if step.capped is not None else []
    names = ["scores", "scaled", *capped, "masked", "softmax"]
    extra = dict(step.rows)  # a second map and what the maps make (diff), as traced
    every = [getattr(step, n)[b, :, 0] for n in names] + [x[b, :, 0] for x in extra.values()]
    row_names = [*names, *extra]
    for h, rows in enumerate(_stack(every)[:, :, shown].swapaxes(0, 1)):  # (H, names, shown C)
        table(
            rows,
            row_names,
            slot_labels,
            _t(lang, "row"),
            _t(lang, "attn", h=h, g=h // groups),
            lambda i, j: j in empty and not row_names[i].startswith("masked"),
        )
    explained(*names)
    table(step.output[b, :, 0], heads, d_v, "", _t(lang, "output"))  # (H, Dv)
    explained("output")
    for name, made in step.outs.items():  # the head-output transforms (a gate), as traced
        formula = SPECS[name].formula(inp)  # the stage table's, as attn trace writes it
        cols = d_v if made.shape[-1] == inp.d_v else [str(i) for i in range(made.shape[-1])]
        table(made[b, :, 0], heads, cols, "", _t(lang, "out_stage", formula=formula))
        explained(name)
    return parts


def _latent_tables(
    run: DecodeRun,
    step: DecodeStep,
    b: int,
    slots: tuple[list[int], list[str]],
    options: RenderOptions,
    out: tuple[list[RenderableType], Callable[..., None], Callable[..., None]],
) -> None:
    """A step against a latent cache (MLA): the absorbed query, the one cache every head reads
    (its values the latent, its first columns), each head's scores to softmax, the averaged
    latent and the output W_UV makes of it."""
    lang = options.lang
    shown, slot_labels = slots
    inp = run.trace.inputs
    heads = [_t(lang, "head_row", h=h) for h in range(inp.heads)]
    parts, table, explained = out  # the step's renderables, a titled table, an explanation

    def cols(n: int) -> list[str]:
        return [str(i) for i in range(n)]

    assert step.latent is not None, "a latent cache's steps keep softmax·V_cache"
    table(step.Q[b, :, 0], heads, cols(step.Q.shape[-1]), "", _t(lang, "Q_latent"))
    explained("Q_latent")
    cache = step.K_cache[b, 0, shown]  # (shown C, r + d_rope)
    table(
        cache,
        slot_labels,
        cols(cache.shape[-1]),
        _t(lang, "slot"),
        _t(lang, "K_latent", parts=run.cache_parts),
    )
    explained("K_latent")
    parts.append(Text(_t(lang, "V_latent", r=step.V_cache.shape[-1]), style="dim"))
    capped = ["capped"] if step.capped is not None else []
    names = ["scores", "scaled", *capped, "masked", "softmax"]
    for h in range(inp.heads):
        rows = _stack([getattr(step, n)[b, h, 0, shown] for n in names])
        table(rows, names, slot_labels, _t(lang, "row"), _t(lang, "attn_latent", h=h))
    explained(*names)
    table(step.latent[b, :, 0], heads, cols(step.latent.shape[-1]), "", _t(lang, "output_latent"))
    table(step.output[b, :, 0], heads, cols(inp.d_v), "", _t(lang, "output_finish"))
    explained("output_latent")


def _stack(rows: list[Any]) -> Any:
    import numpy as np

    return np.stack(rows)  # (rows, C)


def _check_line(run: DecodeRun, k: int, lang: Lang) -> Group:
    lines = [step_check(run, k, LABELS, lang)]
    if run.paged is not None:
        near = run.paged.contiguous_diffs[k]
        same = near <= run.tolerance
        paged = _t(lang, "check_paged", diff=f"{near:.3e}", mark=mark(same))
        lines.append(Text(paged, style=check_style(same)))
    return Group(*lines)


def render_checks(run: DecodeRun, options: RenderOptions) -> Group:
    """Every step's largest difference from the full trace, and the prefill's."""
    heads = ["col_step", "col_token", "col_pos", "col_slots", "col_diff"]
    if run.paged is not None:
        heads.append("col_contiguous")

    def cells(k: int) -> list[Text | str]:
        out: list[Text | str] = [str(run.result.steps[k].slots)]
        out.append(shown_diff(run.diffs[k], run.tolerance))
        if run.paged is not None:
            out.append(shown_diff(run.paged.contiguous_diffs[k], run.tolerance))
        return out

    return step_checks(run, options, LABELS, heads, cells)


def _page_title(run: DecodeRun, k: int, lang: Lang) -> str:
    """A step's page title, ``token@position → slot`` (go-to matches the token)."""
    s = run.result.steps[k]
    return _t(lang, "page_step", token=safe(run.label(s.index)), pos=s.position, slot=s.slot)


SECTIONS = Sections(render_overview, render_step, render_checks, LABELS, _page_title)
render_decode = SECTIONS.whole  # overview and cost, every step (the middle ones elided), checks
decode_pages = SECTIONS.pages  # step mode's pages, one renderable each
decode_titles = SECTIONS.titles  # step mode's page titles, as decode_pages
