"""The computation: inputs, stage table, step functions, block engine (NumPy only, no I/O)."""
