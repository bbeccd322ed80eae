"""RoPE scaling (issue 23) against transformers itself: tiny checkpoints saved by transformers
5.24 with each kind of scaled RoPE, and what its eager attention computed for layer 0
(tests/reference/rope_scaling/, made by tests/reference/rope_scaling.py in a throwaway venv).

``attn import`` reads each checkpoint (config.json in either spelling, as saved) and its trace
must give transformers' rotated queries and keys, attention weights and attention output; the
frequencies and the attention factor of core/rope_scaling.py must be transformers' own.
"""

from __future__ import annotations

import json
import math
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

REFERENCE = Path(__file__).parent / "reference" / "rope_scaling"
CASES = sorted(p.name for p in REFERENCE.iterdir() if p.is_dir())
RUNS = [(case, i) for case in CASES for i in range(len(json.loads(
    (REFERENCE / case / "reference.json").read_text())["runs"]))]  # fmt: skip
IMPORTED = {c for c in CASES if not c.startswith("phi3")}  # Phi-3's fused qkv_proj: refused


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
    return RopeScaling(kind, tuple((k, tuple(v) if isinstance(v, list) else v)
                                   for k, v in given.items()))  # fmt: skip


def test_there_is_a_case_of_every_kind() -> None:
    kinds = {_reference(c)["rope_parameters"]["rope_type"] for c in CASES}
    assert kinds == set(KINDS)


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
    result = run_cli("import", str(REFERENCE / case), "--hidden", str(tmp_path / "h.npy"),
                     "-o", str(out))  # fmt: skip
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


def test_phi3_is_refused_in_one_line_naming_what_is_missing(tmp_path: Path) -> None:
    np.save(tmp_path / "h.npy", np.zeros((3, 16)))
    result = run_cli("import", str(REFERENCE / "phi3_longrope"), "--hidden",
                     str(tmp_path / "h.npy"), "-o", str(tmp_path / "o.npz"))  # fmt: skip
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "phi3" in lines[0]
    assert not (tmp_path / "o.npz").exists()


# -- the fixture's rope.scaling, from a user ---------------------------------------------------

BASE = """
tokens: [a, b, c]
Q: [[1, 0, 0.5, 0.2], [0, 1, 0.1, 0.3], [1, 1, 0.2, 0.1]]
K: [[1, 0, 0.4, 0.2], [0, 1, 0.3, 0.3], [1, 1, 0.2, 0.7]]
V: [[1, 0, 0, 2], [0, 1, 3, 0], [1, 1, 0, -1]]  # rows of unequal sums: sum(output) moves
causal: true
"""


def _fixture(tmp_path: Path, scaling: str) -> Path:
    path = tmp_path / "f.yaml"
    path.write_text(BASE + f"rope: {{base: 10000, scaling: {scaling}}}\n")
    return path


@pytest.mark.parametrize(
    ("scaling", "field"),
    [
        ("{type: ntk}", "rope.scaling.type"),
        ("{type: linear}", "rope.scaling"),
        ("{type: linear, factor: 0}", "rope.scaling.factor"),
        ("{type: linear, factor: .inf}", "rope.scaling.factor"),
        ("{type: linear, factor: 2, beta_fast: 3}", "rope.scaling.beta_fast"),
        ("{type: yarn, original_max_position_embeddings: 8}", "rope.scaling"),
        (
            "{type: yarn, factor: 2, original_max_position_embeddings: 1.5}",
            "rope.scaling.original_max_position_embeddings",
        ),
        (
            "{type: yarn, factor: 2, original_max_position_embeddings: 8, truncate: 1}",
            "rope.scaling.truncate",
        ),
        (
            "{type: longrope, short_factor: [1], long_factor: [1, 2], "
            "original_max_position_embeddings: 2, factor: 2}",
            "rope.scaling.short_factor",
        ),
        (
            "{type: llama3, factor: 8, low_freq_factor: 4, high_freq_factor: 1, "
            "original_max_position_embeddings: 8}",
            "rope.scaling.high_freq_factor",
        ),
        ("{type: linear, rope_type: llama3, factor: 2}", "rope.scaling"),
        ("[linear, 2]", "rope.scaling"),
    ],
)
def test_a_bad_scaling_is_one_line_naming_the_field(
    tmp_path: Path, scaling: str, field: str
) -> None:
    result = run_cli("trace", str(_fixture(tmp_path, scaling)))
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and f": {field}: " in lines[0], result.stderr


def test_a_scaled_fixture_round_trips_through_json_and_npz(tmp_path: Path) -> None:
    path = _fixture(tmp_path, "{type: yarn, factor: 4, original_max_position_embeddings: 2}")
    assert (
        run_cli("trace", str(path), "--format", "json", "-o", str(tmp_path / "t.json")).exit_code
        == 0
    )
    config = json.loads((tmp_path / "t.json").read_text())["config"]["rope"]
    assert config["scaling"] == {"type": "yarn", "factor": 4.0,
                                 "original_max_position_embeddings": 2}  # fmt: skip
    inputs = load_fixture(path)
    attention = 0.1 * math.log(4) + 1
    assert "yarn scaling, cos and sin × 1.13863" in run(inputs)["Q_rot"].formula
    assert run(inputs)["Q_rot"].formula.startswith("Q_rot = RoPE(Q, positions)")
    assert attention == pytest.approx(1.1386294361)


def test_decode_refuses_a_length_dependent_scaling_past_its_length(tmp_path: Path) -> None:
    path = _fixture(tmp_path, "{type: dynamic, factor: 2, max_position_embeddings: 2}")
    result = run_cli("decode", str(path))
    assert result.exit_code == 2
    assert "rope.scaling: dynamic frequencies change" in result.stderr
    ok = _fixture(tmp_path, "{type: dynamic, factor: 2, max_position_embeddings: 8}")
    assert run_cli("decode", str(ok)).exit_code == 0


@pytest.mark.parametrize("kind", ["yarn", "longrope", "llama3"])
def test_the_gradient_through_scaled_rope_matches_finite_differences(
    tmp_path: Path, kind: str
) -> None:
    """d_Q (and d_K) undo the scaled rotation and its attention factor: the backward pass's
    gradient of sum(output) against a central difference of the forward."""
    from dataclasses import replace

    scalings = {
        "yarn": "{type: yarn, factor: 4, original_max_position_embeddings: 2}",
        "longrope": "{type: longrope, short_factor: [1, 2], long_factor: [3, 5], "
        "original_max_position_embeddings: 2, factor: 3}",
        "llama3": "{type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4, "
        "original_max_position_embeddings: 20}",
    }
    inputs = load_fixture(_fixture(tmp_path, scalings[kind]))
    trace = run(inputs, backward=True)
    for name in ("Q", "K"):
        analytic = trace[f"d_{name}"].data
        base = getattr(inputs, name)
        numeric = np.zeros_like(base)
        for i in np.ndindex(base.shape):
            step = np.zeros_like(base)
            step[i] = 1e-6
            up = run(replace(inputs, **{name: base + step}))["output"].data.sum()
            down = run(replace(inputs, **{name: base - step}))["output"].data.sum()
            numeric[i] = (up - down) / 2e-6
        np.testing.assert_allclose(analytic.reshape(numeric.shape), numeric, rtol=1e-6, atol=1e-8)
