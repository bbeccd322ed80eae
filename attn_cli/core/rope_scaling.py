"""RoPE scaling: the kinds of Hugging Face transformers' ``ROPE_INIT_FUNCTIONS``
(``modeling_rope_utils.py``, read in 5.24.0), one entry per kind of this module's ``KINDS``.

Each kind turns the inverse frequencies of plain RoPE, ``base^(-2i/dims)``, into the ones a
long-context checkpoint rotates by, and gives the attention factor transformers multiplies cos
and sin by (so the rotated part of q·k is multiplied by its square):

- ``linear`` (kaiokendev): every frequency divided by ``factor``.
- ``dynamic`` (NTK, bloc97 and emozilla): past ``max_position_embeddings`` tokens the base grows,
  ``base·(factor·L/max − (factor − 1))^(dims/(dims−2))`` for a sequence of L positions.
- ``llama3`` (Llama 3.1-3.3): wavelengths shorter than ``original/high_freq_factor`` are kept,
  longer than ``original/low_freq_factor`` divided by ``factor``, smoothly mixed between.
- ``yarn`` (Peng et al.; gpt-oss, Qwen, DeepSeek): a ramp between the dimensions of
  ``beta_fast`` and ``beta_slow`` rotations mixes the scaled and the kept frequencies, and the
  logits grow by the attention factor ``0.1·ln(factor) + 1`` (mscale) squared.
- ``longrope`` (Phi-3): each frequency divided by its own factor, ``long_factor`` past
  ``original_max_position_embeddings`` positions, else ``short_factor``, with the attention
  factor ``sqrt(1 + ln(factor)/ln(original))``.
- ``ntk_alpha`` (HunYuan: a "dynamic" rope with a fixed ``alpha``, which transformers'
  HunYuanDenseV1RotaryEmbedding renames so): the base grows once, by the same power as dynamic
  NTK, ``base·alpha^(dims/(dims−2))``, whatever the sequence's length.

The fixture spells a kind's parameters as config.json does. Computed in float64 (transformers:
float32; the difference is about 1e-7 of each frequency).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
# The fixture key being parsed (core/variant.py's FixtureKey): Any here, so that core/inputs.py,
# which names RopeScaling, and core/variant.py stay below this module.
FixtureKey = Any


def plain(value: Any) -> Any:
    """A NumPy array or scalar (a whole-fixture .npz's member) as a list or a number."""
    return value.tolist() if isinstance(value, np.ndarray | np.generic) else value


ORIGINAL = "original_max_position_embeddings"
MAX = "max_position_embeddings"
# yarn's optional keys besides factor and the lengths (transformers' _compute_yarn_parameters)
YARN_TUNING = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate")


class RopeScaling(NamedTuple):
    """A kind of RoPE scaling and its parameters as the fixture gives them, in the kind's order
    (lists as tuples, so that a Rope stays hashable)."""

    kind: str
    params: tuple[tuple[str, Any], ...]

    def get(self, name: str, default: Any = None) -> Any:
        return dict(self.params).get(name, default)

    def config(self) -> dict[str, Any]:
        """Its JSON form: ``{"type": kind, parameter: value, ...}``."""
        out: dict[str, Any] = {"type": self.kind}
        out.update((k, list(v) if isinstance(v, tuple) else v) for k, v in self.params)
        return out


Compute = Callable[[FloatArray, RopeScaling, int, float, int], tuple[FloatArray, float]]


class Kind(NamedTuple):
    """One kind: its parameters and how it scales (``compute(inv_freq, scaling, dims, base,
    length)`` -> the scaled inverse frequencies and the attention factor)."""

    required: tuple[str, ...]
    optional: tuple[str, ...]
    compute: Compute
    by_length: bool  # whether the frequencies depend on the sequence's length
    words: str  # what it does, in a few words (errors, the formula)


def default_inv_freq(dims: int, base: float) -> FloatArray:
    """base^(-2i/dims) for i < dims/2, as transformers: 1 / base^(arange(0, dims, 2)/dims)."""
    inv: FloatArray = 1.0 / base ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
    return inv


def _linear(
    inv: FloatArray, s: RopeScaling, dims: int, base: float, length: int
) -> tuple[FloatArray, float]:
    return inv / s.get("factor"), 1.0


def _dynamic(
    inv: FloatArray, s: RopeScaling, dims: int, base: float, length: int
) -> tuple[FloatArray, float]:
    return default_inv_freq(dims, dynamic_base(s, dims, base, length)), 1.0


def dynamic_base(s: RopeScaling, dims: int, base: float, length: int) -> float:
    """The base dynamic NTK scaling rotates by for ``length`` positions: the base itself up to
    ``max_position_embeddings``, then ``base·(factor·L/max − (factor − 1))^(dims/(dims−2))``."""
    factor, longest = s.get("factor"), s.get(MAX)
    seen = max(length, longest)  # transformers: seq_len = max(position_ids) + 1, at least max
    return float(base * ((factor * seen / longest) - (factor - 1)) ** (dims / (dims - 2)))


def ntk_alpha_base(s: RopeScaling, dims: int, base: float) -> float:
    """The base NTK-alpha scaling rotates by: ``base·alpha^(dims/(dims−2))`` (transformers'
    ``compute_ntk_alpha_rope_parameters``, dims = head_dim)."""
    return float(base * s.get("alpha") ** (dims / (dims - 2)))


def _ntk_alpha(
    inv: FloatArray, s: RopeScaling, dims: int, base: float, length: int
) -> tuple[FloatArray, float]:
    return default_inv_freq(dims, ntk_alpha_base(s, dims, base)), 1.0


def llama3_bands(inv: FloatArray, s: RopeScaling) -> tuple[Any, Any, Any]:
    """(wavelengths, kept, scaled) of each pair: kept below ``original/high_freq_factor``,
    divided by factor above ``original/low_freq_factor``, smoothed between (neither)."""
    original = s.get(ORIGINAL)
    wavelen = 2 * math.pi / inv
    kept = wavelen < original / s.get("high_freq_factor")
    scaled = wavelen > original / s.get("low_freq_factor")
    return wavelen, kept, scaled


def llama3_smooth(wavelen: FloatArray, s: RopeScaling) -> FloatArray:
    """The smooth factor of each pair between the bands, (original/wavelen − low) / (high − low);
    0 where high_freq_factor = low_freq_factor (Llama 4 Scout's 1 and 1: no pair is between)."""
    low, high = s.get("low_freq_factor"), s.get("high_freq_factor")
    if high == low:
        return np.zeros_like(wavelen)
    out: FloatArray = (s.get(ORIGINAL) / wavelen - low) / (high - low)
    return out


def _llama3(
    inv: FloatArray, s: RopeScaling, dims: int, base: float, length: int
) -> tuple[FloatArray, float]:
    factor = s.get("factor")
    wavelen, kept, scaled = llama3_bands(inv, s)
    out = np.where(scaled, inv / factor, inv)
    smooth = llama3_smooth(wavelen, s)
    smoothed = (1 - smooth) * out / factor + smooth * out
    return np.where(~kept & ~scaled, smoothed, out), 1.0


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_factor(s: RopeScaling) -> float:
    """The scale yarn stretches by: ``factor``, else max_position_embeddings / original."""
    factor = s.get("factor")
    return float(factor) if factor is not None else s.get(MAX) / s.get(ORIGINAL)


def yarn_attention(s: RopeScaling) -> float:
    """The attention factor (mscale): given, or 0.1·ln(factor) + 1 (DeepSeek's ratio of two
    mscales when mscale and mscale_all_dim are set)."""
    given, factor = s.get("attention_factor"), yarn_factor(s)
    if given is not None:
        return float(given)
    mscale, all_dim = s.get("mscale"), s.get("mscale_all_dim")
    if mscale and all_dim:
        return _mscale(factor, mscale) / _mscale(factor, all_dim)
    return _mscale(factor)


def yarn_ramp(s: RopeScaling, dims: int, base: float) -> FloatArray:
    """Per pair, 0 where the frequency is kept (fast: more than beta_fast rotations over the
    original length), 1 where it is divided by factor (slow: fewer than beta_slow), a linear
    ramp between; transformers' ``find_correction_range`` and ``linear_ramp_factor``."""
    original = s.get(ORIGINAL)

    def correction(rotations: float) -> float:
        return dims * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction(s.get("beta_fast") or 32), correction(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp: FloatArray = np.clip((np.arange(dims // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    return ramp


def _yarn(
    inv: FloatArray, s: RopeScaling, dims: int, base: float, length: int
) -> tuple[FloatArray, float]:
    ramp = yarn_ramp(s, dims, base)
    return inv / yarn_factor(s) * ramp + inv * (1 - ramp), yarn_attention(s)


def longrope_factor(s: RopeScaling) -> float:
    factor = s.get("factor")
    return float(factor) if factor is not None else s.get(MAX) / s.get(ORIGINAL)


def longrope_attention(s: RopeScaling) -> float:
    given, factor = s.get("attention_factor"), longrope_factor(s)
    if given is not None:
        return float(given)
    return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(s.get(ORIGINAL)))


def longrope_long(s: RopeScaling, length: int) -> bool:
    """Whether the long factors apply: more positions than the original length."""
    return bool(length > s.get(ORIGINAL))


def _longrope(
    inv: FloatArray, s: RopeScaling, dims: int, base: float, length: int
) -> tuple[FloatArray, float]:
    ext = np.asarray(s.get("long_factor" if longrope_long(s, length) else "short_factor"))
    return inv / ext, longrope_attention(s)


KINDS: dict[str, Kind] = {
    "linear": Kind(("factor",), (), _linear, False, "every frequency / factor"),
    "dynamic": Kind(("factor", MAX), (), _dynamic, True, "NTK: the base grows past max"),
    "llama3": Kind(
        ("factor", "low_freq_factor", "high_freq_factor", ORIGINAL),
        (),
        _llama3,
        False,
        "low frequencies / factor, high kept, smoothed between",
    ),
    "yarn": Kind(
        (ORIGINAL,),
        ("factor", MAX, *YARN_TUNING),
        _yarn,
        False,
        "a ramp between kept and / factor, logits × mscale²",
    ),
    "longrope": Kind(
        ("short_factor", "long_factor", ORIGINAL),
        ("factor", MAX, "attention_factor"),
        _longrope,
        True,
        "per-pair factors, long past the original length",
    ),
    "ntk_alpha": Kind(("alpha",), (), _ntk_alpha, False, "NTK alpha: the base × alpha^(d/(d−2))"),
}


def frequencies(
    scaling: RopeScaling | None, dims: int, base: float, length: int, source: str = ""
) -> tuple[FloatArray, float]:
    """The inverse frequencies RoPE rotates by and the attention factor on cos and sin, for a
    sequence of ``length`` positions (max position + 1, as transformers' ``seq_len``).

    Every caller (the rotation of attn trace, decode, flash and the backward pass, MLA's, and
    attn rope's table) goes through here, and here each frequency is checked: finite, > 0 and
    with a finite wavelength, and the attention factor finite and > 0, else a ComputeError
    naming ``rope.scaling`` (``source``: the fixture)."""
    with np.errstate(all="ignore"):  # overflow is named below, not warned about
        inv = default_inv_freq(dims, base)
        if scaling is None:
            scaled, attention = inv, 1.0
        else:
            scaled, attention = KINDS[scaling.kind].compute(inv, scaling, dims, base, length)
        scaled = np.asarray(scaled, dtype=np.float64)
        ok = bool(
            np.isfinite(scaled).all()
            and (scaled > 0).all()
            and np.isfinite(2 * math.pi / scaled).all()
        )
    if not ok or not (math.isfinite(attention) and attention > 0):
        from attn_cli.errors import ComputeError

        what = "plain" if scaling is None else scaling.kind
        raise ComputeError(
            source,
            "rope" if scaling is None else "rope.scaling",
            f"gives {what} frequencies or an attention factor that are not finite and positive "
            f"for {length} positions (base {base:g}, {dims} dims)",
            "settings whose frequencies stay finite (a smaller factor, base or length)",
        )
    return scaled, float(attention)


# -- the fixture's ``rope.scaling`` ------------------------------------------------------------


def parse_scaling(
    raw: Any, key: FixtureKey, dims: int, base: float, field: str = "rope.scaling"
) -> RopeScaling:
    """``rope.scaling`` (or ``field``): ``{type: llama3, factor: 8, ...}`` with the kind's
    parameters named as config.json names them (``rope_type`` is read as ``type``)."""
    if not isinstance(raw, Mapping):
        raise key(
            f"got {key.describe(raw)}",
            "a mapping {type: " + " | ".join(KINDS) + ", factor: ..., ...}",
            field,
        )
    value = {str(k): plain(v) for k, v in raw.items() if v is not None}
    if "type" in value and "rope_type" in value and value["type"] != value["rope_type"]:
        raise key("gives both type and rope_type, and they differ", "one of them", field)
    kind = value.pop("type", value.pop("rope_type", None))
    value.pop("rope_type", None)
    if not isinstance(kind, str) or kind not in KINDS:
        raise key(
            f"type is {key.describe(kind)}",
            " | ".join(KINDS) + " (transformers' rope_type)",
            f"{field}.type",
        )
    spec = KINDS[kind]
    known = (*spec.required, *spec.optional)
    for name in value:
        if name not in known:
            raise key(
                f"has {name!r}, which {kind} does not read",
                "only " + ", ".join(known),
                f"{field}.{name}",
            )
    for name in spec.required:
        if name not in value:
            raise key(f"misses {name}", f"{kind} needs " + ", ".join(spec.required), field)
    params = {
        name: _parameter(name, value[name], key, dims, field) for name in known if name in value
    }
    scaling = RopeScaling(kind, tuple(params.items()))
    _check_kind(scaling, key, dims, base, field)
    return scaling


MOST_POSITIONS = 1 << 53  # a longer context is not a whole number of positions in float64
# The range each numeric parameter is read in: wide enough for every published config (factors
# 1-64, beta 1-32, mscale ~0.7-1), narrow enough that no formula of this module overflows,
# divides by zero or takes the log of 0 (a factor of 1e308 or 5e-324 is refused here, at load
# time, for attn trace, decode, flash and rope alike).
RANGES: dict[str, tuple[float, float]] = {
    "factor": (1e-3, 1e6),
    "low_freq_factor": (1e-3, 1e6),
    "high_freq_factor": (1e-3, 1e6),
    "beta_fast": (1e-3, 1e6),
    "beta_slow": (1e-3, 1e6),
    "attention_factor": (1e-3, 1e3),
    "mscale": (0.0, 1e3),
    "mscale_all_dim": (0.0, 1e3),
    "short_factor": (1e-3, 1e6),
    "long_factor": (1e-3, 1e6),
    "alpha": (1e-3, 1e6),  # HunYuan ships 1000; the base grows by about alpha
}


def _parameter(name: str, value: Any, key: FixtureKey, dims: int, within: str) -> Any:
    field = f"{within}.{name}"
    if name == "truncate":
        if type(value) is not bool:
            raise key(f"got {key.describe(value)}", "true or false", field)
        return value
    if name in ("short_factor", "long_factor"):
        low, high = RANGES[name]
        if not isinstance(value, list) or len(value) != dims // 2:
            expected = f"a list of {dims // 2} numbers from {low:g} to {high:g}, one per pair"
            raise key(f"got {key.describe(value)}", expected, field)
        return tuple(_in_range(v, key, f"{field}[{i}]", name) for i, v in enumerate(value))
    if name in (ORIGINAL, MAX):
        if type(value) is not int or not 1 <= value <= MOST_POSITIONS:
            raise key(
                f"got {key.describe(value)}", "a whole number of positions from 1 to 2**53", field
            )
        return value
    return _in_range(value, key, field, name)


def _in_range(value: Any, key: FixtureKey, field: str, name: str) -> float:
    """A finite number in the parameter's range (RANGES), else one line naming the field."""
    low, high = RANGES[name]
    expected = f"a number from {low:g} to {high:g}"
    if type(value) not in (int, float):
        raise key(f"got {key.describe(value)}", expected, field)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not low <= number <= high:  # NaN fails too
        raise key(f"got {key.describe(value)}", expected, field)
    return number


def _check_kind(s: RopeScaling, key: FixtureKey, dims: int, base: float, field: str) -> None:
    """What transformers' validation asks of a kind, and what its formulas need."""
    if s.kind in ("dynamic", "ntk_alpha") and dims <= 2:
        raise key(
            f"rotates {dims} dims",
            "more than 2 (the base grows by a power dims/(dims-2))",
            f"{field}.type",
        )
    if s.kind == "llama3" and s.get("high_freq_factor") < s.get("low_freq_factor"):
        raise key(
            f"high_freq_factor is {s.get('high_freq_factor')}",
            f"at least low_freq_factor ({s.get('low_freq_factor')})",
            f"{field}.high_freq_factor",
        )
    if s.kind in ("yarn", "longrope") and s.get("factor") is None and s.get(MAX) is None:
        raise key(
            "gives neither factor nor max_position_embeddings",
            "one of them (factor = max_position_embeddings / original)",
            field,
        )
    if s.kind == "longrope" and s.get(ORIGINAL) < 2:
        raise key(
            f"original_max_position_embeddings is {s.get(ORIGINAL)}",
            "at least 2 (longrope's attention factor divides by its log)",
            f"{field}.{ORIGINAL}",
        )
    if s.kind == "yarn" and base <= 1:
        raise key(
            f"rotates with base {base:g}",
            "a base above 1 (yarn's ramp divides by its log)",
            f"{field}.type",
        )


# -- per pair: which band of the scaling each rotated pair falls in ----------------------------

NO_MIX = float("nan")  # a kind that does not mix kept and scaled frequencies


def bands(
    scaling: RopeScaling | None, dims: int, base: float, length: int
) -> tuple[tuple[str, ...], FloatArray]:
    """Per rotated pair, the band the scaling puts it in and the share of "÷ factor" it gets.

    Bands: ``plain`` (no scaling), ``scaled`` (÷ factor), ``kept`` (unchanged), ``smooth``
    (llama3: between the two, mixed), ``ramp`` (yarn: between, mixed), ``grown`` (dynamic: the
    base grew), ``unchanged`` (dynamic: not past max yet), ``short`` / ``long`` (longrope's
    factor lists). The share is 0 for kept, 1 for scaled, the mix between for smooth and ramp
    (llama3: 1 − smooth; yarn: the ramp), NaN for the kinds that do not mix; ntk_alpha's base
    grew for every pair."""
    pairs = dims // 2
    none = np.full(pairs, NO_MIX)
    if scaling is None:
        return ("plain",) * pairs, none
    kind = scaling.kind
    if kind == "linear":
        return ("scaled",) * pairs, np.ones(pairs)
    if kind == "ntk_alpha":
        return ("grown",) * pairs, none
    if kind == "dynamic":
        grown = length > scaling.get(MAX)
        return ("grown" if grown else "unchanged",) * pairs, none
    if kind == "longrope":
        return ("long" if longrope_long(scaling, length) else "short",) * pairs, none
    if kind == "llama3":
        inv = default_inv_freq(dims, base)
        wavelen, kept, scaled = llama3_bands(inv, scaling)
        smooth = llama3_smooth(wavelen, scaling)
        mix = np.where(kept, 0.0, np.where(scaled, 1.0, 1.0 - smooth))
        names = np.where(kept, "kept", np.where(scaled, "scaled", "smooth"))
        return tuple(str(n) for n in names), mix
    ramp = yarn_ramp(scaling, dims, base)  # yarn
    names = np.where(ramp == 0, "kept", np.where(ramp == 1, "scaled", "ramp"))
    return tuple(str(n) for n in names), ramp


def trained_length(scaling: RopeScaling | None) -> int | None:
    """The context the frequencies were trained for: ``original_max_position_embeddings``
    (dynamic: ``max_position_embeddings``); None when the scaling does not say (linear)."""
    if scaling is None:
        return None
    trained = scaling.get(MAX if scaling.kind == "dynamic" else ORIGINAL)
    return None if trained is None else int(trained)
