"""A slow, loop-based attention reference, written independently of ``attn_cli.core.pipeline``.

It reads the raw fixture mapping (nested lists, as a JSON or YAML file holds them), computes
every stage with plain Python loops, ``math.fsum`` and ``math.exp``, and returns each stage as
a NumPy array (used only as a container) in the public trace layout:

    X [b?, seq, d_model]; Q [b?, heads, seq_q, d_k]; K, V [b?, kv_heads, seq_k, d];
    scores, scaled, masked, softmax [b?, heads, seq_q, seq_k]; output [b?, heads, seq_q, d_v];
    concat [b?, seq_q, heads*d_v]; projected [b?, seq_q, d_out]

and, for the variants (docs/fixture-format.md), X_kv [b?, seq_k, d_model_kv]; Q_norm, Q_rot as Q;
K_norm, K_rot as K; capped, alibi as scores; lse [b?, heads, seq_q]. The variants follow the
published code, re-derived here loop by loop: RoPE as HF ``rotate_half`` (``half``) and Meta's
complex rotation (``interleaved``), ALiBi slopes as Press et al.'s ``get_slopes``, softcap as
Gemma 2 (before the mask), sinks as gpt-oss (joined to the softmax, dropped after), QK-norm as
HF ``Qwen3RMSNorm``, window as HF/Mistral ``sliding_window`` (0 <= pos_q - pos_k < window), the
output gate as HF ``Qwen3NextAttention`` (gate [b?, heads, seq_q, d_v] = X·W_G + b_G split into
heads; gated = output · sigmoid(gate), as output; concat joins gated).
Multi-head latent attention (``mla``) as transformers 5.24's ``DeepseekV3Attention.forward``:
c_Q, c_Q_norm [b?, seq, q_lora_rank]; q_nope, q_rope, q_rope_rot [b?, heads, seq, d]; c_KV,
c_KV_norm [b?, seq, kv_lora_rank]; k_rope, k_rope_rot [b?, seq, d_rope]; K_nope [b?, heads, seq,
d_nope]; RoPE of interleaved pairs written as ``apply_rotary_pos_emb_interleave`` returns them;
the scale mscale²/√d_k; and the absorbed form (q_absorbed, scores_absorbed, output_latent,
output_absorbed) from its own formulas, loop by loop.

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


def _softmax_row(row: list[float], sink: float | None = None) -> tuple[list[float], float]:
    """The weights of one row and its log-sum-exp; a sink joins the sum and is dropped after."""
    finite = [x for x in row if x != NEG_INF]
    if sink is not None:
        finite.append(sink)
    if not finite:
        return [0.0] * len(row), NEG_INF  # nothing to attend to: all-zero weights
    m = max(finite)
    e = [0.0 if x == NEG_INF else math.exp(x - m) for x in row]
    total = math.fsum(e + ([math.exp(sink - m)] if sink is not None else []))
    return [x / total for x in e], m + math.log(total)


def _sigmoid(x: float) -> float:
    """1 / (1 + e^(−x)), written so that e^(...) never overflows."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def _positions(fx: dict[str, Any], T: int, S: int) -> tuple[list[int], list[int]]:
    """Token positions: as given, else keys 0..S-1 and queries 0..T-1 (lower-right: S-T+i)."""
    offset = S - T if fx.get("causal") == "lower-right" else 0
    pos_q = fx.get("positions", [offset + i for i in range(T)])
    pos_k = fx.get("key_positions", list(range(S)))
    return [int(p) for p in pos_q], [int(p) for p in pos_k]


def _rms(x: list[float], w: list[float], eps: float) -> list[float]:
    """x / sqrt(mean(x^2) + eps) * w, HF Qwen3RMSNorm's formula."""
    r = 1.0 / math.sqrt(math.fsum(a * a for a in x) / len(x) + eps)
    return [a * r * _float(wi) for a, wi in zip(x, w, strict=True)]


def _clamp(x: Any, c: float) -> Any:
    """Every number of a nested list clamped to [-c, c], as torch's clamp_(min=-c, max=c)."""
    if isinstance(x, list):
        return [_clamp(item, c) for item in x]
    return min(max(x, -c), c)


def _qk_norm(x: Nested, w: Nested, eps: float) -> Nested:
    """x [b][h][t][d]: RMSNorm of each head (len(w) == d) or of all heads of a token together."""
    n, d = len(x[0]), len(x[0][0][0])
    if len(w) == d:
        return [[[_rms(row, w, eps) for row in hd] for hd in item] for item in x]
    out = []
    for item in x:
        rows = [
            _rms([a for h in range(n) for a in item[h][t]], w, eps) for t in range(len(item[0]))
        ]
        out.append([[row[h * d : (h + 1) * d] for row in rows] for h in range(n)])
    return out


def _qk_layernorm(x: Nested, w: Nested, b: Nested | None, eps: float) -> Nested:
    """x [b][h][t][d]: torch's LayerNorm of each head's row, (x - mean) / sqrt(var + eps) * w + b
    (the biased variance); w and b hold one row per head, or one row for every head."""

    def norm(row: list[float], h: int) -> list[float]:
        wh = w[h] if isinstance(w[0], list) else w
        bh = [0.0] * len(row) if b is None else b[h] if isinstance(b[0], list) else b
        mean = math.fsum(row) / len(row)
        var = math.fsum((a - mean) ** 2 for a in row) / len(row)
        r = 1.0 / math.sqrt(var + eps)
        return [
            (a - mean) * r * _float(wi) + _float(bi) for a, wi, bi in zip(row, wh, bh, strict=True)
        ]

    return [[[norm(row, h) for row in hd] for h, hd in enumerate(item)] for item in x]


def _rope_vec(x: list[float], pos: int, rope: dict[str, Any]) -> list[float]:
    """Rotate pairs of x by pos * base^(-2i/dims): half pairs i, i+dims/2; interleaved 2i, 2i+1."""
    dims = rope.get("dims", len(x))
    base, scaling = rope.get("base", 10000.0), rope.get("scaling")
    if scaling is not None and scaling["type"] == "ntk_alpha":  # HunYuan: base × alpha^(d/(d-2))
        base, scaling = base * scaling["alpha"] ** (dims / (dims - 2)), None
    out = list(x)
    for i in range(dims // 2):
        a, b = (i, i + dims // 2) if rope.get("layout", "half") == "half" else (2 * i, 2 * i + 1)
        angle = pos * llama3_frequency(base ** (-2.0 * i / dims), scaling)
        c, s_ = math.cos(angle), math.sin(angle)
        out[a], out[b] = x[a] * c - x[b] * s_, x[b] * c + x[a] * s_
    return out


def llama3_frequency(freq: float, scaling: dict[str, Any] | None) -> float:
    """One frequency as Llama 3.1's RoPE scaling leaves it (transformers'
    ``_compute_llama3_parameters``): kept below original/high_freq_factor wavelengths, divided
    by factor above original/low_freq_factor, smoothed between (other kinds: test_rope_view.py)."""
    if scaling is None:
        return freq
    assert scaling["type"] == "llama3", "the loop reference knows llama3 scaling only"
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / freq
    if wavelen < old / high:
        return freq
    if wavelen > old / low:
        return float(freq / factor)
    smooth = (old / wavelen - low) / (high - low)
    return float((1 - smooth) * freq / factor + smooth * freq)


def _rope(x: Nested, pos: list[int], rope: Any) -> Nested:
    rope = {} if rope is True else rope
    return [[[_rope_vec(row, pos[t], rope) for t, row in enumerate(hd)] for hd in it] for it in x]


def alibi_slopes_reference(n: int) -> list[float]:
    """Press et al.'s get_slopes, written out: 2^(-8/n) to the powers 1..n for n a power of 2;
    else the slopes of the closest smaller power of 2, then every other slope of twice that."""
    p = 1
    while p * 2 <= n:
        p *= 2
    own = [2.0 ** (-8.0 * (i + 1) / p) for i in range(p)]
    if p == n:
        return own
    return own + alibi_slopes_reference(2 * p)[0::2][: n - p]


def _per_token(X: Nested, W: Nested, b: Nested | None, n: int, has_batch: bool) -> Nested:
    Xb = X if has_batch else [X]
    return [_split(_matvec_rows(item, W, b), n) for item in Xb]


def reference(fx: dict[str, Any], *, lse: bool = False) -> dict[str, np.ndarray]:
    """Every stage of the attention described by the fixture mapping ``fx``, in pipeline order;
    ``lse`` (the opt-in stage) only when asked for."""
    fx = {k: v for k, v in fx.items() if v is not None}
    has_batch = _depth(fx["X"] if "X" in fx else fx["Q"]) >= 3
    stages, _ = _compute(fx)
    if not lse:
        stages.pop("lse", None)  # linear attention has none
    return {
        name: np.array(data if has_batch and name != "lambda" else data[0], dtype=np.float64)
        for name, data in stages.items()
    }


def _compute(fx: dict[str, Any]) -> tuple[dict[str, Nested], list[Any]]:
    """The stages (batch axis always there) and allowed[b][h][i][j]."""
    fx = {k: v for k, v in fx.items() if v is not None}
    if "linear_attention" in fx or "gated_deltanet" in fx:  # no softmax: loops of their own
        from reference_linear import linear_stages

        return linear_stages(fx), []
    stages: dict[str, Nested] = {}

    # 1) queries, keys and values per batch item: q[b][h][t][i]
    if "mla" in fx:
        q, k, v = _mla(fx, stages)
        H = Hkv = len(q[0])
    elif "X" in fx:
        X = fx["X"]
        has_batch = _depth(X) == 3
        Xb = X if has_batch else [X]
        H = fx.get("heads", 1)
        Hkv = fx.get("kv_heads", H)
        stages["X"] = [[[_float(x) for x in row] for row in item] for item in Xb]
        X_kv = fx.get("X_kv", X)
        if "X_kv" in fx:
            Xkb = X_kv if has_batch else [X_kv]
            stages["X_kv"] = [[[_float(x) for x in row] for row in item] for item in Xkb]
        q = _per_token(X, fx["W_Q"], fx.get("b_Q"), H, has_batch)
        k = _per_token(X_kv, fx["W_K"], fx.get("b_K"), Hkv, has_batch)
        v = _per_token(X_kv, fx["W_V"], fx.get("b_V"), Hkv, has_batch)
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
    pos_q, pos_k = _positions(fx, T, S)

    # 1a) clip_qkv (OLMo): q, k and v clamped to [-c, c] right after the projections
    if "clip_qkv" in fx:
        c = float(fx["clip_qkv"])
        q = stages["Q_clip"] = _clamp(q, c)
        k = stages["K_clip"] = _clamp(k, c)
        v = stages["V"] = _clamp(v, c)

    # 1b) QK-norm, then RoPE, on queries and keys (not values)
    if "qk_norm" in fx:
        norm = fx["qk_norm"]
        eps = norm.get("eps", 1e-6)
        q = stages["Q_norm"] = _qk_norm(q, norm["q_weight"], eps)
        k = stages["K_norm"] = _qk_norm(k, norm["k_weight"], eps)
    # 1b'') q/k LayerNorm (StableLM 2 one per head, Phi one for all heads with a bias)
    if "qk_layernorm" in fx:
        ln = fx["qk_layernorm"]
        eps = ln.get("eps", 1e-5)
        q = stages["Q_ln"] = _qk_layernorm(q, ln["q_weight"], ln.get("q_bias"), eps)
        k = stages["K_ln"] = _qk_layernorm(k, ln["k_weight"], ln.get("k_bias"), eps)
    if fx.get("rope", False) is not False:
        q = stages["Q_rot"] = _rope(q, pos_q, fx["rope"])
        k = stages["K_rot"] = _rope(k, pos_k, fx["rope"])
    # 1b'') a norm after RoPE (HunYuan's query/key_layernorm; without weights, Llama 4's "L2
    # norm"): each rotated head row x / sqrt(mean(x^2) + eps) * w, w = 1 when none is given
    if "post_rope_norm" in fx:
        post = fx["post_rope_norm"]
        ones = [1.0] * d_k
        q = stages["Q_postnorm"] = _qk_norm(q, post.get("q_weight", ones), post["eps"])
        k = stages["K_postnorm"] = _qk_norm(k, post.get("k_weight", ones), post["eps"])
    # 1b') attention temperature tuning (Llama 4; Ministral 3 with offset 0): each query times
    # 1 + attn_scale * ln(1 + floor((pos + offset) / floor_scale)), the keys untouched
    if "temperature" in fx:
        tt = fx["temperature"]
        off = tt.get("offset", 1)
        tuned = [
            1 + tt["attn_scale"] * math.log(1 + math.floor((p + off) / tt["floor_scale"]))
            for p in pos_q
        ]
        q = stages["Q_tuned"] = [
            [[[x * tuned[t] for x in row] for t, row in enumerate(hd)] for hd in it] for it in q
        ]

    # 1c) differential attention: each head's Q and K cut in halves; the chain's map is Q1·K1ᵀ
    q2 = k2 = None
    if "diff" in fx:
        half = d_k // 2
        q2 = [[[row[half:] for row in hd] for hd in item] for item in q]
        k2 = [[[row[half:] for row in hd] for hd in item] for item in k]
        q = stages["Q_1"] = [[[row[:half] for row in hd] for hd in item] for item in q]
        k = stages["K_1"] = [[[row[:half] for row in hd] for hd in item] for item in k]
        d_k = half

    # 2) scores and 3) scaled
    mscale = float(fx["mla"].get("mscale", 1.0)) if "mla" in fx else 1.0
    scale = fx.get("scale", mscale * mscale / math.sqrt(d_k))
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
    logits = scaled

    # 3b) softcap (Gemma 2), before the mask
    if "softcap" in fx:
        cap = float(fx["softcap"])
        logits = [
            [[[cap * math.tanh(x / cap) for x in r] for r in hd] for hd in it] for it in scaled
        ]
        stages["capped"] = logits

    # 3c) ALiBi: -slope_h * |pos_q - pos_k|
    alibi = fx.get("alibi", False)
    if alibi is not False:
        slopes = alibi_slopes_reference(H) if alibi is True else alibi.get("slopes")
        slopes = alibi_slopes_reference(H) if slopes is None else [float(m) for m in slopes]
        bias_h = [
            [[-slopes[h] * abs(pos_q[i] - pos_k[j]) for j in range(S)] for i in range(T)]
            for h in range(H)
        ]
        stages["alibi"] = [bias_h for _ in range(B)]

    # 4) masked: + bias + alibi, then mask_value (-inf) where not allowed
    causal = _causal_offset(fx.get("causal"), T, S) is not None
    window, chunk = fx.get("window"), fx.get("chunk")
    mask, bias, lengths = fx.get("mask"), fx.get("bias"), fx.get("lengths")
    fill = float(fx.get("mask_value", NEG_INF))
    if isinstance(lengths, int):
        lengths = [lengths]

    def allowed(b: int, h: int, i: int, j: int) -> bool:
        ok = True
        if causal and pos_k[j] > pos_q[i]:
            ok = False
        if window is not None and not pos_q[i] - pos_k[j] < window:
            ok = False
        if chunk is not None and pos_k[j] // chunk != pos_q[i] // chunk:  # Llama 4's chunks
            ok = False
        if mask is not None and not bool(_broadcast_get(mask, (b, h, i, j))):
            ok = False
        if lengths is not None and j >= lengths[b]:
            ok = False
        return ok

    use_mask = causal or mask is not None or bias is not None or lengths is not None
    use_mask = use_mask or alibi is not False
    if use_mask:
        masked = []
        for b in range(B):
            item = []
            for h in range(H):
                rows = []
                for i in range(T):
                    row = []
                    for j in range(S):
                        x = logits[b][h][i][j]
                        if bias is not None:
                            x = x + _float(_broadcast_get(bias, (b, h, i, j)))
                        if alibi is not False:
                            x = x + stages["alibi"][b][h][i][j]
                        row.append(x if allowed(b, h, i, j) else fill)
                    rows.append(row)
                item.append(rows)
            masked.append(item)
        stages["masked"] = masked
        logits = masked

    # 5) softmax (with the sinks of gpt-oss) and its log-sum-exp, and 6) output
    sinks = fx.get("sinks")
    weights, lse = [], []
    for b in range(B):
        w_item, l_item = [], []
        for h in range(H):
            sink = None if sinks is None else float(sinks[h])
            pairs = [_softmax_row(row, sink) for row in logits[b][h]]
            w_item.append([p[0] for p in pairs])
            l_item.append([p[1] for p in pairs])
        weights.append(w_item)
        lse.append(l_item)
    stages["softmax"], stages["lse"] = weights, lse
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

    # 6a) differential attention's second map, λ, the difference map, the norm and the scale
    if "diff" in fx:
        assert q2 is not None and k2 is not None
        mods = {
            "softcap": fx.get("softcap"),
            "bias": bias,
            "alibi": stages.get("alibi"),
            "fill": fill,
            "masks": use_mask,
        }
        output = _diff(fx["diff"], stages, q2, k2, v, scale, allowed, mods, group)

    # 6b) the output gate of Qwen3-Next: gate = X·W_G + b_G per head, gated = output · σ(gate)
    if "gate" in fx:
        G = fx["gate"]
        X_items = fx["X"] if _depth(fx["X"]) == 3 else [fx["X"]]
        flat = [_matvec_rows(item, G["W_G"], G.get("b_G")) for item in X_items]  # [b][i][h*d_v]
        gate = [
            [[[flat[b][i][h * d_v + c] for c in range(d_v)] for i in range(T)] for h in range(H)]
            for b in range(B)
        ]
        stages["gate"] = gate
        output = [
            [
                [
                    [output[b][h][i][c] * _sigmoid(gate[b][h][i][c]) for c in range(d_v)]
                    for i in range(T)
                ]
                for h in range(H)
            ]
            for b in range(B)
        ]
        stages["gated"] = output

    # 7) concat and the output projection
    if H > 1 or "W_O" in fx:
        concat = [
            [[output[b][h][i][c] for h in range(H) for c in range(d_v)] for i in range(T)]
            for b in range(B)
        ]
        stages["concat"] = concat
        if "W_O" in fx:
            stages["projected"] = [_matvec_rows(item, fx["W_O"], fx.get("b_O")) for item in concat]
    if "mla" in fx:
        _mla_absorbed(fx["mla"], stages)

    grid = [
        [[[allowed(b, h, i, j) for j in range(S)] for i in range(T)] for h in range(H)]
        for b in range(B)
    ]
    return stages, grid


def _diff(
    d: dict[str, Any],
    stages: dict[str, Nested],
    q2: Nested,
    k2: Nested,
    v: Nested,
    scale: float,
    allowed: Any,
    mods: dict[str, Any],
    group: int,
) -> Nested:
    """The paper's formula (Ye et al. 2024; unilm's MultiheadDiffAttn.forward), loop by loop:
    A2 = softmax(Q2·K2ᵀ·s, the first map's mask), λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init,
    λ_init = 0.8 − 0.6·exp(−0.3·depth), diff = A1 − λ·A2, diff_output = diff·V,
    diff_norm = w·x/√(mean(x²) + eps), diff_scaled = diff_norm·(1 − λ_init)."""
    B, H, T = len(q2), len(q2[0]), len(q2[0][0])
    S, d_v = len(k2[0][0]), len(v[0][0][0])
    init = d["lambda_init"] if "depth" not in d else 0.8 - 0.6 * math.exp(-0.3 * d["depth"])

    def vec(name: str, h: int) -> list[float]:
        x = d[name]
        return [_float(y) for y in (x[h] if _depth(x) == 2 else x)]

    lam = [
        math.exp(_dot(vec("lambda_q1", h), vec("lambda_k1", h)))
        - math.exp(_dot(vec("lambda_q2", h), vec("lambda_k2", h)))
        + init
        for h in range(H)
    ]
    scores, weights = [], []
    for b in range(B):
        s_item, w_item = [], []
        for h in range(H):
            s_rows, w_rows = [], []
            for i in range(T):
                row, logits = [], []
                for j in range(S):
                    x = _dot(q2[b][h][i], k2[b][h // group][j])
                    row.append(x)
                    x = x * scale
                    if mods["softcap"] is not None:
                        cap = float(mods["softcap"])
                        x = cap * math.tanh(x / cap)
                    if mods["bias"] is not None:
                        x = x + _float(_broadcast_get(mods["bias"], (b, h, i, j)))
                    if mods["alibi"] is not None:
                        x = x + mods["alibi"][b][h][i][j]
                    logits.append(x if not mods["masks"] or allowed(b, h, i, j) else mods["fill"])
                s_rows.append(row)
                w_rows.append(_softmax_row(logits)[0])
            s_item.append(s_rows)
            w_item.append(w_rows)
        scores.append(s_item)
        weights.append(w_item)
    stages["scores_2"], stages["softmax_2"] = scores, weights
    stages["lambda"] = [lam for _ in range(B)]  # no batch axis: reference() takes item 0
    A1 = stages["softmax"]
    diff = [
        [
            [[A1[b][h][i][j] - lam[h] * weights[b][h][i][j] for j in range(S)] for i in range(T)]
            for h in range(H)
        ]
        for b in range(B)
    ]
    stages["diff"] = diff
    out = [
        [
            [
                [
                    math.fsum(diff[b][h][i][j] * v[b][h // group][j][c] for j in range(S))
                    for c in range(d_v)
                ]
                for i in range(T)
            ]
            for h in range(H)
        ]
        for b in range(B)
    ]
    stages["diff_output"] = out
    w = [_float(x) for x in d["norm"]] if "norm" in d else [1.0] * d_v
    eps = float(d.get("eps", 1e-5))
    normed = [[[_rms(row, w, eps) for row in hd] for hd in item] for item in out]
    stages["diff_norm"] = normed
    scaled = [[[[x * (1.0 - init) for x in row] for row in hd] for hd in item] for item in normed]
    stages["diff_scaled"] = scaled
    return scaled


def _dot(x: list[float], y: list[float]) -> float:
    return math.fsum(a * b for a, b in zip(x, y, strict=True))


def _column(W: Nested, c: int) -> list[float]:
    return [_float(row[c]) for row in W]


def _rope_pairs_deepseek(x: list[float], pos: int, base: float) -> list[float]:
    """Pairs (x0, x1), (x2, x3), ... turned by pos·base^(−2i/D), written as transformers'
    apply_rotary_pos_emb_interleave does: first numbers of the pairs, then second numbers."""
    D = len(x)
    first, second = [], []
    for i in range(D // 2):
        angle = pos * base ** (-2 * i / D)
        c, s = math.cos(angle), math.sin(angle)
        first.append(x[2 * i] * c - x[2 * i + 1] * s)
        second.append(x[2 * i + 1] * c + x[2 * i] * s)
    return first + second


def _mla(fx: dict[str, Any], stages: dict[str, Nested]) -> tuple[Nested, Nested, Nested]:
    """The naive form of multi-head latent attention, token by token: its stages into
    ``stages`` (batch axis first), and q, k, v [b][h][t][d]."""
    m, H = fx["mla"], fx.get("heads", 1)
    X = fx["X"] if _depth(fx["X"]) == 3 else [fx["X"]]
    X = [[[_float(x) for x in row] for row in item] for item in X]
    stages["X"] = X
    eps, base = float(m.get("eps", 1e-6)), float(m.get("base", 10000.0))
    d_rope = len(m["W_KR"][0])
    T = len(X[0])
    pos = _positions(fx, T, T)[0]

    def proj(x: list[float], W: Nested) -> list[float]:
        return [_dot(x, _column(W, c)) for c in range(len(W[0]))]

    def per_head(flat: list[float], h: int) -> list[float]:
        d = len(flat) // H
        return flat[h * d : (h + 1) * d]

    names = (
        "c_Q",
        "c_Q_norm",
        "q_nope",
        "q_rope",
        "c_KV",
        "c_KV_norm",
        "k_rope",
        "K_nope",
        "q_rope_rot",
        "k_rope_rot",
        "Q",
        "K",
        "V",
    )
    out: dict[str, list[Any]] = {n: [] for n in names}
    for item in X:
        rows: dict[str, list[Any]] = {n: [] for n in names}
        for t, x in enumerate(item):
            if "W_DQ" in m:
                c_q = proj(x, m["W_DQ"])
                c_q_norm = _rms(c_q, m["q_norm"], eps)
                rows["c_Q"].append(c_q)
                rows["c_Q_norm"].append(c_q_norm)
                q_flat = proj(c_q_norm, m["W_UQ"])
            else:
                q_flat = proj(x, m["W_Q"])
            c_kv = proj(x, m["W_DKV"])
            c_kv_norm = _rms(c_kv, m["kv_norm"], eps)
            k_rope = proj(x, m["W_KR"])
            k_rot = _rope_pairs_deepseek(k_rope, pos[t], base)
            k_nope_flat, v_flat = proj(c_kv_norm, m["W_UK"]), proj(c_kv_norm, m["W_UV"])
            rows["c_KV"].append(c_kv)
            rows["c_KV_norm"].append(c_kv_norm)
            rows["k_rope"].append(k_rope)
            rows["k_rope_rot"].append(k_rot)
            for n in ("q_nope", "q_rope", "q_rope_rot", "K_nope", "Q", "K", "V"):
                rows[n].append([])
            for h in range(H):
                q_h = per_head(q_flat, h)
                q_nope, q_rope = q_h[: len(q_h) - d_rope], q_h[len(q_h) - d_rope :]
                q_rot = _rope_pairs_deepseek(q_rope, pos[t], base)
                k_nope = per_head(k_nope_flat, h)
                for n, val in (
                    ("q_nope", q_nope),
                    ("q_rope", q_rope),
                    ("q_rope_rot", q_rot),
                    ("K_nope", k_nope),
                    ("Q", q_nope + q_rot),
                    ("K", k_nope + k_rot),
                    ("V", per_head(v_flat, h)),
                ):
                    rows[n][-1].append(val)
        for n in names:  # [t][h][d] -> [h][t][d] for the per-head stages
            per = n in ("q_nope", "q_rope", "q_rope_rot", "K_nope", "Q", "K", "V")
            out[n].append([[r[h] for r in rows[n]] for h in range(H)] if per else rows[n])
    for n in names[:10]:
        if out[n] and out[n][0]:
            stages[n] = out[n]
    return out["Q"], out["K"], out["V"]


def _mla_absorbed(m: dict[str, Any], stages: dict[str, Nested]) -> None:
    """The absorbed form from its own formulas: q_absorbed = q_nope·W_UKᵀ per head, the scores
    against the latent plus the RoPE part, the weights on the latent, then W_UV."""
    H = len(stages["q_nope"][0])
    r = len(m["W_UK"])
    d_nope, d_v = len(m["W_UK"][0]) // H, len(m["W_UV"][0]) // H
    q_abs, s_abs, o_lat, o_abs = [], [], [], []
    for b, heads in enumerate(stages["q_nope"]):
        c = stages["c_KV_norm"][b]
        k_rot = stages["k_rope_rot"][b]
        qa_b, sa_b, ol_b, oa_b = [], [], [], []
        for h, rows in enumerate(heads):
            qa = [
                [
                    math.fsum(q[i] * _float(m["W_UK"][a][h * d_nope + i]) for i in range(d_nope))
                    for a in range(r)
                ]
                for q in rows
            ]
            q_rot = stages["q_rope_rot"][b][h]
            sa = [
                [_dot(qa[t], c[s]) + _dot(q_rot[t], k_rot[s]) for s in range(len(c))]
                for t in range(len(rows))
            ]
            w = stages["softmax"][b][h]
            ol = [
                [math.fsum(w[t][s] * c[s][a] for s in range(len(c))) for a in range(r)]
                for t in range(len(rows))
            ]
            oa = [
                [
                    math.fsum(o[a] * _float(m["W_UV"][a][h * d_v + e]) for a in range(r))
                    for e in range(d_v)
                ]
                for o in ol
            ]
            qa_b.append(qa)
            sa_b.append(sa)
            ol_b.append(ol)
            oa_b.append(oa)
        q_abs.append(qa_b)
        s_abs.append(sa_b)
        o_lat.append(ol_b)
        o_abs.append(oa_b)
    stages.update(
        q_absorbed=q_abs, scores_absorbed=s_abs, output_latent=o_lat, output_absorbed=o_abs
    )


def mla_from_torch(
    w: dict[str, Any], heads: int, rank: int, nope: int, v: int
) -> tuple[dict[str, Any], Any]:
    """The mla key and W_O from DeepseekV3Attention's weights (torch Linear layout (out, in),
    names without the module's prefix), as docs/fixture-format.md maps them:
    kv_a_proj_with_mqa's rows split into the latent's and k_rope's, kv_b_proj's per head into
    the key's and the value's."""
    kv_a = np.asarray(w["kv_a_proj_with_mqa.weight"]).T  # (d_model, r + d_rope)
    kv_b = np.asarray(w["kv_b_proj.weight"]).T.reshape(rank, heads, nope + v)  # key, value rows
    mla: dict[str, Any] = {
        "W_DKV": kv_a[:, :rank],
        "W_KR": kv_a[:, rank:],
        "kv_norm": np.asarray(w["kv_a_layernorm.weight"]),
        "W_UK": kv_b[:, :, :nope].reshape(rank, heads * nope),
        "W_UV": kv_b[:, :, nope:].reshape(rank, heads * v),
    }
    if "q_proj.weight" in w:
        mla["W_Q"] = np.asarray(w["q_proj.weight"]).T
    else:
        mla |= {
            "W_DQ": np.asarray(w["q_a_proj.weight"]).T,
            "q_norm": np.asarray(w["q_a_layernorm.weight"]),
            "W_UQ": np.asarray(w["q_b_proj.weight"]).T,
        }
    return mla, np.asarray(w["o_proj.weight"]).T


def random_mla_fixture(
    seed: int,
    *,
    heads: int = 2,
    seq: int = 3,
    d_model: int = 4,
    q_rank: int | None = 3,
    rank: int = 3,
    d_nope: int = 2,
    d_rope: int = 2,
    d_v: int = 2,
    batch: int | None = None,
    causal: bool = True,
    W_O: bool = False,
    mscale: float | None = None,
    magnitude: float = 1.0,
) -> dict[str, Any]:
    """A fixture mapping of multi-head latent attention, weights drawn from ``seed``; without
    ``q_rank`` the query is X·W_Q (no q LoRA)."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> Any:
        return (rng.standard_normal(shape) * magnitude).tolist()

    width = heads * (d_nope + d_rope)
    m: dict[str, Any] = {}
    if q_rank is not None:
        m["W_DQ"], m["W_UQ"] = normal(d_model, q_rank), normal(q_rank, width)
        m["q_norm"] = rng.uniform(0.5, 1.5, q_rank).tolist()
    else:
        m["W_Q"] = normal(d_model, width)
    m["W_DKV"], m["W_KR"] = normal(d_model, rank), normal(d_model, d_rope)
    m["kv_norm"] = rng.uniform(0.5, 1.5, rank).tolist()
    m["W_UK"], m["W_UV"] = normal(rank, heads * d_nope), normal(rank, heads * d_v)
    if mscale is not None:
        m["mscale"] = mscale
    fx: dict[str, Any] = {
        "X": normal(batch, seq, d_model) if batch else normal(seq, d_model),
        "heads": heads,
        "mla": m,
    }
    if causal:
        fx["causal"] = True
    if W_O:
        fx["W_O"] = normal(heads * d_v, 3)
    return fx


def reference_sentinel_rows(fx: dict[str, Any]) -> tuple[tuple[int, int, int, float, bool], ...]:
    """(batch, head, query, leaked weight, no key allowed) for rows whose hidden keys got weight."""
    stages, allowed = _compute(fx)
    if "softmax" not in stages:  # linear attention: nothing is hidden by a fill
        return ()
    weights = stages["softmax"]
    rows = []
    for b, item in enumerate(weights):
        for h, hd in enumerate(item):
            for i, row in enumerate(hd):
                hidden = [w for j, w in enumerate(row) if not allowed[b][h][i][j]]
                leaked = math.fsum(hidden)
                if leaked > 0:
                    rows.append((b, h, i, leaked, len(hidden) == len(row)))
    return tuple(rows)


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
    cross: int | None = None,
    **variants: Any,
) -> dict[str, Any]:
    """A fixture mapping of nested lists; ``mask``/``bias`` give the shape of those arrays.

    ``layout`` is the direct-mode layout: 2 = [seq, heads*d], 3 = [batch, seq, heads*d],
    4 = [batch, heads, seq, d] (3 and 4 imply a batch axis; ``batch`` defaults to 2 then).
    ``cross`` = d_model_kv makes projection mode cross-attention (``X_kv`` of ``seq_k`` rows).
    ``variants`` are fixture keys (``rope``, ``window``, ...) copied in as given, except
    ``sinks=True``, ``qk_norm="head"`` or ``"projection"``, ``alibi_slopes=True``, ``gate=True``
    (or ``"bias"``) and ``diff=True`` (or ``"init"``), which
    draw random numbers (after every other draw, so the other arrays do not change).
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
        assert cross or seq_k == seq, "projection mode is self-attention: seq_q == seq_k"
        fx["X"] = normal(batch, seq, d_model) if batch else normal(seq, d_model)
        d_kv = cross or d_model
        if cross:
            fx["X_kv"] = normal(batch, seq_k, d_kv) if batch else normal(seq_k, d_kv)
        fx["W_Q"] = normal(d_model, heads * d_k)
        fx["W_K"] = normal(d_kv, Hkv * d_k)
        fx["W_V"] = normal(d_kv, Hkv * d_v)
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
    popped = ("sinks", "qk_norm", "alibi_slopes", "gate", "diff")
    sinks, norm, slopes, gate, diff = (variants.pop(k, None) for k in popped)
    fx.update(variants)
    if sinks:
        fx["sinks"] = rng.standard_normal(heads).tolist()
    if norm:
        width = {"head": (d_k, d_k), "projection": (heads * d_k, Hkv * d_k)}[norm]
        q_w, k_w = (rng.uniform(0.5, 1.5, n).tolist() for n in width)
        fx["qk_norm"] = {"q_weight": q_w, "k_weight": k_w, "eps": 1e-6}
    if slopes:
        fx["alibi"] = {"slopes": rng.uniform(0.01, 1.0, heads).tolist()}
    if gate:  # True: W_G; "bias": W_G and b_G
        fx["gate"] = {"W_G": normal(d_model, heads * d_v)}
        if gate == "bias":
            fx["gate"]["b_G"] = normal(heads * d_v)
    if diff:  # True: λ_init from depth 1; "init": λ_init given, a norm weight, per-head vectors
        names = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")
        shape = (heads, d_k // 2) if diff == "init" else (d_k // 2,)
        fx["diff"] = {n: (rng.standard_normal(shape) * 0.5).tolist() for n in names}
        if diff == "init":
            fx["diff"]["lambda_init"] = float(rng.uniform(0.1, 0.8))
            fx["diff"]["norm"] = rng.uniform(0.5, 1.5, d_v).tolist()
        else:
            fx["diff"]["depth"] = 1
    return fx


def _inf_to_str(x: Any) -> Any:
    """-inf becomes the string "-inf", as a JSON fixture writes it."""
    if isinstance(x, list):
        return [_inf_to_str(y) for y in x]
    return "-inf" if x == NEG_INF else x
