"""``attn decode`` of linear attention as Rich renderables: the state ledger beside softmax
attention's growing KV cache, each step's numbers and the state after it, the self-checks;
in English or Chinese.

Formatting only: every number comes from the :class:`StateRun` (core/decode_state.py's steps
and the checks of check/state_runs.py).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.text import Text

from attn_cli.core.stages import SPECS
from attn_cli.present.explain_registry import Explanation
from attn_cli.present.i18n import Lang, label
from attn_cli.present.options import RenderOptions
from attn_cli.present.render import render_explanation, simple_table
from attn_cli.present.run_view import (
    Sections,
    decode_opening,
    lookup,
    shown_diff,
    step_check,
    step_checks,
    titled_matrix,
)
from attn_cli.present.text import safe

if TYPE_CHECKING:
    from attn_cli.check.state_runs import StateRun
    from attn_cli.core.decode_state import StateStep

LEDGER_TOKENS = (4096, 32768, 131072)  # the lengths the ledger adds to the fixture's own

LABELS: dict[Lang, dict[str, str]] = {
    "en": {
        "title": "Linear-attention decoding: a state in place of the KV cache",
        "overview": "prefill: the first {p} token(s) ({tokens}) through the same recurrence; "
        "then one step per token, each updating the state and reading its output from it",
        "steps": "{n} decoding steps",
        "step": "step {k} of {n} · token {token} at position {pos}",
        "read": "{formula} · {rows}",
        "state": "state after the token: {formula} · {what}",
        "per_head": "head {h} (d_k × d_v)",
        "row_head": "head {h}",
        "row_slot": "t−{n}",
        "by_head": "one row per head",
        "by_slot": "one row per earlier token",
        "output": "output: one row per head",
        "out_stage": "{formula}: one row per head",
        "ledger_line": "ledger: the state holds {state} bytes whatever the length; softmax "
        "attention's KV cache of the same {heads} heads would hold {kv} bytes after {t} tokens",
        "ledger_title": "state ledger per layer (float64), against softmax attention's KV cache",
        "col_tokens": "tokens",
        "col_state": "state bytes",
        "col_kv": "KV cache bytes",
        "col_ratio": "cache / state",
        "row_prefill": "{t} (prefill)",
        "row_last": "{t} (this fixture)",
        "ledger_formula": "state = {parts} = {n} numbers × 8 = {b} bytes; KV cache = {heads} × "
        "({dk} + {dv}) × 8 = {kv} bytes per token; the cache outweighs the state from {even} "
        "tokens on",
        "batch": "batch {b} · ",
        "batch_note": "(per batch item; {b} items)",
        "more_steps": "… {n} more steps (--full shows all)",
        "check": "self-check: max |{stage} − the chunked form's row {token}| = {diff} {mark} "
        "(≤ {tol})",
        "check_prefill": "self-check of the prefill: max |{stage} − the chunked form's rows| = "
        "{diff} {mark}",
        "check_title": "self-check: each step against the chunked form's row",
        "col_step": "step",
        "col_token": "token",
        "col_pos": "position",
        "col_diff": "max abs diff",
        "page_overview": "overview and state ledger",
        "page_step": "{token}@{pos}",
        "page_checks": "self-check of every step",
    },
    "zh": {
        "title": "线性注意力解码：用状态代替 KV 缓存",
        "overview": "预填充：前 {p} 个词（{tokens}）按同一个递推算完；之后每个词一步，"
        "每一步更新状态并从状态中读出输出",
        "steps": "共 {n} 个解码步",
        "step": "第 {k} 步，共 {n} 步 · 词 {token}，位置 {pos}",
        "read": "{formula} · {rows}",
        "state": "这个词之后的状态：{formula} · {what}",
        "per_head": "头 {h}（d_k × d_v）",
        "row_head": "头 {h}",
        "row_slot": "t−{n}",
        "by_head": "每个头一行",
        "by_slot": "之前每个词一行",
        "output": "output：每个头一行",
        "out_stage": "{formula}：每个头一行",
        "ledger_line": "账本：无论序列多长，状态都占 {state} 字节；同样 {heads} 个头的 softmax "
        "注意力在 {t} 个词之后，KV 缓存要占 {kv} 字节",
        "ledger_title": "每层的状态账本（float64），对比 softmax 注意力的 KV 缓存",
        "col_tokens": "词数",
        "col_state": "状态字节数",
        "col_kv": "KV 缓存字节数",
        "col_ratio": "缓存 / 状态",
        "row_prefill": "{t}（预填充）",
        "row_last": "{t}（本配置文件）",
        "ledger_formula": "状态 = {parts} = {n} 个数 × 8 = {b} 字节；KV 缓存 = {heads} × "
        "({dk} + {dv}) × 8 = 每个词 {kv} 字节；从 {even} 个词起缓存超过状态",
        "batch": "批 {b} · ",
        "batch_note": "（每个批元素；共 {b} 个）",
        "more_steps": "… 另有 {n} 步（加 --full 显示全部）",
        "check": "自检：max |{stage} − 分块形式中 {token} 那一行| = {diff} {mark}（≤ {tol}）",
        "check_prefill": "预填充自检：max |{stage} − 分块形式的对应各行| = {diff} {mark}",
        "check_title": "自检：每一步与分块形式对比",
        "col_step": "步",
        "col_token": "词",
        "col_pos": "位置",
        "col_diff": "最大绝对误差",
        "page_overview": "概览与状态账本",
        "page_step": "{token}@{pos}",
        "page_checks": "每一步的自检",
    },
}

_EXPLAIN: dict[str, dict[Lang, tuple[str, str]]] = {  # key -> lang -> (formula, meaning)
    "state": {
        "en": (
            "state_t = update(state_(t−1), token t)",
            "Linear attention keeps no keys and values: each token is folded into a fixed "
            "matrix per head (d_k × d_v), and the next token's output is read from that "
            "matrix alone. This is the recurrent form attn trace shows as the state stage, "
            "run one token at a time, as generation runs it.",
        ),
        "zh": (
            "state_t = update(state_(t−1), 第 t 个词)",
            "线性注意力不保存键和值：每个词都被折叠进每个头一个固定大小的矩阵（d_k × d_v），"
            "下一个词的输出只从这个矩阵读出。这就是 attn trace 中 state 阶段的递推形式，"
            "像生成时那样一次一个词地运行。",
        ),
    },
    "ledger": {
        "en": (
            "state bytes = Σ numbers of the state × 8; KV cache = heads × (d_k + d_v) × 8 × T",
            "The state's size does not depend on how many tokens came before: the memory of "
            "a linear-attention layer is constant in the sequence length, while a softmax "
            "layer's KV cache grows by a key and a value per head for every token. Hybrid "
            "models (Qwen3-Next: three Gated DeltaNet layers to one full-attention layer) "
            "pay the growing cache only in their softmax layers.",
        ),
        "zh": (
            "状态字节数 = 状态中数的个数 × 8；KV 缓存 = heads × (d_k + d_v) × 8 × T",
            "状态的大小与之前有多少个词无关：线性注意力层的内存不随序列长度增长，"
            "而 softmax 层的 KV 缓存每来一个词，每个头都要多存一个键和一个值。"
            "混合模型（Qwen3-Next：三层 Gated DeltaNet 配一层完整注意力）只在 softmax "
            "层付出不断增长的缓存。",
        ),
    },
    "check": {
        "en": (
            "max |output − the chunked form's row of this token| ≤ 1e-12",
            "The chunked form computes every token at once, chunk by chunk (the parallel "
            "form within a chunk, the state carried between chunks), with no per-token "
            "state; the decode loop must give the same numbers to the last few bits.",
        ),
        "zh": (
            "max |output − 分块形式中该词的那一行| ≤ 1e-12",
            "分块形式一次算出所有词：块内用并行形式，块与块之间传递状态，不逐词保存状态；"
            "解码循环必须给出相同的数，只差最后几位。",
        ),
    },
}


_t = partial(lookup, LABELS)  # a label of LABELS in a language, filled in


def render_overview(run: StateRun, options: RenderOptions) -> Group:
    lang = options.lang
    parts = [*decode_opening(run, LABELS, lang), render_ledger(run, lang)]
    if options.explain:
        parts += [render_explanation(explain(run, key, lang)) for key in ("state", "ledger")]
    return Group(*parts)


def render_ledger(run: StateRun, lang: Lang) -> Group:
    """The state's bytes against the KV cache's at the prefill, this fixture's length and a few
    long contexts."""
    c = run.ledger
    table = simple_table(Text(_t(lang, "ledger_title"), style="bold"))
    table.add_column(_t(lang, "col_tokens"))
    for head in ("col_state", "col_kv", "col_ratio"):
        table.add_column(_t(lang, head), justify="right")
    rows = [
        (_t(lang, "row_prefill", t=run.result.prefill), run.result.prefill),
        (_t(lang, "row_last", t=c.seq), c.seq),
        *((f"{t:,}", t) for t in LEDGER_TOKENS if t > c.seq),
    ]
    for name, t in rows:
        kv = c.kv_at(t)
        table.add_row(name, f"{c.state:,}", f"{kv:,}", f"{kv / c.state:,.2f}")
    parts: list[RenderableType] = [table, Text(ledger_formula(run, lang), style="italic")]
    if run.trace.inputs.has_batch:
        parts.append(Text(_t(lang, "batch_note", b=run.trace.inputs.batch), style="dim"))
    return Group(*parts, Text(""))


def ledger_formula(run: StateRun, lang: Lang) -> str:
    """How the ledger's bytes are counted: the state's parts, the KV cache's per token."""
    c = run.ledger
    return _t(
        lang,
        "ledger_formula",
        parts=" + ".join(f"{n} {list(shape)}" for n, shape in c.parts),
        n=c.numbers,
        b=c.state,
        heads=c.heads,
        dk=c.d_k,
        dv=c.d_v,
        kv=c.kv_per_token,
        even=c.break_even(),
    )


def render_step(run: StateRun, k: int, options: RenderOptions) -> Group:
    """One token: the numbers it read, the state after it, its output, the ledger, the check."""
    lang = options.lang
    step = run.result.steps[k]
    token = repr(safe(run.label(step.index)))
    title = _t(lang, "step", k=k + 1, n=len(run.result.steps), token=token, pos=step.position)
    parts: list[RenderableType] = [Rule(Text(title, style="bold cyan"), align="left", style="cyan")]
    for b in range(run.trace.inputs.batch):
        parts += _step_tables(run, step, b, options)
    c = run.ledger
    ledger = _t(
        lang,
        "ledger_line",
        state=f"{c.state:,}",
        heads=c.heads,
        kv=f"{c.kv_at(step.index + 1):,}",
        t=step.index + 1,
    )
    parts += [Text(ledger, style="italic"), step_check(run, k, LABELS, lang)]
    if options.explain:
        parts.append(render_explanation(explain(run, "check", lang)))
    return Group(*parts, Text(""))


def _step_tables(run: StateRun, step: StateStep, b: int, options: RenderOptions) -> list[Any]:
    lang = options.lang
    inp = run.trace.inputs
    prefix = _t(lang, "batch", b=b) if inp.has_batch else ""
    parts: list[RenderableType] = []

    def table(matrix: Any, rows: list[str], title: str) -> None:
        cols = [str(i) for i in range(matrix.shape[-1])]
        parts.extend(titled_matrix(prefix + title, matrix, rows, cols, "", options))

    def heads(n: int) -> list[str]:
        return [_t(lang, "row_head", h=h) for h in range(n)]

    for name, x in step.read.items():  # (B, H, n) each
        formula = run.formulas.get(name, name)
        table(x[b], heads(x.shape[1]), _t(lang, "read", formula=formula, rows=_t(lang, "by_head")))
    for name, x in (step.state or {}).items():
        formula = run.formulas.get(name, name)
        if x.ndim == 4:  # (B, H, d_k, d_v): a matrix per head
            for h in range(x.shape[1]):
                what = _t(lang, "per_head", h=h)
                table(
                    x[b, h],
                    [str(i) for i in range(x.shape[2])],
                    _t(lang, "state", formula=formula, what=what),
                )
        elif name == "conv":  # (B, K−1, C): the window of the tokens before
            n = x.shape[1]
            rows = [_t(lang, "row_slot", n=n - i) for i in range(n)]
            table(x[b], rows, _t(lang, "state", formula=formula, what=_t(lang, "by_slot")))
        else:  # (B, H, d): a vector per head
            table(
                x[b],
                heads(x.shape[1]),
                _t(lang, "state", formula=formula, what=_t(lang, "by_head")),
            )
    table(step.output[b, :, 0], heads(inp.heads), _t(lang, "output"))
    for name, made in step.outs.items():  # the head-output transforms (z, normed)
        formula = SPECS[name].formula(inp)
        table(made[b, :, 0], heads(inp.heads), _t(lang, "out_stage", formula=formula))
    return parts


def render_checks(run: StateRun, options: RenderOptions) -> Group:
    """Every step's largest difference from the chunked form, and the prefill's."""
    heads = ("col_step", "col_token", "col_pos", "col_state", "col_kv", "col_diff")
    c = run.ledger

    def cells(k: int) -> list[Text | str]:
        kv = c.kv_at(run.result.steps[k].index + 1)
        return [f"{c.state:,}", f"{kv:,}", shown_diff(run.diffs[k], run.tolerance)]

    return step_checks(run, options, LABELS, heads, cells)


def explain(run: StateRun, key: str, lang: Lang) -> Explanation:
    """The state, its ledger or the self-check, explained."""
    formula, meaning = _EXPLAIN[key][lang]
    c = run.ledger
    shapes = {
        "state": " + ".join(f"{n} {list(s)}" for n, s in c.parts),
        "ledger": label(lang, "scalar"),
        "check": label(lang, "scalar"),
    }
    inputs = {
        "state": ("Q", "K", "V"),
        "ledger": ("heads", "d_k", "d_v"),
        "check": ("output", "output_chunked"),
    }[key]
    return Explanation(key, lang, (formula,), inputs, f"{key} {shapes[key]}", (meaning,))


def _page_title(run: StateRun, k: int, lang: Lang) -> str:
    """A step's page title, ``token@position``."""
    s = run.result.steps[k]
    return _t(lang, "page_step", token=safe(run.label(s.index)), pos=s.position)


SECTIONS = Sections(render_overview, render_step, render_checks, LABELS, _page_title)
render_state_decode = SECTIONS.whole  # overview and ledger, every step (middle elided), checks
state_pages = SECTIONS.pages  # step mode's pages, one renderable each
state_titles = SECTIONS.titles  # step mode's page titles, as state_pages
