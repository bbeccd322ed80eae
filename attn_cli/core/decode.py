"""KV-cache decoding: a prefill, then one token at a time against the cache of keys and values.

Axis names as in the pipeline: B batch, H query heads, Hkv key/value heads, T tokens (each
token sees only the ones up to it, and keys are the same tokens, S == T), D d_k, Dv d_v,
C cache slots.

A key is rotated once (``rotate``, e.g. RoPE), when it enters the cache, at its own position;
the query of a step is rotated at its position. Each step and the prefill run the one chain
(core/chain.py) over their cells: scaled -> the score modifiers -> masked -> the softmax with
the chain's extra logit. A step's cells are every batch item and head, its one query and the
cache slots (``keys`` the token each slot holds, -1 while empty). When a variant asks for a
cache of so many slots (``chain.cache_slots()``) the cache is a ring buffer: the token at
position p goes to slot p mod C, evicting the one C positions back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attn_cli.core.chain import Chain
from attn_cli.core.steps import softmax_rows
from attn_cli.core.variant import REGISTRY, Cells
from attn_cli.core.variant import FloatArray as Logits  # what the chain's hooks take

FloatArray = np.ndarray[Any, np.dtype[np.floating[Any]]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]
Rotate = Callable[[FloatArray, IntArray], FloatArray]  # (x (..., n, D), positions (n,)) -> x


@dataclass(frozen=True, eq=False)
class DecodeStep:
    """One generated token: its query, the cache as it is now, and the attention against it.

    Each score modifier's stage (``capped``) is in ``modified`` and reads as an attribute;
    a registered modifier that is off reads as None.
    """

    index: int  # the token's index in the sequence
    position: int  # its position (RoPE, the allowed-keys rules)
    slot: int  # the cache slot its key and value went to
    slots: int  # C, the cache length at this step
    cache_positions: tuple[int, ...]  # the position each slot holds, -1 when empty
    Q: FloatArray  # (B, H, 1, D) as projected
    Q_rot: FloatArray | None  # (B, H, 1, D) rotated at the position, when rotating
    K_cache: FloatArray  # (B, Hkv, C, D) rotated keys, as cached
    V_cache: FloatArray  # (B, Hkv, C, Dv)
    scores: FloatArray  # (B, H, 1, C)
    scaled: FloatArray  # (B, H, 1, C)
    masked: FloatArray  # (B, H, 1, C) the last modifier's stage + biases, -inf where hidden
    softmax: FloatArray  # (B, H, 1, C) the kept weights (with an extra logit, less than 1)
    output: FloatArray  # (B, H, 1, Dv)
    modified: Mapping[str, FloatArray] = field(default_factory=dict)  # (B, H, 1, C) each

    def __getattr__(self, name: str) -> FloatArray | None:
        """A score modifier's stage by its name (``step.capped``); None when it is off."""
        modified = self.__dict__.get("modified", {})
        if name in modified:
            stage: FloatArray = modified[name]
            return stage
        if any(v.stage == name for v in REGISTRY.values()):
            return None
        raise AttributeError(name)


@dataclass(frozen=True, eq=False)
class DecodeResult:
    """The prefill of the first ``prefill`` tokens and the steps that follow."""

    prefill: int
    prefill_output: FloatArray  # (B, H, prefill, Dv), each prefill token over those up to it
    steps: tuple[DecodeStep, ...]


@dataclass(frozen=True)
class DecodeBugs:
    """Mistakes of hand-written decode loops, for the grader to recompute (all off: correct)."""

    rerotate_cache: bool = False  # cached keys rotated again at every step
    restart_positions: bool = False  # positions counted from 0 again after the prefill
    head_tiled: bool = False  # query head h reads cache head h mod Hkv, not h // groups
    # a ring buffer this many slots bigger than the cache rules ask, trusted to hide the rest
    # (the allowed-keys rules of the variants with a cache rule left out)
    extra_slots: int = 0


@dataclass(frozen=True, eq=False)
class _Setup:
    chain: Chain
    scale: float
    positions: IntArray  # (T,)
    rotate: Rotate | None


def decode(
    q: FloatArray,  # (B, H, T, D)
    k: FloatArray,  # (B, Hkv, T, D)
    v: FloatArray,  # (B, Hkv, T, Dv)
    *,
    chain: Chain,
    scale: float,
    prefill: int,
    positions: Any,
    rotate: Rotate | None = None,
) -> DecodeResult:
    """Prefill the first ``prefill`` tokens, then decode the rest one step at a time."""
    setup = _setup(q, k, v, chain, scale, prefill, positions, rotate)
    return _decode(q, k, v, prefill, setup, DecodeBugs())


def _setup(
    q: FloatArray,
    k: FloatArray,
    v: FloatArray,
    chain: Chain,
    scale: float,
    prefill: int,
    positions: Any,
    rotate: Rotate | None,
) -> _Setup:
    """Check the shapes and gather the options every step reads."""
    B, H, T, _ = q.shape
    Hkv = k.shape[1]
    if k.shape[:3] != (B, Hkv, T) or v.shape[:3] != (B, Hkv, T) or H % Hkv:
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape}: decoding needs S == T")
    if not 1 <= prefill <= T:
        raise ValueError(f"prefill must be 1..{T}, not {prefill}")
    pos = np.asarray(positions, dtype=np.int64).reshape(T)
    return _Setup(chain=chain, scale=scale, positions=pos, rotate=rotate)


def _decode(
    q: FloatArray, k: FloatArray, v: FloatArray, prefill: int, setup: _Setup, bugs: DecodeBugs
) -> DecodeResult:
    """The prefill, the cache it leaves, and one step per remaining token."""
    T = q.shape[2]
    pos = setup.positions
    k_rot, q_pre = k[:, :, :prefill], q[:, :, :prefill]
    if setup.rotate is not None:
        q_pre = setup.rotate(q_pre, pos[:prefill])  # (B, H, P, D)
        k_rot = setup.rotate(k_rot, pos[:prefill])  # (B, Hkv, P, D)
    prefill_output = _prefill(q_pre, k_rot, v[:, :, :prefill], setup)
    ring = setup.chain.cache_slots()
    cache = _Cache.empty(k, v, None if ring is None else ring + bugs.extra_slots)
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
    def empty(cls, k: FloatArray, v: FloatArray, ring: int | None) -> _Cache:
        B, Hkv, _, D = k.shape
        C = 0 if ring is None else ring
        K = np.zeros((B, Hkv, C, D), k.dtype)
        V = np.zeros((B, Hkv, C, v.shape[3]), v.dtype)
        return cls(K, V, np.full(C, -1, np.int64), ring)

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
    bugs: DecodeBugs,
) -> DecodeStep:
    """Attention of token i against the cache: scores, scaled, the chain, softmax, output."""
    B, H, Hkv = q.shape[0], q.shape[1], cache.K.shape[1]
    heads = np.arange(H) % Hkv if bugs.head_tiled else np.arange(H) // (H // Hkv)
    k = cache.K[:, heads]  # (B, H, C, D)
    scores = (q if q_rot is None else q_rot) @ k.swapaxes(-1, -2)  # (B, H, 1, C)
    scaled = scores * q.dtype.type(setup.scale)
    pos = setup.positions
    held = cache.held  # (C,) token indices, -1 for empty slots: the chain hides those
    cells = Cells(np.arange(B), np.arange(H), np.array([i]), held,
                  pos[[i]], np.where(held >= 0, pos[np.maximum(held, 0)], 0))  # fmt: skip
    chain = setup.chain.without_cache_rules() if bugs.extra_slots else setup.chain
    modified, masked, weights = _attend(chain, scaled, cells)
    output = weights @ cache.V[:, heads]  # (B, H, 1, C) @ (B, H, C, Dv)
    return DecodeStep(
        index=i,
        position=int(pos[i]),
        slot=slot,
        slots=int(held.size),
        cache_positions=tuple(int(pos[t]) if t >= 0 else -1 for t in held),
        Q=q,
        Q_rot=q_rot,
        K_cache=cache.K,
        V_cache=cache.V,
        scores=scores,
        scaled=scaled,
        masked=masked,
        softmax=weights,
        output=output,
        modified=modified,
    )


def _attend(
    chain: Chain, scaled: Logits, cells: Cells, hidden: BoolArray | None = None
) -> tuple[dict[str, FloatArray], FloatArray, FloatArray]:
    """The chain over the cells (B, H, n, C): each modifier's stage, masked (-inf where not
    allowed, and where ``hidden``), the softmax with the chain's extra logit."""
    modified: dict[str, FloatArray] = {}

    def keep(stage: str) -> Logits:
        out = np.empty_like(scaled)
        modified[stage] = out
        return out

    x = chain.modify(scaled, keep)
    masked, _, _ = chain.masked(x, cells, None, lambda stage: None, fill=-np.inf)
    if hidden is not None:
        np.copyto(masked, -np.inf, where=hidden)
    masked = masked.astype(scaled.dtype, copy=False)
    weights, _ = softmax_rows(masked, None, sink=chain.extra_logit(cells, masked.dtype))
    return modified, masked, weights


def _prefill(q: FloatArray, k: FloatArray, v: FloatArray, setup: _Setup) -> FloatArray:
    """Each prefill token attending to those up to it (q and k already rotated): (B, H, P, Dv)."""
    B, H, P = q.shape[:3]
    Hkv = k.shape[1]
    heads = np.arange(H) // (H // Hkv)  # query head h reads key/value head h // groups
    scores = q @ k[:, heads].swapaxes(-1, -2)  # (B, H, P, D) @ (B, H, D, P)
    scaled = scores * q.dtype.type(setup.scale)
    tokens, pos = np.arange(P), setup.positions[:P]
    cells = Cells(np.arange(B), np.arange(H), tokens, tokens, pos, pos)
    later = np.triu(np.ones((P, P), dtype=bool), 1)  # key j > query i: not in the cache yet
    weights = _attend(setup.chain, scaled, cells, later)[2]
    out: FloatArray = weights @ v[:, heads]  # (B, H, P, Dv)
    return out


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
    chain: Chain,
    scale: float,
    prefill: int,
    positions: Any,
    rotate: Rotate | None = None,
    extra: Sequence[tuple[str, str, DecodeBugs]] = (),
) -> tuple[DecodeMistake, ...]:
    """Each named mistake of the loop that can apply here (RoPE, GQA), recomputed; then each
    of ``extra`` (name, description, bugs): the variants' own (check/mistakes/)."""
    setup = _setup(q, k, v, chain, scale, prefill, positions, rotate)
    candidates = (
        ("rerotate_cache", "cached keys rotated again at every step",
         DecodeBugs(rerotate_cache=True), rotate is not None),
        ("restart_positions", "positions restarted at 0 after the prefill",
         DecodeBugs(restart_positions=True), rotate is not None),
        ("cache_by_query_head", "cache read by query head (h mod kv_heads), not h // groups",
         DecodeBugs(head_tiled=True), q.shape[1] != k.shape[1]),
        *((name, description, bugs, True) for name, description, bugs in extra),
    )  # fmt: skip
    return tuple(
        DecodeMistake(name, description, _decode(q, k, v, prefill, setup, bugs))
        for name, description, bugs, applies in candidates
        if applies
    )
