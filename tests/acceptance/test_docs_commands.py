"""Every shell command in README.md and docs/*.md, run as shown, in order, on the installed attn.

A document's commands are the lines of its ```bash, ```sh and ```console blocks (a line ending in
``\\`` goes on; a comment line or the text after `` # `` is not run). They run one after
another in a temporary folder of their own, holding a copy of docs/ (as a clone of the repo has),
with the ``attn`` installed beside this Python; each must exit 0, or the code its comment names
(``# ... exit 1``). A command with ``--step`` gets a terminal and ``q``.

Not run, and said so here and in the document:

- a block after the comment ``<!-- needs the models extra -->`` (``attn import``), when
  safetensors or tokenizers is not installed (``pip install '.[models]'``);
- a block after the comment ``<!-- not run by tests/acceptance/test_docs_commands.py: REASON -->``,
  where REASON says what it needs that a test cannot have: a download or torch
  (``test_only_downloads_and_torch_are_skipped`` keeps the reasons to those);
- the parts of a command that set a machine up: ``pip install ...``, ``python3 -m venv``,
  ``. .venv/bin/activate`` (the package is installed already), and the README's test command
  itself (``pytest``: this suite).
"""

from __future__ import annotations

import importlib.util
import os
import re
import select
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import DOCS, ROOT, clean_env

DOCUMENTS = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
# README.md still names the old path (tests/test_docs_commands.py); both are markers
SKIP = re.compile(r"<!-- not run by tests/acceptance/test_docs_commands\.py: (.+?) -->")
MODELS_EXTRA = "<!-- needs the models extra -->"
SHELL = ("bash", "sh", "console", "shell")
# Setting a machine up, not using attn: the package under test is installed already.
SETUP = ("pip install", "python3 -m venv", "python -m venv", ". .venv/bin/activate")
HAVE_MODELS = all(importlib.util.find_spec(m) is not None for m in ("safetensors", "tokenizers"))
TIMEOUT = 120.0  # seconds a command; generous for a loaded machine


@dataclass(frozen=True)
class Command:
    """One command of a document: its text, where it stands, the exit code it should give."""

    text: str
    line: int
    exit_code: int


@dataclass(frozen=True)
class Skipped:
    """A block not run, with the reason its marker gives."""

    document: str
    line: int
    reason: str


def _setup_removed(text: str) -> str:
    """The command without its machine set-up parts (``pip install . && attn trace``)."""
    parts = [part.strip() for part in text.split(" && ")]
    return " && ".join(p for p in parts if not p.startswith(SETUP))


def _expected_exit(comment: str) -> int:
    found = re.search(r"\bexit (\d+)\b", comment)
    return int(found.group(1)) if found else 0


def commands(document: Path) -> tuple[list[Command], list[Skipped]]:
    """The shell commands of one markdown document, in order, and the blocks marked not run."""
    lines = document.read_text(encoding="utf-8").splitlines()
    found: list[Command] = []
    skipped: list[Skipped] = []
    fence: str | None = None
    skip_reason: str | None = None
    pending = ""
    start = 0
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if fence is None:
            marker = SKIP.search(line)
            if marker:
                skip_reason = marker.group(1)
            elif stripped == MODELS_EXTRA and not HAVE_MODELS:
                skip_reason = "needs the models extra, not installed"
            elif stripped.startswith("```"):
                fence = stripped[3:].strip() or "text"
                if fence in SHELL and skip_reason is not None:
                    skipped.append(Skipped(document.name, number, skip_reason))
                    fence = "skipped"
                skip_reason = None
            elif stripped:
                skip_reason = None  # the marker stands right before its block
            continue
        if stripped.startswith("```"):
            fence = None
            continue
        if fence not in SHELL:
            continue
        if stripped.startswith("#") or not stripped:
            if found and stripped.startswith("#") and "exit " in stripped and not pending:
                last = found[-1]  # a comment line after a command: what it prints and exits
                found[-1] = Command(last.text, last.line, _expected_exit(stripped))
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        text, _, comment = (pending + stripped).partition(" # ")
        pending = ""
        text = _setup_removed(text.strip())
        if text and text != "pytest":
            found.append(Command(text, start, _expected_exit(comment)))
    return found, skipped


def _environment(home: Path) -> dict[str, str]:
    """English, no colour, 80 columns, the installed ``attn`` first on PATH, no checkout on it."""
    env = clean_env(COLUMNS="80", HOME=str(home))
    env.pop("PYTHONPATH", None)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _in_a_terminal(command: str, cwd: Path, env: dict[str, str]) -> int:
    """Run ``command`` on a terminal, pressing q until it quits; its exit code."""
    master, slave = os.openpty()
    child = subprocess.Popen(
        ["bash", "-c", command],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=cwd,
        env=env,
        start_new_session=True,
    )
    os.close(slave)
    deadline = time.monotonic() + TIMEOUT
    try:
        while child.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    os.read(master, 65536)  # a child never blocks on a full terminal
                except OSError:
                    break
            os.write(master, b"q")
        return child.wait(timeout=max(deadline - time.monotonic(), 1.0))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(master)


def run_command(command: Command, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """The exit code and the end of what ``command`` wrote to standard error."""
    if "--step" in command.text:
        return _in_a_terminal(command.text, cwd, env), ""
    done = subprocess.run(
        ["bash", "-c", command.text],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=TIMEOUT,
        text=True,
        errors="replace",
        check=False,
    )
    return done.returncode, done.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_command_runs_as_shown(document: Path, tmp_path: Path) -> None:
    found, _ = commands(document)
    work = tmp_path / "work"
    shutil.copytree(DOCS, work / "docs")
    home = tmp_path / "home"
    home.mkdir()
    env = _environment(home)
    failures = []
    for command in found:
        code, stderr = run_command(command, work, env)
        if code != command.exit_code:
            failures.append(
                f"{document.name}:{command.line}: `{command.text}` exited {code}, "
                f"expected {command.exit_code}\n{stderr}"
            )
    assert not failures, "\n".join(failures)


def test_only_downloads_and_torch_are_skipped() -> None:
    skipped = [s for document in DOCUMENTS for s in commands(document)[1]]
    for block in skipped:
        assert re.search(r"\b(download|torch|models extra)\b", block.reason), block
    # the README's real-model commands that need MiniLM (84 MB) are marked, and said so
    assert any(s.document == "README.md" and "download" in s.reason for s in skipped)


def test_the_reader_finds_commands_comments_and_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n```bash\npip install . && attn trace   # the example\n"
        "attn check a.yaml \\\n    --golden g.json   # compare: exit 1\n"
        "attn check x --against d.json\n# softmax differs first ... exit 1\npytest\n```\n\n"
        "```text\nattn not-a-command\n```\n\n"
        "<!-- not run by tests/acceptance/test_docs_commands.py: needs a download -->\n"
        '```bash\nattn import "$MODEL"\n```\n',
        encoding="utf-8",
    )
    found, skipped = commands(page)
    assert [(c.text, c.line, c.exit_code) for c in found] == [
        ("attn trace", 4, 0),
        ("attn check a.yaml --golden g.json", 5, 1),
        ("attn check x --against d.json", 7, 1),
    ]
    assert skipped == [Skipped("page.md", 17, "needs a download")]


def test_the_readme_is_a_front_page_and_the_index_links_every_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([^)#]+)", index))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.glob("*.md")} - {"README.md"}
    pages |= {"notebook.ipynb", "grader/README.md"}
    assert pages - linked == set()


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_a_file(document: Path) -> None:
    text = document.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    missing = [t for t in targets if "://" not in t and not (document.parent / t).exists()]
    assert missing == []
