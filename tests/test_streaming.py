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
import re
import tracemalloc
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import pytest

from attn_cli.blas import blas_limit, blas_threads, cores_busy
from attn_cli.core.memory import NPZ_BUFFER, check_memory, memory_needed
from attn_cli.core.pipeline import Deferred, Stage, run, run_streamed
from attn_cli.errors import InputError, UsageError
from attn_cli.io.arrays import npz_writer
from attn_cli.io.examples import find_example
from attn_cli.io.fixture import load_fixture, validate
from attn_cli.io.trace_json import dumps, write_trace_json

GOLDEN = Path(__file__).parent / "golden"
GENERATOR = re.compile(rb'"generator": "[^"]*"')


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
def test_streamed_json_is_the_golden_file_byte_for_byte(path: Path) -> None:
    """Every golden JSON trace, streamed, is the file (the generator's version aside); one
    golden (pytorch_snippet) differs from today's whole-trace dumps in last digits too, so it
    is compared with dumps(run()) instead."""
    inputs = load_fixture(find_example(path.stem))  # type: ignore[arg-type]
    now = GENERATOR.sub(b"", streamed_json(inputs))
    if path.stem == "pytorch_snippet":
        assert now == GENERATOR.sub(b"", dumps(run(inputs)).encode())
        return
    assert now == GENERATOR.sub(b"", path.read_bytes())


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


def test_cores_are_busy_above_twenty_percent_pressure(tmp_path: Path) -> None:
    assert cores_busy(str(pressure(tmp_path, 35.0)))
    assert not cores_busy(str(pressure(tmp_path, 5.0)))


def test_without_pressure_the_load_average_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("os.getloadavg", lambda: (2.5, 0.0, 0.0))
    assert cores_busy(str(tmp_path / "missing"))
    monkeypatch.setattr("os.getloadavg", lambda: (0.5, 0.0, 0.0))
    assert not cores_busy(str(tmp_path / "missing"))


def test_the_environment_overrides_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("attn_cli.blas.cores_busy", lambda: True)
    assert blas_threads({}) == 1
    assert blas_threads({"ATTN_BLAS_THREADS": "auto"}) == 1
    assert blas_threads({"ATTN_BLAS_THREADS": "3"}) == 3
    monkeypatch.setattr("attn_cli.blas.cores_busy", lambda: False)
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
