"""``attn flash --split-kv S`` run on a fixture: core/split_kv.py's chunks and merge, checked
against the trace as flash is (runs.py's ``flash_checks``), and the merge in two more orders
(a left fold, a tree) checked against it too.

Axis names as in core/flash.py: B batch, H query heads, T queries, Dv d_v; n chunks.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from attn_cli.blas import blas_limit
from attn_cli.check.references import (
    SelfCheck,
    check_failure,
    finite_max,
    reference_rows,
    self_check,
)
from attn_cli.check.runs import (
    RUN_HTML_VIEWS,
    AnyArray,
    default_block,
    flash_args,
    flash_checks,
    flash_keep,
    load_trace,
    refuse_blocks,
)
from attn_cli.core.chain import Chain
from attn_cli.core.pipeline import refuse as refuse_variants
from attn_cli.core.variant import FlashMaps
from attn_cli.errors import ComputeError, UsageError

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.core.pipeline import Dtype, Trace
    from attn_cli.core.split_kv import SplitResult


@dataclass(frozen=True, eq=False)
class SplitRun:
    """A fixture through split-KV: the chunks, the merges and the checks."""

    trace: Trace
    result: SplitResult
    splits: int
    block_q: int
    block_k: int | None  # None: each chunk in one key block
    checks: tuple[SelfCheck, ...]
    sentinel: float | None = None  # the fixture's finite mask_value, replaced by −∞

    @property
    def base2(self) -> bool:
        return self.result.base2

    @property
    def output(self) -> AnyArray:
        return self.result.merged.output

    @property
    def lse(self) -> AnyArray:
        return self.result.merged.lse

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def _repr_html_(self) -> str | None:
        """The interactive page in a notebook cell, once a page registers (RUN_HTML_VIEWS)."""
        view = RUN_HTML_VIEWS.get("split_kv")
        return None if view is None else view(self)


def refuse_split(inputs: Inputs, splits: int) -> None:
    """FlashAttention's refusals, a second softmax map (diff), more chunks than keys."""
    refuse_variants(inputs, "FlashAttention")
    for v, _ in Chain(inputs).on:
        if isinstance(v, FlashMaps):
            raise UsageError(
                inputs.source,
                v.name,
                "split-KV merges one softmax map, and this variant has a second",
                "attn flash without --split-kv",
                option="split-kv",
            )
    if not 1 <= splits <= inputs.seq_k:
        raise UsageError(
            inputs.source,
            "split-kv",
            f"is {splits}, but the fixture has {inputs.seq_k} keys",
            f"a whole number of chunks from 1 to {inputs.seq_k}",
            option="split-kv",
        )


def split_bytes(inputs: Inputs, splits: int) -> int:
    """What the chunks hold beside the trace: each chunk's O, m, l and lse, the weights."""
    rows = inputs.batch * inputs.heads * inputs.seq_q
    return 8 * rows * (splits * (inputs.d_v + 4) + 3 * (inputs.d_v + 1))


def run_split(
    fixture: str | os.PathLike[str] | None,
    *,
    splits: int,
    block_q: int | None = None,
    block_k: int | None = None,
    base2: bool = False,
    dtype: Dtype = "float64",
    max_elements: int | None = None,
    max_memory: int | None = None,
) -> SplitRun:
    """The fixture's keys in ``splits`` chunks through flash's loop, merged and checked."""

    def refuse(inputs: Inputs) -> None:
        refuse_split(inputs, splits)
        refuse_blocks({"block-q": block_q, "block-k": block_k})

    trace, sentinel = load_trace(
        fixture,
        flash_keep,
        refuse=refuse,
        dtype=dtype,
        max_elements=max_elements,
        max_memory=max_memory,
        extra_bytes=lambda inp: split_bytes(inp, splits),
    )
    bq = block_q or default_block(trace.inputs.seq_q)
    quiet = np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore")
    with quiet, blas_limit(trace.inputs.seq_k):
        return check_split(trace, splits, bq, block_k, base2, sentinel)


def check_split(
    trace: Trace,
    splits: int,
    bq: int,
    bk: int | None,
    base2: bool,
    sentinel: float | None = None,
) -> SplitRun:
    """The chunks and the merges, then the one-shot merge checked as flash's O and L are, and
    the fold and the tree against the trace's rows and against each other."""
    from attn_cli.core.flash import LOG2E
    from attn_cli.core.split_kv import split_kv_forward

    args = flash_args(trace)  # the same q, k, v, chain, scale and offset as flash's
    result = split_kv_forward(**args, splits=splits, block_q=bq, block_k=bk, base2=base2)
    merged = result.merged
    checks = list(flash_checks(trace, merged.output, merged.lse, base2))  # type: ignore[arg-type]
    ref_o, ref_L = reference_rows(trace, args["q"], args["k"], args["v"])
    f32 = trace.dtype == "float32"
    scores = finite_max(ref_L) + math.log(trace.inputs.seq_k)
    to_e = np.asarray(1 / LOG2E if base2 else 1.0, merged.lse.dtype)
    for name, (lse, out) in (("fold", result.fold), ("tree", result.tree)):
        checks += [
            self_check(f"output_{name}", out, ref_o, scores, f32),
            self_check(f"lse_{name}", lse * to_e, ref_L, scores, f32),
        ]
    (lse_f, out_f), (lse_t, out_t) = result.fold, result.tree
    checks += [
        self_check("orders_output", out_f, out_t, scores, f32),
        self_check("orders_lse", lse_f, lse_t, scores, f32),
    ]
    return SplitRun(trace, result, splits, bq, bk, tuple(checks), sentinel)


def split_failure(run: SplitRun) -> ComputeError | None:
    """The error to raise when a merge left the trace's numbers (None: all within)."""
    return check_failure(run.trace, run.checks, "split-KV's")
