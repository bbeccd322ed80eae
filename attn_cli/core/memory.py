"""The memory estimate: what a trace will hold at its peak, from the shapes alone."""

from __future__ import annotations

import math
import os
from collections.abc import Collection
from typing import Literal

from attn_cli.core.blocks import rows_per_block
from attn_cli.core.inputs import Inputs
from attn_cli.core.stages import STAGES
from attn_cli.errors import InputError

MAX_MEMORY_CAP = 4 * 1024**3
# How a trace leaves the process: held whole (tables, the Python API), or streamed to a file.
Written = Literal["held", "npz", "json"]
WRITTEN: tuple[Written, ...] = ("held", "npz", "json")
NPZ_BUFFER = 16 << 20  # numpy's write_array copies a non-contiguous stage through this
JSON_CHUNK = 4 << 20  # text formatted before it is written (1 Mi characters), and its bytes
JSON_ROW_BYTES = 128  # per number of one row being formatted: a float object, its text, twice


def default_max_memory() -> int:
    """The default budget of a trace: 4 GiB, or half the physical memory when that is less."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not POSIX: no way to ask
        return MAX_MEMORY_CAP
    return min(MAX_MEMORY_CAP, physical // 2) if physical > 0 else MAX_MEMORY_CAP


def memory_needed(
    inputs: Inputs,
    keep: Collection[str] | None = None,
    itemsize: int = 8,
    backward: bool = False,
    written: Written = "held",
) -> int:
    """Bytes a trace of ``inputs`` holds at its peak, estimated from the shapes alone.

    ``keep`` names the stages the trace keeps (None: all); ``itemsize`` is 8 for float64. The
    kept score stages, B·H·T·S numbers each, dominate: a 200,000-token sequence needs 320 GB
    for each of them. ``backward`` adds the gradient stages and what the backward pass holds.
    ``written`` "npz" or "json" prices a trace streamed to a file (pipeline.run_streamed): its
    score stages cost a block each, plus what the writer formats at a time.
    """
    B, H, Hkv, T, S = inputs.batch, inputs.heads, inputs.kv_heads, inputs.seq_q, inputs.seq_k
    D, Dv, E = inputs.d_k, inputs.d_v, inputs.d_out or 0
    given = [inputs.X, inputs.W_Q, inputs.W_K, inputs.W_V, inputs.Q, inputs.K, inputs.V]
    given += [inputs.W_O, inputs.bias, *inputs.expected.values(), inputs.X_kv, inputs.grad]
    held = sum(a.nbytes for a in given if a is not None)
    held += 0 if inputs.mask is None else inputs.mask.nbytes
    # 1) Q, K, V: projected, or given (copied only to change precision)
    numbers = B * (H * T * D + Hkv * S * (D + Dv))
    if inputs.mode == "direct" and itemsize == 8:
        numbers = 0
    # 2)-3) the Q/K transforms' stages (Q_norm and K_norm, Q_rot and K_rot): each as big as Q, K
    from attn_cli.core.chain import Chain  # NumPy: memory.py itself imports none

    chain = Chain(inputs)
    q_stages, k_stages = len(chain.transforms_of("Q")), len(chain.transforms_of("K"))
    numbers += B * D * (H * T * q_stages + Hkv * S * k_stages)
    # 4)-8) the score stages that are kept, lse, and the blocks of score rows being worked on
    whole = not streams(inputs, keep, backward, written)
    numbers += whole * score_stages_kept(inputs, keep) * B * H * T * S
    numbers += B * H * T if keep is not None and "lse" in keep else 0
    blocks = 3 + 2 * len(chain.bias_stages) + (inputs.mask_value != -math.inf)  # ALiBi's: 2
    numbers += blocks * rows_per_block(T, S, itemsize) * S
    # 9) output, concat, projected
    numbers += B * H * T * Dv * 2 + B * T * E
    if backward:
        numbers += backward_numbers(inputs, keep)
    return held + itemsize * numbers + writer_bytes(S, written)


def streams(inputs: Inputs, keep: Collection[str] | None, backward: bool, written: Written) -> bool:
    """Whether the score stages are streamed, not held: written to a file, and no gradient
    stage kept (the backward pass reads them whole)."""
    if written == "held":
        return False
    grads = [s.name for s in STAGES if s.gradient and s.applies(inputs)]
    return not backward or not any(keep is None or g in keep for g in grads)


def writer_bytes(seq_k: int, written: Written) -> int:
    """What the writer holds besides the trace: numpy's copy buffer, or a row of text."""
    if written == "npz":
        return NPZ_BUFFER
    if written == "json":
        return JSON_CHUNK + JSON_ROW_BYTES * seq_k
    return 0


def backward_numbers(inputs: Inputs, keep: Collection[str] | None = None) -> int:
    """Numbers the backward pass adds: its (T, S) arrays whole, and gradients as big as the
    forward's. It holds softmax (and each score modifier's input: scaled under a logit cap), the
    allowed mask (and the biases summed), and up to four score-like gradients at once, whether
    kept or not, and about twice the rest of a trace; blocked (only gradients that are not
    (T, S)-shaped kept), L and as many arrays of one block instead."""
    from attn_cli.core.chain import Chain

    chain = Chain(inputs)
    B, H, Hkv, T, S = inputs.batch, inputs.heads, inputs.kv_heads, inputs.seq_q, inputs.seq_k
    D, Dv, E = inputs.d_k, inputs.d_v, inputs.d_out or 0
    from attn_cli.core.gradients import blocked

    grads = [s for s in STAGES if s.gradient and s.score_like and s.applies(inputs)]
    kept = grads if keep is None else [s for s in grads if s.name in keep]
    held = 2 + len(chain.stages) + bool(chain.biases)
    score_like = B * H * T * S * (max(len(kept), 4) + held)
    if keep is not None and blocked(inputs, keep):  # no (T, S) array: L and a block's arrays
        from attn_cli.core.backward import BLOCK_CELLS

        score_like = B * H * T + (4 + held) * min(BLOCK_CELLS, B * H * T * S)
    rest = B * (H * T * (D + Dv) + Hkv * S * (D + Dv) + T * E) * 2
    weights = sum(
        w.size
        for w in (inputs.X, inputs.X_kv, inputs.W_Q, inputs.W_K, inputs.W_V, inputs.W_O)
        if w is not None
    )
    return score_like + rest + 2 * weights


def score_stages_kept(inputs: Inputs, keep: Collection[str] | None = None) -> int:
    """How many score-like stages (scores, scaled, masked, softmax, the variants') a trace
    keeps, of those that apply."""
    stages = [s.name for s in STAGES if s.score_like and not s.gradient and s.applies(inputs)]
    return len(stages if keep is None else [s for s in stages if s in keep])


def check_memory(
    inputs: Inputs,
    max_memory: int | None = None,
    keep: Collection[str] | None = None,
    itemsize: int = 8,
    backward: bool = False,
    written: Written = "held",
) -> None:
    """Refuse, before any stage is computed, a trace that would need more than ``max_memory``.

    ``max_memory`` None is :func:`default_max_memory`; ``keep``, ``itemsize``, ``backward``
    and ``written`` as for :func:`memory_needed`.
    """
    budget = default_max_memory() if max_memory is None else max_memory
    need = memory_needed(inputs, keep, itemsize, backward, written)
    if need <= budget:
        return
    B, H, T, S = inputs.batch, inputs.heads, inputs.seq_q, inputs.seq_k
    n = 0 if streams(inputs, keep, backward, written) else score_stages_kept(inputs, keep)
    held = f"{n} score stages each hold" if n > 1 else "the score stage holds" if n else ""
    why = f" ({held} {B * H * T * S:,} numbers: batch {B} x heads {H} x seq_q {T} x seq_k {S})"
    raise InputError(
        inputs.source,
        "",
        f"tracing it would need about {format_bytes(need)} of memory{why if n else ''}",
        f"at most {format_bytes(budget)}",
        option="max-memory",
    )


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
