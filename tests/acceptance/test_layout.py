"""The package's shape: no import cycle anywhere, every function fits on a screen, no module
over 800 lines, no module reading another's private names, and `# fmt: skip` kept for tables.

The cycle check reads every ``import`` and ``from ... import`` in ``attn_cli`` wherever it
stands (module level, inside a function, under ``TYPE_CHECKING``): an import deferred into a
function hides a cycle from Python's start-up, not from a reader. ``lint-imports`` checks the
arrows between layers; this checks them between modules.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "attn_cli"
MAX_FUNCTION_LINES = 80  # STYLE.md 15: a function fits on a screen, as the formatter lays it out


def _module_name(path: Path) -> str:
    """``attn_cli/check/grade.py`` -> ``attn_cli.check.grade``; a package is its ``__init__``."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


@functools.cache
def _trees() -> dict[str, tuple[ast.Module, bool]]:
    """Every module of the package parsed once: its tree, and whether it is a package."""
    return {
        name: (ast.parse(path.read_text(encoding="utf-8"), str(path)), path.name == "__init__.py")
        for name, path in _sources().items()
    }


def _base(node: ast.ImportFrom, here: str, is_package: bool) -> str:
    """The module a ``from`` import reads from, relative imports resolved against ``here``."""
    if not node.level:
        return node.module or ""
    anchor = here.split(".") if is_package else here.split(".")[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join([*anchor, *([node.module] if node.module else [])])


def _import_module_name(node: ast.Call) -> str | None:
    """The module ``import_module("a.b")`` loads, when its name is written out."""
    func = node.func
    called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    arg = node.args[0] if node.args else None
    if called != "import_module" or not isinstance(arg, ast.Constant):
        return None
    return arg.value if isinstance(arg.value, str) else None


def _imported(node: ast.AST, here: str, is_package: bool, modules: set[str]) -> Iterator[str]:
    """The package modules one statement imports: ``from a import b`` is ``a.b`` when that is
    a module, else ``a``; ``import_module("a.b")`` with a literal name counts as ``import a.b``."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = _base(node, here, is_package)
        for alias in node.names:
            yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
    elif isinstance(node, ast.Call) and (name := _import_module_name(node)) is not None:
        yield name


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports, from every import statement in its source.

    Importing a submodule runs its parents' ``__init__`` too; that is not counted as an arrow
    (the parents here hold docstrings and lazy names), as in import-linter.
    """
    trees = _trees()
    modules = set(trees)
    graph: dict[str, set[str]] = {name: set() for name in trees}
    for name, (tree, is_package) in trees.items():
        for node in ast.walk(tree):
            found = _imported(node, name, is_package, modules)
            graph[name].update(m for m in found if m in modules and m != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]``, or None: a depth-first walk that meets its own path."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for nxt in sorted(graph[node]):
            if nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in done and (cycle := visit(nxt)) is not None:
                return cycle
        on_path.discard(path.pop())
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done and (cycle := visit(start)) is not None:
            return cycle
    return None


@pytest.mark.slow
def test_the_graph_sees_imports_inside_functions_and_type_checking() -> None:
    graph = import_graph()
    # attn_cli/__init__.py imports these only under TYPE_CHECKING
    assert {"attn_cli.api", "attn_cli.errors"} <= graph["attn_cli"]
    # check/run.py imports the grader inside check_fixture
    assert "attn_cli.check.grade" in graph["attn_cli.check.run"]


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.slow
def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def long_functions(tree: ast.AST, where: str) -> Iterator[str]:
    """Functions and methods over MAX_FUNCTION_LINES, from ``def`` to their last line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1  # decorators stand above node.lineno
            if lines > MAX_FUNCTION_LINES:
                yield f"{where}:{node.lineno} {node.name} ({lines} lines)"


def _function(lines: int, indent: str = "") -> str:
    """The source of a function ``lines`` long, ``def`` included."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))
    return f"{indent}def f():\n{body}"


def test_long_functions_counts_from_def_to_the_last_line() -> None:
    fits = ast.parse("@decorator\n@another\n" + _function(MAX_FUNCTION_LINES))
    assert list(long_functions(fits, "m")) == []  # decorators are not counted
    over = ast.parse("class C:\n" + _function(MAX_FUNCTION_LINES + 1, "    "))
    # methods are counted too
    assert list(long_functions(over, "m")) == [f"m:2 f ({MAX_FUNCTION_LINES + 1} lines)"]


@pytest.mark.slow  # reads the whole package (about half a second), once for all these tests
def test_no_function_over_80_lines() -> None:
    long = [found for name, (tree, _) in _trees().items() for found in long_functions(tree, name)]
    assert not long, "functions over 80 lines: " + ", ".join(long)


MAX_MODULE_LINES = 800  # issue 37: a module a reader can hold; split by meaning past this
MAX_FMT_SKIPS = 150  # issue 37: `# fmt: skip` only where a table of data reads better aligned
NAMEDTUPLE_API = {"_make", "_replace", "_fields", "_asdict", "_field_defaults"}  # public API


def test_no_module_over_800_lines() -> None:
    long = [
        f"{name} ({n} lines)"
        for name, path in _sources().items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, "modules over 800 lines: " + ", ".join(long)


def test_fmt_skip_only_where_a_table_needs_it() -> None:
    found = sum(
        line.rstrip().endswith("# fmt: skip")
        for path in _sources().values()
        for line in path.read_text(encoding="utf-8").splitlines()
    )
    assert found <= MAX_FMT_SKIPS, f"{found} `# fmt: skip` in attn_cli (at most {MAX_FMT_SKIPS})"


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(tree: ast.AST, here: str, is_package: bool) -> Iterator[str]:
    """Another module's private names read here: ``from attn_cli.x import _y`` and ``m._y``
    where ``m`` names a module of the package (``import attn_cli.x as m``, ``from attn_cli
    import x``)."""
    modules = set(_sources())
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _base(node, here, is_package)
            if not base.startswith("attn_cli"):
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules:
                    aliases[alias.asname or alias.name] = full
                elif private(alias.name) and base != here:
                    yield f"{here}:{node.lineno} from {base} import {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("attn_cli") and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and private(node.attr)
            and node.attr not in NAMEDTUPLE_API
        ):
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else None
            if name in aliases and aliases[name] != here:
                yield f"{here}:{node.lineno} {name}.{node.attr}"


def test_private_uses_finds_both_forms() -> None:
    tree = ast.parse(
        "from attn_cli.core import steps as s\nfrom attn_cli.core.steps import _x\ns._y\n"
    )
    found = list(private_uses(tree, "attn_cli.check.grade", False))
    assert [f.split(" ", 1)[1] for f in found] == ["from attn_cli.core.steps import _x", "s._y"]


def test_no_module_reads_another_modules_private_names() -> None:
    found = [
        use
        for name, (tree, is_package) in _trees().items()
        for use in private_uses(tree, name, is_package)
    ]
    assert not found, "private names read from another module: " + ", ".join(found)


def test_every_package_ships_in_the_wheel() -> None:
    """pyproject.toml lists the packages a non-editable install copies; a subpackage left out
    imports in the checkout and fails after `pip install .` (io/families did, once)."""
    text = (PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8")
    listed = set(re.findall(r'"(attn_cli[\w.]*)"', text.split("packages = [", 1)[1].split("]")[0]))
    found = {_module_name(p.parent / "__init__.py") for p in PACKAGE.rglob("__init__.py")}
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"
