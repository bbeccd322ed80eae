"""What kind of head an attention pattern shows, read from its weights alone.

For a head's weights ``A`` [T, T] (rows: queries, summing to 1), three scores, each the mean
weight a query puts on one key, over the queries for which that key is a real choice:

    previous   A[i, i-1], i = 1 .. T-1            the previous token (induction's first half)
    first      A[i, 0],   i = 1 .. T-1            the first token: a sink, or BOS
    self       A[i, i],   i = 1 .. T-1            the token itself: the diagonal

Query 0 is left out of all three: in a causal model it can only attend to itself, the first
token. A head is named by its highest score when that is at least THRESHOLD, else it is mixed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

HeadKind = Literal["previous", "first", "self", "mixed"]
KINDS: tuple[HeadKind, ...] = ("previous", "first", "self")
THRESHOLD = 0.5


@dataclass(frozen=True)
class HeadType:
    """A head's kind and the three scores it was read from."""

    kind: HeadKind
    scores: dict[str, float]


def head_type(weights: np.ndarray[Any, Any]) -> HeadType:
    """The kind of one head from its weights [T, T]."""
    A = np.asarray(weights, dtype=np.float64)
    T = A.shape[-1]
    if T < 2:
        return HeadType("mixed", dict.fromkeys(KINDS, 0.0))
    i = np.arange(1, T)
    scores = {
        "previous": float(A[i, i - 1].mean()),
        "first": float(A[i, 0].mean()),
        "self": float(A[i, i].mean()),
    }
    best = max(KINDS, key=lambda k: scores[k])
    kind: HeadKind = best if scores[best] >= THRESHOLD else "mixed"
    return HeadType(kind, scores)


def head_types(weights: np.ndarray[Any, Any]) -> list[HeadType]:
    """Each head's kind, from a layer's weights [heads, T, T]."""
    return [head_type(w) for w in np.asarray(weights)]
