"""The JSON of ``attn flash --split-kv S``: flash's document (``"format": "attn-flash"``, read
by ``attn check`` as a flash dump) with the chunks and the merge in place of the tiles.

``{"format": "attn-flash", "version": 1, ..., "split_kv": S, "block_q", "block_k", "base2",
"lse_base", "checks": [...], "chunks": [{"keys": [s0, s1], "m", "l", "lse", "O"}], "merge":
{"extra", "m_star", "weights"}, "orders": {"left_fold": {"output", "lse"}, "tree": {...}},
"stages": {"output", "lse"}}``: m, l, lse, m_star ([batch,] heads, queries), O and output
([batch,] heads, queries, d_v), weights ([batch,] heads, queries, chunks [+ 1 for the
extra logit], each row summing to 1); ``block_k`` null: each chunk in one key block.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from attn_cli.core.pipeline import Trace
from attn_cli.core.split_kv import SplitResult
from attn_cli.io.decode_json import (
    FLASH_FORMAT,
    CheckLike,
    array_lines,
    checks_json,
    close_last,
    document_head,
    mapping,
)
from attn_cli.io.decode_json import stages_lines as stages_text
from attn_cli.io.trace_json import json_text


class SplitRunLike(Protocol):
    """What the split-KV JSON reads (check/split_runs.py's SplitRun)."""

    @property
    def trace(self) -> Trace: ...
    @property
    def result(self) -> SplitResult: ...
    @property
    def splits(self) -> int: ...
    @property
    def block_q(self) -> int: ...
    @property
    def block_k(self) -> int | None: ...
    @property
    def checks(self) -> tuple[CheckLike, ...]: ...
    @property
    def sentinel(self) -> float | None: ...


def split_dumps(run: SplitRunLike) -> str:
    """The chunks, the merge, the two orders, then O and L, as JSON text."""
    trace, result = run.trace, run.result
    public = _public(trace.inputs.has_batch)
    head = document_head(trace, FLASH_FORMAT)
    head.update(
        key_tokens=list(trace.key_labels),
        split_kv=run.splits,
        block_q=run.block_q,
        block_k=run.block_k,
        base2=result.base2,
        lse_base="2" if result.base2 else "e",
        checks=checks_json(run.checks),
        mask_value_replaced=run.sentinel,
    )
    lines = ["{", *mapping(head, 2), '  "chunks": [']
    for n, c in enumerate(result.chunks):
        arrays = {"m": c.m, "l": c.l, "lse": c.lse, "O": c.output}
        lines += ["    {", f'      "keys": {json_text(list(c.keys))},']
        lines += close_last(_arrays(arrays, public, 6))
        lines.append("    }" + ("," if n < len(result.chunks) - 1 else ""))
    lines += ["  ],", '  "merge": {']
    m = result.merged
    extra = None if result.extra is None else result.extra
    weights = np.moveaxis(m.weights, 0, -1)  # (B, H, T, n): the batch axis first, to drop it
    merge = {"extra": extra, "m_star": m.m_star, "weights": weights}
    lines += close_last(_arrays(merge, public, 4))
    lines += ["  },", '  "orders": {']
    for name, (lse, out) in (("left_fold", result.fold), ("tree", result.tree)):
        lines.append(f"    {json_text(name)}: {{")
        lines += close_last(_arrays({"output": out, "lse": lse}, public, 6))
        lines.append("    }" + ("," if name == "left_fold" else ""))
    lines.append("  },")
    lines += stages_text([("output", public(m.output)), ("lse", public(m.lse))], 2)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _public(has_batch: bool) -> Any:
    """Drop the batch axis (the first) when the fixture has none."""
    return lambda a: np.asarray(a) if has_batch else np.asarray(a)[0]


def _arrays(arrays: dict[str, Any], public: Any, indent: int) -> list[str]:
    """``"name": array,`` lines (null for None), each array without the batch axis when the
    fixture has none."""
    return array_lines({k: None if v is None else public(v) for k, v in arrays.items()}, indent)
