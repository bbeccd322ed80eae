"""The grader on q/k LayerNorm (the bundled example ``qk_layernorm``: StableLM 2's LayerNorm of
each head of Q and K, 2 query heads, 1 kv head, d_k 4): a student's Q_ln and K_ln written here
with NumPy the wrong way (an RMSNorm, head 0's weight on every head, one norm over the whole
projection) are each diagnosed by name, in English and Chinese, and the right way by none."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import FIXTURES, run_cli

from attn_cli.api import trace_file
from attn_cli.check.dump import load_dump
from attn_cli.check.grade import grade

Array = np.ndarray[Any, np.dtype[Any]]
FX = yaml.safe_load((FIXTURES / "qk_layernorm.yaml").read_text(encoding="utf-8"))
EPS = FX["qk_layernorm"]["eps"]
T, H, HKV, D = len(FX["tokens"]), FX["heads"], FX["kv_heads"], 4


def _heads(W: str, n: int) -> Array:
    """X·W split into heads: (heads, T, D)."""
    flat = np.array(FX["X"]) @ np.array(FX[W])  # (T, heads*D)
    out: Array = flat.reshape(T, n, D).transpose(1, 0, 2)  # (heads, T, D)
    return out


def _layer_norm(x: Array, w: Array) -> Array:
    c = x - x.mean(-1, keepdims=True)
    return c / np.sqrt((c * c).mean(-1, keepdims=True) + EPS) * w  # type: ignore[no-any-return]


def _rms(x: Array, w: Array) -> Array:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w  # type: ignore[no-any-return]


def _whole(x: Array, w: Array) -> Array:
    """One LayerNorm over each token's heads*D numbers, then split again."""
    n = x.shape[0]
    flat = x.transpose(1, 0, 2).reshape(T, n * D)  # (T, heads*D)
    out: Array = _layer_norm(flat, w.reshape(-1)).reshape(T, n, D).transpose(1, 0, 2)
    return out  # (heads, T, D)


Q, K = _heads("W_Q", H), _heads("W_K", HKV)
QW, KW = (np.array(FX["qk_layernorm"][w])[:, None] for w in ("q_weight", "k_weight"))
Norm = Callable[[Array, Array], Array]
STUDENTS: dict[str, Norm] = {  # the student's norm of Q (K) given its weights (heads, 1, D)
    "qk_layernorm_rms": _rms,
    "qk_layernorm_shared": lambda x, w: _layer_norm(x, w[0]),
    "qk_layernorm_whole": _whole,
}


def _dump(tmp_path: Path, norm: Norm) -> Path:
    path = tmp_path / "student.npz"
    np.savez(path, Q=Q, K=K, Q_ln=norm(Q, QW), K_ln=norm(K, KW))
    return path


@pytest.mark.parametrize("mistake", STUDENTS)
def test_each_mistake_is_named(mistake: str, tmp_path: Path) -> None:
    comparison = grade(trace_file("qk_layernorm"), load_dump(_dump(tmp_path, STUDENTS[mistake])))
    assert comparison.first_difference is not None
    assert comparison.first_difference.name == "Q_ln"
    assert [d.name for d in comparison.diagnoses] == [mistake]


def test_the_right_layernorm_is_the_trace(tmp_path: Path) -> None:
    comparison = grade(trace_file("qk_layernorm"), load_dump(_dump(tmp_path, _layer_norm)))
    assert comparison.first_difference is None and comparison.diagnoses == ()


@pytest.mark.slow
def test_attn_check_says_it_in_chinese(tmp_path: Path) -> None:
    dump = _dump(tmp_path, _rms)
    args = ("check", "qk_layernorm", "--against", str(dump), "--format", "plain")
    zh = run_cli(*args, "--lang", "zh")
    assert zh.exit_code == 1, zh.stderr
    assert "q/k LayerNorm 做成了 RMSNorm（没有减均值）" in " ".join(zh.stdout.split())
