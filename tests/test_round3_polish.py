"""Round three's polish (issue 22): help texts, golden folders, decode's ring, 80 columns, HTML
themes, blank lines in plain output, the step-mode keys and the minus sign."""

from __future__ import annotations

import re
from typing import Any

import pytest
from conftest import run_cli

from attn_cli.cli.app import COMMANDS, _built, app

# -- 1. help texts are plain text, not Rich markup ----------------------------------------------

_BRACKETED = re.compile(r"\[[^\[\]]*\]")


def _squeezed(text: str) -> str:
    return " ".join(text.split())


def _help_sources(command: Any) -> list[str]:
    """The help texts of a Click command and of each of its parameters, as written."""
    texts = [command.help or ""]
    texts += [getattr(param, "help", None) or "" for param in command.params]
    return [t for t in texts if t]


def _literals(texts: list[str]) -> list[str]:
    return [_squeezed(found) for text in texts for found in _BRACKETED.findall(text)]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_bracket_in_a_command_help_is_shown(name: str) -> None:
    literals = _literals(_help_sources(_built(name)))
    result = run_cli(name, "--help", env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    shown = _squeezed(result.stdout)
    missing = [literal for literal in literals if literal not in shown]
    assert not missing, f"attn {name} --help lost {missing}"


def test_the_brackets_the_issue_names_are_shown() -> None:
    """The three the issue saw eaten; a guard that the test above has something to find."""
    assert "pip install 'attn-cli[models]'" in run_cli("import", "-h").stdout
    wide = {"COLUMNS": "400"}
    assert "[seq, hidden] or [batch, seq, hidden]" in run_cli("import", "-h", env=wide).stdout
    assert "[heads*d_k, d_model]" in _squeezed(run_cli("new", "-h", env=wide).stdout)


def test_the_root_help_and_its_listing_keep_brackets() -> None:
    import typer.main

    group = typer.main.get_command(app)
    literals = _literals([group.help or "", *(entry.summary for entry in COMMANDS.values())])
    result = run_cli("--help", env={"COLUMNS": "400"})
    assert result.exit_code == 0
    assert all(literal in _squeezed(result.stdout) for literal in literals)


def test_help_texts_stay_as_written_after_drawing() -> None:
    """Escaping is for the drawing only: completion reads the same texts."""
    before = _help_sources(_built("import"))
    assert run_cli("import", "--help").exit_code == 0
    assert _help_sources(_built("import")) == before
