"""Families whose 2026 config.json was refused, imported as shipped (issue 41): each case of
tests/reference/forward_2026/ made by transformers 5.25 (forward_2026.py), at its deep layers 2
and 3 from ``--text``: the fixture's X against transformers' residual stream entering the layer
(through the layer's own norm, written here), the traced softmax against its eager attention
weights and the output after W_O against its attention module's output. Then one hostile
config per key these families now read, each refused in one line."""

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

CASES = Path(__file__).parent.parent / "reference" / "forward_2026"
Array = np.ndarray[Any, Any]


def _rms(x: Array, w: Array, eps: float) -> Array:
    y: Array = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
    return y


def _layer_norm(x: Array, w: Array, b: Array | None, eps: float) -> Array:
    c = x - x.mean(-1, keepdims=True)
    y: Array = c / np.sqrt((c * c).mean(-1, keepdims=True) + eps) * w
    return y if b is None else y + b


# each case's norm before attention, as its modeling file writes it: (hidden, tensors, layer)
NormOf = Callable[[Array, dict[str, Array], int], Array]
NORMS: dict[str, NormOf] = {
    "phi3": lambda h, t, i: _rms(h, t[f"model.layers.{i}.input_layernorm.weight"], 1e-5),
    "smollm3": lambda h, t, i: _rms(h, t[f"model.layers.{i}.input_layernorm.weight"], 1e-6),
    "gptj": lambda h, t, i: _layer_norm(
        h, t[f"transformer.h.{i}.ln_1.weight"], t[f"transformer.h.{i}.ln_1.bias"], 1e-5
    ),
    "cohere2": lambda h, t, i: _layer_norm(
        h, t[f"model.layers.{i}.input_layernorm.weight"], None, 1e-5
    ),
}


def _reference(case: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CASES / case / "reference.json").read_text())
    return data


def _close(actual: Array, expected: Any) -> None:
    expected = np.asarray(expected, dtype=np.float64)
    np.testing.assert_allclose(actual.reshape(expected.shape), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("layer", [2, 3])
@pytest.mark.parametrize("case", sorted(NORMS))
def test_a_deep_layer_matches_transformers(case: str, layer: int, tmp_path: Path) -> None:
    ref = _reference(case)
    out = tmp_path / "layer.npz"
    folder = str(CASES / case)
    result = run_cli("import", folder, "--layer", str(layer), "--text", ref["text"], "-o", str(out))
    assert result.exit_code == 0, result.stderr
    deep = ref["deep"][str(layer)]
    tensors = {
        k: v.astype(np.float64) for k, v in load_file(CASES / case / "model.safetensors").items()
    }
    trace = run(load_fixture(out))
    hidden = np.asarray(deep["hidden"], dtype=np.float64)
    _close(np.asarray(trace["X"].data), NORMS[case](hidden, tensors, layer))
    _close(np.asarray(trace["softmax"].data), deep["attentions"])
    _close(np.asarray(trace["projected"].data), deep["attn_output"])


def refused_line(case: str, tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> str:
    """The case's checkpoint with ``edit`` made to its config.json: refused in one line."""
    folder = tmp_path / case
    shutil.copytree(CASES / case, folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    text = _reference(case)["text"]
    result = run_cli(
        "import", str(folder), "--layer", "2", "--text", text, "-o", str(tmp_path / "o.npz")
    )
    assert result.exit_code == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


def _rope(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda c: c["rope_parameters"].__setitem__(key, value)


def _top(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda c: c.__setitem__(key, value)


HOSTILE = [
    ("phi3", _rope("long_factor", [1.0, 2.0]), "long_factor"),
    ("phi3", _rope("short_factor", [1.0, -1.0, 1.0]), "short_factor"),
    ("smollm3", _top("no_rope_layers", [1, 1, 0]), "no_rope_layers"),
    ("smollm3", _top("no_rope_layers", [1, 1, 2, 0]), "no_rope_layers"),
    ("smollm3", _top("layer_types", ["full_attention"] * 3 + ["chunked"]), "layer_types"),
    ("smollm3", lambda c: c.update(no_rope_layers=None, no_rope_layer_interval=0), "interval"),
    ("cohere2", _top("sliding_window_pattern", 0), "sliding_window_pattern"),
    ("cohere2", _top("head_dim", 4), "head_dim"),
    ("cohere2", _top("sliding_window", 0), "sliding_window"),
    ("gptj", _top("rotary_dim", 5), "rotary_dim"),
    ("gptj", _top("rotary_dim", 32), "rotary_dim"),
    ("gptj", _top("rotary_dim", None), "rotary_dim"),
    ("gptj", _top("n_head", 3), "n_head"),
    ("gptj", _top("activation_function", "swish2"), "activation_function"),
]


@pytest.mark.parametrize(("case", "edit", "key"), HOSTILE)
def test_a_hostile_value_of_a_key_is_refused_in_one_line(
    case: str, edit: Callable[[dict[str, Any]], None], key: str, tmp_path: Path
) -> None:
    assert key in refused_line(case, tmp_path, edit)


def test_smollm3_slides_where_layer_types_says_whatever_use_sliding_window(tmp_path: Path) -> None:
    """transformers' eager mask per layer comes from layer_types (SmolLM3's modeling file):
    use_sliding_window false only builds the default list (checked with transformers 5.25: a
    layer typed sliding_attention with sliding_window 2 attends to 2 keys)."""
    folder = tmp_path / "smollm3"
    shutil.copytree(CASES / "smollm3", folder)
    config = json.loads((folder / "config.json").read_text())
    config["layer_types"][2] = "sliding_attention"
    config["sliding_window"] = 2
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "l2.npz"
    text = _reference("smollm3")["text"]
    result = run_cli("import", str(folder), "--layer", "2", "--text", text, "-o", str(out))
    assert result.exit_code == 0, result.stderr
    assert int(np.load(out)["window"]) == 2
