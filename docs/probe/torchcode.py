"""TorchCode's accepted causal attention, with two classic mistakes (docs/probe.md)."""

import numpy as np


def causal_attention(q, k, v):
    T, S = q.shape[-2], k.shape[-2]
    scores = q @ np.swapaxes(k, -1, -2) / q.shape[-1]  # / d_k, not / sqrt(d_k)
    scores = scores * np.tril(np.ones((T, S)))  # the mask multiplied in
    scores = np.where(scores == 0, -np.inf, scores)  # ... then every 0 taken as masked
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True) @ v
