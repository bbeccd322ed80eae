"""KV-cache decoding: a prefill, then one token at a time against the cache of keys and values.

Axis names as in the pipeline: B batch, H query heads, Hkv key/value heads, T tokens (the
fixture is causal and self-attending, S == T), D d_k, Dv d_v, C cache slots.

A key is rotated once (``rotate``, e.g. RoPE), when it enters the cache, at its own position;
the query of a step is rotated at its position. With ``window`` the cache is a ring buffer of
``window`` slots: the token at position p goes to slot p mod window, evicting the one
``window`` positions back, so the cache always holds exactly the keys the window allows.
With ``softcap`` (Gemma 2) the scaled scores are capped, softcap·tanh(scaled/softcap), before the
bias and the mask, as in the full computation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from attn_cli.core.steps import cap_scores, window_reach

FloatArray = np.ndarray[Any, np.dtype[np.floating[Any]]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]
Rotate = Callable[[FloatArray, IntArray], FloatArray]  # (x (..., n, D), positions (n,)) -> x


@dataclass(frozen=True, eq=False)
class DecodeStep:
    """One generated token: its query, the cache as it is now, and the attention against it."""

    index: int  # the token's index in the sequence
    position: int  # its position (RoPE, window)
    slot: int  # the cache slot its key and value went to
    slots: int  # C, the cache length at this step
    cache_positions: tuple[int, ...]  # the position each slot holds, -1 when empty
    Q: FloatArray  # (B, H, 1, D) as projected
    Q_rot: FloatArray | None  # (B, H, 1, D) rotated at the position, when rotating
    K_cache: FloatArray  # (B, Hkv, C, D) rotated keys, as cached
    V_cache: FloatArray  # (B, Hkv, C, Dv)
    scores: FloatArray  # (B, H, 1, C)
    scaled: FloatArray  # (B, H, 1, C)
    capped: FloatArray | None  # (B, H, 1, C) softcap·tanh(scaled/softcap), with a softcap
    masked: FloatArray  # (B, H, 1, C) capped|scaled + bias, -inf at empty slots, out of window
    softmax: FloatArray  # (B, H, 1, C) the kept weights (with sinks they sum to less than 1)
    output: FloatArray  # (B, H, 1, Dv)


@dataclass(frozen=True, eq=False)
class DecodeResult:
    """The prefill of the first ``prefill`` tokens and the steps that follow."""

    prefill: int
    prefill_output: FloatArray  # (B, H, prefill, Dv), causal attention over the prefill
    steps: tuple[DecodeStep, ...]


@dataclass(frozen=True)
class _Bugs:
    """Mistakes of hand-written decode loops, for the grader to recompute (all off: correct)."""

    rerotate_cache: bool = False  # cached keys rotated again at every step
    restart_positions: bool = False  # positions counted from 0 again after the prefill
    head_tiled: bool = False  # query head h reads cache head h mod Hkv, not h // groups
    ring_extra_slot: bool = False  # ring buffer of window + 1 slots


@dataclass(frozen=True, eq=False)
class _Setup:
    scale: float
    positions: IntArray  # (T,)
    rotate: Rotate | None
    window: int | None
    sinks: FloatArray | None  # (H,)
    bias: FloatArray | None  # (B, H, T, T) view
    softcap: float | None


def decode(
    q: FloatArray,  # (B, H, T, D)
    k: FloatArray,  # (B, Hkv, T, D)
    v: FloatArray,  # (B, Hkv, T, Dv)
    *,
    scale: float,
    prefill: int,
    positions: Any,
    rotate: Rotate | None = None,
    window: int | None = None,
    sinks: FloatArray | None = None,
    bias: FloatArray | None = None,
    softcap: float | None = None,
) -> DecodeResult:
    """Prefill the first ``prefill`` tokens, then decode the rest one step at a time."""
    setup = _setup(q, k, v, scale, prefill, positions, rotate, window, sinks, bias, softcap)
    return _decode(q, k, v, prefill, setup, _Bugs())


def _setup(
    q: FloatArray,
    k: FloatArray,
    v: FloatArray,
    scale: float,
    prefill: int,
    positions: Any,
    rotate: Rotate | None,
    window: int | None,
    sinks: FloatArray | None,
    bias: FloatArray | None,
    softcap: float | None,
) -> _Setup:
    """Check the shapes and gather the options every step reads."""
    B, H, T, _ = q.shape
    Hkv = k.shape[1]
    if k.shape[:3] != (B, Hkv, T) or v.shape[:3] != (B, Hkv, T) or H % Hkv:
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape}: decoding needs S == T")
    if not 1 <= prefill <= T:
        raise ValueError(f"prefill must be 1..{T}, not {prefill}")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1, not {window}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be > 0, not {softcap}")
    pos = np.asarray(positions, dtype=np.int64).reshape(T)
    return _Setup(
        scale=scale,
        positions=pos,
        rotate=rotate,
        # a window wider than the positions reach is plain causal: a ring that never wraps
        window=None if window is None else window_reach(window, pos, pos),
        sinks=None if sinks is None else np.asarray(sinks, dtype=q.dtype).reshape(H),
        bias=None if bias is None else np.broadcast_to(bias, (B, H, T, T)),
        softcap=softcap,
    )


def _decode(
    q: FloatArray, k: FloatArray, v: FloatArray, prefill: int, setup: _Setup, bugs: _Bugs
) -> DecodeResult:
    """The prefill, the cache it leaves, and one step per remaining token."""
    T = q.shape[2]
    pos = setup.positions
    k_rot, q_pre = k[:, :, :prefill], q[:, :, :prefill]
    if setup.rotate is not None:
        q_pre = setup.rotate(q_pre, pos[:prefill])  # (B, H, P, D)
        k_rot = setup.rotate(k_rot, pos[:prefill])  # (B, Hkv, P, D)
    prefill_output = _prefill(q_pre, k_rot, v[:, :, :prefill], setup)
    cache = _Cache.empty(k, v, setup.window, bugs.ring_extra_slot)
    for i in range(prefill):
        cache.put(i, int(pos[i]), k_rot[:, :, i], v[:, :, i])
    steps = []
    for i in range(prefill, T):
        rot_pos = pos[i - prefill] if bugs.restart_positions else pos[i]
        if bugs.rerotate_cache and setup.rotate is not None:
            cache.rerotate(setup.rotate, pos)
        k_new = k[:, :, i : i + 1]  # (B, Hkv, 1, D)
        q_new = q[:, :, i : i + 1]  # (B, H, 1, D)
        q_rot = None
        if setup.rotate is not None:
            k_new = setup.rotate(k_new, np.array([rot_pos]))
            q_rot = setup.rotate(q_new, np.array([rot_pos]))
        slot = cache.put(i, int(pos[i]), k_new[:, :, 0], v[:, :, i])
        steps.append(_step(i, slot, q_new, q_rot, cache, setup, bugs))
    return DecodeResult(prefill, prefill_output, tuple(steps))


@dataclass(eq=False)
class _Cache:
    """The cache arrays and which token each slot holds (-1: empty)."""

    K: FloatArray  # (B, Hkv, C, D)
    V: FloatArray  # (B, Hkv, C, Dv)
    held: IntArray  # (C,) token indices
    ring: int | None  # ring buffer size, None: the cache grows

    @classmethod
    def empty(cls, k: FloatArray, v: FloatArray, window: int | None, extra: bool) -> _Cache:
        B, Hkv, _, D = k.shape
        C = 0 if window is None else window + int(extra)
        K = np.zeros((B, Hkv, C, D), k.dtype)
        V = np.zeros((B, Hkv, C, v.shape[3]), v.dtype)
        return cls(K, V, np.full(C, -1, np.int64), None if window is None else C)

    def put(self, index: int, position: int, k: FloatArray, v: FloatArray) -> int:
        """Write one token's key and value (B, Hkv, D) and return its slot."""
        if self.ring is None:
            slot = self.held.size
            self.K = np.concatenate([self.K, k[:, :, None]], axis=2)  # (B, Hkv, C+1, D)
            self.V = np.concatenate([self.V, v[:, :, None]], axis=2)  # (B, Hkv, C+1, Dv)
            self.held = np.append(self.held, index)
            return slot
        slot = position % self.ring
        # new arrays, so the steps already taken keep the cache as they saw it
        self.K, self.V, self.held = self.K.copy(), self.V.copy(), self.held.copy()
        self.K[:, :, slot], self.V[:, :, slot], self.held[slot] = k, v, index
        return slot

    def rerotate(self, rotate: Rotate, positions: IntArray) -> None:
        """The classic bug: rotate the (already rotated) cached keys again at their positions."""
        full = self.held >= 0
        self.K = self.K.copy()
        self.K[:, :, full] = rotate(self.K[:, :, full], positions[self.held[full]])


def _step(
    i: int,
    slot: int,
    q: FloatArray,  # (B, H, 1, D)
    q_rot: FloatArray | None,  # (B, H, 1, D)
    cache: _Cache,
    setup: _Setup,
    bugs: _Bugs,
) -> DecodeStep:
    """Attention of token i against the cache: scores, scaled, masked, softmax, output."""
    H, Hkv = q.shape[1], cache.K.shape[1]
    heads = np.arange(H) % Hkv if bugs.head_tiled else np.arange(H) // (H // Hkv)
    k = cache.K[:, heads]  # (B, H, C, D)
    scores = (q if q_rot is None else q_rot) @ k.swapaxes(-1, -2)  # (B, H, 1, C)
    scaled = scores * q.dtype.type(setup.scale)
    capped = None if setup.softcap is None else cap_scores(scaled, setup.softcap)
    full = cache.held >= 0
    held = np.where(full, cache.held, 0)  # (C,) token indices, 0 for empty slots
    masked = scaled if capped is None else capped
    if setup.bias is not None:
        masked = masked + setup.bias[:, :, i : i + 1, held]  # (B, H, 1, C)
    allowed = full.copy()
    if setup.window is not None and not bugs.ring_extra_slot:
        gap = setup.positions[i] - setup.positions[held]  # (C,)
        allowed &= (gap >= 0) & (gap < setup.window)
    masked = np.where(allowed, masked, -np.inf).astype(q.dtype, copy=False)
    weights = _softmax_with_sinks(masked, setup.sinks)
    output = weights @ cache.V[:, heads]  # (B, H, 1, C) @ (B, H, C, Dv)
    pos = setup.positions
    return DecodeStep(
        index=i,
        position=int(pos[i]),
        slot=slot,
        slots=int(cache.held.size),
        cache_positions=tuple(int(pos[t]) if t >= 0 else -1 for t in cache.held),
        Q=q,
        Q_rot=q_rot,
        K_cache=cache.K,
        V_cache=cache.V,
        scores=scores,
        scaled=scaled,
        capped=capped,
        masked=masked,
        softmax=weights,
        output=output,
    )


def _prefill(q: FloatArray, k: FloatArray, v: FloatArray, setup: _Setup) -> FloatArray:
    """Causal attention over the prefill tokens (q and k already rotated): (B, H, P, Dv)."""
    H, Hkv, P = q.shape[1], k.shape[1], q.shape[2]
    heads = np.arange(H) // (H // Hkv)  # query head h reads key/value head h // groups
    scores = q @ k[:, heads].swapaxes(-1, -2)  # (B, H, P, D) @ (B, H, D, P)
    masked = scores * q.dtype.type(setup.scale)
    if setup.softcap is not None:
        masked = cap_scores(masked, setup.softcap)  # before the bias and the mask (Gemma 2)
    if setup.bias is not None:
        masked = masked + setup.bias[:, :, :P, :P]
    pos = setup.positions[:P]
    allowed = np.tril(np.ones((P, P), dtype=bool))  # key j <= query i
    if setup.window is not None:
        gap = pos[:, None] - pos[None, :]  # (P, P)
        allowed &= (gap >= 0) & (gap < setup.window)
    masked = np.where(allowed, masked, -np.inf).astype(q.dtype, copy=False)
    out: FloatArray = _softmax_with_sinks(masked, setup.sinks) @ v[:, heads]  # (B, H, P, Dv)
    return out


def _softmax_with_sinks(x: FloatArray, sinks: FloatArray | None) -> FloatArray:
    """Softmax over keys of (B, H, n, C); a sink per head joins each row's sum and is dropped."""
    m = x.max(axis=-1, keepdims=True)  # (B, H, n, 1)
    if sinks is not None:
        sink = sinks[None, :, None, None]  # (1, H, 1, 1)
        m = np.maximum(m, sink)
    m = np.where(np.isneginf(m), 0.0, m).astype(x.dtype)  # a row of -inf gives zeros
    e = np.exp(x - m)
    total = e.sum(axis=-1, keepdims=True)  # (B, H, n, 1)
    if sinks is not None:
        total = total + np.exp(sink - m)
    weights: FloatArray = e / np.where(total == 0, 1.0, total).astype(x.dtype)
    return weights


def self_check(result: DecodeResult, full_output: FloatArray) -> list[float]:
    """The largest |step output - full output row| of each step; full is (B?, H, T, Dv)."""
    full = full_output if full_output.ndim == 4 else full_output[None]  # (B, H, T, Dv)
    return [float(np.abs(s.output[:, :, 0] - full[:, :, s.index]).max()) for s in result.steps]


@dataclass(frozen=True)
class KVCacheBytes:
    """Bytes of K and V cache per token per layer, for this model, MHA and MQA, and for seq."""

    kv_heads: int
    heads: int
    seq: int
    per_token: int  # kv_heads * (d_k + d_v) * itemsize
    per_token_mha: int  # kv_heads = heads
    per_token_mqa: int  # kv_heads = 1
    total: int  # per_token * seq
    total_mha: int
    total_mqa: int


def kv_cache_bytes(
    kv_heads: int, heads: int, d_k: int, d_v: int, itemsize: int, seq: int
) -> KVCacheBytes:
    """What the cache costs: K and V (kv_heads * d_k and kv_heads * d_v numbers) per token."""

    def per_token(n: int) -> int:
        return n * (d_k + d_v) * itemsize

    return KVCacheBytes(
        kv_heads=kv_heads,
        heads=heads,
        seq=seq,
        per_token=per_token(kv_heads),
        per_token_mha=per_token(heads),
        per_token_mqa=per_token(1),
        total=per_token(kv_heads) * seq,
        total_mha=per_token(heads) * seq,
        total_mqa=per_token(1) * seq,
    )


@dataclass(frozen=True, eq=False)
class DecodeMistake:
    """What a decode loop with one named mistake returns, to match against a user's dump."""

    name: str
    description: str
    result: DecodeResult


def decode_mistakes(
    q: FloatArray,
    k: FloatArray,
    v: FloatArray,
    *,
    scale: float,
    prefill: int,
    positions: Any,
    rotate: Rotate | None = None,
    window: int | None = None,
    sinks: FloatArray | None = None,
    bias: FloatArray | None = None,
    softcap: float | None = None,
) -> tuple[DecodeMistake, ...]:
    """Each named mistake that can apply here (RoPE, GQA, window), recomputed."""
    setup = _setup(q, k, v, scale, prefill, positions, rotate, window, sinks, bias, softcap)
    candidates = (
        ("rerotate_cache", "cached keys rotated again at every step", _Bugs(rerotate_cache=True),
         rotate is not None),
        ("restart_positions", "positions restarted at 0 after the prefill",
         _Bugs(restart_positions=True), rotate is not None),
        ("cache_by_query_head", "cache read by query head (h mod kv_heads), not h // groups",
         _Bugs(head_tiled=True), q.shape[1] != k.shape[1]),
        ("ring_buffer_off_by_one", "ring buffer of window + 1 slots (one key too many)",
         _Bugs(ring_extra_slot=True), window is not None),
    )  # fmt: skip
    return tuple(
        DecodeMistake(name, description, _decode(q, k, v, prefill, setup, bugs))
        for name, description, bugs, applies in candidates
        if applies
    )
