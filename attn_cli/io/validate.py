"""Validation: a parsed fixture mapping in, :class:`Inputs` out, every mistake named."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attn_cli.core.chain import REGISTRY  # with the variants attn ships registered
from attn_cli.core.inputs import FloatArray, Inputs, IntArray
from attn_cli.core.limits import DEFAULT_MAX_ELEMENTS
from attn_cli.core.stages import STAGE_NAMES
from attn_cli.core.variant import Variant
from attn_cli.errors import InputError, did_you_mean
from attn_cli.errors import field_name as _field
from attn_cli.io.checker import Checker, describe, number, numeric_array, plain


def _own_keys() -> list[Variant]:
    """Attention's own keys (as torch SDPA's ``is_causal`` and ``attn_mask``): the variants that
    are fields of :class:`Inputs` with no ``key_order`` of their own, in the order of the fields.
    They are listed with ``scale``; those that hide keys are parsed before the other variants
    (which check against them: ``masks``), the rest after the scale."""
    fields = list(Inputs.__dataclass_fields__)
    own = [v for v in REGISTRY.values() if v.name in fields and v.key_order == Variant.key_order]
    return sorted(own, key=lambda v: fields.index(v.name))


def _hides(variant: Variant) -> bool:
    """Whether the variant has a rule of which keys a query may attend."""
    return type(variant).allowed is not Variant.allowed


_OWN_KEYS = tuple(v.name for v in _own_keys())
# The keys of the inputs' own arrays: X and the projections, or Q, K and V given directly.
INPUT_KEYS = ("X", "W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "Q", "K", "V")
KNOWN_KEYS = (
    "name",
    "description",
    "tokens",
    "key_tokens",
    *INPUT_KEYS,
    "heads",
    "kv_heads",
    "W_O",
    "b_O",
    "scale",
    *_OWN_KEYS,
    "expected",
    "X_kv",
    "positions",
    "key_positions",
    *(
        v.name
        for v in sorted(REGISTRY.values(), key=lambda v: v.key_order)
        if v.name not in _OWN_KEYS
    ),
    "grad",
)


# Keys whose numbers become float arrays: a NumPy array there is checked, not walked.
_FLOAT_KEYS = (
    *INPUT_KEYS,
    "W_O",
    "b_O",
    *_OWN_KEYS,
    "X_kv",
    *(v.name for v in REGISTRY.values() if "" in v.array_parts),
    "grad",
)


def _suggest(key: str, choices: Sequence[str]) -> str:
    return did_you_mean(key, choices)


def validate(obj: Any, source: str, *, max_elements: int = DEFAULT_MAX_ELEMENTS) -> Inputs:
    """Validate a parsed fixture mapping (values may be NumPy arrays) and build :class:`Inputs`."""
    # 1) known string keys only; `key: null` means the key is omitted
    obj = _known_keys(obj, source)
    _exclusive(obj, source)
    c = Checker(source, max_elements)
    heads = _positive_int(c, obj, "heads")
    kv_heads = _positive_int(c, obj, "kv_heads")
    # 2) the inputs: projection mode (X and weights) or direct mode (Q, K, V)
    latent = _latent_variant(obj)
    projection = latent is not None or _mode(c, obj) == "projection"
    if latent is not None:
        arrays = _latent(c, obj, latent, heads, kv_heads)
    elif projection:
        arrays = _projection(c, obj, heads, kv_heads)
    else:
        arrays = _direct(c, obj, heads, kv_heads)
    # 3) the output projection, what hides keys, labels, the variants, then attention's other keys
    W_O, b_O = _output_projection(c, obj, arrays)
    hiding = _parse(c, obj, arrays, [v for v in _own_keys() if _hides(v)], {})
    tokens, key_tokens = _labels(c, obj, arrays["seq_q"], arrays["seq_k"])
    variants = {**hiding, **_variants(c, obj, arrays, hiding)}
    name, description = _string(c, obj, "name"), _string(c, obj, "description")
    scale = _scale(c, obj)
    variants.update(_parse(c, obj, arrays, [v for v in _own_keys() if not _hides(v)], hiding))
    expected = _expected(c, obj)
    d_out = None if W_O is None else W_O.shape[1]
    grad = _grad(c, obj, arrays, d_out) if "grad" in obj else None
    extra = {k: variants.pop(k) for k in _plugged() if k in variants}
    given: dict[str, Any] = {k: arrays.get(k) for k in _ARRAYS}  # what the mode produced
    given.update({k: arrays[k] for k in _SIZES})
    return Inputs(
        source=source,
        mode="projection" if projection else "direct",
        name=name,
        description=description,
        tokens=tokens,
        key_tokens=key_tokens,
        W_O=W_O,
        b_O=b_O,
        scale=scale,
        expected=expected,
        grad=grad,
        **given,
        **variants,
        extra=extra,
    )


def _exclusive(obj: Mapping[str, Any], source: str) -> None:
    """A variant given with a key it cannot be combined with (its ``excludes``, when it says
    why: differential attention and RoPE) is a one-line error naming that key."""
    for v in REGISTRY.values():
        if v.excludes_why and obj.get(v.name) not in (None, False):
            for other in v.excludes:
                if obj.get(other) not in (None, False):
                    raise InputError(
                        source,
                        other,
                        f"given with {v.name}",
                        f"{v.name} without {other} ({v.excludes_why})",
                    )


def _plugged() -> tuple[str, ...]:
    """The keys of variants registered from outside the package: not fields of Inputs, their
    settings go to ``Inputs.extra``, parsed by the variant itself (core/variant.py ``parse``)."""
    return tuple(name for name in REGISTRY if name not in Inputs.__dataclass_fields__)


_SIZES = ("has_batch", "batch", "seq_q", "seq_k", "heads", "kv_heads", "d_k", "d_v")
_ARRAYS = (*INPUT_KEYS, "X_kv")


def _known_keys(obj: Any, source: str) -> dict[str, Any]:
    """The mapping with every key known and a string, and null values left out."""
    if not isinstance(obj, Mapping):
        raise InputError(source, "", f"top level is {describe(obj)}", "a mapping of fixture keys")
    for key in obj:
        if not isinstance(key, str):
            raise InputError(source, _field(key), f"key is {describe(key)}", "a string key")
        if key not in KNOWN_KEYS and key not in _plugged():
            known = tuple(dict.fromkeys((*KNOWN_KEYS, *_plugged())))
            raise InputError(
                source,
                _field(key),
                f"unknown key{_suggest(key, known)}",
                "one of " + ", ".join(known),
            )
    return {
        k: v if k in _FLOAT_KEYS and numeric_array(v) else plain(v)
        for k, v in obj.items()
        if v is not None
    }


def _mode(c: Checker, obj: Mapping[str, Any]) -> str:
    """``projection`` (X and weights) or ``direct`` (Q, K, V given); never both, never neither."""
    projection = [k for k in ("X", "W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V") if k in obj]
    direct = [k for k in ("Q", "K", "V") if k in obj]
    if projection and direct:
        raise c.error(
            direct[0],
            f"both modes at once ({', '.join(projection)} and {', '.join(direct)})",
            "either X with W_Q, W_K, W_V (projection mode) or Q, K, V (direct mode)",
        )
    if not projection and not direct:
        raise c.error(
            "", "no inputs", "X with W_Q, W_K, W_V (projection mode) or Q, K, V (direct mode)"
        )
    if direct and "X_kv" in obj:
        raise c.error(
            "X_kv",
            "given in direct mode (Q, K, V)",
            "X_kv only with X, W_Q, W_K, W_V (projection mode): K and V come from X_kv",
        )
    return "projection" if projection else "direct"


def _output_projection(
    c: Checker, obj: Mapping[str, Any], arrays: Mapping[str, Any]
) -> tuple[FloatArray | None, FloatArray | None]:
    """W_O [heads*d_v, d_out] and b_O [d_out], when given."""
    heads, d_v = arrays["heads"], arrays["d_v"]
    if "W_O" not in obj:
        if "b_O" in obj:
            raise c.error("b_O", "given without W_O", "W_O [heads*d_v, d_out] alongside b_O")
        return None, None
    W_O = c.floats(obj, "W_O", (2,), f"shape [heads*d_v, d_out] = [{heads * d_v}, d_out]")
    if W_O.shape[0] != heads * d_v:
        raise c.error(
            "W_O", f"has {W_O.shape[0]} rows", f"heads*d_v = {heads}*{d_v} = {heads * d_v} rows"
        )
    b_O = _vector(c, obj, "b_O", W_O.shape[1], "d_out (columns of W_O)") if "b_O" in obj else None
    return W_O, b_O


def _scale(c: Checker, obj: Mapping[str, Any]) -> float | None:
    """The fixture's scale (a finite number > 0), or None for 1/sqrt(d_k)."""
    if "scale" not in obj:
        return None
    s = obj["scale"]
    if not number(s):
        raise c.error("scale", f"got {describe(s)}", "a number > 0")
    try:
        finite = math.isfinite(float(s))
    except OverflowError:  # an int beyond float64
        finite = False
    if not finite or s <= 0:
        raise c.error("scale", f"is {s}", "a finite number > 0 (omit it for 1/sqrt(d_k))")
    return float(s)


def _labels(
    c: Checker, obj: Mapping[str, Any], seq_q: int, seq_k: int
) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
    """Query and key tokens; keys share the queries' when self-attention gives none."""
    tokens = _tokens(c, obj, "tokens", seq_q, "seq_q (one per query position)")
    key_tokens = _tokens(c, obj, "key_tokens", seq_k, "seq_k (one per key position)")
    if key_tokens is None and tokens is not None and seq_q == seq_k:
        key_tokens = tokens
    return tokens, key_tokens


def _string(c: Checker, obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key, "")
    if not isinstance(value, str):
        raise c.error(key, f"got {describe(value)}", "a string")
    _require_unicode(c, key, value)
    return value


def _require_unicode(c: Checker, field: str, text: str) -> None:
    """Refuse a lone surrogate (JSON ``"\\ud800"``): no terminal or file could print it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise c.error(
            field,
            f"holds a lone surrogate {text[e.start]!a} at character {e.start}",
            "text that is valid Unicode",
        ) from None


def _positive_int(c: Checker, obj: Mapping[str, Any], key: str) -> int | None:
    if key not in obj:
        return None
    value = obj[key]
    if type(value) is not int:
        raise c.error(key, f"got {describe(value)}", "a whole number >= 1")
    if value < 1:
        raise c.error(key, f"is {value}", "a whole number >= 1")
    return value


def _vector(c: Checker, obj: Mapping[str, Any], key: str, size: int, what: str) -> FloatArray:
    arr = c.floats(obj, key, (1,), f"a vector of length {what} = {size}")
    if arr.shape[0] != size:
        raise c.error(key, f"has length {arr.shape[0]}", f"{what} = {size}")
    return arr


def _split(c: Checker, key: str, width: int, n: int, n_name: str) -> int:
    if width % n:
        raise c.error(
            key,
            f"has {width} columns, not divisible by {n_name} = {n}",
            f"a multiple of {n_name} (each head owns a contiguous block of columns)",
        )
    return width // n


def _projection(
    c: Checker, obj: Mapping[str, Any], heads: int | None, kv_heads: int | None
) -> dict[str, Any]:
    for key in ("X", "W_Q", "W_K", "W_V"):
        if key not in obj:
            raise c.error(key, "missing", "X, W_Q, W_K and W_V together (projection mode)")
    X = c.floats(obj, "X", (2, 3), "shape [seq, d_model] or [batch, seq, d_model]")
    has_batch = X.ndim == 3
    X = X if has_batch else X[None]  # (batch, seq, d_model)
    X_kv = _x_kv(c, obj, X, has_batch) if "X_kv" in obj else None
    H = heads or 1
    Hkv = kv_heads or H
    _check_groups(c, H, Hkv)
    W = {}
    for key, n_name in (("W_Q", "heads"), ("W_K", "kv_heads"), ("W_V", "kv_heads")):
        source = X if key == "W_Q" or X_kv is None else X_kv
        src, width = ("X", "d_model") if source is X else ("X_kv", "d_model_kv")
        rows = source.shape[2]
        w = c.floats(obj, key, (2,), f"shape [{width}, {n_name}*d] = [{rows}, {n_name}*d]")
        if w.shape[0] != rows:
            raise c.error(
                key, f"has {w.shape[0]} rows", f"{width} = {rows} rows (columns of {src})"
            )
        W[key] = w
    d_k = _split(c, "W_Q", W["W_Q"].shape[1], H, "heads")
    d_k_kv = _split(c, "W_K", W["W_K"].shape[1], Hkv, "kv_heads")
    if d_k_kv != d_k:
        raise c.error(
            "W_K",
            f"has {W['W_K'].shape[1]} columns (d_k = {d_k_kv} per head)",
            f"kv_heads*d_k = {Hkv}*{d_k} = {Hkv * d_k} columns, matching W_Q",
        )
    d_v = _split(c, "W_V", W["W_V"].shape[1], Hkv, "kv_heads")
    out: dict[str, Any] = {"X": X, **W}
    for key, w_key in (("b_Q", "W_Q"), ("b_K", "W_K"), ("b_V", "W_V")):
        if key in obj:
            out[key] = _vector(c, obj, key, W[w_key].shape[1], f"columns of {w_key}")
    if X_kv is not None:
        out["X_kv"] = X_kv
    out.update(
        has_batch=has_batch,
        batch=X.shape[0],
        seq_q=X.shape[1],
        seq_k=X.shape[1] if X_kv is None else X_kv.shape[1],
        heads=H,
        kv_heads=Hkv,
        d_k=d_k,
        d_v=d_v,
    )
    return out


def _latent_variant(obj: Mapping[str, Any]) -> Variant | None:
    """The variant that makes Q, K and V itself from X (MLA), when the fixture gives its key."""
    return next((v for v in REGISTRY.values() if v.front_stages and v.name in obj), None)


def _latent(
    c: Checker, obj: Mapping[str, Any], v: Variant, heads: int | None, kv_heads: int | None
) -> dict[str, Any]:
    """X and a variant that projects Q, K and V from it (MLA): the sizes are its setting's."""
    others = [k for k in (*_ARRAYS, *v.excludes) if k in obj and k != "X"]
    if others or (kv_heads is not None and kv_heads != heads):
        got = others[0] if others else "kv_heads"
        raise c.error(
            got,
            f"given with {v.name}",
            f"X and {v.name} alone ({v.name} makes Q, K "
            "and V from X; every head reads the one latent)",
        )
    if "X" not in obj:
        raise c.error("X", "missing", f"X with {v.name} ({v.name} projects from X)")
    X = c.floats(obj, "X", (2, 3), "shape [seq, d_model] or [batch, seq, d_model]")
    has_batch = X.ndim == 3
    X = X if has_batch else X[None]  # (batch, seq, d_model)
    H, (B, T, d_model) = heads or 1, X.shape
    sizes = dict(heads=H, kv_heads=H, d_k=0, d_v=0, batch=B, seq_q=T, seq_k=T)
    value = v.parse(
        obj[v.name], _Key(c, v.name, **sizes, has_batch=has_batch, settings={}, d_model=d_model)
    )
    d_k, d_v = v.latent_sizes(value, H)
    return {"X": X, v.name: value, "has_batch": has_batch, **sizes, "d_k": d_k, "d_v": d_v}


def _x_kv(c: Checker, obj: Mapping[str, Any], X: FloatArray, has_batch: bool) -> FloatArray:
    """Cross-attention's second input, (batch, seq_k, d_model_kv) as X (batch, seq, d_model)."""
    doc = "shape [seq_k, d_model_kv] or [batch, seq_k, d_model_kv], with or without batch as X"
    X_kv = c.floats(obj, "X_kv", (2, 3), doc)
    if (X_kv.ndim == 3) != has_batch:
        what = f"has {X_kv.ndim} axes but X has {3 if has_batch else 2}"
        raise c.error("X_kv", what, "the layout of X: a batch axis in both or in neither")
    X_kv = X_kv if has_batch else X_kv[None]  # (batch, seq_k, d_model_kv)
    if X_kv.shape[0] != X.shape[0]:
        raise c.error("X_kv", f"has batch {X_kv.shape[0]}", f"batch {X.shape[0]} as in X")
    return X_kv


def _check_groups(c: Checker, heads: int, kv_heads: int) -> None:
    if heads % kv_heads:
        raise c.error(
            "kv_heads",
            f"is {kv_heads}, which does not divide heads = {heads}",
            "a divisor of heads (grouped-query attention)",
        )


def _direct(
    c: Checker, obj: Mapping[str, Any], heads: int | None, kv_heads: int | None
) -> dict[str, Any]:
    for key in ("Q", "K", "V"):
        if key not in obj:
            raise c.error(key, "missing", "Q, K and V together (direct mode)")
    layouts = "shape [seq, heads*d], [batch, seq, heads*d] or [batch, heads, seq, d]"
    Q = c.floats(obj, "Q", (2, 3, 4), layouts)
    K = c.floats(obj, "K", (2, 3, 4), layouts)
    V = c.floats(obj, "V", (2, 3, 4), layouts)
    for key, arr in (("K", K), ("V", V)):
        if arr.ndim != Q.ndim:
            raise c.error(key, f"has {arr.ndim} axes but Q has {Q.ndim}", "the same layout as Q")
    has_batch = Q.ndim >= 3
    if Q.ndim == 4:
        H, Hkv = Q.shape[1], K.shape[1]
        for key, given, actual in (("heads", heads, H), ("kv_heads", kv_heads, Hkv)):
            if given is not None and given != actual:
                raise c.error(
                    key,
                    f"is {given} but the arrays have {actual} on their head axis",
                    f"{actual}, or omit it (4-axis arrays carry their heads)",
                )
        if V.shape[1] != Hkv:
            raise c.error("V", f"has {V.shape[1]} heads", f"as many as K ({Hkv})")
        _check_groups(c, H, Hkv)
        q, k, v = Q, K, V
    else:
        H = heads or 1
        Hkv = kv_heads or H
        _check_groups(c, H, Hkv)
        if Q.ndim == 2:
            Q, K, V = Q[None], K[None], V[None]  # (1, seq, heads*d)
        d_q = _split(c, "Q", Q.shape[2], H, "heads")
        d_kk = _split(c, "K", K.shape[2], Hkv, "kv_heads")
        d_vv = _split(c, "V", V.shape[2], Hkv, "kv_heads")
        # (batch, seq, heads*d) -> (batch, heads, seq, d): head h owns columns h*d:(h+1)*d
        q = Q.reshape(Q.shape[0], Q.shape[1], H, d_q).transpose(0, 2, 1, 3)
        k = K.reshape(K.shape[0], K.shape[1], Hkv, d_kk).transpose(0, 2, 1, 3)
        v = V.reshape(V.shape[0], V.shape[1], Hkv, d_vv).transpose(0, 2, 1, 3)
    if k.shape[3] != q.shape[3]:
        raise c.error("K", f"has d_k = {k.shape[3]} per head", f"d_k = {q.shape[3]} as in Q")
    for key, arr in (("K", k), ("V", v)):
        if arr.shape[0] != q.shape[0]:
            raise c.error(key, f"has batch {arr.shape[0]}", f"batch {q.shape[0]} as in Q")
    if v.shape[2] != k.shape[2]:
        raise c.error("V", f"has {v.shape[2]} positions", f"seq_k = {k.shape[2]} as in K")
    return {
        "Q": np.ascontiguousarray(q),
        "K": np.ascontiguousarray(k),
        "V": np.ascontiguousarray(v),
        "has_batch": has_batch,
        "batch": q.shape[0],
        "seq_q": q.shape[2],
        "seq_k": k.shape[2],
        "heads": q.shape[1],
        "kv_heads": k.shape[1],
        "d_k": q.shape[3],
        "d_v": v.shape[3],
    }


def _tokens(
    c: Checker, obj: Mapping[str, Any], key: str, n: int, what: str
) -> tuple[str, ...] | None:
    if key not in obj:
        return None
    value = obj[key]
    if not isinstance(value, list):
        raise c.error(key, f"got {describe(value)}", "a list of strings")
    for i, t in enumerate(value):
        if not isinstance(t, str):
            raise c.error(f"{key}[{i}]", f"got {describe(t)}", "a string (quote it in YAML)")
        _require_unicode(c, f"{key}[{i}]", t)
    if len(value) != n:
        raise c.error(key, f"has {len(value)} tokens", f"{n} = {what}")
    return tuple(value)


def _expected(c: Checker, obj: Mapping[str, Any]) -> dict[str, FloatArray]:
    if "expected" not in obj:
        return {}
    value = obj["expected"]
    if not isinstance(value, Mapping):
        raise c.error("expected", f"got {describe(value)}", "a mapping of stage name to array")
    value = {stage: arr if numeric_array(arr) else plain(arr) for stage, arr in value.items()}
    out: dict[str, FloatArray] = {}
    for stage, arr in value.items():
        if stage not in STAGE_NAMES:
            raise c.error(
                f"expected.{_field(stage)}",
                f"unknown stage{_suggest(str(stage), STAGE_NAMES)}",
                "one of " + ", ".join(STAGE_NAMES),
            )
        if arr is None:
            continue
        out[stage] = c.floats(
            value,
            stage,
            (1, 2, 3, 4),
            "an array of 1 to 4 axes in the JSON trace layout",
            allow=("-inf", "inf", "nan"),
            name=f"expected.{stage}",
        )
    return out


def _grad(
    c: Checker, obj: Mapping[str, Any], arrays: Mapping[str, Any], d_out: int | None
) -> FloatArray:
    """The backward pass's dL/d(final stage), in that stage's layout; returned batch first."""
    has_batch = arrays["has_batch"]
    T, H, Dv = arrays["seq_q"], arrays["heads"], arrays["d_v"]
    if d_out is not None:
        stage, axes, shape = "projected", ["seq", "d_out"], [T, d_out]
    else:
        stage, axes, shape = "output", ["heads", "seq", "d_v"], [H, T, Dv]
    if has_batch:
        axes, shape = ["batch", *axes], [arrays["batch"], *shape]
    doc = f"dL/d{stage}, shape [{', '.join(axes)}] = {shape} (the layout of {stage})"
    grad = c.floats(obj, "grad", (len(shape),), doc)
    if list(grad.shape) != shape:
        raise c.error("grad", f"has shape {list(grad.shape)}", doc)
    return grad if has_batch else grad[None]


# ---------------------------------------------------------------------------------------------
# The variants: each parses its own key (core/plugins/); positions place tokens for them


@dataclass(frozen=True)
class _Key:
    """The fixture key a variant parses (core/variant.py FixtureKey), on the checker."""

    c: Checker
    name: str
    heads: int
    kv_heads: int
    d_k: int
    d_v: int
    d_model: int | None
    batch: int
    seq_q: int
    seq_k: int
    has_batch: bool
    settings: Mapping[str, Any]  # what was parsed before this key's turn

    @property
    def masks(self) -> bool:
        return any(x is not None and _hides(REGISTRY[n]) for n, x in self.settings.items())

    def setting(self, name: str) -> Any:
        return self.settings.get(name)

    def __call__(self, got: str, expected: str, field: str | None = None) -> InputError:
        return self.c.error(field or self.name, got, expected)

    def describe(self, value: Any) -> str:
        return describe(value)

    def floats(
        self, value: Any, field: str, ndims: tuple[int, ...], doc: str, allow: tuple[str, ...] = ()
    ) -> FloatArray:
        return self.c.floats({field: value}, field, ndims, doc, allow=allow)

    def shape(
        self, value: Any, field: str, leaf: Callable[[Any], bool], doc: str
    ) -> tuple[int, ...]:
        return self.c.shape_of(value, field, leaf, doc)


def _parse(
    c: Checker,
    obj: Mapping[str, Any],
    arrays: Mapping[str, Any],
    variants: list[Variant],
    before: Mapping[str, Any],
) -> dict[str, Any]:
    """The settings the fixture gives of ``variants``, each parsed by its variant in turn,
    checked against the sizes and the settings parsed ``before``."""
    sizes = {k: arrays[k] for k in ("heads", "kv_heads", "d_k", "d_v", "batch", "seq_q", "seq_k")}
    X = arrays.get("X")
    sizes["d_model"] = None if X is None else int(X.shape[-1])
    return {
        v.name: v.parse(
            obj[v.name], _Key(c, v.name, **sizes, has_batch=arrays["has_batch"], settings=before)
        )
        for v in variants
        if v.name in obj
    }


def _variants(
    c: Checker, obj: Mapping[str, Any], arrays: Mapping[str, Any], hiding: Mapping[str, Any]
) -> dict[str, Any]:
    """The positions, and each variant's setting parsed by the variant, by name (attention's own
    keys, ``_own_keys``, are parsed around them); ``hiding``: the settings that hide keys."""
    positions = {
        "positions": _positions(c, obj, "positions", arrays["seq_q"], "seq_q"),
        "key_positions": _positions(c, obj, "key_positions", arrays["seq_k"], "seq_k"),
    }
    out = _parse(
        c,
        obj,
        arrays,
        [v for v in REGISTRY.values() if v.name not in _OWN_KEYS and v.name not in arrays],
        hiding,
    )
    out.update({v.name: arrays[v.name] for v in REGISTRY.values() if v.name in arrays})
    readers = [v for v in _listed() if v.reads_positions]
    given = [k for k, p in positions.items() if p is not None]
    # positions also place the tokens of causal attention (Inputs.token_positions: its default
    # positions are upper-left or lower-right), though causal writes none into the JSON config
    causal = hiding.get("causal")
    if given and causal is None and all(out.get(v.name) is None for v in readers):
        raise c.error(
            given[0],
            "given but nothing reads positions",
            f"{', '.join(v.name for v in readers)} or causal alongside it (positions only "
            "place tokens for them)",
        )
    return {**positions, **out}


def _listed() -> list[Variant]:
    """The registered variants in the order the fixture's keys are listed (``key_order``)."""
    return sorted(REGISTRY.values(), key=lambda v: v.key_order)


def _positions(
    c: Checker, obj: Mapping[str, Any], key: str, n: int, n_name: str
) -> IntArray | None:
    """A list of ``n`` whole numbers >= 0: the token positions of queries or keys."""
    if key not in obj:
        return None
    value = obj[key]
    doc = f"a list of {n_name} = {n} whole numbers >= 0"
    if not isinstance(value, list):
        raise c.error(key, f"got {describe(value)}", doc)
    for i, p in enumerate(value):
        if type(p) is not int:
            raise c.error(f"{key}[{i}]", f"got {describe(p)}", "a whole number >= 0")
        if p < 0 or p > 2**53:
            raise c.error(f"{key}[{i}]", f"is {p}", "a whole number between 0 and 2^53")
    if len(value) != n:
        raise c.error(key, f"has {len(value)} entries", doc)
    return np.array(value, dtype=np.int64)
