"""Model families for ``attn import``: a checkpoint's config.json read into the plan of one layer.

A plan names every tensor that layer L's attention reads (without the checkpoint's prefix, such
as ``model.`` or ``bert.``), the shape config.json implies for it, and each variant's setting the
fixture must carry (RoPE, the sliding window, and the variants a family's own module reads: a
cap on the scores, a norm of q and k, a learned extra logit, ...). Defaults for keys
a config.json leaves out are those of the transformers config class of the family (read from
transformers 5.24's ``configuration_*.py``).

Each family is one ``Family`` object in one module of ``models/``, registered by its model_type
(registry.py) the way a variant is registered by its name; decoders that differ from Llama by a
table give an ``Arch`` (decoder.py) and a ``Block`` (blocks.py). ARCHITECTURE.md, "How to add a
family", walks through one.

    config.py    config.json's typed getters          plan.py     LayerPlan, BlockPlan, HeadPlan
    keys.py      the allowlists' shared tables         checks.py   model_type, keys, tensors
    rope.py      RoPE and its scalings                 decoder.py  the Llama-like base (Arch)
    blocks.py    the blocks past attention             experts.py  Mixtral's and Qwen's MoE
"""

from __future__ import annotations

from attn_cli.io.families import models as _models  # noqa: F401  (registers the built-in families)
from attn_cli.io.families.checks import (
    KNOWN_TYPES,
    check_keys,
    check_tensors,
    family_of,
    plan_layer,
    prefix_of,
    resolve_family,
    text_config,
    text_model,
)
from attn_cli.io.families.config import Config
from attn_cli.io.families.plan import (
    BlockPlan,
    Corrected,
    Embedding,
    Experts,
    FloatArray,
    FromTensors,
    Greedy,
    Grouped,
    HeadPlan,
    LayerPlan,
    MixtureReads,
    Norm,
    NormKind,
    OwnMixture,
    Rope,
    Stacked,
    Tensor,
)
from attn_cli.io.families.registry import REGISTRY, Family, Wrapper, get, register, registered

__all__ = [
    "KNOWN_TYPES",
    "REGISTRY",
    "BlockPlan",
    "Config",
    "Corrected",
    "Embedding",
    "Experts",
    "Family",
    "FloatArray",
    "FromTensors",
    "Greedy",
    "Grouped",
    "HeadPlan",
    "LayerPlan",
    "MixtureReads",
    "Norm",
    "NormKind",
    "OwnMixture",
    "Rope",
    "Stacked",
    "Tensor",
    "Wrapper",
    "check_keys",
    "check_tensors",
    "family_of",
    "get",
    "plan_layer",
    "prefix_of",
    "register",
    "registered",
    "resolve_family",
    "text_config",
    "text_model",
]
