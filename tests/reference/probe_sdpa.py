"""Print attn probe's report of torch's scaled_dot_product_attention as JSON (needs torch).

    python tests/reference/probe_sdpa.py > tests/reference/probe_sdpa.json

SDPA is wrapped so that the probe can ask each convention it has: ``causal`` (is_causal),
``mask`` (attn_mask, bool: True attends), ``scale``, and K/V with fewer heads (enable_gqa);
it has no sliding window. tests/acceptance/test_probe_torch.py asserts the same conventions from a
live torch; tests/check/test_probe.py asserts that attn's own reference, probed, gives this file's.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def sdpa(
    q: Any, k: Any, v: Any, causal: bool = False, mask: Any = None, scale: float | None = None
) -> Any:
    """torch SDPA with attn probe's option names; GQA on when K/V have fewer heads."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )


def main() -> None:
    import torch

    from attn_cli.check.probe import probe

    report = probe(
        sdpa, target="torch.nn.functional.scaled_dot_product_attention", framework="torch"
    )
    made = {"torch": torch.__version__, "made_by": "python tests/reference/probe_sdpa.py"}
    json.dump(made | report.as_json(), sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
