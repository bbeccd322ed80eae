"""The JSON of ``attn decode`` and ``attn flash``: fixed key order, full float64, byte-stable.

As the JSON trace (io/trace_json.py): non-finite values are the strings ``"-inf"``, ``"inf"``,
``"nan"``, arrays are nested lists with each innermost row on one line, and a fixture without
a batch axis has none here either.

- ``{"format": "attn-decode", "version": 1, ..., "prefill": P, "steps": [{"index", "position",
  "token", "slot", "cache_positions", "stages": {NAME: {"shape", "data"}}, "max_abs_diff"}]}``
  with stages Q (Q_rot), K_cache, V_cache, scores, scaled (capped), masked, softmax, output as
  the trace's with seq_q = 1 and seq_k = the cache's slots (-1 in cache_positions: empty);
- ``{"format": "attn-flash", "version": 1, ..., "block_q", "block_k", "tiles": [{"batch",
  "head", "q_block", "k_block", "skipped", "S", "m", "alpha", "P", "l", "acc"}],
  "stages": {"output", "lse"}}`` with only the first ``max_tiles`` tiles (``tiles_total`` says
  how many there are), so its size grows with the tiles shown, not with the sequence squared.

A paged decode (``--paged``) adds ``"paged": {"block_size", "pages", "pages_used",
"pool_bytes", "used_bytes", "contiguous_bytes", "waste_slots", "waste_bytes",
"prefill_max_abs_diff_contiguous", "max_abs_diff_contiguous", "prefill": PAGES}`` to the head
and ``"pages": PAGES`` and ``"max_abs_diff_contiguous"`` to each step, where PAGES is
``{"block_table": [page of each logical block, -1: freed], "placed": [[token, page, slot]],
"allocated": [...], "freed": [...], "in_use", "filled"}``; ``slot`` and ``cache_positions``
are then the gathered cache's (the live blocks' pages in logical order).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from attn_cli._version import __version__
from attn_cli.core.decode import DecodeResult, DecodeStep, KVCacheBytes
from attn_cli.core.flash import Tile
from attn_cli.core.pipeline import Trace
from attn_cli.io.trace_json import (
    array_text,  # one array layout for every JSON
    json_text,
    number_text,
    trace_config,
)

DECODE_FORMAT = "attn-decode"
FLASH_FORMAT = "attn-flash"
BATCH_FORMAT = "attn-decode-batch"
VERSION = 1


class DecodeRunLike(Protocol):
    """What the decode JSON reads (check/grade_decode.py's DecodeRun)."""

    @property
    def trace(self) -> Trace: ...
    @property
    def result(self) -> DecodeResult: ...
    @property
    def diffs(self) -> tuple[float, ...]: ...
    @property
    def prefill_diff(self) -> float: ...
    @property
    def cost(self) -> KVCacheBytes: ...
    @property
    def sentinel(self) -> float | None: ...
    @property
    def paged(self) -> Any: ...  # check/paged_runs.py's PagedCheck, None: contiguous


class CheckLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def max_abs(self) -> float: ...
    @property
    def ulps(self) -> float | None: ...
    @property
    def tolerance(self) -> float: ...
    @property
    def ok(self) -> bool: ...


class FlashRunLike(Protocol):
    """What the flash JSON reads (check/grade_decode.py's FlashRun)."""

    @property
    def trace(self) -> Trace: ...
    @property
    def output(self) -> Any: ...
    @property
    def lse(self) -> Any: ...
    @property
    def tiles(self) -> tuple[Tile, ...]: ...
    @property
    def tiles_total(self) -> int: ...
    @property
    def block_q(self) -> int: ...
    @property
    def block_k(self) -> int: ...
    @property
    def base2(self) -> bool: ...
    @property
    def causal_offset(self) -> int | None: ...
    @property
    def checks(self) -> Sequence[CheckLike]: ...
    @property
    def max_tiles(self) -> int: ...
    @property
    def sentinel(self) -> float | None: ...


def document_head(trace: Trace, fmt: str) -> dict[str, Any]:
    return {
        "format": fmt,
        "version": VERSION,
        "generator": f"attn {__version__}",
        "name": trace.inputs.name,
        "config": trace_config(trace),
        "tokens": list(trace.query_labels),
    }


def _value(value: Any) -> str:
    """A plain JSON value; a float as the trace writes numbers (non-finite as strings)."""
    if isinstance(value, float):
        return number_text(value)
    return json_text(value)


def mapping(items: dict[str, Any], indent: int) -> list[str]:
    """``"key": value,`` lines (the caller closes the last one)."""
    pad = " " * indent
    return [f"{pad}{json_text(k)}: {_value(v)}," for k, v in items.items()]


def stages_lines(stages: list[tuple[str, Any]], indent: int) -> list[str]:
    """``"stages": {NAME: {"shape", "data"}}`` at ``indent``."""
    pad = " " * indent
    lines = [f'{pad}"stages": {{']
    for n, (name, data) in enumerate(stages):
        arr = np.asarray(data)
        comma = "," if n < len(stages) - 1 else ""
        lines.append(f"{pad}  {json_text(name)}: {{")
        lines.append(f'{pad}    "shape": {json.dumps(list(arr.shape))},')
        lines.append(f'{pad}    "data": {array_text(arr.tolist(), indent + 4)}')
        lines.append(f"{pad}  }}{comma}")
    lines.append(f"{pad}}}")
    return lines


def close_last(lines: list[str]) -> list[str]:
    lines[-1] = lines[-1].removesuffix(",")
    return lines


# ---------------------------------------------------------------------------------------------
# attn decode


def decode_dumps(run: DecodeRunLike) -> str:
    """The decode as JSON text: the prefill, each step's stages and its self-check."""
    trace, result = run.trace, run.result
    cost = run.cost
    head = document_head(trace, DECODE_FORMAT)
    head.update(
        prefill=result.prefill,
        prefill_max_abs_diff=run.prefill_diff,
        max_abs_diff=max((run.prefill_diff, *run.diffs)),
        kv_cache_bytes={
            "itemsize": 8,
            "kv_heads": cost.kv_heads,
            "heads": cost.heads,
            "seq": cost.seq,
            "per_token": cost.per_token,
            "per_token_mha": cost.per_token_mha,
            "per_token_mqa": cost.per_token_mqa,
            "total": cost.total,
            "total_mha": cost.total_mha,
            "total_mqa": cost.total_mqa,
            **({} if cost.latent is None else {"latent": cost.latent}),
        },
        mask_value_replaced=run.sentinel,
    )
    paged = run.paged
    if paged is not None:
        pool = paged.pool
        head["paged"] = {
            "block_size": pool.block_size,
            "pages": pool.pages,
            "pages_used": pool.pages_used,
            "pool_bytes": pool.pool,
            "used_bytes": pool.used,
            "contiguous_bytes": pool.contiguous,
            "waste_slots": pool.waste_slots,
            "waste_bytes": pool.waste,
            "prefill_max_abs_diff_contiguous": paged.prefill_diff,
            "max_abs_diff_contiguous": paged.worst,
            "prefill": _pages(result.prefill_pages),
        }
    lines = ["{", *mapping(head, 2), '  "steps": [']
    near = paged.contiguous_diffs if paged is not None else (None,) * len(result.steps)
    for n, (step, diff) in enumerate(zip(result.steps, run.diffs, strict=True)):
        lines += _step(trace, step, diff, near[n], last=n == len(result.steps) - 1)
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def _pages(pages: Any) -> dict[str, Any]:
    """The block table after a step, and what the step placed, took and released."""
    return {
        "block_table": list(pages.table),
        "placed": [list(p) for p in pages.placed],
        "allocated": list(pages.allocated),
        "freed": list(pages.freed),
        "in_use": pages.in_use,
        "filled": pages.filled,
    }


def decode_stages(trace: Trace, step: DecodeStep) -> list[tuple[str, Any]]:
    """A step's stages in the trace's public layout (no batch axis when the fixture has none)."""
    names = [
        "Q",
        "Q_rot",
        "K_cache",
        "V_cache",
        "scores",
        "scaled",
        "capped",
        "masked",
        "softmax",
        "output",
    ]
    out = []
    for name in names:
        data = step.latent if name == "output" and step.latent is not None else getattr(step, name)
        if name == "output" and step.latent is not None:  # a latent cache's softmax·V_cache
            out.append(("output_latent", data if trace.inputs.has_batch else data[0]))
            data = step.output
        if data is not None:
            out.append((name, data if trace.inputs.has_batch else data[0]))
    for name, made in step.rows.items():  # a second map and the difference (diff)
        out.append((name, made if trace.inputs.has_batch else made[0]))
    for name, made in step.outs.items():  # the head-output transforms (a gate)
        out.append((name, made if trace.inputs.has_batch else made[0]))
    return out


def _step(
    trace: Trace, step: DecodeStep, diff: float, contiguous: float | None, *, last: bool
) -> list[str]:
    meta: dict[str, Any] = {
        "index": step.index,
        "position": step.position,
        "token": trace.query_labels[step.index],
        "slot": step.slot,
        "cache_positions": list(step.cache_positions),
        "max_abs_diff": diff,
    }
    if step.pages is not None:
        meta["pages"] = _pages(step.pages)
        meta["max_abs_diff_contiguous"] = contiguous
    lines = ["    {", *mapping(meta, 6)]
    lines += stages_lines(decode_stages(trace, step), 6)
    lines.append("    }" + ("" if last else ","))
    return lines


# ---------------------------------------------------------------------------------------------
# attn flash


def flash_dumps(run: FlashRunLike) -> str:
    """The FlashAttention loop as JSON text: the tiles shown, then O and L, then the checks."""
    trace = run.trace
    has_batch = trace.inputs.has_batch
    head = document_head(trace, FLASH_FORMAT)
    head.update(
        key_tokens=list(trace.key_labels),
        block_q=run.block_q,
        block_k=run.block_k,
        base2=run.base2,
        lse_base="2" if run.base2 else "e",
        causal_skip=run.causal_offset is not None,
        tiles_total=run.tiles_total,
        tiles_shown=len(run.tiles),
        max_tiles=run.max_tiles,
        checks=checks_json(run.checks),
        mask_value_replaced=run.sentinel,
    )
    lines = ["{", *mapping(head, 2), '  "tiles": [']
    for n, tile in enumerate(run.tiles):
        lines += _tile(tile, has_batch, last=n == len(run.tiles) - 1)
    lines.append("  ],")
    output, lse = (np.asarray(a) for a in (run.output, run.lse))
    stages = [("output", output if has_batch else output[0]), ("lse", lse if has_batch else lse[0])]
    lines += stages_lines(stages, 2)
    lines.append("}")
    return "\n".join(lines) + "\n"


def checks_json(checks: Iterable[CheckLike]) -> list[dict[str, Any]]:
    """A run's checks as the document's ``checks`` list."""
    return [
        {
            "name": c.name,
            "max_abs_diff": plain_number(c.max_abs),
            "ulps": plain_number(c.ulps),
            "tolerance": c.tolerance,
            "ok": c.ok,
        }
        for c in checks
    ]


def array_lines(arrays: dict[str, Any], indent: int) -> list[str]:
    """``"name": array,`` lines at ``indent``, null for None."""
    pad = " " * indent
    out = []
    for name, data in arrays.items():
        text = "null" if data is None else array_text(np.asarray(data).tolist(), indent)
        out.append(f"{pad}{json_text(name)}: {text},")
    return out


def plain_number(x: float | None) -> Any:
    """A number for json.dumps: non-finite as the trace's strings."""
    if x is None or np.isfinite(x):
        return x
    return json.loads(number_text(x))


def _tile(tile: Tile, has_batch: bool, *, last: bool) -> list[str]:
    meta: dict[str, Any] = {"batch": tile.batch} if has_batch else {}
    meta.update(
        head=tile.head, q_block=list(tile.q_block), k_block=list(tile.k_block), skipped=tile.skipped
    )
    arrays = {name: getattr(tile, name) for name in ("S", "m", "alpha", "P", "l", "acc")}
    lines = ["    {", *mapping(meta, 6), *array_lines(arrays, 6)]
    close_last(lines)
    lines.append("    }" + ("" if last else ","))
    return lines


# ---------------------------------------------------------------------------------------------
# attn decode of linear attention: a recurrent state in place of the cache


class StateRunLike(Protocol):
    """What the state decode's JSON reads (check/state_runs.py's StateRun)."""

    @property
    def trace(self) -> Trace: ...
    @property
    def result(self) -> Any: ...
    @property
    def diffs(self) -> tuple[float, ...]: ...
    @property
    def prefill_diff(self) -> float: ...
    @property
    def ledger(self) -> Any: ...
    @property
    def checked(self) -> str: ...


def state_dumps(run: StateRunLike) -> str:
    """The decode as JSON text: the state ledger, each step's numbers, state, output, check."""
    trace, result, c = run.trace, run.result, run.ledger
    head = document_head(trace, DECODE_FORMAT)
    head.update(
        prefill=result.prefill,
        prefill_max_abs_diff=run.prefill_diff,
        max_abs_diff=max((run.prefill_diff, *run.diffs)),
        checked=run.checked,
        state_bytes={
            "itemsize": c.itemsize,
            "parts": {n: list(shape) for n, shape in c.parts},
            "numbers": c.numbers,
            "state": c.state,
            "seq": c.seq,
            "heads": c.heads,
            "kv_cache_per_token": c.kv_per_token,
            "kv_cache_total": c.kv_at(c.seq),
        },
    )
    lines = ["{", *mapping(head, 2), '  "steps": [']
    batch = trace.inputs.has_batch
    for n, (step, diff) in enumerate(zip(result.steps, run.diffs, strict=True)):
        meta = {
            "index": step.index,
            "position": step.position,
            "token": trace.query_labels[step.index],
            "state_bytes": c.state,
            "kv_cache_bytes": c.kv_at(step.index + 1),
            "max_abs_diff": diff,
        }
        named = [
            *step.read.items(),
            *((f"state.{k}", x) for k, x in (step.state or {}).items()),
            ("output", step.output),
            *step.outs.items(),
        ]
        stages = [(name, x if batch else x[0]) for name, x in named]
        lines += ["    {", *mapping(meta, 6), *stages_lines(stages, 6)]
        lines.append("    }" + ("" if n == len(result.steps) - 1 else ","))
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# attn decode F1 F2 ... --batch: continuous batching


def batch_dumps(run: Any) -> str:
    """The batch as JSON text (check/batch_runs.py's BatchRun): the sequences, each step's
    packed rows, cu_seqlens, mask (true: may attend), weights and outputs, and each sequence's
    ``output`` by name, (heads, tokens, d_v), with its checks."""
    members = run.result.members
    head = document_head(run.traces[0], BATCH_FORMAT)
    head.pop("tokens")
    head.update(
        prefill=max(m.prefill for m in members), chunk=members[0].chunk, max_abs_diff=run.worst
    )
    paging = run.result.paging
    if paging is not None:
        near = run.contiguous or ()
        worst = max((x for c in near for x in c), default=0.0)
        head["paged"] = {
            "block_size": paging.block_size,
            "pages": paging.pages,
            "pages_used": run.result.peak,
            "share_prefix": run.result.share,
            "bytes_per_token_slot": run.per_token,
            "max_abs_diff_contiguous": worst,
        }
    lines = ["{", *mapping(head, 2), '  "sequences": {']
    for j, name in enumerate(run.names):
        m = members[j]
        trace = run.traces[j]
        meta = {
            "fixture": run.fixtures[j],
            "tokens": list(trace.query_labels),
            "arrive": m.arrive,
            "prefill": m.prefill,
            "leaves": m.leaves - 1,
            "max_abs_diff_solo": max(run.solo[j]),
            "max_abs_diff": max(run.full[j]),
        }
        lines.append(f"    {json_text(name)}: {{")
        lines += mapping(meta, 6)
        lines.append(f'      "output": {array_text(run.result.outputs(j).tolist(), 6)}')
        lines.append("    }" + ("," if j < len(run.names) - 1 else ""))
    lines += ["  },", '  "steps": [']
    for n, step in enumerate(run.result.steps):
        meta = {
            "step": step.step,
            "rows": [{"sequence": run.names[j], "token": t} for j, t in step.rows],
            "row_sequence": [j for j, _ in step.rows],
            "keys": [{"sequence": run.names[j], "token": t} for j, t in step.keys],
            "cu_seqlens_q": list(step.cu_seqlens_q),
            "cu_seqlens_k": list(step.cu_seqlens_k),
            "entering": [run.names[j] for j in step.entering],
            "leaving": [run.names[j] for j in step.leaving],
        }
        if step.pages is not None:
            p = step.pages
            meta["pages"] = {
                "block_tables": {run.names[j]: list(t) for j, t in p.tables},
                "refcounts": {str(page): n for page, n in p.refcounts},
                "shared": [
                    {"sequence": run.names[j], "block": b, "page": q} for j, b, q in p.shared
                ],
                "copied": [
                    {"sequence": run.names[j], "block": b, "from": a, "to": q}
                    for j, b, a, q in p.copied
                ],
                "allocated": list(p.allocated),
                "freed": list(p.freed),
            }
        lines += ["    {", *mapping(meta, 6)]
        lines.append(f'      "mask": {json.dumps(step.mask.tolist())},')
        lines += stages_lines(
            [
                ("scores", step.scores),
                ("masked", step.masked),
                ("softmax", step.softmax),
                ("output", step.output),
            ],
            6,
        )
        lines.append("    }" + ("," if n < len(run.result.steps) - 1 else ""))
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"
