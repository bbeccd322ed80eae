"""The grader of someone's own continuous batch: each sequence's outputs against core/batch.py's
run of the same fixtures, arrivals, prefill and chunks (check/batch_runs.py), and the mistake of
a ragged mask that leaks across sequences named only when its recomputation reproduces them.

Axes: H heads, T a sequence's tokens, Dv d_v.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from attn_cli.check.batch_runs import run_batch
from attn_cli.check.compare import Comparison, Diagnosis, StageResult, Tolerance, cell_errors
from attn_cli.check.compare import compare_stage as compare_one
from attn_cli.check.dump import BatchDump
from attn_cli.core.batch import batch_decode
from attn_cli.core.inputs import FloatArray

LEAK = (
    "ragged_mask_leak",
    "one causal mask over the packed rows (a sequence sees the keys of those packed before it)",
)
NO_COPY = (
    "shared_page_written_without_copy",
    "a shared page written without copying it first (the other sequences read the new token)",
)
DETAILS = {
    LEAK[0]: "Recomputing the batch with one causal mask over the packed rows (no "
    "block-diagonal mask: each row also sees every key of the sequences packed before it) "
    "reproduces every cell of your {stage} ({tol}). Fix: mask each sequence's block by "
    "cu_seqlens_q and cu_seqlens_k, −∞ everywhere else.",
    NO_COPY[0]: "Recomputing the paged batch with every write going straight into its block's "
    "page, shared or not, reproduces every cell of your {stage} ({tol}): a sequence's own token "
    "overwrote a row of a page another sequence reads. Fix: when the page's reference count is "
    "above 1, copy it to a free page, point the block at the copy, then write (copy on write).",
}


def grade_batch(dump: BatchDump, tolerance: Tolerance, worst: int) -> Comparison:
    """Every sequence's outputs (H, T, Dv) against attn's batch of the same fixtures."""
    fixtures = [f for f, _, _ in dump.sequences]
    arrive = tuple(a for _, a, _ in dump.sequences)
    paged = None if dump.block_size is None else (dump.block_size, None)
    run = run_batch(
        list(fixtures), arrive, dump.prefill, dump.chunk, paged=paged, share=dump.share_prefix
    )
    axes = ("head", "token", "d_v")
    results = []
    for j, (_, _, given) in enumerate(dump.sequences):
        name = f"output {run.names[j]}"
        ref = run.result.outputs(j).astype(np.float64)  # (H, T, Dv)
        if given.shape != ref.shape:
            results.append(StageResult(name, "shape", axes, tuple(ref.shape), tuple(given.shape)))
        else:
            results.append(compare_one(name, axes, ref, given, tolerance, worst))
    chunks = "" if dump.chunk is None else f" in chunks of {dump.chunk}"
    notes = (
        f"batch: {len(fixtures)} sequences arriving at steps {list(arrive)}, prefill "
        f"{dump.prefill}{chunks}",
    )
    comparison = Comparison(
        run.traces[0], "dump", dump.source, tolerance, tuple(results), notes=notes
    )
    first = comparison.first_difference
    if first is None:
        return comparison
    r = run.result
    candidates = [(LEAK, batch_decode(r.members, leak=True, paging=r.paging, share=r.share))]
    if r.paging is not None and r.share:
        candidates.append(
            (NO_COPY, batch_decode(r.members, paging=r.paging, share=True, no_copy=True))
        )
    differing = [j for j, res in enumerate(results) if res.status != "same"]
    for (name, title), wrong in candidates:
        if all(
            _same(dump.sequences[j][2], wrong.outputs(j).astype(np.float64), tolerance)
            for j in differing
        ):
            detail = DETAILS[name].format(stage=first.name, tol=tolerance)
            found = Diagnosis(name=name, title=title, detail=detail, stage=first.name)
            return replace(comparison, diagnoses=(found,))
    return replace(comparison, tried=tuple(title for (_, title), _ in candidates))


def _same(given: FloatArray, value: FloatArray, tol: Tolerance) -> bool:
    return bool(given.shape == value.shape and not cell_errors(given, value, tol)[0].any())
