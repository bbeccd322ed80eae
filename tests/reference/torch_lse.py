"""Make torch_lse.json: torch.logsumexp of a masked score tensor, with and without sinks.

Run once in a throwaway venv that has torch (never the dev venv):
    /tmp/torchvenv/bin/python tests/reference/torch_lse.py
The inputs come from a fixed NumPy seed; torch computes masked, lse, the weights and the output.
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

torch: Any = importlib.import_module("torch")  # only in the throwaway venv

OUT = Path(__file__).with_name("torch_lse.json")


def listed(t: Any) -> Any:
    """Nested lists with -inf as the string "-inf" and NaN as null (JSON has neither)."""
    if isinstance(t, list):
        return [listed(x) for x in t]
    if isinstance(t, float) and math.isnan(t):
        return None
    if isinstance(t, float) and math.isinf(t):
        return "-inf" if t < 0 else "inf"
    return t


def main() -> None:
    rng = np.random.default_rng(11)
    B, H, Hkv, T, S, D, Dv = 2, 4, 2, 5, 6, 3, 2
    q = rng.normal(size=(B, H, T, D))
    k = rng.normal(size=(B, Hkv, S, D))
    v = rng.normal(size=(B, Hkv, S, Dv))
    allowed = rng.random((B, H, T, S)) < 0.7
    allowed[..., 0] = True  # every row sees key 0 ...
    allowed[0, 1, 2] = False  # ... but this one, which has nothing to attend to
    sinks = rng.normal(size=H)
    scale = 1 / math.sqrt(D)

    f64 = torch.float64
    tq, tk, tv = (torch.tensor(x, dtype=f64) for x in (q, k, v))
    tk = tk.repeat_interleave(H // Hkv, dim=1)  # (B, H, S, D), grouped as [0, 0, 1, 1]
    tv = tv.repeat_interleave(H // Hkv, dim=1)
    masked = (tq @ tk.transpose(-1, -2)) * scale  # (B, H, T, S)
    masked = masked.masked_fill(~torch.tensor(allowed), float("-inf"))
    lse = torch.logsumexp(masked, dim=-1)  # (B, H, T)
    sink_col = torch.tensor(sinks, dtype=f64).view(1, H, 1, 1).expand(B, H, T, 1)
    lse_sinks = torch.logsumexp(torch.cat([masked, sink_col], dim=-1), dim=-1)
    weights = torch.softmax(masked, dim=-1)  # NaN in the empty row
    output = weights @ tv  # (B, H, T, Dv)
    data = {
        "about": "torch.logsumexp over keys of a masked score tensor; made by torch_lse.py",
        "torch": torch.__version__,
        "scale": scale,
        "q": q.tolist(),
        "k": k.tolist(),
        "v": v.tolist(),
        "allowed": allowed.tolist(),
        "sinks": sinks.tolist(),
        "masked": listed(masked.tolist()),
        "lse": listed(lse.tolist()),
        "lse_with_sinks": listed(lse_sinks.tolist()),
        "output": listed(output.tolist()),
    }
    lines = (f"{json.dumps(key)}: {json.dumps(value)}" for key, value in data.items())
    OUT.write_text("{\n" + ",\n".join(lines) + "\n}\n")  # one key a line


if __name__ == "__main__":
    main()
