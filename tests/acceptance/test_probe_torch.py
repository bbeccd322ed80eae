"""``attn probe`` on torch's own ``scaled_dot_product_attention`` (skipped without torch).

torch is not a dependency of attn: run these in a venv with torch (2.13 checked:
``enable_gqa`` exists there). SDPA wrapped with attn probe's option names must match with NumPy
arrays converted inside the wrapper and with ``--framework torch``; dropout left on must not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

torch = pytest.importorskip("torch", reason="torch is not installed: pip install torch")
F = torch.nn.functional

SDPA_CONVENTIONS = {
    "scale": "1/sqrt(d)",
    "causal": "upper-left",
    "mask": "true-attends",
    "empty_row": "zeros",
    "gqa": "repeat-interleave",
    "softmax_axis": "keys",
    "large_logits": "stable",
    "zero_scores": "kept",
    "deterministic": True,
    "batch_independent": True,
    "window": "n/a",
}

WRAPPERS = """
import torch
import torch.nn.functional as F

def sdpa(q, k, v, causal=False, mask=None, scale=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                          scale=scale, enable_gqa=q.shape[1] != k.shape[1])

def sdpa_numpy(q, k, v, causal=False, mask=None, scale=None):
    t = lambda a: None if a is None else torch.from_numpy(a)
    return sdpa(t(q), t(k), t(v), causal, t(mask), scale).numpy()

def sdpa_dropout(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
"""


def test_enable_gqa_exists_in_this_torch() -> None:
    assert "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


@pytest.mark.slow
@pytest.mark.parametrize(("function", "framework"), [("sdpa", "torch"), ("sdpa_numpy", "numpy")])
def test_sdpa_wrapped_matches(tmp_path: Path, function: str, framework: str) -> None:
    path = tmp_path / "wrappers.py"
    path.write_text(WRAPPERS)
    result = run_cli("probe", f"{path}:{function}", "--framework", framework, "-f", "json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["conventions"] == SDPA_CONVENTIONS and report["findings"] == []


@pytest.mark.slow
def test_sdpa_in_float32_and_with_an_additive_mask_matches(tmp_path: Path) -> None:
    path = tmp_path / "wrappers.py"
    path.write_text(WRAPPERS)
    for extra in (["--dtype", "float32"], ["--mask", "additive"]):
        result = run_cli("probe", f"{path}:sdpa", "--framework", "torch", "-f", "json", *extra)
        assert result.exit_code == 0, result.stderr
        conventions: dict[str, Any] = json.loads(result.stdout)["conventions"]
        assert conventions["scale"] == "1/sqrt(d)" and conventions["empty_row"] == "zeros"


@pytest.mark.slow
def test_sdpa_with_dropout_on_is_not_deterministic(tmp_path: Path) -> None:
    path = tmp_path / "wrappers.py"
    path.write_text(WRAPPERS)
    result = run_cli("probe", f"{path}:sdpa_dropout", "--framework", "torch", "-f", "json")
    assert result.exit_code == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["conventions"]["deterministic"] is False
    assert "not_deterministic" in [f["id"] for f in report["findings"]]


@pytest.mark.slow
def test_sdpa_itself_is_asked_without_options(tmp_path: Path) -> None:
    """The builtin has no signature to read: no option is passed, and without enable_gqa it
    refuses K/V with fewer heads, which is no difference."""
    target = "torch.nn.functional:scaled_dot_product_attention"
    result = run_cli("probe", target, "--framework", "torch", "-f", "json")
    assert result.exit_code == 0, result.stderr
    conventions = json.loads(result.stdout)["conventions"]
    assert conventions["causal"] == "none" and conventions["mask"] == "n/a"
    assert conventions["gqa"] == "refused"


def test_numpy_arrays_returned_under_framework_torch_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "np_target.py"
    path.write_text("def f(q, k, v):\n    return q.numpy()\n")
    result = run_cli("probe", f"{path}:f", "--framework", "torch")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ") and "expected a torch.Tensor" in result.stderr
