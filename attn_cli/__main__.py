"""``python -m attn_cli`` runs the ``attn`` command."""

from attn_cli.cli.app import main

main()
