"""Heads and columns: a projection's columns split into heads, and heads side by side again.

Head h owns the contiguous columns h*d:(h+1)*d, as torch's ``view(B, T, H, D)`` lays them out.
Axis names as in steps.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FloatArray = np.ndarray[Any, np.dtype[np.float64]]


def split_heads(x: FloatArray, heads: int) -> FloatArray:
    """Contiguous column blocks become heads: head h owns columns h*d:(h+1)*d."""
    B, T, width = x.shape
    split = x.reshape(B, T, heads, width // heads)  # (B, T, H, D)
    heads_first: FloatArray = split.transpose(0, 2, 1, 3)  # (B, H, T, D)
    return heads_first


def merge_heads(x: FloatArray) -> FloatArray:
    """Heads side by side, the inverse of split_heads: head h fills columns h*d:(h+1)*d."""
    B, H, T, D = x.shape
    merged: FloatArray = x.transpose(0, 2, 1, 3).reshape(B, T, H * D)  # (B, T, H*D)
    return merged
