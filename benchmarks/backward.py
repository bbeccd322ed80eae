"""``attn trace --backward`` (input gradients only) against a plain NumPy manual backward, as
whole processes (issue 27).

    python benchmarks/backward.py                  # 2,048 float64 tokens
    python benchmarks/backward.py --seq 1024 2048 4096 --busy

8 query heads, 2 key/value heads, d 64, causal, a direct-mode fixture (Q, K, V in .npy files
beside it), L = Σ output. attn's side is ``attn trace FIXTURE --backward -s d_Q -s d_K -s d_V -f
npz -o OUT`` (the forward streamed, then the backward blocked: the weights recomputed per block
from the log-sum-exp); NumPy's is a script that computes every head's (T, T) weights whole,
keeps them, and runs the textbook backward (dP = dO·Vᵀ, dS = P ∘ (dP − rowsum(dP ∘ P)), dQ,
dK, dV with the GQA groups summed), writing the same npz. Both are started, timed and measured
(peak RSS from wait4) by bench.py's launcher, alternating, median of ``--reps`` paired rounds;
``--torch-python PY`` adds torch autograd on the same inputs. Target (issue 27): at 2,048
float64 tokens attn / NumPy <= 1.3 in time and in memory.
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

NUMPY_BACKWARD = """\
import sys
import numpy as np
folder, T, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
q = np.load(f"{folder}/Q.npy").reshape(T, 8, 64).transpose(1, 0, 2).copy()  # (H, T, D)
k = np.load(f"{folder}/K.npy").reshape(T, 2, 64).transpose(1, 0, 2).copy()  # (Hkv, T, D)
v = np.load(f"{folder}/V.npy").reshape(T, 2, 64).transpose(1, 0, 2).copy()
scale = 0.125
qg = q.reshape(2, 4 * T, 64)  # (Hkv, g*T, D): each kv head's query heads stacked
P = (qg @ k.transpose(0, 2, 1)).reshape(8, T, T) * scale  # (H, T, T)
P[:, np.triu(np.ones((T, T), bool), 1)] = -np.inf
P -= P.max(-1, keepdims=True)
np.exp(P, out=P)
P /= P.sum(-1, keepdims=True)
dO = np.ones((8, T, 64))
dP = (dO.reshape(2, 4 * T, 64) @ v.transpose(0, 2, 1)).reshape(8, T, T)  # (H, T, T)
dS = P * (dP - (dP * P).sum(-1, keepdims=True))
dS *= scale
dQ = (dS.reshape(2, 4 * T, T) @ k).reshape(8, T, 64)
dK = (dS.reshape(2, 4, T, T).transpose(0, 1, 3, 2) @ q.reshape(2, 4, T, 64)).sum(1)
dV = (P.reshape(2, 4, T, T).transpose(0, 1, 3, 2) @ dO.reshape(2, 4, T, 64)).sum(1)
np.savez(out, d_Q=dQ, d_K=dK, d_V=dV)
"""

TORCH_BACKWARD = """\
import sys
import numpy as np
import torch
import torch.nn.functional as F
folder, T, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def load(name, heads):
    x = torch.from_numpy(np.load(f"{folder}/{name}.npy")).view(T, heads, 64).transpose(0, 1)
    return x.contiguous().requires_grad_()
q, k, v = load("Q", 8), load("K", 2), load("V", 2)
o = F.scaled_dot_product_attention(q, k.repeat_interleave(4, 0), v.repeat_interleave(4, 0),
                                   is_causal=True)
o.sum().backward()
np.savez(out, d_Q=q.grad.numpy(), d_K=k.grad.numpy(), d_V=v.grad.numpy())
"""


def write_fixture(folder: Path, seq: int) -> Path:
    """decode.py's direct-mode fixture (Q, K, V in .npy files beside it), with no window."""
    return decode_fixture(folder, seq, 0)


def same_gradients(attn: Path, numpy: Path) -> float:
    """The largest relative difference of attn's d_Q, d_K, d_V from NumPy's."""
    import numpy as np

    worst = 0.0
    with np.load(attn) as a, np.load(numpy) as n:
        for name in ("d_Q", "d_K", "d_V"):
            ours, ref = a[name], n[name]  # (heads, tokens, d) both
            worst = max(worst, float(np.abs(ours - ref).max() / (1 + np.abs(ref).max())))
    return worst


def run_pair(seq: int, reps: int, torch_python: str | None) -> dict[str, float]:
    env = child_env()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        fixture = write_fixture(folder, seq)
        out = {side: folder / f"{side}.npz" for side in ("attn", "numpy", "torch")}
        sides = {
            "attn": [
                sys.executable,
                "-m",
                "attn_cli",
                "trace",
                str(fixture),
                "--backward",
                "-s",
                "d_Q",
                "-s",
                "d_K",
                "-s",
                "d_V",
                "-f",
                "npz",
                "-o",
                str(out["attn"]),
            ],
            "numpy": [
                sys.executable,
                "-c",
                NUMPY_BACKWARD,
                str(folder),
                str(seq),
                str(out["numpy"]),
            ],
        }
        if torch_python:
            sides["torch"] = [
                torch_python,
                "-c",
                TORCH_BACKWARD,
                str(folder),
                str(seq),
                str(out["torch"]),
            ]
        runs: dict[str, list[tuple[float, int]]] = {name: [] for name in sides}
        for _ in range(reps):
            for name, cmd in sides.items():
                r = measure(cmd, env)
                runs[name].append((r.wall, r.rss))
        row: dict[str, float] = {"seq": seq, "diff": same_gradients(out["attn"], out["numpy"])}
    for name, got in runs.items():
        row[f"{name}_s"] = statistics.median(w for w, _ in got)
        row[f"{name}_mib"] = statistics.median(m for _, m in got) / 2**20
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, nargs="*", default=[2048])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--busy", action="store_true", help="spin a process on a core meanwhile")
    parser.add_argument("--torch-python", help="an interpreter that imports torch")
    args = parser.parse_args()
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        rows = [run_pair(seq, args.reps, args.torch_python) for seq in args.seq]
    finally:
        if spin is not None:
            spin.kill()
    busy = ", busy" if args.busy else ""
    print(
        f"attn trace --backward (d_Q, d_K, d_V) vs a NumPy manual backward ({HEADS} heads, "
        f"{KV_HEADS} kv, d {D}, causal, float64{busy}; {ROOT.name})"
    )
    head = (
        f"{'tokens':>7} {'attn s':>8} {'numpy s':>8} {'ratio':>6} {'attn MiB':>9} "
        f"{'numpy MiB':>10} {'ratio':>6} {'max rel diff':>13}"
    )
    print(head + (f" {'torch s':>8} {'torch MiB':>10}" if args.torch_python else ""))
    for r in rows:
        line = (
            f"{r['seq']:>7} {r['attn_s']:>8.2f} {r['numpy_s']:>8.2f} "
            f"{r['attn_s'] / r['numpy_s']:>6.2f} {r['attn_mib']:>9.1f} "
            f"{r['numpy_mib']:>10.1f} {r['attn_mib'] / r['numpy_mib']:>6.2f} "
            f"{r['diff']:>13.1e}"
        )
        if args.torch_python:
            line += f" {r['torch_s']:>8.2f} {r['torch_mib']:>10.1f}"
        print(line)


if __name__ == "__main__":
    main()
