"""Ministral 3 as shipped (issue 41): its case of tests/reference/forward_2026/ (made by
transformers 5.25, forward_2026.py) at deep layers 2 and 3 from ``--text``: the fixture's X
against transformers' residual stream entering the layer through the layer's RMSNorm (written
here), the traced softmax against its eager attention weights, the output after W_O against its
attention module's output; the query scaling (llama_4_scaling_beta) is the ``temperature``
variant, offset 0. Then hostile values of the keys it reads, each refused in one line."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("safetensors", reason="attn import needs safetensors: pip install '.[models]'")
pytest.importorskip("tokenizers", reason="attn import needs tokenizers: pip install '.[models]'")

from conftest import run_cli
from safetensors.numpy import load_file

from attn_cli.core.pipeline import run
from attn_cli.io.fixture import load_fixture

CASE = Path(__file__).parent.parent / "reference" / "forward_2026" / "ministral3"
Array = np.ndarray[Any, Any]


def _reference() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CASE / "reference.json").read_text())
    return data


def _close(actual: Array, expected: Any) -> None:
    expected = np.asarray(expected, dtype=np.float64)
    np.testing.assert_allclose(actual.reshape(expected.shape), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("layer", [2, 3])
def test_a_deep_layer_matches_transformers(layer: int, tmp_path: Path) -> None:
    ref = _reference()
    out = tmp_path / "layer.npz"
    result = run_cli(
        "import", str(CASE), "--layer", str(layer), "--text", ref["text"], "-o", str(out)
    )
    assert result.exit_code == 0, result.stderr
    deep = ref["deep"][str(layer)]
    tensors = load_file(CASE / "model.safetensors")
    w = tensors[f"model.layers.{layer}.input_layernorm.weight"].astype(np.float64)
    h = np.asarray(deep["hidden"], dtype=np.float64)
    trace = run(load_fixture(out))
    assert "Q_tuned" in trace  # the query scaling, shown as its stage
    _close(np.asarray(trace["X"].data), h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-5) * w)
    _close(np.asarray(trace["softmax"].data), deep["attentions"])
    _close(np.asarray(trace["projected"].data), deep["attn_output"])


def _rope(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda c: c["rope_parameters"].__setitem__(key, value)


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (_rope("llama_4_scaling_beta", "0.1"), "llama_4_scaling_beta"),
        (_rope("llama_4_scaling_beta", True), "llama_4_scaling_beta"),
        (_rope("original_max_position_embeddings", 0), "original_max_position_embeddings"),
        (_rope("mrope_section", [1, 1]), "mrope_section"),
    ],
)
def test_a_hostile_value_is_refused_in_one_line(
    edit: Callable[[dict[str, Any]], None], key: str, tmp_path: Path
) -> None:
    folder = tmp_path / "ministral3"
    shutil.copytree(CASE, folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    result = run_cli(
        "import",
        str(folder),
        "--layer",
        "2",
        "--text",
        _reference()["text"],
        "-o",
        str(tmp_path / "o.npz"),
    )
    assert result.exit_code == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and key in lines[0], result.stderr
