"""RoPE (rotary position embedding), what present/ says about it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.core.plugins.rope import frequencies
from attn_cli.core.variant import before
from attn_cli.core.variants import rope_pairs
from attn_cli.present.i18n import Lang, en_zh, label
from attn_cli.present.text import factor, short_number
from attn_cli.present.variant_texts import VariantTexts

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.core.pipeline import Trace
    from attn_cli.present.explain_registry import Cell, CellText, Context, Parts


@dataclass(frozen=True)
class RotatedPair:
    """One pair (a, b) of a row rotated by RoPE, with the trace's rotated values."""

    index: int  # i: angle = position × base^(−2i/dims)
    first: int  # the dimension of a
    second: int  # the dimension of b (i + dims/2 in half layout, 2i + 1 interleaved)
    inv_freq: float  # base^(−2i/dims), or as the RoPE scaling says
    angle: float  # position × inv_freq
    cos: float  # times the attention factor of the RoPE scaling (1 without)
    sin: float
    a: float  # the source row at ``first``
    b: float  # the source row at ``second``
    rotated_a: float  # Q_rot (or K_rot) at ``first``, from the trace: a·cos − b·sin
    rotated_b: float  # at ``second``, from the trace: a·sin + b·cos


@dataclass(frozen=True)
class Rotation:
    """One row of Q_rot or K_rot taken apart, pair by pair."""

    stage: str  # Q_rot or K_rot
    source: str  # what was rotated: Q (K), or the stage of the Q/K transform before RoPE
    position: int  # the token position the angles are taken at
    base: float
    dims: int  # the rotated dimensions (partial rotary: fewer than d_k)
    pairs: tuple[RotatedPair, ...]
    passed: tuple[float, ...]  # dimensions dims..d_k−1, passed through unchanged
    scaling: str | None = None  # the kind of RoPE scaling (llama3, yarn...), None: none
    attention: float = 1.0  # its factor on cos and sin


def rotation(trace: Trace, name: str, at: tuple[int, ...], position: int) -> Rotation | None:
    """The row ``at`` of Q_rot (K_rot) beside the row it rotated, pair by pair; None without RoPE.

    The angles are the convention's (position × base^(−2i/dims)), so the rotated values, read
    from the trace, are a·cos − b·sin and a·sin + b·cos of the source row's pairs.
    """
    rope = trace.inputs.rope
    stage = f"{name}_rot"
    if rope is None or stage not in trace:
        return None
    source = before(trace.inputs, stage)  # Q, or the transform before RoPE (Q_norm, Q_clip)
    x = trace[source].data[at]  # (D,)
    rotated = trace[stage].data[at]  # (D,)
    first, second = rope_pairs(rope.dims, rope.layout)  # (P,), (P,)
    inv_freq, att = frequencies(rope, trace.inputs)  # (P,), the factor on cos and sin
    pairs = []
    for i, (d1, d2, f) in enumerate(zip(first, second, inv_freq, strict=True)):
        angle = position * float(f)
        pairs.append(
            RotatedPair(
                i,
                int(d1),
                int(d2),
                float(f),
                angle,
                att * math.cos(angle),
                att * math.sin(angle),
                float(x[d1]),
                float(x[d2]),
                float(rotated[d1]),
                float(rotated[d2]),
            )
        )
    passed = tuple(float(v) for v in rotated[rope.dims :])
    kind = None if rope.scaling is None else rope.scaling.kind
    return Rotation(stage, source, position, rope.base, rope.dims, tuple(pairs), passed, kind, att)


def _explain_rot(c: Context) -> Parts:
    """The explanation of Q_rot and K_rot (rotary position embedding)."""
    inp = c.trace.inputs
    rope = TEXTS.setting(inp)
    assert rope is not None
    source = before(inp, c.name)
    pairs = (
        "i with i + dims/2 (GPT-NeoX, HF rotate_half)"
        if rope.layout == "half"
        else "2i with 2i + 1 (GPT-J, Meta's llama)"
    )
    pairs_zh = "第 i 维与第 i + dims/2 维" if rope.layout == "half" else "第 2i 维与第 2i + 1 维"
    layout = en_zh(c, f"{rope.layout} layout", "半分布局" if rope.layout == "half" else "交错布局")
    base = short_number(rope.base, c.precision)
    formula = (
        f"{c.name} = RoPE({source}, pos)",
        en_zh(
            c,
            f"{layout}, base {base}, {rope.dims} of {inp.d_k} dims rotate",
            f"{layout}，base {base}，{inp.d_k} 维中旋转 {rope.dims} 维",
        ),
        "angle[p, i] = p × base^(−2i/dims); (a, b) → (a·cos − b·sin, a·sin + b·cos)",
    )
    meaning = [
        en_zh(
            c,
            f"Rotary position embedding: dimensions are taken in pairs ({pairs}) and each pair "
            "is rotated by an angle proportional to the token's position, faster for the first "
            "pairs and slower for the last. V is not rotated.",
            f"旋转位置编码：把维度两两配对（{pairs_zh}），"
            "每一对按与位置成正比的角度旋转；前面的维度转得快，后面的转得慢。V 不旋转。",
        ),
        en_zh(
            c,
            "Why it works: rotating q by angle(m) and k by angle(n) makes their dot product "
            "depend only on m − n, so the scores see relative positions.",
            "为什么有效：q 按位置 m 旋转、k 按位置 n 旋转后，它们的点积只取决于 m − n，"
            "所以分数看到的是相对位置。",
        ),
    ]
    if rope.dims < inp.d_k:
        meaning.append(
            en_zh(
                c,
                f"Partial rotary: only the first {rope.dims} of {inp.d_k} dimensions rotate.",
                f"部分旋转：{inp.d_k} 维中只有前 {rope.dims} 维旋转。",
            )
        )
    if rope.scaling is not None:
        meaning.append(_scaling_meaning(c, rope))
    return formula, (c.shape_of(source),), meaning


def _scaling_meaning(c: Context, rope: Any) -> str:
    """What the RoPE scaling changes, in a sentence, with its attention factor."""
    kind = rope.scaling.kind
    _, att = frequencies(rope, c.trace.inputs)
    words = _SCALING_WORDS[kind]
    text = en_zh(
        c,
        f"RoPE scaling ({kind}, as transformers' rope_type): the angles use scaled frequencies, "
        f"{words['en']}, so that a model trained on short contexts reads long ones.",
        f"RoPE 缩放（{kind}，即 transformers 的 rope_type）：角度使用缩放后的频率，"
        f"{words['zh']}，让在短上下文上训练的模型能读长上下文。",
    )
    if att != 1.0:
        g = short_number(att, 6)
        text += en_zh(
            c,
            f" cos and sin are multiplied by the attention factor {g}, so the rotated part of "
            f"every score grows by {g}².",
            f" cos 和 sin 乘以注意力因子 {g}，所以每个分数的旋转部分放大 {g}² 倍。",
        )
    return text


def _cell_rot(c: Cell) -> CellText | None:
    """The worked cell under ``Q_rot`` or ``K_rot``: the query's (key's) row, pair by pair."""
    cell = c.cell
    rot = cell.q_rot if c.stage == "Q_rot" else cell.k_rot
    if rot is None:
        return None
    token = c.q_label if c.stage == "Q_rot" else c.k_label
    g = c.g
    intro = "cell_rot" if rot.scaling is None else "cell_rot_scaled"
    lines = [
        label(
            c.lang,
            intro,
            stage=rot.stage,
            source=rot.source,
            token=token,
            pos=rot.position,
            base=g(rot.base),
            dims=rot.dims,
            kind=rot.scaling,
            att=g(rot.attention),
        )
    ]
    count = len(rot.pairs)
    picked: list[int | None] = list(range(count))
    if not c.full and count > 2:
        picked = [0, None, count - 1] if count > 3 else [0, 1, count - 1]
    for i in picked:
        if i is None:
            lines.append(f"… ({label(c.lang, 'full_hint', e='…')})")
            continue
        pair = rot.pairs[i]
        a, b = factor(pair.a, c.precision), factor(pair.b, c.precision)
        cos, sin = factor(pair.cos, c.precision), factor(pair.sin, c.precision)
        freq = f"{g(rot.base)}^(−{2 * i}/{rot.dims})" if rot.scaling is None else "ω′"
        lines.append(
            label(
                c.lang,
                "cell_rot_pair",
                i=i,
                d1=pair.first,
                d2=pair.second,
                angle=f"{rot.position} × {freq} = {rot.position} × {g(pair.inv_freq)} = "
                f"{g(pair.angle)}",
                cos=c.n(pair.cos),
                sin=c.n(pair.sin),
            )
        )
        name = f"{rot.stage}[{token}, "
        lines.append(
            f"{name}{pair.first}] = a·cos − b·sin = {a}×{cos} − {b}×{sin} = {c.n(pair.rotated_a)}"
        )
        lines.append(
            f"{name}{pair.second}] = a·sin + b·cos = {a}×{sin} + {b}×{cos} = {c.n(pair.rotated_b)}"
        )
    if rot.passed:
        lines.append(
            label(c.lang, "cell_rot_pass", start=rot.dims, end=rot.dims + len(rot.passed) - 1)
        )
    from attn_cli.present.explain_registry import CellText

    return CellText(c.title, tuple(lines))


_SCALING_WORDS: dict[str, dict[Lang, str]] = {
    "linear": {"en": "every frequency divided by factor", "zh": "每个频率都除以 factor"},
    "dynamic": {
        "en": "NTK: past max_position_embeddings the base grows with the length",
        "zh": "NTK：超过 max_position_embeddings 后，base 随长度增大",
    },
    "llama3": {
        "en": "short wavelengths kept, long ones divided by factor, smoothed between",
        "zh": "短波长保持不变，长波长除以 factor，中间平滑过渡",
    },
    "yarn": {
        "en": "a ramp from kept (fast pairs) to divided by factor (slow pairs)",
        "zh": "从保持不变（快的维度对）到除以 factor（慢的维度对）的线性过渡",
    },
    "longrope": {
        "en": "each pair divided by its own factor: long_factor past the original length, "
        "else short_factor",
        "zh": "每一对除以各自的因子：超过原始长度用 long_factor，否则用 short_factor",
    },
}


def _scaling_line(rope: Any, inp: Inputs, lang: Lang) -> str:
    """The header's line on RoPE scaling: its kind, parameters, what it does, the factor."""
    scaling = rope.scaling
    params = ", ".join(
        f"{k} {short_number(v, 4) if isinstance(v, float) else v}"
        for k, v in scaling.params
        if not isinstance(v, tuple)
    )
    words = _SCALING_WORDS[scaling.kind][lang]
    _, att = frequencies(rope, inp)
    if att != 1.0:
        words += "; cos, sin × " + short_number(att, 6)
    return label(lang, "conv_rope_scaling", kind=scaling.kind, params=params, words=words)


class RopeTexts(VariantTexts):
    name = "rope"
    order = 20
    reads_positions = True
    before_positions = True
    labels: ClassVar[dict[Lang, dict[str, str]]] = {
        "en": {
            "conv_rope": (
                "RoPE: {layout} layout ({who}), base {base}, {dims} of {d_k} "
                "dims rotate; Q and K, not V"
            ),
            "conv_rope_half": "half: i pairs with i + dims/2, HF rotate_half",
            "conv_rope_interleaved": "interleaved: 2i pairs with 2i + 1, Meta's llama",
            "cell_rot": (
                "{stage}[{token}] rotates {source}[{token}] at position {pos}: pair i turns by "
                "angle = {pos} × {base}^(−2i/{dims}), (a, b) → (a·cos − b·sin, a·sin + b·cos)"
            ),
            "cell_rot_pair": (
                "pair {i}, dimensions ({d1}, {d2}): angle = {angle}; cos = {cos}, sin = {sin}"
            ),
            "cell_rot_pass": "dimensions {start} to {end} pass through unchanged (partial rotary)",
            "cell_rot_scaled": (
                "{stage}[{token}] rotates {source}[{token}] at position {pos}: pair i turns by "
                "angle = {pos} × ω′, where ω′ is the frequency {base}^(−2i/{dims}) as {kind} "
                "RoPE scaling sets it, (a, b) → (a·cos − b·sin, a·sin + b·cos), with cos and sin × "
                "the attention factor {att}"
            ),
            "conv_rope_scaling": "RoPE scaling {kind} ({params}): {words}",
        },
        "zh": {
            "conv_rope": (
                "RoPE：{layout}（{who}），base {base}，旋转 {dims} 维（共 {d_k} "
                "维）；只作用于 Q 和 K，不作用于 V"
            ),
            "conv_rope_half": "半分布局：第 i 维与第 i + dims/2 维配对，HF rotate_half",
            "conv_rope_interleaved": "交错布局：第 2i 维与第 2i + 1 维配对，Meta llama",
            "cell_rot": (
                "{stage}[{token}] 把 {source}[{token}] 按位置 {pos} 旋转：第 i 对转过 "
                "angle = {pos} × {base}^(−2i/{dims})，(a, b) → (a·cos − b·sin, a·sin + b·cos)"
            ),
            "cell_rot_pair": (
                "第 {i} 对，第 ({d1}, {d2}) 维：angle = {angle}；cos = {cos}，sin = {sin}"
            ),
            "cell_rot_pass": "第 {start} 到第 {end} 维不旋转，原样保留（部分旋转）",
            "cell_rot_scaled": (
                "{stage}[{token}] 把 {source}[{token}] 按位置 {pos} 旋转：第 i 对转过 "
                "angle = {pos} × ω′，ω′ 是频率 {base}^(−2i/{dims}) 经 {kind} RoPE 缩放后的值，"
                "(a, b) → (a·cos − b·sin, a·sin + b·cos)，cos 和 sin 乘以注意力因子 {att}"
            ),
            "conv_rope_scaling": "RoPE 缩放 {kind}（{params}）：{words}",
        },
    }
    explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {
        "Q_rot": _explain_rot,
        "K_rot": _explain_rot,
    }
    cell_texts: ClassVar[dict[str, Callable[[Any], Any]]] = {"Q_rot": _cell_rot, "K_rot": _cell_rot}

    def cell_rows(
        self,
        trace: Trace,
        rows: tuple[tuple[int, ...], tuple[int, ...]],
        positions: tuple[int, int],
    ) -> dict[str, Any]:
        q_at, k_at = rows
        return {
            "q_rot": rotation(trace, "Q", q_at, positions[0]),
            "k_rot": rotation(trace, "K", k_at, positions[1]),
        }

    math_names = ("RoPE",)
    formula_zh: ClassVar[tuple[tuple[str, str], ...]] = (
        (r", (\w+) scaling", r"，\1 缩放"),
        (r", cos and sin × ", "，cos 与 sin × "),
    )
    grad_note: ClassVar[dict[Lang, str]] = {
        "en": "RoPE rotates each pair of dimensions by an angle that depends on the position. "
        "A rotation's transpose is its inverse, so the gradient goes back by rotating the "
        "other way, by −angle.",
        "zh": "RoPE 按位置把每对维度旋转一个角度。旋转矩阵的转置就是它的逆，所以梯度反着转回去，"
        "即旋转 −angle。",
    }

    def grad_transform(self, stage: str, formula: str, lang: Lang) -> tuple[str, str] | None:
        if "RoPE⁻¹" not in formula:
            return None
        return self.grad_note[lang], stage.replace("_norm", "") + "_rot"

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        rope = value
        who = label(lang, f"conv_rope_{rope.layout}")
        layout = who.split(":")[0].split("：")[0]
        who = who.split(":")[-1].split("：")[-1].strip()
        lines = [
            label(
                lang,
                "conv_rope",
                layout=layout,
                who=who,
                base=f"{rope.base:g}",
                dims=rope.dims,
                d_k=inp.d_k,
            )
        ]
        if rope.scaling is not None:
            lines.append(_scaling_line(rope, inp, lang))
        return lines


TEXTS = RopeTexts()
