"""NumPy files: ``{file: x.npy}`` / ``{file: a.npz, key: W_Q}`` references, whole-fixture
``.npz``, and ``--format npz`` traces. Never unpickled, never outside the fixture's folder."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import Tolerance, run_cli
from reference import random_fixture, reference

from attn_cli.core.pipeline import run
from attn_cli.errors import InputError
from attn_cli.io.fixture import load_fixture, validate

REFERENCE: Tolerance = {"rtol": 1e-12, "atol": 1e-12}


def fixture_with_arrays(tmp_path: Path) -> dict[str, Any]:
    """A projection fixture as lists, with its arrays also saved beside it."""
    fx = random_fixture(5, heads=2, d_model=6, W_O=True, causal=True)
    for key in ("X", "W_Q"):
        np.save(tmp_path / f"{key}.npy", np.array(fx[key]))
    np.savez(tmp_path / "weights.npz", W_K=np.array(fx["W_K"]), V_weights=np.array(fx["W_V"]))
    return fx


def write_yaml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.slow
def test_references_give_the_same_trace_as_lists(tmp_path: Path) -> None:
    fx = fixture_with_arrays(tmp_path)
    lists = run(validate(fx, "lists.json"))
    refs = {
        **fx,
        "X": {"file": "X.npy"},
        "W_Q": {"file": "W_Q.npy"},
        "W_K": {"file": "weights.npz"},
        "W_V": {"file": "weights.npz", "key": "V_weights"},
    }
    path = tmp_path / "refs.json"
    path.write_text(json.dumps(refs))
    trace = run(load_fixture(path))
    expected = reference(fx)
    for name in expected:
        np.testing.assert_allclose(trace[name].data, expected[name], err_msg=name, **REFERENCE)
        assert np.array_equal(trace[name].data, lists[name].data), name


def test_yaml_references_relative_to_the_fixture_not_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub = tmp_path / "data"
    sub.mkdir()
    fx = fixture_with_arrays(sub)
    monkeypatch.chdir(tmp_path)
    write_yaml(
        sub / "fx.yaml",
        f"X: {{file: X.npy}}\nW_Q: {{file: W_Q.npy}}\n"
        f"W_K: {json.dumps(fx['W_K'])}\nW_V: {json.dumps(fx['W_V'])}\n",
    )
    inputs = load_fixture(Path("data") / "fx.yaml")
    assert inputs.X is not None
    np.testing.assert_array_equal(inputs.X[0], np.array(fx["X"]))


def test_referenced_arrays_get_the_same_validation_as_lists(tmp_path: Path) -> None:
    np.save(tmp_path / "nan.npy", np.array([[1.0, np.nan], [0.0, 1.0]]))
    np.save(tmp_path / "W.npy", np.eye(2))
    path = write_yaml(
        tmp_path / "fx.yaml",
        "X: {file: nan.npy}\nW_Q: {file: W.npy}\nW_K: {file: W.npy}\nW_V: {file: W.npy}\n",
    )
    with pytest.raises(InputError, match=r"X\[0\]\[1\]: is nan"):
        load_fixture(path)
    np.save(tmp_path / "cube.npy", np.ones((2, 2, 2, 2)))
    path.write_text(
        "X: {file: cube.npy}\nW_Q: {file: W.npy}\nW_K: {file: W.npy}\nW_V: {file: W.npy}\n"
    )
    with pytest.raises(InputError, match="X: has 4 axes"):
        load_fixture(path)


def escape(tmp_path: Path, ref: str) -> str:
    inside = tmp_path / "fixture"
    inside.mkdir(exist_ok=True)
    np.save(tmp_path / "secret.npy", np.eye(2))
    path = write_yaml(
        inside / "fx.yaml", f"X: {ref}\nW_Q: [[1], [1]]\nW_K: [[1], [1]]\nW_V: [[1], [1]]\n"
    )
    with pytest.raises(InputError) as info:
        load_fixture(path)
    return str(info.value)


def test_a_path_leaving_the_fixture_folder_is_refused(tmp_path: Path) -> None:
    message = escape(tmp_path, "{file: ../secret.npy}")
    assert "X.file: '../secret.npy' leads outside the fixture's folder" in message


def test_an_absolute_path_is_refused(tmp_path: Path) -> None:
    message = escape(tmp_path, f"{{file: {json.dumps(str(tmp_path / 'secret.npy'))}}}")
    assert "is an absolute path, expected a path relative to the fixture's folder" in message


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")
def test_a_symlink_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "fixture").mkdir()
    np.save(tmp_path / "secret.npy", np.eye(2))
    (tmp_path / "fixture" / "link.npy").symlink_to(tmp_path / "secret.npy")
    message = escape(tmp_path, "{file: link.npy}")
    assert "'link.npy' leads outside the fixture's folder" in message


def test_a_pickled_object_array_is_refused_unread(tmp_path: Path) -> None:
    np.save(tmp_path / "objects.npy", np.array([[1.0, None]], dtype=object), allow_pickle=True)
    path = write_yaml(
        tmp_path / "fx.yaml",
        "X: {file: objects.npy}\nW_Q: [[1], [1]]\nW_K: [[1], [1]]\nW_V: [[1], [1]]\n",
    )
    with pytest.raises(InputError, match="holds Python objects"):
        load_fixture(path)


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("{file: missing.npy}", "X.file 'missing.npy': no such file"),
        ("{file: W.npy, key: W}", "X.key: given for a .npy file"),
        ("{file: a.npz, key: W_Q}", "X.key: a.npz has no array 'W_Q' (did you mean 'W_q'?)"),
        ("{file: a.npz}", "X.key: a.npz has no array 'X'"),
        ("{file: W.txt}", "X.file: 'W.txt' is neither .npy nor .npz"),
        ("{file: W.npy, kye: 1}", "X.kye: unknown key in a file reference (did you mean 'key'?)"),
        ("{file: 3}", "X.file: got 3, expected a file name"),
        ("{file: not_npy.npy}", "not a .npy array"),
        ("{file: not_npz.npz}", "not a readable .npz archive"),
    ],
)
def test_bad_references_are_one_line_errors(tmp_path: Path, ref: str, message: str) -> None:
    np.save(tmp_path / "W.npy", np.eye(2))
    np.savez(tmp_path / "a.npz", W_q=np.eye(2))
    (tmp_path / "W.txt").write_text("1 2")
    (tmp_path / "not_npy.npy").write_bytes(b"just text")
    (tmp_path / "not_npz.npz").write_bytes(b"just text")
    path = write_yaml(
        tmp_path / "fx.yaml", f"X: {ref}\nW_Q: [[1], [1]]\nW_K: [[1], [1]]\nW_V: [[1], [1]]\n"
    )
    result = run_cli("trace", str(path))
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1


def test_a_referenced_array_too_big_is_refused_before_reading(tmp_path: Path) -> None:
    np.save(tmp_path / "big.npy", np.zeros((100, 100)))
    path = write_yaml(
        tmp_path / "fx.yaml",
        "X: {file: big.npy}\nW_Q: [[1], [1]]\nW_K: [[1], [1]]\nW_V: [[1], [1]]\n",
    )
    with pytest.raises(InputError, match="holds 10,000 numbers, too many"):
        load_fixture(path, max_elements=5000)


def test_a_whole_fixture_as_npz(tmp_path: Path) -> None:
    fx = random_fixture(9, batch=2, heads=2, d_model=4, lengths=[3, 1])
    path = tmp_path / "fx.npz"
    extra = {"name": "from numpy", "tokens": ["a", "b", "c"], "causal": True, "scale": 0.5}
    arrays: dict[str, Any] = {k: np.array(v) for k, v in {**fx, **extra}.items()}
    np.savez(path, **arrays)
    inputs = load_fixture(path)
    assert (inputs.name, inputs.tokens, inputs.causal) == (
        "from numpy",
        ("a", "b", "c"),
        "upper-left",
    )
    assert inputs.scale == 0.5 and inputs.heads == 2 and inputs.lengths is not None
    assert inputs.lengths.tolist() == [3, 1]
    expected = reference({**fx, "causal": True, "scale": 0.5})
    trace = run(inputs)
    for name in expected:
        np.testing.assert_allclose(trace[name].data, expected[name], err_msg=name, **REFERENCE)


def test_a_whole_fixture_npz_with_an_unknown_key_suggests_one(tmp_path: Path) -> None:
    path = tmp_path / "fx.npz"
    np.savez(path, X=np.eye(2), W_Q=np.eye(2), W_K=np.eye(2), W_V=np.eye(2), casual=np.array(1))
    result = run_cli("trace", str(path))
    assert result.exit_code == 2
    assert "casual: unknown key (did you mean 'causal'?)" in result.stderr


def test_a_whole_fixture_npz_holding_a_pickle_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fx.npz"
    np.savez(path, X=np.array([{"a": 1}], dtype=object), W_Q=np.eye(2))
    with pytest.raises(InputError, match="holds Python objects"):
        load_fixture(path)
    path.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(InputError, match=r"not a readable \.npz archive"):
        load_fixture(path)


def test_npz_trace_round_trips(tmp_path: Path) -> None:
    out = tmp_path / "trace.npz"
    result = run_cli("trace", "--format", "npz", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert f"Wrote {out}" in result.stderr
    as_json = json.loads(run_cli("trace", "--format", "json").stdout)["stages"]
    with np.load(out, allow_pickle=False) as saved:
        assert list(saved.files) == list(as_json)  # arrays named after stages, in order
        for name, stage in as_json.items():
            assert saved[name].dtype == np.float64
            assert saved[name].tolist() == stage["data"]  # the same float64 numbers exactly
    with zipfile.ZipFile(out) as archive:
        assert all(info.compress_type == zipfile.ZIP_STORED for info in archive.infolist())


def test_npz_trace_of_some_stages_in_float32(tmp_path: Path) -> None:
    out = tmp_path / "trace.npz"
    args = ["--stage", "softmax", "--dtype", "float32", "--format", "npz", "-o", str(out)]
    result = run_cli("trace", *args)
    assert result.exit_code == 0, result.output
    with np.load(out) as saved:
        assert saved.files == ["softmax"] and saved["softmax"].dtype == np.float32


def test_npz_needs_an_output_file() -> None:
    result = run_cli("trace", "--format", "npz")
    assert result.exit_code == 2
    assert "--format npz: needs a file, expected -o FILE.npz" in result.stderr
