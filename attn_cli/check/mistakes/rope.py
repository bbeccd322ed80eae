"""The mistakes of RoPE: the other layout (half vs interleaved), V rotated too, K not rotated,
another model's base, the frequencies' exponent without its 2, every dimension rotated where
the rotary part is partial, the pairs turned by -angle, its scaling ignored, pairs put in the
wrong band of it, its attention factor (mscale) left out, and (with positions.py) the positions
read one off. Axis names as in core/steps.py."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from attn_cli.check.mistake import Mistake, Reader, register, register_reader, register_zh
from attn_cli.check.recompute import Change, internal, recomputed
from attn_cli.core.chain import Chain
from attn_cli.core.inputs import FloatArray, IntArray
from attn_cli.core.plugins.rope import apply_rope, frequencies, rope_inv_freq, rope_length
from attn_cli.core.rope_scaling import KINDS, bands, longrope_long, yarn_factor, yarn_ramp
from attn_cli.core.stages import STAGE_NAMES
from attn_cli.core.variant import REGISTRY, QKAt
from attn_cli.core.variants import RopeLayout

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _rotate(trace: Trace, x: FloatArray, positions: IntArray, rope: Any = None) -> FloatArray:
    """x (B, heads, n, D) rotated at ``positions`` by the fixture's RoPE (or by ``rope``)."""
    variant = REGISTRY["rope"]
    value = variant.value(trace.inputs) if rope is None else rope
    return variant.transform(value, QKAt(trace.inputs, "K", positions), x)


def _before_rope(trace: Trace, which: str) -> FloatArray:
    """What RoPE rotates: Q or K after the transforms before it (Q_norm with QK-norm)."""
    stages = Chain(trace.inputs).qk_stages(which)
    return internal(trace, stages[stages.index(f"{which}_rot") - 1])


def _rope_layout(trace: Trace) -> list[Change]:
    rope = trace.inputs.rope
    if rope is None or rope.dims < 4:
        return []  # with 2 rotary dims both layouts pair (0, 1)
    other: RopeLayout = "interleaved" if rope.layout == "half" else "half"
    wrong = replace(rope, layout=other)
    pos_q, pos_k = trace.inputs.token_positions()
    values = {
        "Q_rot": _rotate(trace, _before_rope(trace, "Q"), pos_q, wrong),  # (B, H, T, D)
        "K_rot": _rotate(trace, _before_rope(trace, "K"), pos_k, wrong),  # (B, Hkv, S, D)
    }
    pairs = {
        "half": "dimension i with i + d/2 (HF's rotate_half, GPT-NeoX)",
        "interleaved": "dimension 2i with 2i+1 (GPT-J, Meta's view_as_complex)",
    }
    detail = (
        f"Your {{stage}} is what attn gets with RoPE in the {other} layout, pairing "
        f"{pairs[other]}, where the fixture's {rope.layout} layout pairs {pairs[rope.layout]}. "
        "The two give the same scores only if W_Q and W_K are permuted to match (HF's "
        "convert_llama_weights_to_hf permutes each head's columns [0, 2, 4, ..., 1, 3, 5, ...]). "
        f"Fix: rotate in the {rope.layout} layout, or permute the weights."
    )
    return [Change(detail, "Q_rot", values)]


def _rope_on_v(trace: Trace) -> list[Change]:
    inp = trace.inputs
    if inp.rope is None or inp.d_v < inp.rope.dims:
        return []  # a V narrower than the rotary dims would not even rotate
    _, pos_k = inp.token_positions()
    v = _rotate(trace, internal(trace, "V"), pos_k)  # (B, Hkv, S, Dv)
    detail = (
        "Your {stage} is what attn gets when V is rotated too. RoPE rotates only queries and "
        "keys, so that each score q·k depends on how far apart the two tokens are; the values "
        "carry content and are not rotated. Fix: apply RoPE to Q and K only."
    )
    return [Change(detail, "V", {"V": v})]


def _rope_not_on_k(trace: Trace) -> list[Change]:
    if trace.inputs.rope is None:
        return []
    detail = (
        "Your {stage} is what attn gets when RoPE rotates Q but not K. A score q·k then "
        "depends on the query's absolute position instead of the distance between query and "
        "key, which is the point of RoPE. Fix: rotate K too, at the key positions."
    )
    return [Change(detail, "K_rot", {"K_rot": _before_rope(trace, "K")})]


# -- RoPE scaling (core/rope_scaling.py): the frequencies a long-context checkpoint rotates by --


def _rotated_by(trace: Trace, inv_freq: FloatArray, attention: float) -> dict[str, FloatArray]:
    """Q_rot and K_rot rotated by ``inv_freq``, cos and sin times ``attention``."""
    rope = trace.inputs.rope
    assert rope is not None
    pos_q, pos_k = trace.inputs.token_positions()
    values = {}
    for which, pos in (("Q", pos_q), ("K", pos_k)):
        values[f"{which}_rot"] = apply_rope(
            _before_rope(trace, which),
            pos,
            layout=rope.layout,
            dims=rope.dims,
            inv_freq=inv_freq,
            attention=attention,
        )  # (B, H|Hkv, T|S, D)
    return values


class _Scaled(NamedTuple):
    """A fixture's RoPE scaling and the frequencies before and after it."""

    rope: Any  # core/inputs.py's Rope
    scaling: Any  # core/rope_scaling.py's RopeScaling
    plain: FloatArray  # (P,) base^(-2i/dims)
    inv: FloatArray  # (P,) what the scaling rotates by
    attention: float  # its factor on cos and sin


def _scaled(trace: Trace) -> _Scaled | None:
    rope = trace.inputs.rope
    if rope is None or rope.scaling is None:
        return None
    inv, attention = frequencies(rope, trace.inputs)
    return _Scaled(rope, rope.scaling, rope_inv_freq(rope.dims, rope.base), inv, attention)


def _scaling_ignored(trace: Trace) -> list[Change]:
    scaled = _scaled(trace)
    if scaled is None:
        return []
    _, scaling, plain, inv, attention = scaled
    if np.array_equal(plain, inv) and attention == 1:
        return []  # dynamic below max_position_embeddings: nothing to ignore
    factor = "" if attention == 1 else f", and cos and sin are not multiplied by {attention:.6g}"
    detail = (
        f"Your {{stage}} is what attn gets when RoPE ignores the fixture's {scaling.kind} "
        f"scaling: the plain frequencies base^(-2i/dims){factor}. {scaling.kind} "
        f"{KINDS[scaling.kind].words}. Fix: compute inv_freq as transformers' "
        f"ROPE_INIT_FUNCTIONS['{scaling.kind}'] does (modeling_rope_utils.py); attn rope "
        "shows each pair's frequency before and after."
    )
    return [Change(detail, "Q_rot", _rotated_by(trace, plain, 1.0))]


def _wrong_band(trace: Trace) -> list[Change]:
    """Each pair put in the wrong band: llama3's bands reversed or its middle band not
    smoothed, yarn's ramp reversed, longrope's other factor list."""
    scaled = _scaled(trace)
    if scaled is None:
        return []
    rope, scaling, plain, inv, attention = scaled
    wrong: list[tuple[FloatArray, str]] = []
    if scaling.kind == "llama3":
        factor = scaling.get("factor")
        share = bands(scaling, rope.dims, rope.base, 0)[1]  # 0 kept .. 1 ÷ factor
        swapped = (1 - share) * plain / factor + share * plain  # each pair's share reversed
        wrong += [
            (
                swapped,
                "the bands swapped: the short wavelengths (below "
                "original/high_freq_factor) divided "
                "by factor and the long ones kept, as when the "
                "wavelength is compared the wrong way "
                "or the frequency is compared where the wavelength should be",
            ),
            (
                np.where((share > 0) & (share < 1), plain, inv),
                "the middle band (between original/high_freq_factor and original/low_freq_factor) "
                "left unscaled instead of smoothed between θ and θ/factor",
            ),
            (
                np.where((share > 0) & (share < 1), plain / factor, inv),
                "the middle band divided by factor instead of smoothed between θ and θ/factor",
            ),
        ]
    elif scaling.kind == "yarn":
        ramp = yarn_ramp(scaling, rope.dims, rope.base)
        wrong.append(
            (
                plain / yarn_factor(scaling) * (1 - ramp) + plain * ramp,
                "the ramp reversed: the fast pairs (many turns over "
                "the original length) divided by "
                "factor and the slow ones kept; transformers' inv_freq_extrapolation_factor is "
                "1 − ramp, the share of the kept frequency",
            )
        )
    elif scaling.kind == "longrope":
        long = longrope_long(scaling, rope_length(trace.inputs))
        other = np.asarray(scaling.get("short_factor" if long else "long_factor"))
        words = ("short_factor", "long_factor") if long else ("long_factor", "short_factor")
        wrong.append(
            (
                plain / other,
                f"{words[0]} used where {words[1]} applies (long_factor only past "
                "original_max_position_embeddings = "
                f"{scaling.get('original_max_position_embeddings')} "
                "positions: max(position) + 1 decides)",
            )
        )
    changes = []
    for freq, what in wrong:
        if np.allclose(freq, inv, rtol=1e-12, atol=0):
            continue  # the mistake changes nothing here (no pair in that band)
        detail = (
            f"Your {{stage}} is what attn gets with {scaling.kind} RoPE scaling's pairs in the "
            f"wrong band: {what}. Fix: attn rope shows which band each pair falls in."
        )
        changes.append(Change(detail, "Q_rot", _rotated_by(trace, freq, attention)))
    return changes


def _mscale_missing(trace: Trace) -> list[Change]:
    scaled = _scaled(trace)
    if scaled is None or scaled.attention == 1:
        return []
    _, scaling, _, inv, attention = scaled
    detail = (
        f"Your {{stage}} is what attn gets when {scaling.kind}'s attention factor (mscale) "
        f"{attention:.6g} is left out: transformers multiplies cos and sin by it "
        "(attention_scaling), so q and k each grow by it and the rotated part of every logit by "
        f"its square, {attention * attention:.6g}. Fix: multiply cos and sin by "
        f"{attention:.6g}."
    )
    return [Change(detail, "Q_rot", _rotated_by(trace, inv, 1.0))]


def _moved(trace: Trace, dq: int, dk: int) -> Change:
    """Q_rot and K_rot at moved positions; moved alike, the distances and so every stage after
    them stay the trace's (only Q_rot and K_rot show it)."""
    pos_q, pos_k = trace.inputs.token_positions()
    values: dict[str, FloatArray] = {}
    if dq == dk:
        after = STAGE_NAMES[STAGE_NAMES.index("K_rot") + 1 :]
        values = {n: internal(trace, n) for n in after if n in trace}
    values["Q_rot"] = _rotate(trace, _before_rope(trace, "Q"), pos_q + dq)
    values["K_rot"] = _rotate(trace, _before_rope(trace, "K"), pos_k + dk)
    return Change("", "Q_rot", values)


register(
    "rope",
    Mistake("rope_layout", "RoPE half vs interleaved layout", recomputed(_rope_layout), 110),
    Mistake("rope_on_v", "RoPE applied to V as well", recomputed(_rope_on_v), 111),
    Mistake("rope_not_on_k", "RoPE not applied to K", recomputed(_rope_not_on_k), 112),
    Mistake("rope_scaling_ignored", "RoPE scaling ignored", recomputed(_scaling_ignored), 117),
    Mistake("rope_wrong_band", "RoPE scaling: wrong band", recomputed(_wrong_band), 118),
    Mistake(
        "rope_mscale_missing", "RoPE scaling: mscale missing", recomputed(_mscale_missing), 119
    ),
)
register_reader("rope", Reader("RoPE", "Q_rot", _moved))


# -- the frequencies of plain RoPE: base, exponent, rotary dims, direction (issue 28) ----------


def _turned(trace: Trace, inv_freq: FloatArray, dims: int, sign: float = 1.0) -> Any:
    """Q_rot and K_rot rotated by ``sign``·position·``inv_freq`` over the first ``dims``."""
    rope = trace.inputs.rope
    assert rope is not None
    pos = dict(zip("QK", trace.inputs.token_positions(), strict=True))
    return {
        f"{w}_rot": apply_rope(
            _before_rope(trace, w), pos[w], layout=rope.layout, dims=dims, inv_freq=sign * inv_freq
        )
        for w in "QK"
    }  # (B, H|Hkv, T|S, D)


def _plain(trace: Trace) -> Any:
    """The fixture's RoPE when it has no scaling (the scaled frequencies are another story)."""
    rope = trace.inputs.rope
    return rope if rope is not None and rope.scaling is None else None


def _rope_base(trace: Trace) -> list[Change]:
    rope = _plain(trace)
    if rope is None:
        return []
    return [
        Change(
            f"Your {{stage}} is what attn gets with a RoPE base of {base:g} instead of "
            f"{rope.base:g}: every pair turns at another speed. The base is config.json's "
            "rope_theta (10000 for Llama 2 and GPT-NeoX, 500000 for Llama 3, 1000000 for Qwen2 "
            f"and Qwen3), not a constant of RoPE. Fix: base = {rope.base:g}.",
            "Q_rot",
            _turned(trace, rope_inv_freq(rope.dims, base), rope.dims),
        )
        for base in (10000.0, 500000.0, 1000000.0)
        if base != rope.base
    ]


def _rope_exponent(trace: Trace) -> list[Change]:
    rope = _plain(trace)
    if rope is None or rope.dims < 4:
        return []  # one pair: its exponent is 0 either way
    inv_freq = 1.0 / rope.base ** (np.arange(rope.dims // 2) / rope.dims)  # base^(-i/dims)
    detail = (
        "Your {stage} is what attn gets with the frequencies base^(-i/dims) for i = 0, 1, 2, "
        "...: the 2 of 2i/dims left out (arange(dims // 2) / dims), so the slowest pair turns "
        "about as fast as the middle one should. HF: 1 / base ** (arange(0, dims, 2) / dims). "
        "Fix: inv_freq = base ** (-2 * i / dims)."
    )
    return [Change(detail, "Q_rot", _turned(trace, inv_freq, rope.dims))]


def _rope_all_dims(trace: Trace) -> list[Change]:
    rope = _plain(trace)
    d_k = trace.inputs.d_k
    if rope is None or rope.dims == d_k or d_k % 2:
        return []
    detail = (
        f"Your {{stage}} is what attn gets with all {d_k} dimensions rotated, where the fixture "
        f"rotates the first {rope.dims} and passes the rest through (partial rotary: "
        "GPT-NeoX's rotary_pct, Phi's partial_rotary_factor). Fix: rotate x[..., :rotary_dim] "
        "and concatenate x[..., rotary_dim:] unchanged, with frequencies over rotary_dim."
    )
    return [Change(detail, "Q_rot", _turned(trace, rope_inv_freq(d_k, rope.base), d_k))]


def _rope_reversed(trace: Trace) -> list[Change]:
    rope = _plain(trace)
    if rope is None:
        return []
    detail = (
        "Your {stage} is what attn gets with every pair turned the other way, by -angle: "
        "rotate_half written as cat(x2, -x1) instead of cat(-x2, x1), or sin with its sign "
        "flipped. Each score then depends on the distance taken the other way round. Fix: "
        "rotate_half(x) = cat(-x[..., d/2:], x[..., :d/2])."
    )
    return [
        Change(
            detail, "Q_rot", _turned(trace, rope_inv_freq(rope.dims, rope.base), rope.dims, -1.0)
        )
    ]


register(
    "rope",
    Mistake("rope_base", "RoPE base (rope_theta) of another model", recomputed(_rope_base), 113),
    Mistake(
        "rope_exponent",
        "RoPE frequencies base^(-i/d) instead of base^(-2i/d)",
        recomputed(_rope_exponent),
        114,
    ),
    Mistake(
        "rope_all_dims",
        "RoPE over every dimension where it is partial",
        recomputed(_rope_all_dims),
        115,
    ),
    Mistake("rope_reversed", "RoPE turned the other way (-angle)", recomputed(_rope_reversed), 116),
)

register_zh(
    {
        "rope_layout": (
            "RoPE 的 half 与 interleaved 布局弄混",
            "half 布局把第 i 维与第 i+d/2 维配对（HF rotate_half、GPT-NeoX），interleaved 把 2i 与"
            " 2i+1 配对（GPT-J、Meta 的复数写法）；两者只有在 W_Q、W_K 按头重排后才一致。修正：按 "
            "fixture 的布局旋转，或重排权重。",
        ),
        "rope_on_v": (
            "RoPE 也作用在了 V 上",
            "RoPE 只旋转查询和键，使分数只取决于两者的距离；值不旋转。修正：只对 Q、K 用 RoPE。",
        ),
        "rope_not_on_k": (
            "RoPE 没有作用在 K 上",
            "只旋转了 Q，分数就取决于查询的绝对位置而不是距离。修正：K 也在键的位置上旋转。",
        ),
        "rope_base": (
            "RoPE 的 base（rope_theta）用了别的模型的",
            "base 来自 config.json 的 rope_theta（Llama 2 为 10000，Llama 3 为 500000，Qwen 为 100"
            "0000），不是常数。修正：使用 fixture 的 base。",
        ),
        "rope_exponent": (
            "RoPE 频率写成 base^(-i/d) 而不是 base^(-2i/d)",
            "漏了 2i/d 中的 2（arange(d // 2) / d）。修正：inv_freq = 1 / base ** (arange(0, d, 2)"
            " / d)。",
        ),
        "rope_all_dims": (
            "部分旋转时却旋转了所有维度",
            "fixture 只旋转前 rotary_dim 维（GPT-NeoX 的 rotary_pct、Phi 的 partial_rotary_factor"
            "），其余维度原样通过。修正：只旋转 x[..., :rotary_dim]，频率也按 rotary_dim 计算。",
        ),
        "rope_reversed": (
            "RoPE 旋转方向反了（−角度）",
            "rotate_half 写成 cat(x2, -x1)，或 sin 的符号反了，每对维度按 −角度旋转。修正：rotate_"
            "half(x) = cat(-x[..., d/2:], x[..., :d/2])。",
        ),
        "rope_scaling_ignored": (
            "忽略了 RoPE 缩放",
            "夹具的 rope.scaling 给出了长上下文的频率（llama3、yarn、longrope、linear、dynamic），"
            "你的旋转却用了原始频率 base^(−2i/dims)（也没有注意力因子）。修正：按 transformers 的 "
            "ROPE_INIT_FUNCTIONS 计算 inv_freq（modeling_rope_utils.py）；attn rope 列出每一对缩放"
            "前后的频率。",
        ),
        "rope_wrong_band": (
            "RoPE 缩放：频段弄错",
            "llama3 的高低频段弄反（短波长被除以 factor），或中间频段没有平滑过渡；"
            "yarn 的斜坡弄反；longrope 用错了因子列表。修正：llama3 保留 "
            "λ < 原始长度/high_freq_factor，λ > 原始长度/low_freq_factor 的除以 factor，"
            "中间平滑过渡；attn rope 显示每一对所在的频段。",
        ),
        "rope_mscale_missing": (
            "RoPE 缩放：缺少 mscale",
            "yarn 或 longrope 的注意力因子（mscale）没有乘到 cos 和 sin 上，"
            "所以每个 logit 的旋转部分少乘了它的平方。"
            "修正：cos 和 sin 乘以注意力因子（transformers 的 attention_scaling）。",
        ),
    }
)
