"""``attn check``: a fixture's trace against a golden file, its ``expected`` section, or a dump."""

import os
import stat
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from attn_cli.cli.options import (
    CheckFormat,
    ColorOption,
    LangOption,
    MaxElementsOption,
    QuietOption,
    WidthOption,
    plain_wanted,
)
from attn_cli.cli.output import console, emit, plain_text
from attn_cli.core.limits import DEFAULT_MAX_ELEMENTS
from attn_cli.errors import AttnError, UsageError, printable

if TYPE_CHECKING:
    from attn_cli.check.compare import Outcome, Tolerance
    from attn_cli.cli.options import Lang

STDIN = "-"

FixturesArgument = Annotated[
    list[str],
    typer.Argument(
        help="Fixture files, bundled example names, or '-' for standard input (several need "
        "--golden-dir).",
        show_default=False,
        metavar="FIXTURE...",
    ),
]
GoldenOption = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option("--golden", "-g", help="Compare with this golden JSON trace.", metavar="FILE"),
]
GoldenDirOption = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        help="A golden per fixture, at its path under --root with .json: week1/cat.yaml -> "
        "DIR/week1/cat.json; a bundled example NAME -> DIR/NAME.json.",
        metavar="DIR",
    ),
]
RootOption = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        help="With --golden-dir: the folder the fixtures' paths are taken relative to "
        "(default: the current folder).",
        metavar="DIR",
        show_default=False,
    ),
]
AgainstOption = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        help="Grade your own implementation: a .json (stage -> nested list, or a JSON "
        "trace) or .npz (arrays named after stages) that your code wrote.",
        metavar="FILE",
    ),
]
UpdateOption = Annotated[
    bool,
    typer.Option(
        "--update", help="(Re)write the golden file(s) from the current trace, atomically."
    ),
]
RtolOption = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        min=0,
        metavar="TOL",
        show_default=False,
        help="Relative tolerance (default 1e-9; 1e-4 with --against).",
    ),
]
AtolOption = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        min=0,
        metavar="TOL",
        show_default=False,
        help="Absolute tolerance (default 1e-12; 1e-5 with --against).",
    ),
]
CheckStageOption = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--stage", "-s", metavar="STAGE", help="Compare only this stage; repeat for more."
    ),
]
WorstOption = Annotated[
    int,
    typer.Option(min=1, metavar="N", help="Worst cells listed for the first stage that differs."),
]
CheckFormatOption = Annotated[
    CheckFormat,
    typer.Option(
        "--format",
        "-f",
        help="table (coloured on a terminal), plain, json, junit (JUnit XML for CI test "
        "reports), github (GitHub Actions annotations).",
    ),
]


CheckBackwardOption = Annotated[
    bool,
    typer.Option(
        "--backward",
        help="Trace the backward pass too, so goldens, expected sections and --against dumps "
        "can hold gradients (d_Q, dQ, q.grad, ...).",
    ),
]


def check(
    fixtures: FixturesArgument,
    golden: GoldenOption = None,
    golden_dir: GoldenDirOption = None,
    root: RootOption = None,
    against: AgainstOption = None,
    update: UpdateOption = False,
    rtol: RtolOption = None,
    atol: AtolOption = None,
    stage: CheckStageOption = None,
    worst: WorstOption = 5,
    fmt: CheckFormatOption = CheckFormat.table,
    width: WidthOption = None,
    color: ColorOption = None,
    max_elements: MaxElementsOption = DEFAULT_MAX_ELEMENTS,
    backward: CheckBackwardOption = False,
    lang: LangOption = None,
    quiet: QuietOption = False,
) -> None:
    """Compare a fixture's trace with a golden file, its `expected` section, or your own code.

    A cell passes when |actual - expected| <= atol + rtol*|expected| (nan equals only nan).

    Exit code as diff: 0 same, 1 different, 2 trouble.

    Examples:

      attn check my.yaml -g golden/my.json --update  # write the golden

      attn check my.yaml -g golden/my.json           # compare with it

      attn check week*/*.yaml --golden-dir golden/   # golden/week1/x.json, ...

      attn check my.yaml                             # its own `expected` section

      attn check the_cat_sat --against dump.npz      # grade your implementation

      attn check *.yaml --golden-dir g/ -f junit     # JUnit XML for CI
    """
    from attn_cli.api import check_stage_names
    from attn_cli.check.compare import Outcome
    from attn_cli.check.compare import exit_code as code_of

    stages = check_stage_names(stage)
    goldens = _check_plan(fixtures, golden, golden_dir, root, against, update, stages)
    tolerance = _tolerance(against, rtol, atol)
    for_ci = fmt in (CheckFormat.junit, CheckFormat.github)  # a report even when one fails
    outcomes: list[Outcome] = []
    run = _Run(golden_dir, against, update, tolerance, stages, worst, max_elements, backward)
    for fixture, golden_file in zip(fixtures, goldens, strict=True):
        reraise = len(fixtures) == 1 and not for_ci
        outcome = _check_or_report(fixture, golden_file, run, reraise=reraise)
        outcomes.append(replace(outcome, fixture=_shown_name(fixture)))
    _report(outcomes, fmt, width, color, worst, lang)
    raise typer.Exit(code_of(outcomes))


def _tolerance(
    against: Optional[Path],  # noqa: UP045
    rtol: Optional[float],  # noqa: UP045
    atol: Optional[float],  # noqa: UP045
) -> "Tolerance":
    """--rtol and --atol over the default: the grader's with --against, else the goldens'."""
    from attn_cli.check.compare import GOLDEN_TOLERANCE, GRADER_TOLERANCE, Tolerance

    default = GRADER_TOLERANCE if against is not None else GOLDEN_TOLERANCE
    return Tolerance(default.rtol if rtol is None else rtol, default.atol if atol is None else atol)


@dataclass(frozen=True)
class _Run:
    """What every fixture of one ``attn check`` is checked with."""

    golden_dir: Optional[Path]  # noqa: UP045
    against: Optional[Path]  # noqa: UP045
    update: bool
    tolerance: "Tolerance"
    stages: Optional[tuple[str, ...]]  # noqa: UP045
    worst: int
    max_elements: int
    backward: bool


def _check_or_report(
    fixture: str,
    golden: Optional[Path],  # noqa: UP045
    run: _Run,
    *,
    reraise: bool,
) -> "Outcome":
    """One fixture checked; unless ``reraise``, its error is an `Error:` line and an outcome."""
    from attn_cli.check.compare import Outcome

    try:
        return _check_one(fixture, golden, run)
    except AttnError as e:
        if reraise:
            raise
        from attn_cli.cli.app import one_line

        typer.echo(f"Error: {one_line(e)}", err=True)
        return Outcome(fixture, error=one_line(e))


def _check_one(fixture: str, golden: Optional[Path], run: _Run) -> "Outcome":  # noqa: UP045
    """One fixture checked; with --update, the golden's folders are made (``mkdir -p``)."""
    from attn_cli.check.run import check_fixture
    from attn_cli.io.files import folders_for

    golden_dir, update = run.golden_dir, run.update
    option = "--golden-dir" if golden_dir is not None else "--golden"
    if golden is not None:
        _check_golden_path(golden, option, update)
    if not update and golden is not None and golden_dir is not None:
        _refuse_old_layout(fixture, golden, golden_dir)
    folders: AbstractContextManager[None] = nullcontext()
    if update and golden is not None:
        folders = folders_for(golden, option=option)  # mkdir -p, undone if the check fails
    with folders:
        return check_fixture(
            fixture,
            golden=golden,
            against=run.against,
            update=update,
            tolerance=run.tolerance,
            stages=run.stages,
            worst=run.worst,
            max_elements=run.max_elements,
            backward=run.backward,
        )


def _check_golden_path(golden: Path, option: str, update: bool) -> None:
    """A path the system cannot look at (a name too long) is refused; to update, so is a FIFO,
    a device or a folder: a golden is a regular file to read back (reading one, the gate
    refuses the rest)."""
    from attn_cli.io.gate import require_regular

    mode = _stat_mode(golden, option)
    if mode is None or not update:
        return
    expected = "a regular file to hold the golden JSON trace"
    try:
        require_regular(mode, printable(str(golden)), expected, option)
    except AttnError as e:
        raise UsageError(e.source, e.field, e.what, e.expected) from None


def _stat_mode(path: Path, option: str) -> Optional[int]:  # noqa: UP045
    """The mode of ``path`` (stat never blocks, even on a FIFO), None when it does not exist."""
    try:
        return os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as e:
        what = f"cannot use the path ({getattr(e, 'strerror', None) or e})"
        raise UsageError(printable(str(path)), option, what, "a usable path") from None


def _is_dir(path: Path, option: str) -> bool:
    mode = _stat_mode(path, option)
    return mode is not None and stat.S_ISDIR(mode)


def _shown_name(fixture: str) -> str:
    """How a report names a fixture: as given, standard input as ``<stdin>`` (as trace does)."""
    return "<stdin>" if fixture == STDIN else fixture


def _report(
    outcomes: list["Outcome"],
    fmt: CheckFormat,
    width: Optional[int],  # noqa: UP045
    color: Optional[bool],  # noqa: UP045
    worst: int,
    lang: Optional["Lang"],
) -> None:
    from attn_cli.present import report
    from attn_cli.present.i18n import default_lang

    if fmt is CheckFormat.json:
        emit(report.report_json(outcomes), None, escape="json")
        return
    if fmt is CheckFormat.junit:
        emit(report.report_junit(outcomes, worst=worst), None, escape="xml")
        return
    if fmt is CheckFormat.github:
        emit(report.report_github(outcomes, worst=worst), None)
        return
    language = default_lang(os.environ) if lang is None else lang.value
    details = report.render_outcomes(outcomes, worst=worst, lang=language)
    if details is not None and plain_wanted(fmt, color):
        emit(plain_text(details, width) + "\n", None)  # a blank line before the summary
    elif details is not None:
        console(width, plain=False, color=color).print(details)
    emit("".join(line + "\n" for line in report.summary_lines(outcomes)), None)


def _check_plan(
    fixtures: list[str],
    golden: Optional[Path],  # noqa: UP045
    golden_dir: Optional[Path],  # noqa: UP045
    root: Optional[Path],  # noqa: UP045
    against: Optional[Path],  # noqa: UP045
    update: bool,
    stages: Optional[tuple[str, ...]],  # noqa: UP045
) -> list[Optional[Path]]:  # noqa: UP045
    """Refuse option combinations that have no meaning, naming what would; the golden of each
    fixture (None: none)."""
    given = [
        n
        for n, v in (("--golden", golden), ("--golden-dir", golden_dir), ("--against", against))
        if v is not None
    ]
    if len(given) > 1:
        raise UsageError("", " and ".join(given), "given together", "one of them")
    if root is not None and golden_dir is None:
        raise UsageError("", "--root", "given without --golden-dir", "--golden-dir DIR --root DIR")
    if golden is not None and len(fixtures) > 1:
        raise UsageError(
            "",
            "--golden",
            f"one golden file for {len(fixtures)} fixtures",
            "--golden-dir DIR (a golden per fixture, under DIR at its path)",
        )
    if against is not None and len(fixtures) > 1:
        raise UsageError("", "--against", f"one dump for {len(fixtures)} fixtures", "one fixture")
    if update and golden is None and golden_dir is None:
        raise UsageError("", "--update", "nothing to update", "--golden FILE or --golden-dir DIR")
    if update and stages is not None:
        raise UsageError(
            "", "--update", "given with --stage", "--update alone (goldens hold every stage)"
        )
    if golden_dir is not None:
        here = Path.cwd() if root is None else root
        return golden_paths(fixtures, golden_dir, here, update=update)
    return [golden] * len(fixtures)


def golden_paths(
    fixtures: list[str], golden_dir: Path, root: Path, *, update: bool = False
) -> list[Optional[Path]]:  # noqa: UP045
    """Each fixture's golden: DIR/<its path under root, suffix .json>, or DIR/<NAME>.json for a
    bundled example; two fixtures with one golden are refused. To update, DIR may be missing
    (it is made as the goldens are written)."""
    missing = update and _stat_mode(golden_dir, "--golden-dir") is None
    if not missing and not _is_dir(golden_dir, "--golden-dir"):
        raise UsageError(
            printable(str(golden_dir)), "--golden-dir", "is not a directory", "a directory"
        )
    if not _is_dir(root, "--root"):
        raise UsageError(printable(str(root)), "--root", "is not a directory", "a directory")
    paths: list[Optional[Path]] = []  # noqa: UP045
    seen: dict[Path, str] = {}
    for fixture in fixtures:
        path = golden_dir / golden_key(fixture, root)
        if path in seen:
            raise UsageError(
                "",
                "--golden-dir",
                f"{printable(seen[path])!r} and {printable(fixture)!r} would share the golden "
                f"{printable(str(path))!r}",
                "fixtures at distinct paths (or bundled names)",
            )
        seen[path] = fixture
        paths.append(path)
    return paths


def golden_key(fixture: str, root: Path) -> Path:
    """Where under --golden-dir a fixture's golden lives: week1/cat.yaml -> week1/cat.json."""
    if fixture == STDIN:
        raise UsageError(
            "<stdin>",
            "--golden-dir",
            "standard input has no name to give a golden file",
            "a fixture path or example name",
        )
    if not _is_path(fixture):
        return Path(fixture + ".json")  # a bundled example, by name
    relative = Path(os.path.relpath(os.path.abspath(fixture), os.path.abspath(root)))
    if relative.parts[:1] == ("..",) or relative.is_absolute():
        raise UsageError(
            printable(fixture),
            "--golden-dir",
            f"is outside the root folder {printable(str(root))!r}",
            "fixtures under the root (the current folder, or --root DIR)",
        )
    return relative.with_suffix(".json")


def _is_path(fixture: str) -> bool:
    """Whether attn reads ``fixture`` as a path (not as a bundled example's name), as api does."""
    try:
        exists = os.path.lexists(fixture)
    except (OSError, ValueError):
        exists = True
    return exists or bool(Path(fixture).suffix) or "/" in fixture or "\\" in fixture


def _refuse_old_layout(fixture: str, golden: Path, golden_dir: Path) -> None:
    """A golden missing where it belongs but present where attn 0.1 put it (DIR/<stem>.json)."""
    old = golden_dir / f"{Path(fixture).stem}.json"
    if golden.exists() or old == golden or not old.is_file() or not _is_path(fixture):
        return
    raise UsageError(
        printable(str(golden)),
        "--golden-dir",
        f"no such golden file, but {printable(str(old))!r} is where attn 0.1 kept it (goldens "
        "are now keyed on the fixture's path under --root)",
        "the golden at this path: move it here, or write it with --update",
    )
