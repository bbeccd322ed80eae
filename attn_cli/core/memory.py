"""The memory estimate: what a trace will hold at its peak, from the shapes alone."""

from __future__ import annotations

import os
from collections.abc import Collection

from attn_cli.core.inputs import Inputs
from attn_cli.core.limits import BLOCK_ELEMENTS
from attn_cli.errors import InputError

MAX_MEMORY_CAP = 4 * 1024**3


def default_max_memory() -> int:
    """The default budget of a trace: 4 GiB, or half the physical memory when that is less."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not POSIX: no way to ask
        return MAX_MEMORY_CAP
    return min(MAX_MEMORY_CAP, physical // 2) if physical > 0 else MAX_MEMORY_CAP


SCORE_STAGES = ("scores", "scaled", "masked", "softmax")


def memory_needed(inputs: Inputs, keep: Collection[str] | None = None, itemsize: int = 8) -> int:
    """Bytes a trace of ``inputs`` holds at its peak, estimated from the shapes alone.

    ``keep`` names the stages the trace keeps (None: all); ``itemsize`` is 8 for float64. The
    kept score stages, B·H·T·S numbers each, dominate: a 200,000-token sequence needs 320 GB
    for each of them.
    """
    B, H, Hkv, T, S = inputs.batch, inputs.heads, inputs.kv_heads, inputs.seq_q, inputs.seq_k
    D, Dv, E = inputs.d_k, inputs.d_v, inputs.d_out or 0
    given = [inputs.X, inputs.W_Q, inputs.W_K, inputs.W_V, inputs.Q, inputs.K, inputs.V]
    given += [inputs.W_O, inputs.bias, *inputs.expected.values()]
    held = sum(a.nbytes for a in given if a is not None)
    held += 0 if inputs.mask is None else inputs.mask.nbytes
    # 1) Q, K, V: projected, or given (copied only to change precision)
    numbers = B * (H * T * D + Hkv * S * (D + Dv))
    if inputs.mode == "direct" and itemsize == 8:
        numbers = 0
    # 2)-5) the score stages that are kept, and a block of score rows being worked on
    numbers += score_stages_kept(inputs, keep) * B * H * T * S
    numbers += 3 * min(T * S, max(S, BLOCK_ELEMENTS))
    # 6)-7) output, concat, projected
    numbers += B * H * T * Dv * 2 + B * T * E
    return held + itemsize * numbers


def score_stages_kept(inputs: Inputs, keep: Collection[str] | None = None) -> int:
    """How many of scores, scaled, masked, softmax a trace keeps (masked only if it applies)."""
    stages = [s for s in SCORE_STAGES if s != "masked" or _masks(inputs)]
    return len(stages if keep is None else [s for s in stages if s in keep])


def _masks(inputs: Inputs) -> bool:
    """Whether the trace has a ``masked`` stage."""
    return any(x is not None for x in (inputs.causal, inputs.mask, inputs.bias, inputs.lengths))


def check_memory(
    inputs: Inputs,
    max_memory: int | None = None,
    keep: Collection[str] | None = None,
    itemsize: int = 8,
) -> None:
    """Refuse, before any stage is computed, a trace that would need more than ``max_memory``.

    ``max_memory`` None is :func:`default_max_memory`; ``keep`` and ``itemsize`` as for
    :func:`memory_needed`.
    """
    budget = default_max_memory() if max_memory is None else max_memory
    need = memory_needed(inputs, keep, itemsize)
    if need <= budget:
        return
    B, H, T, S = inputs.batch, inputs.heads, inputs.seq_q, inputs.seq_k
    n = score_stages_kept(inputs, keep)
    held = f"{n} score stages each hold" if n > 1 else "the score stage holds" if n else ""
    why = f" ({held} {B * H * T * S:,} numbers: batch {B} x heads {H} x seq_q {T} x seq_k {S})"
    raise InputError(
        inputs.source, "",
        f"tracing it would need about {format_bytes(need)} of memory{why if n else ''}",
        f"at most {format_bytes(budget)}", option="max-memory",
    )  # fmt: skip


def format_bytes(n: int) -> str:
    """A size in binary units: ``512 bytes``, ``1.5 KiB``, ``4.0 GiB``."""
    if n < 1024:
        return f"{n} bytes"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        size /= 1024
        if size < 1024 or unit == "PiB":
            break
    return f"{size:.1f} {unit}"
