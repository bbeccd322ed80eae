"""The ``attn`` command line: one thin module per command; ``main`` is the console script."""

from attn_cli.cli.app import main

__all__ = ["main"]
