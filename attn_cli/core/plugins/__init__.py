"""The variants attn ships, each one plug-in object (core/variant.py), registered in the order
they run at each hook: the score modifiers, the additive biases, the allowed-keys rules, the
extra logits; then the ones that so far only read their fixture key (QK-norm and RoPE, which
still run in core/pipeline.py, and the mask sentinel). Importing this package registers them;
core/chain.py does so. parsing.py holds the checks their ``parse`` share."""

# isort: off
from attn_cli.core.plugins import allowed, bias, sinks, softcap  # noqa: F401 (registers)
from attn_cli.core.plugins import mask_value, qk_norm, rope  # noqa: F401 (registers, after)
# isort: on
