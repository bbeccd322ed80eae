"""A student's attention with every variant, written in plain NumPy apart from attn's pipeline
and grader, with one mistake of the grader's catalogue planted on request (tests of issue 28).

``student(fx, mistake)`` reads a raw fixture mapping (nested lists) and returns every stage,
batch axis first: Q, K, V, Q_norm, Q_rot ... [B, heads, seq, d]; scores ... softmax
[B, heads, seq_q, seq_k]; output [B, heads, seq_q, d_v]; concat [B, seq_q, heads*d_v]. A mistake
is a string; each ``if m == "..."`` below is the way a student writes it, from the published
code and the issue threads docs/grader/README.md cites, not from attn's code.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]


def arr(x: Any) -> Array:
    if isinstance(x, list):
        return np.array([arr(v) for v in x], dtype=np.float64) if x else np.zeros(0)
    return np.asarray(-np.inf if x == "-inf" else x, dtype=np.float64)


def press_slopes(n: int) -> list[float]:
    """Press et al.'s get_slopes: for n not a power of two, the closest power's slopes plus
    every other slope of twice that."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + power_of_2(2 * closest)[0::2][: n - closest]


def rms(x: Array, w: Array, eps: float, m: str | None) -> Array:
    """RMSNorm over the last axis, with the QK-norm mistakes."""
    if m == "qk_layernorm":
        x = x - x.mean(-1, keepdims=True)
    ms = (x * x).mean(-1, keepdims=True)
    root = np.sqrt(ms) + eps if m == "qk_eps_outside" else np.sqrt(ms + eps)
    weight = {"qk_no_weight": 1.0, "qk_plus_one": 1 + w}.get(m or "", w)
    y: Array = x / root * weight
    return y


def qk_norm(x: Array, w: Array, eps: float, m: str | None) -> Array:
    """x [B, H, n, d]: per head when w has d entries, else over the whole projection."""
    B, H, n, d = x.shape
    per_head = len(w) == d
    if m == "qk_extent":
        per_head = not per_head  # Qwen3's per-head norm where OLMo 2's is meant, or back
    if per_head:
        return rms(x, w if len(w) == d else w.reshape(H, 1, d), eps, m)
    flat = x.transpose(0, 2, 1, 3).reshape(B, n, H * d)
    whole = w if len(w) == H * d else np.tile(w, H)
    y: Array = rms(flat, whole, eps, m).reshape(B, n, H, d).transpose(0, 2, 1, 3)
    return y


def rope(x: Array, pos: Array, cfg: dict[str, Any], m: str | None) -> Array:
    """HF rotate_half (half) or Meta's complex pairs (interleaved) on the first dims columns."""
    d = x.shape[-1]
    base: float = cfg.get("base", 10000.0)
    dims = int(cfg.get("dims") or d)
    layout: str = cfg.get("layout", "half")
    if m == "rope_base":
        base = 500000.0 if base == 10000.0 else 10000.0
    if m == "rope_all_dims":
        dims = d
    exponent = np.arange(0, dims, 2) / dims
    if m == "rope_exponent":
        exponent = np.arange(dims // 2) / dims  # forgot the 2 of 2i/d
    angle = np.outer(pos, base**-exponent)  # (n, dims/2)
    if m == "rope_reversed":
        angle = -angle
    out: Array = x.copy()
    if layout == "half":
        h = dims // 2
        a, b = x[..., :h], x[..., h:dims]
        out[..., :h] = a * np.cos(angle) - b * np.sin(angle)
        out[..., h:dims] = b * np.cos(angle) + a * np.sin(angle)
    else:
        z = (x[..., 0:dims:2] + 1j * x[..., 1:dims:2]) * np.exp(1j * angle)
        out[..., 0:dims:2], out[..., 1:dims:2] = z.real, z.imag
    return out


def softmax_rows(x: Array, sink: Array | None, m: str | None) -> Array:
    """Softmax over the last axis of [B, H, T, S]; a row of -inf gives 0; ``sink`` (H,)."""
    top = x.max(-1, keepdims=True)
    if sink is not None and m not in ("sinks_unshifted", "sinks_not_exp"):
        top = np.maximum(top, sink[None, :, None, None])
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(x - top)
    total = e.sum(-1, keepdims=True)
    if sink is not None:
        s = sink[None, :, None, None]
        term = {"sinks_not_exp": s, "sinks_unshifted": np.exp(s)}.get(m or "", np.exp(s - top))
        total = total + term
    if m == "sinks_not_exp":
        raw: Array = e / total  # written without a guard: the sum may even be negative
        return raw
    with np.errstate(invalid="ignore", divide="ignore"):
        w: Array = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)
    return w


def student(fx: dict[str, Any], m: str | None = None) -> dict[str, Array]:
    """Every stage of the fixture's attention, batch axis first, with mistake ``m`` planted."""
    st: dict[str, Array] = {}
    H = fx.get("heads", 1)
    Hkv = fx.get("kv_heads", H)
    # 1) Q, K, V, split into heads: [B, heads, seq, d]
    if "X" in fx:
        X = arr(fx["X"])
        X = X if X.ndim == 3 else X[None]
        flat = [
            X @ arr(fx[f"W_{n}"]) + (arr(fx[f"b_{n}"]) if f"b_{n}" in fx else 0.0) for n in "QKV"
        ]
    else:
        flat = [arr(fx[n]) for n in "QKV"]
        flat = [f if f.ndim == 3 else f[None] for f in flat]
    B, T, S = flat[0].shape[0], flat[0].shape[1], flat[1].shape[1]
    q, k, v = (
        f.reshape(B, f.shape[1], n, -1).transpose(0, 2, 1, 3)
        for f, n in zip(flat, (H, Hkv, Hkv), strict=True)
    )
    st.update(Q=q, K=k, V=v)
    d = q.shape[-1]
    # 2) positions
    causal = fx.get("causal", False)
    pos_k = np.asarray(fx.get("key_positions", np.arange(S)))
    offset = S - T if causal == "lower-right" else 0
    pos_q = np.asarray(fx.get("positions", np.arange(T) + offset))
    # 3) QK-norm, RoPE
    norm, cfg = fx.get("qk_norm"), fx.get("rope")
    cfg = {} if cfg is True else cfg
    if norm:
        eps = 1e-6 if m == "qk_eps" else norm["eps"]
        qw, kw = arr(norm["q_weight"]), arr(norm["k_weight"])
        if m != "qk_after_rope":
            q = st["Q_norm"] = qk_norm(q, qw, eps, m) if m != "qk_k_only" else q
            k = st["K_norm"] = qk_norm(k, kw, eps, m)
    if cfg is not None:
        q = st["Q_rot"] = rope(q, pos_q, cfg, m)
        k = st["K_rot"] = rope(k, pos_k, cfg, m)
        if norm and m == "qk_after_rope":
            q = st["Q_rot"] = qk_norm(q, arr(norm["q_weight"]), norm["eps"], m)
            k = st["K_rot"] = qk_norm(k, arr(norm["k_weight"]), norm["eps"], m)
    # 4) scores: query head h reads kv head h // (H / Hkv)
    group = H // Hkv
    kv = [h // group for h in range(H)]
    k_of = [h % Hkv if m in ("gqa_tiled", "gqa_k_tiled") else kv[h] for h in range(H)]
    v_of = [h % Hkv if m in ("gqa_tiled", "gqa_v_tiled") else kv[h] for h in range(H)]
    if m == "gqa_single":
        k_of = v_of = [0] * H  # k[:, :1] broadcast: multi-query where grouped is meant
    if m == "gqa_flat_repeat":  # repeat_interleave of the flat [B, S, Hkv*d], then the split
        k, v = (
            np.repeat(a.transpose(0, 2, 1, 3).reshape(B, S, -1), group, axis=-1)
            .reshape(B, S, H, -1)
            .transpose(0, 2, 1, 3)
            for a in (k, v)
        )
        k_of = v_of = list(range(H))
    scores = np.stack([q[:, h] @ k[:, k_of[h]].transpose(0, 2, 1) for h in range(H)], 1)
    st["scores"] = scores  # [B, H, T, S]
    scale = fx.get("scale", 1 / math.sqrt(d))
    x = st["scaled"] = scores * scale
    # 5) softcap
    cap = fx.get("softcap")
    if cap and m == "softcap_before_scale":
        x = st["capped"] = cap * np.tanh(scores / cap) * scale
    elif cap and m == "softcap_wrong_cap":
        c = 30.0 if cap != 30 else 50.0
        x = st["capped"] = c * np.tanh(x / c)
    elif cap:
        x = st["capped"] = {
            "softcap_no_divide": cap * np.tanh(x),
            "softcap_no_multiply": np.tanh(x / cap),
            "softcap_no_factor": np.tanh(x),
            "softcap_left_out": x,
        }.get(m or "", cap * np.tanh(x / cap))
    # 6) ALiBi and bias
    if fx.get("alibi"):
        given = fx["alibi"]
        slopes = np.asarray(press_slopes(H) if given is True else given["slopes"])
        if m == "alibi_reversed":
            slopes = slopes[::-1]
        if m == "alibi_from_one":
            slopes = np.array([2 ** (-8 * h / H) for h in range(H)])
        if m == "alibi_geometric":
            slopes = np.array([2 ** (-8 * (h + 1) / H) for h in range(H)])
        dist = np.abs(pos_q[:, None] - pos_k[None, :])  # (T, S)
        st["alibi"] = -slopes[None, :, None, None] * dist[None, None]
        scaled_too = m == "alibi_scaled"  # the bias scaled along with the scores
        x = (scores + st["alibi"]) * scale if scaled_too else x + st["alibi"]
    if "bias" in fx:
        bias = arr(fx["bias"])
        if m == "bias_transposed":
            bias = np.swapaxes(np.broadcast_to(bias, (B, H, T, S)), -1, -2)
        if m == "bias_before_scale":
            x = (scores + bias) * scale
        elif m == "bias_sign":
            x = x - np.where(np.isfinite(bias), bias, -bias)  # a hidden place stays hidden
        elif m != "bias_ignored":
            x = x + bias
    # 7) which keys each query may see
    ok = np.ones((B, H, T, S), dtype=bool)
    behind = pos_q[:, None] - pos_k[None, :]  # (T, S)
    if causal:
        if m == "causal_upper_left":
            rule = np.arange(S)[None, :] <= np.arange(T)[:, None]  # tril(ones(T, S))
        elif m == "causal_lower_right":
            rule = np.arange(S)[None, :] <= np.arange(T)[:, None] + S - T
        elif m == "causal_missing":
            rule = np.ones((T, S), bool)
        else:
            rule = behind >= 0
        ok &= rule
    window = fx.get("window")
    if window:
        if m == "window_ignored":
            pass
        elif m == "window_two_sided":
            ok = np.ones((B, H, T, S), bool) & (np.abs(behind) < window)
        elif m == "window_off_by_one":
            ok &= behind <= window  # window + 1 keys
        elif m == "window_last_keys":
            ok &= pos_k[None, :] > pos_q.max() - window  # the last window keys, for every query
        else:
            ok &= behind < window
    if "mask" in fx:
        ok &= np.broadcast_to(np.asarray(fx["mask"], bool), (B, H, T, S))
    if "lengths" in fx:
        n = np.asarray(fx["lengths"])
        if m == "lengths_left":
            valid = np.arange(S)[None, :] >= S - n[:, None]  # padding at the start
        elif m == "lengths_queries":
            valid = np.ones((B, S), bool)
            ok &= (np.arange(T)[None, :] < n[:, None])[:, None, :, None]
        elif m == "lengths_off_by_one":
            valid = np.arange(S)[None, :] <= n[:, None]
        elif m == "lengths_ignored":
            valid = np.ones((B, S), bool)
        else:
            valid = np.arange(S)[None, :] < n[:, None]
        ok &= valid[:, None, None, :]
    fill = float(fx.get("mask_value", -np.inf))
    fill = {"sentinel_1e9": -1e9, "sentinel_ignored": -np.inf, "sentinel_1e4": -1e4}.get(
        m or "", fill
    )
    masks = causal or window or "mask" in fx or "lengths" in fx
    if masks:
        if m == "mask_zero_fill":
            x = np.where(ok, x, 0.0)  # scores * mask
        elif m == "sentinel_added":  # BERT's (1 - mask) * -10000.0, added
            x = x + np.where(ok, 0.0, fill if math.isfinite(fill) else -1e4)
        elif m != "mask_after_softmax":
            x = np.where(ok, x, fill)
    if masks or "bias" in fx or fx.get("alibi"):
        st["masked"] = x
    if cap and m == "softcap_after_mask":
        x = st["capped"] = cap * np.tanh(x / cap)
    # 8) softmax, with the sinks joined and dropped
    sinks = arr(fx["sinks"]) if "sinks" in fx else None
    if sinks is not None and m == "sinks_left_out":
        sinks = None
    if sinks is not None and m == "sinks_scaled":
        sinks = sinks * scale
    if sinks is not None and m == "sinks_per_kv_head":
        sinks = sinks[np.array(kv)]  # indexed by the kv head: sinks[h // group]
    w = softmax_rows(x, sinks, m)
    if m == "mask_after_softmax":
        w = w * ok  # zeroed after the softmax, not renormalised
    st["softmax"] = w
    out = np.stack([w[:, h] @ v[:, v_of[h]] for h in range(H)], 1)  # [B, H, T, d_v]
    st["output"] = out
    if H > 1 or "W_O" in fx:
        st["concat"] = out.transpose(0, 2, 1, 3).reshape(B, T, -1)
    if "W_O" in fx:
        st["projected"] = st["concat"] @ arr(fx["W_O"]) + (arr(fx["b_O"]) if "b_O" in fx else 0)
    return st
