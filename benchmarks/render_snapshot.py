"""Capture what attn prints for every bundled example, to check a refactor changes no byte.

    python benchmarks/render_snapshot.py OUT_DIR           # write one file per command
    diff -r BEFORE_DIR AFTER_DIR                           # compare two captures

Not part of the test run. Each command runs in-process through Typer's CliRunner (fast enough to
run after every change); a command that fails records its exit code and output too, so a change in
what is refused shows up as well. The commands: ``attn trace NAME`` plain and coloured, with and
without ``--explain``, in English and Chinese, at widths 40, 80 and 130; ``attn decode NAME --full
--explain`` and ``attn flash NAME`` at the same widths; and the html, svg, markdown and latex
writers at the default width.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIDTHS = ("40", "80", "130")


def examples() -> list[str]:
    return sorted(p.stem for p in (ROOT / "fixtures").glob("*.yaml"))


def commands(name: str) -> Iterator[list[str]]:
    """Every command captured for one example."""
    for width in WIDTHS:
        for colour in ("--no-color", "--color"):
            for extra in ([], ["--explain"], ["--lang", "zh"], ["--explain", "--lang", "zh"]):
                yield ["trace", name, "--width", width, colour, *extra]
            yield ["decode", name, "--full", "--explain", "--width", width, colour]
            yield ["decode", name, "--width", width, colour, "--lang", "zh"]
            yield ["flash", name, "--width", width, colour]
            yield ["flash", name, "--explain", "--width", width, colour]
    for fmt in ("html", "svg", "markdown", "latex"):
        yield ["trace", name, "--explain", "-f", fmt]
    yield ["trace", name, "-f", "html", "--lang", "zh"]
    yield ["decode", name, "-f", "html"]
    yield ["decode", name, "--explain", "-f", "html", "--lang", "zh"]
    yield ["flash", name, "-f", "html"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", help="one example")
    args = parser.parse_args()
    from typer.testing import CliRunner

    from attn_cli.cli.app import app

    runner = CliRunner()
    args.out.mkdir(parents=True, exist_ok=True)
    count = 0
    for name in [args.only] if args.only else examples():
        for cmd in commands(name):
            result = runner.invoke(app, cmd, env={"NO_COLOR": None, "FORCE_COLOR": None})
            file = args.out / ("_".join(c.lstrip("-") for c in cmd) + ".txt")
            file.write_text(f"exit {result.exit_code}\n{result.output}", encoding="utf-8")
            count += 1
    print(f"{count} outputs in {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
