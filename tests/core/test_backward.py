"""The backward pass against central finite differences of a forward written here, and its laws.

The forward used by the finite differences (``reference``) is plain NumPy with a loop over
(batch, head) and over softmax rows, written independently of attn_cli. Every gradient stage of
every fixture is compared with central differences in float64: max |analytic − numeric| over
max |numeric| <= 1e-6 (measured: about 1e-9 or below, see ``fd_errors``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_cli.core.backward import (
    GRADIENT_STAGES,
    MISTAKES,
    ForwardArrays,
    attention_backward,
    backward_mistakes,
    delta_flash,
    out_gradients,
)
from attn_cli.core.chain import REGISTRY, Chain
from attn_cli.core.inputs import Inputs

Array = np.ndarray[Any, np.dtype[Any]]
FD_STEP = 1e-5
FD_TOL = 1e-6

# ---------------------------------------------------------------------------------------------
# A fixture and the reference forward


@dataclass(frozen=True)
class Fx:
    """All inputs of one attention computation (internal layouts, batch axis always present)."""

    H: int
    Hkv: int
    scale: float
    X: Array | None = None  # (B, T, C)
    X_kv: Array | None = None  # (B, S, C_kv)
    W: dict[str, Array | None] | None = None  # W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O
    Q: Array | None = None  # direct mode (B, H, T, D)
    K: Array | None = None  # (B, Hkv, S, D)
    V: Array | None = None  # (B, Hkv, S, Dv)
    allowed: Array | None = None  # broadcasts to (B, H, T, S)
    bias: Array | None = None  # broadcasts to (B, H, T, S)
    softcap: float | None = None
    rot_q: Array | None = None  # (T, D, D) one orthogonal matrix per query position
    rot_k: Array | None = None  # (S, D, D)
    temp_q: Array | None = None  # (T,) a factor per query position (attention temperature)
    grad: Array | None = None  # dL/d(final stage); None: L = sum


INPUT_NAMES = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")


def _heads(flat: Array, n: int) -> Array:
    B, T, width = flat.shape
    d = width // n
    out = np.empty((B, n, T, d))
    for h in range(n):
        out[:, h] = flat[:, :, h * d : (h + 1) * d]
    return out


def _softmax_row(x: Array) -> Array:
    if np.all(np.isneginf(x)):
        return np.zeros_like(x)
    e = np.exp(x - x.max())
    row: Array = e / e.sum()
    return row


def reference(fx: Fx, at: str | None = None, value: Array | None = None) -> dict[str, Array]:
    """Every stage; the stage (or input) named ``at`` is replaced by ``value`` when computed."""
    s: dict[str, Array] = {}

    def put(name: str, x: Array) -> Array:
        s[name] = value if name == at and value is not None else x
        return s[name]

    w = {n: (put(n, a) if a is not None else None) for n, a in (fx.W or {}).items()}
    if fx.X is not None:
        X = put("X", fx.X)
        src = X if fx.X_kv is None else put("X_kv", fx.X_kv)
        q = put("Q", _heads(X @ w["W_Q"] + (0 if w["b_Q"] is None else w["b_Q"]), fx.H))
        k = put("K", _heads(src @ w["W_K"] + (0 if w["b_K"] is None else w["b_K"]), fx.Hkv))
        v = put("V", _heads(src @ w["W_V"] + (0 if w["b_V"] is None else w["b_V"]), fx.Hkv))
    else:
        assert fx.Q is not None and fx.K is not None and fx.V is not None
        q, k, v = put("Q", fx.Q), put("K", fx.K), put("V", fx.V)
    if fx.rot_q is not None:
        q = put("Q_rot", np.einsum("tij,bhtj->bhti", fx.rot_q, q))
    if fx.rot_k is not None:
        k = put("K_rot", np.einsum("sij,bhsj->bhsi", fx.rot_k, k))
    if fx.temp_q is not None:
        q = put("Q_tuned", q * fx.temp_q[:, None])  # (B, H, T, D)
    B, T, S = q.shape[0], q.shape[2], k.shape[2]
    scores = np.empty((B, fx.H, T, S))
    for b in range(B):
        for h in range(fx.H):
            scores[b, h] = q[b, h] @ k[b, h // (fx.H // fx.Hkv)].T
    x = put("scaled", put("scores", scores) * fx.scale)
    if fx.softcap is not None:
        x = put("capped", fx.softcap * np.tanh(x / fx.softcap))
    if fx.allowed is not None or fx.bias is not None:
        x = x + (0.0 if fx.bias is None else fx.bias)
        if fx.allowed is not None:
            x = np.where(fx.allowed, x, -np.inf)
        x = put("masked", x)
    P = np.zeros_like(x)
    for idx in np.ndindex(*x.shape[:3]):
        P[idx] = _softmax_row(x[idx])
    P = put("softmax", P)
    out = np.empty((B, fx.H, T, v.shape[3]))
    for b in range(B):
        for h in range(fx.H):
            out[b, h] = P[b, h] @ v[b, h // (fx.H // fx.Hkv)]
    out = put("output", out)
    if fx.H > 1 or w.get("W_O") is not None:
        concat = put("concat", np.concatenate(list(out.transpose(1, 0, 2, 3)), axis=-1))
        if w.get("W_O") is not None:
            put("projected", concat @ w["W_O"] + (0 if w["b_O"] is None else w["b_O"]))
    return s


def final_stage(s: dict[str, Array]) -> Array:
    return s["projected"] if "projected" in s else s["output"]


def loss(fx: Fx, at: str | None = None, value: Array | None = None) -> float:
    """L = sum(grad ∘ final stage); without W_O, taken through concat when it exists."""
    s = reference(fx, at, value)
    grad = np.ones_like(final_stage(s)) if fx.grad is None else fx.grad
    if "concat" in s and "projected" not in s:
        merged = np.concatenate(list(grad.transpose(1, 0, 2, 3)), axis=-1)  # (B, T, H*Dv)
        return float(np.sum(merged * s["concat"]))
    return float(np.sum(grad * final_stage(s)))


def numeric_gradient(fx: Fx, name: str) -> Array:
    """Central differences of the loss with respect to one stage or input, element by element."""
    base = reference(fx)[name]
    out = np.zeros_like(base)
    for idx in np.ndindex(*base.shape):
        plus, minus = base.copy(), base.copy()
        plus[idx] += FD_STEP
        minus[idx] -= FD_STEP
        out[idx] = (loss(fx, name, plus) - loss(fx, name, minus)) / (2 * FD_STEP)
    return out


def forward_arrays(fx: Fx) -> ForwardArrays:
    """The backward's view of a reference run (q, k are the rotated ones under RoPE)."""
    s = reference(fx)
    W = fx.W or {}
    return ForwardArrays(
        q=s.get("Q_tuned", s.get("Q_rot", s["Q"])),
        k=s.get("K_rot", s["K"]),
        v=s["V"],
        weights=s["softmax"],
        output=s["output"],
        scale=fx.scale,
        allowed=fx.allowed,
        bias=fx.bias,
        chain=_chain(fx, s),
        before=(s["scaled"],) if fx.softcap is not None else (),
        X=fx.X,
        X_kv=fx.X_kv,
        back_q=_back_q(fx),
        back_k=() if fx.rot_k is None else (("K_rot", _unrotate(fx.rot_k)),),
        back_out=(),  # no output gate here
        **{n: W.get(n) for n in INPUT_NAMES},
    )


def _chain(fx: Fx, s: dict[str, Array]) -> Chain | None:
    """The chain of the fixture's score modifier (the cap), on bare inputs of its shapes."""
    if fx.softcap is None:
        return None
    B, H, T, D = s["Q"].shape
    inputs = Inputs(
        source="test",
        mode="direct",
        has_batch=True,
        batch=B,
        seq_q=T,
        seq_k=s["K"].shape[2],
        heads=H,
        kv_heads=fx.Hkv,
        d_k=D,
        d_v=s["V"].shape[3],
        extra={"softcap": fx.softcap},
    )
    return Chain(inputs)


def _back_q(fx: Fx) -> tuple[tuple[str, Callable[[Array], Array]], ...]:
    """The query transforms' backward, first transform first: the rotation, the temperature."""
    back: list[tuple[str, Callable[[Array], Array]]] = []
    if fx.rot_q is not None:
        back.append(("Q_rot", _unrotate(fx.rot_q)))
    if fx.temp_q is not None:
        temp = fx.temp_q
        back.append(("Q_tuned", lambda d: d * temp[:, None]))
    return tuple(back)


def _unrotate(rot: Array) -> Callable[[Array], Array]:
    """The transpose of a rotation per position: what carries d_Q_rot back to d_Q."""
    return lambda d: np.einsum("tji,bhtj->bhti", rot, d)


# ---------------------------------------------------------------------------------------------
# Fixtures


def _rotations(rng: np.random.Generator, n: int, d: int) -> Array:
    return np.stack([np.linalg.qr(rng.normal(size=(d, d)))[0] for _ in range(n)])


def make_fixture(
    seed: int,
    *,
    B: int = 2,
    T: int = 3,
    S: int | None = None,
    H: int = 2,
    Hkv: int | None = None,
    D: int = 3,
    Dv: int = 2,
    C: int = 4,
    projection: bool = True,
    cross: bool = False,
    W_O: bool = False,
    biases: bool = False,
    causal: bool = False,
    mask: bool = False,
    empty_row: bool = False,
    bias: bool = False,
    softcap: float | None = None,
    rope: bool = False,
    temperature: bool = False,
    scale: float | None = None,
    upstream: bool = True,
) -> Fx:
    """A small random fixture; values ~N(0, 0.7²) keep the softmax away from saturation."""
    rng = np.random.default_rng(seed)
    S = T if S is None else S
    assert S == T or cross or not projection, "self-attention has as many keys as queries"
    Hkv = H if Hkv is None else Hkv

    def r(*shape: int) -> Array:
        return rng.normal(scale=0.7, size=shape)

    W: dict[str, Array | None] = {}
    kw: dict[str, Any] = {}
    if projection:
        C_kv = C + 1 if cross else C
        kw["X"] = r(B, T, C)
        kw["X_kv"] = r(B, S, C_kv) if cross else None
        W = {"W_Q": r(C, H * D), "W_K": r(C_kv, Hkv * D), "W_V": r(C_kv, Hkv * Dv)}
        W.update(
            {
                f"b_{n}": r(m) if biases else None
                for n, m in (("Q", H * D), ("K", Hkv * D), ("V", Hkv * Dv))
            }
        )
    else:
        kw.update(Q=r(B, H, T, D), K=r(B, Hkv, S, D), V=r(B, Hkv, S, Dv))
    W["W_O"] = r(H * Dv, 3) if W_O else None
    W["b_O"] = r(3) if W_O and biases else None
    kw["allowed"] = _allowed(rng, (B, H, T, S), causal, mask, empty_row)
    kw["bias"] = r(1, H, T, S) if bias else None
    if rope:
        kw["rot_q"], kw["rot_k"] = _rotations(rng, T, D), _rotations(rng, S, D)
    if temperature:
        kw["temp_q"] = 1.0 + rng.random(T)  # any positive factor per query position
    fx = Fx(
        H=H, Hkv=Hkv, scale=1 / np.sqrt(D) if scale is None else scale, W=W, softcap=softcap, **kw
    )
    final = final_stage(reference(fx))
    return replace(fx, grad=r(*final.shape) if upstream else None)


def _allowed(
    rng: np.random.Generator, shape: tuple[int, ...], causal: bool, mask: bool, empty_row: bool
) -> Array | None:
    """Where a query may attend: lower-right causal, a random mask, one row with nothing."""
    if not (causal or mask or empty_row):
        return None
    _, _, T, S = shape
    allowed = np.ones(shape, dtype=bool)
    if causal:
        allowed &= np.arange(S)[None, :] <= np.arange(T)[:, None] + (S - T)  # (T, S)
    if mask:
        allowed &= rng.random(shape) < 0.7
        if not empty_row:
            allowed[..., 0] = True  # keep every row non-empty unless an empty one is wanted
    if empty_row:
        allowed[0, 0, T - 1] = False
    return allowed


FIXTURES: dict[str, dict[str, Any]] = {
    "direct_one_head": dict(projection=False, H=1, T=3, S=3, upstream=False),
    "direct_heads_bias_only": dict(projection=False, H=2, T=2, S=4, bias=True),
    "heads_causal_W_O_biases": dict(H=2, T=4, causal=True, W_O=True, biases=True),
    "gqa_mask_bias_empty_row": dict(
        H=4, Hkv=2, T=4, mask=True, empty_row=True, bias=True, W_O=True, biases=True, scale=0.8
    ),
    "mqa_softcap_causal": dict(H=2, Hkv=1, T=3, causal=True, softcap=1.2, scale=1.5, biases=True),
    "cross_attention_gqa": dict(cross=True, H=4, Hkv=2, T=2, S=3, mask=True, W_O=True, biases=True),
    "rope_gqa_causal": dict(rope=True, H=2, Hkv=1, T=3, causal=True, W_O=True, upstream=False),
    "rope_temperature_gqa": dict(
        rope=True, temperature=True, H=2, Hkv=1, T=3, causal=True, W_O=True
    ),
    "direct_gqa_softcap_mask": dict(
        projection=False, H=4, Hkv=2, T=3, S=3, softcap=2.0, mask=True, bias=True
    ),
}

# The forward stage or input each gradient is taken with respect to.
TARGET = {name: name.removeprefix("d_") for name in GRADIENT_STAGES}


def fd_errors(fx: Fx) -> dict[str, float]:
    """Max |analytic − numeric| / max |numeric| for every gradient the backward returns.

    A gradient that is zero in theory (d_b_K: softmax ignores a constant added to a row) has
    only rounding noise to divide by; its error is the absolute one.
    """
    grads = attention_backward(forward_arrays(fx), fx.grad)
    errors = {}
    for name, analytic in grads:
        numeric = numeric_gradient(fx, TARGET[name])
        assert analytic.shape == numeric.shape, name
        size = float(np.max(np.abs(numeric)))
        errors[name] = float(np.max(np.abs(analytic - numeric))) / (size if size > 1e-6 else 1.0)
    return errors


def expected_stages(fx: Fx) -> set[str]:
    """The gradient stages the backward must return: one per forward stage and input present."""
    s = reference(fx)
    names = set(s) | {n for n, a in (fx.W or {}).items() if a is not None}
    return {f"d_{n}" for n in names} & set(GRADIENT_STAGES)


# ---------------------------------------------------------------------------------------------
# Finite differences


@pytest.mark.parametrize("name", list(FIXTURES))
def test_every_gradient_matches_finite_differences(name: str) -> None:
    fx = make_fixture(sum(map(ord, name)), **FIXTURES[name])
    grads = attention_backward(forward_arrays(fx), fx.grad)
    assert set(grads.stages()) == expected_stages(fx)
    errors = fd_errors(fx)
    bad = {n: e for n, e in errors.items() if not e <= FD_TOL}
    assert not bad, f"relative finite-difference errors above {FD_TOL}: {bad}"


def test_the_fixtures_cover_every_gradient_stage() -> None:
    covered: set[str] = set()
    for name, kw in FIXTURES.items():
        covered |= expected_stages(make_fixture(sum(map(ord, name)), **kw))
    # the head-output transforms' (the gate's: d_gated, d_gate, d_W_G, d_b_G), which this
    # reference forward does not compute: tests/core/test_gate.py, by finite differences; and the
    # halves differential attention cuts (d_Q_1, d_K_1): tests/core/test_diff_backward.py
    from attn_cli.core.stages import STAGE_NAMES

    halves = {f"d_{w}_{v.suffix}" for v in REGISTRY.values() if v.out_reads for w in "QK"}
    # and clip_qkv's (d_Q_clip, d_K_clip): the backward pass refuses it (the clamp of V)
    refused = {"d_Q_clip", "d_K_clip"}
    # and the norm after RoPE's (d_Q_postnorm, d_K_postnorm): tests/core/test_backward_trace.py,
    # by finite differences, and tests/core/test_post_rope_norm.py
    elsewhere = {"d_Q_postnorm", "d_K_postnorm"}
    possible = set(GRADIENT_STAGES) & set(STAGE_NAMES)
    assert covered == possible - set(out_gradients()) - halves - refused - elsewhere


def test_direct_mode_stops_at_qkv() -> None:
    fx = make_fixture(1, **FIXTURES["direct_heads_bias_only"])
    grads = attention_backward(forward_arrays(fx), fx.grad)
    for name in ("d_X", "d_X_kv", "d_W_Q", "d_W_K", "d_W_V", "d_b_Q", "d_b_K", "d_b_V"):
        assert getattr(grads, name) is None


def test_no_grad_means_the_sum_of_the_final_stage() -> None:
    fx = make_fixture(2, **FIXTURES["heads_causal_W_O_biases"])
    fwd = forward_arrays(fx)
    ones = np.ones_like(final_stage(reference(fx)))
    for name, g in attention_backward(fwd, None):
        np.testing.assert_array_equal(g, getattr(attention_backward(fwd, ones), name))


def test_a_grad_of_the_wrong_shape_is_refused() -> None:
    fx = make_fixture(3, **FIXTURES["heads_causal_W_O_biases"])
    with pytest.raises(ValueError, match="grad has shape"):
        attention_backward(forward_arrays(fx), np.ones((1, 2)))


# ---------------------------------------------------------------------------------------------
# Laws


@st.composite
def law_fixtures(draw: st.DrawFn) -> Fx:
    g, Hkv = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    T, projection, cross = draw(st.integers(1, 4)), draw(st.booleans()), draw(st.booleans())
    return make_fixture(
        draw(st.integers(0, 2**32 - 1)),
        B=draw(st.integers(1, 2)),
        T=T,
        S=draw(st.integers(1, 4)) if cross or not projection else T,
        H=g * Hkv,
        Hkv=Hkv,
        D=draw(st.integers(1, 3)),
        projection=projection,
        cross=cross,
        mask=True,
        empty_row=draw(st.booleans()),
        bias=draw(st.booleans()),
        softcap=draw(st.sampled_from([None, 1.5])),
        W_O=draw(st.booleans()),
        biases=draw(st.booleans()),
        upstream=draw(st.booleans()),
    )


@settings(max_examples=40, deadline=None)
@given(law_fixtures())
def test_laws_of_the_score_gradients(fx: Fx) -> None:
    fwd = forward_arrays(fx)
    grads = attention_backward(fwd, fx.grad)
    assert grads.d_masked is not None and fx.allowed is not None
    scale = max(1.0, float(np.abs(grads.d_softmax).max()))
    # the rows of d_masked sum to zero (softmax is invariant to adding a constant to a row)
    np.testing.assert_allclose(grads.d_masked.sum(axis=-1), 0.0, atol=1e-13 * scale)
    # masked positions get exactly zero, at every score stage
    for g in (grads.d_masked, grads.stages().get("d_capped"), grads.d_scaled, grads.d_scores):
        if g is not None:
            assert np.all(g[~np.broadcast_to(fx.allowed, g.shape)] == 0.0)
    # a row with nothing allowed gets zero gradient, and so does its query
    empty = ~np.broadcast_to(fx.allowed, grads.d_scores.shape).any(axis=-1)  # (B, H, T)
    assert np.all(grads.d_scores[empty] == 0.0)
    assert np.all(grads.d_Q[empty] == 0.0)
    # b_K adds q·b_K to a whole row of scores, which softmax ignores: its gradient is zero
    # (not under softcap, whose tanh bends the row)
    if grads.d_b_K is not None and fx.softcap is None:
        np.testing.assert_allclose(grads.d_b_K, 0.0, atol=1e-13 * scale * fx.H)
    # Delta: rowsum(dO ∘ O) == rowsum(dP ∘ P), FlashAttention-2's form
    np.testing.assert_allclose(
        delta_flash(grads.d_output, fwd.output),
        np.einsum("bhts,bhts->bht", grads.d_softmax, fwd.weights),
        rtol=1e-12,
        atol=1e-14 * scale,
    )


@settings(max_examples=25, deadline=None)
@given(law_fixtures())
def test_gqa_gradients_are_sums_over_the_repeated_heads(fx: Fx) -> None:
    g = fx.H // fx.Hkv
    s = reference(fx)
    direct = Fx(
        H=fx.H,
        Hkv=fx.Hkv,
        scale=fx.scale,
        Q=s["Q"],
        K=s["K"],
        V=s["V"],
        allowed=fx.allowed,
        bias=fx.bias,
        softcap=fx.softcap,
        grad=None,
    )
    repeated = replace(
        direct, Hkv=fx.H, K=np.repeat(s["K"], g, axis=1), V=np.repeat(s["V"], g, axis=1)
    )
    grouped = attention_backward(forward_arrays(direct))
    explicit = attention_backward(forward_arrays(repeated))
    B, _, S, _ = explicit.d_K.shape
    np.testing.assert_allclose(grouped.d_Q, explicit.d_Q, rtol=1e-12, atol=1e-14)
    for name in ("d_K", "d_V"):
        per_head = getattr(explicit, name)  # (B, H, S, d)
        summed = per_head.reshape(B, fx.Hkv, g, S, -1).sum(axis=2)  # (B, Hkv, S, d)
        np.testing.assert_allclose(getattr(grouped, name), summed, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------------------------------------
# The named mistakes

GENERIC: dict[str, Any] = dict(H=4, Hkv=2, T=4, causal=True, W_O=True, biases=True, scale=0.7)

# Where each mistake first shows: that stage differs from the right one, those before it do not.
FIRST_WRONG = {
    "softmax_without_rowsum": "d_masked",
    "scale_left_out": "d_scores",
    "scale_applied_twice": "d_scores",
    "dK_not_transposed": "d_K",
    "dV_not_transposed": "d_V",
    "gqa_not_summed": "d_K",
    "gradient_into_masked": "d_masked",
    "dX_missing_Q_path": "d_X",
    "dX_missing_K_path": "d_X",
    "dX_missing_V_path": "d_X",
}


def test_every_named_mistake_differs_from_the_right_answer() -> None:
    fx = make_fixture(7, **GENERIC)
    fwd = forward_arrays(fx)
    right = attention_backward(fwd, fx.grad)
    mistakes = backward_mistakes(fwd, fx.grad)
    assert set(mistakes) == set(MISTAKES) == set(FIRST_WRONG)
    for name, wrong in mistakes.items():
        stage = FIRST_WRONG[name]
        a, b = getattr(wrong, stage), getattr(right, stage)
        assert a.shape == b.shape
        assert np.max(np.abs(a - b)) > 1e-3 * np.max(np.abs(b)), name
        for early in ("d_projected", "d_concat", "d_output", "d_softmax"):
            np.testing.assert_array_equal(getattr(wrong, early), getattr(right, early))


def test_what_each_mistake_computes() -> None:
    fx = make_fixture(8, **GENERIC)
    fwd = forward_arrays(fx)
    right = attention_backward(fwd, fx.grad)
    m = backward_mistakes(fwd, fx.grad)
    P, dP, dO = fwd.weights, right.d_softmax, right.d_output
    assert fx.allowed is not None
    np.testing.assert_allclose(
        _get(m["softmax_without_rowsum"].d_masked), P * dP, rtol=1e-12, atol=1e-14
    )
    np.testing.assert_allclose(
        m["scale_left_out"].d_Q, right.d_Q / fx.scale, rtol=1e-12, atol=1e-14
    )
    np.testing.assert_allclose(
        m["scale_applied_twice"].d_K, right.d_K * fx.scale, rtol=1e-12, atol=1e-14
    )
    np.testing.assert_allclose(
        m["dV_not_transposed"].d_V[:, 0], (P @ dO)[:, 0] + (P @ dO)[:, 1], rtol=1e-12, atol=1e-14
    )
    np.testing.assert_allclose(
        m["gqa_not_summed"].d_V, (P.swapaxes(-1, -2) @ dO)[:, ::2], rtol=1e-12, atol=1e-14
    )
    leaked = _get(m["gradient_into_masked"].d_masked)
    assert np.any(leaked[~np.broadcast_to(fx.allowed, leaked.shape)] != 0.0)
    W = fx.W or {}
    for path, d in (("Q", right.d_Q), ("K", right.d_K), ("V", right.d_V)):
        B, n, T, d_head = d.shape
        merged = d.transpose(0, 2, 1, 3).reshape(B, T, n * d_head)  # (B, T, n*d)
        missing = merged @ _get(W[f"W_{path}"]).T
        lost = _get(right.d_X) - _get(m[f"dX_missing_{path}_path"].d_X)
        np.testing.assert_allclose(lost, missing, rtol=1e-10, atol=1e-13)


def test_mistakes_that_cannot_happen_are_left_out() -> None:
    fx = make_fixture(9, cross=True, H=2, T=2, S=3, scale=1.0)
    mistakes = backward_mistakes(forward_arrays(fx), fx.grad)
    assert set(mistakes) == {"softmax_without_rowsum", "dX_missing_K_path", "dX_missing_V_path"}
    right = attention_backward(forward_arrays(fx), fx.grad)
    for name, wrong in mistakes.items():
        changed = {s for s, g in wrong if not np.array_equal(g, getattr(right, s))}
        assert changed, name


def _get(x: Array | None) -> Array:
    assert x is not None
    return x


def _print_table() -> None:  # pragma: no cover (python tests/core/test_backward.py)
    worst: dict[str, tuple[float, str]] = {}
    for name, kw in FIXTURES.items():
        for stage, err in fd_errors(make_fixture(sum(map(ord, name)), **kw)).items():
            if err >= worst.get(stage, (-1.0, ""))[0]:
                worst[stage] = (err, name)
    for stage in GRADIENT_STAGES:
        err, where = worst[stage]
        print(f"| {stage} | {err:.1e} | {where} |")


if __name__ == "__main__":  # pragma: no cover
    _print_table()
