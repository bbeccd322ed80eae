"""The 2025-26 variants against the same math written plainly in NumPy (issue 24), in one process.

    python benchmarks/variants.py               # seq 2048, about a minute
    python benchmarks/variants.py --seq 1024 --reps 7

For each variant, attn's pipeline computes the layer's ``output`` stage only
(``run(inputs, keep={"output"})``: what ``attn trace --stage output`` computes, without reading
or writing files) and a plain NumPy function computes the same numbers from the same arrays,
written here as a careful reader would write it from the reference code (one head's T×T at a
time). The two alternate, ``--reps``
times each, and the ratio of the medians is printed (target <= 1.5, issue 24). Both sides'
results are compared first: a benchmark of wrong math is no benchmark.

Shapes: seq tokens, d_model 512, 8 heads, causal, float64.
- mla: DeepSeek V3's layer shrunk by 4 (q LoRA 384, kv_lora_rank 128, d_nope 32, d_rope 16,
  d_v 32): the naive form (the absorbed one is computed only on runs that show it).
- gate: Qwen3-Next's output gate over 8 heads of d_k 64 (σ(X·W_G) times each head's output).
- linear: Katharopoulos' linear attention, every stage kept (the parallel T×T weights, the
  state after every token, the chunked form), 2 heads of 16, d_model 32.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

D_MODEL, HEADS = 512, 8


def softmax_causal(scores: Any) -> Any:
    """Row softmax of one head's (T, T) scores with key j > query i hidden, in place."""
    T = scores.shape[-1]
    scores[np.triu(np.ones((T, T), dtype=bool), 1)] = -np.inf
    scores -= scores.max(-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(-1, keepdims=True)
    return scores


def mla_case(seq: int, rng: np.random.Generator) -> tuple[dict[str, Any], Callable[[], Any]]:
    q_rank, rank, nope, rope, dv = 384, 128, 32, 16, 32

    def w(*shape: int) -> Any:
        return rng.standard_normal(shape) / np.sqrt(shape[0])

    X = rng.standard_normal((seq, D_MODEL))
    m = {
        "W_DQ": w(D_MODEL, q_rank),
        "q_norm": 1 + 0.1 * rng.standard_normal(q_rank),
        "W_UQ": w(q_rank, HEADS * (nope + rope)),
        "W_DKV": w(D_MODEL, rank),
        "kv_norm": 1 + 0.1 * rng.standard_normal(rank),
        "W_UK": w(rank, HEADS * nope),
        "W_UV": w(rank, HEADS * dv),
        "W_KR": w(D_MODEL, rope),
    }
    fixture = {"X": X, "heads": HEADS, "causal": True, "mla": m}

    def rms(x: Any, weight: Any) -> Any:
        return weight * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)

    def rotate(x: Any) -> Any:  # interleaved pairs, written [evens | odds] as transformers does
        inv = 10000.0 ** (-np.arange(0, rope, 2) / rope)
        angle = np.arange(seq)[:, None] * inv
        cos, sin = np.cos(angle), np.sin(angle)
        even, odd = x[..., 0::2], x[..., 1::2]
        return np.concatenate([even * cos - odd * sin, odd * cos + even * sin], axis=-1)

    def plain() -> Any:
        q = (rms(X @ m["W_DQ"], m["q_norm"]) @ m["W_UQ"]).reshape(seq, HEADS, nope + rope)
        q = q.transpose(1, 0, 2)  # (H, T, nope + rope)
        c = rms(X @ m["W_DKV"], m["kv_norm"])  # (T, rank)
        k_nope = (c @ m["W_UK"]).reshape(seq, HEADS, nope).transpose(1, 0, 2)
        v = (c @ m["W_UV"]).reshape(seq, HEADS, dv).transpose(1, 0, 2)
        k_rope = rotate(X @ m["W_KR"])  # (T, rope), one for all heads
        q_rope = rotate(q[..., nope:])
        out = np.empty((HEADS, seq, dv))
        for h in range(HEADS):  # one head's (T, T) at a time, as a careful reader would
            scores = q[h, :, :nope] @ k_nope[h].T + q_rope[h] @ k_rope.T
            scores /= np.sqrt(nope + rope)
            out[h] = softmax_causal(scores) @ v[h]
        return out  # (H, T, dv)

    return fixture, plain


def gate_case(seq: int, rng: np.random.Generator) -> tuple[dict[str, Any], Callable[[], Any]]:
    d = D_MODEL // HEADS
    X = rng.standard_normal((seq, D_MODEL))
    W = {n: rng.standard_normal((D_MODEL, D_MODEL)) / np.sqrt(D_MODEL) for n in "QKVG"}
    fixture = {
        "X": X,
        "W_Q": W["Q"],
        "W_K": W["K"],
        "W_V": W["V"],
        "heads": HEADS,
        "causal": True,
        "gate": {"W_G": W["G"]},
    }

    def heads(x: Any) -> Any:
        return x.reshape(seq, HEADS, d).transpose(1, 0, 2)

    def plain() -> Any:
        q, k, v, g = (heads(X @ W[n]) for n in "QKVG")
        out = np.empty((HEADS, seq, d))
        for h in range(HEADS):  # one head's (T, T) at a time
            scores = q[h] @ k[h].T
            scores /= np.sqrt(d)
            out[h] = softmax_causal(scores) @ v[h]
        return out / (1 + np.exp(-g))  # gated (H, T, d)

    return fixture, plain


def linear_case(seq: int, rng: np.random.Generator) -> tuple[dict[str, Any], Callable[[], Any]]:
    """Katharopoulos' linear attention with every stage kept: the three forms attn computes and
    checks (parallel T×T weights, the state after every token, chunks of 64), written plainly;
    2 heads of d_k = d_v = 16 (the states are (H, T, d_k, d_v), kept whole)."""
    heads, d, width, chunk = 2, 16, 32, 64
    X = rng.standard_normal((seq, width)) * 0.7
    W = {n: rng.standard_normal((width, heads * d)) * 0.7 for n in "QKV"}
    fixture = {
        "X": X,
        "W_Q": W["Q"],
        "W_K": W["K"],
        "W_V": W["V"],
        "heads": heads,
        "causal": True,
        "linear_attention": {"chunk": chunk},
    }

    def phi(x: Any) -> Any:
        return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))

    def plain() -> Any:
        q, k, v = ((X @ W[n]).reshape(seq, heads, d).transpose(1, 0, 2) for n in "QKV")  # (H, T, d)
        q, k = phi(q), phi(k)
        below = np.tril(np.ones((seq, seq), dtype=bool))
        out = np.empty((heads, seq, d))
        for h in range(heads):  # parallel: the implicit weights, one head's (T, T) at a time
            w = np.where(below, q[h] @ k[h].T, 0.0)
            out[h] = (w / w.sum(-1, keepdims=True)) @ v[h]
        states, zs = np.empty((heads, seq, d, d)), np.empty((heads, seq, d))
        S, z, rec = np.zeros((heads, d, d)), np.zeros((heads, d)), np.empty((heads, seq, d))
        for t in range(seq):  # recurrent: the state after every token
            S = S + k[:, t, :, None] * v[:, t, None, :]
            z = z + k[:, t]
            states[:, t], zs[:, t] = S, z
            rec[:, t] = (
                np.einsum("hk,hkv->hv", q[:, t], S) / np.einsum("hk,hk->h", q[:, t], z)[:, None]
            )
        S, z, chunked = np.zeros((heads, d, d)), np.zeros((heads, d)), np.empty((heads, seq, d))
        for c0 in range(0, seq, chunk):  # chunked: the carried state plus the chunk's own
            qc, kc, vc = q[:, c0 : c0 + chunk], k[:, c0 : c0 + chunk], v[:, c0 : c0 + chunk]
            intra = np.where(below[: qc.shape[1], : qc.shape[1]], qc @ kc.swapaxes(1, 2), 0.0)
            den = np.einsum("hck,hk->hc", qc, z) + intra.sum(-1)
            chunked[:, c0 : c0 + chunk] = (qc @ S + intra @ vc) / den[..., None]
            S, z = S + kc.swapaxes(1, 2) @ vc, z + kc.sum(1)
        return out  # (H, T, d)

    return fixture, plain


CASES = {
    "mla": (mla_case, "output"),
    "gate": (gate_case, "gated"),
    "linear": (linear_case, None),  # every stage kept: the three forms
}


def measure(seq: int, reps: int, name: str) -> tuple[float, float]:
    from attn_cli.core.pipeline import run
    from attn_cli.io.validate import validate

    make, stage = CASES[name]
    fixture, plain = make(seq, np.random.default_rng(0))
    inputs = validate(fixture, f"{name}.bench")
    keep = None if stage is None else {stage}
    ours = np.asarray(run(inputs, keep=keep)[stage or "output"].data)
    np.testing.assert_allclose(ours, plain(), rtol=1e-9, atol=1e-9)
    times: dict[str, list[float]] = {"attn": [], "numpy": []}
    for _ in range(reps):
        for side, call in (("attn", lambda: run(inputs, keep=keep)), ("numpy", plain)):
            start = time.perf_counter()
            call()
            times[side].append(time.perf_counter() - start)
    return statistics.median(times["attn"]), statistics.median(times["numpy"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", nargs="*", choices=sorted(CASES), default=sorted(CASES))
    args = parser.parse_args()
    print(
        f"variants at seq {args.seq}, d_model {D_MODEL}, {HEADS} heads, causal, float64 "
        f"(median of {args.reps})"
    )
    print(f"{'variant':<8} {'attn s':>8} {'numpy s':>8} {'ratio':>6}  target <= 1.5")
    for name in args.only:
        ours, plain = measure(args.seq, args.reps, name)
        mark = "met" if ours / plain <= 1.5 else "MISSED"
        print(f"{name:<8} {ours:>8.3f} {plain:>8.3f} {ours / plain:>6.2f}  {mark}")


if __name__ == "__main__":
    main()
