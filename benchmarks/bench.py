"""attn's benchmarks: ratios measured side by side, in one run, on this machine.

    python benchmarks/bench.py            # about two minutes; --reps N for steadier medians
    python benchmarks/bench.py --sweep    # long sequences (issue 16); see --help

Not part of the test run. Every measurement runs in a fresh subprocess whose environment has
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed (they can pin OpenBLAS to a slow kernel) and
PYTHONDONTWRITEBYTECODE removed (so attn's modules load from bytecode, as after an install).
Times are medians of repetitions that alternate between the two sides of each ratio.

1. start-up   `attn trace` (default example) / `python -c "import numpy, typer, rich.console,
              rich.table, yaml"`                                          target <= 1.25
              and `attn --help` / `python -c "import numpy"`              target < 1
              (--startup: only this one)
2. compute    tracing seq 2048, d_model 512, 8 heads, W_O, every stage kept, no rendering /
              the same math in plain NumPy                                target <= 1.2
              (and / torch scaled_dot_product_attention on the CPU, when torch imports)
3. memory     (peak RSS - RSS after imports) / bytes of the stages kept   target <= 1.5
4. rendering  elided 4096-token trace / the 3-token default, same shapes  target <= 3
5. loading    the same 2048x512 (+ 3 x 512x64) arrays: YAML / JSON        target <= 2
              (and .npy references / JSON)
6. decode     `attn decode` 1,024 tokens / a NumPy KV-cache loop (8 heads, 2 kv, d 64,
              causal), time and peak memory; memory growth 512 to 4,096    target <= 2, <= 1.2
7. flash      `attn flash` 8,192 float32, 64x64 tiles / NumPy full attention:
              time, memory; busy: 128x128 tiles / one BLAS thread          target <= 1.5, <= 0.5
8. backward   `attn trace --backward` 2,048 float64 / a NumPy manual
              backward, time and memory (and torch autograd with
              --torch-python)                                             target <= 1.3
              6-8 run quiet, then with a core busy (decode.py, flash.py, backward.py: the sides,
              and other sizes); --no-methods skips them.

--sweep: seq 1024..16384 (--max-seq stops earlier), float32 and float64, d_model 512, 8 heads,
only ``output`` kept. Three subprocesses read the same whole-fixture .npz and write their output
as .npz: ``attn trace FIXTURE.npz --stage output --format npz -o OUT``, a plain NumPy script
computing one head at a time, and torch's CPU scaled_dot_product_attention (when torch imports in
``--torch-python``). Each child is started, timed and measured (wait4's ru_maxrss) by a small
launcher process, never wrapped, so that its peak is its own (see LAUNCHER). Every figure has a
one-BLAS-thread line (OPENBLAS_NUM_THREADS=1, OMP_NUM_THREADS=1)
beside it and the 1-minute load average at its runs; ``--busy`` runs
``python -c "while True: pass"`` during the measurement.
Targets (issue 16): attn / NumPy <= 1.2 in wall time and <= 1 in peak memory at every seq;
attn / torch <= 1 at 16384.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SEQ, D_MODEL, HEADS = 2048, 512, 8
RENDER_SEQ = 4096


def child_env() -> dict[str, str]:
    drop = {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "PYTHONDONTWRITEBYTECODE"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.pop("CI", None)  # the same code paths as on a developer's machine
    env["NO_COLOR"] = "1"
    return env


def child(task: str, *args: str, python: str = sys.executable) -> Any:
    """Run ``bench.py --child TASK ARGS`` in a fresh interpreter; its last line is JSON."""
    cmd = [python, str(Path(__file__).resolve()), "--child", task, *args]
    out = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{task} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=child_env(), stdout=subprocess.DEVNULL, check=True, cwd=ROOT)
    return time.perf_counter() - start


def verdict(ratio: float, target: float) -> str:
    return "met" if ratio <= target else "missed"


# ---------------------------------------------------------------------------------------------
# Children: each prints one JSON line


def child_machine() -> dict[str, Any]:
    import numpy as np

    info: dict[str, Any] = {"numpy": np.__version__}
    blas = np.__config__.CONFIG.get("Build Dependencies", {}).get("blas", {})
    info["blas_build"] = f"{blas.get('name')} {blas.get('version')}"
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        info["kernel"] = "threadpoolctl not installed: the BLAS kernel in use is not known"
    else:
        pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
        info["kernel"] = "; ".join(
            f"{p.get('internal_api')} {p.get('version')}, kernel {p.get('architecture')}, "
            f"{p.get('num_threads')} threads"
            for p in pools
        )
    return info


def fixture_arrays(seq: int, d_model: int, heads: int, out: bool = True) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    W = [rng.standard_normal((d_model, d_model)) / d_model**0.5 for _ in range(4)]
    fx = {"X": rng.standard_normal((seq, d_model)), "W_Q": W[0], "W_K": W[1], "W_V": W[2]}
    if out:
        fx["W_O"] = W[3]
    return {**fx, "heads": heads}


def plain_numpy(
    X: Any, W_Q: Any, W_K: Any, W_V: Any, W_O: Any, heads: int, contiguous: bool = False
) -> Any:
    """The same math in the most direct NumPy, every intermediate held as attn holds it.

    ``contiguous`` copies each head's block into its own array first: the direct version's
    matmuls on transposed views are slower in NumPy, and the tuned one shows by how much.
    """
    import numpy as np

    T, C = X.shape
    d = C // heads
    fix = np.ascontiguousarray if contiguous else (lambda a: a)
    q = fix((X @ W_Q).reshape(T, heads, d).transpose(1, 0, 2))  # (H, T, d)
    k = fix((X @ W_K).reshape(T, heads, d).transpose(1, 0, 2))
    v = fix((X @ W_V).reshape(T, heads, d).transpose(1, 0, 2))
    scores = q @ k.transpose(0, 2, 1)  # (H, T, T)
    scaled = scores / np.sqrt(d)
    e = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    weights = e / e.sum(axis=-1, keepdims=True)
    output = weights @ v  # (H, T, d)
    concat = output.transpose(1, 0, 2).reshape(T, C)
    return scores, scaled, weights, output, concat @ W_O


def child_compute(reps: int) -> dict[str, Any]:
    import numpy as np

    from attn_cli.core.pipeline import run
    from attn_cli.io.fixture import validate

    fx = fixture_arrays(SEQ, D_MODEL, HEADS)
    inputs = validate(fx, "bench")
    arrays = {k: fx[k] for k in ("X", "W_Q", "W_K", "W_V", "W_O")}
    np.testing.assert_allclose(
        run(inputs)["projected"].data, plain_numpy(**arrays, heads=HEADS)[-1], rtol=1e-9, atol=1e-9
    )
    attn: list[float] = []
    plain: list[float] = []
    tuned: list[float] = []
    f32: list[float] = []
    out_only: list[float] = []
    for _ in range(reps):
        for times, call in (
            (plain, lambda: plain_numpy(**arrays, heads=HEADS)),
            (tuned, lambda: plain_numpy(**arrays, heads=HEADS, contiguous=True)),
            (attn, lambda: run(inputs)),
            (f32, lambda: run(inputs, dtype="float32")),
            (out_only, lambda: run(inputs, keep={"projected"})),
        ):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    med = statistics.median
    return {
        "attn": med(attn),
        "plain": med(plain),
        "tuned": med(tuned),
        "float32": med(f32),
        "output": med(out_only),
    }


def child_torch(reps: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    fx = fixture_arrays(SEQ, D_MODEL, HEADS)
    X, W_Q, W_K, W_V, W_O = (torch.from_numpy(fx[k]) for k in ("X", "W_Q", "W_K", "W_V", "W_O"))
    T, C = X.shape
    d = C // HEADS

    def sdpa() -> Any:
        with torch.no_grad():
            q, k, v = ((X @ W).view(T, HEADS, d).transpose(0, 1) for W in (W_Q, W_K, W_V))
            out = F.scaled_dot_product_attention(q, k, v)  # (H, T, d), float64
            return out.transpose(0, 1).reshape(T, C) @ W_O

    sdpa()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        sdpa()
        times.append(time.perf_counter() - start)
    return {
        "torch": statistics.median(times),
        "version": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def rss_peak() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def child_memory(path: str, keep: str, dtype: str) -> dict[str, Any]:
    import numpy as np

    import attn_cli.core.pipeline
    import attn_cli.io.fixture

    base = rss_peak()
    inputs = attn_cli.io.fixture.load_fixture(path)
    trace = attn_cli.core.pipeline.run(
        inputs,
        keep=None if keep == "all" else keep.split(","),
        dtype=dtype,  # type: ignore[arg-type]
    )
    peak = rss_peak()
    # bytes of the stages, counting memory two stages share (concat is a view of output) once
    roots: dict[int, int] = {}
    for stage in trace:
        arr = stage.data
        while isinstance(arr.base, np.ndarray):
            arr = arr.base
        roots[id(arr)] = arr.nbytes
    return {"base": base, "peak": peak, "kept": sum(roots.values()), "stages": list(trace.stages)}


def child_render(reps: int) -> dict[str, Any]:
    import io

    import numpy as np
    from rich.console import Console

    from attn_cli.core.pipeline import run
    from attn_cli.io.examples import find_example
    from attn_cli.io.fixture import load_fixture, validate
    from attn_cli.present.render import RenderOptions, render_trace

    default = find_example("the_cat_sat")
    assert default is not None
    small = run(load_fixture(default))
    rng = np.random.default_rng(0)

    def like_default(seq: int) -> Any:  # the default's shapes: d_model 4, d_k 2, one head
        fx = {
            "X": rng.standard_normal((seq, 4)),
            "W_Q": rng.standard_normal((4, 2)),
            "W_K": rng.standard_normal((4, 2)),
            "W_V": rng.standard_normal((4, 2)),
        }
        return run(validate(fx, f"{seq} tokens"))

    big, twelve = like_default(RENDER_SEQ), like_default(12)

    def render(trace: Any, heat: bool = False) -> None:
        console = Console(file=io.StringIO(), width=100, color_system="truecolor" if heat else None)
        console.print(render_trace(trace, RenderOptions(heatmap=heat)))

    cases = {
        "small": (small, False),
        "big": (big, False),
        "twelve": (twelve, False),
        "small_heat": (small, True),
        "big_heat": (big, True),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for trace, heat in cases.values():
        render(trace, heat)  # warm-up: first-use imports and caches
    for _ in range(reps):
        for name, (trace, heat) in cases.items():
            start = time.perf_counter()
            render(trace, heat)
            times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def child_load(folder: str, reps: int) -> dict[str, Any]:
    from attn_cli.io.fixture import load_fixture

    paths = {kind: Path(folder) / f"fixture.{kind}" for kind in ("json", "yaml")}
    paths["npy"] = Path(folder) / "refs.yaml"
    times: dict[str, list[float]] = {k: [] for k in paths}
    errors: dict[str, str] = {}
    shapes = set()
    for _ in range(reps):
        for kind, path in paths.items():
            if kind in errors:
                continue
            start = time.perf_counter()
            try:
                inputs = load_fixture(path)
            except Exception as e:  # e.g. references not supported by this checkout
                errors[kind] = f"{type(e).__name__}: {e}"
                continue
            times[kind].append(time.perf_counter() - start)
            shapes.add((kind, inputs.X.shape if inputs.X is not None else None))
    out: dict[str, Any] = {k: statistics.median(v) for k, v in times.items() if v}
    out["errors"] = errors
    return out


def write_load_files(folder: Path) -> None:
    import numpy as np

    fx = fixture_arrays(SEQ, D_MODEL, HEADS, out=False)
    fx = {k: v for k, v in fx.items() if k != "heads"}
    W = {k: np.ascontiguousarray(v[:, :64]) for k, v in fx.items() if k != "X"}  # 512x64 each
    arrays = {"X": fx["X"], **W}
    (folder / "fixture.json").write_text(json.dumps({k: v.tolist() for k, v in arrays.items()}))
    with open(folder / "fixture.yaml", "w") as f:  # flow rows, as yaml.safe_dump writes them
        for key, arr in arrays.items():
            f.write(f"{key}:\n")
            for row in arr.tolist():
                f.write("- [" + ", ".join(repr(x) for x in row) + "]\n")
    lines = []
    for key, arr in arrays.items():
        np.save(folder / f"{key}.npy", arr)
        lines.append(f"{key}: {{file: {key}.npy}}\n")
    (folder / "refs.yaml").write_text("".join(lines))


def write_memory_fixture(folder: Path) -> Path:
    import numpy as np

    fx = fixture_arrays(SEQ, D_MODEL, HEADS)
    path = folder / "big.npz"
    np.savez(path, **fx)
    return path


# ---------------------------------------------------------------------------------------------
# --sweep: long sequences, attn vs plain NumPy per head vs torch SDPA, each a subprocess

SWEEP_SEQS = (1024, 2048, 4096, 8192, 16384)
SWEEP_DTYPES = ("float32", "float64")
BUSY_LOOP = "while True: pass"
SHORT_SEQ, SHORT_REPS = 2048, 9  # up to this seq, at least this many runs per median
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Run:
    """One subprocess: wall seconds, peak RSS bytes, 1-minute load average when it started."""

    wall: float
    rss: int
    load: float


# Each child is started by a small launcher (`python -S`, ~9 MiB) that times it and reads its
# peak memory from wait4's ru_maxrss. On Linux ru_maxrss keeps the high-water mark of the
# process before execve, i.e. of whoever forked it: started from this parent (~60 MiB) a child
# could never look smaller than the parent, so the launcher is the one that forks. The children
# run unwrapped: an earlier in-process wrapper (runpy, reading VmHWM at exit) added 14-18 ms to
# attn's runs and ~0-4 ms to the NumPy script's (21 paired runs), which at 1,024 tokens moved
# the ratio from 1.17 to 1.23-1.30.
LAUNCHER = """\
import json, os, resource, sys, time
cmd = sys.argv[1:]
with open(os.devnull, "wb") as null, open(os.environ["BENCH_ERR_FILE"], "wb") as err:
    start = time.perf_counter()
    pid = os.posix_spawn(cmd[0], cmd, os.environ, file_actions=[
        (os.POSIX_SPAWN_DUP2, null.fileno(), 1), (os.POSIX_SPAWN_DUP2, err.fileno(), 2)])
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
print(json.dumps({"wall": wall, "rss": usage.ru_maxrss * 1024,
                  "code": os.waitstatus_to_exitcode(status)}))
"""


def measure(cmd: list[str], env: dict[str, str]) -> Run:
    """Run the Python command ``cmd`` to the end, from the launcher: its wall time and peak
    memory, and the 1-minute load average when it started."""
    with tempfile.NamedTemporaryFile(suffix=".err", delete=False) as f:
        err_file = Path(f.name)
    load = os.getloadavg()[0]
    try:
        out = subprocess.run(
            [sys.executable, "-S", "-c", LAUNCHER, *cmd],
            capture_output=True,
            text=True,
            env={**env, "BENCH_ERR_FILE": str(err_file)},
            cwd=ROOT,
            check=True,
        )
        got = json.loads(out.stdout)
        if got["code"] != 0:
            err = err_file.read_bytes()[-3000:]
            raise RuntimeError(f"{' '.join(cmd)} failed ({got['code']}):\n{err!r}")
        return Run(got["wall"], got["rss"], load)
    finally:
        err_file.unlink(missing_ok=True)


def write_sweep_fixture(folder: Path, seq: int) -> Path:
    """A whole-fixture .npz (docs/fixture-format.md): X, W_Q, W_K, W_V and heads, 0-d."""
    import numpy as np

    fx = fixture_arrays(seq, D_MODEL, HEADS, out=False)
    path = folder / f"seq{seq}.npz"
    arrays: dict[str, Any] = {k: np.asarray(v) for k, v in fx.items()}  # heads: a 0-d array
    np.savez(path, **arrays)
    return path


def child_plain_heads(path: str, out: str, dtype: str) -> dict[str, Any]:
    """The plain NumPy script: project, then one head at a time, each (T, T) matrix whole."""
    import numpy as np

    with np.load(path) as z:
        X, W_Q, W_K, W_V = (z[k].astype(dtype) for k in ("X", "W_Q", "W_K", "W_V"))
        H = int(z["heads"])
    T, C = X.shape
    d = C // H
    q, k, v = X @ W_Q, X @ W_K, X @ W_V  # (T, C) each; head h owns columns h*d:(h+1)*d
    output = np.empty((H, T, d), dtype)  # (H, T, d)
    for h in range(H):
        cols = slice(h * d, (h + 1) * d)
        att = q[:, cols] @ k[:, cols].T  # (T, T)
        att *= 1.0 / np.sqrt(d)
        att -= att.max(axis=-1, keepdims=True)
        np.exp(att, out=att)
        att /= att.sum(axis=-1, keepdims=True)
        output[h] = att @ v[:, cols]  # (T, d)
    np.savez(out, output=output)
    return {"shape": list(output.shape)}


def child_torch_sdpa(path: str, out: str, dtype: str) -> dict[str, Any]:
    """torch's CPU scaled_dot_product_attention on the same inputs, every head at once."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    with np.load(path) as z:
        X, W_Q, W_K, W_V = (
            torch.from_numpy(z[k].astype(dtype)) for k in ("X", "W_Q", "W_K", "W_V")
        )
        H = int(z["heads"])
    T, C = X.shape
    with torch.no_grad():
        q, k, v = ((X @ W).view(T, H, C // H).transpose(0, 1) for W in (W_Q, W_K, W_V))  # (H, T, d)
        output = F.scaled_dot_product_attention(q, k, v)  # (H, T, d)
    np.savez(out, output=output.numpy())
    return {"threads": torch.get_num_threads(), "version": torch.__version__}


def torch_python(given: str | None) -> str | None:
    """An interpreter that imports torch: ``--torch-python``, else this one if it can."""
    for py in (given, sys.executable):
        if py and subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 0:
            return py
    return None


@dataclass(frozen=True)
class SweepRow:
    """One (dtype, seq, BLAS threads) line: the medians of each side's runs."""

    dtype: str
    seq: int
    threads: str  # "default" or "1"
    runs: dict[str, list[Run]]  # side ("attn", "numpy", "torch") -> its runs

    def wall(self, side: str) -> float:
        return statistics.median(r.wall for r in self.runs[side])

    def rss(self, side: str) -> float:
        return statistics.median(r.rss for r in self.runs[side])

    def load(self) -> tuple[float, float]:
        loads = [r.load for runs in self.runs.values() for r in runs]
        return min(loads), max(loads)


def memory_available() -> int:
    """MemAvailable from /proc/meminfo in bytes (a large number where there is none)."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return 2**62
    kib = next((int(line.split()[1]) for line in lines if line.startswith("MemAvailable:")), None)
    return 2**62 if kib is None else kib * 1024


def sdpa_need(seq: int, dtype: str) -> int:
    """Bytes torch's CPU SDPA peaks at: every head's (T, T) weights, twice, and a fifth more
    (measured: 4.9 GiB at seq 8192 float32, 9.1 GiB in float64)."""
    itemsize = 4 if dtype == "float32" else 8
    return 2 * HEADS * seq * seq * itemsize * 6 // 5


def sdpa_fits(seq: int, dtype: str, share: float = 0.5) -> bool:
    """Whether torch's SDPA fits in ``share`` of the RAM that is free (--torch-memory): half
    by default, as a machine that is shared must not be pushed into the OOM killer for a
    comparison column."""
    return sdpa_need(seq, dtype) < memory_available() * share


def sweep_commands(
    fixture: Path, out: Path, dtype: str, torch_py: str | None
) -> dict[str, list[str]]:
    py, me = sys.executable, str(Path(__file__).resolve())
    cmds = {
        "attn": [
            py,
            "-m",
            "attn_cli",
            "trace",
            str(fixture),
            "--stage",
            "output",
            "--format",
            "npz",
            "-o",
            str(out / "attn.npz"),
            "--dtype",
            dtype,
        ],
        "numpy": [py, me, "--child", "plain_heads", str(fixture), str(out / "numpy.npz"), dtype],
    }
    if torch_py:
        cmds["torch"] = [
            torch_py,
            me,
            "--child",
            "torch_sdpa",
            str(fixture),
            str(out / "torch.npz"),
            dtype,
        ]
    return cmds


def check_same_output(out: Path, sides: Collection[str], dtype: str) -> None:
    """The three sides computed the same numbers (a benchmark of wrong math is no benchmark)."""
    import numpy as np

    with np.load(out / "attn.npz") as z:
        ref = z["output"]
    tol = 1e-4 if dtype == "float32" else 1e-9
    for side in sides:
        if side != "attn":
            with np.load(out / f"{side}.npz") as z:
                np.testing.assert_allclose(z["output"], ref, rtol=tol, atol=tol, err_msg=side)


def sweep_seq(
    fixture: Path,
    seq: int,
    out: Path,
    dtype: str,
    torch_py: str | None,
    reps: int,
    share: float = 0.5,
) -> list[SweepRow]:
    """Every side at the default BLAS threads and at one, interleaved, ``reps`` times."""
    if torch_py and not sdpa_fits(seq, dtype, share):
        print(
            f"  torch at seq {seq}, {dtype}: skipped, it would need "
            f"{sdpa_need(seq, dtype) / 2**30:.0f} GiB ({share:.0%} of the free memory is "
            f"{memory_available() * share / 2**30:.0f} GiB; see --torch-memory)"
        )
        torch_py = None
    cmds = sweep_commands(fixture, out, dtype, torch_py)
    envs = {"default": child_env(), "1": {**child_env(), **ONE_THREAD}}
    runs: dict[str, dict[str, list[Run]]] = {t: {side: [] for side in cmds} for t in envs}
    if seq <= SHORT_SEQ:  # a run of a few tenths of a second is mostly start-up, and noisy
        reps = max(reps, SHORT_REPS)
    for _ in range(reps):
        for threads, env in envs.items():
            for side, cmd in cmds.items():
                runs[threads][side].append(measure(cmd, env))
    check_same_output(out, cmds, dtype)
    return [SweepRow(dtype, seq, t, runs[t]) for t in envs]


def print_sweep_row(row: SweepRow) -> None:
    """One line: walls and their ratios, peak memory and its ratio, the load average."""
    mib = 2**20
    a, n = row.wall("attn"), row.wall("numpy")
    text = f"{row.dtype:<8}{row.seq:>6}  {row.threads:>7}  attn {a:7.2f} s  numpy {n:7.2f} s  "
    text += f"= {a / n:5.2f}"
    if "torch" in row.runs:
        t = row.wall("torch")
        text += f"  torch {t:7.2f} s = {a / t:5.2f}"
    ra, rn = row.rss("attn"), row.rss("numpy")
    text += f"  | peak {ra / mib:6.0f} / {rn / mib:6.0f} MiB = {ra / rn:4.2f}"
    if "torch" in row.runs:
        text += f" (torch {row.rss('torch') / mib:.0f})"
    lo, hi = row.load()
    print(f"{text}  | load {lo:.2f}-{hi:.2f}", flush=True)


def print_sweep_summary(rows: list[SweepRow], busy: bool) -> None:
    """The issue's table: ratios by seq, default threads and (in brackets) one BLAS thread."""
    seqs = sorted({r.seq for r in rows})
    by = {(r.dtype, r.seq, r.threads): r for r in rows}
    print(
        f"\nsummary ({'other core busy' if busy else 'no added load'}): default threads "
        "[one BLAS thread]; targets: wall <= 1.2, peak <= 1, torch <= 1 at 16384"
    )
    print(f"{'':<40}" + "".join(f"{s:>16}" for s in seqs))
    lines = [
        ("attn / plain NumPy, wall, float64", "float64", "numpy", "wall"),
        ("attn / plain NumPy, wall, float32", "float32", "numpy", "wall"),
        ("attn / torch CPU SDPA, wall, float32", "float32", "torch", "wall"),
        ("attn / torch CPU SDPA, wall, float64", "float64", "torch", "wall"),
        ("attn / plain NumPy, peak memory, float64", "float64", "numpy", "rss"),
        ("attn / plain NumPy, peak memory, float32", "float32", "numpy", "rss"),
    ]
    for label, dtype, side, what in lines:
        cells = []
        for seq in seqs:
            pair = [by.get((dtype, seq, t)) for t in ("default", "1")]
            if any(r is None or side not in r.runs for r in pair):
                cells.append(f"{'-':>16}")
                continue
            ratio = [getattr(r, what)("attn") / getattr(r, what)(side) for r in pair if r]
            cells.append(f"{ratio[0]:>8.2f} [{ratio[1]:.2f}]")
        if any(c.strip() != "-" for c in cells):
            print(f"{label:<40}" + "".join(cells))
    loads = [x for r in rows for x in r.load()]
    print(f"{'1-minute load average at the runs':<40}{min(loads):.2f} to {max(loads):.2f}")


def sweep(args: argparse.Namespace) -> None:
    """The long-sequence sweep of issue 16, quiet or with the other core busy."""
    torch_py = torch_python(args.torch_python)
    seqs = [s for s in SWEEP_SEQS if args.min_seq <= s <= args.max_seq]
    print(
        f"attn sweep: d_model {D_MODEL}, {HEADS} heads, only output kept, "
        f"median of {args.sweep_reps} interleaved runs ({SHORT_REPS} up to seq {SHORT_SEQ}); "
        f"{os.cpu_count()} CPUs"
    )
    print(f"  torch: {torch_py or 'not importable (give --torch-python)'}")
    busy = None
    if args.busy:
        busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
        print(f"  busy: pid {busy.pid} runs {BUSY_LOOP!r} for the whole sweep")
    rows: list[SweepRow] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            for seq in seqs:
                fixture = write_sweep_fixture(folder, seq)
                for dtype in args.dtypes:
                    for row in sweep_seq(
                        fixture, seq, folder, dtype, torch_py, args.sweep_reps, args.torch_memory
                    ):
                        rows.append(row)
                        print_sweep_row(row)
                fixture.unlink()
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    print_sweep_summary(rows, args.busy)


# ---------------------------------------------------------------------------------------------
# --traces: big traces written as streams (issue 16)

TRACE_SEQ = 4096
FORMATS = ("npz", "json")


def traces(args: argparse.Namespace) -> None:
    """All-stage npz and JSON traces of TRACE_SEQ tokens, one head: peak memory against one
    score stage's size (target < 2x), and the largest seq each way of writing fits in 4 GiB."""
    import numpy as np

    seq, heads = args.trace_seq, 1
    stage = seq * seq * 8
    print(
        f"attn traces: seq {seq}, d_model {D_MODEL}, {heads} head, W_O, every stage, float64; "
        f"one score stage {stage / 2**20:.0f} MiB"
    )
    with tempfile.TemporaryDirectory(dir=args.trace_dir) as tmp:
        folder = Path(tmp)
        fixture = folder / "fixture.npz"
        fx = fixture_arrays(seq, D_MODEL, heads)
        arrays: dict[str, Any] = {k: np.asarray(v) for k, v in fx.items()}  # heads: 0-d
        np.savez(fixture, **arrays)
        for fmt in FORMATS:
            out = folder / f"trace.{fmt}"
            cmd = [
                sys.executable,
                "-m",
                "attn_cli",
                "trace",
                str(fixture),
                "--format",
                fmt,
                "-o",
                str(out),
                "--quiet",
            ]
            run = measure(cmd, child_env())
            size = out.stat().st_size
            out.unlink()
            print(
                f"  {fmt:<5} wall {run.wall:7.1f} s  peak {run.rss / 2**20:6.0f} MiB = "
                f"{run.rss / stage:.2f} x one stage (target < 2: "
                f"{verdict(run.rss / stage, 2 - 1e-9)})  file {size / 2**30:.2f} GiB  "
                f"load {run.load:.2f}"
            )
    print_capacity()


def print_capacity(budget: int = 4 << 30) -> None:
    """The largest seq whose all-stage trace each way of writing fits in ``budget``, by the
    memory check's own estimate (d_model 512, 8 heads, W_O, float64)."""
    from attn_cli.core.memory import WRITTEN, memory_needed

    def fits(seq: int, written: Any) -> bool:
        return memory_needed(sweep_inputs(seq), None, 8, False, written) <= budget

    print(
        f"largest seq in {budget / 2**30:.0f} GiB, every stage, d_model {D_MODEL}, {HEADS} heads:"
    )
    for written in WRITTEN:
        lo, hi = 1, 1 << 20
        while lo < hi:  # the largest seq that fits
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid, written) else (lo, mid - 1)
        print(f"  {written:<5} {lo:>9,}")


def sweep_inputs(seq: int) -> Any:
    """Inputs of the sweep's shapes; the zeros are never touched, so they cost no memory."""
    import numpy as np

    from attn_cli.io.fixture import validate

    W = np.zeros((D_MODEL, D_MODEL))
    fx = {"X": np.zeros((seq, D_MODEL)), "W_Q": W, "W_K": W, "W_V": W, "W_O": W}
    return validate({**fx, "heads": HEADS}, f"{seq} tokens", max_elements=2**40)


def startup(py: str, reps: int) -> None:
    """1. start-up: ``attn trace`` against its import floor, ``attn --help`` against NumPy's import.

    The console script is run as a user types it (``python -m`` adds runpy's ~3 ms); the sides
    alternate, and each figure is the median of ``reps`` runs after one warm-up run."""
    script = Path(py).parent / "attn"
    attn = [str(script)] if script.is_file() else [py, "-m", "attn_cli"]
    attn_cmd = [*attn, "trace"]
    base_cmd = [py, "-c", "import numpy, typer, rich.console, rich.table, yaml"]
    numpy_cmd = [py, "-c", "import numpy"]
    # typer >= 0.29 loads pydantic (typer._adapters) to parse options; we pin below it, but a
    # machine with a newer typer is measured against that cost too.
    pyd_cmd = [py, "-c", "import numpy, typer, rich.console, rich.table, yaml, typer._adapters"]
    has_pydantic = subprocess.run(pyd_cmd, capture_output=True).returncode == 0
    cmds = [attn_cmd, base_cmd, [*attn, "--help"], numpy_cmd]
    cmds += [pyd_cmd] if has_pydantic else []
    for cmd in cmds:
        wall(cmd)  # warm-up: bytecode written, files cached
    times: list[list[float]] = [[] for _ in cmds]
    for _ in range(reps):
        for t, cmd in zip(times, cmds, strict=True):
            t.append(wall(cmd))
    a, b, h, n, *rest = (statistics.median(t) for t in times)
    report(1, "start-up", f"attn trace {a * 1e3:.0f} ms / imports {b * 1e3:.0f} ms", a / b, 1.25)
    note(
        f"attn --help {h * 1e3:.0f} ms / python -c 'import numpy' {n * 1e3:.0f} ms = "
        f"{h / n:.2f} (target < 1: {verdict(h / n, 1 - 1e-9)}); {' '.join(attn)}"
    )
    if rest:
        note(
            f"this typer loads pydantic (typer._adapters) to parse options: imports plus that "
            f"{rest[0] * 1e3:.0f} ms; attn trace / that = {a / rest[0]:.2f} (pyproject pins <0.29)"
        )


# ---------------------------------------------------------------------------------------------
# The parent: runs the children, prints the ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions per timing (median)")
    parser.add_argument("--startup-reps", type=int, default=15)
    parser.add_argument("--startup", action="store_true", help="only 1. start-up (half a minute)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--sweep", action="store_true", help="the long-sequence sweep instead")
    parser.add_argument("--min-seq", type=int, default=SWEEP_SEQS[0], help="sweep from this seq")
    parser.add_argument("--max-seq", type=int, default=SWEEP_SEQS[-1], help="sweep up to this seq")
    parser.add_argument("--dtypes", nargs="+", choices=SWEEP_DTYPES, default=list(SWEEP_DTYPES))
    parser.add_argument("--sweep-reps", type=int, default=3, help="runs per sweep figure")
    parser.add_argument("--busy", action="store_true", help="keep one core busy while sweeping")
    parser.add_argument("--torch-python", help="an interpreter with torch, for the SDPA column")
    parser.add_argument(
        "--torch-memory",
        type=float,
        default=0.5,
        help="share of the free memory torch's SDPA may need (default 0.5)",
    )
    parser.add_argument("--traces", action="store_true", help="big npz and JSON traces instead")
    parser.add_argument(
        "--no-methods",
        action="store_true",
        help="skip 6-8 (decode, flash, backward; about four minutes)",
    )
    parser.add_argument("--method-reps", type=int, default=3, help="paired rounds for 6-8")
    parser.add_argument("--trace-seq", type=int, default=TRACE_SEQ, help="seq of --traces")
    parser.add_argument("--trace-dir", help="where --traces writes its files (default: /tmp)")
    args = parser.parse_args()
    if args.child:
        task, *rest = args.child
        result = globals()[f"child_{task}"](*(int(a) if a.isdigit() else a for a in rest))
        print(json.dumps(result))
        return
    if args.sweep:
        sweep(args)
        return
    if args.traces:
        traces(args)
        return
    if args.startup:
        startup(sys.executable, args.startup_reps)
        return

    py = sys.executable
    machine = child("machine")
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor() or "unknown",
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    print("attn benchmarks")
    print(
        f"  machine: {os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, "
        f"NumPy {machine['numpy']}, BLAS {machine['blas_build']}"
    )
    print(f"  BLAS in use: {machine['kernel']}")
    pinned = {
        k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ
    }
    print(f"  OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE: {pinned or 'not set'}; removed for the runs")
    print()

    startup(py, args.startup_reps)

    # 2. compute
    c = child("compute", str(args.reps))
    detail = f"attn {c['attn']:.3f} s / plain NumPy {c['plain']:.3f} s"
    report(2, "compute", detail, c["attn"] / c["plain"], 1.2)
    note(
        f"plain NumPy with each head made contiguous first: {c['tuned']:.3f} s; "
        f"attn / that = {c['attn'] / c['tuned']:.2f}"
    )
    note(
        f"float32: {c['float32']:.3f} s; --stage projected (nothing else kept): {c['output']:.3f} s"
    )
    try:
        t = child("torch", str(args.reps))
    except RuntimeError as e:
        note(f"torch: skipped, it does not import here ({str(e).splitlines()[-1]})")
    else:
        note(
            f"attn / torch {t['version']} SDPA (float64, {t['threads']} threads, keeps only the "
            f"output) {t['torch']:.3f} s = {c['attn'] / t['torch']:.2f}"
        )

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # 3. memory
        npz = write_memory_fixture(folder)
        m = child("memory", str(npz), "all", "float64")
        mib = 2**20
        detail = (
            f"(peak {m['peak'] / mib:.0f} MiB - after imports {m['base'] / mib:.0f} MiB) / "
            f"stages kept {m['kept'] / mib:.0f} MiB"
        )
        report(3, "memory", detail, (m["peak"] - m["base"]) / m["kept"], 1.5)
        o = child("memory", str(npz), "output", "float64")
        o32 = child("memory", str(npz), "output", "float32")
        note(
            f"--stage output: {(o['peak'] - o['base']) / mib:.0f} MiB over the imports, "
            f"{(o32['peak'] - o32['base']) / mib:.0f} MiB in float32 (one score stage alone: "
            f"{HEADS * SEQ * SEQ * 8 / mib:.0f} MiB)"
        )

        # 4. rendering
        r = child("render", str(args.reps))
        big, small = r["big"] * 1e3, r["small"] * 1e3
        detail = f"{RENDER_SEQ} tokens elided {big:.1f} ms / 3 tokens {small:.1f} ms"
        report(4, "rendering", detail, r["big"] / r["small"], 3)
        note(
            f"{RENDER_SEQ} tokens / 12 tokens (the largest trace shown whole, as many cells): "
            f"{r['big'] / r['twelve']:.2f}; with the heatmap, in colour: "
            f"{r['big_heat'] / r['small_heat']:.2f}"
        )

        # 5. loading
        write_load_files(folder)
        size = (folder / "fixture.json").stat().st_size / mib
        ld = child("load", str(folder), str(args.reps))
        detail = f"YAML {ld['yaml']:.3f} s / JSON {ld['json']:.3f} s ({size:.1f} MiB)"
        report(5, "loading", detail, ld["yaml"] / ld["json"], 2)
        if "npy" in ld:
            note(f".npy references {ld['npy'] * 1e3:.1f} ms / JSON = {ld['npy'] / ld['json']:.3f}")
        for kind, error in ld["errors"].items():
            note(f"{kind}: not measured ({error})")

    if not args.no_methods:
        methods(args)


def spinning(busy: bool) -> Any:
    """A process spinning on one core while the block runs, when ``busy``."""
    import contextlib

    @contextlib.contextmanager
    def spin() -> Any:
        proc = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            yield
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()

    return spin()


def growth(small: dict[str, float], big: dict[str, float], floor: float) -> float:
    """The slope of log(peak − floor) against log(tokens) between two rows."""
    import math

    above = [r["attn_mib"] - floor for r in (small, big)]
    return math.log(above[1] / above[0]) / math.log(big["seq"] / small["seq"])


def methods(args: argparse.Namespace) -> None:
    """6-8: decode, flash and backward as whole processes against plain NumPy (issue 27), the
    machine quiet and with a core busy; decode.py, flash.py and backward.py hold the sides."""
    import backward
    import decode
    import flash

    reps = args.method_reps
    for busy in (False, True):
        when = "busy core" if busy else "quiet"
        with spinning(busy):
            d = decode.run_pair(1024, 0, reps)
            report(
                6,
                "decode",
                f"1,024 tokens ({when}) attn {d['attn_s']:.2f} s / NumPy KV-cache "
                f"loop {d['numpy_s']:.2f} s",
                d["attn_s"] / d["numpy_s"],
                2,
            )
            note(
                f"peak memory {d['attn_mib']:.0f} MiB / {d['numpy_mib']:.0f} MiB = "
                f"{d['attn_mib'] / d['numpy_mib']:.2f} (target <= 2)"
            )
            if not busy:
                big = decode.run_pair(4096, 0, 1)
                slope = growth(decode.run_pair(512, 0, 1), big, d["floor_mib"])
                note(
                    f"memory growth exponent 512 to 4,096 tokens {slope:.2f} (target <= 1.2); "
                    f"4,096 tokens {big['attn_s']:.2f} s / {big['numpy_s']:.2f} s"
                )
            f = flash.run_pair(8192, 64, "float32", reps, one_thread=busy)
            report(
                7,
                "flash",
                f"8,192 float32, 64x64 tiles ({when}) attn {f['attn_s']:.2f} s / "
                f"NumPy full {f['numpy_s']:.2f} s",
                f["attn_s"] / f["numpy_s"],
                1.5,
            )
            note(
                f"peak memory {f['attn_mib']:.0f} MiB / {f['numpy_mib']:.0f} MiB = "
                f"{f['attn_mib'] / f['numpy_mib']:.2f} (target <= 0.5)"
            )
            if busy:
                t = flash.run_pair(8192, 128, "float32", reps, one_thread=True)
                note(
                    f"128x128 tiles: {t['attn_s']:.2f} s / one BLAS thread {t['attn1_s']:.2f} s "
                    f"= {t['attn_s'] / t['attn1_s']:.2f} (target <= 1.5)"
                )
            b = backward.run_pair(2048, reps, torch_python(args.torch_python))
            report(
                8,
                "backward",
                f"2,048 float64 ({when}) attn {b['attn_s']:.2f} s / NumPy "
                f"manual {b['numpy_s']:.2f} s",
                b["attn_s"] / b["numpy_s"],
                1.3,
            )
            line = (
                f"peak memory {b['attn_mib']:.0f} MiB / {b['numpy_mib']:.0f} MiB = "
                f"{b['attn_mib'] / b['numpy_mib']:.2f} (target <= 1.3); "
                f"largest relative difference of the gradients {b['diff']:.1e}"
            )
            if "torch_s" in b:
                line += f"; torch autograd {b['torch_s']:.2f} s, {b['torch_mib']:.0f} MiB"
            note(line)


def report(n: int, name: str, detail: str, ratio: float, target: float) -> None:
    print(
        f"{n}. {name:<10} {detail} = {ratio:.2f}   (target <= {target}: {verdict(ratio, target)})"
    )


def note(text: str) -> None:
    print(f"   {'':<10} {text}")


if __name__ == "__main__":
    main()
