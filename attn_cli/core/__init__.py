"""The computation: inputs, the stage table, the step functions and the block engine (NumPy only, no I/O, no text for people)."""
