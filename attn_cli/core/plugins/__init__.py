"""The variants attn ships, each one plug-in object (core/variant.py), registered in the order
they run at each hook: the score modifiers, the additive biases, the allowed-keys rules, the
extra logits. Importing this package registers them; core/chain.py does so."""

from attn_cli.core.plugins import allowed, bias, sinks, softcap  # noqa: F401 (registers)
