"""config.json as ``attn import`` reads it: typed getters whose errors name the file and the key."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from attn_cli.errors import InputError

REQUIRED: Any = object()  # a getter's default: the key must be given


# Counts that a list or a loop is built over before the checkpoint's tensors are checked
# against them (the experts' tensor names, the router's groups): bounded where they are read,
# as a config claiming 2**63 experts built a list of their names until memory ran out.
MOST: dict[str, int] = dict.fromkeys(
    (
        "num_local_experts",
        "num_experts",
        "n_routed_experts",
        "num_experts_per_tok",
        "n_group",
        "topk_group",
        "n_shared_experts",
    ),
    1 << 16,
)


class Config:
    """config.json as read: typed getters whose errors name the file and the key.

    ``path`` is where the mapping sits in config.json (``text_config.``), prefixed to each key
    an error names."""

    def __init__(self, data: Mapping[str, Any], source: str, path: str = "") -> None:
        self.data = data
        self.source = source
        self.path = path

    def error(self, key: str, what: str, expected: str) -> InputError:
        return InputError(self.source, self.path + key, what, expected)

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def whole(self, key: str, default: Any = REQUIRED, minimum: int = 1) -> int:
        value = self.data.get(key)
        if value is None:
            if default is REQUIRED:
                raise self.error(key, "missing", f"a whole number >= {minimum}")
            return int(default)
        most = MOST.get(key)
        if type(value) is not int or value < minimum or (most is not None and value > most):
            expected = f"a whole number >= {minimum}"
            if most is not None:
                expected = f"a whole number from {minimum} to {most:,} ({key} of a model)"
            raise self.error(key, f"got {shown(value)}", expected)
        return value

    def number(self, key: str, default: float, *, positive: bool = True) -> float:
        value = self.data.get(key)
        if value is None:
            return default
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or (positive and value <= 0):
            raise self.error(
                key, f"got {value!r}", "a finite number" + (" > 0" if positive else "")
            )
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key)
        if value is None:  # transformers writes null for an option left at its default
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"got {value!r}", "true or false")
        return value

    def optional_number(self, key: str, default: float) -> float | None:
        """The number, or None where config.json says null (the default where it says nothing)."""
        if key in self.data and self.data[key] is None:
            return None
        return self.number(key, default)

    def mapping(self, key: str) -> Mapping[str, Any] | None:
        """The mapping at ``key`` (rope_parameters, rope_scaling, ...), None where config.json
        says nothing or null; any other type is one line naming the key."""
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise self.error(key, f"got {shown(value)}", "a mapping {name: value, ...}")
        return value

    def text(self, key: str, default: str) -> str:
        """The string at ``key`` (an activation, a method's name), ``default`` where
        config.json says nothing or null; any other type is one line naming the key."""
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(key, f"got {shown(value)}", "a string")
        return value

    def optional_whole(self, key: str, default: int, minimum: int = 1) -> int | None:
        """The whole number, or None where config.json says null."""
        if key in self.data and self.data[key] is None:
            return None
        return self.whole(key, default, minimum)


def check_layer(config: Config, key: str, layer: int, default: Any = REQUIRED) -> int:
    """The number of layers at ``key``; ``layer`` must be one of them."""
    layers = config.whole(key, default)
    if not 0 <= layer < layers:
        raise config.error(
            key,
            f"the model has {layers} layers, layer {layer} is out of range",
            f"a layer between 0 and {layers - 1}",
        )
    return layers


def heads(config: Config, hidden: int, heads_key: str) -> int:
    """The number of heads at ``heads_key``, a divisor of the hidden size."""
    n = config.whole(heads_key)
    if hidden % n:
        raise config.error(heads_key, f"{n} does not divide the hidden size {hidden}", "a divisor")
    return n


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut short for a one-line error (a list may hold thousands of entries)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def spelled(value: Any, limit: int = 60) -> str:
    """``value`` as JSON spells it (true, null), cut short for a one-line message."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def finite(x: Any) -> bool:
    """A float or int (not a bool) that is finite."""
    return type(x) in (int, float) and math.isfinite(x)
