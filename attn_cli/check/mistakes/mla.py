"""The mistakes of multi-head latent attention (DeepSeek V2/V3): the absorbed form written
without the RoPE split (the scores against the latent alone, k_rope's part left out, as when the
decoupled key is folded through W_UK), RoPE turned over the whole head instead of its rope
part, the scale taken from the nope dimensions only, and k_rope cut per head (laid out feature
by feature) instead of one k_rope shared whole by every head."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attn_cli.check.mistake import Mistake, register, register_zh
from attn_cli.check.recompute import Change, internal, recomputed
from attn_cli.core.plugins.mla import MLA, rope_interleaved
from attn_cli.core.variant import REGISTRY

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


def _mla(trace: Trace) -> MLA | None:
    value: MLA | None = REGISTRY["mla"].value(trace.inputs)
    return value


def _absorbed_without_rope(trace: Trace) -> list[Change]:
    if _mla(trace) is None:
        return []
    q_absorbed, c = internal(trace, "q_absorbed"), internal(trace, "c_KV_norm")
    scores = q_absorbed @ c[:, None].swapaxes(-1, -2)  # (B, H, T, S): the latent part only
    detail = (
        "Your {stage} is what attn gets from the absorbed form without the RoPE split: "
        "(q_nope·W_UKᵀ)·c_KV_normᵀ alone, k_rope's part left out. RoPE cannot pass through W_UK "
        "(a rotation by position does not commute with it), so DeepSeek keeps position in a "
        "separate key shared by all heads. Fix: scores = q_absorbed·c_KV_normᵀ + "
        "q_rope_rot·k_rope_rotᵀ."
    )
    return [Change(detail, "scores", {"scores": scores})]


def _rope_whole_head(trace: Trace) -> list[Change]:
    value = _mla(trace)
    if value is None:
        return []
    pos_q, pos_k = trace.inputs.token_positions()
    q = np.concatenate([internal(trace, "q_nope"), internal(trace, "q_rope")], axis=-1)
    H = q.shape[1]
    k_rope = np.broadcast_to(
        internal(trace, "k_rope")[:, None], (*internal(trace, "K_nope").shape[:3], value.d_rope)
    )
    k = np.concatenate([internal(trace, "K_nope"), k_rope], axis=-1)  # (B, H, S, D)
    Q, K = rope_interleaved(q, pos_q, value.base), rope_interleaved(k, pos_k, value.base)
    detail = (
        f"Your {{stage}} is what attn gets with RoPE turned over the whole head ({q.shape[-1]} "
        f"dimensions of each of the {H} heads) instead of its rope part ({value.d_rope}): "
        "K_nope comes from the latent, where no position may enter, or W_UK could not be "
        "absorbed into the query. Fix: rotate q_rope and k_rope only, then Q = [q_nope | "
        "q_rope_rot], K = [K_nope | k_rope_rot]."
    )
    return [Change(detail, "Q", {"Q": Q, "K": K})]


def _scale_nope_only(trace: Trace) -> list[Change]:
    value = _mla(trace)
    if value is None:
        return []
    d_nope = trace.inputs.d_k - value.d_rope
    scale = value.mscale**2 / np.sqrt(d_nope)
    if np.isclose(scale, trace.scale, rtol=1e-12):
        return []
    detail = (
        f"Your {{stage}} is what attn gets with the scale taken from the nope dimensions only: "
        f"1/√{d_nope} = {scale:.6g} where the scores are dot products over d_nope + d_rope = "
        f"{trace.inputs.d_k} dimensions. Fix: scale = mscale²/√(qk_nope_head_dim + "
        f"qk_rope_head_dim) = {trace.scale:.6g} (transformers' self.scaling)."
    )
    return [Change(detail, "scaled", {"scaled": internal(trace, "scores") * scale})]


def _k_rope_per_head(trace: Trace) -> list[Change]:
    value = _mla(trace)
    if value is None:
        return []
    K_nope = internal(trace, "K_nope")  # (B, H, S, d_nope)
    B, H, S, _ = K_nope.shape
    if H == 1:
        return []
    k_rot = internal(trace, "k_rope_rot")  # (B, S, d_rope)
    cut = np.repeat(k_rot, H, axis=-1).reshape(B, S, H, value.d_rope).transpose(0, 2, 1, 3)
    detail = (
        f"Your {{stage}} is what attn gets with k_rope cut per head: np.repeat(k_rope, {H}, "
        f"axis=-1) split into {H} heads gives head h its own {value.d_rope} numbers, repeated "
        "feature by feature, where DeepSeek shares one k_rope, whole, with every head "
        "(expand_kv's k_rot.expand). Fix: K = [K_nope[h] | k_rope_rot] for every head h."
    )
    K = np.concatenate([K_nope, cut], axis=-1)  # (B, H, S, D)
    return [Change(detail, "K", {"K": K, "Q": internal(trace, "Q")})]


register(
    "mla",
    Mistake(
        "mla_absorbed_without_rope",
        "MLA's absorbed form without the RoPE split",
        recomputed(_absorbed_without_rope),
        230,
    ),
    Mistake(
        "mla_rope_whole_head",
        "MLA's RoPE turned over the whole head",
        recomputed(_rope_whole_head),
        231,
    ),
    Mistake(
        "mla_scale_nope_only",
        "MLA's scale from the nope dims only",
        recomputed(_scale_nope_only),
        232,
    ),
    Mistake(
        "mla_k_rope_per_head",
        "MLA's k_rope per head instead of shared",
        recomputed(_k_rope_per_head),
        233,
    ),
)

register_zh(
    {
        "mla_absorbed_without_rope": (
            "MLA 的吸收形式没有拆出 RoPE 部分",
            "只算了 (q_nope·W_UKᵀ)·c_KV_normᵀ，漏掉了 k_rope 那一项。RoPE 无法穿过 W_UK，所以 Dee"
            "pSeek 把位置放在所有头共享的单独的键里。修正：scores = q_absorbed·c_KV_normᵀ + q_rope"
            "_rot·k_rope_rotᵀ。",
        ),
        "mla_rope_whole_head": (
            "MLA 的 RoPE 转了整个头",
            "RoPE 应只作用于 rope 部分；K_nope 来自潜向量，不能带位置，否则 W_UK 无法并入查询。"
            "修正：只旋转 q_rope 和 k_rope，再拼成 Q = [q_nope | q_rope_rot]、K = [K_nope | k_rop"
            "e_rot]。",
        ),
        "mla_scale_nope_only": (
            "MLA 的缩放只按 nope 维度计算",
            "分数是 d_nope + d_rope 维的点积，缩放应为 mscale²/√(qk_nope_head_dim + qk_rope_head_"
            "dim)（transformers 的 self.scaling）。修正：用整个头的维度。",
        ),
        "mla_k_rope_per_head": (
            "MLA 的 k_rope 被按头切开，而不是共享",
            "每个头得到了 k_rope 的一段（逐个特征重复），而 DeepSeek 让所有头共享同一个完整的 k"
            "_rope（expand_kv 中的 k_rot.expand）。修正：每个头 h 都用 K = [K_nope[h] | k_rope_ro"
            "t]。",
        ),
    }
)
