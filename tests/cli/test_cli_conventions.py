"""Command-line conventions: -V, completion, -q, FORCE_COLOR, one-line usage errors, help.

Issue 14 ("Command-line conventions") and issue 15 (usage errors, options parsed by hand,
COLUMNS, a stdout that cannot encode): each test names what a user did and what they saw.
"""

from __future__ import annotations

import json
import re
import time
import tracemalloc
from pathlib import Path

import pytest
from conftest import FIXTURES, run_attn, run_cli

from attn_cli import __version__
from attn_cli.cli.options import MAX_WIDTH, tame_terminal_size
from attn_cli.errors import UsageError
from attn_cli.present.worked import parse_cell, resolve_position

ANSI = re.compile(r"\x1b\[")
COMMANDS = ["trace", "check", "heatmap", "new", "examples", "import"]
CAT = FIXTURES / "the_cat_sat.yaml"
# Two queries, the first with nothing to attend to: a warning (not an error) on stderr.
EMPTY_ROW = {
    "tokens": ["a", "b"],
    "Q": [[1, 0], [0, 1]],
    "K": [[1, 0], [0, 1]],
    "V": [[1, 2], [3, 4]],
    "mask": [[False, False], [True, True]],
}


def one_error_line(result: object, *, code: int = 2) -> str:
    """The single ``Error:`` line of a failed run (exit code first, then the output)."""
    assert getattr(result, "exit_code", None) == code, getattr(result, "output", result)
    stderr: str = result.stderr  # type: ignore[attr-defined]
    assert stderr.startswith("Error: ") and stderr.count("\n") == 1, stderr
    assert "╭" not in stderr and "Usage:" not in stderr and "Traceback" not in stderr
    assert result.stdout == ""  # type: ignore[attr-defined]
    return stderr.rstrip("\n")


# ---------------------------------------------------------------------------------------------
# -V, completion


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version_short_and_long(flag: str) -> None:
    result = run_cli(flag)
    assert result.exit_code == 0
    assert result.stdout == f"attn {__version__}\n"


def test_shell_completion_is_offered_and_shown() -> None:
    helped = run_cli("--help")
    assert helped.exit_code == 0
    assert "--install-completion" in helped.stdout and "--show-completion" in helped.stdout
    shown = run_cli("--show-completion", "bash")
    assert shown.exit_code == 0, shown.output
    assert "complete " in shown.stdout and "_COMPLETE" in shown.stdout  # a bash script


# ---------------------------------------------------------------------------------------------
# -q/--quiet: no notes, no warnings; errors still print


def test_every_command_has_quiet() -> None:
    """Every registered command, including ones added later (declare QuietOption once more)."""
    import typer.main

    from attn_cli.cli.app import app

    group = typer.main.get_command(app)
    ctx = typer.Context(group)
    names = group.list_commands(ctx)  # type: ignore[attr-defined]
    commands = {name: group.get_command(ctx, name) for name in names}  # type: ignore[attr-defined]
    assert set(COMMANDS) <= set(commands)
    for name, command in commands.items():
        flags = {opt for param in command.params for opt in getattr(param, "opts", ())}
        assert {"--quiet", "-q"} <= flags, name


def test_the_help_list_is_each_commands_first_paragraph() -> None:
    """``attn --help`` lists the commands from the table in app.py without importing them;
    each line there is its command's own docstring's first paragraph."""
    import importlib
    import inspect

    from attn_cli.cli.app import COMMANDS as TABLE
    from attn_cli.cli.app import implementation

    assert set(COMMANDS) <= set(TABLE)
    for name, entry in TABLE.items():
        module, function = implementation(name)
        func = getattr(importlib.import_module(f"attn_cli.cli.{module}"), function)
        first = " ".join((inspect.getdoc(func) or "").split("\n\n")[0].split())
        assert entry.summary == first, name
    listed = run_cli("--help").stdout.split("\nCommands:\n")[1]
    unwrapped = " ".join(listed.split())  # Click wraps each summary under its column
    for name, entry in TABLE.items():
        assert f" {name} {entry.summary}" in f" {unwrapped}", name


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("argv", "built"),
    [
        (["--help"], []),
        (["trace", "-f", "json"], ["trace"]),
        (["import", "-h"], ["importer"]),
        (["examples"], ["examples"]),
    ],
)
def test_a_command_imports_only_itself(argv: list[str], built: list[str]) -> None:
    """A command's module is imported when it runs: ``attn trace`` does not pay for the other
    seven at start-up, and ``attn --help`` lists them all without importing one."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from attn_cli.cli.app import COMMANDS, implementation, main\n"
        f"sys.argv = ['attn', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "modules = [implementation(name)[0] for name in COMMANDS]\n"
        "print('BUILT', sorted(m for m in modules if 'attn_cli.cli.' + m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert f"BUILT {built}" in out.stdout


@pytest.mark.subprocess
def test_the_default_trace_skips_what_it_does_not_draw() -> None:
    """Start-up budget (issue 16): the default trace loads neither the other commands' modules,
    JSON's writer nor the classroom layers (its tables are Rich's: issue 37)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from attn_cli.cli.app import main\n"
        "sys.argv = ['attn', 'trace']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "skipped = ['unicodedata', 'attn_cli.io.trace_json',"
        " 'attn_cli.present.explain', 'attn_cli.present.worked', 'attn_cli.cli.check']\n"
        "print('LOADED', [m for m in skipped if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "LOADED []" in out.stdout, out.stdout[-300:]


@pytest.mark.subprocess
def test_the_console_script_runs_without_the_cyclic_collector() -> None:
    """The entry point turns the collector off (~10 ms of start-up, nothing to free: a run
    leaves ~600 unreachable objects); importing the app, as tests and users do, does not."""
    import subprocess
    import sys

    code = (
        "import gc, sys\n"
        "import attn_cli.cli.app\n"
        "print('IMPORTED', gc.isenabled())\n"
        "from attn_cli.cli import main\n"
        "sys.argv = ['attn', 'trace', '--stage', 'softmax']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('RAN', gc.isenabled(), gc.collect() < 5000)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "IMPORTED True" in out.stdout and "RAN False True" in out.stdout, out.stdout[-300:]


def _quiet_runs(tmp_path: Path) -> list[tuple[str, ...]]:
    empty = tmp_path / "empty_row.json"
    empty.write_text(json.dumps(EMPTY_ROW))
    return [
        ("trace", str(CAT), "-f", "json", "-o", str(tmp_path / "t.json")),
        ("trace", str(CAT), "-s", "output", "-f", "npz", "-o", str(tmp_path / "t.npz")),
        ("heatmap", str(CAT), "-f", "svg", "-o", str(tmp_path / "h.svg")),
        ("new", str(tmp_path / "n.yaml")),
        ("examples", "--copy", "the_cat_sat", str(tmp_path / "copy.yaml")),
        ("trace", str(empty), "-f", "json"),  # a warning: row 0 has nothing to attend to
    ]


def test_quiet_silences_notes_and_warnings(tmp_path: Path) -> None:
    (tmp_path / "loud").mkdir()
    for args in _quiet_runs(tmp_path / "loud"):
        loud = run_cli(*args)
        assert loud.exit_code == 0, loud.output
        assert loud.stderr.startswith(("Wrote ", "Warning: ")), args
    (tmp_path / "quiet").mkdir()
    for args in _quiet_runs(tmp_path / "quiet"):
        quiet = run_cli(*args, "-q")
        assert quiet.exit_code == 0, quiet.output
        assert quiet.stderr == "", args


def test_quiet_keeps_errors() -> None:
    result = run_cli("trace", "no_such_fixture.yaml", "-q")
    assert one_error_line(result).startswith("Error: no_such_fixture.yaml: no such file")


# ---------------------------------------------------------------------------------------------
# Colour: FORCE_COLOR like NO_COLOR; NO_COLOR wins; a flag wins over both


@pytest.mark.parametrize(
    ("env", "flags", "coloured"),
    [
        ({"FORCE_COLOR": "1", "NO_COLOR": None}, [], True),
        ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, [], False),  # NO_COLOR wins
        ({"FORCE_COLOR": "1", "NO_COLOR": None}, ["--no-color"], False),
        ({"FORCE_COLOR": "", "NO_COLOR": None}, [], False),  # empty: not set
        ({"FORCE_COLOR": None, "NO_COLOR": "1"}, ["--color"], True),
        ({"FORCE_COLOR": None, "NO_COLOR": None}, [], False),  # a pipe: plain
    ],
)
@pytest.mark.parametrize("command", [["trace", "-s", "softmax"], ["heatmap"]])
def test_force_color_and_no_color(
    env: dict[str, str | None], flags: list[str], coloured: bool, command: list[str]
) -> None:
    result = run_cli(*command, *flags, env=env)
    assert result.exit_code == 0, result.output
    assert bool(ANSI.search(result.stdout)) is coloured


def test_force_color_colours_a_check_report(tmp_path: Path) -> None:
    golden = tmp_path / "g.json"
    assert run_cli("check", str(CAT), "-g", str(golden), "--update").exit_code == 0
    doc = json.loads(golden.read_text())
    doc["stages"]["Q"]["data"][0][0][0] += 1
    golden.write_text(json.dumps(doc))
    forced = run_cli("check", str(CAT), "-g", str(golden), env={"FORCE_COLOR": "1"})
    assert forced.exit_code == 1 and ANSI.search(forced.stdout)
    both = run_cli("check", str(CAT), "-g", str(golden), env={"FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert both.exit_code == 1 and not ANSI.search(both.stdout)


# ---------------------------------------------------------------------------------------------
# Usage errors: one line, exit 2, never a Rich panel


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["trace", "--format", "pdf"],
            "Error: --format: got 'pdf', expected one of table, plain, json, markdown, latex, "
            "html, svg, npz, marp",
        ),
        (["trace", "--lang", "fr"], "Error: --lang: got 'fr', expected one of en, zh"),
        (
            ["check", "the_cat_sat", "-f", "xml"],
            "Error: --format: got 'xml', expected one of table, plain, json, junit, github",
        ),
        (
            ["check"],
            "Error: FIXTURE...: missing, expected one or more fixture files or bundled example "
            "names",
        ),
        (["new"], "Error: FILE: missing, expected the file to write"),
        (
            ["trace", "--fokus", "1"],
            "Error: --fokus: no such option for attn trace (did you mean '--focus'?), expected "
            "one of the options of attn trace -h",
        ),
        (
            ["trace", "--precision", "99"],
            "Error: --precision: got 99, expected an integer from 0 to 17",
        ),
        (
            ["trace", "--width", "5000"],
            "Error: --width: got 5000, expected an integer from 40 to 1000",
        ),
        (
            ["trace", "--width", "abc"],
            "Error: --width: got 'abc', expected an integer from 40 to 1000",
        ),
        (["trace", "--width", "²"], "Error: --width: got '²', expected an integer from 40 to 1000"),
        (["new", "x.yaml", "--seq", "0"], "Error: --seq: got 0, expected an integer from 1 to 256"),
        (
            ["check", "x", "--rtol", "-1"],
            "Error: --rtol: got -1.0, expected a number of at least 0",
        ),
        (
            ["trace", "--format"],
            "Error: --format: needs a value, expected one of table, plain, "
            "json, markdown, latex, html, svg, npz, marp",
        ),
        (
            ["trace", "--stage"],
            "Error: --stage: needs a value, expected a stage name such as softmax",
        ),
        (
            ["trace", "a", "b"],
            "Error: attn trace: got unexpected extra argument(s) (b), "
            "expected attn trace [OPTIONS] [FIXTURE]",
        ),
    ],
)
def test_usage_errors_are_one_line(args: list[str], line: str) -> None:
    assert one_error_line(run_cli(*args)) == line


def test_an_unknown_command_is_one_line_naming_the_commands() -> None:
    line = one_error_line(run_cli("tracee"))
    assert line.startswith(
        "Error: tracee: no such command (did you mean 'trace'?), expected one of "
    )
    assert {"check", "examples", "heatmap", "new", "trace"} <= set(
        line.rsplit("of ", 1)[1].split(", ")
    )


def test_a_huge_option_value_is_cut_short_in_the_error() -> None:
    line = one_error_line(run_cli("trace", "--format", "x" * 100_000))
    assert len(line) < 200 and "…" in line


def test_help_is_still_typers() -> None:
    result = run_cli("trace", "--help")
    assert result.exit_code == 0
    assert "Usage:" in result.stdout and "\nOptions:\n" in result.stdout
    bare = run_cli()  # no command: the help, as before
    assert "Usage" in bare.output and "trace" in bare.output


# ---------------------------------------------------------------------------------------------
# Help: metavars, example style, shared options with shared defaults


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_examples_in_one_style_that_fits_80_columns(command: str) -> None:
    result = run_cli(command, "--help", env={"COLUMNS": "80"})
    assert result.exit_code == 0
    text = result.stdout
    assert "Examples:" in text
    block = re.split(r"\n(?:Arguments|Options):\n", text.split("Examples:", 1)[1])[0]
    lines = [line.rstrip() for line in block.splitlines() if line.strip()]
    assert lines, command
    for line in lines:  # each example on one line, indented 2, a comment aligned after it
        assert re.match(r"^    (attn|cat) \S", line) and len(line) <= 80, (command, line)
    columns = {line.index("  # ") for line in lines}
    assert len(columns) == 1, (command, lines)


@pytest.mark.parametrize(
    ("command", "usage"),
    [
        ("trace", "[OPTIONS] [FIXTURE]"),
        ("heatmap", "[OPTIONS] [FIXTURE]"),
        ("check", "[OPTIONS] FIXTURE..."),
        ("new", "[OPTIONS] FILE"),
        ("examples", "[OPTIONS] [FILE]"),
    ],
)
def test_usage_lines_use_the_shared_metavars(command: str, usage: str) -> None:
    result = run_cli(command, "--help", env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert re.search(rf"Usage: .* {command} {re.escape(usage)}\s*$", result.stdout, re.M)
    assert "{" not in result.stdout.split("\n\n")[1]  # not Typer's {FILE}
    options = result.stdout.split("\nOptions:\n", 1)[1]
    assert "<path>" not in options and "<str>" not in options  # FILE, DIR, STAGE, ...


@pytest.mark.parametrize("command", ["trace", "heatmap"])
def test_precision_and_shared_options_are_the_same_everywhere(command: str) -> None:
    result = run_cli(command, "--help", env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert re.search(r"--precision\s+DIGITS\s[^-]*\[default: 4", result.stdout)
    for option in ("--dtype", "--max-memory", "--max-elements", "--width", "--quiet"):
        assert option in result.stdout, option


def test_heatmap_default_precision_is_the_tables() -> None:
    result = run_cli("heatmap", "causal_multihead", "-f", "plain", "--width", "120")
    assert result.exit_code == 0
    assert re.search(r"^like\s+0\.9858\*\s+0\.0142\s", result.stdout, re.M)


# ---------------------------------------------------------------------------------------------
# Options parsed by hand: --focus, --cell, --max-memory (issue 15)


@pytest.mark.parametrize(
    "value",
    [
        "١",
        "²",
        "٣",
        "1" * 30,
        "9" * 5000,
        " 1 2 ",
        "-1",
        "+1",
        "0x1",
        "1e0",
        "",
        "\x1b[2J",
        "\u202e1",
    ],
)
@pytest.mark.parametrize("option", ["--focus", "--cell"])
def test_hostile_positions_are_one_error_line(option: str, value: str) -> None:
    spec = value if option == "--focus" else f"{value},1"
    result = run_cli("trace", "-s", "softmax", option, spec)
    line = one_error_line(result)
    assert line.startswith(f"Error: {option}: ")
    assert len(line) < 300 and "\x1b" not in line and "\u202e" not in line


def test_unicode_digits_are_not_indices() -> None:
    labels = ["The", "cat", "sat"]
    assert resolve_position(" 2 ", labels, "--focus", "query") == 2
    for digits in ("١", "²", "𝟏", "①"):
        with pytest.raises(UsageError, match="no query token or index"):
            resolve_position(digits, labels, "--focus", "query")
    assert resolve_position("²", ["²", "x"], "--focus", "query") == 0  # a token is a token


def test_thousands_of_commas_take_bounded_time_and_memory() -> None:
    labels = ["The", "cat", "sat"]
    for spec in ("," * 20_000, "The" + "," * 20_000 + "cat", "a," * 10_000):
        tracemalloc.start()
        start = time.perf_counter()
        with pytest.raises(UsageError, match="--cell"):
            parse_cell(spec, labels, labels)
        seconds = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert seconds < 0.2 and peak < 1_000_000, (seconds, peak)
    assert parse_cell("The,cat", labels, labels).key == 1  # still works


def test_cell_with_a_comma_inside_a_token_still_splits_right() -> None:
    q, k = ["a,b", "x"], ["c", "y"]
    ref = parse_cell("a,b,c", q, k)
    assert (ref.query, ref.key) == (0, 0)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "9" * 400,
            f"Error: --max-memory: got '{'9' * 39}…', expected a size such as 8G, "
            "500M or 1.5GiB (powers of 1024)",
        ),
        ("١G", "Error: --max-memory: got '١G', expected a size such as 8G"),
        ("0", "Error: --max-memory: got '0', expected a size of at least 1 byte"),
    ],
)
def test_max_memory_values(value: str, message: str) -> None:
    assert one_error_line(run_cli("trace", "--max-memory", value)).startswith(message)


# ---------------------------------------------------------------------------------------------
# COLUMNS and LINES: bounded, garbage ignored (issue 15)


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("120", "120"),
        ("10", "10"),
        ("99999999", str(MAX_WIDTH)),
        ("1" * 5000, None),
        ("²", None),
        ("١٢٠", None),
        ("abc", None),
        ("0", None),
        ("-5", None),
        ("", None),
        (" 90 ", "90"),
    ],
)
def test_terminal_size_variables_are_tamed(value: str, kept: str | None) -> None:
    env = {"COLUMNS": value, "LINES": value, "OTHER": "x"}
    tame_terminal_size(env)
    assert env.get("COLUMNS") == kept and env.get("LINES") == kept
    assert env["OTHER"] == "x"


@pytest.mark.parametrize("value", ["²", "١٢٠", "99999999999", "abc"])
def test_garbage_columns_never_end_in_a_traceback(value: str) -> None:
    for args in (["trace", "-s", "softmax", "--color"], ["trace", "--help"], ["check", "-h"]):
        result = run_cli(*args, env={"COLUMNS": value, "LINES": value})
        assert result.exit_code == 0, (args, result.output, result.exception)
        longest = max(len(line) for line in ANSI.sub("", result.stdout).splitlines())
        assert longest <= MAX_WIDTH + 20


# ---------------------------------------------------------------------------------------------
# A standard output that cannot encode the output (issue 15)


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "env", [{"PYTHONIOENCODING": "ascii"}, {"PYTHONIOENCODING": "latin-1"}, {"LANG": "C"}]
)
@pytest.mark.parametrize(
    "args",
    [
        ["trace", "--explain", "--lang", "zh"],
        ["trace", "-f", "json"],
        ["heatmap"],
        ["trace", "--cell", "The,cat"],
        ["check", "the_cat_sat", "--format", "github"],
        ["trace", "--help"],
        ["examples"],
    ],
)
def test_a_stdout_that_cannot_encode_is_no_traceback(env: dict[str, str], args: list[str]) -> None:
    from conftest import clean_env

    result = run_attn(*args, env=clean_env(**env))
    assert "Traceback" not in result.stderr and "UnicodeEncodeError" not in result.stderr
    assert result.returncode in (0, 2), result.stderr
    if args[0] == "trace" and "--help" not in args:
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip()
