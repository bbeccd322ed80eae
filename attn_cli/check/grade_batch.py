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


def grade_batch(dump: BatchDump, tolerance: Tolerance, worst: int) -> Comparison:
    """Every sequence's outputs (H, T, Dv) against attn's batch of the same fixtures."""
    fixtures = [f for f, _, _ in dump.sequences]
    arrive = tuple(a for _, a, _ in dump.sequences)
    run = run_batch(list(fixtures), arrive, dump.prefill, dump.chunk)
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
    notes = (f"batch: {len(fixtures)} sequences arriving at steps {list(arrive)}, prefill "
             f"{dump.prefill}{chunks}",)  # fmt: skip
    comparison = Comparison(run.traces[0], "dump", dump.source, tolerance, tuple(results),
                            notes=notes)  # fmt: skip
    first = comparison.first_difference
    if first is None:
        return comparison
    leaky = batch_decode(run.result.members, leak=True)
    differing = [j for j, r in enumerate(results) if r.status != "same"]
    if all(_same(dump.sequences[j][2], leaky.outputs(j).astype(np.float64), tolerance)
           for j in differing):  # fmt: skip
        found = Diagnosis(
            name=LEAK[0], title=LEAK[1],
            detail="Recomputing the batch with one causal mask over the packed rows (no "
            "block-diagonal mask: each row also sees every key of the sequences packed before "
            f"it) reproduces every cell of your {first.name} ({tolerance}). Fix: mask each "
            "sequence's block by cu_seqlens_q and cu_seqlens_k, −∞ everywhere else.",
            stage=first.name,
        )  # fmt: skip
        return replace(comparison, diagnoses=(found,))
    return replace(comparison, tried=(LEAK[1],))


def _same(given: FloatArray, value: FloatArray, tol: Tolerance) -> bool:
    return bool(given.shape == value.shape and not cell_errors(given, value, tol)[0].any())
