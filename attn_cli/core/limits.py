"""Names and limits shared by the loader and the CLI; importing this costs nothing."""

from __future__ import annotations

STAGE_NAMES = (
    "X", "Q", "K", "V", "scores", "scaled", "masked", "softmax", "output", "concat", "projected",
)  # fmt: skip

DEFAULT_MAX_ELEMENTS = 50_000_000  # numbers in one fixture
DEFAULT_MAX_BYTES = 512 * 1024 * 1024  # size of one fixture file
# One block of the score stages holds about this many numbers (4 MiB in float64): big enough
# for BLAS to run at full speed, small enough that a block stays in cache between the steps.
# The memory estimate in fixture.py counts on it too.
BLOCK_ELEMENTS = 1 << 19
