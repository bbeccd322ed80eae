"""The variants attn ships, one plug-in object (core/variant.py) per module of this package.

Importing the package imports every module, and each registers its variants; the registry keeps
them in their ``order``, the order they run at each hook (the allowed-keys rules, the biases,
the extra logits, the score modifiers, the Q/K transforms). core/chain.py imports it.
parsing.py holds the checks their ``parse`` share.
"""

from attn_cli.discover import submodules

submodules(__name__, __path__)
