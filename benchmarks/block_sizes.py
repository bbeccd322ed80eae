"""Block size and BLAS threads for the score stages, measured in-process (issue 16).

    python benchmarks/block_sizes.py                    # about ten minutes
    python benchmarks/block_sizes.py --busy             # with one core kept busy
    python benchmarks/block_sizes.py --seqs 8192 --rows 64 512 --threads 2 1 --reps 5

Runs ``attn_cli.core.pipeline.run(inputs, keep={"output"})`` (d_model 512, 8 heads, no W_O) with
``BLOCK_ELEMENTS`` monkeypatched (in the pipeline, or in the engine after the split) to
``rows * seq`` so that each block holds ``rows`` query rows, for every row count asked, at the
BLAS thread counts asked (threadpoolctl and ATTN_BLAS_THREADS; 0 is the engine's own rule).
Configurations are interleaved: each repetition runs
every one once, in an order rotated by one each time, so slow spells of a shared machine fall on
all of them alike. Prints medians, each next to the 1-minute load average at its runs, and the
block's bytes. ``rows 0`` stands for the engine as it
is (``BLOCK_ELEMENTS = 2**19``). Not part of the test run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# As bench.py: OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE can pin OpenBLAS to a slower kernel (Haswell
# instead of SkylakeX here); they act when NumPy loads, so drop them and start again.
PINNED = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
if __name__ == "__main__" and any(k in os.environ for k in PINNED):
    env = {k: v for k, v in os.environ.items() if k not in PINNED}
    os.execve(sys.executable, [sys.executable, *sys.argv], env)

import attn_cli.core.engine as engine  # noqa: E402
import attn_cli.core.pipeline as pipeline  # noqa: E402
from attn_cli.io.fixture import validate  # noqa: E402

# The engine asks core/blocks.py for its rows per block; an experiment replaces that answer.
POLICY = engine.rows_per_block

D_MODEL, HEADS = 512, 8
OLD_BLOCK = 1 << 19  # numbers per block before core/blocks.py (attn 0.1): 2**19 // seq rows


@dataclass(frozen=True)
class Config:
    """One way to run: query rows per block (0: the engine's own, -1: attn 0.1's) and threads."""

    rows: int
    threads: int

    def block_rows(self, seq: int, itemsize: int) -> int:
        if self.rows == 0:
            return POLICY(seq, seq, itemsize)
        return min(seq, OLD_BLOCK // seq) if self.rows < 0 else self.rows

    def label(self, seq: int, itemsize: int = 8) -> str:
        tag = {0: " (now)", -1: " (0.1)"}.get(self.rows, "      ")
        threads = f"{self.threads} thr" if self.threads else "rule "
        return f"{self.block_rows(seq, itemsize):>5} rows{tag} {threads}"


def inputs_for(seq: int) -> Any:
    rng = np.random.default_rng(0)
    W = [rng.standard_normal((D_MODEL, D_MODEL)) / D_MODEL**0.5 for _ in range(3)]
    fx = {"X": rng.standard_normal((seq, D_MODEL)), "W_Q": W[0], "W_K": W[1], "W_V": W[2]}
    return validate({**fx, "heads": HEADS}, f"{seq} tokens")


def time_one(inputs: Any, seq: int, dtype: str, config: Config) -> tuple[float, float, float]:
    """Wall and CPU seconds (all threads) of one output-only run, and the load average before."""
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    rows = config.rows

    def policy(seq_q: int, seq_k: int, itemsize: int) -> int:
        if rows == 0:
            return POLICY(seq_q, seq_k, itemsize)  # the engine's own
        if rows < 0:
            return max(1, min(seq_q, OLD_BLOCK // max(seq_k, 1)))  # attn 0.1's rule
        return max(1, min(seq_q, rows))

    engine.rows_per_block = policy  # type: ignore[assignment]
    load = os.getloadavg()[0]
    # threads 0: the engine's own rule (ATTN_BLAS_THREADS=auto); else that many, forced both
    # here and through the variable (the engine's rule would otherwise override the limit)
    os.environ["ATTN_BLAS_THREADS"] = str(config.threads or "auto")
    limits = None if config.threads == 0 else config.threads
    with threadpool_limits(limits=limits, user_api="blas"):
        start, cpu = time.perf_counter(), time.process_time()
        pipeline.run(inputs, keep={"output"}, dtype=dtype)  # type: ignore[arg-type]
        return time.perf_counter() - start, time.process_time() - cpu, load


def measure(seq: int, dtype: str, configs: list[Config], reps: int) -> None:
    """Interleaved repetitions of every config; one printed line per config.

    CPU time counts the BLAS threads' spinning at each rendezvous, so it shows what a block size
    costs even when the wall clock is mostly other people's work.
    """
    inputs = inputs_for(seq)
    times: dict[Config, list[tuple[float, float, float]]] = {c: [] for c in configs}
    for rep in range(reps):
        turn = rep % len(configs)
        for config in configs[turn:] + configs[:turn]:
            times[config].append(time_one(inputs, seq, dtype, config))
    med = statistics.median
    best = min(med(t for t, _, _ in runs) for runs in times.values())
    itemsize = np.dtype(dtype).itemsize
    for config, runs in times.items():
        wall = med(t for t, _, _ in runs)
        cpu = med(c for _, c, _ in runs)
        rows = config.block_rows(seq, itemsize)
        mib = rows * seq * itemsize / 2**20
        loads = [load for _, _, load in runs]
        print(
            f"{dtype:<8}{seq:>6}  {config.label(seq, itemsize)}  block {mib:6.1f} MiB  "
            f"wall {wall:7.3f} s  x{wall / best:5.2f} of best  cpu {cpu:7.3f} s  "
            f"(wall runs {min(t for t, _, _ in runs):.3f}-{max(t for t, _, _ in runs):.3f})  "
            f"load {min(loads):.2f}-{max(loads):.2f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"])
    parser.add_argument("--rows", type=int, nargs="+", default=[0, -1, 128, 256, 512, 1024, 2048])
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[2, 1, 0],
        help="BLAS threads; 0 is the engine's rule (1 when the cores are busy)",
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--busy", action="store_true", help="keep one core busy meanwhile")
    args = parser.parse_args()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    load = f"one core busy (pid {busy.pid})" if busy else "no added load"
    print(
        f"block sizes: d_model {D_MODEL}, {HEADS} heads, output only, median of {args.reps}; "
        f"{load}; patching attn_cli.core.engine.rows_per_block"
    )
    try:
        for seq in args.seqs:
            rows = sorted({r for r in args.rows if r <= seq})
            configs = [Config(r, t) for r in rows for t in args.threads]
            for dtype in args.dtypes:
                measure(seq, dtype, configs, args.reps)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


if __name__ == "__main__":
    main()
