"""A student's scaled dot-product attention, in NumPy, with one planted mistake.

It computes "The cat sat" (attn's bundled example `the_cat_sat`) and saves every stage it has
to student_dump.json, beside this file, for the grader:

    python docs/grader/student_attention.py
    attn check the_cat_sat --against docs/grader/student_dump.json

The planted mistake is in step 4; attn names it. (Fix it, run both commands again: exit 0.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# The inputs of fixtures/the_cat_sat.yaml: X is (seq, d_model), each W is (d_model, d_k).
X = np.array([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], dtype=float)
W_Q = np.array([[1, 0], [0, 1], [1, 0], [0, 1]], dtype=float)
W_K = np.array([[0, 1], [1, 0], [0, 0], [1, 1]], dtype=float)
W_V = np.array([[1, 0], [0, 1], [1, 1], [0, 0]], dtype=float)


def attention(x: np.ndarray) -> dict[str, np.ndarray]:
    """Every stage of single-head attention over x (seq, d_model), by name."""
    # 1) project
    q, k, v = x @ W_Q, x @ W_K, x @ W_V  # (seq, d_k)
    # 2) every query against every key
    scores = q @ k.T  # (seq_q, seq_k)
    # 3) scale
    scaled = scores / np.sqrt(q.shape[-1])
    # 4) softmax, row maximum subtracted first
    e = np.exp(scaled - scaled.max(axis=0, keepdims=True))
    weights = e / e.sum(axis=0, keepdims=True)  # planted mistake: axis=0 should be axis=-1
    # 5) weighted sum of the values
    out = weights @ v  # (seq_q, d_v)
    return {"Q": q, "K": k, "V": v, "scores": scores, "scaled": scaled, "weights": weights,
            "out": out}  # fmt: skip


if __name__ == "__main__":
    stages = attention(X)
    target = Path(__file__).resolve().parent / "student_dump.json"
    lines = [f"  {json.dumps(name)}: {json.dumps(a.tolist())}" for name, a in stages.items()]
    target.write_text("{\n" + ",\n".join(lines) + "\n}\n")  # one stage per line
    print(f"wrote {target}")
