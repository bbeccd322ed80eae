"""``attn decode --paged``: the KV cache in pages of a pool (core/paged.py), each step checked
against the contiguous decode of the same fixture and against the full attention's rows.

``paging_for`` reads the options against the fixture (block size, pool size, what the pool
needs) before anything is computed; ``check_paged`` runs core/decode.py twice, paged and
contiguous, and keeps both comparisons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from attn_cli.core.chain import Chain
from attn_cli.core.paged import Paging, PoolBytes, pages_needed, pool_bytes
from attn_cli.errors import UsageError

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs

MAX_BLOCK = 1 << 12  # tokens a page: real engines use 16 to 256
MAX_PAGES = 1 << 20


@dataclass(frozen=True)
class PagedCheck:
    """What ``--paged`` adds to a decode run: the pool, its cost, and each step's largest
    difference from the contiguous cache's output."""

    paging: Paging
    pool: PoolBytes
    contiguous_diffs: tuple[float, ...]
    prefill_diff: float  # the prefill does not read the pool: 0 unless the loop is wrong

    @property
    def worst(self) -> float:
        return max((self.prefill_diff, *self.contiguous_diffs))


def refuse_paged(inputs: Inputs) -> None:
    """A paged cache holds keys and values: a decode with a loop of its own (a recurrent state,
    two softmax maps) is refused in one line naming both."""
    why = (
        "a paged cache holds the keys and values of one softmax map, and this decode keeps none "
        "(a recurrent state or two maps: a loop of its own)"
    )
    Chain(inputs).refuse_own_loop(
        why, "a fixture of softmax attention with one map, or no paging", "paged"
    )


def default_block(tokens: int) -> int:
    """A teaching page: about a third of the sequence, at least 2 tokens, at most 16 (vLLM's
    default), so a short example fills several pages."""
    return min(16, max(2, -(-tokens // 3)))


def paging_for(inputs: Inputs, block_size: int | None, pages: int | None) -> Paging:
    """The pool for this fixture: ``block_size`` tokens a page (default ``default_block``) and
    ``pages`` pages (default: as many as the sequence holds at once), refused in one line when
    out of range or too small."""
    src, T = inputs.source, inputs.seq_q
    bs = default_block(T) if block_size is None else block_size
    if not 1 <= bs <= MAX_BLOCK:
        raise UsageError(
            src, "block-size", f"is {bs}", f"1 to {MAX_BLOCK:,} tokens a page", option="block-size"
        )
    reach = Chain(inputs).cache_slots()
    need = pages_needed(T, bs, inputs.token_positions()[0], reach)
    if pages is None:
        return Paging(bs, need)
    if not 1 <= pages <= MAX_PAGES:
        raise UsageError(src, "pages", f"is {pages}", f"1 to {MAX_PAGES:,} pages", option="pages")
    if pages < need:
        held = f"{T} tokens in pages of {bs}" + ("" if reach is None else f", window {reach}")
        raise UsageError(
            src,
            "pages",
            f"a pool of {pages} is too small ({held} hold {need} pages at once)",
            f"at least {need}",
            option="pages",
        )
    return Paging(bs, pages)


def paged_bytes(inputs: Inputs, paging: Paging) -> int:
    """What the pool holds (and, with a window, a copy of it each time a page is taken again)."""
    per_row = inputs.batch * inputs.kv_heads * (inputs.d_k + inputs.d_v) * 8
    pool = paging.pages * paging.block_size * per_row
    reused = 0 if Chain(inputs).cache_slots() is None else inputs.seq_q // paging.block_size
    return pool * (1 + reused)


def pool_cost(inputs: Inputs, paging: Paging, per_token: int) -> PoolBytes:
    """The pool's bytes against the contiguous cache's, per layer."""
    reach = Chain(inputs).cache_slots()
    pos = inputs.token_positions()[0]
    return pool_bytes(paging, per_token, inputs.seq_q, pos, reach)
