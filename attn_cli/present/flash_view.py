"""``attn flash`` as Rich renderables: the FlashAttention-2 forward tile by tile (S, the running
max m, alpha, P, the running sum l, the accumulator), then O and L and the self-check, with
explanations in English or Chinese.

Formatting only: every number comes from the :class:`FlashRun` (core/flash.py's tiles and the
checks of check/runs.py). ``flash_pages`` yields one renderable per page for step mode:
the overview, each tile shown, the result; ``flash_titles`` names them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.text import Text

from attn_cli.core.flash import LOG2E
from attn_cli.present.explain_registry import Explanation
from attn_cli.present.i18n import Lang, label
from attn_cli.present.options import RenderOptions
from attn_cli.present.render import render_explanation, render_header, simple_table
from attn_cli.present.run_view import lookup, sentinel_note, titled_matrix
from attn_cli.present.text import TABLE_EDGE, format_number, pick_tables
from attn_cli.present.variants import extra_logit, modifier, view_inputs, view_notes

if TYPE_CHECKING:
    from attn_cli.check.runs import FlashRun
    from attn_cli.check.split_runs import SplitRun
    from attn_cli.core.flash import Tile

LABELS: dict[Lang, dict[str, str]] = {
    "en": {
        "title": "FlashAttention-2 forward, tile by tile",
        "blocks": "blocks: {bq} queries × {bk} keys; {n} tiles ({skipped} skipped), visited per "
        "(batch, head, query block) over the key blocks in order",
        "cut": "showing the first {shown} of {n} tiles (--max-tiles N shows more)",
        "base2": "--base2: Triton's form: S in base 2 (× scale·log2 e = × {c}), P = exp2(S − m), "
        "α = exp2(m_old − m), L = m + log2(l) in base 2",
        "base_e": "exp and log in base e, as the FlashAttention-2 paper writes them",
        "no_skip": "no tile is skipped (not causal, or positions given)",
        "skipped_out": "nothing: m, l and acc carry over",
        "tile": "tile {k} of {n} · {where}queries {t0}..{t1} × keys {s0}..{s1}",
        "skipped": "skipped: every key of this block is after every query (above the causal "
        "diagonal); m, l and acc carry over unchanged",
        "S": "S: scaled scores of the tile (−∞ where not allowed)",
        "state": "running state per query row",
        "P": "P = exp(S − m)",
        "P2": "P = exp2(S − m)",
        "acc": "acc = α·acc + P·V",
        "query": "query",
        "result": "the result: O = acc / l and L = m + log l",
        "result2": "the result: O = acc / l and L = m + log2 l (base 2)",
        "O": "O · {where}",
        "L": "L (log-sum-exp) · {where}",
        "check_title": "self-check against plain softmax attention",
        "col_what": "quantity",
        "col_diff": "max abs diff",
        "col_ulps": "in ulps",
        "col_tol": "tolerance",
        "check_output": "O vs plain softmax rows' output",
        "check_lse": "L vs plain softmax rows' lse (base e)",
        "check_softmax": "exp(x − L) vs the trace's softmax",
        "ulps_note": "float32: the order of summation changes the last bits (ulps), not the math",
        "where": "batch {b} · head {h} · ",
        "where_h": "head {h} · ",
        "page_overview": "overview",
        "page_tile": "{where}q {t0}..{t1} × k {s0}..{s1}",
        "page_skipped": "{where}q {t0}..{t1} × k {s0}..{s1} (skipped)",
        "page_result": "O, L and the self-check",
    },
    "zh": {
        "title": "FlashAttention-2 前向计算，逐块展示",
        "blocks": "分块：每块 {bq} 个查询 × {bk} 个键；共 {n} 块（跳过 {skipped} 块），"
        "按（批，头，查询块）依次遍历各个键块",
        "cut": "只显示 {n} 块中的前 {shown} 块（加 --max-tiles N 显示更多）",
        "base2": "--base2：Triton 的写法：S 以 2 为底（× scale·log2 e = × {c}），P = exp2(S − m)，"
        "α = exp2(m_old − m)，L = m + log2(l) 以 2 为底",
        "base_e": "exp 和 log 以 e 为底，与 FlashAttention-2 论文的写法相同",
        "no_skip": "没有跳过的块（不是因果遮盖，或给出了位置）",
        "skipped_out": "无：m、l、acc 保持不变",
        "tile": "第 {k} 块，共 {n} 块 · {where}查询 {t0}..{t1} × 键 {s0}..{s1}",
        "skipped": "跳过：这一块的每个键都在每个查询之后（位于因果对角线之上）；m、l、acc 保持不变",
        "S": "S：这一块缩放后的分数（不允许看的位置为 −∞）",
        "state": "每个查询行的运行状态",
        "P": "P = exp(S − m)",
        "P2": "P = exp2(S − m)",
        "acc": "acc = α·acc + P·V",
        "query": "查询",
        "result": "结果：O = acc / l，L = m + log l",
        "result2": "结果：O = acc / l，L = m + log2 l（以 2 为底）",
        "O": "O · {where}",
        "L": "L（log-sum-exp）· {where}",
        "check_title": "与普通 softmax 注意力对比的自检",
        "col_what": "量",
        "col_diff": "最大绝对误差",
        "col_ulps": "以 ulp 计",
        "col_tol": "容差",
        "check_output": "O 对比逐行普通 softmax 的 output",
        "check_lse": "L 对比逐行普通 softmax 的 lse（以 e 为底）",
        "check_softmax": "exp(x − L) 对比 trace 的 softmax",
        "ulps_note": "float32：求和顺序只改变最后几位（ulp），不改变数学",
        "where": "批 {b} · 头 {h} · ",
        "where_h": "头 {h} · ",
        "page_overview": "概览",
        "page_tile": "{where}查询 {t0}..{t1} × 键 {s0}..{s1}",
        "page_skipped": "{where}查询 {t0}..{t1} × 键 {s0}..{s1}（跳过）",
        "page_result": "O、L 与自检",
    },
}


_t = partial(lookup, LABELS)  # a label of LABELS in a language, filled in


def render_flash(run: FlashRun, options: RenderOptions | None = None) -> Group:
    """The whole loop: overview, the tiles shown (the middle ones elided), O, L, the checks."""
    options = options or RenderOptions()
    parts: list[RenderableType] = [render_overview(run, options)]
    for k in pick_tables(len(run.tiles), options.full):
        if k is None:
            more = len(run.tiles) - 2 * TABLE_EDGE
            parts.append(Text(f"… {more} (--full)", style="dim"))
        else:
            parts.append(render_tile(run, k, options))
    parts.append(render_result(run, options))
    return Group(*parts)


def flash_pages(run: FlashRun, options: RenderOptions | None = None) -> Iterator[RenderableType]:
    """Step mode's pages, one renderable each: the overview, every tile shown, the result."""
    options = options or RenderOptions()
    yield render_overview(run, options)
    for k in range(len(run.tiles)):
        yield render_tile(run, k, options)
    yield render_result(run, options)


def flash_titles(run: FlashRun, lang: Lang) -> list[str]:
    """Step mode's page titles, as ``flash_pages``: the overview, where each tile is, the result."""
    tiles = []
    for tile in run.tiles:
        (t0, t1), (s0, s1) = tile.q_block, tile.k_block
        key = "page_skipped" if tile.skipped else "page_tile"
        tiles.append(
            _t(lang, key, where=_where(run, tile, lang), t0=t0, t1=t1 - 1, s0=s0, s1=s1 - 1)
        )
    return [_t(lang, "page_overview"), *tiles, _t(lang, "page_result")]


def render_overview(run: FlashRun, options: RenderOptions) -> Group:
    """The configuration, the block sizes, how many tiles, the base, what was cut."""
    lang = options.lang
    n, skipped = f"{run.tiles_total:,}", f"{skipped_total(run):,}"
    blocks = _t(lang, "blocks", bq=run.block_q, bk=run.block_k, n=n, skipped=skipped)
    parts: list[RenderableType] = [
        render_header(run.trace, lang),
        Rule(Text(_t(lang, "title"), style="bold cyan"), align="left", style="cyan"),
        Text(blocks),
    ]
    if run.cut:
        parts.append(Text(_t(lang, "cut", shown=len(run.tiles), n=n), style="yellow"))
    base = _t(lang, "base_e")
    if run.base2:
        base = _t(lang, "base2", c=f"{run.trace.scale * LOG2E:.6g}")
    parts.append(Text(base, style="bold" if run.base2 else "dim"))
    if run.causal_offset is None:
        parts.append(Text(_t(lang, "no_skip"), style="dim"))
    parts += sentinel_note(run.sentinel, lang)
    if options.explain:
        parts.append(render_explanation(explain(run, "loop", lang)))
    return Group(*parts, Text(""))


def skipped_total(run: FlashRun) -> int:
    """Tiles wholly above the causal diagonal, over the whole loop (not only those shown)."""
    offset = run.causal_offset
    if offset is None:
        return 0
    inp = run.trace.inputs
    T, S, bq, bk = inp.seq_q, inp.seq_k, run.block_q, run.block_k
    blocks_k = -(-S // bk)
    skipped = 0
    for t0 in range(0, T, bq):
        last = min(T, t0 + bq) - 1 + offset  # the last key the block's last query may see
        computed = min(blocks_k, last // bk + 1 if last >= 0 else 0)
        skipped += blocks_k - computed
    return skipped * inp.batch * inp.heads


def _where(run: FlashRun, tile: Tile, lang: Lang) -> str:
    if run.trace.inputs.has_batch:
        return _t(lang, "where", b=tile.batch, h=tile.head)
    return _t(lang, "where_h", h=tile.head)


def previous_m(run: FlashRun, k: int) -> Any:
    """m before tile k: the previous tile's of the same query block, else the start value
    (−∞, or the head's sink, a logit already seen)."""
    tile = run.tiles[k]
    if k > 0:
        before = run.tiles[k - 1]
        if (before.batch, before.head, before.q_block) == (tile.batch, tile.head, tile.q_block):
            return before.m
    extra = extra_logit(run.trace.inputs, tile.head)
    start = -math.inf if extra is None else extra * (LOG2E if run.base2 else 1)
    return np.full(tile.m.shape, start)


def render_tile(run: FlashRun, k: int, options: RenderOptions) -> Group:
    """One tile: S, then per query row m_old, m, α, l, then P and acc; or why it was skipped."""
    lang = options.lang
    tile = run.tiles[k]
    (t0, t1), (s0, s1) = tile.q_block, tile.k_block
    title = _t(
        lang,
        "tile",
        k=k + 1,
        n=f"{run.tiles_total:,}",
        where=_where(run, tile, lang),
        t0=t0,
        t1=t1 - 1,
        s0=s0,
        s1=s1 - 1,
    )
    parts: list[RenderableType] = [Rule(Text(title, style="bold cyan"), align="left", style="cyan")]
    queries = list(run.trace.query_labels[t0:t1])
    keys = list(run.trace.key_labels[s0:s1])
    q_axis = _t(lang, "query")

    def table(matrix: Any, cols: list[str], title: str) -> None:
        parts.extend(titled_matrix(title, matrix, queries, cols, q_axis, options))

    def explained(*keys: str) -> None:
        if options.explain:
            parts.extend(render_explanation(explain(run, key, lang)) for key in keys)

    if tile.skipped:
        parts.append(Text(_t(lang, "skipped"), style="yellow"))
        explained("skipped")
    else:
        inp = run.trace.inputs
        texts = modifier(inp)  # a score modifier's S, explained by its own note
        s_title = None if texts is None else texts.view_title("flash", texts.setting(inp), lang)
        table(tile.S, keys, s_title or _t(lang, "S"))
        note = [] if texts is None else list(texts.view_notes.get("flash", {}))
        explained(note[0] if note else "S")
    state = [previous_m(run, k), tile.m, tile.alpha, tile.l]
    names = ["m_old", "m", "α", "l"]
    shown = [(n, x) for n, x in zip(names, state, strict=True) if x is not None]
    table(np.stack([x for _, x in shown], axis=1), [n for n, _ in shown], _t(lang, "state"))
    explained("m", "alpha", "l")
    if not tile.skipped:
        table(tile.P, keys, _t(lang, "P2" if run.base2 else "P"))
        explained("P")
    acc_title = "acc" if tile.skipped else _t(lang, "acc")
    table(tile.acc, [str(i) for i in range(tile.acc.shape[1])], acc_title)
    explained("acc")
    return Group(*parts)


def render_result(run: FlashRun, options: RenderOptions) -> Group:
    """O and L per (batch, head), and the self-check against the trace."""
    lang = options.lang
    inp = run.trace.inputs
    title = _t(lang, "result2" if run.base2 else "result")
    parts: list[RenderableType] = [Rule(Text(title, style="bold cyan"), align="left", style="cyan")]
    labels = list(run.trace.query_labels)
    for b in range(inp.batch):
        for h in range(inp.heads):
            where = _t(lang, "where", b=b, h=h) if inp.has_batch else _t(lang, "where_h", h=h)
            out = np.concatenate([run.output[b, h], run.lse[b, h][:, None]], axis=1)  # (T, Dv+1)
            cols = [*(f"O {i}" for i in range(inp.d_v)), "L"]
            title = where.removesuffix(" · ")
            parts += titled_matrix(title, out, labels, cols, _t(lang, "query"), options)
    if options.explain:
        parts += [render_explanation(explain(run, key, lang)) for key in ("O", "L")]
    parts.append(render_checks(run, lang))
    if options.explain:
        parts.append(render_explanation(explain(run, "check", lang)))
    return Group(*parts)


def render_checks(
    run: FlashRun | SplitRun, lang: Lang, labels: dict[Lang, dict[str, str]] | None = None
) -> Group:
    """The largest differences from the trace: O, L, the rebuilt weights; ulps in float32.
    ``labels`` (split-KV's) name the checks before flash's own and i18n's."""
    labels = LABELS if labels is None else {n: LABELS[n] | labels[n] for n in LABELS}
    table = simple_table(Text(_t(lang, "check_title"), style="bold"))
    f32 = any(c.ulps is not None for c in run.checks)
    heads = ["col_what", "col_diff", *(["col_ulps"] if f32 else []), "col_tol"]
    for n, head in enumerate(heads):
        table.add_column(_t(lang, head), justify="left" if n == 0 else "right", no_wrap=True)
    for c in run.checks:
        mark = Text(
            f"{c.max_abs:.3e} {'✓' if c.ok else '✗'}", style="green" if c.ok else "bold red"
        )
        ulps = [format_number(c.ulps, 0) if c.ulps is not None else ""] if f32 else []
        key = f"check_{c.name}"  # a variant's own checks (a second map's) in i18n's labels
        what = lookup(labels, lang, key) if key in labels[lang] else label(lang, key)
        table.add_row(what, mark, *ulps, f"{c.tolerance:.3g}")
    parts: list[RenderableType] = [table]
    if f32:
        parts.append(Text(_t(lang, "ulps_note"), style="dim"))
    return Group(*parts, Text(""))


# ---------------------------------------------------------------------------------------------
# Explanations of every quantity (en and zh)

_EXPLAIN: dict[str, dict[Lang, tuple[str, str]]] = {  # key -> lang -> (formula, meaning)
    "loop": {
        "en": (
            "for each (batch, head, query block): for each key block: update m, l, acc",
            "FlashAttention never holds the (queries × keys) matrix. It walks the keys a "
            "block at a time, keeping per query row only a running max m, a running sum l "
            "and an unnormalised output acc, so memory grows with the sequence, not with "
            "its square.",
        ),
        "zh": (
            "对每个（批，头，查询块）：对每个键块：更新 m、l、acc",
            "FlashAttention 从不保存（查询 × 键）整个矩阵。它一次处理一块键，每个查询行只保留"
            "运行中的最大值 m、运行中的和 l 和未归一化的输出 acc，所以内存随序列长度增长，"
            "而不是随它的平方增长。",
        ),
    },
    "skipped": {
        "en": (
            "under causal: a key block is skipped when its first key comes after the last "
            "query of the query block (first key position > last query position)",
            "Every key of this block comes after every query of the block, so every score "
            "would be −∞ and every P zero. The kernel does not even load it: about half of "
            "the tiles of a causal sequence are skipped.",
        ),
        "zh": (
            "因果遮盖下：键块的第一个键在查询块最后一个查询之后时（第一个键的位置 > "
            "最后一个查询的位置），跳过这个键块",
            "这一块的每个键都在这一块的每个查询之后，所以每个分数都是 −∞，每个 P 都是 0。"
            "内核根本不读取它：因果序列约有一半的块被跳过。",
        ),
    },
    "S": {
        "en": (
            "S = Q_block · K_blockᵀ × scale (+ bias), −∞ where not allowed",
            "The same numbers as the matching block of the trace's masked stage: only this "
            "tile of it exists at any time.",
        ),
        "zh": (
            "S = Q_块 · K_块ᵀ × scale（+ bias），不允许看的位置为 −∞",
            "与 trace 中 masked 阶段对应的那一块数值相同：任何时候都只有这一块存在。",
        ),
    },
    "m": {
        "en": (
            "m = max(m_old, rowmax(S))",
            "The largest score seen so far in each row. Subtracting it before exp keeps "
            "every exponential at most 1, so nothing overflows.",
        ),
        "zh": (
            "m = max(m_old, rowmax(S))",
            "每一行到目前为止见过的最大分数。先减去它再取 exp，每个指数都不超过 1，不会溢出。",
        ),
    },
    "alpha": {
        "en": (
            "α = exp(m_old − m)",
            "When a larger score arrives, everything summed so far was exponentiated against "
            "the old max; multiplying by α re-bases it on the new one. α = 1 when the max "
            "did not change, 0 on a row's first tile (m_old = −∞).",
        ),
        "zh": (
            "α = exp(m_old − m)",
            "出现更大的分数时，之前累加的一切都是相对旧的最大值取的指数；乘以 α 就换成以新的"
            "最大值为基准。最大值不变时 α = 1，一行的第一块时为 0（m_old = −∞）。",
        ),
    },
    "P": {
        "en": (
            "P = exp(S − m)",
            "The tile's unnormalised weights against the running max. They are not divided "
            "by the sum yet: the sum is not known until the last key block.",
        ),
        "zh": (
            "P = exp(S − m)",
            "这一块相对运行最大值的未归一化权重。此时还不能除以总和：要到最后一个键块才知道总和。",
        ),
    },
    "l": {
        "en": (
            "l = α·l + rowsum(P)",
            "The running softmax denominator: the old sum re-based by α, plus this tile's.",
        ),
        "zh": (
            "l = α·l + rowsum(P)",
            "运行中的 softmax 分母：旧的和乘以 α 换基准，再加上这一块的和。",
        ),
    },
    "acc": {
        "en": (
            "acc = α·acc + P · V_block",
            "The running numerator of the output: the weighted sum of the values so far, "
            "re-based by α like l.",
        ),
        "zh": (
            "acc = α·acc + P · V_块",
            "输出的运行分子：到目前为止值的加权和，与 l 一样乘以 α 换基准。",
        ),
    },
    "O": {
        "en": (
            "O = acc / l (after the last key block)",
            "Only now is the division done, once per row: the same output as softmax·V.",
        ),
        "zh": (
            "O = acc / l（最后一个键块之后）",
            "直到这时才做除法，每行一次：与 softmax·V 的结果相同。",
        ),
    },
    "L": {
        "en": (
            "L = m + log(l), the log-sum-exp of the row",
            "What FlashAttention and torch SDPA keep instead of the weights: any weight is "
            "exp(S − L), which the backward pass rebuilds tile by tile. With --base2 "
            "(Triton) it is stored in base 2: L₂ = L · log2 e.",
        ),
        "zh": (
            "L = m + log(l)，这一行的 log-sum-exp",
            "FlashAttention 和 torch SDPA 保存的是它，而不是权重：任何权重都等于 exp(S − L)，"
            "反向传播逐块重建它们。加 --base2（Triton）时以 2 为底保存：L₂ = L · log2 e。",
        ),
    },
    "check": {
        "en": (
            "max |O − output|, max |L − lse|, max |exp(x − L) − softmax|",
            "The tiled loop and the ordinary computation are the same math summed in a "
            "different order: in float64 they agree to 1e-12; in float32 they differ in "
            "the last few bits (ulps), which is rounding, not a bug.",
        ),
        "zh": (
            "max |O − output|，max |L − lse|，max |exp(x − L) − softmax|",
            "分块循环和普通计算是同一套数学，只是求和顺序不同：float64 下误差不超过 1e-12；"
            "float32 下只差最后几位（ulp），那是舍入，不是程序错误。",
        ),
    },
}


def explain(run: FlashRun, key: str, lang: Lang) -> Explanation:
    """The explanation of one quantity of the loop, with this run's block sizes."""
    notes = view_notes("flash")  # a variant's note on S as it computes it
    formula, meaning = (_EXPLAIN | notes)[key][lang]
    bq, bk, Dv = run.block_q, run.block_k, run.trace.inputs.d_v
    shapes = {
        "S": f"S [{bq}, {bk}]",
        "P": f"P [{bq}, {bk}]",
        "m": f"m [{bq}]",
        "alpha": f"α [{bq}]",
        "l": f"l [{bq}]",
        "acc": f"acc [{bq}, d_v={Dv}]",
        "O": f"O [seq_q, d_v={Dv}]",
        "L": "L [seq_q]",
    }
    inputs = (
        {
            "S": ("Q_block", "K_block"),
            "m": ("m_old", "S"),
            "alpha": ("m_old", "m"),
            "P": ("S", "m"),
            "l": ("α", "l", "P"),
            "acc": ("α", "acc", "P", "V_block"),
            "O": ("acc", "l"),
            "L": ("m", "l"),
            "loop": ("Q", "K", "V"),
            "skipped": ("q_block", "k_block"),
            "check": ("O", "L", "output", "softmax"),
        }
        | view_inputs("flash")
    ).get(key, (label(lang, "given"),))
    shapes |= {"loop": "O, L", "skipped": _t(lang, "skipped_out")}  # no array made: said so
    shape = shapes.get(key, shapes["S"] if key in notes else label(lang, "scalar"))
    return Explanation(key, lang, (formula,), inputs, shape, (meaning,))
