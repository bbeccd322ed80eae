"""OLMo's clip_qkv, as shipped (issue 41): the olmo_clip case of tests/reference/forward_2026/
made by transformers 5.25 (forward_2026.py), at its deep layers 2 and 3 from ``--text``: the
fixture's X against transformers' residual stream entering the layer (through the layer's own
norm, written here), the traced softmax against its eager attention weights and the output
after W_O against its attention module's output. Then hostile values of the key, each refused in
one line, and the variant through trace, its JSON, its explanations, the grader, decoding,
FlashAttention and the backward pass."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("safetensors", reason="attn import needs safetensors: pip install '.[models]'")
pytest.importorskip("tokenizers", reason="attn import needs tokenizers: pip install '.[models]'")

from conftest import run_cli
from safetensors.numpy import load_file
from test_forward_2026_shipped import refused_line

from attn_cli.core.pipeline import run
from attn_cli.io.fixture import load_fixture

CASES = Path(__file__).parent.parent / "reference" / "forward_2026"
Array = np.ndarray[Any, Any]


def _layer_norm(x: Array, w: Array | None, eps: float) -> Array:
    c = x - x.mean(-1, keepdims=True)
    y: Array = c / np.sqrt((c * c).mean(-1, keepdims=True) + eps)
    return y if w is None else y * w


# each case's norm before attention, as its modeling file writes it: (hidden, tensors, layer)
NormOf = Callable[[Array, dict[str, Array], int], Array]
NORMS: dict[str, NormOf] = {
    "olmo_clip": lambda h, t, i: _layer_norm(h, None, 1e-5),
}


def _reference(case: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CASES / case / "reference.json").read_text())
    return data


def _close(actual: Array, expected: Any) -> float:
    expected = np.asarray(expected, dtype=np.float64)
    actual = actual.reshape(expected.shape)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
    return float(np.abs(actual - expected).max())


def _import(case: str, layer: int, out: Path, folder: Path | None = None) -> Any:
    text = _reference(case)["text"]
    where = str(folder or CASES / case)
    return run_cli("import", where, "--layer", str(layer), "--text", text, "-o", str(out))


@pytest.mark.slow
@pytest.mark.parametrize("layer", [2, 3])
@pytest.mark.parametrize("case", sorted(NORMS))
def test_a_deep_layer_matches_transformers(case: str, layer: int, tmp_path: Path) -> None:
    ref = _reference(case)
    out = tmp_path / "layer.npz"
    result = _import(case, layer, out)
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


def _top(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda c: c.__setitem__(key, value)


HOSTILE = [
    ("olmo_clip", _top("clip_qkv", 0), "clip_qkv"),
    ("olmo_clip", _top("clip_qkv", -1.0), "clip_qkv"),
    ("olmo_clip", _top("clip_qkv", "big"), "clip_qkv"),
]


@pytest.mark.parametrize(("case", "edit", "key"), HOSTILE)
def test_a_hostile_value_of_a_key_is_refused_in_one_line(
    case: str, edit: Callable[[dict[str, Any]], None], key: str, tmp_path: Path
) -> None:
    assert key in refused_line(case, tmp_path, edit)


@pytest.fixture(scope="module")
def olmo_layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Layer 2 of the olmo_clip case as a fixture (clip_qkv 0.5)."""
    out = tmp_path_factory.mktemp("olmo") / "l2.npz"
    result = _import("olmo_clip", 2, out)
    assert result.exit_code == 0, result.stderr
    return out


def test_clip_qkv_is_a_stage_of_trace_json_and_explain(olmo_layer: Path) -> None:
    table = run_cli("trace", str(olmo_layer))
    assert table.exit_code == 0, table.stderr
    assert "Q_clip = clamp(Q, −0.5, 0.5)" in table.stdout
    assert "V = X·W_V, clamped to [−0.5, 0.5] (clip_qkv)" in table.stdout
    assert "clip_qkv 0.5: Q, K and V clamped" in table.stdout
    page = olmo_layer.parent / "page.html"
    assert run_cli("trace", str(olmo_layer), "-f", "html", "-o", str(page)).exit_code == 0
    assert "Q_clip" in page.read_text()
    data = json.loads(run_cli("trace", str(olmo_layer), "-f", "json").stdout)
    assert data["config"]["clip_qkv"] == 0.5
    for lang, word in (("en", "OLMo clamps Q, K and V"), ("zh", "截断 Q、K 和 V")):
        explained = run_cli("trace", str(olmo_layer), "--explain", "--lang", lang, "-s", "K_clip")
        assert explained.exit_code == 0, explained.stderr
        assert word in explained.stdout


def test_the_traced_q_k_and_v_are_clamped(olmo_layer: Path) -> None:
    trace = run(load_fixture(olmo_layer))
    for name in ("Q_clip", "K_clip", "V"):
        assert np.abs(np.asarray(trace[name].data)).max() <= 0.5
    assert np.abs(np.asarray(trace["Q"].data)).max() > 0.5  # the clamp bites here


def test_decode_and_flash_run_it_and_the_backward_pass_refuses_it(olmo_layer: Path) -> None:
    for command in ("decode", "flash"):
        result = run_cli(command, str(olmo_layer))
        assert result.exit_code == 0, result.stderr
    backward = run_cli("trace", str(olmo_layer), "--backward")
    assert backward.exit_code == 2
    lines = backward.stderr.splitlines()
    assert len(lines) == 1 and "clip_qkv" in lines[0], backward.stderr


def test_the_grader_names_clip_qkv_left_out(olmo_layer: Path) -> None:
    from attn_cli.api import trace_file
    from attn_cli.check.dump import load_dump
    from attn_cli.check.grade import grade

    fixture = load_fixture(olmo_layer)
    unclipped = run(fixture.with_setting("clip_qkv", None))
    right = run(fixture)
    dump: dict[str, Any] = {n: unclipped[n].data for n in ("Q", "K", "scores", "softmax")}
    dump["V"] = np.asarray(right["V"].data)
    dump["Q_clip"], dump["K_clip"] = dump["Q"], dump["K"]
    path = olmo_layer.parent / "student.npz"
    np.savez(path, **dump)
    comparison = grade(trace_file(str(olmo_layer)), load_dump(path))
    assert comparison.first_difference is not None
    assert comparison.first_difference.name == "Q_clip"
    assert [d.name for d in comparison.diagnoses] == ["clip_qkv_left_out"]
