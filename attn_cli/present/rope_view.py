"""``attn rope`` as Rich renderables: a fixture's RoPE pair by pair (frequency, wavelength
against the trained context, the band its scaling puts the pair in, the scaled frequency, the
angle at one position), with explanations in English or Chinese.

Formatting only: every number comes from core/rope_table.py's :class:`RopeTable`.
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from attn_cli.present.explain_registry import Explanation
from attn_cli.present.i18n import Lang
from attn_cli.present.options import RenderOptions
from attn_cli.present.render import fields, render_explanation
from attn_cli.present.run_view import lookup
from attn_cli.present.text import format_number, pick_rows, safe, short_number

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.core.rope_table import RopeTable

ROW_LIMIT, ROW_EDGE = 24, 8  # pairs shown without --full: the fast and the slow ends

LABELS: dict[Lang, dict[str, str]] = {
    "en": {
        "title": "RoPE, pair by pair",
        "k_layout": "layout",
        "half": "half: dimension i pairs with i + dims/2 (HF rotate_half, GPT-NeoX)",
        "interleaved": "interleaved: dimension 2i pairs with 2i + 1 (Meta's llama, GPT-J)",
        "k_dims": "rotated",
        "dims": "{dims} of d_k = {d_k} dimensions, {pairs}",
        "dims_partial": "{dims} of d_k = {d_k} dimensions, {pairs}; the other {rest} pass through",
        "k_base": "base",
        "base": "{base}: θ_i = base^(−2i/{dims}) radians per position",
        "base_grown": "{base}, grown to {grown} for {length} positions (dynamic NTK)",
        "base_alpha": "{base}, grown to {grown} by alpha at every length (NTK alpha)",
        "k_scaling": "scaling",
        "none": "none",
        "scaling": "{kind} ({params})",
        "k_trained": "trained context",
        "trained": "{trained} positions (original_max_position_embeddings)",
        "trained_dynamic": "{trained} positions (max_position_embeddings)",
        "k_attention": "attention factor",
        "attention": "{a} on cos and sin: the rotated part of every logit × {a2}",
        "k_length": "sequence",
        "length": "{length} positions (the frequencies of dynamic and longrope depend on it; "
        "--length)",
        "k_position": "angles at",
        "position": "position {position} (--position)",
        "col_pair": "pair",
        "col_dims": "dims",
        "col_theta": "θ",
        "col_wave": "λ",
        "col_ratio": "λ/ctx",
        "col_band": "band",
        "col_divisor": "θ/θ'",
        "col_scaled": "θ'",
        "col_angle": "angle",
        "lg_theta": "θ = base^(−2i/dims), radians per position",
        "lg_wave": "λ = 2π/θ, positions per turn",
        "lg_ctx": "λ/ctx = λ / the trained context (above 1: no full turn in training)",
        "lg_scaled": "θ' = what RoPE rotates by",
        "lg_angle": "angle = p·θ' at position p",
        "lg_angle_plain": "angle = p·θ at position p",
        "col_cos": "cos",
        "col_sin": "sin",
        "plain": "—",
        "scaled": "÷ factor",
        "kept": "kept",
        "smooth": "smooth",
        "ramp": "ramp",
        "grown": "base grown",
        "unchanged": "unchanged",
        "short": "short_factor",
        "long": "long_factor",
        "more": "… {n} pairs (--full)",
        "float": "attn computes these in float64; transformers in float32 (about 1e-7 of each "
        "frequency apart)",
    },
    "zh": {
        "title": "RoPE 逐对展示",
        "k_layout": "布局",
        "half": "半分：第 i 维与第 i + dims/2 维配对（HF rotate_half、GPT-NeoX）",
        "interleaved": "交错：第 2i 维与第 2i + 1 维配对（Meta 的 llama、GPT-J）",
        "k_dims": "旋转维度",
        "dims": "d_k = {d_k} 维中的 {dims} 维，共 {pairs} 对",
        "dims_partial": "d_k = {d_k} 维中的 {dims} 维，共 {pairs} 对；其余 {rest} 维不旋转",
        "k_base": "base",
        "base": "{base}：θ_i = base^(−2i/{dims})，每个位置转过的弧度",
        "base_grown": "{base}，序列有 {length} 个位置时增大到 {grown}（动态 NTK）",
        "base_alpha": "{base}，按 alpha 增大到 {grown}，与序列长度无关（NTK alpha）",
        "k_scaling": "缩放",
        "none": "无",
        "scaling": "{kind}（{params}）",
        "k_trained": "训练上下文",
        "trained": "{trained} 个位置（original_max_position_embeddings）",
        "trained_dynamic": "{trained} 个位置（max_position_embeddings）",
        "k_attention": "注意力因子",
        "attention": "cos 和 sin 乘以 {a}：每个 logit 的旋转部分乘以 {a2}",
        "k_length": "序列",
        "length": "{length} 个位置（dynamic 和 longrope 的频率取决于它；--length）",
        "k_position": "角度取自",
        "position": "位置 {position}（--position）",
        "col_pair": "对",
        "col_dims": "维",
        "col_theta": "θ",
        "col_wave": "λ",
        "col_ratio": "λ/ctx",
        "col_band": "频段",
        "col_divisor": "θ/θ'",
        "col_scaled": "θ'",
        "col_angle": "角度",
        "lg_theta": "θ = base^(−2i/dims)，每个位置转过的弧度",
        "lg_wave": "λ = 2π/θ，转一圈的位置数",
        "lg_ctx": "λ/ctx = λ / 训练上下文长度（大于 1：训练中没有转满一圈）",
        "lg_scaled": "θ' = RoPE 实际使用的频率",
        "lg_angle": "角度 = p·θ'，p 为所示位置",
        "lg_angle_plain": "角度 = p·θ，p 为所示位置",
        "col_cos": "cos",
        "col_sin": "sin",
        "plain": "—",
        "scaled": "÷ 因子",
        "kept": "保持",
        "smooth": "平滑",
        "ramp": "斜坡",
        "grown": "base 增大",
        "unchanged": "不变",
        "short": "short_factor",
        "long": "long_factor",
        "more": "… 还有 {n} 对（--full）",
        "float": "attn 用 float64 计算；transformers 用 float32（每个频率相差约 1e-7）",
    },
}

# What each kind does, and the columns, for --explain: (English, Chinese).
KIND_WORDS: dict[str, tuple[str, str]] = {
    "linear": (
        "linear (position interpolation): every θ is divided by factor, so a position up to "
        "factor × the trained context turns no further than the trained ones did; neighbouring "
        "tokens become harder to tell apart.",
        "linear（位置插值）：每个 θ 都除以 factor，于是直到 factor × 训练长度的位置，"
        "转过的角度都不超过训练时见过的；相邻的 token 也更难区分。",
    ),
    "dynamic": (
        "dynamic NTK: up to max_position_embeddings nothing changes; past it the base grows "
        "with the sequence, which slows the slow pairs most and leaves the fastest almost as "
        "they were. The frequencies depend on the length: --length shows another.",
        "dynamic NTK：序列不超过 max_position_embeddings 时不变；超过后 base 随序列长度增大，"
        "慢的对变慢得最多，最快的几乎不变。频率取决于长度：用 --length 查看其他长度。",
    ),
    "llama3": (
        "llama3: a pair whose wavelength is below trained / high_freq_factor is kept (it turns "
        "many times within the trained context and tells neighbours apart); above trained / "
        "low_freq_factor it is divided by factor; between, θ' = (1 − s)·θ/factor + s·θ with "
        "s = (trained/λ − low_freq_factor)/(high_freq_factor − low_freq_factor); the band column "
        'shows such a pair as "smooth" with 1 − s, its share of ÷ factor.',
        "llama3：波长小于 训练长度 / high_freq_factor 的对保持不变（它们在训练上下文中转了很多圈，"
        "用来区分相邻的 token）；大于 训练长度 / low_freq_factor 的除以 factor；介于两者之间的，"
        "θ' = (1 − s)·θ/factor + s·θ，其中 s = (训练长度/λ − low_freq_factor)/"
        "(high_freq_factor − low_freq_factor)；频段一列把这样的对标为「平滑」，后面的数是 1 − s，"
        "即它除以 factor 的比例。",
    ),
    "yarn": (
        "yarn: a ramp r over the pairs, between the pair that turns beta_fast times over the "
        "trained context and the one that turns beta_slow times: r = 0 keeps θ (fast pairs), "
        "r = 1 divides it by factor (slow pairs), between mixes, θ' = θ/factor·r + θ·(1 − r). "
        "The attention factor (mscale) multiplies cos and sin, so the rotated part of every "
        "logit grows by its square and the softmax stays as sharp as at the trained length.",
        "yarn：在各对之间有一个斜坡 r，介于在训练上下文中转 beta_fast 圈的对与转 beta_slow 圈的对"
        "之间：r = 0 保持 θ（快的对），r = 1 除以 factor（慢的对），中间按比例混合，"
        "θ' = θ/factor·r + θ·(1 − r)。注意力因子（mscale）乘到 cos 和 sin 上，"
        "所以每个 logit 的旋转部分乘以它的平方，softmax 和在训练长度时一样尖锐。",
    ),
    "longrope": (
        "longrope: each pair is divided by its own factor, from long_factor when the sequence is "
        "longer than the trained context, else short_factor; the attention factor multiplies "
        "cos and sin.",
        "longrope：每一对除以自己的因子，序列比训练上下文长时取 long_factor，否则取 short_factor；"
        "注意力因子乘到 cos 和 sin 上。",
    ),
    "ntk_alpha": (
        "ntk_alpha (HunYuan): the base is multiplied once by alpha^(dims/(dims−2)), the power "
        "dynamic NTK grows it by, but at every length: the slow pairs slow down most, the "
        "fastest stay almost as they were, and nothing depends on the sequence.",
        "ntk_alpha（混元）：base 一次性乘以 alpha^(dims/(dims−2))，与动态 NTK 的幂相同，"
        "但与长度无关：慢的对变慢得最多，最快的几乎不变，频率不随序列长度变化。",
    ),
}
PAIRS_WORDS = (
    "Each pair (a, b) of a query's or key's dimensions turns by angle = position × θ_i, "
    "θ_i = base^(−2i/dims): pair 0 turns one radian per position, the last about 1/base. The "
    "fast pairs tell neighbouring tokens apart, the slow ones carry long distances.",
    "查询和键的每一对维度 (a, b) 按 角度 = 位置 × θ_i 旋转，θ_i = base^(−2i/dims)："
    "第 0 对每个位置转 1 弧度，最后一对约 1/base。快的对区分相邻的 token，慢的对承载远距离。",
)
WAVE_WORDS = (
    "The wavelength λ = 2π/θ is how many positions a pair takes for one full turn. A pair "
    "whose λ is longer than the trained context (λ / trained above 1) never turned fully in "
    "training: past that context its angles are new to the model, which is what RoPE scaling "
    "repairs.",
    "波长 λ = 2π/θ 是一对转满一圈所需的位置数。λ 比训练上下文长（λ / 训练长度 大于 1）的对在训练中"
    "从未转满一圈：超出这个上下文后，它的角度对模型来说是新的，RoPE 缩放正是为此。",
)
ANGLE_WORDS = (
    "The angle columns are at the position shown: (a, b) → (a·cos − b·sin, a·sin + b·cos), "
    "times the attention factor. attn trace --explain shows the same rotation applied to a row "
    "of Q and K.",
    "角度各列取自所示位置：(a, b) → (a·cos − b·sin, a·sin + b·cos)，再乘以注意力因子。"
    "attn trace --explain 展示同样的旋转作用在 Q 和 K 的一行上。",
)


_t = partial(lookup, LABELS)  # a label of LABELS in a language, filled in


def _g(x: float, precision: int) -> str:
    """A number over many orders of magnitude (θ from 1 to 1e-7, λ from 6 to 1e9):
    ``precision`` significant digits, scientific (``1.037e-6``, ``6.092e5``) where fixed point
    would need more than 2 leading zeros or ``precision`` digits."""
    if not math.isfinite(x):
        return format_number(x, precision)
    digits = max(precision, 1)
    if x == 0 or 1e-3 <= abs(x) < 10**digits:
        return f"{x:.{digits}g}"
    mantissa, _, exponent = f"{x:.{digits - 1}e}".partition("e")
    return f"{mantissa}e{int(exponent)}"


def render_rope(inputs: Inputs, table: RopeTable, options: RenderOptions | None = None) -> Group:
    """The overview, the table of pairs, and (--explain) what the columns and the kind mean."""
    options = options or RenderOptions()
    lang = options.lang
    parts: list[RenderableType] = [_overview(inputs, table, lang, options.precision)]
    parts.append(_pairs(table, lang, options))
    scaled = table.rope.scaling is not None
    legend = [
        "lg_theta",
        "lg_wave",
        *(["lg_ctx"] if table.trained is not None else []),
        *(["lg_scaled", "lg_angle"] if scaled else ["lg_angle_plain"]),
    ]
    parts.append(Text(" · ".join(_t(lang, key) for key in legend), style="dim"))
    parts.append(Text(_t(lang, "float"), style="dim"))
    if options.explain:
        parts.append(render_explanation(explain_rope(table, lang)))
    return Group(*parts)


def _overview(inputs: Inputs, table: RopeTable, lang: Lang, precision: int) -> Panel:
    rope, scaling = table.rope, table.rope.scaling
    pairs = rope.dims // 2
    dims_key = "dims" if rope.dims == table.d_k else "dims_partial"
    base = _t(lang, "base", base=short_number(rope.base, precision), dims=rope.dims)
    if table.base != rope.base:
        base = _t(
            lang,
            "base_alpha" if scaling is not None and scaling.kind == "ntk_alpha" else "base_grown",
            base=short_number(rope.base, precision),
            grown=_g(table.base, precision + 2),
            length=f"{table.length:,}",
        )
    counted = f"{pairs} pair" + ("" if pairs == 1 else "s") if lang == "en" else pairs
    dims = _t(
        lang, dims_key, dims=rope.dims, d_k=table.d_k, pairs=counted, rest=table.d_k - rope.dims
    )
    lines = [
        (_t(lang, "k_layout"), _t(lang, rope.layout)),
        (_t(lang, "k_dims"), dims),
        (_t(lang, "k_base"), base),
    ]
    if scaling is None:
        lines.append((_t(lang, "k_scaling"), _t(lang, "none")))
    else:
        params = ", ".join(
            f"{k} {_g(v, precision) if isinstance(v, float) else v}"
            for k, v in scaling.params
            if not isinstance(v, tuple)
        )
        lines.append((_t(lang, "k_scaling"), _t(lang, "scaling", kind=scaling.kind, params=params)))
    if table.trained is not None:
        key = "trained_dynamic" if scaling is not None and scaling.kind == "dynamic" else "trained"
        lines.append((_t(lang, "k_trained"), _t(lang, key, trained=f"{table.trained:,}")))
    if table.attention != 1.0:
        a = table.attention
        lines.append(
            (
                _t(lang, "k_attention"),
                _t(lang, "attention", a=_g(a, precision + 2), a2=_g(a * a, precision + 2)),
            )
        )
    lines.append((_t(lang, "k_length"), _t(lang, "length", length=f"{table.length:,}")))
    lines.append((_t(lang, "k_position"), _t(lang, "position", position=f"{table.position:,}")))
    grid = fields([(key, Text(safe(value))) for key, value in lines])
    title = f"{_t(lang, 'title')} · {inputs.name}" if inputs.name else _t(lang, "title")
    return Panel(grid, title=Text(safe(title), style="bold"), title_align="left", box=box.ROUNDED)


def _pairs(table: RopeTable, lang: Lang, options: RenderOptions) -> Table:
    p = options.precision
    scaled = table.rope.scaling is not None
    out = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, 1))
    columns = ["col_pair", "col_dims", "col_theta", "col_wave"]
    if table.trained is not None:
        columns.append("col_ratio")
    if scaled:
        columns += ["col_band", "col_divisor", "col_scaled"]
    columns += ["col_angle", "col_cos", "col_sin"]
    for name in columns:
        out.add_column(
            _t(lang, name), justify="left" if name == "col_band" else "right", no_wrap=True
        )
    n = len(table.first)
    for i in pick_rows(n, options.full):
        if i is None:
            out.add_row(Text(_t(lang, "more", n=n - 2 * ROW_EDGE), style="dim"))
            continue
        row = [
            str(i),
            f"{table.first[i]}, {table.second[i]}",
            _g(table.inv_freq[i], p),
            _g(table.wavelength[i], p),
        ]
        if table.trained is not None:
            row.append(_g(table.over_trained[i], p))
        if scaled:
            band = _t(lang, table.band[i])
            if table.band[i] in ("smooth", "ramp"):  # how much of ÷ factor the pair gets
                band += f" {table.mix[i]:.2f}"
            row += [band, _g(table.divisor[i], p), _g(table.scaled[i], p)]
        row += [
            _g(table.angle[i], p),
            format_number(table.cos[i], p),
            format_number(table.sin[i], p),
        ]
        out.add_row(*row)
    return out


def explain_rope(table: RopeTable, lang: Lang) -> Explanation:
    """The view explained: the formulas, what a pair and a wavelength are, what the kind does."""
    en = lang == "en"
    rope = table.rope
    meaning = [PAIRS_WORDS[0 if en else 1], WAVE_WORDS[0 if en else 1]]
    if rope.scaling is not None:
        meaning.append(KIND_WORDS[rope.scaling.kind][0 if en else 1])
    meaning.append(ANGLE_WORDS[0 if en else 1])
    formula = (
        "θ_i = base^(−2i/dims), λ_i = 2π/θ_i",
        "θ'_i = scaling(θ_i), angle = p·θ'_i",
        "(a, b) → (a·cos − b·sin, a·sin + b·cos) × attention factor",
    )
    pairs = rope.dims // 2
    return Explanation(
        "rope",
        lang,
        formula,
        (f"base, dims = {rope.dims}", f"position p = {table.position}"),
        f"({pairs},) θ', angle",
        tuple(meaning),
    )
