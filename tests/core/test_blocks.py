"""The block-size policy's laws: a floor in rows, a cap in bytes, never more rows than queries.

The numbers are integers, so every comparison is exact. Worked examples are computed by hand in
the comments; the laws are checked by hypothesis over any sequence lengths, dtypes and limits.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from attn_cli.core.blocks import MAX_BYTES, MIN_ROWS, TARGET_BYTES, rows_per_block

MiB = 1 << 20
seqs = st.integers(min_value=1, max_value=1 << 20)
itemsizes = st.sampled_from([2, 4, 8])
limits = st.fixed_dictionaries(
    {
        "min_rows": st.integers(min_value=1, max_value=4096),
        "max_bytes": st.integers(min_value=1, max_value=1 << 30),
        "target_bytes": st.integers(min_value=1, max_value=1 << 30),
    }
)
SETTINGS = settings(max_examples=300, deadline=None)


def test_worked_examples() -> None:
    # seq_k 8192, float64: a row is 64 KiB; 8 MiB target = 128 rows < floor 256 -> 256 (16 MiB)
    assert (
        rows_per_block(8192, 8192, 8, min_rows=256, max_bytes=32 * MiB, target_bytes=8 * MiB) == 256
    )
    # seq_k 32768, float64: a row is 256 KiB; floor 256 rows = 64 MiB > cap 32 MiB -> 128 rows
    assert (
        rows_per_block(32768, 32768, 8, min_rows=256, max_bytes=32 * MiB, target_bytes=8 * MiB)
        == 128
    )
    # seq_k 2048, float32: a row is 8 KiB; 8 MiB target = 1024 rows (above the floor, in the cap)
    assert (
        rows_per_block(2048, 2048, 4, min_rows=256, max_bytes=32 * MiB, target_bytes=8 * MiB)
        == 1024
    )
    # 100 queries: never more rows than there are
    assert (
        rows_per_block(100, 2048, 4, min_rows=256, max_bytes=32 * MiB, target_bytes=8 * MiB) == 100
    )
    # one row of 10 MiB under a 1 MiB cap: one row is always allowed
    assert rows_per_block(5, 10 * MiB // 8, 8, min_rows=256, max_bytes=MiB) == 1


def test_defaults_keep_the_measured_floor_up_to_16384() -> None:
    """The floor that the measurements asked for fits the cap at seq 16384 in float64."""
    assert MIN_ROWS * 16384 * 8 <= MAX_BYTES
    assert TARGET_BYTES <= MAX_BYTES
    assert rows_per_block(16384, 16384, 8) == MIN_ROWS


@SETTINGS
@given(seq_q=seqs, seq_k=seqs, itemsize=itemsizes, kw=limits)
def test_between_one_and_seq_q(seq_q: int, seq_k: int, itemsize: int, kw: dict[str, int]) -> None:
    assert 1 <= rows_per_block(seq_q, seq_k, itemsize, **kw) <= seq_q


@SETTINGS
@given(seq_q=seqs, seq_k=seqs, itemsize=itemsizes, kw=limits)
def test_byte_cap(seq_q: int, seq_k: int, itemsize: int, kw: dict[str, int]) -> None:
    """A block never exceeds max_bytes, except a single row (there is no smaller block)."""
    rows = rows_per_block(seq_q, seq_k, itemsize, **kw)
    assert rows == 1 or rows * seq_k * itemsize <= kw["max_bytes"]


@SETTINGS
@given(seq_q=seqs, seq_k=seqs, itemsize=itemsizes, kw=limits)
def test_floor(seq_q: int, seq_k: int, itemsize: int, kw: dict[str, int]) -> None:
    """At least min_rows (or every query), wherever min_rows rows fit under the cap."""
    rows = rows_per_block(seq_q, seq_k, itemsize, **kw)
    if kw["min_rows"] * seq_k * itemsize <= kw["max_bytes"]:
        assert rows >= min(kw["min_rows"], seq_q)


@SETTINGS
@given(seq_q=seqs, seq_k=seqs, itemsize=itemsizes, kw=limits)
def test_no_bigger_than_asked(seq_q: int, seq_k: int, itemsize: int, kw: dict[str, int]) -> None:
    """Above the floor, a block holds no more than target_bytes (the cache-sized goal)."""
    rows = rows_per_block(seq_q, seq_k, itemsize, **kw)
    assert rows <= max(kw["min_rows"], kw["target_bytes"] // (seq_k * itemsize), 1)


@SETTINGS
@given(seq_q=seqs, seq_k=seqs, more=st.integers(1, 1 << 16), itemsize=itemsizes, kw=limits)
def test_monotone(seq_q: int, seq_k: int, more: int, itemsize: int, kw: dict[str, int]) -> None:
    """Longer keys never give more rows; more queries never give fewer."""
    rows = rows_per_block(seq_q, seq_k, itemsize, **kw)
    assert rows_per_block(seq_q, seq_k + more, itemsize, **kw) <= rows
    assert rows_per_block(seq_q + more, seq_k, itemsize, **kw) >= rows
