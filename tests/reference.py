"""A slow, loop-based attention reference, written independently of ``attn_cli.core.pipeline``.

It reads the raw fixture mapping (nested lists, as a JSON or YAML file holds them), computes
every stage with plain Python loops, ``math.fsum`` and ``math.exp``, and returns each stage as
a NumPy array (used only as a container) in the public trace layout:

    X [b?, seq, d_model]; Q [b?, heads, seq_q, d_k]; K, V [b?, kv_heads, seq_k, d];
    scores, scaled, masked, softmax [b?, heads, seq_q, seq_k]; output [b?, heads, seq_q, d_v];
    concat [b?, seq_q, heads*d_v]; projected [b?, seq_q, d_out]

``b?`` is there only when the fixture had a batch axis. The module also holds
``random_fixture``, the seeded generator of fixture mappings the tests share.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

NEG_INF = float("-inf")

Nested = list[Any]


def _depth(x: Any) -> int:
    n = 0
    while isinstance(x, list):
        n += 1
        x = x[0]
    return n


def _shape(x: Any) -> tuple[int, ...]:
    out = []
    while isinstance(x, list):
        out.append(len(x))
        x = x[0]
    return tuple(out)


def _float(x: Any) -> float:
    return float(x)  # also turns the string "-inf" into -inf


def _matvec_rows(A: Nested, W: Nested, b: Nested | None) -> Nested:
    """Rows of A times W (the X @ W convention), plus b: loops only."""
    n_in, n_out = len(W), len(W[0])
    out = []
    for row in A:
        new = []
        for c in range(n_out):
            s = math.fsum(_float(row[m]) * _float(W[m][c]) for m in range(n_in))
            new.append(s + (_float(b[c]) if b is not None else 0.0))
        out.append(new)
    return out


def _split(flat: Nested, n: int) -> Nested:
    """[seq, n*d] -> [n, seq, d]: head h owns columns h*d:(h+1)*d."""
    d = len(flat[0]) // n
    return [
        [[_float(flat[t][h * d + i]) for i in range(d)] for t in range(len(flat))] for h in range(n)
    ]


def _broadcast_get(arr: Any, idx: tuple[int, int, int, int]) -> Any:
    """arr[idx] with arr broadcast right-aligned against [batch, heads, seq_q, seq_k]."""
    shape = _shape(arr)
    x = arr
    for axis, size in enumerate(shape):
        i = idx[4 - len(shape) + axis]
        x = x[0 if size == 1 else i]
    return x


def _causal_offset(causal: Any, seq_q: int, seq_k: int) -> int | None:
    if causal is None or causal is False:
        return None
    if causal is True or causal == "upper-left":
        return 0
    if causal == "lower-right":
        return seq_k - seq_q
    raise ValueError(f"bad causal {causal!r}")


def _softmax_row(row: list[float]) -> list[float]:
    finite = [x for x in row if x != NEG_INF]
    if not finite:
        return [0.0] * len(row)  # nothing to attend to: all-zero weights
    m = max(finite)
    e = [0.0 if x == NEG_INF else math.exp(x - m) for x in row]
    total = math.fsum(e)
    return [x / total for x in e]


def reference(fx: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every stage of the attention described by the fixture mapping ``fx``."""
    fx = {k: v for k, v in fx.items() if v is not None}
    stages: dict[str, Nested] = {}

    # 1) queries, keys and values per batch item: q[b][h][t][i]
    if "X" in fx:
        X = fx["X"]
        has_batch = _depth(X) == 3
        Xb = X if has_batch else [X]
        H = fx.get("heads", 1)
        Hkv = fx.get("kv_heads", H)
        stages["X"] = [[[_float(x) for x in row] for row in item] for item in Xb]
        q = [_split(_matvec_rows(item, fx["W_Q"], fx.get("b_Q")), H) for item in Xb]
        k = [_split(_matvec_rows(item, fx["W_K"], fx.get("b_K")), Hkv) for item in Xb]
        v = [_split(_matvec_rows(item, fx["W_V"], fx.get("b_V")), Hkv) for item in Xb]
    else:
        depth = _depth(fx["Q"])
        has_batch = depth >= 3
        if depth == 4:
            q, k, v = (
                [[[[_float(x) for x in r] for r in h] for h in b] for b in fx[n]] for n in "QKV"
            )
            H, Hkv = len(q[0]), len(k[0])
        else:
            H = fx.get("heads", 1)
            Hkv = fx.get("kv_heads", H)
            Qb, Kb, Vb = (fx[n] if depth == 3 else [fx[n]] for n in "QKV")
            q = [_split(item, H) for item in Qb]
            k = [_split(item, Hkv) for item in Kb]
            v = [_split(item, Hkv) for item in Vb]
    stages["Q"], stages["K"], stages["V"] = q, k, v

    B, T, S = len(q), len(q[0][0]), len(k[0][0])
    d_k, d_v = len(q[0][0][0]), len(v[0][0][0])
    group = H // Hkv  # query head h reads key/value head h // group

    # 2) scores and 3) scaled
    scale = fx.get("scale", 1.0 / math.sqrt(d_k))
    scores = [
        [
            [
                [
                    math.fsum(q[b][h][i][c] * k[b][h // group][j][c] for c in range(d_k))
                    for j in range(S)
                ]
                for i in range(T)
            ]
            for h in range(H)
        ]
        for b in range(B)
    ]
    scaled = [[[[s * scale for s in row] for row in hd] for hd in item] for item in scores]
    stages["scores"], stages["scaled"] = scores, scaled

    # 4) masked: + bias, then -inf where not allowed
    offset = _causal_offset(fx.get("causal"), T, S)
    mask, bias, lengths = fx.get("mask"), fx.get("bias"), fx.get("lengths")
    if isinstance(lengths, int):
        lengths = [lengths]
    use_mask = offset is not None or mask is not None or bias is not None or lengths is not None
    weights_in = scaled
    if use_mask:
        masked = []
        for b in range(B):
            item = []
            for h in range(H):
                rows = []
                for i in range(T):
                    row = []
                    for j in range(S):
                        x = scaled[b][h][i][j]
                        if bias is not None:
                            x = x + _float(_broadcast_get(bias, (b, h, i, j)))
                        ok = True
                        if offset is not None and j > i + offset:
                            ok = False
                        if mask is not None and not bool(_broadcast_get(mask, (b, h, i, j))):
                            ok = False
                        if lengths is not None and j >= lengths[b]:
                            ok = False
                        row.append(x if ok else NEG_INF)
                    rows.append(row)
                item.append(rows)
            masked.append(item)
        stages["masked"] = masked
        weights_in = masked

    # 5) softmax and 6) output
    weights = [[[_softmax_row(row) for row in hd] for hd in item] for item in weights_in]
    stages["softmax"] = weights
    output = [
        [
            [
                [
                    math.fsum(weights[b][h][i][j] * v[b][h // group][j][c] for j in range(S))
                    for c in range(d_v)
                ]
                for i in range(T)
            ]
            for h in range(H)
        ]
        for b in range(B)
    ]
    stages["output"] = output

    # 7) concat and the output projection
    if H > 1 or "W_O" in fx:
        concat = [
            [[output[b][h][i][c] for h in range(H) for c in range(d_v)] for i in range(T)]
            for b in range(B)
        ]
        stages["concat"] = concat
        if "W_O" in fx:
            stages["projected"] = [_matvec_rows(item, fx["W_O"], fx.get("b_O")) for item in concat]

    return {
        name: np.array(data if has_batch else data[0], dtype=np.float64)
        for name, data in stages.items()
    }


def reference_empty_rows(fx: dict[str, Any]) -> tuple[tuple[int, int, int], ...]:
    """(batch, head, query) rows whose every key is -inf in the reference's masked stage."""
    ref = reference(fx)
    if "masked" not in ref:
        return ()
    masked = ref["masked"] if ref["masked"].ndim == 4 else ref["masked"][None]
    rows = []
    for b, item in enumerate(masked.tolist()):
        for h, hd in enumerate(item):
            for i, row in enumerate(hd):
                if all(x == NEG_INF for x in row):
                    rows.append((b, h, i))
    return tuple(rows)


# ---------------------------------------------------------------------------------------------
# Seeded random fixtures


def random_fixture(
    seed: int,
    *,
    mode: str = "projection",
    layout: int = 2,
    batch: int | None = None,
    seq: int = 3,
    seq_k: int | None = None,
    heads: int = 1,
    kv_heads: int | None = None,
    d_k: int = 2,
    d_v: int | None = None,
    d_model: int = 4,
    qkv_bias: bool = False,
    W_O: bool = False,
    b_O: bool = False,
    d_out: int = 3,
    scale: float | None = None,
    causal: Any = None,
    mask: tuple[int, ...] | None = None,
    bias: tuple[int, ...] | None = None,
    neg_inf_bias: bool = False,
    lengths: list[int] | int | None = None,
    magnitude: float = 1.0,
) -> dict[str, Any]:
    """A fixture mapping of nested lists; ``mask``/``bias`` give the shape of those arrays.

    ``layout`` is the direct-mode layout: 2 = [seq, heads*d], 3 = [batch, seq, heads*d],
    4 = [batch, heads, seq, d] (3 and 4 imply a batch axis; ``batch`` defaults to 2 then).
    """
    rng = np.random.default_rng(seed)
    Hkv = kv_heads if kv_heads is not None else heads
    d_v = d_v if d_v is not None else d_k
    if mode == "direct" and layout >= 3 and batch is None:
        batch = 2
    seq_k = seq if seq_k is None else seq_k
    B = batch or 1

    def normal(*shape: int) -> Any:
        return (rng.standard_normal(shape) * magnitude).tolist()

    fx: dict[str, Any] = {}
    if mode == "projection":
        assert seq_k == seq, "projection mode is self-attention: seq_q == seq_k"
        fx["X"] = normal(batch, seq, d_model) if batch else normal(seq, d_model)
        fx["W_Q"] = normal(d_model, heads * d_k)
        fx["W_K"] = normal(d_model, Hkv * d_k)
        fx["W_V"] = normal(d_model, Hkv * d_v)
        if qkv_bias:
            fx["b_Q"], fx["b_K"], fx["b_V"] = (
                normal(heads * d_k),
                normal(Hkv * d_k),
                normal(Hkv * d_v),
            )
        fx["heads"], fx["kv_heads"] = heads, Hkv
    elif layout == 4:
        assert batch, "layout 4 has a batch axis"
        fx["Q"] = normal(B, heads, seq, d_k)
        fx["K"] = normal(B, Hkv, seq_k, d_k)
        fx["V"] = normal(B, Hkv, seq_k, d_v)
    else:
        lead = (B,) if layout == 3 else ()
        assert layout == 3 or batch is None, "layout 2 has no batch axis"
        fx["Q"] = normal(*lead, seq, heads * d_k)
        fx["K"] = normal(*lead, seq_k, Hkv * d_k)
        fx["V"] = normal(*lead, seq_k, Hkv * d_v)
        fx["heads"], fx["kv_heads"] = heads, Hkv
    if W_O:
        fx["W_O"] = normal(heads * d_v, d_out)
        if b_O:
            fx["b_O"] = normal(d_out)
    if scale is not None:
        fx["scale"] = scale
    if causal is not None:
        fx["causal"] = causal
    if mask is not None:
        fx["mask"] = (rng.random(mask) < 0.7).tolist() if mask else bool(rng.random() < 0.7)
    if bias is not None:
        values = rng.standard_normal(bias)
        if neg_inf_bias and values.size:
            values.reshape(-1)[rng.random(values.size) < 0.3] = -np.inf
        fx["bias"] = _inf_to_str(values.tolist())  # a float when bias == ()
    if lengths is not None:
        fx["lengths"] = lengths
    return fx


def _inf_to_str(x: Any) -> Any:
    """-inf becomes the string "-inf", as a JSON fixture writes it."""
    if isinstance(x, list):
        return [_inf_to_str(y) for y in x]
    return "-inf" if x == NEG_INF else x
