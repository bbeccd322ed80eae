"""``attn flash`` against plain NumPy full attention, as whole processes (issue 27).

    python benchmarks/flash.py                     # 8,192 float32 tokens, 64×64 tiles
    python benchmarks/flash.py --seq 2048 --tile 128 --busy --one-thread

8 query heads, 2 key/value heads, d 64, causal, a direct-mode fixture (Q, K, V in .npy files
beside it). attn's side is ``attn flash FIXTURE --dtype float32 --block-q N --block-k N -f
plain`` (the first tiles' tables; O, L and exp(x − L) checked against a streamed reference);
NumPy's is a script that computes one head at a time, its (T, T) scores whole, masked, softmaxed
in place and multiplied by V. Both are started, timed and measured (peak RSS from wait4) by
bench.py's launcher, alternating, median of ``--reps`` paired rounds; ``--one-thread`` adds attn
with ``ATTN_BLAS_THREADS=1`` (the busy-core target: within 1.5x of it). Targets (issue 27): at
8,192 float32 tokens with 64×64 tiles attn / NumPy <= 1.5 in time and <= 0.5 in memory.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import ROOT, child_env, measure
from decode import write_fixture as decode_fixture

HEADS, KV_HEADS, D = 8, 2, 64

NUMPY_FULL = """\
import sys
import numpy as np
folder, T, dtype = sys.argv[1], int(sys.argv[2]), sys.argv[3]
q = np.load(f"{folder}/Q.npy").astype(dtype).reshape(T, 8, 64).transpose(1, 0, 2).copy()
k = np.load(f"{folder}/K.npy").astype(dtype).reshape(T, 2, 64).transpose(1, 0, 2).copy()
v = np.load(f"{folder}/V.npy").astype(dtype).reshape(T, 2, 64).transpose(1, 0, 2).copy()
above = np.triu(np.ones((T, T), bool), 1)  # causal: key j > query i is hidden
out = np.empty((8, T, 64), dtype)
for h in range(8):
    att = q[h] @ k[h // 4].T  # (T, T)
    att *= np.asarray(0.125, dtype)
    att[above] = -np.inf
    att -= att.max(-1, keepdims=True)
    np.exp(att, out=att)
    att /= att.sum(-1, keepdims=True)
    out[h] = att @ v[h // 4]
print(float(out.sum()))
"""


def write_fixture(folder: Path, seq: int) -> Path:
    """decode.py's direct-mode fixture (Q, K, V in .npy files beside it), with no window."""
    return decode_fixture(folder, seq, 0)


def run_pair(seq: int, tile: int, dtype: str, reps: int, one_thread: bool) -> dict[str, float]:
    env = child_env()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        fixture = write_fixture(folder, seq)
        attn = [
            sys.executable,
            "-m",
            "attn_cli",
            "flash",
            str(fixture),
            "--dtype",
            dtype,
            "--block-q",
            str(tile),
            "--block-k",
            str(tile),
            "-f",
            "plain",
        ]
        plain = [sys.executable, "-c", NUMPY_FULL, str(folder), str(seq), dtype]
        sides = {"attn": (attn, env), "numpy": (plain, env)}
        if one_thread:
            sides["attn1"] = (attn, {**env, "ATTN_BLAS_THREADS": "1"})
        runs: dict[str, list[tuple[float, int]]] = {name: [] for name in sides}
        for _ in range(reps):
            for name, (cmd, side_env) in sides.items():
                r = measure(cmd, side_env)
                runs[name].append((r.wall, r.rss))
    row: dict[str, float] = {"seq": seq, "tile": tile}
    for name, got in runs.items():
        row[f"{name}_s"] = statistics.median(w for w, _ in got)
        row[f"{name}_mib"] = statistics.median(m for _, m in got) / 2**20
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, nargs="*", default=[8192])
    parser.add_argument("--tile", type=int, default=64, help="block_q = block_k")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--busy", action="store_true", help="spin a process on a core meanwhile")
    parser.add_argument("--one-thread", action="store_true", help="attn with 1 BLAS thread too")
    args = parser.parse_args()
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        rows = [
            run_pair(seq, args.tile, args.dtype, args.reps, args.one_thread) for seq in args.seq
        ]
    finally:
        if spin is not None:
            spin.kill()
    busy = ", busy" if args.busy else ""
    print(
        f"attn flash vs NumPy full attention ({HEADS} heads, {KV_HEADS} kv, d {D}, causal, "
        f"{args.dtype}, {args.tile}x{args.tile} tiles{busy}; {ROOT.name})"
    )
    print(
        f"{'tokens':>7} {'attn s':>8} {'numpy s':>8} {'ratio':>6} {'attn MiB':>9} "
        f"{'numpy MiB':>10} {'ratio':>6}"
        + (f" {'1-thread s':>10} {'ratio':>6}" if args.one_thread else "")
    )
    for r in rows:
        line = (
            f"{r['seq']:>7} {r['attn_s']:>8.2f} {r['numpy_s']:>8.2f} "
            f"{r['attn_s'] / r['numpy_s']:>6.2f} {r['attn_mib']:>9.1f} "
            f"{r['numpy_mib']:>10.1f} {r['attn_mib'] / r['numpy_mib']:>6.2f}"
        )
        if args.one_thread:
            line += f" {r['attn1_s']:>10.2f} {r['attn_s'] / r['attn1_s']:>6.2f}"
        print(line)


if __name__ == "__main__":
    main()
