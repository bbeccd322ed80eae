"""The bundled examples: fixtures shipped inside the package (``fixtures/`` in the repo)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_EXAMPLE = "the_cat_sat"
SUFFIXES = (".yaml", ".yml", ".json")


def example_dir() -> Path:
    """Where the bundled fixtures are: in the installed package, or the repo's fixtures/."""
    package = Path(__file__).resolve().parent.parent
    installed = package / "fixtures"
    return installed if installed.is_dir() else package.parent / "fixtures"


def example_paths() -> dict[str, Path]:
    """Bundled example name (file stem) -> path, sorted by name."""
    folder = example_dir()
    if not folder.is_dir():
        return {}
    paths = sorted(p for p in folder.iterdir() if p.suffix in SUFFIXES and p.is_file())
    return {p.stem: p for p in paths}


def find_example(name: str) -> Path | None:
    """The path of the bundled example called ``name``, or None."""
    return example_paths().get(name)
