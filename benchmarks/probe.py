"""``attn probe`` on a NumPy attention function, timed as a whole process (issue 38).

    python benchmarks/probe.py            # 5 runs; --reps N for more

Not part of the test run. Each run is a fresh ``python -m attn_cli probe FILE:attention -f json``
(start-up, loading the file, every convention's calls, the JSON) on a plain NumPy attention
written to a temporary folder; beside it, ``python -m attn_cli --help`` as the start-up floor.
Prints the median and the slowest of each. Target: the probe under 5 s on this machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ATTENTION = """
import math
import numpy as np

def attention(q, k, v, causal=False, mask=None, scale=None, window=None):
    T, S = q.shape[-2], k.shape[-2]
    groups = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    c = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * c
    i, j = np.arange(T)[:, None], np.arange(S)[None, :]
    allowed = np.ones(s.shape, dtype=bool)
    if causal or window is not None:
        allowed &= j <= i
    if window is not None:
        allowed &= i - j < window
    if mask is not None:
        allowed &= mask
    s = np.where(allowed, s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0) @ v
"""


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    reps = parser.parse_args().reps
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "student.py"
        target.write_text(ATTENTION)
        probe = [sys.executable, "-m", "attn_cli", "probe", f"{target}:attention", "-f", "json"]
        floor = [sys.executable, "-m", "attn_cli", "--help"]
        timed(probe, env)  # warm the bytecode and the page cache
        runs: dict[str, list[float]] = {"probe": [], "--help": []}
        for _ in range(reps):  # alternate, so that a busy moment falls on both
            runs["probe"].append(timed(probe, env))
            runs["--help"].append(timed(floor, env))
    for name, seconds in runs.items():
        print(
            f"attn {name:7s} median {statistics.median(seconds):.3f} s, "
            f"slowest {max(seconds):.3f} s ({reps} runs)"
        )
    verdict = "under" if max(runs["probe"]) < 5 else "OVER"
    print(f"target: the probe under 5 s: {verdict}")


if __name__ == "__main__":
    main()
