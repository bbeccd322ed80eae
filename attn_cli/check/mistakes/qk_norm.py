"""The mistakes of QK-norm (Qwen3, Gemma 3, OLMo 2: RMSNorm of Q and K before RoPE): eps outside
the square root or of another size, the norm over the other extent (each head vs the whole
projection), the weight left out or taken as 1 + weight (Gemma's convention), a LayerNorm
(mean subtracted), the norm on one of Q and K only, the norm after RoPE. Axis names as in
core/steps.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from attn_cli.check.compare import GRADER_TOLERANCE
from attn_cli.check.mistake import Mistake, register, register_zh
from attn_cli.check.recompute import Candidate, Change, candidate, internal, recomputed
from attn_cli.core.chain import Chain
from attn_cli.core.heads import merge_heads, split_heads
from attn_cli.core.inputs import FloatArray, QKNorm
from attn_cli.core.variant import QKAt

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace

COMMON_EPS = (1e-5, 1e-6, 1e-8, 1e-12, 0.0)  # Llama, Qwen3, Adam-style, BERT's LayerNorm, none


@dataclass(frozen=True)
class _Norm:
    """How a student's RMSNorm goes: eps inside or outside the square root, over each head or
    the whole projection, the weight as given, left out or plus one, the mean subtracted."""

    eps: float
    eps_outside: bool = False
    per_head: bool | None = None  # None: as the fixture's weight says
    weight: str = "as given"  # "as given", "none", "plus one"
    centred: bool = False  # LayerNorm: the mean subtracted first

    def __call__(self, x: FloatArray, w: FloatArray) -> FloatArray:
        """x (B, heads, n, D) normalised with the weight ``w`` of length D or heads*D."""
        H, D = x.shape[1], x.shape[-1]
        per_head = (w.shape[0] == D) if self.per_head is None else self.per_head
        if per_head and w.shape[0] != D:
            w = w.reshape(H, 1, D)  # the projection's weight cut into heads: (H, 1, D)
        if not per_head and w.shape[0] == D:
            w = np.tile(w, H)  # one head's weight repeated over the projection: (H*D,)
        y = x if per_head else merge_heads(x)  # (B, n, H*D) over the whole projection
        if self.centred:
            y = y - y.mean(axis=-1, keepdims=True)
        mean_sq = np.mean(y * y, axis=-1, keepdims=True)  # (..., 1)
        rms = np.sqrt(mean_sq) + self.eps if self.eps_outside else np.sqrt(mean_sq + self.eps)
        weight = {"as given": w, "none": 1.0, "plus one": 1.0 + w}[self.weight]
        if per_head:
            out: FloatArray = y / rms * weight  # (B, H, n, D)
            return out
        return split_heads(y / rms * weight, H)  # (B, H, n, D)


def _value(trace: Trace) -> QKNorm | None:
    value: QKNorm | None = trace.inputs.setting("qk_norm")
    return value


def _normed(trace: Trace, norm: _Norm, which: str = "QK") -> dict[str, FloatArray]:
    """Q_norm and K_norm as ``norm`` makes them from attn's Q and K (only those in ``which``;
    the other as attn's)."""
    value = _value(trace)
    assert value is not None
    out = {}
    for name, w in (("Q", value.q_weight), ("K", value.k_weight)):
        x = internal(trace, name)  # (B, heads, n, D)
        out[f"{name}_norm"] = norm(x, w) if name in which else internal(trace, f"{name}_norm")
    return out


def _changes(trace: Trace, norms: list[tuple[_Norm, str]]) -> list[Change]:
    return [Change(detail, "Q_norm", _normed(trace, norm)) for norm, detail in norms]


def _eps_outside(trace: Trace) -> list[Change]:
    value = _value(trace)
    if value is None:
        return []
    detail = (
        "Your {stage} is what attn gets with eps added outside the square root: x / "
        f"(sqrt(mean(x²)) + eps) instead of x / sqrt(mean(x²) + eps), eps = {value.eps:g}. "
        "RMSNorm (HF's Qwen3RMSNorm, LlamaRMSNorm) adds eps to the mean of the squares, "
        "inside: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps). Fix: move eps inside."
    )
    return _changes(trace, [(_Norm(value.eps, eps_outside=True), detail)])


def _eps_value(trace: Trace) -> list[Change]:
    value = _value(trace)
    if value is None:
        return []
    out: list[Change] = []
    seen: list[tuple[dict[str, FloatArray], list[float]]] = []
    for eps in (e for e in COMMON_EPS if e != value.eps):
        normed = _normed(trace, _Norm(eps))
        for other, alike in seen:  # eps values the numbers cannot tell apart are named together
            if all(
                np.allclose(normed[n], other[n], GRADER_TOLERANCE.rtol, GRADER_TOLERANCE.atol)
                for n in normed
            ):
                alike.append(eps)
                break
        else:
            seen.append((normed, [eps]))
    for normed, alike in seen:
        said = " or ".join(f"{e:g}" for e in alike)
        detail = (
            f"Your {{stage}} is what attn gets with the norm's eps = {said} instead of the "
            f"fixture's {value.eps:g}. Checkpoints differ (Qwen3 1e-6, Llama 1e-5, BERT's "
            "LayerNorm 1e-12): it is config.json's rms_norm_eps. Fix: eps = "
            f"{value.eps:g}."
        )
        out.append(Change(detail, "Q_norm", normed))
    return out


def _wrong_extent(trace: Trace) -> list[Change]:
    value = _value(trace)
    inp = trace.inputs
    if value is None or max(inp.heads, inp.kv_heads) == 1:
        return []  # one head: the head is the whole projection
    per_head = value.q_weight.shape[0] == inp.d_k
    said = (
        "each head on its own (a weight of d_k, Qwen3, Gemma 3)",
        "the whole projection, every head at once (a weight of heads*d_k, OLMo 2)",
    )
    detail = (
        f"Your {{stage}} is what attn gets with the norm over {said[per_head]} where the "
        f"fixture normalises {said[not per_head]}: the mean of x² is taken over another "
        "extent. Fix: Qwen3's q_norm is RMSNorm(head_dim) applied to q.view(..., heads, "
        "head_dim); OLMo 2's is RMSNorm(heads*head_dim) applied before the split."
    )
    return _changes(trace, [(_Norm(value.eps, per_head=not per_head), detail)])


def _weight(trace: Trace) -> list[Change]:
    value = _value(trace)
    if value is None:
        return []
    left_out = (
        "Your {stage} is what attn gets with the norm's weight left out: x / sqrt(mean(x²) + "
        "eps) alone. The learned weight (q_norm.weight, k_norm.weight) multiplies every "
        "dimension afterwards. Fix: multiply by q_weight (Q) and k_weight (K)."
    )
    plus_one = (
        "Your {stage} is what attn gets with the norm's weight taken as 1 + weight, Gemma's "
        "RMSNorm convention (Gemma3RMSNorm stores the weight around 0 and scales by 1 + w), on "
        "a weight stored as the scale itself (Qwen3, OLMo 2, and attn's fixtures). Fix: "
        "multiply by the weight as given."
    )
    return _changes(
        trace,
        [
            (_Norm(value.eps, weight="none"), left_out),
            (_Norm(value.eps, weight="plus one"), plus_one),
        ],
    )


def _layer_norm(trace: Trace) -> list[Change]:
    value = _value(trace)
    if value is None:
        return []
    detail = (
        "Your {stage} is what attn gets with a LayerNorm (the mean subtracted first) where the "
        "fixture has an RMSNorm: x / sqrt(mean(x²) + eps) * weight, no mean subtracted, no bias "
        "(Qwen3, OLMo 2; Cohere and some ViTs use LayerNorm for their q/k norms). Fix: do not "
        "centre x."
    )
    return _changes(trace, [(_Norm(value.eps, centred=True), detail)])


def _one_side(trace: Trace) -> list[Change]:
    value = _value(trace)
    if value is None:
        return []
    out = []
    for done, left in (("Q", "K"), ("K", "Q")):
        detail = (
            f"Your {{stage}} is what attn gets with only {done} normalised: {left}_norm is "
            f"{left} itself. QK-norm normalises both, each with its own weight "
            f"({left.lower()}_weight for {left}). Fix: {left}_norm = RMSNorm({left}) too."
        )
        values = _normed(trace, _Norm(value.eps), which=done)
        values[f"{left}_norm"] = internal(trace, left)  # (B, heads, n, D)
        out.append(Change(detail, "Q_norm", values))
    return out


def _after_rope(trace: Trace) -> list[Candidate]:
    """The positional transform (RoPE) first, then the norm: Q_rot = norm(rope(Q)); the user's
    Q_norm is either that too (named after the step it does) or not dumped."""
    value, inp = _value(trace), trace.inputs
    turn = next(((v, x) for v, x in Chain(inp).transforms_of("Q") if v.positional), None)
    if value is None or turn is None:
        return []
    rope, setting = turn
    pos = dict(zip("QK", inp.token_positions(), strict=True))
    norm = _Norm(value.eps)
    rotated: dict[str, FloatArray] = {}
    for which, w in (("Q", value.q_weight), ("K", value.k_weight)):
        turned = rope.transform(setting, QKAt(inp, which, pos[which]), internal(trace, which))
        rotated[f"{which}_{rope.suffix}"] = norm(turned, w)  # (B, heads, n, D)
    detail = (
        "Your {stage} is what attn gets with the norm applied after RoPE: norm(rope(Q)) "
        "instead of rope(norm(Q)). Qwen3, Gemma 3 and OLMo 2 normalise first, then rotate "
        "(HunYuan is the one that rotates first). The norm's weight does not commute with the "
        "rotation. Fix: q = rope(q_norm(q)), k = rope(k_norm(k))."
    )
    named = {**{f"{w}_norm": rotated[f"{w}_{rope.suffix}"] for w in "QK"}, **rotated}
    return [
        candidate(trace, detail, f"Q_{rope.suffix}", rotated),
        candidate(trace, detail, "Q_norm", named),
    ]


register(
    "qk_norm",
    Mistake(
        "qk_norm_eps_outside", "QK-norm eps outside the square root", recomputed(_eps_outside), 210
    ),
    Mistake("qk_norm_eps", "QK-norm eps of another size", recomputed(_eps_value), 211),
    Mistake(
        "qk_norm_extent",
        "QK-norm over the wrong extent (each head vs the whole projection)",
        recomputed(_wrong_extent),
        212,
    ),
    Mistake(
        "qk_norm_weight",
        "QK-norm weight left out, or taken as 1 + weight",
        recomputed(_weight),
        213,
    ),
    Mistake(
        "qk_norm_layernorm",
        "QK-norm as a LayerNorm (mean subtracted)",
        recomputed(_layer_norm),
        214,
    ),
    Mistake("qk_norm_one_side", "QK-norm on only one of Q and K", recomputed(_one_side), 215),
    Mistake("qk_norm_after_rope", "QK-norm applied after RoPE", _after_rope, 216),
)

register_zh(
    {
        "qk_norm_eps_outside": (
            "QK-norm 的 eps 放在了平方根外面",
            "写成 x / (sqrt(mean(x²)) + eps)；RMSNorm 把 eps 加在平方均值上、根号里面。修正：x * r"
            "sqrt(mean(x²) + eps)。",
        ),
        "qk_norm_eps": (
            "QK-norm 的 eps 大小不对",
            "eps 来自 config.json 的 rms_norm_eps（Qwen3 为 1e-6，Llama 为 1e-5）。修正：使用 fixt"
            "ure 的 eps。",
        ),
        "qk_norm_extent": (
            "QK-norm 归一化的范围不对（每个头与整个投影）",
            "Qwen3、Gemma 3 对每个头单独做 RMSNorm（权重长 d_k），OLMo 2 对整个投影做（权重长 head"
            "s·d_k）。修正：按 fixture 权重的长度选择范围。",
        ),
        "qk_norm_weight": (
            "QK-norm 的权重漏了，或当成了 1 + 权重",
            "RMSNorm 之后要乘学到的权重；Gemma 的约定是乘 1 + w，而这里的权重本身就是缩放。修正："
            "乘 fixture 给的权重。",
        ),
        "qk_norm_layernorm": (
            "QK-norm 做成了 LayerNorm（减了均值）",
            "fixture 是 RMSNorm：不减均值、没有偏置。修正：不要中心化 x。",
        ),
        "qk_norm_one_side": (
            "只对 Q 和 K 中的一个做了 QK-norm",
            "Q 和 K 都要归一化，各用自己的权重。修正：另一个也做 RMSNorm。",
        ),
        "qk_norm_after_rope": (
            "QK-norm 放在了 RoPE 之后",
            "Qwen3、Gemma 3、OLMo 2 先归一化再旋转（HunYuan 反过来）；权重与旋转不可交换。修正：q "
            "= rope(q_norm(q))，k = rope(k_norm(k))。",
        ),
    }
)
