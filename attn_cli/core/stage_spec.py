"""A row of the stage table (core/stages.py) and the layouts rows share. No NumPy: the table
and the variants that add rows to it (core/variant.py) both import it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs

SCORE_AXES = ("batch", "head", "query", "key")
Q_AXES = ("batch", "head", "query", "d_k")
K_AXES = ("batch", "kv_head", "key", "d_k")
OUT_AXES = ("batch", "head", "query", "d_v")


class StageSpec(NamedTuple):
    """One row of the stage table."""

    name: str
    needs: tuple[str, ...]  # the stages it is computed from (those that apply)
    axes: tuple[str, ...]  # its layout, batch axis first
    score_like: bool  # a (query, key) matrix per head
    explain: str  # the key of its explanation (present/explain.py)
    applies: Callable[[Inputs], bool]
    formula: Callable[[Inputs], str]
    opt_in: bool = False  # computed only when asked for by name (``run(keep=...)``)
    gradient: bool = False  # a stage of the backward pass: only with ``run(backward=True)``


def number_text(x: float) -> str:
    """A number as a formula writes it: ``−∞``, ``1e-06``, ``−2``."""
    return "−∞" if x == -math.inf else f"{x:g}".replace("-", "−")
