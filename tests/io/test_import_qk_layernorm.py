"""qk_layernorm where attn cannot be exact: each refused in one line (exit 2) naming the file,
the field and what was expected. In a checkpoint (StableLM's per-head norms, Phi's shared one
with a bias, Cohere's use_qk_norm with one (heads, head_dim) weight: config.json's key not a
boolean, a norm tensor missing or of another shape, norm tensors saved with the key off) and in
a fixture (the key's value, its weights' shapes, its biases, eps). The checkpoints are the
committed ones transformers saved (tests/reference/forward_2026/stablelm,
tests/reference/families/phi_qk_layernorm and cohere_qk_norm)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import FIXTURES, run_cli

REFERENCE = Path(__file__).parent.parent / "reference"
STABLELM = REFERENCE / "forward_2026" / "stablelm"
PHI = REFERENCE / "families" / "phi_qk_layernorm"
COHERE = REFERENCE / "families" / "cohere_qk_norm"  # use_qk_norm: q_norm [heads, head_dim]
ATTN = "model.layers.{}.self_attn."


def _checkpoint(tmp_path: Path, source: Path, config: dict[str, Any], edit: Any) -> Path:
    """A copy of ``source`` with ``config`` merged into its config.json and ``edit`` applied to
    its tensors (a dict, changed in place)."""
    safetensors = pytest.importorskip("safetensors.numpy", reason="attn import needs safetensors")
    folder = tmp_path / source.name
    shutil.copytree(source, folder)
    data = json.loads((folder / "config.json").read_text()) | config
    (folder / "config.json").write_text(json.dumps(data))
    tensors = safetensors.load_file(str(folder / "model.safetensors"))
    edit(tensors)
    safetensors.save_file(tensors, str(folder / "model.safetensors"))
    return folder


def _drop(name: str) -> Any:
    return lambda t: t.pop(name)


def _cut(name: str) -> Any:
    return lambda t: t.__setitem__(name, t[name][:4].copy())


def _nothing(t: dict[str, Any]) -> None:
    return None


S, P = ATTN.format(2), ATTN.format(0)  # the layer each case imports
HOSTILE: dict[str, tuple[Path, dict[str, Any], Any, str]] = {
    "stablelm qk_layernorm a string": (STABLELM, {"qk_layernorm": "yes"}, _nothing, "qk_layernorm"),
    "stablelm qk_layernorm 1": (STABLELM, {"qk_layernorm": 1}, _nothing, "qk_layernorm: got 1"),
    "stablelm key off, norms saved": (
        STABLELM,
        {"qk_layernorm": False},
        _nothing,
        "k_layernorm.norms.0.weight: a tensor of layer 0's attention",
    ),
    "stablelm a head's q norm missing": (
        STABLELM,
        {},
        _drop(S + "q_layernorm.norms.1.weight"),
        S + "q_layernorm.norms.1.weight: missing tensor",
    ),
    "stablelm a k norm of another length": (
        STABLELM,
        {},
        _cut(S + "k_layernorm.norms.0.weight"),
        S + "k_layernorm.norms.0.weight: has shape [4], expected [8]",
    ),
    "stablelm a norm for a head it does not have": (
        STABLELM,
        {},
        lambda t: t.__setitem__(S + "k_layernorm.norms.1.weight", np.ones(8, np.float32)),
        "k_layernorm.norms.1.weight",
    ),
    "phi qk_layernorm a string": (PHI, {"qk_layernorm": "true"}, _nothing, "qk_layernorm"),
    "phi its q norm's bias missing": (
        PHI,
        {},
        _drop(P + "q_layernorm.bias"),
        P + "q_layernorm.bias: missing tensor",
    ),
    "phi a k norm of another length": (
        PHI,
        {},
        _cut(P + "k_layernorm.weight"),
        P + "k_layernorm.weight: has shape [4], expected [8]",
    ),
    "cohere use_qk_norm a string": (COHERE, {"use_qk_norm": "yes"}, _nothing, "use_qk_norm"),
    "cohere key off, norms saved": (
        COHERE,
        {"use_qk_norm": False},
        _nothing,
        "k_norm.weight: a tensor of layer 0's attention",
    ),
    "cohere its k norm missing": (
        COHERE,
        {},
        _drop(P + "k_norm.weight"),
        P + "k_norm.weight: missing tensor",
    ),
    "cohere one q norm weight for every head": (
        COHERE,
        {},
        lambda t: t.__setitem__(P + "q_norm.weight", t[P + "q_norm.weight"][0].copy()),
        P + "q_norm.weight: has shape [8], expected [2, 8]",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_checkpoint_is_refused_in_one_line(case: str, tmp_path: Path) -> None:
    pytest.importorskip("tokenizers", reason="--text needs tokenizers")
    source, config, edit, words = HOSTILE[case]
    folder = _checkpoint(tmp_path, source, config, edit)
    out = tmp_path / "out.npz"
    layer = "2" if source == STABLELM else "0"
    result = run_cli("import", str(folder), "--layer", layer, "--text", "a b c", "-o", str(out))
    assert result.exit_code == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert words in lines[0], lines[0]
    assert not out.exists()


# the fixture's qk_layernorm (heads 2, kv_heads 1, d_k 4) -> the one line's field and words
ONES, ZEROS = [1.0] * 4, [0.0] * 4
FIXTURE_HOSTILE: list[tuple[Any, str]] = [
    ("yes", "qk_layernorm: got the string 'yes', expected a mapping"),
    (True, "qk_layernorm: got the boolean true, expected a mapping"),
    ({"q_weight": ONES}, "qk_layernorm.k_weight: missing, expected q_weight and k_weight"),
    (
        {"q_weight": ONES[:3], "k_weight": ONES},
        "qk_layernorm.q_weight: has shape [3], expected [heads, d_k] = [2, 4] (one per head) "
        "or d_k = 4 (shared)",
    ),
    (
        {"q_weight": [ONES] * 3, "k_weight": ONES},
        "qk_layernorm.q_weight: has shape [3, 4], expected [heads, d_k] = [2, 4]",
    ),
    (
        {"q_weight": ONES, "k_weight": [ONES] * 2},
        "qk_layernorm.k_weight: has shape [2, 4], expected [kv_heads, d_k] = [1, 4]",
    ),
    (
        {"q_weight": [ONES] * 2, "k_weight": ONES, "q_bias": ZEROS},
        "qk_layernorm.q_bias: has shape [4], expected the shape of q_weight, [2, 4]",
    ),
    (
        {"q_weight": ONES, "k_weight": ONES, "eps": -1},
        "qk_layernorm.eps: is -1, expected a finite number > 0",
    ),
    (
        {"q_weight": ONES, "k_weight": ONES, "bias": ZEROS},
        "qk_layernorm.bias: unknown key (did you mean 'q_bias'?)",
    ),
    (
        {"q_weight": [[ONES]], "k_weight": ONES},
        "qk_layernorm.q_weight: has 3 axes (shape [1, 1, 4])",
    ),
]


@pytest.mark.parametrize(("value", "words"), FIXTURE_HOSTILE)
def test_a_hostile_fixture_key_is_refused_in_one_line(
    value: Any, words: str, tmp_path: Path
) -> None:
    fx = yaml.safe_load((FIXTURES / "qk_layernorm.yaml").read_text(encoding="utf-8"))
    path = tmp_path / "h.yaml"
    path.write_text(yaml.safe_dump({**fx, "qk_layernorm": value}), encoding="utf-8")
    result = run_cli("trace", str(path), "-s", "Q_ln")
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {path}: {words}"), result.stderr
