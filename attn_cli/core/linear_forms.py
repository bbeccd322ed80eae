"""The forms of linear attention's math, each a small function over (B, H, T, ·) arrays: the
parallel (T×T weights), recurrent (the state after every token) and chunked forms of
Katharopoulos et al.'s linear attention and of Gated DeltaNet's delta rule, and the pieces of
Gated DeltaNet's front end (the causal conv, softplus, the gated RMSNorm). The variants that use
them are in core/plugins/linear.py. Axes: B batch, H heads, T tokens, d_k and d_v per head.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attn_cli.core.ops import rms_norm, silu

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
L2_EPS = 1e-6  # l2norm's eps in torch_*_gated_delta_rule (use_qk_l2norm_in_kernel)


def elu1(x: FloatArray) -> FloatArray:
    """φ(x) = elu(x) + 1: x + 1 where x > 0, else exp(x); always positive."""
    out = np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    out = out.astype(x.dtype, copy=False)
    return out


def causal_ones(T: int) -> Any:
    """(T, T) True where key s ≤ query t."""
    return np.tril(np.ones((T, T), dtype=bool))


def linear_parallel(phi_q: FloatArray, phi_k: FloatArray, v: FloatArray) -> tuple[Any, Any]:
    """The implicit weights A[t, s] = φ(q_t)·φ(k_s) / Σ_{s' ≤ t} φ(q_t)·φ(k_s') (s ≤ t), and A·V."""
    T = phi_q.shape[-2]
    raw = np.where(causal_ones(T), phi_q @ phi_k.swapaxes(-1, -2), 0.0)  # (B, H, T, T)
    weights = (raw / raw.sum(axis=-1, keepdims=True)).astype(phi_q.dtype, copy=False)
    return weights, weights @ v  # (B, H, T, T), (B, H, T, d_v)


def linear_recurrent(phi_q: FloatArray, phi_k: FloatArray, v: FloatArray) -> tuple[Any, Any, Any]:
    """Token by token: S_t = S_{t−1} + φ(k_t)v_tᵀ, z_t = z_{t−1} + φ(k_t), o_t = φ(q_t)ᵀS_t /
    φ(q_t)ᵀz_t. The states (B, H, T, d_k, d_v), normalisers (B, H, T, d_k) and outputs."""
    B, H, T, dk = phi_q.shape
    dv = v.shape[-1]
    states = np.empty((B, H, T, dk, dv), dtype=phi_q.dtype)
    zs = np.empty((B, H, T, dk), dtype=phi_q.dtype)
    out = np.empty((B, H, T, dv), dtype=phi_q.dtype)
    S = np.zeros((B, H, dk, dv), dtype=phi_q.dtype)
    z = np.zeros((B, H, dk), dtype=phi_q.dtype)
    for t in range(T):
        S = S + phi_k[:, :, t, :, None] * v[:, :, t, None, :]  # (B, H, d_k, d_v)
        z = z + phi_k[:, :, t]  # (B, H, d_k)
        q = phi_q[:, :, t]  # (B, H, d_k)
        num = np.einsum("bhk,bhkv->bhv", q, S)
        out[:, :, t] = num / np.einsum("bhk,bhk->bh", q, z)[..., None]
        states[:, :, t], zs[:, :, t] = S, z
    return states, zs, out


def linear_chunked(phi_q: FloatArray, phi_k: FloatArray, v: FloatArray, chunk: int) -> Any:
    """Chunk by chunk: the state S and normaliser z carried from the chunks before, plus causal
    attention inside the chunk."""
    B, H, T, dk = phi_q.shape
    out = np.empty((*phi_q.shape[:3], v.shape[-1]), dtype=phi_q.dtype)
    S = np.zeros((B, H, dk, v.shape[-1]), dtype=phi_q.dtype)
    z = np.zeros((B, H, dk), dtype=phi_q.dtype)
    for c0 in range(0, T, chunk):
        q, k, vc = (x[:, :, c0 : c0 + chunk] for x in (phi_q, phi_k, v))  # (B, H, C, ·)
        n = q.shape[2]
        intra = np.where(causal_ones(n), q @ k.swapaxes(-1, -2), 0.0)  # (B, H, C, C)
        num = q @ S + intra @ vc  # (B, H, C, d_v)
        den = np.einsum("bhck,bhk->bhc", q, z) + intra.sum(axis=-1)  # (B, H, C)
        out[:, :, c0 : c0 + n] = num / den[..., None]
        S = S + k.swapaxes(-1, -2) @ vc
        z = z + k.sum(axis=2)
    return out


def l2norm(x: FloatArray, eps: float = L2_EPS) -> FloatArray:
    """x / √(Σx² + eps) over the last axis (transformers' ``l2norm``, as FLA's); where Σx²
    overflows, inf (the stage's check names it) rather than the 0 that x / inf would give."""
    r = np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)
    out: FloatArray = np.where(np.isfinite(r), x / r, np.inf).astype(x.dtype, copy=False)
    return out


def delta_recurrent(q: Any, k: Any, v: Any, g: Any, beta: Any) -> tuple[Any, Any]:
    """``torch_recurrent_gated_delta_rule`` after its l2norm and scale: token by token, the state
    decays by exp(g_t), the delta rule writes β_t(v_t − Sᵀk_t) along k_t, o_t = S_tᵀq_t.
    q, k (B, H, T, d_k), v (B, H, T, d_v), g and beta (B, H, T); the states and outputs."""
    B, H, T, dk = q.shape
    dv = v.shape[-1]
    states = np.empty((B, H, T, dk, dv), dtype=q.dtype)
    out = np.empty((B, H, T, dv), dtype=q.dtype)
    S = np.zeros((B, H, dk, dv), dtype=q.dtype)
    for t in range(T):
        S = S * np.exp(g[:, :, t])[..., None, None]  # decay (B, H, d_k, d_v)
        kv_mem = np.einsum("bhkv,bhk->bhv", S, k[:, :, t])  # what S predicts for k_t
        delta = (v[:, :, t] - kv_mem) * beta[:, :, t, None]  # (B, H, d_v)
        S = S + k[:, :, t, :, None] * delta[:, :, None, :]
        out[:, :, t] = np.einsum("bhkv,bhk->bhv", S, q[:, :, t])
        states[:, :, t] = S
    return states, out


def unit_lower_solve(M: Any, rhs: Any) -> Any:
    """X with (I + strictly_lower(M))·X = rhs (``solve_triangular(unitriangular=True)``)."""
    n = M.shape[-1]
    lower = np.tril(M, -1) + np.eye(n, dtype=M.dtype)
    return np.linalg.solve(lower, rhs)


def delta_chunked(q: Any, k: Any, v: Any, g: Any, beta: Any, chunk: int) -> Any:
    """``torch_chunk_gated_delta_rule`` after its l2norm and scale, step for step: padded to
    whole chunks, the UT transform inside each chunk, then the scan over chunks."""
    B, H, T, dk = q.shape
    pad = (chunk - T % chunk) % chunk
    q, k, v = (np.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (q, k, v))
    beta, g = (np.pad(x, ((0, 0), (0, 0), (0, pad))) for x in (beta, g))
    n = (T + pad) // chunk
    v_beta, k_beta = v * beta[..., None], k * beta[..., None]
    q, k, k_beta, v_beta = (x.reshape(B, H, n, chunk, -1) for x in (q, k, k_beta, v_beta))
    cum = g.reshape(B, H, n, chunk).cumsum(axis=-1)  # (B, H, n, C)
    upper = np.triu(np.ones((chunk, chunk), dtype=bool), 1)
    diff = np.where(upper, -np.inf, cum[..., :, None] - cum[..., None, :])
    pairwise = np.exp(diff)  # (B, H, n, C, C): exp(cum_i − cum_j), j ≤ i
    ut = (k_beta @ k.swapaxes(-1, -2)) * pairwise
    intra = (q @ k.swapaxes(-1, -2)) * pairwise
    new_values = unit_lower_solve(ut, v_beta)  # (B, H, n, C, d_v)
    k_cumdecay = unit_lower_solve(ut, k_beta * np.exp(cum)[..., None])  # (B, H, n, C, d_k)
    q = q * np.exp(cum)[..., None]
    k = k * np.exp(cum[..., -1:] - cum)[..., None]
    chunk_decay = np.exp(cum[..., -1])[..., None, None]  # (B, H, n, 1, 1)
    S = np.zeros((B, H, dk, v.shape[-1]), dtype=q.dtype)
    out = np.empty_like(new_values)
    for i in range(n):
        v_new = new_values[:, :, i] - k_cumdecay[:, :, i] @ S
        out[:, :, i] = q[:, :, i] @ S + intra[:, :, i] @ v_new
        S = S * chunk_decay[:, :, i] + k[:, :, i].swapaxes(-1, -2) @ v_new
    return out.reshape(B, H, n * chunk, -1)[:, :, :T].astype(q.dtype)


def delta_parallel(q: Any, k: Any, v: Any, g: Any, beta: Any) -> tuple[Any, Any]:
    """The T×T weights the gated delta rule amounts to, and weights·V: with G_t = Σ_{i≤t} g_i,
    D[t, s] = exp(G_t − G_s) (s ≤ t) and L = strictly_lower(β_t (k_t·k_s) D[t, s]),
    weights = (q·kᵀ ⊙ D)·(I + L)⁻¹·diag(β)."""
    T = q.shape[-2]
    G = np.cumsum(g, axis=-1)  # (B, H, T)
    D = np.exp(np.where(causal_ones(T), G[..., :, None] - G[..., None, :], -np.inf))
    ut = beta[..., :, None] * (k @ k.swapaxes(-1, -2)) * D  # (B, H, T, T)
    eye = np.broadcast_to(np.eye(T, dtype=q.dtype), ut.shape)
    inverse = unit_lower_solve(ut, eye * beta[..., None, :])  # (I + L)⁻¹·diag(β)
    weights = ((q @ k.swapaxes(-1, -2)) * D) @ inverse  # (B, H, T, T)
    weights = np.where(causal_ones(T), weights, 0.0).astype(q.dtype, copy=False)
    return weights, weights @ v


def softplus(x: FloatArray) -> FloatArray:
    """log(1 + eˣ) (torch's: x itself above 20)."""
    out = np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20.0))))
    out = out.astype(x.dtype, copy=False)
    return out


def causal_conv(x: FloatArray, w: FloatArray) -> FloatArray:
    """Depthwise causal conv1d over tokens: out[t, c] = Σ_j w[c, j]·x[t − (K−1) + j, c], zeros
    before the first token (conv1d with padding K−1, the first T outputs). x (B, T, C)."""
    K = w.shape[1]
    T = x.shape[1]
    padded = np.pad(x, ((0, 0), (K - 1, 0), (0, 0)))  # (B, T+K-1, C)
    out = np.zeros_like(x)
    for j in range(K):
        out += padded[:, j : j + T] * w[:, j]
    return out


def gated_rms_norm(o: FloatArray, z: FloatArray, weight: FloatArray, eps: float) -> FloatArray:
    """Qwen3NextRMSNormGated: weight · o / √(mean(o²) + eps), times SiLU(z)."""
    return rms_norm(o, weight, eps, divide=True, times=silu(z))
