"""The grader of someone's own decode loop or flash kernel: their dump against core/decode.py's
or core/flash.py's run of the same fixture (runs.py), and a classic mistake named only when
core's recomputation of that mistake reproduces the dump's numbers (``decode_mistakes``,
``flash_mistakes``: the loop's own mistakes, then those the fixture's variants register in
check/mistake.py's ``DECODE`` and ``FLASH``).

Axis names as in core/decode.py: B batch, H query heads, Hkv key/value heads, T tokens, D d_k,
Dv d_v, C cache slots.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

import attn_cli.check.mistakes  # noqa: F401 (registers the variants' decode and flash mistakes)
from attn_cli.check.compare import (
    Comparison,
    Diagnosis,
    StageResult,
    Tolerance,
    cell_errors,
    compare_stage,
    conform,
)
from attn_cli.check.dump import DecodeDump, Dump, DumpTile, FlashDump
from attn_cli.check.mistake import (
    DECODE,
    FLASH,
    LOOP_TEXTS,
    every_loop_mistake,
    loop_mistakes,
)
from attn_cli.check.runs import (
    AnyArray,
    DecodeArgs,
    decode_args,
    default_block,
    flash_args,
    refuse_decode,
)
from attn_cli.core import decode as core_decode
from attn_cli.core import flash as core_flash
from attn_cli.core.chain import Chain
from attn_cli.core.decode import DecodeMistake, DecodeResult, decode
from attn_cli.core.flash import FlashMistake, Tile, flash_forward
from attn_cli.core.inputs import FloatArray
from attn_cli.core.paged import Paging, pages_needed
from attn_cli.core.pipeline import refuse as refuse_variants
from attn_cli.errors import InputError

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.core.pipeline import Trace


def decode_mistakes(
    q: FloatArray, k: FloatArray, v: FloatArray, *, chain: Chain, **options: Any
) -> tuple[DecodeMistake, ...]:
    """core.decode's mistakes of the loop, then those of the chain's variants that apply."""
    extra = [(m.name, m.description, m.bugs) for m in loop_mistakes(DECODE, chain, options)]
    return core_decode.decode_mistakes(q, k, v, chain=chain, extra=extra, **options)


def flash_mistakes(
    q: FloatArray, k: FloatArray, v: FloatArray, *, chain: Chain, **options: Any
) -> tuple[FlashMistake, ...]:
    """core.flash's mistakes of the loop, then those of the chain's variants that apply."""
    extra = [(m.name, m.description, m.bugs) for m in loop_mistakes(FLASH, chain, options)]
    return core_flash.flash_mistakes(q, k, v, chain=chain, extra=extra, **options)


def grade_special(trace: Trace, dump: Dump, tolerance: Tolerance, worst: int = 5) -> Comparison:
    """Grade a decode or flash dump against the fixture's trace (see ``grade``)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        if isinstance(dump, DecodeDump):
            return grade_decode(trace, dump, tolerance, worst)
        assert isinstance(dump, FlashDump)
        return grade_flash(trace, dump, tolerance, worst)


def _public(trace: Trace, arr: AnyArray, batch_axis: int = 0) -> FloatArray:
    """Drop the batch axis (at ``batch_axis``) when the fixture has none."""
    out: FloatArray = arr if trace.inputs.has_batch else np.take(arr, 0, axis=batch_axis)
    return out


def _axes(trace: Trace, *axes: str) -> tuple[str, ...]:
    return tuple(a for a in axes if a != "batch" or trace.inputs.has_batch)


def _fit(given: FloatArray, shape: tuple[int, ...], axes: tuple[str, ...]) -> FloatArray | None:
    """The dump's array in ``shape``: as conform allows, or reshaped when only size-1 axes or
    merged leading axes (batch·heads, as CS336 and Triton lay them out) differ."""
    fitted = conform(given, shape, axes)
    if fitted is not None:
        return fitted
    if given.size == math.prod(shape) and given.shape[-1:] == shape[-1:]:
        return given.reshape(shape)
    return None


def _stage(
    name: str,
    axes: tuple[str, ...],
    ref: FloatArray,
    given: FloatArray | None,
    tolerance: Tolerance,
    worst: int,
) -> StageResult:
    if given is None:
        return StageResult(name, "missing_expected", axes, None, tuple(ref.shape))
    fitted = _fit(given, tuple(ref.shape), axes)
    if fitted is None:
        return StageResult(name, "shape", axes, tuple(ref.shape), tuple(given.shape))
    return compare_stage(name, axes, ref, fitted, tolerance, worst)


def grade_decode(trace: Trace, dump: DecodeDump, tolerance: Tolerance, worst: int) -> Comparison:
    """Each step's output (and the final cache) against core.decode's; then the mistakes."""
    inp = trace.inputs
    refuse_decode(inp)
    T = inp.seq_q
    steps = dump.outputs.shape[0]
    prefill = dump.prefill if dump.prefill is not None else T - steps
    if not 1 <= prefill <= T or prefill + steps != T:
        raise InputError(
            dump.source,
            "decode_output",
            f"{steps} steps after a prefill of {prefill}",
            f"one output per token after the prefill: {T} tokens in all",
        )
    args = decode_args(trace)
    paging = _paging(trace, dump)
    right = decode(args.q, args.k, args.v, prefill=prefill, paging=paging, **args.kwargs())
    out_axes = _axes(trace, "step", "batch", "head", "d_v")
    cache_axes = _axes(trace, "batch", "kv_head", "slot", "d")
    ref = _decode_stages(trace, right)
    given = {"decode output": dump.outputs, "K_cache": dump.K_cache, "V_cache": dump.V_cache}
    results = [
        _stage("decode output", out_axes, ref["decode output"], dump.outputs, tolerance, worst)
    ]
    results += [
        _stage(n, cache_axes, ref[n], given[n], tolerance, worst)
        for n in ("K_cache", "V_cache")
        if given[n] is not None
    ]
    comparison = Comparison(trace, "dump", dump.source, tolerance, tuple(results))
    first = comparison.first_difference
    notes = (
        f"decode: prefill {prefill}, then {steps} steps; step s is token {prefill} + s"
        + (
            ""
            if paging is None
            else f"; paged, {paging.block_size} tokens a page "
            "(K_cache, V_cache: the last step's gather, empty slots as zeros)"
        ),
    )
    found: tuple[Diagnosis, ...] = ()
    tried: tuple[str, ...] = ()
    if first is not None:
        found, tried = _decode_diagnoses(trace, args, prefill, given, first.name, tolerance, paging)
    return replace(comparison, notes=notes, diagnoses=found, tried=tried)


def _paging(trace: Trace, dump: DecodeDump) -> Paging | None:
    """The pool of a paged dump (its ``block_size``): as many pages as the sequence holds."""
    if dump.block_size is None:
        return None
    from attn_cli.check.paged_runs import MAX_BLOCK

    if dump.block_size > MAX_BLOCK:
        raise InputError(
            dump.source, "block_size", f"is {dump.block_size}", f"1 to {MAX_BLOCK:,} tokens a page"
        )
    inp = trace.inputs
    reach = Chain(inp).cache_slots()
    pages = pages_needed(inp.seq_q, dump.block_size, inp.token_positions()[0], reach)
    return Paging(dump.block_size, pages)


def _decode_stages(trace: Trace, result: DecodeResult) -> dict[str, FloatArray]:
    """The compared arrays of a decode: outputs (steps, B?, H, Dv), the final caches."""
    outputs = np.stack([s.output[:, :, 0] for s in result.steps])  # (n, B, H, Dv)
    last = result.steps[-1] if result.steps else None
    out = {"decode output": _public(trace, outputs, 1)}
    if last is not None:
        out["K_cache"] = _public(trace, last.K_cache)
        out["V_cache"] = _public(trace, last.V_cache)
    return out


def _decode_diagnoses(
    trace: Trace,
    args: DecodeArgs,
    prefill: int,
    given: dict[str, FloatArray | None],
    stage: str,
    tolerance: Tolerance,
    paging: Paging | None = None,
) -> tuple[tuple[Diagnosis, ...], tuple[str, ...]]:
    """The named decode mistakes whose recomputation reproduces the dump."""
    found: list[Diagnosis] = []
    tried: list[str] = []
    options = {"prefill": prefill, "paging": paging, **args.kwargs()}
    right = _decode_stages(trace, decode(args.q, args.k, args.v, **options))
    candidates = [
        (m.name, m.description, _decode_stages(trace, m.result))
        for m in decode_mistakes(args.q, args.k, args.v, **options)
    ]
    groups = trace.inputs.heads // trace.inputs.kv_heads
    if groups > 1 and "K_cache" in right:
        head_axis = 1 if trace.inputs.has_batch else 0
        by_heads = {n: np.repeat(right[n], groups, axis=head_axis) for n in ("K_cache", "V_cache")}
        candidates.append(
            (
                "cache_sized_by_heads",
                "cache sized by query heads (keys and values repeated before caching, not after)",
                {**right, **by_heads},
            )
        )
    for name, title, stages in candidates:
        tried.append(title)
        if stage not in stages or given.get(stage) is None:
            continue
        value = stages[stage]
        if value.shape == right.get(stage, value).shape and _close(value, right[stage], tolerance):
            continue  # the mistake changes nothing here
        if not _same(given[stage], value, tolerance):
            continue
        others = [
            n
            for n in ("decode output", "K_cache", "V_cache")
            if n != stage and given.get(n) is not None and n in stages
        ]
        explains = tuple(n for n in others if _same(given[n], stages[n], tolerance))
        fix, title_zh, explanation_zh = LOOP_TEXTS.get(name, ("", "", ""))
        found.append(
            Diagnosis(
                name=name,
                title=title,
                detail=f"Recomputing the decode loop with this mistake reproduces every cell of "
                f"your {stage} ({tolerance}).{' ' + fix if fix else ''}",
                stage=stage,
                explains=explains,
                title_zh=title_zh,
                explanation_zh=explanation_zh,
                unexplained=tuple(
                    n
                    for n in others
                    if n not in explains and not _same(given[n], right[n], tolerance)
                ),
            )
        )
    return tuple(found), tuple(tried) if not found else ()


def _close(a: FloatArray, b: FloatArray, tol: Tolerance) -> bool:
    return bool(a.shape == b.shape and not cell_errors(a, b, tol)[0].any())


def _same(given: FloatArray | None, value: FloatArray, tol: Tolerance) -> bool:
    """Whether the dump's array, fitted to ``value``'s shape, matches it."""
    if given is None:
        return False
    fitted = given if given.shape == value.shape else _fit(given, tuple(value.shape), ())
    return fitted is not None and _close(fitted, value, tol)


def grade_flash(trace: Trace, dump: FlashDump, tolerance: Tolerance, worst: int) -> Comparison:
    """O and L (and the tiles' m and l) against core.flash's; then the mistakes (a split-KV
    dump's: those of the merge)."""
    refuse_variants(trace.inputs, "FlashAttention")
    args = flash_args(trace)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    inp = trace.inputs
    if dump.split_kv is not None and dump.split_kv > inp.seq_k:
        raise InputError(
            dump.source,
            "split_kv",
            f"is {dump.split_kv}, but the fixture has {inp.seq_k} keys",
            f"a whole number of chunks from 1 to {inp.seq_k}",
        )
    bq = dump.block_q or default_block(inp.seq_q)
    bk = dump.block_k or default_block(inp.seq_k)
    right = flash_forward(q, k, v, block_q=bq, block_k=bk, base2=dump.base2, **args)
    axes_o = _axes(trace, "batch", "head", "query", "d_v")
    axes_l = _axes(trace, "batch", "head", "query")
    ref = {"output": _public(trace, right.output), "lse": _public(trace, right.lse)}
    results = [
        _stage("output", axes_o, ref["output"], dump.output, tolerance, worst),
        _stage("lse", axes_l, ref["lse"], dump.lse, tolerance, worst),
    ]
    if dump.tiles:
        results += _tile_results(right.tiles, dump.tiles, tolerance, worst)
    notes = [
        f"flash: blocks {bq} × {bk}"
        + (
            ""
            if dump.block_q and dump.block_k
            else " (block_q, block_k not in the dump: attn's defaults)"
        )
        + (", L in base 2 (as the dump says)" if dump.base2 else ", L in base e")
    ]
    if dump.split_kv is not None:
        base = ", L in base 2 (as the dump says)" if dump.base2 else ", L in base e"
        notes = [f"split-KV: the keys in {dump.split_kv} chunks, merged by log-sum-exp{base}"]
    comparison = Comparison(
        trace, "dump", dump.source, tolerance, tuple(results), notes=tuple(notes)
    )
    first = comparison.first_difference
    given = {"output": dump.output, "lse": dump.lse}
    if first is not None and first.name in ("output", "lse") and dump.split_kv is not None:
        named, listed = _split_diagnoses(
            trace, dump, (q, k, v), args, ref, given, first.name, tolerance
        )
        return replace(comparison, diagnoses=named, tried=listed)
    if first is None or first.name not in ("output", "lse") or dump.base2:
        return comparison
    sizes = [(bq, bk)] if dump.block_q and dump.block_k else _block_guesses(inp, bq, bk)
    found, tried = _flash_diagnoses(
        trace, (q, k, v), args, sizes, (ref, given), first.name, tolerance
    )
    return replace(comparison, diagnoses=found, tried=tried)


def _flash_diagnoses(
    trace: Trace,
    qkv: tuple[FloatArray, FloatArray, FloatArray],
    args: dict[str, Any],
    sizes: list[tuple[int, int]],
    arrays: tuple[dict[str, FloatArray], dict[str, FloatArray]],
    first: str,
    tolerance: Tolerance,
) -> tuple[tuple[Diagnosis, ...], tuple[str, ...]]:
    """The FlashAttention loop's mistakes that reproduce the dump's first differing stage
    (``first``, output or lse) at one of the block ``sizes``; else what was tried."""
    q, k, v = qkv
    ref, given = arrays
    found: list[Diagnosis] = []
    tried: list[str] = []
    titles = [*_FLASH_TITLES, *((m.name, m.heading) for m in every_loop_mistake(FLASH))]
    for name, title in titles:
        tried.append(title)
        for sq, sk in sizes:
            mistake = next(
                (
                    m
                    for m in flash_mistakes(q, k, v, block_q=sq, block_k=sk, **args)
                    if m.name == name
                ),
                None,
            )
            if mistake is None:
                break
            stages = {
                "output": _public(trace, mistake.result.output),
                "lse": _public(trace, mistake.result.lse),
            }
            matched = _reproduced(stages, (ref, given), first, tolerance)
            if matched is None:
                continue
            explains, unexplained = matched
            found.append(
                Diagnosis(
                    name=name,
                    title=title,
                    detail=f"Recomputing the FlashAttention loop (blocks {sq} × {sk}) with this "
                    f"mistake reproduces every cell of your {first} ({tolerance}).",
                    stage=first,
                    explains=explains,
                    unexplained=unexplained,
                )
            )
            break
    return tuple(found), () if found else tuple(tried)


def _split_diagnoses(
    trace: Trace,
    dump: FlashDump,
    qkv: tuple[FloatArray, FloatArray, FloatArray],
    args: dict[str, Any],
    ref: dict[str, FloatArray],
    given: dict[str, FloatArray],
    stage: str,
    tolerance: Tolerance,
) -> tuple[tuple[Diagnosis, ...], tuple[str, ...]]:
    """The merge's named mistakes (core/split_kv.py) whose recomputation, with the dump's
    chunks, reproduces the dump's first differing stage."""
    from attn_cli.core.split_kv import SPLIT_MISTAKES, split_kv_forward

    assert dump.split_kv is not None
    bq = default_block(trace.inputs.seq_q)
    found: list[Diagnosis] = []
    tried: list[str] = []
    for name, title, bugs in SPLIT_MISTAKES:
        tried.append(title)
        r = split_kv_forward(
            *qkv, splits=dump.split_kv, block_q=bq, base2=dump.base2, bugs=bugs, **args
        )
        stages = {"output": _public(trace, r.merged.output), "lse": _public(trace, r.merged.lse)}
        matched = _reproduced(stages, (ref, given), stage, tolerance)
        if matched is None:
            continue  # the mistake changes nothing here (no logit large enough, one chunk)
        explains, unexplained = matched
        found.append(
            Diagnosis(
                name=name,
                title=title,
                detail=f"Recomputing the split-KV merge ({dump.split_kv} chunks) with this mistake "
                f"reproduces every cell of your {stage} ({tolerance}).",
                stage=stage,
                explains=explains,
                unexplained=unexplained,
            )
        )
    return tuple(found), () if found else tuple(tried)


def _reproduced(
    stages: dict[str, FloatArray],
    arrays: tuple[dict[str, FloatArray], dict[str, FloatArray]],
    stage: str,
    tolerance: Tolerance,
) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """Whether a mistake's output and lse (``stages``) change ``stage`` from the reference and
    reproduce the dump's: None if not, else the other stage as (explained, unexplained)."""
    ref, given = arrays
    if _close(stages[stage], ref[stage], tolerance):
        return None
    if not _same(given[stage], stages[stage], tolerance):
        return None
    other = "lse" if stage == "output" else "output"
    explains = (other,) if _same(given[other], stages[other], tolerance) else ()
    unexplained = () if explains or _same(given[other], ref[other], tolerance) else (other,)
    return explains, unexplained


_FLASH_TITLES = (
    ("acc_not_rescaled", "accumulator not rescaled by alpha"),
    ("sum_not_rescaled", "running sum l not rescaled by alpha"),
    ("lse_without_max", "L = log(l): the running max m left out"),
    ("lse_base2", "L in base 2 (Triton's exp2) where base e is expected"),
)  # then each variant's (check/mistake.py's FLASH)


def _block_guesses(inputs: Inputs, bq: int, bk: int) -> list[tuple[int, int]]:
    """Block sizes to try when the dump names none: attn's defaults, then powers of two."""
    longest = max(inputs.seq_q, inputs.seq_k)
    powers = [1 << n for n in range(8) if 1 << n < longest]
    return list(dict.fromkeys([(bq, bk), *((p, p) for p in powers)]))


def _tile_results(
    tiles: tuple[Tile, ...], given: tuple[DumpTile, ...], tolerance: Tolerance, worst: int
) -> list[StageResult]:
    """The dump's per-tile m and l against attn's tiles at the same place."""
    ours = {(t.batch, t.head, t.q_block, t.k_block): t for t in tiles}
    refs: dict[str, list[FloatArray]] = {"m": [], "l": []}
    mine: dict[str, list[FloatArray]] = {"m": [], "l": []}
    for tile in given:
        match = ours.get((tile.batch, tile.head, tile.q_block, tile.k_block))
        if match is None:
            return [StageResult("tile m", "shape", ("tile", "row"), (len(tiles),), (len(given),))]
        for name in ("m", "l"):
            refs[name].append(getattr(match, name))
            mine[name].append(getattr(tile, name))
    out = []
    for name in ("m", "l"):
        ref = np.concatenate(refs[name])
        got = np.concatenate(mine[name])
        given_arr = got if got.shape == ref.shape else None
        out.append(_stage(f"tile {name}", ("row",), ref, given_arr, tolerance, worst))
    return out
