"""The tiny checkpoints bundled for ``attn import NAME`` (models/): the reference folders' bytes,
read by name with no download, and their layers as transformers computed them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ROOT, TESTS, run_cli

from attn_cli.core.pipeline import run
from attn_cli.io.examples import find_checkpoint, model_paths
from attn_cli.io.fixture import load_fixture

MODELS = ROOT / "models"
FORWARD = TESTS / "reference" / "forward"
BUNDLED = {"tiny_llama": "llama", "tiny_gpt2": "gpt2"}  # name -> its reference case
FILES = ("config.json", "model.safetensors", "tokenizer.json")


def _reference(case: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FORWARD / case / "reference.json").read_text())
    return loaded


def test_the_bundled_names_are_the_reference_checkpoints_byte_for_byte() -> None:
    assert sorted(model_paths()) == sorted(BUNDLED)  # in the installed package, or models/
    for name, case in BUNDLED.items():
        for file in FILES:
            shipped = model_paths()[name] / file
            assert shipped.read_bytes() == (FORWARD / case / file).read_bytes()
            assert (MODELS / name / file).read_bytes() == shipped.read_bytes()


def test_a_name_is_a_bundled_checkpoint_only_when_no_such_path_is_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert find_checkpoint(Path("tiny_llama")) == model_paths()["tiny_llama"]
    assert find_checkpoint(Path("elsewhere/tiny_llama")) == Path("elsewhere/tiny_llama")
    assert find_checkpoint(Path("tiny_bert")) == Path("tiny_bert")  # not bundled: as given
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny_llama").mkdir()  # a folder of the user's own wins
    assert find_checkpoint(Path("tiny_llama")) == Path("tiny_llama")


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_attn_import_reads_a_bundled_name_with_no_download(name: str, tmp_path: Path) -> None:
    pytest.importorskip("safetensors", reason="attn import needs the models extra")
    pytest.importorskip("tokenizers", reason="attn import needs the models extra")
    ref = _reference(BUNDLED[name])
    out = tmp_path / "layer0.npz"
    result = run_cli("import", name, "--text", ref["text"], "-o", str(out))
    assert result.exit_code == 0, result.stderr
    softmax = run(load_fixture(out))["softmax"].data
    expected = np.asarray(ref["attentions"][0], dtype=np.float64)  # transformers' eager weights
    # float32 model vs float64 NumPy: rtol 1e-4, as tests/acceptance/test_forward.py
    np.testing.assert_allclose(softmax, expected, rtol=1e-4, atol=1e-5)


def test_an_unknown_checkpoint_names_the_bundled_ones(tmp_path: Path) -> None:
    pytest.importorskip("safetensors", reason="attn import needs the models extra")
    result = run_cli(
        "import", str(tmp_path / "nowhere"), "--text", "a", "-o", str(tmp_path / "x.npz")
    )
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert line.startswith("Error: ") and "\n" not in line
    assert "no such file or folder" in line and "bundled one: tiny_gpt2, tiny_llama" in line
