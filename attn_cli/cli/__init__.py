"""The ``attn`` command line: one thin module per command; ``main`` is the console script."""

import gc


def main() -> None:
    """The ``attn`` console script and ``python -m attn_cli``: :func:`attn_cli.cli.app.main`,
    without Python's cyclic garbage collector.

    A run makes some 50,000 long-lived objects as it imports Typer, NumPy and Rich, and leaves
    about 600 unreachable ones behind (measured for trace, check, decode, flash and an npz run);
    the collector's passes over the long-lived ones cost ~10 ms of each run and free nothing.
    The step-mode pagers, which wait on a person, turn it back on (:func:`collect_as_usual`).
    Importing :mod:`attn_cli.cli.app` (the tests, your code) leaves the collector alone.

    On the way out every object left is frozen (``gc.freeze``): Python's shutdown runs one more
    full collection even with the collector off, a pass over everything still alive that cost
    ~40 ms of a 1,024-token ``attn decode`` (52 ms at exit, 12 ms frozen) and frees nothing the
    end of the process does not. Objects are still released by reference counting; atexit
    handlers still run.
    """
    gc.disable()
    from attn_cli.cli.app import main as run

    try:
        run()
    finally:
        gc.freeze()


def collect_as_usual() -> None:
    """Cyclic garbage collection back on: for the parts of a run that last as long as a person
    wants them to (step mode)."""
    gc.enable()


__all__ = ["collect_as_usual", "main"]
