"""What the test files share: paths, the in-process CLI, the real ``python -m attn_cli``, markers.

Two ways to run the command line:

- ``run_cli("trace", path)``: in this process, through Typer's ``CliRunner``; fast. Assert the
  exit code first, then ``result.stdout`` / ``result.stderr``.
- ``run_attn(...)`` (or ``attn_command`` + ``clean_env`` for ``Popen``): a real process, with a
  timeout and an environment that no locale, width or colour setting of the caller leaks into.
  Only for what needs the process boundary: pipes, signals, terminals, closed streams, special
  files, resource limits. Such tests carry ``@pytest.mark.subprocess``; a test without it that
  starts a process fails (see ``_processes_are_marked``), so ``-m "not subprocess"`` stays honest.

Markers (registered in pyproject.toml): ``subprocess`` and ``slow`` (over 0.3 s; every
hypothesis ``@given`` test is ``slow`` without saying so). The fast subset, ``pytest --fast``
(``make fast``), is the first case of every test function marked neither (the rule is above
``pytest_collection_modifyitems``).

Import the helpers as ``from conftest import run_cli, FIXTURES``: tests/ and each of its folders
(core, io, check, present, cli, acceptance) are on ``sys.path`` (``pythonpath`` in pyproject.toml),
as for ``reference.py``. This file stays at tests/, so its fixtures and markers apply to every
folder.
"""

from __future__ import annotations

import functools
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any, TypedDict

import pytest
import typer.testing
from typer.testing import CliRunner, Result

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FIXTURES = ROOT / "fixtures"  # the bundled examples
CORPUS_DIR = TESTS / "corpus"  # hostile and broken fixtures, one problem each
GOLDEN = TESTS / "golden"
DOCS = ROOT / "docs"

BUNDLED_PATHS = sorted(p for p in FIXTURES.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
BUNDLED = [p.stem for p in BUNDLED_PATHS]  # as `attn examples` names them
# the bundled examples with an output gate: attn decode and attn flash stop at softmax·V and
# refuse them in one line (tests/core/test_gate.py)
GATED = ["qwen3_next_gate"]
# the bundled examples of multi-head latent attention: attn rope refuses them in one line
# (tests/core/test_mla.py); flash and the backward pass: tests/core/test_mla_backward.py
LATENT = ["deepseek_mla"]
# the bundled examples of differential attention: attn decode and attn rope do not run it yet
# and refuse them in one line (tests/core/test_diff.py); flash and the backward pass:
# tests/core/test_diff_flash.py, tests/core/test_diff_backward.py
DIFFERENTIAL = ["diff_transformer"]
# the bundled examples of linear attention: no softmax (a mixer makes output from Q, K, V);
# decoding, FlashAttention and the backward pass refuse them in one line (tests/core/test_linear.py)
LINEAR = ["gated_deltanet", "linear_attention"]
# the bundled examples of OLMo's clip_qkv: the backward pass refuses them in one line (the clamp
# of V is not in its chain; tests/cli/test_round41_examples.py)
CLIPPED = ["olmo_clip_qkv"]


class Tolerance(TypedDict):
    """The keywords of ``assert_allclose(actual, expected, **TOL)``, typed for mypy."""

    rtol: float
    atol: float


PROCESS_TIMEOUT = 30.0  # seconds; generous for a loaded machine, never reached when all is well

# A golden number may differ from today's in its last bits on another CPU: AVX2, AVX-512 and ARM
# kernels of the same BLAS round a matrix product differently (1.4849 vs 1.4848999999999999).
GOLDEN_RTOL, GOLDEN_ATOL = 1e-12, 1e-15
REGENERATE = "if the change is intended: python tests/update_golden.py, then review the diff"


def assert_same_json(now: Any, golden: Any, where: str) -> None:
    """Equal structure, keys in order and strings; numbers within GOLDEN_RTOL/ATOL.

    "-inf", "inf" and "nan" are strings in attn's JSON, so they compare exactly.
    """
    if isinstance(golden, dict):
        assert isinstance(now, dict) and list(now) == list(golden), f"{where}: keys; {REGENERATE}"
        for key in golden:
            assert_same_json(now[key], golden[key], f"{where}.{key}")
    elif isinstance(golden, list):
        assert isinstance(now, list) and len(now) == len(golden), f"{where}: length; {REGENERATE}"
        for i, (a, b) in enumerate(zip(now, golden, strict=True)):
            assert_same_json(a, b, f"{where}[{i}]")
    elif isinstance(golden, float) and not isinstance(now, (str, bool)) and now is not None:
        close = math.isclose(now, golden, rel_tol=GOLDEN_RTOL, abs_tol=GOLDEN_ATOL)
        assert close, f"{where}: {now} != {golden}"
    else:
        assert type(now) is type(golden) and now == golden, f"{where}: {now!r} != {golden!r}"


runner = CliRunner()

# Typer turns the app into a click command again on every invoke: ~6 ms, nine tenths of a quick
# in-process run. The command keeps no state between runs, so it is built once per app.
if hasattr(typer.testing, "_get_command"):
    typer.testing._get_command = functools.cache(typer.testing._get_command)


def run_cli(
    *args: str, input: str | bytes | None = None, env: Mapping[str, str | None] | None = None
) -> Result:
    """``attn ARGS...`` in this process; the result holds exit_code, stdout and stderr."""
    from attn_cli.cli.app import app  # here, so that importing conftest stays cheap

    return runner.invoke(app, list(args), input=input, env=env)


@dataclass(frozen=True)
class Run:
    """What one ``attn`` run left: exit code, both streams, an escaped exception, and the CPU
    seconds it took (wall time is bounded by ``run_timed``'s timer: a hang raises)."""

    exit_code: int
    stdout: str
    stderr: str
    exception: BaseException | None
    seconds: float


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise TimeoutError("attn did not finish in time")


def run_timed(*args: str, limit: float = 10.0) -> Run:
    """``attn ARGS`` in-process, cut off by a timer signal after ``limit`` wall seconds (a hang);
    ``seconds`` is the CPU time it used, so a bound on it holds on a loaded machine too."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    start = time.process_time()
    try:
        result = run_cli(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    seconds = time.process_time() - start  # CPU: the run's cost, however busy the machine is
    escaped = result.exception if not isinstance(result.exception, SystemExit) else None
    return Run(result.exit_code, result.stdout, result.stderr, escaped, seconds)


# Variables that change what attn prints: locale (language), width, colour, terminal, CI.
_LEAKY = ("LANG", "LANGUAGE", "COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TERM", "CI")
_LEAKY_PREFIXES = ("LC_", "TTY_", "ATTN_", "TYPER_", "_TYPER", "PYTHONWARNINGS", "PYTHONSTARTUP")


def clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without locale, width and colour settings, then ``extra``.

    English, no colour, and this checkout's ``attn_cli`` first on the path; ``extra`` overrides
    (``clean_env(COLUMNS="100")``, ``clean_env(LANG="zh_CN.UTF-8")``).
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _LEAKY and not key.startswith(_LEAKY_PREFIXES)
    }
    env.update(LANG="C.UTF-8", NO_COLOR="1", PYTHONPATH=str(ROOT))
    env.update(extra)
    return env


def attn_command(*args: str) -> list[str]:
    """The argv of ``python -m attn_cli ARGS...`` with this interpreter."""
    return [sys.executable, "-m", "attn_cli", *args]


def run_attn(
    *args: str,
    stdin: int | IO[Any] | None = subprocess.DEVNULL,
    stdout: int | IO[Any] | None = subprocess.PIPE,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = PROCESS_TIMEOUT,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m attn_cli ARGS...`` in a real process; stderr is always captured as text.

    ``env`` defaults to ``clean_env()``; ``preexec_fn`` runs in the child before Python starts
    (``lambda: os.close(1)`` gives ``attn ... >&-``).
    """
    return subprocess.run(
        attn_command(*args),
        stdin=None if input is not None else stdin,
        stdout=stdout,
        stderr=subprocess.PIPE,
        input=input,
        env=clean_env() if env is None else dict(env),
        cwd=cwd,
        timeout=timeout,
        preexec_fn=preexec_fn,
        text=True,
        errors="replace",
        check=False,
    )


def ctrl_c_as_a_terminal_sends_it() -> None:
    """A ``preexec_fn``: Ctrl-C (SIGINT) and Ctrl-\\ (SIGQUIT) back to their defaults in the child.

    A shell without job control starts a background job (``pytest &`` in a script, some CI
    runners) with both ignored, the child inherits that, and Python then installs no
    KeyboardInterrupt handler: a test of what Ctrl-C does must not depend on how pytest was
    started.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def limit_memory(limit: int = 1 << 30) -> Callable[[], None]:
    """A ``preexec_fn`` that caps the child's address space (Linux only; elsewhere nothing)."""

    def apply() -> None:  # runs in the child, before it starts Python
        if sys.platform.startswith("linux"):
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


# ---------------------------------------------------------------------------------------------
# Markers kept honest


# The fast subset (`pytest --fast`, `make fast`) is chosen by a rule, not a list: of every test
# function marked neither `slow` (over 0.3 s, or a hypothesis property) nor `subprocess` (starts
# a process), its first case (the first of its parametrisations). Every module is in it from its
# first test, and every code path a test function walks is walked once; the exhaustive
# parametrisations (every fixture x every format, every attack) and the slow tests run in the
# whole suite (the README's test command, CI).


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="only the fast subset: the first case of every test marked neither slow nor "
        "subprocess",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Property tests (hypothesis ``@given``) are ``slow`` by rule: the whole suite runs them.

    The first case of each test function that is neither slow nor starts a process is marked
    ``fast``; with --fast, the others are deselected.
    """
    from hypothesis import is_hypothesis_test

    seen: set[tuple[str, str]] = set()
    deselected = []
    for item in items:
        if isinstance(item, pytest.Function) and is_hypothesis_test(item.obj):
            item.add_marker(pytest.mark.slow)
        function = (str(item.path), getattr(item, "originalname", item.name))
        quick = not any(item.get_closest_marker(m) for m in ("slow", "subprocess"))
        if quick and function not in seen:
            seen.add(function)
            item.add_marker(pytest.mark.fast)
        elif config.getoption("--fast"):
            deselected.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


def _unmarked_process(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError(
        "this test starts a process: mark it @pytest.mark.subprocess, or run the command "
        "in-process with run_cli()"
    )


@pytest.fixture(autouse=True)
def _processes_are_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that starts a process without ``@pytest.mark.subprocess``."""
    if request.node.get_closest_marker("subprocess") is not None:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", _unmarked_process)
        yield
