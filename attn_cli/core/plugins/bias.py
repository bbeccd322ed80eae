"""The additive biases of `masked`: the fixture's own ``bias`` (torch SDPA's float attn_mask,
added after scaling) and ALiBi (Press et al.: −slope_h × |pos_q − pos_k|, a stage of its own)."""

from __future__ import annotations

from typing import Any

import numpy as np

from attn_cli.core.inputs import Inputs
from attn_cli.core.variant import Cells, FloatArray, Variant, register, take


class Bias(Variant):
    name = "bias"

    def bias(self, value: Any, inputs: Inputs, cells: Cells, dtype: Any) -> FloatArray:
        full = np.broadcast_to(value, (inputs.batch, inputs.heads, inputs.seq_q, inputs.seq_k))
        cells_bias: FloatArray = take(full, cells)  # (b, h, R, S)
        return cells_bias

    def bound_bias(self, value: Any, inputs: Inputs) -> float:
        finite = value[np.isfinite(value)]
        return float(np.abs(finite).max()) if finite.size else 0.0


class Alibi(Variant):
    name = "alibi"
    bias_stage = "alibi"

    def bias(self, value: Any, inputs: Inputs, cells: Cells, dtype: Any) -> FloatArray:
        q, k = cells.pos_q.astype(np.float64), cells.pos_k.astype(np.float64)  # exact below 2^53
        distance = np.abs(np.subtract.outer(q, k))  # (R, S)
        slopes = np.asarray(value, dtype=np.float64)[cells.heads]  # (h,)
        bias = distance * -slopes[:, None, None]  # (h, R, S)
        out: FloatArray = bias[None].astype(dtype, copy=False)  # (1, h, R, S)
        return out

    def bound_bias(self, value: Any, inputs: Inputs) -> float:
        pos_q, pos_k = inputs.token_positions()
        span = max(int(pos_q.max()), int(pos_k.max())) - min(int(pos_q.min()), int(pos_k.min()))
        return float(np.abs(value).max()) * span


register(Bias())
register(Alibi())
