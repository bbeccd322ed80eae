"""The JSON of ``attn rope``: fixed key order, full float64, byte-stable, as io/decode_json.py.

``{"format": "attn-rope", "version": 1, "generator", "name", "rope": {base, layout, dims,
scaling}, "d_k", "length", "position", "trained_length", "base_used", "attention_factor",
"pairs": {"first", "second", "inv_freq", "wavelength", "band", "scaled_inv_freq", "divisor",
"scaled_wavelength", "angle", "cos", "sin"}}``, each member of ``pairs`` a list with one entry per
rotated pair; ``"over_trained"`` (the wavelength over the trained context) joins them when the
scaling names that context, ``"mix"`` (the share of ÷ factor) for the kinds that mix (llama3,
yarn, linear).
"""

from __future__ import annotations

import math
from typing import Any

from attn_cli._version import __version__
from attn_cli.core.inputs import Inputs
from attn_cli.core.rope_table import RopeTable
from attn_cli.io.decode_json import mapping
from attn_cli.io.trace_json import array_text, json_text

ROPE_FORMAT = "attn-rope"
VERSION = 1
COLUMNS = (
    "first",
    "second",
    "inv_freq",
    "wavelength",
    "over_trained",
    "band",
    "mix",
    "scaled_inv_freq",
    "divisor",
    "scaled_wavelength",
    "angle",
    "cos",
    "sin",
)


def rope_dumps(inputs: Inputs, table: RopeTable) -> str:
    """The table as JSON text."""
    rope = table.rope
    head: dict[str, Any] = {
        "format": ROPE_FORMAT,
        "version": VERSION,
        "generator": f"attn {__version__}",
        "name": inputs.name,
        "rope": {
            "base": rope.base,
            "layout": rope.layout,
            "dims": rope.dims,
            "scaling": None if rope.scaling is None else rope.scaling.config(),
        },
        "d_k": table.d_k,
        "length": table.length,
        "position": table.position,
        "trained_length": table.trained,
        "base_used": table.base,
        "attention_factor": table.attention,
    }
    lines = ["{", *mapping(head, 2), '  "pairs": {']
    unknown = {"mix": table.mix, "over_trained": table.over_trained}  # left out when all NaN
    columns = [c for c in COLUMNS if c not in unknown or not all(map(math.isnan, unknown[c]))]
    for n, name in enumerate(columns):
        values = list(getattr(table, "scaled" if name == "scaled_inv_freq" else name))
        text = (
            "[" + ", ".join(json_text(v) for v in values) + "]"
            if name == "band"
            else array_text([v.item() for v in values], 4)
        )
        lines.append(f"    {json_text(name)}: {text}" + ("," if n < len(columns) - 1 else ""))
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"
