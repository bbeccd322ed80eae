"""A pytest plugin: check your own attention function against attn's trace, in your tests.

    def test_my_attention(attn_golden):
        attn_golden.check(my_attention, "lecture.yaml")

``check`` calls ``my_attention`` with the fixture's inputs as NumPy arrays, chosen by the names
of its parameters (``X, W_Q, W_K, W_V, heads``, ...), and compares what it returns, a dict of
stage arrays (``{"scores": s, "softmax": w, "output": o}``, aliases as ``attn check --against``
takes them) or the output alone, with attn's trace. On a difference it fails with the first
stage that differs, its worst cells and the grader's diagnosis.

Or learn, by calling it, which conventions a function follows (``attn probe``)::

    def test_my_attention_is_sdpa(attn_probe):
        attn_probe.assert_matches(my_attention)       # fails listing each finding
        assert attn_probe(my_attention).conventions["gqa"] == "repeat-interleave"

attn's trace of the fixture is also kept as a golden file (``attn_golden/lecture.json`` beside
the test file, or under the ``attn_golden_dir`` ini setting), so that a change in attn, or in
the fixture, shows as a failure to review. Goldens are written only on request:
``pytest --attn-update``.

Registered through the ``pytest11`` entry point, so it loads wherever attn-cli is installed:
importing it costs nothing but pytest; attn itself is imported when a test asks for the fixture.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from attn_cli.check.compare import Comparison, Tolerance
    from attn_cli.check.probe import ProbeReport
    from attn_cli.core.pipeline import Trace

UPDATE_OPTION = "--attn-update"
GOLDEN_DIR_INI = "attn_golden_dir"
DEFAULT_FOLDER = "attn_golden"
FINAL_STAGES = ("projected", "concat", "output")  # what "the output" is, last one first


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attn", "attn: attention traces as goldens")
    group.addoption(
        UPDATE_OPTION,
        action="store_true",
        default=False,
        help="(Re)write the golden traces that attn_golden.check compares with.",
    )
    parser.addini(
        GOLDEN_DIR_INI,
        "Folder of attn_golden's golden traces, relative to the rootdir "
        f"(default: {DEFAULT_FOLDER}/ beside each test file).",
        default="",
    )


@pytest.fixture
def attn_golden(request: pytest.FixtureRequest) -> AttnGolden:
    """Check an attention function against attn's trace of a fixture: ``.check(fn, FIXTURE)``."""
    base = Path(request.path).parent
    setting = str(request.config.getini(GOLDEN_DIR_INI) or "")
    golden_dir = request.config.rootpath / setting if setting else base / DEFAULT_FOLDER
    return AttnGolden(base, golden_dir, update=bool(request.config.getoption(UPDATE_OPTION)))


@pytest.fixture
def attn_probe() -> AttnProbe:
    """Probe an attention function's conventions: ``attn_probe(fn)`` gives the report."""
    return AttnProbe()


class AttnProbe:
    """What the ``attn_probe`` fixture gives a test: the report, or an assertion that it matches.

    Settings are ``attn_cli.probe``'s: ``framework`` ("numpy", "torch"), ``dtype``, ``mask``
    ("bool", "additive"), ``timeout`` (seconds per call; a call past it is abandoned).
    """

    def __call__(self, function: Callable[..., Any], **settings: Any) -> ProbeReport:
        """The probe's report of ``function``; a test failure when it cannot be asked."""
        __tracebackhide__ = True
        from attn_cli.check.probe import probe
        from attn_cli.errors import AttnError

        try:
            return probe(function, **settings)
        except AttnError as e:
            pytest.fail(f"attn_probe: {e}", pytrace=False)

    def assert_matches(self, function: Callable[..., Any], **settings: Any) -> ProbeReport:
        """Fail, naming each finding and its evidence, unless the verdict is "matches"."""
        __tracebackhide__ = True
        report = self(function, **settings)
        if report.verdict != "matches":
            lines = [f"- {f.id}: {f.title} ({f.evidence})" for f in report.findings]
            pytest.fail(
                f"attn_probe: {report.target} differs from PyTorch SDPA:\n" + "\n".join(lines),
                pytrace=False,
            )
        return report


class AttnGolden:
    """What the ``attn_golden`` fixture gives a test: ``check`` and where goldens live."""

    def __init__(self, base: Path, golden_dir: Path, *, update: bool = False) -> None:
        self.base = base  # fixture paths are relative to the test file's folder
        self.golden_dir = golden_dir
        self.update = update

    def check(
        self,
        function: Callable[..., Any],
        fixture: str | os.PathLike[str],
        *,
        golden: bool | str | os.PathLike[str] = True,
        rtol: float | None = None,
        atol: float | None = None,
        stages: tuple[str, ...] | None = None,
        worst: int = 5,
    ) -> Comparison:
        """Call ``function`` on the fixture's inputs and compare what it returns with attn's.

        ``golden``: True keeps attn's trace at the default place, a path puts it there, False
        keeps none. Tolerances default to the grader's (rtol 1e-4, atol 1e-5). Returns the
        comparison; raises AssertionError naming the first stage that differs.
        """
        __tracebackhide__ = True
        from attn_cli.api import trace_file
        from attn_cli.check.compare import GRADER_TOLERANCE, Tolerance
        from attn_cli.errors import AttnError

        where = self._fixture(fixture)
        try:
            trace = trace_file(where)
        except AttnError as e:
            pytest.fail(f"attn_golden: {e}", pytrace=False)
        if golden is not False:
            self._golden(trace, where, None if golden is True else Path(golden))
        tolerance = Tolerance(
            GRADER_TOLERANCE.rtol if rtol is None else rtol,
            GRADER_TOLERANCE.atol if atol is None else atol,
        )
        return compare_function(function, trace, tolerance, stages, worst)

    def golden_path(self, fixture: str | os.PathLike[str]) -> Path:
        """Where the golden of ``fixture`` lives: its path under the test's folder, as .json."""
        where = self._fixture(fixture)
        if not Path(where).suffix and not Path(where).exists():
            return self.golden_dir / f"{where}.json"  # a bundled example, by name
        relative = Path(os.path.relpath(os.path.abspath(where), self.base))
        if relative.parts[:1] == ("..",):
            relative = Path(relative.name)  # outside the test's folder: by its name
        return self.golden_dir / relative.with_suffix(".json")

    def _fixture(self, fixture: str | os.PathLike[str]) -> str:
        """A path relative to the test file's folder if it is there; else as given."""
        near = self.base / fixture
        return str(near) if near.exists() else os.fspath(fixture)

    def _golden(self, trace: Trace, where: str, path: Path | None) -> None:
        """Write the golden (--attn-update), or check that attn's trace still matches it."""
        __tracebackhide__ = True
        from attn_cli.check.compare import check_golden, write_golden

        path = path if path is not None else self.golden_path(where)
        if self.update:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_golden(trace, path)
            return
        if not path.is_file():
            pytest.fail(
                f"attn_golden: no golden trace {path} for {where}: write it with "
                f"pytest {UPDATE_OPTION}, then review and commit it",
                pytrace=False,
            )
        drift = check_golden(trace, path)
        if not drift.same:
            first = drift.first_difference
            assert first is not None
            pytest.fail(
                f"attn_golden: attn's trace of {where} no longer matches its golden {path} "
                f"(first: {first.name}): the fixture or attn changed; review it, then run "
                f"pytest {UPDATE_OPTION}",
                pytrace=False,
            )


def compare_function(
    function: Callable[..., Any],
    trace: Trace,
    tolerance: Tolerance,
    stages: tuple[str, ...] | None = None,
    worst: int = 5,
) -> Comparison:
    """Grade what ``function`` returns for the trace's inputs; AssertionError if it differs."""
    __tracebackhide__ = True
    from attn_cli.check.dump import Dump
    from attn_cli.check.grade import grade

    returned = function(**arguments_for(function, trace))
    arrays, aliases, ignored = stage_arrays(returned, trace)
    name = getattr(function, "__qualname__", None) or repr(function)
    comparison = grade(trace, Dump(f"{name}()", arrays, aliases, ignored), tolerance, stages, worst)
    if not comparison.same:
        raise AssertionError(failure_text(comparison, worst))
    return comparison


def arguments_for(function: Callable[..., Any], trace: Trace) -> dict[str, Any]:
    """The fixture's inputs that ``function`` names (all of them for ``**kwargs``)."""
    available = fixture_arguments(trace)
    params = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return {k: v for k, v in available.items() if v is not None}
    out: dict[str, Any] = {}
    for p in params:
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY):
            continue
        if p.name in available and (available[p.name] is not None or p.default is p.empty):
            out[p.name] = available[p.name]
        elif p.default is p.empty:
            names = ", ".join(k for k, v in available.items() if v is not None)
            raise TypeError(
                f"attn_golden: {getattr(function, '__name__', function)}() needs {p.name!r}, "
                f"which the fixture does not give; it gives: {names}"
            )
    return out


def fixture_arguments(trace: Trace) -> dict[str, Any]:
    """Inputs by the names a function may give its parameters, in the fixture's layout."""
    inp = trace.inputs

    def unbatched(arr: Any) -> Any:
        return arr if arr is None or inp.has_batch else arr[0]  # the fixture had no batch axis

    return {
        "X": unbatched(inp.X),
        "X_kv": unbatched(inp.X_kv),
        "W_Q": inp.W_Q,
        "W_K": inp.W_K,
        "W_V": inp.W_V,
        "W_O": inp.W_O,
        "b_Q": inp.b_Q,
        "b_K": inp.b_K,
        "b_V": inp.b_V,
        "b_O": inp.b_O,
        "Q": unbatched(inp.Q),
        "K": unbatched(inp.K),
        "V": unbatched(inp.V),
        "heads": inp.heads,
        "kv_heads": inp.kv_heads,
        "d_k": inp.d_k,
        "scale": trace.scale,
        "causal": inp.causal is not None,
        "mask": inp.mask,
        "bias": inp.bias,
        "tokens": inp.tokens,
        "inputs": inp,
    }


def stage_arrays(
    returned: Any, trace: Trace
) -> tuple[dict[str, Any], dict[str, str], tuple[str, ...]]:
    """(stage -> float64 array, aliases used, names ignored) from what the function returned.

    A mapping names its stages; an array alone is the output (``projected`` with W_O, else
    ``concat`` with several heads, else ``output``); a pair is (output, softmax weights).
    """
    import numpy as np

    from attn_cli.check.dump import stage_for

    final = next(s for s in FINAL_STAGES if s in trace or s == "output")
    if isinstance(returned, Mapping):
        named = {str(k): v for k, v in returned.items()}
    elif isinstance(returned, tuple) and len(returned) == 2:
        named = {final: returned[0], "softmax": returned[1]}
    else:
        named = {final: returned}
    arrays: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    ignored: list[str] = []
    for key, value in named.items():
        stage = stage_for(key)
        if stage is None or stage in arrays:
            ignored.append(key)
            continue
        if key != stage:
            aliases[key] = stage
        arrays[stage] = np.asarray(_plain(value), dtype=np.float64)
    return arrays, aliases, tuple(ignored)


def _plain(value: Any) -> Any:
    """A torch tensor (detached, on the CPU) or anything NumPy reads."""
    for step in ("detach", "cpu", "numpy"):
        if hasattr(value, step) and not hasattr(value, "__array_interface__"):
            value = getattr(value, step)()
    return value


def failure_text(c: Comparison, worst: int) -> str:
    """The assertion message: first stage that differs, its worst cells, the diagnosis."""
    from attn_cli.present.report import failure_details, failure_message

    first = c.first_difference
    assert first is not None
    later = [s.name for s in c.differing if s is not first]
    lines = [f"attn_golden: {c.against} differs from attn's trace of {c.trace.inputs.source}"]
    lines.append(failure_message(c, first, first))
    lines += failure_details(c, first, worst)[1:]
    if later:
        lines.append(f"later stages that differ too: {', '.join(later)}")
    return "\n".join(lines)
