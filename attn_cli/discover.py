"""The modules of a folder of plug-ins (core/plugins, present/variants, check/mistakes), each
imported, in name order, so that the folder's ``__init__`` lists none of them by name.

A listing of the folder, not ``pkgutil`` (a millisecond of every start-up).
"""

import os
from collections.abc import Iterable
from importlib import import_module
from types import ModuleType


def submodules(package: str, path: Iterable[str]) -> list[ModuleType]:
    """Every ``*.py`` module of the package's folder but ``_``-prefixed ones, imported."""
    names = sorted(
        entry.name[:-3]
        for folder in path
        for entry in os.scandir(folder)
        if entry.name.endswith(".py") and not entry.name.startswith("_")
    )
    return [import_module(f"{package}.{name}") for name in names]
