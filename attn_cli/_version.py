"""The version, in a module of its own: reading it imports nothing else of attn."""

__version__ = "0.1.0"
