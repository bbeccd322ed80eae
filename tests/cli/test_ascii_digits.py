"""Integer options take ASCII digits only: Python's ``int`` reads ``'٣'`` (ARABIC-INDIC DIGIT
THREE) or ``'３'`` (FULLWIDTH DIGIT THREE) as 3, which nobody typed as a number."""

from __future__ import annotations

import pytest
import typer
from conftest import run_cli
from typer.testing import CliRunner

from attn_cli.cli.usage import AttnCommand


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["flash", "--block-q", "٣"],
            "Error: --block-q: got '٣', expected an integer of at least 1",
        ),
        (
            ["trace", "--precision", "３"],
            "Error: --precision: got '３', expected an integer from 0 to 17",
        ),
        (
            ["trace", "--precision=٢"],
            "Error: --precision: got '٢', expected an integer from 0 to 17",
        ),
        (["decode", "-p", "٣"], "Error: --prefill: got '٣', expected an integer of at least 1"),
        (
            ["new", "x.yaml", "--seed", "٧"],
            "Error: --seed: got '٧', expected an integer of at least 0",
        ),
    ],
)
def test_a_non_ascii_digit_is_a_one_line_usage_error(args: list[str], line: str) -> None:
    result = run_cli(*args)
    assert result.exit_code == 2, result.output
    assert result.stderr == line + "\n"
    assert result.stdout == ""


def test_ascii_digits_still_parse() -> None:
    result = run_cli("trace", "--precision", " 2 ", "--stage", "softmax", "-f", "plain")
    assert result.exit_code == 0, result.output
    assert "0.00" in result.stdout and "0.000" not in result.stdout


def test_an_integer_without_a_range_takes_ascii_digits_only() -> None:
    """A plain ``int`` option (no min or max) of a command built on AttnCommand."""
    app = typer.Typer()

    @app.command(cls=AttnCommand)
    def count(n: int = 0) -> None:
        typer.echo(str(n * 2))

    assert CliRunner().invoke(app, ["--n", "21"]).stdout == "42\n"
    refused = CliRunner().invoke(app, ["--n", "٢١"])
    assert refused.exit_code == 2 and "'٢١' is not a valid" in refused.output
