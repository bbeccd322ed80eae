"""How many BLAS threads a long run uses: the machine's state, read once per run.

A leaf beside ``errors`` (it imports nothing of attn but errors), so that the block engine stays
free of files and the environment. Measured on 2 shared cores (docs/performance.md): under load
one BLAS thread beats two by 1.5-3.8x; on a quiet machine two win by 1.3-1.4x.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from attn_cli.errors import UsageError

BLAS_MIN_SEQ = 1024  # shorter runs take milliseconds: BLAS is left as it is
BUSY_PRESSURE = 20.0  # /proc/pressure/cpu "some avg10" (percent) above which cores are busy
BLAS_THREADS_ENV = "ATTN_BLAS_THREADS"  # a number of threads, or "auto" (the rule above)


@contextmanager
def blas_limit(seq: int) -> Iterator[None]:
    """BLAS limited to :func:`blas_threads` threads, for runs long enough that it matters."""
    threads = blas_threads() if seq >= BLAS_MIN_SEQ else None
    if threads is None:
        yield
        return
    try:  # a dependency, imported only here: short runs never pay for it
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - installed with attn
        yield
        return
    with threadpool_limits(limits=threads, user_api="blas"):
        yield


def blas_threads(environ: Mapping[str, str] = os.environ) -> int | None:
    """Threads for BLAS: ``ATTN_BLAS_THREADS``, else 1 when the cores are busy, else None
    (BLAS keeps its own number, one per core)."""
    given = environ.get(BLAS_THREADS_ENV, "auto").strip().lower()
    if given == "auto":
        return 1 if cores_busy() else None
    if not given.isdigit() or int(given) < 1:
        raise UsageError(
            BLAS_THREADS_ENV, "", f"is {given!r}", "a number of threads (1, 2, ...) or auto"
        )
    return int(given)


def cores_busy(pressure: str = "/proc/pressure/cpu") -> bool:
    """Whether other work holds the cores: CPU pressure (Linux 4.20+), else the load average."""
    try:
        with open(pressure, encoding="ascii") as f:  # "some avg10=51.00 avg60=..."
            fields = dict(item.split("=", 1) for item in f.readline().split()[1:])
        return float(fields["avg10"]) > BUSY_PRESSURE
    except (OSError, KeyError, ValueError):
        pass
    try:
        return os.getloadavg()[0] >= (os.cpu_count() or 1)
    except OSError:  # no load average on this system
        return False
