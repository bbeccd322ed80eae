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


def model_dir() -> Path:
    """Where the bundled tiny checkpoints are: in the installed package, or the repo's models/."""
    package = Path(__file__).resolve().parent.parent
    installed = package / "models"
    return installed if installed.is_dir() else package.parent / "models"


def model_paths() -> dict[str, Path]:
    """Bundled checkpoint name (folder name) -> its folder, sorted by name."""
    folder = model_dir()
    if not folder.is_dir():
        return {}
    return {p.name: p for p in sorted(folder.iterdir()) if (p / "config.json").is_file()}


def find_checkpoint(path: Path) -> Path:
    """``path``, or the bundled checkpoint it names when no such file or folder is here."""
    bundled = model_paths().get(str(path))
    return bundled if bundled is not None and not path.exists() else path
