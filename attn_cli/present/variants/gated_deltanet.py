"""Gated DeltaNet (Qwen3-Next), what present/ says about it (its texts live beside plain linear
attention's, in linear.py, which share the state and the three forms)."""

from __future__ import annotations

from attn_cli.present.variants.linear import DeltaTexts

TEXTS = DeltaTexts()
