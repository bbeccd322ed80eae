"""Names and limits shared by the loader and the CLI; importing this costs nothing."""

from __future__ import annotations

STAGE_NAMES = (
    "X", "Q", "K", "V", "scores", "scaled", "masked", "softmax", "output", "concat", "projected",
)  # fmt: skip

DEFAULT_MAX_ELEMENTS = 50_000_000  # numbers in one fixture
DEFAULT_MAX_BYTES = 512 * 1024 * 1024  # size of one fixture file
