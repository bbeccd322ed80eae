"""The grader on differential attention: each mistake planted in a student's own NumPy code (one
head at a time, written from the paper's formula, separate from attn's pipeline and grader),
dumped as a user would (.npz or JSON) and diagnosed by name; a correct student gets no diagnosis.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import yaml
from conftest import FIXTURES, run_cli
from reference import random_fixture

from attn_cli.api import trace_file
from attn_cli.check.compare import Comparison
from attn_cli.check.dump import load_dump
from attn_cli.check.grade import grade
from attn_cli.check.mistake import ZH, every_mistake

Array = npt.NDArray[np.float64]


def student(fx: dict[str, Any], mistake: str | None = None) -> dict[str, Array]:
    """Differential attention of one batch item, causal or not, every stage by name."""
    X, H = np.asarray(fx["X"], float), fx["heads"]
    d = fx["diff"]
    q, k, v = (
        (X @ np.asarray(fx[f"W_{n}"], float)).reshape(len(X), H, -1).transpose(1, 0, 2)
        for n in "QKV"
    )
    T, half = len(X), q.shape[-1] // 2
    depth = d.get("depth")
    if depth is not None:
        layer = depth - 1 if mistake == "init_from_one" else depth
        init = 0.8 - 0.6 * math.exp(-0.3 * layer)
    else:
        init = d["lambda_init"]
    l1 = float(np.dot(d["lambda_q1"], d["lambda_k1"]))
    l2 = float(np.dot(d["lambda_q2"], d["lambda_k2"]))
    right = math.exp(l1) - math.exp(l2) + init  # the paper's λ
    wrong = {
        "lambda_raw": l1 - l2 + init,
        "no_init": math.exp(l1) - math.exp(l2),
        "lambda_is_init": init,
    }
    lam = wrong.get(mistake or "", right)
    st: dict[str, Array] = {"Q": q, "K": k, "V": v}
    maps = []
    for part in (slice(0, half), slice(half, None)):
        logits = q[..., part] @ k[..., part].transpose(0, 2, 1) / math.sqrt(half)  # (H, T, T)
        if fx.get("causal"):
            logits = np.where(np.tril(np.ones((T, T), bool)), logits, -np.inf)
        e = np.exp(logits - logits.max(-1, keepdims=True))
        maps.append(e / e.sum(-1, keepdims=True))
    st["softmax"], st["softmax_2"] = maps
    st["lambda"] = np.full(H, lam)
    st["diff"] = maps[0] - lam * maps[1]
    out = st["diff_output"] = st["diff"] @ v
    if mistake != "no_norm":
        w = np.asarray(d.get("norm", np.ones(out.shape[-1])), float)
        out = st["diff_norm"] = out / np.sqrt((out * out).mean(-1, keepdims=True) + 1e-5) * w
    st["diff_scaled"] = out if mistake == "no_scale" else out * (1 - init)
    st["concat"] = st["diff_scaled"].transpose(1, 0, 2).reshape(T, -1)
    st["projected"] = st["concat"] @ np.asarray(fx["W_O"], float)
    return st


def graded(
    tmp_path: Path, fixture: str | dict[str, Any], dump: dict[str, Any], suffix: str = ".npz"
) -> Comparison:
    if isinstance(fixture, dict):
        (tmp_path / "fixture.json").write_text(json.dumps(fixture))
        fixture = str(tmp_path / "fixture.json")
    path = tmp_path / f"dump{suffix}"
    if suffix == ".npz":
        np.savez(path, **dump)
    else:
        path.write_text(json.dumps({k: np.asarray(x).tolist() for k, x in dump.items()}))
    return grade(trace_file(fixture), load_dump(path))


def bundled() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((FIXTURES / "diff_transformer.yaml").read_text())
    return loaded


def random_diff(seed: int, diff: Any = True) -> dict[str, Any]:
    return random_fixture(seed, seq=4, heads=2, d_k=4, causal=True, W_O=True, diff=diff)


def pick(stages: dict[str, Array], *wanted: str) -> dict[str, Any]:
    return {n: stages[n] for n in wanted}


def test_the_correct_student_agrees_with_attn(tmp_path: Path) -> None:
    stages = student(bundled())
    comparison = graded(tmp_path, "diff_transformer", stages)
    assert comparison.first_difference is None and not comparison.diagnoses


# (fixture, planted mistake, stages dumped, diagnosis, first differing stage)
CASES: list[tuple[str, Any, str | None, tuple[str, ...], str, str]] = [
    (
        "bundled",
        bundled,
        "lambda_raw",
        ("lambda", "diff", "projected"),
        "diff_lambda_not_reparameterised",
        "lambda",
    ),
    (
        "bundled",
        bundled,
        "no_init",
        ("softmax", "softmax_2", "diff", "diff_scaled"),
        "diff_lambda_not_reparameterised",
        "diff",
    ),
    (
        "bundled",
        bundled,
        "lambda_is_init",
        ("projected",),
        "diff_lambda_not_reparameterised",
        "projected",
    ),
    (
        "bundled",
        bundled,
        "init_from_one",
        ("lambda", "diff_scaled"),
        "diff_lambda_init_from_one",
        "lambda",
    ),
    (
        "bundled",
        bundled,
        "no_norm",
        ("diff_output", "diff_scaled", "projected"),
        "diff_norm_missing",
        "diff_scaled",
    ),
    (
        "bundled",
        bundled,
        "no_scale",
        ("diff_norm", "diff_scaled"),
        "diff_scale_missing",
        "diff_scaled",
    ),
    (
        "random",
        lambda: random_diff(3),
        "no_init",
        ("diff",),
        "diff_lambda_not_reparameterised",
        "diff",
    ),
    (
        "random",
        lambda: random_diff(4),
        "no_scale",
        ("projected",),
        "diff_scale_missing",
        "projected",
    ),
    (
        "random",
        lambda: random_diff(5),
        "init_from_one",
        ("concat",),
        "diff_lambda_init_from_one",
        "concat",
    ),
]


@pytest.mark.parametrize(
    ("kind", "make", "mistake", "dumped", "diagnosis", "first"),
    CASES,
    ids=[f"{c[2]}-{c[0]}-{c[5]}" for c in CASES],
)
@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_a_planted_mistake_is_diagnosed_by_name(
    tmp_path: Path,
    kind: str,
    make: Any,
    mistake: str,
    dumped: tuple[str, ...],
    diagnosis: str,
    first: str,
    suffix: str,
) -> None:
    fx = make()
    dump = pick(student(fx, mistake), *dumped)
    comparison = graded(tmp_path, "diff_transformer" if kind == "bundled" else fx, dump, suffix)
    assert comparison.first_difference is not None
    assert comparison.first_difference.name == first
    assert [found.name for found in comparison.diagnoses] == [diagnosis]


def test_the_cli_names_lambda_not_reparameterised_in_both_languages(tmp_path: Path) -> None:
    np.savez(tmp_path / "dump.npz", **pick(student(bundled(), "lambda_raw"), "lambda", "diff"))
    en = run_cli(
        "check", "diff_transformer", "--against", str(tmp_path / "dump.npz"), "--format", "plain"
    )
    assert en.exit_code == 1
    assert "diagnosis: differential λ not re-parameterised" in en.stdout
    assert "without the exponentials" in en.stdout
    zh = run_cli(
        "check",
        "diff_transformer",
        "--against",
        str(tmp_path / "dump.npz"),
        "--format",
        "plain",
        "--lang",
        "zh",
    )
    assert zh.exit_code == 1 and "差分注意力的 λ 没有重新参数化" in zh.stdout


def test_every_diff_mistake_has_chinese() -> None:
    ours = [m for m in every_mistake() if m.name.startswith("diff_")]
    assert len(ours) == 4 and all(m.name in ZH for m in ours)
