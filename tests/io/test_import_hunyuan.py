"""HunYuan dense's new config keys and tensors, attacked: the NTK alpha of its "dynamic" rope
(negative, huge, a string, a bool, a list), the query/key_layernorm tensors missing or of another
size: each refused in one line naming the field. Then what must import: alpha 0 or
null (transformers reads the rope as dynamic NTK then), and its ntk_alpha base as transformers
writes it, base · alpha^(d/(d−2)), checked against the reference case's config."""

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
from safetensors.numpy import load_file, save_file

from attn_cli.io.fixture import load_fixture

CASE = Path(__file__).parent.parent / "reference" / "forward_2026" / "hunyuan_v1_dense"
Edit = Callable[[dict[str, Any]], None]


def _alpha(value: Any) -> Edit:
    return lambda c: c["rope_parameters"].__setitem__("alpha", value)


def _copy(tmp_path: Path, edit: Edit | None = None) -> Path:
    folder = tmp_path / "hunyuan"
    shutil.copytree(CASE, folder)
    if edit is not None:
        config = json.loads((folder / "config.json").read_text())
        edit(config)
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def _import(folder: Path, out: Path) -> Any:
    return run_cli("import", str(folder), "--layer", "2", "--text", "a b c", "-o", str(out))


def _refused(result: Any, out: Path, word: str) -> None:
    assert result.exit_code == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and word in lines[0], result.stderr
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("edit", "word"),
    [
        (_alpha(-5), "rope.scaling.alpha"),
        (_alpha(1e300), "rope.scaling.alpha"),
        (_alpha("1000"), "rope.scaling.alpha"),
        (_alpha(True), "rope.scaling.alpha"),
        (_alpha([1000]), "rope.scaling.alpha"),
    ],
    ids=[
        "alpha negative",
        "alpha huge",
        "alpha a string",
        "alpha a bool",
        "alpha a list",
    ],
)
def test_a_hostile_config_is_refused_in_one_line(edit: Edit, word: str, tmp_path: Path) -> None:
    out = tmp_path / "o.npz"
    _refused(_import(_copy(tmp_path, edit), out), out, word)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tensor", "shape"),
    [("query_layernorm", None), ("key_layernorm", None), ("key_layernorm", (4,))],
    ids=["no query_layernorm", "no key_layernorm", "key_layernorm of 4"],
)
def test_a_missing_or_misshapen_norm_tensor_is_refused(
    tensor: str, shape: tuple[int, ...] | None, tmp_path: Path
) -> None:
    folder = _copy(tmp_path)
    tensors = load_file(folder / "model.safetensors")
    name = f"model.layers.2.self_attn.{tensor}.weight"
    if shape is None:
        del tensors[name]
    else:
        tensors[name] = np.ones(shape, dtype=np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    out = tmp_path / "o.npz"
    _refused(_import(folder, out), out, f"{tensor}.weight")


@pytest.mark.slow
@pytest.mark.parametrize("alpha", [0, None, False])
def test_an_alpha_transformers_does_not_read_leaves_dynamic_ntk(alpha: Any, tmp_path: Path) -> None:
    """``rope_parameters.get("alpha")`` is falsy: transformers' rope is its dynamic NTK, which
    reads factor and max_position_embeddings (the case's 32; nothing grows below it)."""
    out = tmp_path / "o.npz"
    result = _import(_copy(tmp_path, _alpha(alpha)), out)
    assert result.exit_code == 0, result.stderr
    rope = load_fixture(out).rope
    assert rope is not None and rope.scaling is not None
    assert dict(rope.scaling.params) == {"factor": 1.0, "max_position_embeddings": 32}
    assert rope.scaling.kind == "dynamic"


@pytest.mark.slow
def test_the_alpha_base_is_transformers_formula(tmp_path: Path) -> None:
    config = json.loads((CASE / "config.json").read_text())
    out = tmp_path / "o.npz"
    result = _import(CASE, out)
    assert result.exit_code == 0, result.stderr
    assert "ntk_alpha" in result.stderr
    from attn_cli.core.rope_table import rope_table

    rope = load_fixture(out).rope
    assert rope is not None
    d, params = config["head_dim"], config["rope_parameters"]
    base = params["rope_theta"] * params["alpha"] ** (d / (d - 2))  # modeling_hunyuan_v1_dense
    want = 1.0 / base ** (np.arange(0, d, 2) / d)
    table = rope_table(rope, d, 8, 0)
    np.testing.assert_allclose(table.scaled, want, rtol=1e-12)
    assert table.base == pytest.approx(base, rel=1e-12)
