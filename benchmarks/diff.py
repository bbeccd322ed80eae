"""Differential attention at seq 2048: attn's trace against the same math in plain NumPy.

    python benchmarks/diff.py            # about a minute; --reps N for steadier medians

seq 2048, d_model 512, 8 heads (d_k = d_v = 64, two halves of 32), causal, W_O, every stage
kept (attn) or held (NumPy: both maps, the difference, the norm), float64; medians of runs that
alternate the two sides; the outputs are checked equal first. Issue 24's target: within 1.5x.
Not part of the test run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SEQ, D_MODEL, HEADS = 2048, 512, 8


def fixture(seq: int = SEQ) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    W = [rng.standard_normal((D_MODEL, D_MODEL)) / D_MODEL**0.5 for _ in range(4)]
    half = D_MODEL // HEADS // 2
    lam = {
        n: rng.normal(0.0, 0.1, half) for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")
    }
    return {
        "X": rng.standard_normal((seq, D_MODEL)),
        "W_Q": W[0],
        "W_K": W[1],
        "W_V": W[2],
        "W_O": W[3],
        "heads": HEADS,
        "causal": True,
        "diff": {**lam, "depth": 5, "norm": rng.uniform(0.5, 1.5, 2 * half)},
    }


def plain_numpy(fx: dict[str, Any]) -> dict[str, Any]:
    """unilm's MultiheadDiffAttn.forward in direct NumPy, every intermediate held."""
    X, H, d = fx["X"], fx["heads"], fx["diff"]
    T, C = X.shape
    D = C // H
    half = D // 2
    q = (X @ fx["W_Q"]).reshape(T, H, D).transpose(1, 0, 2)  # (H, T, D)
    k = (X @ fx["W_K"]).reshape(T, H, D).transpose(1, 0, 2)
    v = (X @ fx["W_V"]).reshape(T, H, D).transpose(1, 0, 2)
    future = np.triu(np.ones((T, T), bool), 1)
    maps = []
    for part in (slice(0, half), slice(half, D)):
        scores = q[..., part] @ k[..., part].transpose(0, 2, 1)  # (H, T, T)
        scaled = np.where(future, -np.inf, scores / np.sqrt(half))
        e = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
        maps.append((scores, e / e.sum(axis=-1, keepdims=True)))
    init = 0.8 - 0.6 * np.exp(-0.3 * d["depth"])
    lam = np.exp(d["lambda_q1"] @ d["lambda_k1"]) - np.exp(d["lambda_q2"] @ d["lambda_k2"]) + init
    diff = maps[0][1] - lam * maps[1][1]  # (H, T, T)
    out = diff @ v  # (H, T, D)
    normed = out / np.sqrt((out * out).mean(-1, keepdims=True) + 1e-5) * d["norm"]
    concat = (normed * (1 - init)).transpose(1, 0, 2).reshape(T, C)
    return {"maps": maps, "diff": diff, "normed": normed, "projected": concat @ fx["W_O"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seq", type=int, default=SEQ)
    args = parser.parse_args()

    from attn_cli.core.pipeline import run
    from attn_cli.io.fixture import validate

    fx = fixture(args.seq)
    inputs = validate(fx, "bench")
    np.testing.assert_allclose(
        run(inputs)["projected"].data, plain_numpy(fx)["projected"], rtol=1e-9, atol=1e-9
    )
    attn: list[float] = []
    plain: list[float] = []
    out_only: list[float] = []
    for _ in range(args.reps):
        for times, call in (
            (plain, lambda: plain_numpy(fx)),
            (attn, lambda: run(inputs)),
            (out_only, lambda: run(inputs, keep={"projected"})),
        ):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    med = statistics.median
    print(
        f"seq {args.seq}, d_model {D_MODEL}, {HEADS} heads, causal, W_O, float64, "
        f"{args.reps} runs each (medians)"
    )
    print(f"plain NumPy                     {med(plain):7.3f} s")
    print(f"attn, every stage kept          {med(attn):7.3f} s   {med(attn) / med(plain):.2f}x")
    print(
        f"attn, projected only            {med(out_only):7.3f} s   "
        f"{med(out_only) / med(plain):.2f}x"
    )


if __name__ == "__main__":
    main()
