"""The grader's mistakes attn knows: one module per variant module of core/plugins, named after
it (``allowed.py``: causal, window and mask, as core/plugins/allowed.py holds those rules),
``common.py`` for plain attention and ``positions.py`` for positions read one off. Each module
registers its mistakes by the variant's name in check/mistake.py's table; importing this package
imports every module in it, so that none is listed (or named) here."""

from attn_cli.discover import submodules

submodules(__name__, __path__)
