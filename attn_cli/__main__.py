"""``python -m attn_cli`` runs the ``attn`` command."""

from attn_cli.cli import main

main()
