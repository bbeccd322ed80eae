"""``attn decode`` against a plain NumPy KV-cache loop, as whole processes (issue 27).

    python benchmarks/decode.py                    # 512..4096 tokens, about three minutes
    python benchmarks/decode.py --seq 1024 --reps 5
    python benchmarks/decode.py --busy             # with another process spinning on a core

8 query heads, 2 key/value heads, d 64, causal, float64, a direct-mode fixture (Q, K, V in .npy
files beside it). attn's side is ``attn decode FIXTURE -f plain`` (tables of the first and last
steps, every step checked against the full trace, which it computes too); NumPy's is a script that
holds the cache in one preallocated array and computes each step's scores, softmax and output
(grouped heads, no copies). Both are started, timed and measured (peak RSS from wait4) by
bench.py's launcher, alternating, median of ``--reps`` paired rounds. The memory growth exponent
is the slope of log(peak − the interpreter's floor) against log(tokens) from the smallest to the
largest sequence. Targets (issue 27): at 1,024 tokens attn / NumPy <= 2 in time and in memory;
growth exponent <= 1.2; 4,096 tokens and a 128-window at 16,384 within the default budget.

    python benchmarks/decode.py --linear           # the linear row: a state, not a cache

``--linear`` (issue 24) measures what a generation loop holds, in this process with tracemalloc
(the peak of what the loop allocates, the inputs already there): linear attention's loop
(core/decode_state.py, Katharopoulos' S and z of the same 2 kv heads, each step dropped once
taken, as a generator loop drops it) against the KV-cache loop of softmax attention
(core/decode.py); then ``attn decode`` of a linear-attention fixture as a whole process (peak
RSS, which holds the fixture's Q, K, V and every step's output: O(T) numbers, not the state).
Target: the state loop's growth exponent ~0 from 512 to 4,096 tokens.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import ROOT, child_env, measure

HEADS, KV_HEADS, D = 8, 2, 64

NUMPY_LOOP = """\
import sys
import numpy as np
folder, T, window = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
q = np.load(f"{folder}/Q.npy").reshape(T, 8, 64).transpose(1, 0, 2)  # (H, T, D)
k = np.load(f"{folder}/K.npy").reshape(T, 2, 64).transpose(1, 0, 2)  # (Hkv, T, D)
v = np.load(f"{folder}/V.npy").reshape(T, 2, 64).transpose(1, 0, 2)
C = T if window == 0 else window
K, V = np.zeros((2, C, 64)), np.zeros((2, C, 64))
out = np.empty((T, 8, 64))
for t in range(T):
    slot = t % C
    K[:, slot], V[:, slot] = k[:, t], v[:, t]
    n = min(t + 1, C)
    s = q[:, t].reshape(2, 4, 64) @ K[:, :n].transpose(0, 2, 1) / 8.0  # (Hkv, g, n)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    out[t] = (w @ V[:, :n]).reshape(8, 64)
print(float(out.sum()))
"""


def write_fixture(folder: Path, seq: int, window: int) -> Path:
    import numpy as np

    rng = np.random.default_rng(0)
    for name, width in (("Q", HEADS * D), ("K", KV_HEADS * D), ("V", KV_HEADS * D)):
        np.save(folder / f"{name}.npy", rng.standard_normal((seq, width)))
    text = "Q: {file: Q.npy}\nK: {file: K.npy}\nV: {file: V.npy}\n"
    text += f"heads: {HEADS}\nkv_heads: {KV_HEADS}\ncausal: true\n"
    if window:
        text += f"window: {window}\n"
    path = folder / "fixture.yaml"
    path.write_text(text)
    return path


def run_pair(seq: int, window: int, reps: int) -> dict[str, float]:
    env = child_env()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        fixture = write_fixture(folder, seq, window)
        attn = [sys.executable, "-m", "attn_cli", "decode", str(fixture), "-f", "plain"]
        plain = [sys.executable, "-c", NUMPY_LOOP, str(folder), str(seq), str(window)]
        floor = [sys.executable, "-c", "import numpy"]
        runs: dict[str, list[tuple[float, int]]] = {"attn": [], "numpy": [], "floor": []}
        for _ in range(reps):
            for name, cmd in (("attn", attn), ("numpy", plain), ("floor", floor)):
                r = measure(cmd, env)
                runs[name].append((r.wall, r.rss))
    med = {
        n: (statistics.median(w for w, _ in v), statistics.median(m for _, m in v))
        for n, v in runs.items()
    }
    return {
        "seq": seq,
        "window": window,
        "attn_s": med["attn"][0],
        "numpy_s": med["numpy"][0],
        "attn_mib": med["attn"][1] / 2**20,
        "numpy_mib": med["numpy"][1] / 2**20,
        "floor_mib": med["floor"][1] / 2**20,
    }


def loop_peaks(seq: int) -> tuple[float, float, int]:
    """Peak KiB the state loop and the KV-cache loop allocate over ``seq`` tokens (inputs made
    before), and the state's bytes."""
    import tracemalloc

    import numpy as np

    from attn_cli.core.chain import Chain
    from attn_cli.core.decode import decode
    from attn_cli.core.decode_state import iter_steps
    from attn_cli.core.plugins.linear import PlainRecurrence
    from attn_cli.io.fixture import validate

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, HEADS, seq, D))
    k, v = (rng.standard_normal((1, KV_HEADS, seq, D)) for _ in range(2))
    rec = PlainRecurrence(q, k, v, chunk=64)
    state = rec.init()
    state_size = sum(a.nbytes for a in state.values())
    chain = Chain(
        validate({"Q": [[0.0] * D], "K": [[0.0] * D], "V": [[0.0] * D], "causal": True}, "bench")
    )
    positions = np.arange(seq)  # an input too: made before the loops are measured
    peaks = []
    for loop in ("state", "cache"):
        tracemalloc.start()
        if loop == "state":
            total = 0.0
            for step in iter_steps(rec, state, 0, positions):  # each step dropped
                total += float(step.output.sum())
        else:
            decode(q, k, v, chain=chain, scale=1 / 8, prefill=1, positions=positions)
        peaks.append(tracemalloc.get_traced_memory()[1] / 1024)
        tracemalloc.stop()
    return peaks[0], peaks[1], state_size


def write_linear_fixture(folder: Path, seq: int) -> Path:
    """A linear-attention fixture of d_model 64 projected to the same heads."""
    import numpy as np

    rng = np.random.default_rng(0)
    np.save(folder / "X.npy", rng.standard_normal((seq, D)))
    for name, width in (("W_Q", HEADS * D), ("W_K", KV_HEADS * D), ("W_V", KV_HEADS * D)):
        np.save(folder / f"{name}.npy", rng.standard_normal((D, width)) / 8)
    text = "X: {file: X.npy}\nW_Q: {file: W_Q.npy}\nW_K: {file: W_K.npy}\nW_V: {file: W_V.npy}\n"
    text += f"heads: {HEADS}\nkv_heads: {KV_HEADS}\ncausal: true\nlinear_attention: true\n"
    path = folder / "fixture.yaml"
    path.write_text(text)
    return path


def linear_rows(seqs: list[int], reps: int) -> None:
    """The linear row: the loops' peaks and attn decode's RSS, with growth exponents."""
    env = child_env()
    rows = []
    for seq in seqs:
        state_kib, cache_kib, state_bytes = loop_peaks(seq)
        with tempfile.TemporaryDirectory() as tmp:
            fixture = write_linear_fixture(Path(tmp), seq)
            cmd = [sys.executable, "-m", "attn_cli", "decode", str(fixture), "-f", "plain"]
            rss = statistics.median(measure(cmd, env).rss for _ in range(reps)) / 2**20
        rows.append((seq, state_kib, cache_kib, state_bytes, rss))
    print(
        f"linear attention decode vs a KV cache ({HEADS} heads, {KV_HEADS} kv, d {D}, causal, "
        f"float64; {ROOT.name})"
    )
    print(
        f"{'tokens':>7} {'state B':>8} {'state loop KiB':>15} {'cache loop KiB':>15} "
        f"{'attn decode MiB':>16}"
    )
    for seq, s_kib, c_kib, s_bytes, rss in rows:
        print(f"{seq:>7} {s_bytes:>8} {s_kib:>15.1f} {c_kib:>15.1f} {rss:>16.1f}")
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        span = math.log(last[0] / first[0])
        for name, i in (("state loop", 1), ("KV-cache loop", 2), ("attn decode RSS", 4)):
            print(
                f"{name}: growth exponent {math.log(last[i] / first[i]) / span:.2f} "
                f"from {first[0]} to {last[0]} tokens"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, nargs="*", default=[512, 1024, 2048, 4096])
    parser.add_argument("--window", type=int, default=0, help="a sliding window (0: none)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--busy", action="store_true", help="spin a process on a core meanwhile")
    parser.add_argument("--linear", action="store_true", help="the linear row (issue 24)")
    args = parser.parse_args()
    if args.linear:
        linear_rows(args.seq, args.reps)
        return
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        rows = [run_pair(seq, args.window, args.reps) for seq in args.seq]
    finally:
        if spin is not None:
            spin.kill()
    busy = ", busy" if args.busy else ""
    print(
        f"attn decode vs a NumPy KV-cache loop ({HEADS} heads, {KV_HEADS} kv, d {D}, causal, "
        f"window {args.window or 'none'}{busy}; {ROOT.name})"
    )
    print(
        f"{'tokens':>7} {'attn s':>8} {'numpy s':>8} {'ratio':>6} {'attn MiB':>9} "
        f"{'numpy MiB':>10} {'ratio':>6}"
    )
    for r in rows:
        print(
            f"{r['seq']:>7} {r['attn_s']:>8.2f} {r['numpy_s']:>8.2f} "
            f"{r['attn_s'] / r['numpy_s']:>6.2f} {r['attn_mib']:>9.1f} {r['numpy_mib']:>10.1f} "
            f"{r['attn_mib'] / r['numpy_mib']:>6.2f}"
        )
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        above = [(r["attn_mib"] - r["floor_mib"]) for r in (first, last)]
        slope = math.log(above[1] / above[0]) / math.log(last["seq"] / first["seq"])
        print(
            f"memory growth above the interpreter's floor ({first['floor_mib']:.1f} MiB): "
            f"exponent {slope:.2f} from {first['seq']} to {last['seq']} tokens"
        )


if __name__ == "__main__":
    main()
