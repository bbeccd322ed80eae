"""``attn probe TARGET``: exit codes, JSON, the table, and hostile targets and options.

Each target is a file written here by the test; every trouble is one ``Error:`` line and exit 2
(a mutation is a finding, exit 1), never a traceback or a hang.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from conftest import run_attn, run_cli

from attn_cli.check.probe import CONVENTIONS

CORRECT = """
import math
import numpy as np

def attention(q, k, v, causal=False, mask=None):
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        T, S = s.shape[-2:]
        s = np.where(np.tril(np.ones((T, S), dtype=bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    if q.shape[1] != k.shape[1]:
        raise ValueError("no GQA here")
    top = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0) @ v
"""

# TorchCode's accepted answer, in NumPy: / d_k, and scores * mask then == 0 -> -inf
TORCHCODE = """
import numpy as np

def causal_attention(q, k, v):
    T = q.shape[-2]
    scores = q @ np.swapaxes(k, -1, -2) / q.shape[-1]
    scores = scores * np.tril(np.ones((T, k.shape[-2])))
    scores = np.where(scores == 0, -np.inf, scores)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True) @ v
"""


def write(tmp_path: Path, source: str, name: str = "student.py") -> str:
    path = tmp_path / name
    path.write_text(source, encoding="utf-8")
    return str(path)


def one_error_line(stderr: str, *fragments: str) -> None:
    lines = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_a_correct_function_exits_0_with_every_convention_in_the_json(tmp_path: Path) -> None:
    target = write(tmp_path, CORRECT) + ":attention"
    result = run_cli("probe", target, "-f", "json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert list(report) == ["target", "verdict", "conventions", "findings"]
    assert report["target"] == target and report["verdict"] == "matches"
    assert list(report["conventions"]) == list(CONVENTIONS)
    assert report["conventions"] | {"gqa": None} == {
        "scale": "1/sqrt(d)",
        "causal": "upper-left",
        "mask": "true-attends",
        "empty_row": "zeros",
        "gqa": None,
        "softmax_axis": "keys",
        "large_logits": "stable",
        "zero_scores": "kept",
        "deterministic": True,
        "batch_independent": True,
        "window": "n/a",
    }
    assert report["conventions"]["gqa"] == "refused"


def test_torchcodes_accepted_answer_differs_on_scale_and_zero_scores(tmp_path: Path) -> None:
    result = run_cli("probe", write(tmp_path, TORCHCODE) + ":causal_attention", "-f", "json")
    assert result.exit_code == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["conventions"]["scale"] == "1/d"
    assert report["conventions"]["causal"] == "upper-left"  # causal on its own, no option
    assert report["conventions"]["zero_scores"] == "masked"
    ids = [f["id"] for f in report["findings"]]
    assert ids == ["scaled_by_d_k", "zero_scores_masked"]
    assert report["findings"][0]["title"] == "scaled by d_k instead of √d_k"


def test_the_table_names_findings_with_the_graders_words_in_english_and_chinese(
    tmp_path: Path,
) -> None:
    target = write(tmp_path, TORCHCODE) + ":causal_attention"
    result = run_cli("probe", target, "-f", "plain", "--width", "120", "--explain")
    assert result.exit_code == 1, result.stderr
    assert "│ scale             │ 1/d " in result.stdout
    assert "finding: scaled by d_k instead of √d_k [scaled_by_d_k]" in result.stdout
    assert "Fix: / math.sqrt(d)." in result.stdout
    assert result.stdout.rstrip().endswith("verdict: differs (2 findings)")
    zh = run_cli("probe", target, "-f", "plain", "--lang", "zh")
    assert zh.exit_code == 1
    assert "发现：除以 d_k 而不是 √d_k [scaled_by_d_k: scaled by d_k instead of √d_k]" in zh.stdout


HOSTILE = {
    "raises": (
        "def f(q, k, v):\n    raise RuntimeError('boom\\nsecond line')\n",
        "raised RuntimeError: boom second line",
    ),
    "a list": ("def f(q, k, v):\n    return [[1.0]]\n", "returned a list, expected a NumPy array"),
    "wrong shape": (
        "def f(q, k, v):\n    return q[..., 0]\n",
        "returned shape (2, 2, 5), expected (2, 2, 5, 8)",
    ),
    "nan": (
        "import numpy as np\ndef f(q, k, v):\n    return np.full(q.shape, np.nan)\n",
        "returned nan in every cell",
    ),
    "strings": (
        "import numpy as np\ndef f(q, k, v):\n    return np.full(q.shape, 'x')\n",
        "expected real numbers",
    ),
    "exits": ("import sys\ndef f(q, k, v):\n    sys.exit(3)\n", "raised SystemExit: 3"),
    "import raises": (
        "raise ImportError('no torch here')\ndef f(q, k, v):\n    return q\n",
        "running it raised ImportError: no torch here",
    ),
    "syntax": ("def f(q, k, v)\n    return q\n", "line 1: syntax error"),
    "not callable": ("f = 3\n", "f: is a int, not callable"),
    "missing function": ("def g(q, k, v):\n    return q\n", "defines no 'f'"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_target_is_one_line_and_exit_2(tmp_path: Path, case: str) -> None:
    source, expected = HOSTILE[case]
    result = run_cli("probe", write(tmp_path, source) + ":f", "-f", "json")
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    one_error_line(result.stderr, expected)


def test_a_missing_file_and_a_non_utf8_file_are_one_line(tmp_path: Path) -> None:
    missing = run_cli("probe", str(tmp_path / "nope.py") + ":f")
    assert missing.exit_code == 2
    one_error_line(missing.stderr, "nope.py: no such file, expected a Python file")
    bad = tmp_path / "latin.py"
    bad.write_bytes(b"x = '\xe9'\ndef f(q, k, v):\n    return q\n")
    result = run_cli("probe", f"{bad}:f")
    assert result.exit_code == 2
    one_error_line(result.stderr, "latin.py", "expected a Python file that compiles")


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("student.py", "TARGET: got 'student.py'"),
        (":f", "TARGET: got ':f'"),
        ("x.py:1f", "not a Python name"),
        ("no_such_module_38:f", "no such module"),
        ("a-b:f", "not a dotted Python name"),
    ],
)
def test_a_malformed_target_is_one_line(target: str, expected: str) -> None:
    result = run_cli("probe", target)
    assert result.exit_code == 2
    one_error_line(result.stderr, expected)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e308", "2**63", "١٠", "3601", ""])
def test_a_hostile_timeout_is_one_line(tmp_path: Path, value: str) -> None:
    result = run_cli("probe", write(tmp_path, CORRECT) + ":attention", "--timeout", value)
    assert result.exit_code == 2
    one_error_line(result.stderr, "--timeout", repr(value))


@pytest.mark.parametrize("option", ["--framework", "--dtype", "--mask", "--format"])
def test_a_hostile_choice_is_one_line(tmp_path: Path, option: str) -> None:
    result = run_cli("probe", write(tmp_path, CORRECT) + ":attention", option, "jax")
    assert result.exit_code == 2
    one_error_line(result.stderr, option)


def test_framework_torch_without_torch_is_one_line(tmp_path: Path) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torch is installed here")
    result = run_cli("probe", write(tmp_path, CORRECT) + ":attention", "--framework", "torch")
    assert result.exit_code == 2
    one_error_line(result.stderr, "--framework: torch is not installed")


@pytest.mark.slow
def test_a_busy_hang_is_abandoned_and_stopped(tmp_path: Path) -> None:
    source = "def f(q, k, v):\n    while True:\n        pass\n"
    before = threading.active_count()
    start = time.perf_counter()
    result = run_cli("probe", write(tmp_path, source) + ":f", "--timeout", "0.2")
    assert result.exit_code == 2
    one_error_line(result.stderr, "did not return within 0.2 s (abandoned)", "--timeout")
    assert time.perf_counter() - start < 10  # a loaded machine: generous, a hang is forever
    for _ in range(500):  # the thread is stopped at its next instruction, not left spinning
        if threading.active_count() <= before:
            break
        time.sleep(0.01)
    assert threading.active_count() <= before


@pytest.mark.slow
def test_a_hang_while_loading_is_abandoned(tmp_path: Path) -> None:
    source = "while True:\n    pass\n"
    result = run_cli("probe", write(tmp_path, source) + ":f", "--timeout", "0.2")
    assert result.exit_code == 2
    one_error_line(result.stderr, "did not return within 0.2 s")


def test_mutating_q_is_a_finding(tmp_path: Path) -> None:
    source = CORRECT.replace("    top = ", "    q[...] = 0.0  # after its last use\n    top = ")
    result = run_cli("probe", write(tmp_path, source) + ":attention", "-f", "json")
    assert result.exit_code == 1, result.stderr
    findings = json.loads(result.stdout)["findings"]
    assert [f["id"] for f in findings] == ["mutates_inputs"]
    assert "mutat" in findings[0]["id"] and findings[0]["evidence"].startswith("q changed")


def test_what_the_function_prints_goes_to_stderr(tmp_path: Path) -> None:
    source = CORRECT.replace("    s = q @", "    print('debug', q.shape)\n    s = q @")
    result = run_cli("probe", write(tmp_path, source) + ":attention", "-f", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["verdict"] == "matches"
    assert "debug (2, 2, 5, 8)" in result.stderr
    quiet = run_cli("probe", write(tmp_path, source) + ":attention", "-f", "json", "-q")
    assert quiet.exit_code == 0 and "debug" not in quiet.stderr


def test_a_module_target_is_imported_from_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "course38"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "week3.py").write_text(CORRECT)
    monkeypatch.chdir(tmp_path)
    result = run_cli("probe", "course38.week3:attention", "-f", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["target"] == "course38.week3:attention"


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_process_with_a_hung_function_exits_2_promptly(tmp_path: Path) -> None:
    source = "import time\ndef f(q, k, v):\n    time.sleep(3600)\n"
    start = time.perf_counter()
    done = run_attn("probe", write(tmp_path, source) + ":f", "--timeout", "0.5", timeout=20)
    assert done.returncode == 2
    one_error_line(done.stderr, "did not return within 0.5 s")
    assert time.perf_counter() - start < 15


def test_a_target_with_escapes_a_directory_and_a_fifo_are_one_line(tmp_path: Path) -> None:
    escaped = run_cli("probe", "my_\x1b[31m.py:f")
    assert escaped.exit_code == 2
    one_error_line(escaped.stderr, "my_\\x1b[31m.py: no such file")
    folder = run_cli("probe", f"{tmp_path}:f")
    assert folder.exit_code == 2
    one_error_line(folder.stderr, "is a directory, expected a Python file")
    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)
    piped = run_cli("probe", f"{fifo}:f")
    assert piped.exit_code == 2
    one_error_line(piped.stderr, "is a named pipe (FIFO), not a regular file")


def test_an_additive_mask_read_as_bool_is_another_mask(tmp_path: Path) -> None:
    """CORRECT reads its mask as bool: 0 (attend) is False and -inf True, so an additive mask
    hides exactly the keys it lets through: neither applied nor ignored."""
    result = run_cli(
        "probe", write(tmp_path, CORRECT) + ":attention", "--mask", "additive", "-f", "json"
    )
    assert result.exit_code == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["conventions"]["mask"] == "other"
    assert report["conventions"]["empty_row"] == "n/a"
    assert [f["id"] for f in report["findings"]] == ["mask_other"]


def test_a_file_imports_its_neighbours(tmp_path: Path) -> None:
    """Its folder is first on sys.path while it loads, as pytest's prepend mode has it."""
    (tmp_path / "helpers38.py").write_text(CORRECT)
    target = write(tmp_path, "from helpers38 import attention\n", name="uses_helpers.py")
    result = run_cli("probe", target + ":attention", "-f", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["verdict"] == "matches"
