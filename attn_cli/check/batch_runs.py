"""``attn decode F1 F2 ... --batch``: several fixtures decoded as one continuous batch
(core/batch.py), every sequence's every row checked against its own decode and against the full
attention's rows.

Each fixture is a sequence of the batch; they must share the model's shapes (heads, kv_heads,
d_k, d_v, scale, the kind of cache), checked before anything is computed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli.blas import blas_limit
from attn_cli.check.references import (
    F64_TOLERANCE,
    max_abs_diff,
)
from attn_cli.check.runs import (
    decode_args,
    decode_bytes,
    decode_keep,
    decode_reference,
    load_trace,
    refuse_decode,
)
from attn_cli.core.batch import BatchResult, Member, batch_decode
from attn_cli.core.chain import Chain
from attn_cli.core.decode import decode, step_out
from attn_cli.errors import ComputeError, InputError, UsageError

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.core.pipeline import Trace

MAX_SEQUENCES = 256
MAX_ARRIVE = 1_000_000  # steps


@dataclass(frozen=True, eq=False)
class BatchRun:
    """A batch decoded: each sequence's trace and name, the steps, the two checks per token."""

    traces: tuple[Trace, ...]
    names: tuple[str, ...]
    result: BatchResult
    solo: tuple[tuple[float, ...], ...]  # per sequence, per token: max |batch − its own decode|
    full: tuple[tuple[float, ...], ...]  # per sequence, per token: max |batch − full row|
    fixtures: tuple[str, ...] = ()  # each fixture as given (a path or an example's name)
    # a paged batch: per sequence, per token, max |paged batch − the batch of contiguous caches|
    contiguous: tuple[tuple[float, ...], ...] | None = None
    tolerance: float = F64_TOLERANCE

    @property
    def trace(self) -> Trace:
        """The first sequence's trace: the model's shapes every sequence shares (a page's)."""
        return self.traces[0]

    @property
    def worst(self) -> float:
        near = self.contiguous or ((0.0,),)
        return max(
            max(max((*a, *b)) for a, b in zip(self.solo, self.full, strict=True)),
            max(max(c) for c in near),
        )

    @property
    def ok(self) -> bool:
        return self.worst <= self.tolerance

    @property
    def per_token(self) -> int:
        """Bytes of K and V a token slot takes in the pool (float64): its cache's row."""
        m = self.result.members[0]
        return int(m.k.shape[1] * (m.k.shape[3] + m.v.shape[3]) * 8)

    def label(self, j: int, token: int) -> str:
        """``j:token``: sequence j's token, as the packed rows and keys are labelled."""
        return f"{j}:{self.traces[j].query_labels[token]}"


def refuse_batch(inputs: Inputs) -> None:
    """A batch packs KV caches of one softmax map, one sequence a fixture."""
    why = (
        "a batch packs the KV caches of one softmax map, and this decode keeps none (a recurrent "
        "state or two maps: a loop of its own)"
    )
    Chain(inputs).refuse_own_loop(why, "a fixture of softmax attention with one map", "batch")
    if inputs.batch > 1:
        raise UsageError(
            inputs.source,
            "batch",
            f"has {inputs.batch} items",
            "one sequence a fixture (a batch packs one sequence from each)",
            option="batch",
        )


def _refuse(inputs: Inputs) -> None:
    refuse_decode(inputs)
    refuse_batch(inputs)


def parse_arrive(text: str | None, n: int) -> tuple[int, ...]:
    """``0,2,3``: the step at which each of the n fixtures joins (None: all at step 0)."""
    if text is None:
        return (0,) * n
    items = text.split(",")
    if len(items) != n:
        raise UsageError(
            "",
            "arrive",
            f"gives {len(items)} steps for {n} fixtures",
            f"{n} whole numbers, one per fixture, as 0,2,3",
            option="arrive",
        )
    out = []
    for i, item in enumerate(items):
        item = item.strip()
        if not (item.isascii() and item.isdigit()) or int(item) > MAX_ARRIVE:
            raise UsageError(
                "",
                "arrive",
                f"item {i + 1} is {item[:20]!r}",
                f"a whole number of steps from 0 to {MAX_ARRIVE:,}",
                option="arrive",
            )
        out.append(int(item))
    return tuple(out)


SHAPES = ("heads", "kv_heads", "d_k", "d_v")


def _same_shapes(traces: list[Trace], forms: list[bool]) -> None:
    """Every fixture has the first one's shapes: else one line naming both and the shape."""
    first = traces[0]
    for t, latent in zip(traces[1:], forms[1:], strict=True):
        pairs = [(name, getattr(t.inputs, name), getattr(first.inputs, name)) for name in SHAPES]
        pairs += [("scale", t.scale, first.scale), ("latent cache", latent, forms[0])]
        for name, got, want in pairs:
            if got != want:
                raise UsageError(
                    t.inputs.source,
                    name,
                    f"is {got:g}" if isinstance(got, float) else f"is {got}",
                    f"{want} as in {first.inputs.source} (a batch runs one model's shapes)",
                    option="batch",
                )


def run_batch(
    fixtures: list[str | os.PathLike[str]],
    arrive: tuple[int, ...],
    prefill: int = 1,
    chunk: int | None = None,
    *,
    max_elements: int | None = None,
    max_memory: int | None = None,
    paged: tuple[int | None, int | None] | None = None,
    share: bool = False,
) -> BatchRun:
    """Decode the fixtures as one continuous batch, each joining at its ``arrive`` step with a
    prefill of ``prefill`` tokens (at most its own) in chunks of ``chunk`` rows; ``paged``
    (block size, pages; None in either: the default): every cache in one pool of pages,
    ``share``: a joining prompt's whole pages shared with the sequences that hold them."""
    if not 1 <= len(fixtures) <= MAX_SEQUENCES:
        raise UsageError(
            "",
            "batch",
            f"{len(fixtures):,} fixtures",
            f"1 to {MAX_SEQUENCES} sequences in a batch",
            option="batch",
        )
    assert len(arrive) == len(fixtures)
    traces = []
    for fixture in fixtures:
        trace, _ = load_trace(
            fixture,
            decode_keep,
            refuse=_refuse,
            max_elements=max_elements,
            max_memory=max_memory,
            extra_bytes=lambda inp: 2 * decode_bytes(inp, min(prefill, inp.seq_q)),
        )
        traces.append(trace)
    args = [decode_args(t) for t in traces]
    _same_shapes(traces, [a.form is not None for a in args])
    names = _names(traces)
    members = [
        _member(n, a, arrive[j], min(prefill, t.inputs.seq_q), chunk)
        for j, (n, a, t) in enumerate(zip(names, args, traces, strict=True))
    ]
    _refuse_memory(traces[0], members, paged is not None, max_memory)
    quiet = np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore")
    with quiet, blas_limit(sum(t.inputs.seq_q for t in traces)):
        result = batch_decode(members)
        contiguous = None
        if paged is not None:
            plain = result
            result = _paged(traces[0], members, paged, share)
            contiguous = tuple(
                tuple(
                    max_abs_diff(result.outputs(j)[:, i], plain.outputs(j)[:, i])
                    for i in range(m.tokens)
                )
                for j, m in enumerate(members)
            )
        solo, full = [], []
        for j, (t, a, m) in enumerate(zip(traces, args, members, strict=True)):
            got = result.outputs(j)  # (H, T, Dv)
            alone = _solo(a, m.prefill)
            ref = decode_reference(t, a)[0]  # (H, T, Dv)
            solo.append(tuple(max_abs_diff(got[:, i], alone[:, i]) for i in range(m.tokens)))
            full.append(tuple(max_abs_diff(got[:, i], ref[:, i]) for i in range(m.tokens)))
    return BatchRun(
        tuple(traces),
        names,
        result,
        tuple(solo),
        tuple(full),
        tuple(str(f) for f in fixtures),
        contiguous,
    )


def _paged(
    first: Trace, members: list[Member], paged: tuple[int | None, int | None], share: bool
) -> BatchResult:
    """The batch with every cache in one pool: the block size checked, the pool as many pages
    as the batch holds at once (a pool given too small refused, saying how many)."""
    from attn_cli.check.paged_runs import MAX_BLOCK, MAX_PAGES, default_block
    from attn_cli.core.paged import Paging

    src = first.inputs.source
    block_size, pages = paged
    bs = default_block(max(m.tokens for m in members)) if block_size is None else block_size
    if not 1 <= bs <= MAX_BLOCK:
        raise UsageError(
            src, "block-size", f"is {bs}", f"1 to {MAX_BLOCK:,} tokens a page", option="block-size"
        )
    if pages is not None and not 1 <= pages <= MAX_PAGES:
        raise UsageError(src, "pages", f"is {pages}", f"1 to {MAX_PAGES:,} pages", option="pages")
    enough = sum(-(-m.tokens // bs) for m in members)  # no sequence holds more than its own
    result = batch_decode(members, paging=Paging(bs, enough), share=share)
    if pages is None:
        pages = result.peak
    elif pages < result.peak:
        raise UsageError(
            src,
            "pages",
            f"a pool of {pages} is too small (the batch holds {result.peak} pages of {bs} at once)",
            f"at least {result.peak}",
            option="pages",
        )
    return batch_decode(members, paging=Paging(bs, pages), share=share)


def _refuse_memory(
    first: Trace, members: list[Member], paged: bool, max_memory: int | None
) -> None:
    """Each step keeps its packed scores, masked scores and weights (heads × rows × keys): the
    batch is refused in one line, before it runs, when they pass the memory budget."""
    from attn_cli.core.batch import packed_cells
    from attn_cli.core.memory import default_max_memory, format_bytes

    heads = int(members[0].q.shape[1])
    need = 8 * 3 * heads * packed_cells(members) * (2 if paged else 1)
    budget = default_max_memory() if max_memory is None else max_memory
    if need > budget:
        raise InputError(
            first.inputs.source,
            "",
            f"this batch's step tables would need about {format_bytes(need)} of memory",
            f"at most {format_bytes(budget)}",
            option="max-memory",
        )


def _names(traces: list[Trace]) -> tuple[str, ...]:
    """Each sequence's name: its fixture file's stem, numbered when two fixtures share one."""
    names: list[str] = []
    for t in traces:
        base = os.path.splitext(os.path.basename(t.inputs.source))[0] or "seq"
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}#{n}"
        names.append(name)
    return tuple(names)


def _member(name: str, a: Any, arrive: int, prefill: int, chunk: int | None) -> Member:
    """A sequence of the batch: its q and k rotated whole at their positions (each token's
    numbers as a cache keeps them), its chain, scale and the form's finish."""
    q, k = a.q, a.k
    if a.rotate_q is not None:
        q = a.rotate_q(q, a.positions)  # (B, H, T, D)
    if a.rotate is not None:
        k = a.rotate(k, a.positions)  # (B, Hkv, T, D)
    finish = None if a.form is None else a.form.finish
    return Member(
        name, q, k, a.v, a.chain, a.scale, a.positions, arrive, prefill, chunk, finish, a.after
    )


def _solo(a: Any, prefill: int) -> Any:
    """The sequence decoded alone (core/decode.py), every token's row, (H, T, Dv)."""
    r = decode(a.q, a.k, a.v, prefill=prefill, **a.kwargs())
    final = a.chain.joined
    first = r.prefill_outs.get(final, r.prefill_output)[0]  # (H, P, Dv)
    rest = [step_out(s, final)[0] for s in r.steps]  # (H, 1, Dv) each
    return np.concatenate([first, *rest], axis=1)


def batch_failure(run: BatchRun) -> ComputeError | None:
    """The error to raise when a row left its own decode or the full row (None: all within)."""
    if run.ok:
        return None
    for j, (a, b) in enumerate(zip(run.solo, run.full, strict=True)):
        worst = max((*a, *b))
        if worst > run.tolerance:
            return ComputeError(
                run.traces[j].inputs.source,
                f"sequence {run.names[j]}",
                f"the batch's rows differ from its own decode or the full rows by {worst:.3e}",
                f"at most {run.tolerance:g}",
            )
    return None
