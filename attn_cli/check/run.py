"""One fixture checked: traced, then written as a golden or compared with one, with its
``expected`` section, or with someone's own dump (graded)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from attn_cli.api import trace_file
from attn_cli.check.compare import Outcome, Tolerance, check_expected, check_golden, write_golden
from attn_cli.core.limits import DEFAULT_MAX_ELEMENTS


def check_fixture(
    fixture: str,
    *,
    golden: Path | None = None,
    against: Path | None = None,
    update: bool = False,
    tolerance: Tolerance,
    stages: Sequence[str] | None = None,
    worst: int = 5,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    backward: bool = False,
) -> Outcome:
    """Trace ``fixture`` and compare it as asked; ``update`` (re)writes ``golden`` instead."""
    result = trace_file(fixture, max_elements=max_elements, backward=backward)
    picked = None if stages is None else tuple(stages)
    if update:
        assert golden is not None
        return Outcome(fixture, written=write_golden(result, golden))
    if against is not None:
        from attn_cli.check.dump import load_dump
        from attn_cli.check.grade import grade

        return Outcome(fixture, grade(result, load_dump(against), tolerance, picked, worst))
    if golden is not None:
        return Outcome(fixture, check_golden(result, golden, tolerance, picked, worst))
    return Outcome(fixture, check_expected(result, tolerance, picked, worst))
