"""How many query rows one block of the score stages holds, chosen from measurements (issue 16).

The score stages are computed a block of query rows of one head at a time: one (n, S) GEMM for
the scores, the softmax passes over the block, one (n, S) @ (S, Dv) GEMM for the output. Three
numbers decide n (measured by benchmarks/block_sizes.py, d_model 512, 8 heads, 2 shared cores):

- ``TARGET_BYTES``: a block this big stays in the last-level cache between the softmax passes;
  blocks of 32-64 MiB ran 1.4-1.7x slower than 4-16 MiB ones at seq 2048-4096.
- ``MIN_ROWS``: at long sequences the target leaves 32-64 rows, i.e. thousands of small GEMM
  calls, each a rendezvous of the BLAS threads; below this many rows the calls cost more than
  the cache saves, so the floor wins over the target.
- ``MAX_BYTES``: the floor never makes a block bigger than this (the memory estimate counts on
  it); the cap wins over the floor, and one row is always allowed.
"""

from __future__ import annotations

TARGET_BYTES = 8 << 20
MIN_ROWS = 256
MAX_BYTES = 32 << 20


def rows_per_block(
    seq_q: int,
    seq_k: int,
    itemsize: int,
    *,
    min_rows: int = MIN_ROWS,
    max_bytes: int = MAX_BYTES,
    target_bytes: int = TARGET_BYTES,
) -> int:
    """Rows per block: ``target_bytes`` worth, at least ``min_rows``, at most ``max_bytes``."""
    row_bytes = max(seq_k, 1) * itemsize  # one query row of one score stage
    rows = max(target_bytes // row_bytes, min_rows)  # the floor wins over the target
    rows = min(rows, max_bytes // row_bytes)  # the cap wins over the floor
    return max(1, min(rows, seq_q))
