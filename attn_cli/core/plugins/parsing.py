"""What the variants' ``parse`` share: the checks of a number, a list per head, a mapping's
subkeys, each raising the one-line error of the key being parsed (core/variant.py FixtureKey)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from attn_cli.core.variant import FixtureKey, FloatArray, NewSpec
from attn_cli.errors import did_you_mean, field_name


def plain(value: Any) -> Any:
    """A NumPy array or scalar from a Python caller, as the lists and numbers a parser gives."""
    return value.tolist() if isinstance(value, np.ndarray | np.generic) else value


def is_number(x: Any) -> bool:
    """An int or a float, not a boolean."""
    return type(x) is float or type(x) is int


def positive_number(raw: Any, key: FixtureKey, what: str, field: str | None = None) -> float:
    """A finite number > 0; ``what`` says what it does, in the expected part of a message."""
    if not is_number(raw):
        raise key(f"got {key.describe(raw)}", f"a number > 0 ({what})", field)
    try:
        number = float(raw)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or number <= 0:
        raise key(f"is {raw}", f"a finite number > 0 ({what})", field)
    return number


def whole_number(raw: Any, key: FixtureKey, field: str, low: int, high: int, what: str) -> int:
    """An int (not a bool, not a float) from ``low`` to ``high``: every integer setting of a
    variant is bounded at load time, so that 2**63 never reaches NumPy as a size."""
    if type(raw) is not int or not low <= raw <= high:
        raise key(
            f"got {key.describe(raw)}", f"a whole number from {low} to {high} ({what})", field
        )
    return raw


def causal_count(
    raw: Any,
    key: FixtureKey,
    wrong_type: str,
    out_of_range: str,
    alone: str,
    high: float = math.inf,
) -> int:
    """A whole number from 1 to ``high`` that narrows a causal mask (a window, a chunk);
    ``wrong_type``, ``out_of_range`` and ``alone`` (given without causal) are what each refusal
    expects."""
    if type(raw) is not int:
        raise key(f"got {key.describe(raw)}", wrong_type)
    if not 1 <= raw <= high:
        raise key(f"is {raw}", out_of_range)
    if key.setting("causal") is None:
        raise key("given without causal", alone)
    return raw


def per_head(raw: Any, key: FixtureKey, field: str) -> FloatArray:
    """One finite number per query head."""
    numeric = isinstance(raw, np.ndarray) and raw.ndim > 0 and raw.dtype.kind in "iuf"
    arr = key.floats(
        raw if numeric else plain(raw), field, (1,), f"a list of heads = {key.heads} numbers"
    )
    if arr.shape[0] != key.heads:
        raise key(f"has {arr.shape[0]} entries", f"one per query head ({key.heads})", field)
    return arr


def true_or_mapping(raw: Any, key: FixtureKey, doc: str) -> Any:
    """A setting that is ``true``, ``false`` (None: off) or a mapping."""
    if raw is False:
        return None
    if raw is True or isinstance(raw, Mapping):
        return raw
    raise key(f"got {key.describe(raw)}", doc)


def known_subkeys(
    value: Mapping[Any, Any], key: FixtureKey, name: str, known: tuple[str, ...]
) -> None:
    """Every subkey of a mapping setting one of ``known`` (a typo gets a suggestion)."""
    for sub in value:
        if sub not in known:
            raise key(
                f"unknown key{did_you_mean(str(sub), known)}",
                "one of " + ", ".join(known),
                f"{name}.{field_name(sub)}",
            )


def entries(raw: Any, key: FixtureKey, doc: str) -> dict[Any, Any]:
    """A mapping setting's entries that are not null; ``doc`` is what is expected of it when it
    is not a mapping."""
    if not isinstance(raw, Mapping):
        raise key(f"got {key.describe(raw)}", doc)
    return {k: v for k, v in raw.items() if v is not None}


def known_entries(
    raw: Any, key: FixtureKey, name: str, known: tuple[str, ...], doc: str
) -> dict[Any, Any]:
    """A mapping setting's entries that are not null, each one of ``known``."""
    value = entries(raw, key, doc)
    known_subkeys(value, key, name, known)
    return value


def broadcasts(shape: tuple[int, ...], key: FixtureKey) -> None:
    """An array of ``shape`` broadcasts (right-aligned, as torch) to [batch, heads, seq_q, seq_k]
    (a mask, a bias)."""
    target = (key.batch, key.heads, key.seq_q, key.seq_k)
    if len(shape) > 4 or any(
        s not in (1, t) for s, t in zip(reversed(shape), reversed(target), strict=False)
    ):
        names = ("batch", "heads", "seq_q", "seq_k")
        tgt = ", ".join(f"{n}={t}" for n, t in zip(names, target, strict=True))
        raise key(
            f"has shape {list(shape)}, which does not broadcast",
            f"a shape broadcastable (right-aligned, as torch) to [{tgt}]",
        )


def finite_flag(spec: NewSpec, name: str) -> tuple[str, str, str] | None:
    """An ``attn new`` flag given as inf or nan (what YAML cannot write back as a number)."""
    value = spec.options.get(name)
    if value is not None and not math.isfinite(value):
        return name, f"is {value}", "a finite number > 0"
    return None


def fold_scaling(value: dict[str, Any], key: FixtureKey, field: str) -> dict[str, Any]:
    """``scaling.factor: 8`` as ``scaling: {factor: 8}``: a whole-fixture .npz spells the
    mapping one member per entry (``rope.scaling.factor``, ``mla.scaling.factor``)."""
    dotted = {k.removeprefix("scaling."): v for k, v in value.items() if k.startswith("scaling.")}
    if not dotted:
        return value
    if "scaling" in value:
        raise key("given both as scaling and as scaling.NAME", "one of them", field)
    rest = {k: v for k, v in value.items() if not k.startswith("scaling.")}
    return rest | {"scaling": dotted}
