"""Rotary position embedding (Su et al.; HF ``rope_theta``, ``partial_rotary_factor``): Q and K
rotated by their positions. A Q/K transform of the chain: Q -> Q_rot, K -> K_rot; decoding
rotates a key once, when it enters the cache, and a query at its position."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from attn_cli.core.inputs import Inputs, Rope
from attn_cli.core.plugins.parsing import (
    finite_flag,
    fold_scaling,
    known_subkeys,
    plain,
    positive_number,
    true_or_mapping,
)
from attn_cli.core.stage_spec import number_text
from attn_cli.core.variant import (
    FixtureKey,
    FloatArray,
    NewOption,
    NewSpec,
    QKAt,
    Variant,
    before,
    exact,
    register,
)
from attn_cli.core.variants import ROPE_LAYOUTS, RopeLayout, check_rope_dims, rope_pairs

DOC = "true or a mapping {base: 10000, layout: half | interleaved, dims: d_k, scaling: {...}}"


class RotaryEmbedding(Variant[Rope]):
    order = 70
    name = "rope"
    subkeys = ("base", "layout", "dims", "scaling")
    reads_positions = True
    key_order = 20
    suffix = "rot"
    positional = True
    new_options = (
        NewOption(
            "rope",
            str,
            "Rotary position embedding of Q and K: half pairs i with i + d_k/2 (HF), "
            "interleaved pairs 2i with 2i+1 (Meta's llama).",
            metavar="half|interleaved",
            choices=ROPE_LAYOUTS,
            example=("llama.yaml --rope half --causal", "Llama: RoPE, causal"),
        ),
        NewOption(
            "rope_base",
            float,
            "RoPE base (default 10000): angle = position × B^(−2i/dims). Needs --rope.",
            metavar="B",
            field="rope.base",
        ),
        NewOption(
            "rope_dims",
            int,
            "Rotate only the first N (even) dimensions of each head (partial "
            "rotary). Needs --rope.",
            metavar="N",
            field="rope.dims",
        ),
    )
    new_rank, new_order = 10, 10

    def stage_formula(self, value: Rope, inputs: Inputs, stage: str) -> str:
        where = "positions" if stage[0] == "Q" else "key positions"
        formula = (
            f"{stage} = RoPE({before(inputs, stage)}, {where}): {value.layout} layout, "
            f"base {number_text(value.base)}, {value.dims} of {inputs.d_k} dims"
        )
        if value.scaling is None:
            return formula
        _, attention = frequencies(value, inputs)
        formula += f", {value.scaling.kind} scaling"
        if attention != 1.0:
            formula += f", cos and sin × {number_text(attention)}"
        return formula

    def grad_formula(self, value: Rope, inputs: Inputs, d_out: str, x_in: str) -> str:
        return f"RoPE⁻¹({d_out})"

    def transform(self, value: Rope, at: QKAt, x: FloatArray) -> FloatArray:
        return _rotate(value, at, x, inverse=False)  # (B, heads, n, D)

    def grad_transform(
        self, value: Rope, at: QKAt, d_out: FloatArray, x_in: FloatArray
    ) -> FloatArray:
        """A rotation per position (times the attention factor): its transpose, rotation by
        −angle (times the factor), carries d back."""
        return _rotate(value, at, d_out, inverse=True)  # (B, heads, n, D)

    def refuses(self, value: Rope, inputs: Inputs, what: str) -> tuple[str, str, str] | None:
        """Decoding: dynamic and longrope frequencies follow the length: transformers' generate
        rotates each new key with its own step's and keeps the old ones, which one trace
        cannot be."""
        scaling = value.scaling
        if what != "decoding" or scaling is None or scaling.kind not in ("dynamic", "longrope"):
            return None
        limit = scaling.get(
            "max_position_embeddings"
            if scaling.kind == "dynamic"
            else "original_max_position_embeddings"
        )
        if rope_length(inputs) <= limit:
            return None  # the frequencies of every step are the whole sequence's
        return (
            "rope.scaling",
            f"{scaling.kind} frequencies change once the sequence passes "
            f"{limit} positions, and a KV cache keeps keys rotated at the old ones",
            f"at most {limit} positions to decode (attn trace shows the whole sequence)",
        )

    def parse(self, raw: Any, key: FixtureKey) -> Rope | None:
        value = true_or_mapping(raw, key, DOC)
        if value is None:
            return None
        value = {} if value is True else {k: plain(v) for k, v in value.items() if v is not None}
        value = fold_scaling(value, key, "rope.scaling")
        known_subkeys(value, key, self.name, self.subkeys)
        base = 10000.0
        if "base" in value:
            base = positive_number(value["base"], key, "base^(-2i/dims)", "rope.base")
        layout = value.get("layout", "half")
        if layout not in ROPE_LAYOUTS:
            raise key(
                f"got {key.describe(layout)}",
                '"half" (pairs i and i + dims/2, HF rotate_half) or "interleaved" (pairs 2i and '
                "2i+1, Meta llama)",
                "rope.layout",
            )
        dims = _dims(value, key)
        if value.get("scaling") is None:
            return Rope(base, layout, dims)
        from attn_cli.core.rope_scaling import parse_scaling

        return Rope(base, layout, dims, parse_scaling(value["scaling"], key, dims, base))

    def config(self, value: Rope, inputs: Inputs) -> dict[str, Any]:
        out: dict[str, Any] = {"base": value.base, "layout": value.layout, "dims": value.dims}
        if value.scaling is not None:
            out["scaling"] = value.scaling.config()
        return out

    def new_problem(self, spec: NewSpec) -> tuple[str, str, str] | None:
        problem = finite_flag(spec, "rope_base")
        for name in ("rope_base", "rope_dims"):
            if problem is None and name in spec.options and self.name not in spec.options:
                flag = "--" + name.replace("_", "-")
                problem = name, "given without --rope", f"--rope half|interleaved with {flag}"
        return problem

    def new_members(self, spec: NewSpec, rng: np.random.Generator) -> dict[str, Any]:
        if self.name not in spec.options:
            return {}
        members = {"rope.layout": np.array(spec.options[self.name])}
        if "rope_base" in spec.options:
            members["rope.base"] = np.array(float(spec.options["rope_base"]))
        if "rope_dims" in spec.options:
            members["rope.dims"] = np.array(spec.options["rope_dims"])
        return members

    def new_lines(self, spec: NewSpec, members: Mapping[str, Any]) -> list[str]:
        layout = spec.options[self.name]
        pairs = (
            "dimension i pairs with i + dims/2 (HF rotate_half, GPT-NeoX)"
            if layout == "half"
            else "dimension 2i pairs with 2i+1 (Meta's llama, GPT-J)"
        )
        dims = spec.options.get("rope_dims", spec.d_k)
        rest = "" if dims == spec.d_k else f"; the other {spec.d_k - dims} pass through"
        return [
            "rope:   # rotary position embedding of Q and K (not V), after the projection",
            f"  layout: {layout}   # {pairs}",
            f"  base: {exact(spec.options.get('rope_base', 10000.0))}"
            "   # angle = position * base^(-2i/dims)",
            f"  dims: {dims}   # the first {dims} of d_k = {spec.d_k} dimensions rotate{rest}",
        ]

    def new_words(self, spec: NewSpec, members: Mapping[str, Any]) -> str:
        return f"RoPE ({spec.options[self.name]})"


def _dims(value: dict[str, Any], key: FixtureKey) -> int:
    """How many dimensions of each head rotate: an even number up to d_k (the default)."""
    dims = value.get("dims", key.d_k)
    if type(dims) is not int or not 2 <= dims <= key.d_k or dims % 2:
        what = f"got {key.describe(dims)}" if type(dims) is not int else f"is {dims}"
        what += "" if "dims" in value else " (d_k, the default)"
        raise key(
            what,
            f"an even whole number between 2 and d_k = {key.d_k} (RoPE rotates pairs of "
            "dimensions)",
            "rope.dims",
        )
    return dims


def rope_length(inputs: Inputs) -> int:
    """The sequence length RoPE scaling reads: the largest position + 1, of queries and keys
    (transformers' ``seq_len = max(position_ids) + 1``)."""
    pos_q, pos_k = inputs.token_positions()
    return int(max(pos_q.max(initial=0), pos_k.max(initial=0))) + 1


def frequencies(rope: Rope, inputs: Inputs) -> tuple[FloatArray, float]:
    """The inverse frequencies these inputs rotate by, and the attention factor on cos and sin:
    ``base^(-2i/dims)`` and 1, or as ``rope.scaling`` says (core/rope_scaling.py)."""
    if rope.scaling is None:
        return rope_inv_freq(rope.dims, rope.base), 1.0
    from attn_cli.core.rope_scaling import frequencies as scaled

    return scaled(rope.scaling, rope.dims, rope.base, rope_length(inputs), inputs.source)


def rope_inv_freq(dims: int, base: float = 10000.0) -> FloatArray:
    """inv_freq[i] = base^(-2i/dims) for i < dims/2, as HF: 1 / base^(arange(0, dims, 2)/dims)
    (HF ``_compute_default_rope_parameters``, Meta ``precompute_freqs_cis``)."""
    check_rope_dims(dims)
    inv_freq: FloatArray = 1.0 / base ** (np.arange(0, dims, 2, dtype=np.float64) / dims)  # (P,)
    return inv_freq


def rope_angles(
    positions: Any, dims: int, base: float = 10000.0, inv_freq: FloatArray | None = None
) -> FloatArray:
    """angle[t, i] = position[t] * inv_freq[i], in float64 (HF: float32, differences ~1e-7);
    inv_freq is base^(-2i/dims) unless given (RoPE scaling)."""
    pos = np.asarray(positions, dtype=np.float64)  # (T,)
    freq = rope_inv_freq(dims, base) if inv_freq is None else inv_freq
    angles: FloatArray = np.outer(pos, freq)  # (T, P)
    return angles


def apply_rope(
    x: FloatArray,
    positions: Any,
    *,
    base: float = 10000.0,
    layout: RopeLayout = "half",
    dims: int | None = None,
    inverse: bool = False,
    inv_freq: FloatArray | None = None,
    attention: float = 1.0,
) -> FloatArray:
    """Rotate each pair (a, b) of x (..., T, D) by its angle: (a cos - b sin, b cos + a sin).

    Partial rotary (dims < D): the first ``dims`` dimensions rotate, the rest pass through
    (GPT-NeoX ``rotary_pct``, Phi ``partial_rotary_factor``). ``inverse`` rotates by -angle
    (the transpose of the rotation; the backward pass needs it). ``inv_freq`` replaces
    base^(-2i/dims) and ``attention`` multiplies cos and sin (RoPE scaling, as transformers'
    ``attention_scaling``): the dimensions passed through are not multiplied.
    """
    D = x.shape[-1]
    R = D if dims is None else dims
    if not 0 < R <= D:
        raise ValueError(f"RoPE dims must be in 1..{D} (d_k), not {R}")
    pos = np.asarray(positions)
    if pos.shape != (x.shape[-2],):
        raise ValueError(f"positions must have shape ({x.shape[-2]},), not {pos.shape}")
    first, second = rope_pairs(R, layout)
    angles = rope_angles(pos, R, base, inv_freq)  # (T, P)
    cos = (np.cos(angles) * attention).astype(x.dtype, copy=False)  # (T, P)
    sin = (np.sin(angles) * attention).astype(x.dtype, copy=False)  # (T, P)
    if inverse:
        sin = -sin
    a = x[..., first]  # (..., T, P)
    b = x[..., second]  # (..., T, P)
    out: FloatArray = x.copy()  # dimensions R..D-1 pass through (partial rotary)
    out[..., first] = a * cos - b * sin
    out[..., second] = b * cos + a * sin
    return out


register(RotaryEmbedding())


def _rotate(value: Rope, at: QKAt, x: FloatArray, inverse: bool) -> FloatArray:
    """x (B, heads, n, D) rotated by each token's angle (by minus it: ``inverse``), times the
    attention factor."""
    inv_freq, attention = frequencies(value, at.inputs)
    return apply_rope(
        x,
        at.positions,
        layout=value.layout,
        dims=value.dims,
        inverse=inverse,
        inv_freq=inv_freq,
        attention=attention,
    )
