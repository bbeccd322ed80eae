"""Which keys a query may attend: causal (a key no later than the query), the sliding window
(HF/Mistral ``sliding_window``: 0 <= pos_q − pos_k < window), the fixture's boolean ``mask``
(True = may attend, right-aligned as torch broadcasts) and ``lengths`` (padding: keys at or
past a batch item's length are hidden)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from attn_cli.core.inputs import Inputs
from attn_cli.core.plugins.parsing import broadcasts, causal_count, plain
from attn_cli.core.roles import HIDES_LATER_KEYS
from attn_cli.core.variant import (
    BoolArray,
    CacheRule,
    Cells,
    FixtureKey,
    IntArray,
    NewOption,
    NewSpec,
    Variant,
    register,
    take,
)

CAUSAL_VALUES = ("upper-left", "lower-right")  # causal: true is upper-left


class Causal(Variant[str]):
    order = 10
    name = "causal"
    declares = frozenset({HIDES_LATER_KEYS})  # the causal rule alone (a causal mixer's own)

    def parse(self, raw: Any, key: FixtureKey) -> str | None:
        raw = plain(raw)
        if raw is False:
            return None
        if raw is True:
            return "upper-left"
        if raw in CAUSAL_VALUES:
            return str(raw)
        raise key(f"got {key.describe(raw)}", 'false, true, "upper-left" or "lower-right"')

    def allowed(self, value: Any, inputs: Inputs, cells: Cells) -> BoolArray:
        # the default positions give upper-left (key j <= query i) or lower-right (the last
        # query sees every key, as a KV cache)
        return cells.pos_k[None, None, None, :] <= cells.pos_q[None, None, :, None]  # (1,1,R,S)

    def hides(self, value: Any) -> str:
        return f"causal {value}"


class Window(CacheRule[int]):
    order = 11
    name = "window"
    reads_positions = True
    key_order = 40
    new_options = (
        NewOption(
            "window",
            int,
            "Sliding window: each query sees at most N keys, itself included "
            "(Mistral). Needs --causal.",
            metavar="N",
            min=1,
            field="window",
            example=("mistral.yaml --causal --window 3", "a sliding window of 3"),
        ),
    )
    new_rank, new_order = 30, 40

    def parse(self, raw: Any, key: FixtureKey) -> int:
        return causal_count(
            raw,
            key,
            "a whole number >= 1",
            "a whole number >= 1 (keys a query sees, itself too)",
            "causal: true or lower-right alongside window (a sliding window looks back only)",
        )

    def allowed(self, value: Any, inputs: Inputs, cells: Cells) -> BoolArray:
        reach = window_reach(value, *inputs.token_positions())
        return cells.pos_k[None, None, None, :] > cells.pos_q[None, None, :, None] - reach

    def hides(self, value: Any) -> str:
        return f"window {value}"

    def cache_slots(self, value: Any, inputs: Inputs) -> int:
        # a ring of `window` slots: position p goes to slot p mod window, evicting the key
        # `window` positions back, so the cache holds exactly the keys the window allows
        return window_reach(value, *inputs.token_positions())

    def new_problem(self, spec: NewSpec) -> tuple[str, str, str] | None:
        if self.name in spec.options and not spec.causal:
            return (
                self.name,
                "given without --causal",
                "--causal alongside --window (a sliding window looks back only)",
            )
        return None

    def new_lines(self, spec: NewSpec, members: Mapping[str, Any]) -> list[str]:
        window = spec.options[self.name]
        return [
            f"window: {window}   # sliding window: a query sees keys with 0 <= pos_q - pos_k "
            f"< {window}, itself included (HF/Mistral; FlashAttention window_size="
            f"({window - 1}, 0))"
        ]

    def new_words(self, spec: NewSpec, members: Mapping[str, Any]) -> str:
        return f"window {spec.options[self.name]}"


def window_reach(window: int, pos_q: Any, pos_k: Any) -> int:
    """The window as the arithmetic uses it: ``window``, at most one more than the widest gap
    pos_q - pos_k. A wider window allows the same keys (plain causal attention), and a window of
    2^63 or 10^30 fits no int64."""
    pos_q, pos_k = np.asarray(pos_q), np.asarray(pos_k)
    if pos_q.size == 0 or pos_k.size == 0:
        return 1
    widest = int(pos_q.max()) - int(pos_k.min())  # Python ints: no overflow
    return max(1, min(window, widest + 1))


class Mask(Variant[BoolArray]):
    order = 12
    name = "mask"

    def parse(self, raw: Any, key: FixtureKey) -> BoolArray:
        raw = plain(raw)
        shape = key.shape(raw, self.name, _mask_entry, "true/false or 1/0")
        if len(shape) > 4:
            raise key(f"has {len(shape)} axes", "at most 4 [batch, heads, seq_q, seq_k]")
        broadcasts(shape, key)
        return np.array(raw, dtype=bool)

    def allowed(self, value: Any, inputs: Inputs, cells: Cells) -> BoolArray:
        full = np.broadcast_to(value, (inputs.batch, inputs.heads, inputs.seq_q, inputs.seq_k))
        cells_mask: BoolArray = take(full, cells)  # (b, h, R, S)
        return cells_mask

    def hides(self, value: Any) -> str:
        return "mask"


class Lengths(Variant[IntArray]):
    order = 13
    name = "lengths"

    def parse(self, raw: Any, key: FixtureKey) -> IntArray:
        raw = plain(raw)
        items = raw if isinstance(raw, list) else [raw]
        seq_k = key.seq_k
        for i, n in enumerate(items):
            field = f"lengths[{i}]" if isinstance(raw, list) else None
            if type(n) is not int:
                what = f"a whole number of valid keys, 0..{seq_k}"
                raise key(f"got {key.describe(n)}", what, field)
            if not 0 <= n <= seq_k:
                what = f"a number of valid keys between 0 and seq_k = {seq_k}"
                raise key(f"is {n}", what, field)
        if len(items) != key.batch:
            raise key(f"has {len(items)} entries", f"one per batch item ({key.batch})")
        return np.array(items, dtype=np.int64)

    def allowed(self, value: Any, inputs: Inputs, cells: Cells) -> BoolArray:
        valid: BoolArray = cells.keys[None, :] < value[cells.batch][:, None]  # (b, S)
        return valid[:, None, None, :]  # (b, 1, 1, S)

    def hides(self, value: Any) -> str:
        return "lengths"


def _mask_entry(x: Any) -> bool:
    """An entry of a mask: a boolean, or 1/0."""
    return isinstance(x, bool) or (type(x) is int and x in (0, 1))


register(Causal())
register(Window())
register(Mask())
register(Lengths())
