"""How many BLAS threads a long run uses: the machine's state, read once per run.

A leaf beside ``errors`` (it imports nothing of attn but errors), so that the block engine stays
free of files and the environment. Measured on 2 shared cores (docs/performance.md): under load
one BLAS thread beats two by 1.5-3.8x; on a quiet machine two win by 1.3-1.4x.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from attn_cli.errors import UsageError

BLAS_MIN_SEQ = 1024  # shorter runs take milliseconds: BLAS is left as it is
# ... unless the run multiplies this much all the same (a deep forward: layers of small products)
BLAS_MIN_WORK = 1 << 30
BUSY_PRESSURE = 20.0  # /proc/pressure/cpu "some avg10" (percent) above which cores are busy
BLAS_THREADS_ENV = "ATTN_BLAS_THREADS"  # a number of threads, or "auto" (the rule above)


@contextmanager
def blas_limit(seq: int, work: int = 0) -> Iterator[None]:
    """BLAS limited to :func:`blas_threads` threads, for runs long enough that it matters: of
    ``seq`` keys from BLAS_MIN_SEQ, or of ``work`` multiply-adds from BLAS_MIN_WORK (a
    forward through whole layers: with a core busy, each of its small products stalls on two
    threads as a long run's do, 13 ms against 0.23 ms for 256 tokens)."""
    long_run = seq >= BLAS_MIN_SEQ or work >= BLAS_MIN_WORK
    threads = blas_threads() if long_run else None
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
    """Threads for BLAS: ``ATTN_BLAS_THREADS``, else the cores no other work holds now (see
    :func:`free_cores`), else None (BLAS keeps its own number, one per core)."""
    given = environ.get(BLAS_THREADS_ENV, "auto").strip().lower()
    if given == "auto":
        return free_cores()
    if not given.isdigit() or int(given) < 1:
        raise UsageError(
            BLAS_THREADS_ENV, "", f"is {given!r}", "a number of threads (1, 2, ...) or auto"
        )
    return int(given)


PROC = ("/proc/pressure/cpu", "/proc/loadavg", "/proc/self/task")
READING_STANDS = 2.0  # seconds one reading of this machine stands for: a run reads it once
_reading: tuple[float, int | None] | None = None  # (when, free cores) of the last reading


def free_cores(
    pressure: str = PROC[0],
    loadavg: str = PROC[1],
    tasks: str = PROC[2],
) -> int | None:
    """The cores this run can have to itself: None when that is all of them, else at least 1.

    Other work holds a core when it is running now: /proc/loadavg's count of runnable tasks less
    this process's own running threads (a BLAS thread may still spin after a product), the
    least of three looks half a millisecond apart (a blip is not load). A busy loop on one
    of two cores leaves one. CPU pressure ("some avg10" above 20%: tasks have been waiting)
    leaves one as well. Without /proc, a 1-minute load average of at least the cores does.
    This machine's reading stands for ``READING_STANDS`` seconds: a decode's pipeline and its
    loop ask once (each look costs a millisecond).
    """
    global _reading
    own = (pressure, loadavg, tasks) == PROC
    if own and _reading is not None and time.monotonic() - _reading[0] < READING_STANDS:
        return _reading[1]
    found = _free_cores(pressure, loadavg, tasks)
    if own:
        _reading = (time.monotonic(), found)
    return found


def _free_cores(pressure: str, loadavg: str, tasks: str) -> int | None:
    cores = _cores()
    if _pressure(pressure) > BUSY_PRESSURE:
        return 1
    others = _others(loadavg, tasks)
    if others is None:
        try:
            return 1 if os.getloadavg()[0] >= cores else None
        except OSError:  # no load average on this system
            return None
    return None if others <= 0 else max(1, cores - others)


def _cores() -> int:
    """The cores this process may run on (its affinity, e.g. a container's CPU set)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1  # pragma: no cover - macOS, Windows


def _pressure(path: str) -> float:
    """CPU pressure "some avg10" in percent (Linux 4.20+), 0 where it cannot be read."""
    try:
        with open(path, encoding="ascii") as f:  # "some avg10=51.00 avg60=..."
            fields = dict(item.split("=", 1) for item in f.readline().split()[1:])
        return float(fields["avg10"])
    except (OSError, KeyError, ValueError):
        return 0.0


def _others(loadavg: str, tasks: str, looks: int = 3) -> int | None:
    """Runnable tasks of other processes now, the least of ``looks``; None without /proc."""
    seen = []
    for look in range(looks):
        if look:
            time.sleep(0.0005)
        try:
            with open(loadavg, encoding="ascii") as f:  # "0.50 0.40 0.30 3/84 1234"
                running = int(f.read().split()[3].split("/")[0])
            mine = sum(_running(entry.path) for entry in os.scandir(tasks))
        except (OSError, IndexError, ValueError):
            return None
        seen.append(running - mine)
    return min(seen)


def _running(task: str) -> bool:
    """Whether thread ``task`` (a /proc/PID/task/TID folder) is running or runnable."""
    try:
        with open(os.path.join(task, "stat"), encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "R"  # "tid (name) R ..."
    except (OSError, IndexError):
        return False  # the thread has ended
