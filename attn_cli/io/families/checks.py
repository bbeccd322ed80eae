"""What ``attn import`` checks of a checkpoint against its family: the model_type (or --arch),
every config.json key against the family's allowlist, every tensor of the layer against its plan.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from attn_cli.errors import InputError, field_name
from attn_cli.io.families.config import Config, shown, spelled
from attn_cli.io.families.keys import DROPOUT, INERT, NEUTRAL, Rule
from attn_cli.io.families.plan import LayerPlan
from attn_cli.io.families.registry import REGISTRY, get
from attn_cli.io.families.rope import ROPE_KEYS, rope_mapping


def family_of(config: Config, arch: str | None) -> str:
    """The family: ``arch`` if given, else config.json's ``model_type``; others refused."""
    name = arch if arch is not None else config.data.get("model_type")
    source, key = ("", "arch") if arch is not None else (config.source, "model_type")
    option = "arch" if arch is not None else None
    if not isinstance(name, str):
        what = "a model type: " + ", ".join(REGISTRY)
        raise InputError(source, key, f"got {name!r}", what, option=option)
    if name not in REGISTRY:
        why = f" ({KNOWN_TYPES[name]})" if name in KNOWN_TYPES else ""
        raise InputError(
            source,
            key,
            f"model type {name!r} is not supported{why}",
            "one of " + ", ".join(REGISTRY),
            option=option,
        )
    return name


def plan_layer(config: Config, family: str, layer: int) -> LayerPlan:
    """The plan of layer ``layer`` of a checkpoint of ``family`` described by ``config``."""
    wrapper = get(family).wrapper
    if wrapper is not None:  # the text model's layer, found only under the wrapper's prefixes
        plan = plan_layer(text_config(config, family), wrapper.text, layer)
        return replace(plan, family=family, prefixes=wrapper.prefixes)
    return get(family).plan(config, layer)


def text_model(config: Config, family: str) -> tuple[Config, str]:
    """The config and family of the text model (a wrapper's text_config), else as given."""
    wrapper = get(family).wrapper
    if wrapper is None:
        return config, family
    return text_config(config, family), wrapper.text


def text_config(config: Config, family: str) -> Config:
    """A wrapper's ``text_config``: a mapping whose model_type is the wrapper's text family."""
    wrapper = get(family).wrapper
    assert wrapper is not None
    text = wrapper.text
    data = config.data.get("text_config")
    if not isinstance(data, Mapping):
        raise config.error(
            "text_config",
            "missing" if data is None else f"got {spelled(data)}",
            f"the text model's config: a mapping with model_type {text!r}",
        )
    model_type = data.get("model_type")
    if model_type != text:
        got = "missing" if model_type is None else f"got {spelled(model_type)}"
        raise config.error(
            "text_config.model_type",
            f"{got}: attn reads a {family} checkpoint's text model as {text}",
            repr(text),
        )
    return Config(data, config.source, f"{config.path}text_config.")


# Model types attn knows and does not import, with what their attention does that a family's
# plan would miss: --arch never reads one of them as a family.
KNOWN_TYPES = {
    "opt": "learned positions offset by 2",
    "granitemoe": "attention_multiplier as the scale, multipliers on embeddings and residuals",
    "hunyuan_v1_dense": "q/k norm after RoPE (attn's q/k norm comes before it), NTK alpha",
    "falcon": "a fused query_key_value, multi-query heads, parallel attention, optional ALiBi",
    "bloom": "ALiBi position biases and a fused query_key_value",
    "mpt": "ALiBi position biases and a fused Wqkv",
}


# Families whose conventions no config.json key or tensor name shows: read as one of them, a
# checkpoint of another model would import with numbers that are not its own.
def resolve_family(config: Config, arch: str | None) -> tuple[str, tuple[str, ...]]:
    """The family (config.json's model_type, or ``arch``) and a note of what ``arch`` overrode.

    ``arch`` reads a model_type attn does not know (a fine-tune's own name, or none) as that
    family, every key then checked against the family's allowlist; a model_type attn knows
    as another family, or as a model it does not import, is refused.
    """
    family = family_of(config, arch)
    model_type = config.data.get("model_type")
    if arch is None or model_type == family:
        return family, ()
    if isinstance(model_type, str) and (model_type in REGISTRY or model_type in KNOWN_TYPES):
        why = KNOWN_TYPES.get(model_type, f"attn imports it as {model_type}, with its own defaults")
        what = f"{model_type!r} is not {family}: {why}"
        expected = f"a {family} checkpoint, or one whose model_type attn does not know"
        raise _not_family(config, "model_type", what, expected)
    if get(family).arch_refused:
        raise InputError(
            config.source,
            "model_type",
            f"got {spelled(model_type)}: {get(family).arch_refused}",
            f"model_type {family!r} (the checkpoint's own)",
            option="arch",
        )
    _check_architectures(config, family)
    said = "no model_type" if model_type is None else f"model_type {shown(model_type)}"
    return family, (
        f"{said} read as {family}, as asked: every config.json key is one {family} reads, "
        "one that cannot change the attention, or at its neutral value",
    )


def _check_gemma_like(config: Config, family: str) -> None:
    """A GELU MLP marks a Gemma, whose RMSNorm scales by 1 + weight (a key no Gemma 1 config
    has otherwise): read as a family whose RMSNorm scales by the weight, it is refused."""
    if not get(family).plain_rms:
        return
    for key in ("hidden_act", "hidden_activation"):
        value = config.data.get(key)
        if isinstance(value, str) and value.startswith("gelu"):
            raise config.error(
                key,
                f"got {spelled(value)}: the MLP of a Gemma, whose RMSNorm scales by "
                f"1 + weight where {family}'s scales by the weight",
                f"a {family} checkpoint's activation (silu), or the checkpoint's own model_type",
            )


def _normal(name: str) -> str:
    """A model type or class name without case, ``_`` and ``-``: ``xlm-roberta`` -> xlmroberta."""
    return re.sub(r"[_\-]", "", name).lower()


def _known(name: str) -> str | None:
    """The model type attn knows (imported or not) that ``name`` spells, without case or ``_``."""
    known = {_normal(t): t for t in (*REGISTRY, *KNOWN_TYPES)}
    return known.get(_normal(name))


_CLASS = re.compile(r"(.+?)(Model|LMHeadModel|PreTrainedModel|For[A-Z]\w*)")


def _check_architectures(config: Config, family: str) -> None:
    """``architectures`` names no class of a model type attn knows as other than ``family``."""
    classes = config.data.get("architectures")
    for name in classes if isinstance(classes, list) else []:
        match = _CLASS.fullmatch(name) if isinstance(name, str) else None
        known = _known(match.group(1)) if match else None
        if known is not None and known != family:
            why = KNOWN_TYPES.get(known, f"attn imports it as {known}")
            what = f"names {name!r}, a {known} model: {why}"
            raise _not_family(config, "architectures", what, f"a {family} checkpoint")


def _not_family(config: Config, key: str, what: str, expected: str) -> InputError:
    """--arch refused: the checkpoint says it is another model."""
    return InputError(config.source, key, what, expected, option="arch")


def check_keys(config: Config, family: str) -> tuple[str, ...]:
    """Every config.json key is read by the family, inert, or neutral; notes of keys ignored.

    A key that is none of these is refused with its value and what attn expected: a key that
    changes the attention and is not understood is never ignored.
    """
    keys = get(family).keys
    native = config.data.get("model_type") == family
    # a wrapper's text model first: a checkpoint without one is no wrapper, whatever else it has
    wrapper = get(family).wrapper
    text = text_config(config, family) if wrapper is not None else None
    notes: list[str] = []
    inert = [key for key in config.data if key in keys.inert and key not in keys.reads]
    if inert:  # accepted, and said: the reader sees what attn took as having no effect
        hf_class = get(family).hf_class
        notes.append(f"inert keys ({hf_class}'s attention never reads them): {', '.join(inert)}")
    for key, value in config.data.items():
        if key in keys.reads or key in keys.inert:
            continue
        ignored = keys.ignored.get(key)
        own = ignored or keys.neutral.get(key)  # the family's rule before the shared tables
        if own is None and (key in INERT or key.endswith(DROPOUT)):
            continue
        rule = own or NEUTRAL.get(key) or _UNKNOWN
        if _is_neutral(value, rule):
            continue
        if ignored is not None and native:
            notes.append(f"{key} {spelled(value)} ignored: {rule.does.format(family=family)}")
            continue
        raise _refusal(config, key, value, rule, family, ignored is not None)
    notes += _nested_partial_rotary(config, family, native)
    if not native:
        _check_gemma_like(config, family)
        notes += _defaults_given(config, family)
    if text is not None and wrapper is not None:  # text_config's keys, against its family's
        notes += check_keys(text, wrapper.text)
    return tuple(notes)


def _defaults_given(config: Config, family: str) -> list[str]:
    """Read as ``family``, a checkpoint gives each key whose default turns something on (a
    window, a cap on the scores, a scale); an epsilon or RoPE base left out is noted as assumed."""
    model_type = config.data.get("model_type")

    def given(key: str) -> bool:
        params = rope_mapping(config)[0] if key in ROPE_KEYS else None
        return key in config.data or (isinstance(params, Mapping) and key in params)

    keys = get(family).keys
    for need in keys.needs:
        if (need.when is None or config.data.get(need.when) is True) and not any(
            given(k) for k in need.keys
        ):
            raise InputError(
                config.source,
                need.keys[0],
                f"missing: model_type {spelled(model_type)} is "
                f"not {family}, so {family}'s default cannot be assumed",
                "the key, as the model sets it",
                option="arch",
            )
    absent = [k for k in keys.assumed if not given(k)]
    return [f"{', '.join(absent)} absent: {family}'s default assumed"] if absent else []


_UNKNOWN = Rule((None,), "a key attn's {family} import does not know (it may change the attention)")


def _nested_partial_rotary(config: Config, family: str, native: bool) -> list[str]:
    """partial_rotary_factor inside the rope mapping, under the family's rule for the key."""
    params, key = rope_mapping(config)
    if not isinstance(params, Mapping) or "partial_rotary_factor" not in params:
        return []
    if get(family).reads_partial:  # read by its plan
        return []
    value = params["partial_rotary_factor"]
    ignoring = get(family).keys.ignored
    rule = ignoring.get("partial_rotary_factor") or NEUTRAL["partial_rotary_factor"]
    if _is_neutral(value, rule):
        return []
    name = f"{key}.partial_rotary_factor"
    ignored = "partial_rotary_factor" in ignoring
    if native and ignored:
        return [f"{name} {spelled(value)} ignored: {rule.does.format(family=family)}"]
    raise _refusal(config, name, value, rule, family, ignored)


def _is_neutral(value: Any, rule: Rule) -> bool:
    """``value`` is one of the rule's neutral values (true is not 1, as JSON tells them apart)."""
    return any(
        type(value) is type(n) and value == n
        if isinstance(value, bool) or isinstance(n, bool)
        else value == n
        for n in rule.neutral
    )


def _refusal(
    config: Config, key: str, value: Any, rule: Rule, family: str, ignored: bool
) -> InputError:
    """One line naming the key, its value, what it does, and the values attn accepts."""
    does = rule.does.format(family=family)
    if ignored:  # a key the family's class leaves unused, in a checkpoint of another model type
        model_type = config.data.get("model_type")
        does += f", but model_type {spelled(model_type)} is not {family} and may use it"
    elif rule is not _UNKNOWN:
        does += f", which attn's {family} import does not model"
    accepted = "absent or " + " or ".join(json.dumps(n) for n in rule.neutral)
    return config.error(field_name(key), f"got {spelled(value)}: {does}", accepted)


def check_tensors(names: list[str], prefix: str, plan: LayerPlan, source: str) -> None:
    """Every tensor of the layer's attention and pre-norm modules is one the plan reads.

    A q_norm, a bias or a scale the family's layout has no place for means another model:
    refused, never left out of the trace. A prefix naming another model type is refused too.
    """
    stem = _known(prefix.rstrip(".").rsplit(".", 1)[-1]) if prefix else None
    same = stem == plan.family or stem in get(plan.family).stems
    if stem is not None and not same:
        raise InputError(
            source,
            "",
            f"tensors under {prefix!r}, a {stem} model",
            f"a {plan.family} checkpoint",
            option="arch",
        )
    read = {prefix + t.name for t in plan.tensors}
    block = prefix + plan.block
    unused = re.compile(plan.unused)
    for name in names:
        inside = name.startswith(block) and name[len(block) :].startswith(plan.scopes)
        if inside and name not in read and not unused.fullmatch(name[len(block) :]):
            raise InputError(
                source,
                name,
                f"a tensor of layer {plan.layer}'s attention that the "
                f"{plan.family} layout has no place for",
                "only " + ", ".join(sorted(n[len(block) :] for n in read if n.startswith(block))),
            )


def prefix_of(names: list[str], plan: LayerPlan, source: str) -> str:
    """The prefix of the family's tensor names (``model.``, ``bert.``, ``transformer.``, none)."""
    pattern = re.compile(rf"(.*?){plan.anchor}")
    found = sorted({m.group(1) for n in names if (m := pattern.fullmatch(n))})
    if plan.prefixes:  # a wrapper's text model: the layers of its vision tower are not its
        found = [p for p in found if p in plan.prefixes] or [plan.prefixes[0]]
    if len(found) > 1:
        raise InputError(
            source,
            "",
            f"attention tensors under several prefixes ({', '.join(found)})",
            "one model per checkpoint",
        )
    return found[0] if found else ""
