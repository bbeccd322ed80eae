"""``attn check``: a fixture's trace against a golden file, its ``expected`` section, or a dump."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from attn_cli.cli.options import (
    ColorOption,
    Format,
    MaxElementsOption,
    WidthOption,
    plain_wanted,
)
from attn_cli.cli.output import console, emit, plain_text
from attn_cli.core.limits import DEFAULT_MAX_ELEMENTS
from attn_cli.errors import AttnError, UsageError

if TYPE_CHECKING:
    from attn_cli.check.compare import Outcome

FixturesArgument = Annotated[
    list[str],
    typer.Argument(
        help="Fixture files or bundled example names (several need --golden-dir).",
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
    typer.Option(help="Golden files named after each fixture: DIR/<name>.json.", metavar="DIR"),
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
    bool, typer.Option(help="(Re)write the golden file(s) from the current trace, atomically.")
]
RtolOption = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        min=0, help="Relative tolerance (default 1e-9; 1e-4 with --against).", show_default=False
    ),
]
AtolOption = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        min=0, help="Absolute tolerance (default 1e-12; 1e-5 with --against).", show_default=False
    ),
]
CheckStageOption = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option("--stage", "-s", help="Compare only this stage; repeat for more."),
]
WorstOption = Annotated[
    int, typer.Option(min=1, help="Worst cells listed for the first stage that differs.")
]
CheckFormatOption = Annotated[
    Format, typer.Option("--format", "-f", help="table (coloured on a terminal), plain, json.")
]


def check(
    fixtures: FixturesArgument,
    golden: GoldenOption = None,
    golden_dir: GoldenDirOption = None,
    against: AgainstOption = None,
    update: UpdateOption = False,
    rtol: RtolOption = None,
    atol: AtolOption = None,
    stage: CheckStageOption = None,
    worst: WorstOption = 5,
    fmt: CheckFormatOption = Format.table,
    width: WidthOption = None,
    color: ColorOption = None,
    max_elements: MaxElementsOption = DEFAULT_MAX_ELEMENTS,
) -> None:
    """Compare a fixture's trace with a golden file, its `expected` section, or your own code.

    A cell passes when |actual - expected| <= atol + rtol*|expected|; nan, inf and -inf
    equal only themselves. Exit code as diff: 0 same, 1 different, 2 trouble.

    Examples:

      attn check my.yaml --golden golden/my.json --update   # write the golden

      attn check my.yaml --golden golden/my.json            # compare with it

      attn check fixtures/*.yaml --golden-dir golden/       # several at once

      attn check my.yaml                                    # its own `expected` section

      attn check the_cat_sat --against my_dump.npz          # grade your implementation
    """
    from attn_cli.api import check_stage_names
    from attn_cli.check.compare import GOLDEN_TOLERANCE, GRADER_TOLERANCE, Outcome, Tolerance
    from attn_cli.check.compare import exit_code as code_of
    from attn_cli.check.run import check_fixture

    stages = check_stage_names(stage)
    _check_plan(fixtures, golden, golden_dir, against, update, stages)
    default = GRADER_TOLERANCE if against is not None else GOLDEN_TOLERANCE
    tolerance = Tolerance(
        default.rtol if rtol is None else rtol, default.atol if atol is None else atol
    )
    outcomes: list[Outcome] = []
    for fixture in fixtures:
        try:
            outcomes.append(check_fixture(
                fixture, golden=_golden_path(fixture, golden, golden_dir), against=against,
                update=update, tolerance=tolerance, stages=stages, worst=worst,
                max_elements=max_elements,
            ))  # fmt: skip
        except AttnError as e:
            if len(fixtures) == 1:
                raise
            from attn_cli.cli.app import one_line

            typer.echo(f"Error: {one_line(e)}", err=True)
            outcomes.append(Outcome(fixture, error=one_line(e)))
    _report(outcomes, fmt, width, color, worst)
    raise typer.Exit(code_of(outcomes))


def _report(
    outcomes: list["Outcome"],
    fmt: Format,
    width: Optional[int],  # noqa: UP045
    color: Optional[bool],  # noqa: UP045
    worst: int,
) -> None:
    from attn_cli.present.report import render_outcomes, report_json, summary_lines

    if fmt is Format.json:
        emit(report_json(outcomes), None)
        return
    details = render_outcomes(outcomes, worst=worst)
    if details is not None and plain_wanted(fmt, color):
        emit(plain_text(details, width), None)
    elif details is not None:
        console(width, plain=False, color=color).print(details)
    emit("".join(line + "\n" for line in summary_lines(outcomes)), None)


def _check_plan(
    fixtures: list[str],
    golden: Optional[Path],  # noqa: UP045
    golden_dir: Optional[Path],  # noqa: UP045
    against: Optional[Path],  # noqa: UP045
    update: bool,
    stages: Optional[tuple[str, ...]],  # noqa: UP045
) -> None:
    """Refuse option combinations that have no meaning, naming what would."""
    given = [n for n, v in (("--golden", golden), ("--golden-dir", golden_dir),
                            ("--against", against)) if v is not None]  # fmt: skip
    if len(given) > 1:
        raise UsageError("", " and ".join(given), "given together", "one of them")
    if golden is not None and len(fixtures) > 1:
        raise UsageError(
            "", "--golden", f"one golden file for {len(fixtures)} fixtures",
            "--golden-dir DIR (a golden per fixture, DIR/<name>.json)",
        )  # fmt: skip
    if against is not None and len(fixtures) > 1:
        raise UsageError("", "--against", f"one dump for {len(fixtures)} fixtures", "one fixture")
    if update and golden is None and golden_dir is None:
        raise UsageError("", "--update", "nothing to update", "--golden FILE or --golden-dir DIR")
    if update and stages is not None:
        raise UsageError("", "--update", "given with --stage", "--update alone (goldens hold "
                         "every stage)")  # fmt: skip
    if golden_dir is not None:
        _check_golden_dir(fixtures, golden_dir)


def _check_golden_dir(fixtures: list[str], golden_dir: Path) -> None:
    if not golden_dir.is_dir():
        raise UsageError(str(golden_dir), "--golden-dir", "is not a directory", "a directory")
    stems = [_fixture_stem(f) for f in fixtures]
    twice = sorted({s for s in stems if stems.count(s) > 1})
    if twice:
        raise UsageError(
            "", "--golden-dir", f"two fixtures are both named {twice[0]!r}",
            "fixtures with distinct names (each golden is named after its fixture)",
        )  # fmt: skip


def _fixture_stem(fixture: str) -> str:
    if fixture == "-":
        raise UsageError(
            "<stdin>", "--golden-dir", "standard input has no name to give a golden file",
            "a fixture path or example name",
        )  # fmt: skip
    return Path(fixture).stem


def _golden_path(
    fixture: str,
    golden: Optional[Path],  # noqa: UP045
    golden_dir: Optional[Path],  # noqa: UP045
) -> Optional[Path]:  # noqa: UP045
    if golden_dir is not None:
        return golden_dir / f"{_fixture_stem(fixture)}.json"
    return golden
