"""Limits shared by the loader, the engine and the CLI; importing this costs nothing."""

from __future__ import annotations

DEFAULT_MAX_ELEMENTS = 50_000_000  # numbers in one fixture
DEFAULT_MAX_BYTES = 512 * 1024 * 1024  # size of one fixture file
MAX_INT_DIGITS = 300  # a longer integer literal is no weight anyone meant to write
MAX_NESTING = 16  # lists nested deeper than this are refused before they are walked
SHALLOW = "a mapping of fixture keys holding lists of at most 4 axes"
