"""Loop references for linear attention, written from the papers and transformers' code, never
from attn_cli: Katharopoulos et al. 2020 ("Transformers are RNNs", causal, φ = elu + 1) and
Qwen3-Next's Gated DeltaNet (transformers 5.24 ``Qwen3NextGatedDeltaNet`` with
``torch_recurrent_gated_delta_rule``), token by token in plain Python.

The implicit weights are found by linearity, not by a formula: output t is linear in the values,
so weights[t][s] is output t of the recurrence run on a value that is 1 at token s and 0
elsewhere. Every stage has the batch axis; the chunked form's output is the recurrent one's
(what the law says the chunked form must give).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

Nested = list[Any]


def _f(x: Any) -> float:
    return float(x)


def _dot(x: list[float], y: list[float]) -> float:
    return math.fsum(a * b for a, b in zip(x, y, strict=True))


def _proj(x: list[float], W: Nested) -> list[float]:
    return [math.fsum(_f(x[r]) * _f(W[r][c]) for r in range(len(W))) for c in range(len(W[0]))]


def _sig(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def _phi(x: float) -> float:
    return x + 1 if x > 0 else math.exp(x)


def _items(X: Nested) -> Nested:
    """X with a batch axis, as floats."""
    batched = isinstance(X[0][0], list)
    return [[[_f(x) for x in row] for row in item] for item in (X if batched else [X])]


def _heads(rows: Nested, n: int) -> Nested:
    """[t][n*d] -> [h][t][d]."""
    d = len(rows[0]) // n
    return [[row[h * d : (h + 1) * d] for row in rows] for h in range(n)]


def _plain_head(q: Nested, k: Nested, v: Nested) -> dict[str, Nested]:
    """One head of linear attention: phi's, the state and normaliser, the weights, the output."""
    T, dk, dv = len(q), len(q[0]), len(v[0])
    pq = [[_phi(x) for x in row] for row in q]
    pk = [[_phi(x) for x in row] for row in k]
    S = [[0.0] * dv for _ in range(dk)]
    z = [0.0] * dk
    states, zs, outs, weights = [], [], [], []
    for t in range(T):
        for i in range(dk):
            z[i] += pk[t][i]
            for j in range(dv):
                S[i][j] += pk[t][i] * v[t][j]
        states.append([row[:] for row in S])
        zs.append(z[:])
        den = _dot(pq[t], z)
        outs.append([math.fsum(pq[t][i] * S[i][j] for i in range(dk)) / den for j in range(dv)])
        weights.append([_dot(pq[t], pk[s]) / den if s <= t else 0.0 for s in range(T)])
    return {
        "phi_Q": pq,
        "phi_K": pk,
        "state": states,
        "normaliser": zs,
        "output": outs,
        "implicit_weights": weights,
    }


def _delta_run(q: Nested, k: Nested, v: Nested, g: list[float], beta: list[float]) -> Any:
    """The gated delta rule on one head (q, k already normed), token by token: the states and
    outputs, S ← S·e^g; S ← S + k (β (v − Sᵀk))ᵀ; o = Sᵀq."""
    T, dk, dv = len(q), len(q[0]), len(v[0])
    S = [[0.0] * dv for _ in range(dk)]
    states, outs = [], []
    for t in range(T):
        decay = math.exp(g[t])
        S = [[x * decay for x in row] for row in S]
        for j in range(dv):
            pred = math.fsum(S[i][j] * k[t][i] for i in range(dk))
            delta = beta[t] * (v[t][j] - pred)
            for i in range(dk):
                S[i][j] += k[t][i] * delta
        states.append([row[:] for row in S])
        outs.append([math.fsum(S[i][j] * q[t][i] for i in range(dk)) for j in range(dv)])
    return states, outs


def _l2(x: list[float]) -> list[float]:
    n = math.sqrt(math.fsum(a * a for a in x) + 1e-6)
    return [a / n for a in x]


def _delta_item(X: Nested, m: dict[str, Any], H: int) -> dict[str, Nested]:
    """One batch item of Qwen3NextGatedDeltaNet, its stages by name (no batch axis)."""
    Hk = int(m.get("k_heads", H))
    T, kd = len(X), len(m["W_q"][0])
    dk, dv = kd // Hk, len(m["W_v"][0]) // H
    qkv = [_proj(x, m["W_q"]) + _proj(x, m["W_k"]) + _proj(x, m["W_v"]) for x in X]
    conv = [[_f(w) for w in row] for row in m["conv"]]
    K = len(conv[0])
    mixed = []
    for t in range(T):
        row = [
            math.fsum(
                conv[c][j] * qkv[t - (K - 1) + j][c] for j in range(K) if t - (K - 1) + j >= 0
            )
            for c in range(len(conv))
        ]
        mixed.append([x * _sig(x) for x in row])
    group = H // Hk
    qh = _heads([r[:kd] for r in mixed], Hk)
    kh = _heads([r[kd : 2 * kd] for r in mixed], Hk)
    vh = _heads([r[2 * kd :] for r in mixed], H)
    b_logit = [_proj(x, m["W_b"]) for x in X]
    a_in = [_proj(x, m["W_a"]) for x in X]
    beta = [[_sig(b_logit[t][h]) for t in range(T)] for h in range(H)]
    g = [
        [
            -math.exp(_f(m["A_log"][h])) * math.log1p(math.exp(a_in[t][h] + _f(m["dt_bias"][h])))
            for t in range(T)
        ]
        for h in range(H)
    ]
    out: dict[str, Nested] = {
        "qkv": qkv,
        "qkv_conv": mixed,
        "beta": beta,
        "g": g,
        "Q": [qh[h // group] for h in range(H)],
        "K": [kh[h // group] for h in range(H)],
        "V": vh,
    }
    out["q_l2"] = [[[x / math.sqrt(dk) for x in _l2(r)] for r in out["Q"][h]] for h in range(H)]
    out["k_l2"] = [[_l2(r) for r in out["K"][h]] for h in range(H)]
    for name in ("state", "output", "implicit_weights"):
        out[name] = []
    for h in range(H):
        q, k = out["q_l2"][h], out["k_l2"][h]
        states, outs = _delta_run(q, k, vh[h], g[h], beta[h])
        out["state"].append(states)
        out["output"].append(outs)
        # weights[t][s]: output t of the rule run on the one-hot value at s (it is linear in v)
        cols = [
            _delta_run(q, k, [[1.0 if t == s else 0.0] for t in range(T)], g[h], beta[h])[1]
            for s in range(T)
        ]
        out["implicit_weights"].append([[cols[s][t][0] for s in range(T)] for t in range(T)])
    eps = float(m.get("eps", 1e-6))
    out["z"] = _heads([_proj(x, m["W_z"]) for x in X], H)
    normed = []
    for h in range(H):
        rows = []
        for t in range(T):
            o, z = out["output"][h][t], out["z"][h][t]
            r = math.sqrt(math.fsum(x * x for x in o) / dv + eps)
            rows.append([_f(m["norm"][j]) * (o[j] / r) * z[j] * _sig(z[j]) for j in range(dv)])
        normed.append(rows)
    out["normed"] = normed
    return out


def linear_stages(fx: dict[str, Any]) -> dict[str, Nested]:
    """Every stage of a linear_attention or gated_deltanet fixture, in pipeline order, each
    with the batch axis."""
    H = int(fx.get("heads", 1))
    items = _items(fx["X"])
    per: list[dict[str, Nested]] = []
    order: tuple[str, ...]
    sides: tuple[str, ...]
    if "gated_deltanet" in fx:
        per = [_delta_item(X, fx["gated_deltanet"], H) for X in items]
        order = (
            "X",
            "qkv",
            "qkv_conv",
            "beta",
            "g",
            "Q",
            "K",
            "V",
            "q_l2",
            "k_l2",
            "implicit_weights",
            "output",
            "z",
            "normed",
        )
        joined, sides = "normed", ("state", "output_recurrent", "output_chunked")
    else:
        Hkv = int(fx.get("kv_heads", H))
        for X in items:
            q = _heads([_proj(x, fx["W_Q"]) for x in X], H)
            k = _heads([_proj(x, fx["W_K"]) for x in X], Hkv)
            v = _heads([_proj(x, fx["W_V"]) for x in X], Hkv)
            heads = [_plain_head(q[h], k[h * Hkv // H], v[h * Hkv // H]) for h in range(H)]
            item = {n: [hd[n] for hd in heads] for n in heads[0]}
            item["phi_K"] = [[[_phi(x) for x in r] for r in k[g]] for g in range(Hkv)]
            per.append({"Q": q, "K": k, "V": v, **item})
        order = ("X", "Q", "K", "V", "phi_Q", "phi_K", "implicit_weights", "output")
        joined = "output"
        sides = ("state", "normaliser", "output_recurrent", "output_chunked")
    for X, item in zip(items, per, strict=True):
        item["X"] = X
        item["output_recurrent"] = item["output_chunked"] = item["output"]
    stages = {n: [item[n] for item in per] for n in order}
    dv = len(stages["output"][0][0][0])
    if H > 1 or "W_O" in fx:
        stages["concat"] = [
            [
                [item[joined][h][t][j] for h in range(H) for j in range(dv)]
                for t in range(len(item["X"]))
            ]
            for item in per
        ]
        if "W_O" in fx:
            stages["projected"] = [[_proj(r, fx["W_O"]) for r in c] for c in stages["concat"]]
    stages.update({n: [item[n] for item in per] for n in sides})
    return stages


def random_linear_fixture(
    seed: int,
    *,
    kind: str = "linear_attention",
    heads: int = 2,
    kv_heads: int | None = None,
    seq: int = 5,
    d_model: int = 4,
    d_k: int = 3,
    d_v: int = 2,
    batch: int | None = None,
    chunk: int = 2,
    kernel: int = 3,
    W_O: bool = False,
    causal: bool = True,
) -> dict[str, Any]:
    """A fixture mapping of linear attention (``kind``), weights drawn from ``seed``; for
    gated_deltanet ``kv_heads`` is the number of key heads (k_heads)."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> Any:
        return (rng.standard_normal(shape) * 0.7).tolist()

    X = normal(batch, seq, d_model) if batch else normal(seq, d_model)
    fx: dict[str, Any] = {"X": X, "heads": heads}
    Hk = kv_heads or heads
    if kind == "gated_deltanet":
        fx["gated_deltanet"] = {
            "W_q": normal(d_model, Hk * d_k),
            "W_k": normal(d_model, Hk * d_k),
            "W_v": normal(d_model, heads * d_v),
            "W_z": normal(d_model, heads * d_v),
            "W_b": normal(d_model, heads),
            "W_a": normal(d_model, heads),
            "conv": normal(2 * Hk * d_k + heads * d_v, kernel),
            "A_log": rng.uniform(-1, 1.5, heads).tolist(),
            "dt_bias": rng.uniform(0.5, 1.5, heads).tolist(),
            "norm": rng.uniform(0.5, 1.5, d_v).tolist(),
            "k_heads": Hk,
            "chunk": chunk,
        }
    else:
        fx |= {
            "W_Q": normal(d_model, heads * d_k),
            "W_K": normal(d_model, Hk * d_k),
            "W_V": normal(d_model, Hk * d_v),
            "linear_attention": {"chunk": chunk},
        }
        if kv_heads:
            fx["kv_heads"] = kv_heads
    if causal:
        fx["causal"] = True
    if W_O:
        fx["W_O"] = normal(heads * d_v, 3)
    return fx
