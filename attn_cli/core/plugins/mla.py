"""Multi-head latent attention (DeepSeek V2/V3, HF ``DeepseekV3Attention``): Q, K and V made from
a small latent, a front end of the chain, and the absorbed form computed beside it.

The naive form, as transformers 5.24's ``DeepseekV3Attention.forward`` runs it::

    c_Q = X·W_DQ, c_Q_norm = RMSNorm(c_Q), Q = c_Q_norm·W_UQ   (q LoRA; else Q = X·W_Q)
    q_nope, q_rope = Q split per head (d_nope, d_rope)
    c_KV = X·W_DKV, c_KV_norm = RMSNorm(c_KV), k_rope = X·W_KR (one for all heads)
    K_nope = c_KV_norm·W_UK, V = c_KV_norm·W_UV                   (kv_b_proj, per head)
    q_rope_rot, k_rope_rot = RoPE of q_rope, k_rope (interleaved pairs, transformers' output
                             layout: the pairs' first numbers, then their second numbers)
    Q = [q_nope | q_rope_rot], K = [K_nope | k_rope_rot on every head]

then the chain (scores, scaled, masked, softmax, output) with DeepSeek's scale
1/√(d_nope + d_rope) × mscale². The absorbed form, what inference kernels run: W_UK folded into
the query and W_UV applied after attention, so attention reads the latent directly::

    q_absorbed = q_nope·W_UKᵀ (per head), scores_absorbed = q_absorbed·c_KV_normᵀ +
    q_rope_rot·k_rope_rotᵀ, output_latent = softmax·c_KV_norm, output_absorbed =
    output_latent·W_UV (per head)

The pipeline checks scores_absorbed against scores and output_absorbed against output on every
run (``side_equal``). Axes: B batch, H heads, T queries, S keys, r the latent (kv_lora_rank).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from attn_cli.core.heads import merge_heads, split_heads
from attn_cli.core.inputs import Inputs
from attn_cli.core.ops import grad_rms_norm, rms_norm
from attn_cli.core.plugins.parsing import (
    entries,
    fold_scaling,
    known_subkeys,
    plain,
    positive_number,
)
from attn_cli.core.roles import MAKES_QKV, TRANSFORMS_QK
from attn_cli.core.rope_scaling import RopeScaling, frequencies, parse_scaling
from attn_cli.core.stage_spec import StageSpec, number_text
from attn_cli.core.variant import (
    Cast,
    DecodeForm,
    FixtureKey,
    FloatArray,
    FrontEnd,
    IntArray,
    SideForm,
    Traced,
    register,
)

DOC = (
    "a mapping {W_DQ, q_norm, W_UQ (q LoRA) or W_Q; W_DKV, kv_norm, W_UK, W_UV, W_KR; "
    "optional base, eps, mscale, scaling, rope_layout}"
)
SUBKEYS = (
    "W_DQ",
    "q_norm",
    "W_UQ",
    "W_Q",
    "W_DKV",
    "kv_norm",
    "W_UK",
    "W_UV",
    "W_KR",
    "base",
    "eps",
    "mscale",
    "scaling",
    "rope_layout",
)
# where each rotated pair's two numbers go: "split" as transformers' deepseek_v3
# (apply_rotary_pos_emb_interleave: the pairs' first numbers, then their second numbers),
# "pairs" as its deepseek_v2 (view_as_complex: each pair stays in place)
ROPE_LAYOUTS = ("split", "pairs")
WEIGHTS = ("W_DQ", "q_norm", "W_UQ", "W_Q", "W_DKV", "kv_norm", "W_UK", "W_UV", "W_KR")


@dataclass(frozen=True, eq=False)
class MLA:
    """The layer's weights in attn's layout (``Q = X @ W``) and its settings."""

    W_DQ: FloatArray | None  # (d_model, q_rank): q LoRA's down-projection (q_a_proj)
    q_norm: FloatArray | None  # (q_rank,): its RMSNorm weight (q_a_layernorm)
    W_UQ: FloatArray | None  # (q_rank, H*(d_nope+d_rope)) (q_b_proj); None: W_Q (q_proj)
    W_Q: FloatArray | None  # (d_model, H*(d_nope+d_rope))
    W_DKV: FloatArray  # (d_model, r): kv_a_proj_with_mqa's first r columns
    kv_norm: FloatArray  # (r,): kv_a_layernorm
    W_UK: FloatArray  # (r, H*d_nope): kv_b_proj's key rows
    W_UV: FloatArray  # (r, H*d_v): kv_b_proj's value rows
    W_KR: FloatArray  # (d_model, d_rope): kv_a_proj_with_mqa's last d_rope columns
    base: float = 10000.0
    eps: float = 1e-6  # DeepseekV3RMSNorm's default: q_a_layernorm and kv_a_layernorm keep it
    mscale: float = 1.0  # yarn's mscale (mscale_all_dim): the softmax scale times mscale²
    # RoPE scaling of the rope dims (DeepSeek V3's yarn), as rope.scaling; None: plain RoPE
    scaling: RopeScaling | None = None
    rope_layout: str = "split"  # ROPE_LAYOUTS: where each rotated pair's numbers are written

    @property
    def d_rope(self) -> int:
        return int(self.W_KR.shape[1])

    @property
    def rank(self) -> int:
        return int(self.W_DKV.shape[1])

    @property
    def lora(self) -> bool:
        return self.W_DQ is not None


def rope_interleaved(
    x: FloatArray,
    positions: IntArray,
    base: float,
    scaling: RopeScaling | None = None,
    layout: str = "split",
) -> FloatArray:
    """RoPE of pairs (x0, x1), (x2, x3), ... laid out as transformers 5.24's
    ``apply_rotary_pos_emb_interleave`` returns them (layout "split", deepseek_v3):
    [x_even·cos − x_odd·sin | x_odd·cos + x_even·sin]; or as its deepseek_v2's
    ``apply_rotary_emb`` (layout "pairs": view_as_complex times e^(iθ)), each rotated pair in
    place. ``x`` (..., n, D) at ``positions`` (n,); with ``scaling`` the frequencies its kind
    gives and cos, sin times its attention factor (DeepseekV3RotaryEmbedding's
    attention_scaling), for a sequence of max(positions) + 1 positions."""
    D = x.shape[-1]
    length = int(positions.max()) + 1 if positions.size else 1
    inv_freq, factor = frequencies(scaling, D, base, length)  # (D/2,)
    angle = positions.astype(np.float64)[:, None] * inv_freq  # (n, D/2)
    cos, sin = (np.cos(angle) * factor).astype(x.dtype), (np.sin(angle) * factor).astype(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., n, D/2)
    first, second = even * cos - odd * sin, odd * cos + even * sin
    if layout == "pairs":
        paired: FloatArray = np.stack([first, second], axis=-1).reshape(x.shape)
        return paired  # (x0', x1', x2', ...)
    return np.concatenate([first, second], axis=-1)


def naive(value: MLA, heads: int, X: FloatArray, pos: IntArray, cast: Cast) -> dict[str, Any]:
    """The naive form's stages, and Q, K, V, from X (B, T, d_model)."""
    w = {n: cast(f"mla.{n}", a) for n in WEIGHTS if (a := getattr(value, n)) is not None}
    out: dict[str, Any] = {}
    # 1) the query path: through q LoRA's latent and its norm, or straight from X
    if value.lora:
        out["c_Q"] = X @ w["W_DQ"]  # (B, T, q_rank)
        out["c_Q_norm"] = rms_norm(out["c_Q"], w["q_norm"], value.eps, divide=True)
        q = split_heads(out["c_Q_norm"] @ w["W_UQ"], heads)  # (B, H, T, d_nope + d_rope)
    else:
        q = split_heads(X @ w["W_Q"], heads)  # (B, H, T, d_nope + d_rope)
    d_nope = q.shape[-1] - value.d_rope
    out["q_nope"], out["q_rope"] = q[..., :d_nope], q[..., d_nope:]  # (B, H, T, ·)
    # 2) the latent and the decoupled RoPE key, one for all heads
    out["c_KV"] = X @ w["W_DKV"]  # (B, S, r)
    out["c_KV_norm"] = rms_norm(out["c_KV"], w["kv_norm"], value.eps, divide=True)
    out["k_rope"] = X @ w["W_KR"]  # (B, S, d_rope)
    # 3) decompressed per head: K_nope and V
    out["K_nope"] = split_heads(out["c_KV_norm"] @ w["W_UK"], heads)  # (B, H, S, d_nope)
    out["V"] = split_heads(out["c_KV_norm"] @ w["W_UV"], heads)  # (B, H, S, d_v)
    # 4) RoPE on the rope parts only, then q and k joined
    rope = (value.base, value.scaling, value.rope_layout)
    out["q_rope_rot"] = rope_interleaved(out["q_rope"], pos, *rope)
    out["k_rope_rot"] = rope_interleaved(out["k_rope"], pos, *rope)
    out["Q"] = np.concatenate([out["q_nope"], out["q_rope_rot"]], axis=-1)  # (B, H, T, D)
    k_rope = np.broadcast_to(out["k_rope_rot"][:, None], (*out["K_nope"].shape[:3], value.d_rope))
    out["K"] = np.concatenate([out["K_nope"], k_rope], axis=-1)  # (B, H, S, D)
    return out


def absorbed(
    value: MLA, heads: int, arrays: Mapping[str, FloatArray], scale: float, cast: Cast
) -> dict[str, FloatArray]:
    """The absorbed form: attention over the latent, W_UK folded into q, W_UV after."""
    r = value.rank
    W_UK = cast("mla.W_UK", value.W_UK).reshape(r, heads, -1).transpose(1, 0, 2)  # (H, r, nope)
    W_UV = cast("mla.W_UV", value.W_UV).reshape(r, heads, -1).transpose(1, 0, 2)  # (H, r, d_v)
    c_kv = arrays["c_KV_norm"][:, None]  # (B, 1, S, r): one latent for every head
    q_absorbed = arrays["q_nope"] @ W_UK.transpose(0, 2, 1)  # (B, H, T, r)
    k_rope = arrays["k_rope_rot"][:, None]  # (B, 1, S, d_rope)
    scores = q_absorbed @ c_kv.swapaxes(-1, -2) + arrays["q_rope_rot"] @ k_rope.swapaxes(-1, -2)
    output_latent = arrays["softmax"] @ c_kv  # (B, H, T, r)
    return {
        "q_absorbed": q_absorbed,
        "scores_absorbed": scores,  # (B, H, T, S)
        "output_latent": output_latent,
        "output_absorbed": output_latent @ W_UV,
    }


def rms_norm_backward(
    d_y: FloatArray, x: FloatArray, weight: FloatArray, eps: float
) -> tuple[FloatArray, FloatArray]:
    """y = w ⊙ x / r, r = √(mean(x²) + eps)  =>  d_x (QK-norm's RMSNorm backward) and
    d_w = Σ over tokens of d_y ⊙ x / r."""
    r = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)  # (..., 1)
    d_w: FloatArray = (d_y * (x / r)).reshape(-1, x.shape[-1]).sum(axis=0)  # (n,)
    return grad_rms_norm(d_y, x, weight, eps), d_w


def rope_interleaved_backward(
    d_out: FloatArray,
    positions: IntArray,
    base: float,
    scaling: RopeScaling | None = None,
    layout: str = "split",
) -> FloatArray:
    """The transpose of :func:`rope_interleaved`: from d[a | b] (a = even·cos − odd·sin,
    b = odd·cos + even·sin) to d_even = d_a·cos + d_b·sin, d_odd = d_b·cos − d_a·sin,
    interleaved back into pairs."""
    D = d_out.shape[-1]
    length = int(positions.max()) + 1 if positions.size else 1
    inv_freq, factor = frequencies(scaling, D, base, length)  # (D/2,)
    angle = positions.astype(np.float64)[:, None] * inv_freq  # (n, D/2)
    cos = (np.cos(angle) * factor).astype(d_out.dtype)
    sin = (np.sin(angle) * factor).astype(d_out.dtype)
    if layout == "pairs":  # deepseek_v2's: each pair's (first, second) numbers in place
        d_a, d_b = d_out[..., 0::2], d_out[..., 1::2]  # (..., n, D/2)
    else:
        d_a, d_b = d_out[..., : D // 2], d_out[..., D // 2 :]
    d_x = np.empty_like(d_out)
    d_x[..., 0::2] = d_a * cos + d_b * sin
    d_x[..., 1::2] = d_b * cos - d_a * sin
    return d_x


def _linear_back(d: FloatArray, x: FloatArray, W: FloatArray) -> tuple[FloatArray, FloatArray]:
    """out = x·W  =>  d_x = d·Wᵀ, d_W = xᵀ·d over batch and tokens."""
    d_W: FloatArray = np.einsum("bti,bto->io", x, d)  # (in, out)
    return d @ W.T, d_W  # (B, T, in), (in, out)


def naive_backward(
    value: MLA,
    heads: int,
    grads: Mapping[str, FloatArray],
    arrays: Mapping[str, FloatArray],
    pos: IntArray,
    cast: Cast,
) -> dict[str, FloatArray]:
    """The naive form's gradients, from d_Q (B, H, T, D), d_K (B, H, S, D), d_V (B, H, S, Dv)
    back to X and every weight of the layer, in the order the backward computes them."""
    w = {n: cast(f"mla.{n}", a) for n in WEIGHTS if (a := getattr(value, n)) is not None}
    d_Q, d_K, d_V = grads["d_Q"], grads["d_K"], grads["d_V"]
    X = arrays["X"]
    nope = d_Q.shape[-1] - value.d_rope
    out: dict[str, FloatArray] = {}
    # 1) Q = [q_nope | q_rope_rot], K = [K_nope | k_rope_rot on every head]: split; the shared
    # RoPE key gathers every head's gradient
    out["d_q_nope"], out["d_q_rope_rot"] = d_Q[..., :nope], d_Q[..., nope:]
    out["d_K_nope"] = d_K[..., :nope]  # (B, H, S, d_nope)
    out["d_k_rope_rot"] = d_K[..., nope:].sum(axis=1)  # (B, S, d_rope)
    # 2) back through RoPE: the rotation by −angle
    # back in the layout the forward wrote each rotated pair in (deepseek_v2: pairs in place)
    rot = (value.base, value.scaling, value.rope_layout)
    out["d_q_rope"] = rope_interleaved_backward(out["d_q_rope_rot"], pos, *rot)
    out["d_k_rope"] = rope_interleaved_backward(out["d_k_rope_rot"], pos, *rot)
    # 3) the latent: K_nope = c_KV_norm·W_UK, V = c_KV_norm·W_UV, then its RMSNorm
    c = arrays["c_KV_norm"]  # (B, S, r)
    d_c_uk, out["d_W_UK"] = _linear_back(merge_heads(out["d_K_nope"]), c, w["W_UK"])
    d_c_uv, out["d_W_UV"] = _linear_back(merge_heads(d_V), c, w["W_UV"])
    out["d_c_KV_norm"] = d_c_uk + d_c_uv  # (B, S, r)
    out["d_c_KV"], out["d_kv_norm"] = rms_norm_backward(
        out["d_c_KV_norm"], arrays["c_KV"], w["kv_norm"], value.eps
    )
    # 4) the query path: [q_nope | q_rope] per head, heads side by side as W_UQ's columns
    d_q = merge_heads(np.concatenate([out["d_q_nope"], out["d_q_rope"]], axis=-1))  # (B, T, ·)
    if value.lora:
        d_cq, out["d_W_UQ"] = _linear_back(d_q, arrays["c_Q_norm"], w["W_UQ"])
        out["d_c_Q_norm"] = d_cq  # (B, T, q_rank)
        out["d_c_Q"], out["d_q_norm"] = rms_norm_backward(
            d_cq, arrays["c_Q"], w["q_norm"], value.eps
        )
        d_X_q, out["d_W_DQ"] = _linear_back(out["d_c_Q"], X, w["W_DQ"])
    else:
        d_X_q, out["d_W_Q"] = _linear_back(d_q, X, w["W_Q"])
    # 5) into X: the query path, the latent's and the RoPE key's
    d_X_kv, out["d_W_DKV"] = _linear_back(out["d_c_KV"], X, w["W_DKV"])
    d_X_r, out["d_W_KR"] = _linear_back(out["d_k_rope"], X, w["W_KR"])
    out["d_X"] = d_X_q + d_X_kv + d_X_r  # (B, T, d_model)
    return out


_LATENT_Q = ("batch", "head", "query", "kv_lora_rank")
_FRONT: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("c_Q", ("X",), ("batch", "query", "q_lora_rank")),
    ("c_Q_norm", ("c_Q",), ("batch", "query", "q_lora_rank")),
    ("q_nope", ("c_Q_norm", "X"), ("batch", "head", "query", "d_nope")),
    ("q_rope", ("c_Q_norm", "X"), ("batch", "head", "query", "d_rope")),
    ("c_KV", ("X",), ("batch", "key", "kv_lora_rank")),
    ("c_KV_norm", ("c_KV",), ("batch", "key", "kv_lora_rank")),
    ("k_rope", ("X",), ("batch", "key", "d_rope")),
    ("K_nope", ("c_KV_norm",), ("batch", "head", "key", "d_nope")),
    ("q_rope_rot", ("q_rope",), ("batch", "head", "query", "d_rope")),
    ("k_rope_rot", ("k_rope",), ("batch", "key", "d_rope")),
)
_SIDE: tuple[tuple[str, tuple[str, ...], tuple[str, ...], bool], ...] = (
    ("q_absorbed", ("q_nope",), _LATENT_Q, False),
    (
        "scores_absorbed",
        ("q_absorbed", "c_KV_norm", "q_rope_rot", "k_rope_rot"),
        ("batch", "head", "query", "key"),
        False,
    ),
    ("output_latent", ("softmax", "c_KV_norm"), _LATENT_Q, False),
    ("output_absorbed", ("output_latent",), ("batch", "head", "query", "d_v"), False),
)
# the backward's rows, in the order it computes them: name, needs, axes, formula
_GRAD: tuple[tuple[str, tuple[str, ...], tuple[str, ...], str], ...] = (
    ("d_q_nope", ("d_Q",), ("batch", "head", "query", "d_nope"), "d_q_nope = d_Q[:, :d_nope]"),
    (
        "d_q_rope_rot",
        ("d_Q",),
        ("batch", "head", "query", "d_rope"),
        "d_q_rope_rot = d_Q[:, d_nope:]",
    ),
    ("d_K_nope", ("d_K",), ("batch", "head", "key", "d_nope"), "d_K_nope = d_K[:, :d_nope]"),
    (
        "d_k_rope_rot",
        ("d_K",),
        ("batch", "key", "d_rope"),
        "d_k_rope_rot = Σ_h d_K[h][:, d_nope:] (one key for all heads)",
    ),
    (
        "d_q_rope",
        ("d_q_rope_rot",),
        ("batch", "head", "query", "d_rope"),
        "d_q_rope = RoPE⁻¹(d_q_rope_rot), each pair turned back by its angle",
    ),
    (
        "d_k_rope",
        ("d_k_rope_rot",),
        ("batch", "key", "d_rope"),
        "d_k_rope = RoPE⁻¹(d_k_rope_rot), each pair turned back by its angle",
    ),
    (
        "d_W_UK",
        ("d_K_nope", "c_KV_norm"),
        ("kv_lora_rank", "heads*d_nope"),
        "d_W_UK = c_KV_normᵀ·d_K_nope (heads side by side)",
    ),
    (
        "d_W_UV",
        ("d_V", "c_KV_norm"),
        ("kv_lora_rank", "heads*d_v"),
        "d_W_UV = c_KV_normᵀ·d_V (heads side by side)",
    ),
    (
        "d_c_KV_norm",
        ("d_K_nope", "d_V"),
        ("batch", "key", "kv_lora_rank"),
        "d_c_KV_norm = d_K_nope·W_UKᵀ + d_V·W_UVᵀ (every head's)",
    ),
    (
        "d_c_KV",
        ("d_c_KV_norm", "c_KV"),
        ("batch", "key", "kv_lora_rank"),
        "d_c_KV = (g − c_KV·mean(g ⊙ c_KV)/ρ²)/ρ, g = kv_norm ⊙ d_c_KV_norm, "
        "ρ = √(mean(c_KV²) + eps)",
    ),
    (
        "d_kv_norm",
        ("d_c_KV_norm", "c_KV"),
        ("kv_lora_rank",),
        "d_kv_norm = Σ_t d_c_KV_norm ⊙ c_KV/ρ",
    ),
    (
        "d_W_UQ",
        ("d_q_nope", "d_q_rope", "c_Q_norm"),
        ("q_lora_rank", "heads*d_k"),
        "d_W_UQ = c_Q_normᵀ·[d_q_nope | d_q_rope] (heads side by side)",
    ),
    (
        "d_c_Q_norm",
        ("d_q_nope", "d_q_rope"),
        ("batch", "query", "q_lora_rank"),
        "d_c_Q_norm = [d_q_nope | d_q_rope]·W_UQᵀ",
    ),
    (
        "d_c_Q",
        ("d_c_Q_norm", "c_Q"),
        ("batch", "query", "q_lora_rank"),
        "d_c_Q = (g − c_Q·mean(g ⊙ c_Q)/ρ²)/ρ, g = q_norm ⊙ d_c_Q_norm, ρ = √(mean(c_Q²) + eps)",
    ),
    ("d_q_norm", ("d_c_Q_norm", "c_Q"), ("q_lora_rank",), "d_q_norm = Σ_t d_c_Q_norm ⊙ c_Q/ρ"),
    ("d_W_DQ", ("d_c_Q", "X"), ("d_model", "q_lora_rank"), "d_W_DQ = Xᵀ·d_c_Q"),
    ("d_W_DKV", ("d_c_KV", "X"), ("d_model", "kv_lora_rank"), "d_W_DKV = Xᵀ·d_c_KV"),
    ("d_W_KR", ("d_k_rope", "X"), ("d_model", "d_rope"), "d_W_KR = Xᵀ·d_k_rope"),
)
_GRAD_LORA = ("d_W_UQ", "d_c_Q_norm", "d_c_Q", "d_q_norm", "d_W_DQ")
_FORMULAS = {
    "c_Q": "c_Q = X·W_DQ",
    "c_Q_norm": "c_Q_norm = q_norm ⊙ c_Q / √(mean(c_Q²) + eps)",
    "c_KV": "c_KV = X·W_DKV",
    "c_KV_norm": "c_KV_norm = kv_norm ⊙ c_KV / √(mean(c_KV²) + eps)",
    "k_rope": "k_rope = X·W_KR (one for all heads)",
    "K_nope": "K_nope = c_KV_norm·W_UK",
    "q_rope_rot": "q_rope_rot = RoPE(q_rope), interleaved pairs",
    "k_rope_rot": "k_rope_rot = RoPE(k_rope), interleaved pairs",
    "Q": "Q = [q_nope | q_rope_rot]",
    "K": "K = [K_nope | k_rope_rot on every head]",
    "V": "V = c_KV_norm·W_UV",
    "q_absorbed": "q_absorbed = q_nope·W_UKᵀ (W_UK absorbed into the query)",
    "scores_absorbed": "scores_absorbed = q_absorbed·c_KV_normᵀ + q_rope_rot·k_rope_rotᵀ",
    "output_latent": "output_latent = softmax·c_KV_norm",
    "output_absorbed": "output_absorbed = output_latent·W_UV",
}


class LatentAttention(FrontEnd[MLA], SideForm[MLA]):
    order = 5
    name = "mla"
    array_parts = WEIGHTS
    subkeys = SUBKEYS
    key_order = 75
    front_stages = tuple(n for n, _, _ in _FRONT)
    side_stages = tuple(n for n, _, _, _ in _SIDE)
    side_equal = (("scores_absorbed", "scores"), ("output_absorbed", "output"))
    # it makes Q and K itself (its own RoPE part): no Q/K transform, no other front end
    cannot_run_with = frozenset({TRANSFORMS_QK, MAKES_QKV})
    front_gradients = tuple(n for n, _, _, _ in _GRAD)
    front_reads = ("X", "c_Q", "c_Q_norm", "c_KV", "c_KV_norm")

    def latent_sizes(self, value: MLA, heads: int) -> tuple[int, int]:
        d_nope = int(value.W_UK.shape[1]) // heads
        return d_nope + value.d_rope, int(value.W_UV.shape[1]) // heads

    def parse(self, raw: Any, key: FixtureKey) -> MLA:
        value = fold_scaling(entries(raw, key, DOC), key, "mla.scaling")
        known_subkeys(value, key, self.name, self.subkeys)
        return _Parser(key, value).mla()

    def config(self, value: MLA, inputs: Inputs) -> dict[str, Any]:
        out: dict[str, Any] = {
            "q_lora_rank": None if value.W_DQ is None else int(value.W_DQ.shape[1]),
            "kv_lora_rank": value.rank,
            "qk_rope_head_dim": value.d_rope,
            "qk_nope_head_dim": inputs.d_k - value.d_rope,
            "v_head_dim": inputs.d_v,
            "base": value.base,
            "eps": value.eps,
            "mscale": value.mscale,
        }
        if value.scaling is not None:
            out["scaling"] = value.scaling.config()
        if value.rope_layout != "split":
            out["rope_layout"] = value.rope_layout
        return out

    def stage_rows(self) -> tuple[StageSpec, ...]:
        on = self.applies
        rows = [
            StageSpec(n, needs, axes, False, n, self._lora(n), self.formula_of(n))
            for n, needs, axes in _FRONT
        ]
        rows += [
            StageSpec(n, needs, axes, score, n, on, self.formula_of(n))
            for n, needs, axes, score in _SIDE
        ]
        rows += [
            StageSpec(n, needs, axes, False, n, self._lora(n), self.formula_of(n), gradient=True)
            for n, needs, axes, _ in _GRAD
        ]
        return tuple(rows)

    def _lora(self, stage: str) -> Any:
        if stage not in ("c_Q", "c_Q_norm", *_GRAD_LORA):
            return self.applies
        return lambda inputs: (v := self.value(inputs)) is not None and v.lora

    def stage_formula(self, value: MLA, inputs: Inputs, stage: str) -> str:
        if stage.startswith("d_"):
            return self._grad_formula(value, stage)
        if stage in ("q_nope", "q_rope"):
            part = "[:, :d_nope]" if stage == "q_nope" else "[:, d_nope:]"
            source = "c_Q_norm·W_UQ" if value.lora else "X·W_Q"
            return f"{stage} = ({source}){part} per head"
        if stage in ("q_rope_rot", "k_rope_rot"):
            text = _FORMULAS[stage] + (" kept in place" if value.rope_layout == "pairs" else "")
            if value.scaling is None:
                return text
            length = int(inputs.token_positions()[0].max()) + 1
            _, attention = frequencies(value.scaling, value.d_rope, value.base, length)
            times = f", cos and sin × {number_text(attention)}" if attention != 1.0 else ""
            return f"{text}, {value.scaling.kind} scaling{times}"
        return _FORMULAS[stage]

    def _grad_formula(self, value: MLA, stage: str) -> str:
        if stage == "d_X":
            q = "d_c_Q·W_DQᵀ" if value.lora else "[d_q_nope | d_q_rope]·W_Qᵀ"
            return f"d_X = {q} + d_c_KV·W_DKVᵀ + d_k_rope·W_KRᵀ"
        if stage == "d_W_Q":
            return "d_W_Q = Xᵀ·[d_q_nope | d_q_rope] (heads side by side)"
        return next(f for n, _, _, f in _GRAD if n == stage)

    def grad_front(
        self, value: MLA, run: Traced, grads: Mapping[str, FloatArray]
    ) -> dict[str, FloatArray]:
        pos = run.inputs.token_positions()[0]
        return naive_backward(value, run.inputs.heads, grads, run.arrays, pos, run.cast)

    def front_fills(self, value: MLA, gradient: str) -> bool:
        return gradient == "d_W_Q" and not value.lora

    def default_scale(self, value: MLA, inputs: Inputs) -> float:
        """DeepSeek's: 1/√(d_nope + d_rope), times yarn's mscale² (``yarn_apply_mscale``)."""
        return value.mscale * value.mscale / math.sqrt(inputs.d_k)

    def front(
        self, value: MLA, inputs: Inputs, X: FloatArray, positions: IntArray, cast: Cast
    ) -> dict[str, FloatArray]:
        return naive(value, inputs.heads, X, positions, cast)

    def side(self, value: MLA, run: Traced, scale: float) -> dict[str, FloatArray]:
        return absorbed(value, run.inputs.heads, run.arrays, scale, run.cast)

    decode_stages = ("q_nope", "q_rope_rot", "c_KV_norm", "k_rope_rot")

    def decode_form(self, value: MLA, run: Traced) -> DecodeForm:
        """Decoding as DeepSeek's inference runs it: the cache holds each token's latent c_KV
        (normed) and its rotated RoPE key, r + d_rope numbers for all heads; each step's query
        is q_nope·W_UKᵀ beside q_rope_rot, attends over [c_KV_norm | k_rope_rot] (one cache
        head, every query head reads it) with the values the latent itself, and W_UV turns
        each head's softmax·c_KV_norm into its output."""
        r, H, arrays, cast = value.rank, run.inputs.heads, run.arrays, run.cast
        W_UK = cast("mla.W_UK", value.W_UK).reshape(r, H, -1).transpose(1, 0, 2)  # (H, r, nope)
        W_UV = cast("mla.W_UV", value.W_UV).reshape(r, H, -1).transpose(1, 0, 2)  # (H, r, d_v)
        q_absorbed = arrays["q_nope"] @ W_UK.transpose(0, 2, 1)  # (B, H, T, r)
        q = np.concatenate([q_absorbed, arrays["q_rope_rot"]], axis=-1)  # (B, H, T, r + d_rope)
        c_kv = arrays["c_KV_norm"][:, None]  # (B, 1, T, r)
        k = np.concatenate([c_kv, arrays["k_rope_rot"][:, None]], axis=-1)  # (B, 1, T, r + d_rope)

        def finish(latent: FloatArray) -> FloatArray:
            out: FloatArray = latent @ W_UV  # (B, H, n, r) @ (H, r, d_v)
            return out

        return DecodeForm(q, k, c_kv, finish, r + value.d_rope, "[c_KV_norm | k_rope_rot]")

    def refuses(self, value: MLA, inputs: Inputs, what: str) -> tuple[str, str, str] | None:
        kind = None if value.scaling is None else value.scaling.kind
        if what == "decoding" and kind in ("dynamic", "longrope"):
            return (
                "mla.scaling",
                f"{kind} frequencies follow the sequence's length, and a KV "
                "cache keeps keys rotated at the old ones",
                "no scaling, or linear, llama3 or yarn (attn trace shows the whole sequence)",
            )
        if what in ("decoding", "the backward pass", "FlashAttention"):
            return None  # flash tiles the naive form's Q, K, V, as prefill kernels run MLA
        return (
            self.name,
            f"{what} does not yet run multi-head latent attention",
            "a fixture without mla (attn trace shows every stage of it)",
        )


class _Parser:
    """The mla key's checks, each a one-line error naming ``mla.<subkey>``."""

    def __init__(self, key: FixtureKey, value: Mapping[str, Any]) -> None:
        self.key, self.value = key, value
        self.d_model = getattr(key, "d_model", None)

    def matrix(self, name: str, rows: int | None, doc: str) -> FloatArray:
        if name not in self.value:
            raise self.key("missing", f"{name} in {DOC}", f"mla.{name}")
        raw = self.value[name]
        numeric = isinstance(raw, np.ndarray) and raw.dtype.kind in "iuf"
        arr = self.key.floats(raw if numeric else plain(raw), f"mla.{name}", (2,), doc)
        if rows is not None and arr.shape[0] != rows:
            raise self.key(f"has {arr.shape[0]} rows", doc, f"mla.{name}")
        if arr.shape[1] == 0:
            raise self.key("has no columns", doc, f"mla.{name}")
        return arr

    def vector(self, name: str, n: int) -> FloatArray:
        doc = f"a vector of {n} (the RMSNorm weight)"
        if name not in self.value:
            raise self.key("missing", f"{name} in {DOC}", f"mla.{name}")
        raw = self.value[name]
        numeric = isinstance(raw, np.ndarray) and raw.dtype.kind in "iuf"
        arr = self.key.floats(raw if numeric else plain(raw), f"mla.{name}", (1,), doc)
        if arr.shape[0] != n:
            raise self.key(f"has length {arr.shape[0]}", doc, f"mla.{name}")
        return arr

    def columns(self, name: str, arr: FloatArray, per: str) -> int:
        H = self.key.heads
        if arr.shape[1] % H:
            raise self.key(
                f"has {arr.shape[1]} columns, not divisible by heads = {H}",
                f"heads*{per} columns",
                f"mla.{name}",
            )
        return int(arr.shape[1]) // H

    def mla(self) -> MLA:
        if self.d_model is None:
            raise self.key(
                "given with Q, K and V directly",
                "X alongside it (MLA projects queries, the latent and k_rope from X)",
            )
        d, v = self.d_model, self.value
        W_KR = self.matrix("W_KR", d, f"a matrix [d_model, d_rope] = [{d}, d_rope]")
        d_rope = int(W_KR.shape[1])
        if d_rope % 2:
            raise self.key(f"has {d_rope} columns", "an even d_rope (RoPE turns pairs)", "mla.W_KR")
        W_DKV = self.matrix("W_DKV", d, f"a matrix [d_model, kv_lora_rank] = [{d}, r]")
        r = int(W_DKV.shape[1])
        kv_norm = self.vector("kv_norm", r)
        W_UK = self.matrix("W_UK", r, f"a matrix [kv_lora_rank, heads*d_nope] = [{r}, ...]")
        d_nope = self.columns("W_UK", W_UK, "d_nope")
        W_UV = self.matrix("W_UV", r, f"a matrix [kv_lora_rank, heads*d_v] = [{r}, ...]")
        self.columns("W_UV", W_UV, "d_v")
        width = self.key.heads * (d_nope + d_rope)
        q_doc = f"heads*(d_nope + d_rope) = {self.key.heads}*({d_nope} + {d_rope}) = {width}"
        W_DQ = q_norm = W_UQ = W_Q = None
        if "W_DQ" in v:
            if "W_Q" in v:
                raise self.key(
                    "given with W_DQ", "either W_DQ, q_norm, W_UQ (q LoRA) or W_Q", "mla.W_Q"
                )
            W_DQ = self.matrix("W_DQ", d, f"a matrix [d_model, q_lora_rank] = [{d}, ...]")
            q_norm = self.vector("q_norm", int(W_DQ.shape[1]))
            W_UQ = self.matrix("W_UQ", int(W_DQ.shape[1]), f"a matrix [q_lora_rank, {q_doc}]")
            q_name, q_cols = "W_UQ", W_UQ.shape[1]
        else:
            for name in ("q_norm", "W_UQ"):
                if name in v:
                    raise self.key(
                        "given without W_DQ",
                        "W_DQ, q_norm and W_UQ together (q LoRA)",
                        f"mla.{name}",
                    )
            W_Q = self.matrix("W_Q", d, f"a matrix [d_model, {q_doc}]")
            q_name, q_cols = "W_Q", W_Q.shape[1]
        if q_cols != width:
            raise self.key(f"has {q_cols} columns", q_doc, f"mla.{q_name}")
        settings: dict[str, Any] = {
            n: positive_number(v[n], self.key, what, f"mla.{n}")
            for n, what in (
                ("base", "RoPE's base"),
                ("eps", "RMSNorm's epsilon"),
                ("mscale", "yarn's mscale"),
            )
            if n in v
        }
        if "scaling" in v:
            base = settings.get("base", 10000.0)
            settings["scaling"] = parse_scaling(v["scaling"], self.key, d_rope, base, "mla.scaling")
        if "rope_layout" in v:
            layout = plain(v["rope_layout"])
            if layout not in ROPE_LAYOUTS:
                raise self.key(
                    f"got {self.key.describe(layout)}",
                    '"split" (deepseek_v3: the '
                    'pairs\' first numbers, then their second) or "pairs" (deepseek_v2: '
                    "each pair in place)",
                    "mla.rope_layout",
                )
            settings["rope_layout"] = layout
        return MLA(W_DQ, q_norm, W_UQ, W_Q, W_DKV, kv_norm, W_UK, W_UV, W_KR, **settings)


register(LatentAttention())
