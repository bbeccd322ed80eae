"""Big traces written as streams (issue 16): the bytes, the numbers, the memory, the BLAS rule.

Independent sources: the golden JSON files (written by the whole-trace writer before streaming
existed), a loop-based attention in plain Python (math.exp) for the numbers, ``run()`` for
bit-identity (the documented promise that a subset equals a full run), tracemalloc for the
memory held while writing, and hand-made /proc/pressure/cpu files for the BLAS rule.
"""

from __future__ import annotations

import io
import json
import math
import tracemalloc
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import pytest
from conftest import assert_same_json

from attn_cli.api import stream_file
from attn_cli.blas import blas_limit, blas_threads, free_cores
from attn_cli.core.engine import _max_abs, _max_norm
from attn_cli.core.memory import NPZ_BUFFER, check_memory, memory_needed
from attn_cli.core.pipeline import Deferred, Stage, in_dtype, run, run_streamed
from attn_cli.errors import ComputeError, InputError, UsageError
from attn_cli.io.arrays import npz_writer
from attn_cli.io.examples import find_example
from attn_cli.io.fixture import load_fixture, validate
from attn_cli.io.trace_json import dumps, write_trace_json

GOLDEN = Path(__file__).parent.parent / "golden"


def fixture(seq: int, heads: int = 2, d_model: int = 8, seed: int = 0, **extra: Any) -> Any:
    rng = np.random.default_rng(seed)
    fx = {
        "X": rng.standard_normal((seq, d_model)),
        **{f"W_{n}": rng.standard_normal((d_model, d_model)) for n in "QKVO"},
        "heads": heads,
        **extra,
    }
    return validate(fx, f"{seq} tokens")


def streamed_json(inputs: Any, **kw: Any) -> bytes:
    out = io.BytesIO()
    write_trace_json(run_streamed(inputs, **kw), out)
    return out.getvalue()


def loop_attention(X: Any, W: dict[str, Any], heads: int) -> dict[str, list[Any]]:
    """scores, scaled, softmax and output of each head, by plain Python loops and math.exp."""
    T, C = len(X), len(X[0])
    d = C // heads

    def proj(name: str) -> list[list[float]]:
        return [
            [sum(X[t][i] * W[name][i][j] for i in range(C)) for j in range(C)] for t in range(T)
        ]

    q, k, v = proj("Q"), proj("K"), proj("V")
    out: dict[str, list[Any]] = {"scores": [], "scaled": [], "softmax": [], "output": []}
    for h in range(heads):
        cols = range(h * d, (h + 1) * d)
        s = [[sum(q[i][c] * k[j][c] for c in cols) for j in range(T)] for i in range(T)]
        sc = [[x / math.sqrt(d) for x in row] for row in s]
        p = []
        for row in sc:
            e = [math.exp(x - max(row)) for x in row]
            p.append([x / sum(e) for x in e])
        o = [[sum(p[i][j] * v[j][c] for j in range(T)) for c in cols] for i in range(T)]
        for name, m in (("scores", s), ("scaled", sc), ("softmax", p), ("output", o)):
            out[name].append(m)
    return out


# ---------------------------------------------------------------------------------------------
# The bytes and the numbers


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.json")), ids=lambda p: p.stem)
def test_streamed_json_is_the_whole_trace_byte_for_byte_and_the_golden_in_numbers(
    path: Path,
) -> None:
    """Every bundled example, streamed, is the whole-trace writer's bytes from the same run, and
    the golden file (written by the whole-trace writer before streaming existed) in structure
    and numbers. Bytes are compared only within one run: another CPU's BLAS kernel rounds the
    last bit of a product differently (1.4849 in a golden, 1.4848999999999999 on AVX-512)."""
    inputs = load_fixture(find_example(path.stem))  # type: ignore[arg-type]
    raw = streamed_json(inputs)
    assert raw == dumps(run(inputs)).encode()
    golden, streamed = json.loads(path.read_bytes()), json.loads(raw)
    assert golden.pop("generator").startswith("attn ") and streamed.pop("generator")
    assert_same_json(streamed, golden, path.stem)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_json_numbers_match_a_loop_reference(dtype: str) -> None:
    inputs = fixture(5, heads=2, d_model=4)
    data = json.loads(streamed_json(inputs, dtype=dtype))["stages"]
    X = inputs.X[0].tolist()
    W = {n: getattr(inputs, f"W_{n}").tolist() for n in "QKV"}
    ref = loop_attention(X, W, heads=2)
    tol = 1e-12 if dtype == "float64" else 1e-5
    for name, want in ref.items():
        np.testing.assert_allclose(np.array(data[name]["data"]), want, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"causal": True},
        {"alibi": True, "causal": True},
        {"softcap": 5.0, "window": 2, "causal": True},
    ],
    ids=["plain", "causal", "alibi", "softcap-window"],
)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_npz_and_json_streams_are_bit_identical_to_run(extra: dict[str, Any], dtype: str) -> None:
    """Deferred stages, computed again block by block, equal run()'s to the last bit."""
    inputs = fixture(9, heads=2, d_model=8, **extra)
    held = run(inputs, dtype=dtype)  # type: ignore[arg-type]
    streamed = run_streamed(inputs, dtype=dtype)  # type: ignore[arg-type]
    assert [s.name for s in streamed] == list(held.stages)
    assert any(isinstance(s, Deferred) for s in streamed)
    buf = io.BytesIO()
    npz_writer(streamed)(buf)
    with np.load(io.BytesIO(buf.getvalue())) as z:
        assert z.files == list(held.stages)
        for stage in held:
            assert z[stage.name].dtype == stage.data.dtype
            assert z[stage.name].tobytes() == np.ascontiguousarray(stage.data).tobytes()
    assert streamed_json(inputs, dtype=dtype) == dumps(held).encode()


def test_a_stage_subset_streams_and_text_streams_get_text() -> None:
    inputs = fixture(7, causal=True)
    text = io.StringIO()
    write_trace_json(run_streamed(inputs, keep={"softmax"}), text, ("softmax",))
    assert text.getvalue() == dumps(run(inputs, keep={"softmax"}))
    assert list(json.loads(text.getvalue())["stages"]) == ["softmax"]


def test_rows_found_empty_while_writing_are_reported_after() -> None:
    """With only softmax kept, the rows with nothing to attend to are found as it is written."""
    mask = np.ones((4, 4), dtype=bool)
    mask[2] = False  # query 2 may attend to nothing
    inputs = fixture(4, heads=1, d_model=4, mask=mask.tolist())
    streamed = run_streamed(inputs, keep={"softmax"})
    assert streamed.finished().empty_rows == ()  # nothing computed yet
    npz_writer(streamed)(io.BytesIO())
    assert (
        streamed.finished().empty_rows == run(inputs, keep={"softmax"}).empty_rows == ((0, 0, 2),)
    )


def test_the_backward_pass_holds_every_stage() -> None:
    inputs = fixture(4, heads=1, d_model=4)
    streamed = run_streamed(inputs, backward=True)
    assert all(isinstance(s, Stage) for s in streamed)


# ---------------------------------------------------------------------------------------------
# Memory: what writing holds, and what the check approves


class Discard(io.RawIOBase):
    """A binary sink that keeps nothing (a file on disk, as far as memory goes)."""

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        return memoryview(b).nbytes


@pytest.mark.parametrize("fmt", ["npz", "json"])
@pytest.mark.slow
def test_writing_holds_a_block_not_a_stage(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """tracemalloc sees NumPy's buffers: writing a 256-token, 4-head trace's score stages peaks
    well below one of them (2 MiB): a 512 KiB block, and for JSON a chunk of text (64 Ki
    characters here, to keep the test fast under tracemalloc)."""
    monkeypatch.setattr("attn_cli.io.trace_json.CHUNK_CHARS", 1 << 16)
    inputs = fixture(256, heads=4, d_model=16)
    keep = {"softmax"} if fmt == "json" else {"scores", "scaled", "softmax", "output"}
    stage = inputs.heads * 256 * 256 * 8
    streamed = run_streamed(inputs, keep=keep)
    sink = cast("IO[bytes]", Discard())
    tracemalloc.start()
    try:
        if fmt == "npz":
            npz_writer(streamed)(sink)
        else:
            write_trace_json(streamed, sink)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < stage / 2, f"{peak / 2**20:.2f} MiB"


def test_the_memory_check_prices_each_way_of_writing() -> None:
    """4096 tokens, 8 heads, every stage: held it needs 3 score stages of 1 GiB; streamed, it
    fits in a few hundred MiB (the old check approved a JSON trace needing ~49 GB)."""
    W = np.zeros((512, 512))
    fx = {"X": np.zeros((4096, 512)), "W_Q": W, "W_K": W, "W_V": W, "W_O": W, "heads": 8}
    inputs = validate(fx, "4096 tokens")
    held = memory_needed(inputs)
    npz, js = (memory_needed(inputs, written=w) for w in ("npz", "json"))
    assert held > 3 * 2**30 > 256 * 2**20 > max(js, npz)
    with pytest.raises(InputError, match="3 score stages"):
        check_memory(inputs, 3 * 2**30)
    check_memory(inputs, 256 * 2**20, written="json")
    # with the backward pass keeping its gradients, nothing is streamed: the writer's buffer
    # comes on top of the held trace
    streamed = memory_needed(inputs, backward=True, written="npz")
    assert streamed == memory_needed(inputs, backward=True) + NPZ_BUFFER


# ---------------------------------------------------------------------------------------------
# The BLAS threading rule


def pressure(tmp_path: Path, avg10: float) -> Path:
    path = tmp_path / "cpu"
    path.write_text(
        f"some avg10={avg10:.2f} avg60=1.00 avg300=1.00 total=1\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    return path


def proc(tmp_path: Path, running: int, mine: int = 1, threads: int = 3) -> tuple[str, str]:
    """A /proc/loadavg with ``running`` runnable tasks, and a task folder of this process's
    ``threads`` threads, ``mine`` of them running (state R), the others sleeping."""
    loadavg = tmp_path / "loadavg"
    loadavg.write_text(f"0.50 0.40 0.30 {running}/84 4242\n")
    tasks = tmp_path / "task"
    for tid in range(threads):
        (tasks / str(tid)).mkdir(parents=True, exist_ok=True)
        state = "R" if tid < mine else "S"
        (tasks / str(tid) / "stat").write_text(f"{tid} (python (a) b) {state} 1 2 3\n")
    return str(loadavg), str(tasks)


def test_a_core_held_by_other_work_is_left_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy loop on one of two cores: /proc/loadavg counts it and this process running."""
    quiet = str(pressure(tmp_path, 1.0))
    monkeypatch.setattr("attn_cli.blas._cores", lambda: 2)
    assert free_cores(quiet, *proc(tmp_path, running=2)) == 1  # the loop and this thread
    assert free_cores(quiet, *proc(tmp_path, running=1)) is None  # only this thread
    assert free_cores(quiet, *proc(tmp_path, running=3, mine=2)) == 1  # a BLAS thread spins
    assert free_cores(quiet, *proc(tmp_path, running=2, mine=2)) is None  # ... only ours
    assert free_cores(quiet, *proc(tmp_path, running=9)) == 1  # never fewer than one
    monkeypatch.setattr("attn_cli.blas._cores", lambda: 8)
    assert free_cores(quiet, *proc(tmp_path, running=4)) == 5  # three others: five left


def test_a_passing_task_is_not_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The least of three looks: a task seen once is gone at the next."""
    monkeypatch.setattr("attn_cli.blas._cores", lambda: 2)
    loadavg, tasks = proc(tmp_path, running=3)
    looks = iter([1, 3])  # what the next looks see

    def sleep(_: float) -> None:
        Path(loadavg).write_text(f"0.5 0.4 0.3 {next(looks)}/84 1\n")

    monkeypatch.setattr("attn_cli.blas.time.sleep", sleep)
    assert free_cores(str(pressure(tmp_path, 1.0)), loadavg, tasks) is None


def test_pressure_above_twenty_percent_leaves_one_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("attn_cli.blas._cores", lambda: 2)
    idle = proc(tmp_path, running=1)
    assert free_cores(str(pressure(tmp_path, 35.0)), *idle) == 1
    assert free_cores(str(pressure(tmp_path, 5.0)), *idle) is None


def test_without_proc_the_load_average_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("attn_cli.blas._cores", lambda: 2)
    missing = [str(tmp_path / name) for name in ("cpu", "loadavg", "task")]
    monkeypatch.setattr("os.getloadavg", lambda: (2.5, 0.0, 0.0))
    assert free_cores(*missing) == 1
    monkeypatch.setattr("os.getloadavg", lambda: (0.5, 0.0, 0.0))
    assert free_cores(*missing) is None


def test_one_reading_of_this_machine_stands_for_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode's pipeline and its loop each ask; /proc is read once, and again after
    READING_STANDS seconds. Readings of other paths (the tests' own) are never kept."""
    import attn_cli.blas as blas

    reads: list[tuple[str, ...]] = []
    answers = iter([1, None, 1])

    def reading(*paths: str) -> int | None:
        reads.append(paths)
        return next(answers)

    now = [100.0]
    monkeypatch.setattr(blas, "_free_cores", reading)
    monkeypatch.setattr(blas, "_reading", None)
    monkeypatch.setattr("attn_cli.blas.time.monotonic", lambda: now[0])
    assert free_cores() == 1 and free_cores() == 1 and len(reads) == 1
    now[0] += blas.READING_STANDS + 0.1
    assert free_cores() is None and len(reads) == 2
    assert free_cores("cpu", "loadavg", "task") == 1 and len(reads) == 3  # not kept
    assert free_cores() is None and len(reads) == 3


def test_this_process_reads_as_running_on_this_machine() -> None:
    """The real /proc (Linux): this thread is running as it looks, so it is not counted."""
    if not Path("/proc/self/task").is_dir():
        pytest.skip("no /proc here")
    from attn_cli.blas import _others

    others = _others("/proc/loadavg", "/proc/self/task")
    assert others is not None and others >= 0


def test_the_environment_overrides_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("attn_cli.blas.free_cores", lambda: 1)
    assert blas_threads({}) == 1
    assert blas_threads({"ATTN_BLAS_THREADS": "auto"}) == 1
    assert blas_threads({"ATTN_BLAS_THREADS": "3"}) == 3
    monkeypatch.setattr("attn_cli.blas.free_cores", lambda: None)
    assert blas_threads({}) is None
    for bad in ("0", "two", "-1"):
        with pytest.raises(UsageError, match="ATTN_BLAS_THREADS"):
            blas_threads({"ATTN_BLAS_THREADS": bad})


def test_short_runs_leave_blas_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below 1024 keys the rule is not even asked (threadpoolctl is not imported for them)."""

    def fail() -> None:
        raise AssertionError("asked")

    monkeypatch.setattr("attn_cli.blas.blas_threads", fail)
    with blas_limit(1023):
        pass


@pytest.mark.parametrize("streamed", [False, True])
def test_the_rule_covers_every_product_of_a_long_run(
    streamed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load the projections suffer as much as the blocks: the thread count holds for the
    whole run (threadpoolctl's own report, read inside the projection and a block)."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    import attn_cli.core.engine as engine
    import attn_cli.core.pipeline as pipeline
    import attn_cli.core.steps as steps

    seen: list[int] = []

    def threads() -> int:
        return max(
            int(i["num_threads"])
            for i in threadpoolctl.threadpool_info()
            if i["user_api"] == "blas"
        )

    def spy(original: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            seen.append(threads())
            return original(*args, **kwargs)

        return wrapped

    monkeypatch.setenv("ATTN_BLAS_THREADS", "1")
    monkeypatch.setattr(pipeline, "project", spy(steps.project))
    monkeypatch.setattr(engine, "weighted_sum", spy(steps.weighted_sum))
    inputs = fixture(1024, heads=1, d_model=4)
    (run_streamed if streamed else run)(inputs, keep={"output"})
    assert len(seen) >= 4 and set(seen) == {1}  # Q, K, V and the blocks' outputs
    seen.clear()
    run(fixture(8, heads=1, d_model=4), keep={"output"})  # short: BLAS left as it is
    assert seen and min(seen) == threads()


# ---------------------------------------------------------------------------------------------
# A float32 stream holds its inputs in float32 (in_dtype): the float64 arrays are never read
# again, and holding them was the difference from a plain NumPy script's peak at 1,024 tokens.


@pytest.mark.parametrize(
    "fx",
    [
        {"bias": np.linspace(-1.0, 1.0, 81).reshape(9, 9), "causal": True},
        {"X_kv": np.arange(40.0).reshape(5, 8) / 40, "W_K": np.eye(8), "W_V": np.eye(8)},
        {"b_Q": np.ones(8), "b_K": np.ones(8) / 2, "b_V": np.ones(8) / 4, "b_O": np.ones(8)},
    ],
    ids=["bias", "cross", "biases"],
)
def test_float32_inputs_give_the_same_bits_as_a_float32_run(fx: dict[str, Any]) -> None:
    inputs = fixture(9, heads=2, d_model=8, **fx)
    small = in_dtype(inputs, "float32")
    arrays = {
        n: getattr(small, n)
        for n in ("X", "X_kv", "bias", *(f"{w}_{n}" for w in "Wb" for n in "QKVO"))
    }
    assert {n: a.dtype for n, a in arrays.items() if a is not None} == {
        n: np.dtype(np.float32) for n, a in arrays.items() if a is not None
    }
    for name, a in arrays.items():  # the same values, rounded once
        if a is not None:
            assert a.tobytes() == getattr(inputs, name).astype(np.float32).tobytes(), name
    want, got = run(inputs, dtype="float32"), run(small, dtype="float32")
    for stage in want:
        assert got[stage.name].data.tobytes() == stage.data.tobytes(), stage.name
    assert in_dtype(inputs, "float64") is inputs


def test_direct_mode_inputs_in_float32_and_their_overflow_named_as_a_run_names_it() -> None:
    direct = validate({"Q": [[1.0, 2.0]], "K": [[3.0, 4.0]], "V": [[5.0, 6.0]]}, "d.json")
    small = in_dtype(direct, "float32")
    assert {getattr(small, n).dtype for n in "QKV"} == {np.dtype(np.float32)}
    assert run(small, dtype="float32")["output"].data.tobytes() == (
        run(direct, dtype="float32")["output"].data.tobytes()
    )
    fx = {
        "X": [[1e39, 0.0]],
        "W_Q": [[1.0], [1.0]],
        "W_K": [[1.0], [1.0]],
        "W_V": [[1.0], [1.0]],
        "tokens": ["big"],
    }
    errors = []
    for attempt in (lambda i: in_dtype(i, "float32"), lambda i: run(i, dtype="float32")):
        with pytest.raises(ComputeError) as info:
            attempt(validate(fx, "test.json"))
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    assert "X[query 0 'big', feature 0]" in errors[0]


def test_a_float32_stream_lets_the_float64_inputs_go(tmp_path: Path) -> None:
    path = tmp_path / "f.npz"
    inputs = fixture(64, heads=2, d_model=16)
    arrays = {n: getattr(inputs, n) for n in ("X", "W_Q", "W_K", "W_V")}
    np.savez(path, **{**arrays, "X": arrays["X"][0]}, heads=2)
    for dtype in ("float32", "float64"):
        streamed = stream_file(path, written="npz", stages=["output"], dtype=dtype)
        X = streamed.trace.inputs.X
        assert X is not None and X.dtype == np.dtype(dtype)


def test_the_overflow_bounds_need_no_float64_copy() -> None:
    """The engine's bounds: the largest row norm in float64 (einsum casts as it goes) and the
    largest |value|, against loops; a float32 Q of 4 MiB costs them under 1 MiB."""
    rng = np.random.default_rng(3)
    flat = (rng.standard_normal((1, 512, 4 * 512)) * 1e18).astype(np.float32)  # squares > f32
    q = flat.reshape(1, 512, 4, 512).transpose(0, 2, 1, 3)  # (B, H, T, D): a strided view
    rows = [math.fsum(float(v) ** 2 for v in row) for row in q.reshape(-1, 512)]
    assert _max_norm(q) == pytest.approx(math.sqrt(max(rows)), rel=1e-12)
    tracemalloc.start()
    try:
        _max_norm(q)
        _max_abs(q)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < q.nbytes / 4
    assert _max_abs(q) == max(abs(float(q.max())), abs(float(q.min())))
    assert math.isnan(_max_abs(np.array([1.0, np.nan, -3.0])))
    assert _max_abs(np.zeros((0, 3))) == 0.0
