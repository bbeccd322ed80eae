"""RoPE scaling (issue 23) against transformers itself: tiny checkpoints saved by transformers
5.24 with each kind of scaled RoPE, and what its eager attention computed for layer 0
(tests/reference/rope_scaling/, made by tests/reference/rope_scaling.py in a throwaway venv).

``attn import`` reads each checkpoint (config.json in either spelling, as saved) and its trace
must give transformers' rotated queries and keys, attention weights and attention output; the
frequencies and the attention factor of core/rope_scaling.py must be transformers' own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli

from attn_cli.core.inputs import Rope
from attn_cli.core.pipeline import run
from attn_cli.core.plugins.rope import apply_rope
from attn_cli.core.rope_scaling import KINDS, RopeScaling, frequencies
from attn_cli.io.fixture import load_fixture

REFERENCE = Path(__file__).parent.parent / "reference" / "rope_scaling"
CASES = sorted(p.name for p in REFERENCE.iterdir() if p.is_dir())
RUNS = [
    (case, i)
    for case in CASES
    for i in range(len(json.loads((REFERENCE / case / "reference.json").read_text())["runs"]))
]
IMPORTED = set(CASES)  # Phi-3 too: its fused qkv_proj is split into Q | K | V


def _reference(case: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REFERENCE / case / "reference.json").read_text())
    return data


def _scaling(params: dict[str, Any], config: dict[str, Any]) -> RopeScaling:
    """The fixture's rope.scaling, written here from transformers' rope_parameters."""
    kind = params["rope_type"]
    reads = (*KINDS[kind].required, *KINDS[kind].optional)
    given = {k: v for k, v in params.items() if k in reads and v is not None}
    given.setdefault("max_position_embeddings", config["max_position_embeddings"])
    if "max_position_embeddings" not in reads:
        del given["max_position_embeddings"]
    return RopeScaling(
        kind, tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in given.items())
    )


def test_there_is_a_case_of_every_kind() -> None:
    kinds = {_reference(c)["rope_parameters"]["rope_type"] for c in CASES}
    # but HunYuan's ntk_alpha, a rope_type of its modeling file only: its case is
    # tests/reference/forward_2026/hunyuan_v1_dense (test_forward_2026.py, test_import_hunyuan.py)
    assert kinds | {"ntk_alpha"} == set(KINDS)


@pytest.mark.parametrize(("case", "run_index"), RUNS)
def test_frequencies_and_attention_factor_are_transformers(case: str, run_index: int) -> None:
    ref = _reference(case)
    params = ref["rope_parameters"]
    config = json.loads((REFERENCE / case / "config.json").read_text())
    run_ = ref["runs"][run_index]
    dims = 2 * len(run_["inv_freq"])
    inv, attention = frequencies(_scaling(params, config), dims, params["rope_theta"], run_["T"])
    np.testing.assert_allclose(inv, run_["inv_freq"], rtol=2e-6)  # transformers: float32
    assert attention == pytest.approx(run_["attention_scaling"], rel=1e-6)


def test_the_attention_factor_multiplies_the_rotated_dims_only() -> None:
    """transformers multiplies cos and sin (of the rotary dims): q·k of the rotated part grows
    by the factor squared, the dimensions passed through do not."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 6))
    inv = np.array([0.5, 0.01])
    plain = apply_rope(x, np.arange(3), dims=4, inv_freq=inv)
    scaled = apply_rope(x, np.arange(3), dims=4, inv_freq=inv, attention=1.5)
    np.testing.assert_allclose(scaled[:, :4], 1.5 * plain[:, :4], rtol=1e-15)
    np.testing.assert_array_equal(scaled[:, 4:], x[:, 4:])


def _imported(tmp_path: Path, case: str, run_: dict[str, Any]) -> Any:
    pytest.importorskip(
        "safetensors", reason="attn import needs safetensors: pip install '.[models]'"
    )
    np.save(tmp_path / "h.npy", np.array(run_["h"], dtype=np.float64))
    out = tmp_path / f"{case}.npz"
    result = run_cli(
        "import", str(REFERENCE / case), "--hidden", str(tmp_path / "h.npy"), "-o", str(out)
    )
    assert result.exit_code == 0, result.stderr
    return load_fixture(out)


@pytest.mark.parametrize(("case", "run_index"), [r for r in RUNS if r[0] in IMPORTED])
def test_an_imported_layer_is_transformers_eager_attention(
    tmp_path: Path, case: str, run_index: int
) -> None:
    run_ = _reference(case)["runs"][run_index]
    inputs = _imported(tmp_path, case, run_)
    assert inputs.rope is not None and inputs.rope.scaling is not None
    trace = run(inputs)
    q, k = np.array(run_["q"]), np.array(run_["k"])
    np.testing.assert_allclose(trace["Q_rot"].data, q, rtol=1e-4, atol=1e-5 * np.abs(q).max())
    np.testing.assert_allclose(trace["K_rot"].data, k, rtol=1e-4, atol=1e-5 * np.abs(k).max())
    np.testing.assert_allclose(trace["softmax"].data, run_["weights"], rtol=1e-4, atol=1e-6)
    out = np.array(run_["output"])
    np.testing.assert_allclose(
        trace["projected"].data, out, rtol=1e-4, atol=1e-5 * np.abs(out).max()
    )


def test_both_spellings_of_llama3_import_to_the_same_fixture(tmp_path: Path) -> None:
    run_ = _reference("llama3_legacy")["runs"][0]
    legacy = _imported(tmp_path, "llama3_legacy", run_)
    params = _imported(tmp_path, "llama3_params", run_)
    assert legacy.rope == params.rope
    assert legacy.rope is not None and legacy.rope.scaling is not None
    assert legacy.rope.base == 500000.0 and legacy.rope.scaling.kind == "llama3"


def test_plain_rope_would_be_wrong_on_every_case(tmp_path: Path) -> None:
    """The cases do test the scaling: plain RoPE moves the output (dynamic's short run aside)."""
    for case in sorted(IMPORTED):
        run_ = _reference(case)["runs"][0]
        inputs = _imported(tmp_path, case, run_)
        assert inputs.rope is not None
        from dataclasses import replace

        plain = replace(inputs, rope=Rope(inputs.rope.base, inputs.rope.layout, inputs.rope.dims))
        gap = np.abs(run(plain)["projected"].data - np.array(run_["output"])).max()
        assert gap > 1e-3, case
