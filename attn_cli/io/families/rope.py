"""RoPE as config.json gives it: ``rope_parameters`` (transformers 5) or the legacy keys, the
scalings transformers' ROPE_INIT_FUNCTIONS read, per layer type where a family has two bases.
A family's differences (its default theta, a renamed rope type, the legacy theta key) come from
its ``Arch`` (decoder.py), never from its name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attn_cli.core.rope_scaling import ORIGINAL, YARN_TUNING
from attn_cli.errors import field_name
from attn_cli.io.families.arch import Arch
from attn_cli.io.families.config import Config, shown
from attn_cli.io.families.plan import Rope

ROPE_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")  # of a default rope


def rope_mapping(config: Config) -> tuple[Any, str]:
    """The RoPE mapping and its key: ``rope_scaling`` where it is set, as transformers 5 takes
    it over ``rope_parameters`` (``convert_rope_params_to_dict``), else ``rope_parameters``."""
    scaling = config.mapping("rope_scaling")
    if scaling:
        return scaling, "rope_scaling"
    params = config.mapping("rope_parameters")
    if params is not None:
        return params, "rope_parameters"
    return scaling, "rope_scaling"


# What transformers' ROPE_INIT_FUNCTIONS read of each kind besides rope_theta, and from where:
# the rope mapping, or config.json's max_position_embeddings (core/rope_scaling.py's KINDS).
SCALED_READS = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", ORIGINAL),
    "yarn": ("factor", ORIGINAL, *YARN_TUNING),
    "longrope": ("short_factor", "long_factor", "factor", ORIGINAL, "attention_factor"),
    "ntk_alpha": ("alpha",),  # a family's "dynamic" rope with an alpha (Arch.ntk_alpha)
}
WITH_ORIGINAL = ("llama3", "yarn", "longrope")  # standardize_rope_params fills it in
LAYER_TYPES = ("sliding_attention", "full_attention")


def _scaling(
    config: Config, key: str, params: Mapping[str, Any], rope_type: Any, arch: Arch
) -> tuple[tuple[str, Any], ...] | None:
    """The fixture's rope.scaling from the rope mapping, as transformers' rope init functions
    read it; any other key of the mapping is refused (a rope attn would silently not apply).

    A top-level original_max_position_embeddings wins over the mapping's, as in transformers'
    standardize_rope_params (Phi3Config has one whatever config.json says: 4096)."""
    reads = SCALED_READS.get(rope_type, ()) if isinstance(rope_type, str) else ()
    if rope_type != "default" and not reads:
        raise config.error(
            key,
            f"rope_type {shown(rope_type)} is not supported",
            "default, " + ", ".join(SCALED_READS) + " (transformers' ROPE_INIT_FUNCTIONS)",
        )
    other = next((k for k in params if k not in (*ROPE_KEYS, *reads, *arch.rope_extra)), None)
    if other is not None:  # mrope_section, ...: a rope attn would silently not apply
        kind = "a default rope" if rope_type == "default" else f"a {rope_type} rope"
        raise config.error(
            f"{key}.{field_name(other)}",
            f"got {shown(params[other])} in {kind}",
            "only " + ", ".join((*ROPE_KEYS[:3], "partial_rotary_factor", *reads)),
        )
    if rope_type == "default":
        return None
    found = {k: params[k] for k in reads if params.get(k) is not None}
    original = "original_max_position_embeddings"

    def longest() -> int:  # read only where the rope needs it
        key = "max_position_embeddings"
        return config.whole(key, arch.size(key))

    if rope_type in WITH_ORIGINAL and (config.has(original) or arch.fixed_original):
        found[original] = config.whole(original, 4096)
    elif rope_type in WITH_ORIGINAL:
        found.setdefault(original, longest())
    if rope_type not in ("linear", "llama3", "ntk_alpha"):  # dynamic's length; yarn's, longrope's
        found["max_position_embeddings"] = longest()
    return (("type", rope_type), *found.items())


def scaling_note(scaling: tuple[tuple[str, Any], ...] | None) -> str:
    if scaling is None:
        return ""
    kind = dict(scaling)["type"]
    return f"RoPE scaling {kind}, as transformers' {kind} rope init computes it"


def _typed_rope(config: Config, arch: Arch, kind: str) -> tuple[dict[str, Any], str, float]:
    """Gemma 3's and OLMo 3's RoPE of one layer type: rope_parameters keyed by layer type (as
    transformers 5 writes it), or the legacy keys (rope_theta and rope_scaling for full layers,
    Gemma 3's rope_local_base_freq for sliding ones); with the type's default theta."""
    assert arch.by_type is not None
    default = arch.by_type[kind == "full_attention"]
    params = config.mapping("rope_parameters")  # on every layer type: a list is one line
    if params is not None and set(params) & set(LAYER_TYPES):
        if config.mapping("rope_scaling") or set(params) - set(LAYER_TYPES):
            raise config.error(
                "rope_parameters",
                f"got {shown(params)} beside rope_scaling or other keys",
                "a mapping per layer type (sliding_attention, full_attention) alone",
            )
        one = params.get(kind) or {}
        if not isinstance(one, Mapping):
            raise config.error(f"rope_parameters.{kind}", f"got {shown(one)}", "a mapping")
        return dict(one), f"rope_parameters.{kind}", default
    if kind == "full_attention":
        one, key = rope_mapping(config)
        one = dict(one or {})
        one.setdefault("rope_theta", config.number("rope_theta", default))
        return one, key, default
    local = arch.local_theta
    theta = config.number(local, default) if local else default
    return {"rope_type": "default", "rope_theta": theta}, "rope_local_base_freq", default


def rope_of(config: Config, arch: Arch, head_dim: int, kind: str) -> tuple[Rope, str]:
    """RoPE of this layer: base, rotated dims, layout, scaling, from ``rope_parameters``
    (transformers 5) or the legacy keys, and a note of its scaling and partial rotation."""
    if arch.by_type is not None:
        params, key, theta = _typed_rope(config, arch, kind)
    else:
        params, key = rope_mapping(config)
        params, theta = ({} if params is None else params), arch.theta
    if not isinstance(params, Mapping) or any(isinstance(v, Mapping) for v in params.values()):
        raise config.error(key, f"got {shown(params)}", "one mapping such as {rope_type: default}")
    if arch.default_rope and key == "rope_scaling" and not params:
        params = dict(arch.default_rope)  # the config class's default when config.json has none
    rope_type = params.get("rope_type", params.get("type", "default"))
    if isinstance(rope_type, str):
        rope_type = dict(arch.renamed_ropes).get(rope_type, rope_type)
    if arch.ntk_alpha and rope_type == "dynamic" and params.get("alpha"):
        rope_type = "ntk_alpha"  # as transformers' HunYuanDenseV1RotaryEmbedding renames it
    scaling = _scaling(config, key, params, rope_type, arch)
    given = Config(params, config.source)
    legacy = arch.theta_key
    base = (given if "rope_theta" in params else config).number(
        "rope_theta" if "rope_theta" in params else legacy, theta
    )
    if arch.partial is None:  # check_keys notes (or refuses) the factor it ignores
        note = scaling_note(scaling)
        return Rope(base=base, dims=head_dim, layout=arch.layout, scaling=scaling), note
    pct = arch.partial_key
    nested = "partial_rotary_factor" in params
    factor = (given if nested else config).number(
        "partial_rotary_factor" if nested else pct, arch.partial
    )
    dims = int(head_dim * factor)
    if dims < 2 or dims % 2 or factor > 1:
        raise config.error(
            f"{key}.partial_rotary_factor" if nested else pct,
            f"{factor} gives {dims} rotated dims of {head_dim}",
            "a factor in (0, 1] giving an even number of dims",
        )
    note = "; ".join(
        n
        for n in (
            scaling_note(scaling),
            (
                f"partial rotary: the first {dims} of {head_dim} dims rotate"
                if dims < head_dim
                else ""
            ),
        )
        if n
    )
    return Rope(base=base, dims=dims, layout=arch.layout, scaling=scaling), note
