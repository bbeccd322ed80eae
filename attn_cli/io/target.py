"""Someone else's code, run: a TARGET (``path/to/file.py:function`` or ``package.module:function``)
loaded as pytest loads a test file, and called with a timeout.

Loading a file *runs* it, as ``import`` does: its top-level code executes in this process. The
file is read through the gate (a regular file, at most :data:`MAX_SOURCE_BYTES`), compiled, and
run as a module named after it, with its folder first on ``sys.path`` so that it can import its
neighbours (pytest's ``prepend`` mode). A module name is imported as ``import`` would, the current
folder on the path as ``python -m`` has it.

Every call of the user's code (the file's top level too) runs in a daemon thread that the caller
waits for at most ``timeout`` seconds. What it prints goes to standard error, never into the
caller's standard output; NumPy's floating-point warnings are silenced inside it (an overflow is
read from the numbers it returns). A call that does not return in time is abandoned: the thread is
asked to stop (an exception raised in it at its next Python instruction), and if it is stuck in C
it keeps running until the process exits; nothing calls the function again.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import sys
import threading
import types
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attn_cli.errors import InputError, ProbeError, UsageError, printable
from attn_cli.io.gate import read_bytes

MAX_SOURCE_BYTES = 8 * 1024 * 1024
TARGET_FORM = "path/to/file.py:function or package.module:function"


class Abandoned(BaseException):
    """Raised inside a call that ran past its timeout, to stop it at its next instruction."""


@dataclass(frozen=True)
class Outcome:
    """What one call of user code ended with: its value, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None


def one_line(error: BaseException) -> str:
    """An exception as ``Type: message`` on one printable line, cut at 200 characters."""
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    text = " ".join(printable(line) for line in text.splitlines())
    return text if len(text) <= 200 else text[:199] + "…"


def call(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    timeout: float,
    source: str,
    field: str = "",
) -> Outcome:
    """``fn(*args, **kwargs)`` in a thread, its prints on stderr; a ProbeError past ``timeout``
    (``source`` and ``field`` name the code and the call in it)."""
    box: list[Outcome] = []

    def run() -> None:
        import numpy as np

        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                box.append(Outcome(value=fn(*args, **kwargs)))
        except Abandoned:
            pass
        except BaseException as e:  # the user's exception is the outcome
            box.append(Outcome(error=e))

    worker = threading.Thread(target=run, name="attn-probe-call", daemon=True)
    with contextlib.redirect_stdout(sys.stderr):
        worker.start()
        worker.join(timeout)
    if worker.is_alive():
        _stop(worker)
        raise ProbeError(
            source,
            field,
            f"did not return within {timeout:g} s (abandoned)",
            "code that returns in time",
            option="timeout",
        )
    return box[0] if box else Outcome(error=Abandoned())


def _stop(worker: threading.Thread) -> None:
    """Ask a thread to stop: Abandoned is raised in it at its next Python instruction."""
    if worker.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(worker.ident), ctypes.py_object(Abandoned)
        )


def load(target: str, *, timeout: float) -> Callable[..., Any]:
    """The function named by ``target``; loading it runs the file (or imports the module)."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise UsageError("", "TARGET", f"got {_shown(target)}", TARGET_FORM)
    attrs = name.split(".")
    if not all(a.isidentifier() for a in attrs):
        raise UsageError(
            "", "TARGET", f"function name {_shown(name)} is not a Python name", TARGET_FORM
        )
    is_file = where.endswith(".py") or "/" in where or os.sep in where
    module = _run_file(Path(where), timeout) if is_file else _import(where, timeout)
    found: Any = module
    for i, attr in enumerate(attrs):
        if not hasattr(found, attr):
            defined = ".".join(attrs[:i]) or where
            raise InputError(
                where, name, f"{defined} defines no {attr!r}", "the name of a function it defines"
            )
        found = getattr(found, attr)
    if not callable(found):
        raise InputError(
            where,
            name,
            f"is a {type(found).__name__}, not callable",
            "an attention function fn(q, k, v, ...)",
        )
    return found  # type: ignore[no-any-return]


def _shown(text: str) -> str:
    return repr(printable(text if len(text) <= 60 else text[:59] + "…"))


def _run_file(path: Path, timeout: float) -> types.ModuleType:
    """Compile and run a Python file as a module named after it (its folder on sys.path)."""
    source = str(path)
    data = read_bytes(path, source, "a Python file", max_bytes=MAX_SOURCE_BYTES)
    try:
        code = compile(data, source, "exec", dont_inherit=True)
    except SyntaxError as e:
        raise InputError(
            source, f"line {e.lineno}", f"syntax error: {e.msg}", "a Python file that compiles"
        ) from None
    except (ValueError, UnicodeDecodeError) as e:  # NUL bytes, an undecodable encoding
        raise InputError(
            source, "", f"cannot compile: {one_line(e)}", "a UTF-8 Python file"
        ) from None
    stem = path.stem if path.stem.isidentifier() else "_attn_probe_target"
    name = stem if stem not in sys.modules else f"_attn_probe_{stem}"
    module = types.ModuleType(name)
    module.__file__ = str(path.resolve())
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    sys.modules[name] = module
    ran = call(exec, (code, module.__dict__), {}, timeout=timeout, source=source)
    if ran.error is not None:
        del sys.modules[name]
        raise InputError(
            source, "", f"running it raised {one_line(ran.error)}", "a file that runs without error"
        ) from None
    return module


def _import(name: str, timeout: float) -> types.ModuleType:
    """Import a module by its dotted name, the current folder on the path as ``python -m``."""
    if not all(part.isidentifier() for part in name.split(".")):
        raise UsageError(
            "", "TARGET", f"module {_shown(name)} is not a dotted Python name", TARGET_FORM
        )
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    got = call(importlib.import_module, (name,), {}, timeout=timeout, source=name)
    missing = getattr(got.error, "name", None) if isinstance(got.error, ImportError) else None
    if missing and (name == missing or name.startswith(f"{missing}.")):
        raise InputError(
            name, "", "no such module", "a module importable from the current folder or the venv"
        ) from None
    if got.error is not None:
        raise InputError(
            name,
            "",
            f"importing it raised {one_line(got.error)}",
            "a module that imports without error",
        ) from None
    module: types.ModuleType = got.value
    return module
