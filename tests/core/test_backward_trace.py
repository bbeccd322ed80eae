"""The backward pass in the tracer: every gradient stage of a trace, checked.

Independent sources: central finite differences in float64 of L = Σ grad ∘ final stage, where
the forward is attn's own pipeline (for the inputs: X, W_*, b_*, Q, K, V, sinks) or a loop
reference written here (for the stages in between: Q_norm ... projected); core/backward.py run
on ForwardArrays assembled here from the trace's forward stages; and laws (the rows of dS sum to
0, masked cells get exactly 0, GQA gradients are the sum over the repeated heads).
Tolerances: finite differences max |analytic − numeric| / max |numeric| <= 1e-6 (measured about
1e-9 and below, see FD_ERRORS below); core.backward rtol 1e-12.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import CLIPPED, DIFFERENTIAL, GATED, LATENT, LINEAR
from test_explain import ALLOWED, english_left

from attn_cli.api import trace_file
from attn_cli.check.compare import GOLDEN_TOLERANCE, check_expected, check_golden, write_golden
from attn_cli.check.dump import Dump, load_dump, stage_for
from attn_cli.check.grade import grade
from attn_cli.check.grade_backward import _forward
from attn_cli.core.backward import (
    MISTAKES,
    ForwardArrays,
    attention_backward,
    backward_mistakes,
    merge_heads,
    out_gradients,
    split_heads,
)
from attn_cli.core.chain import REGISTRY, Chain, cells_of
from attn_cli.core.inputs import Inputs
from attn_cli.core.ops import grad_layer_norm, grad_rms_norm
from attn_cli.core.pipeline import Trace, run
from attn_cli.core.plugins.rope import apply_rope, frequencies
from attn_cli.core.stage_facts import final_stage
from attn_cli.core.stages import GRADIENT_STAGE_NAMES, SPECS, softmax_input
from attn_cli.core.steps import allowed_positions
from attn_cli.errors import InputError, UsageError
from attn_cli.io.arrays import npz_writer
from attn_cli.io.examples import example_paths
from attn_cli.io.trace_json import dumps, loads
from attn_cli.io.validate import validate
from attn_cli.present.explain import cell_text, explain_stage
from attn_cli.present.explain_backward import gradient_cell
from attn_cli.present.text import upstream_line
from attn_cli.present.worked import CellRef, worked_cells

Array = np.ndarray[Any, np.dtype[Any]]
# these refuse it
EXAMPLES = sorted(
    set(example_paths()) - set(LATENT) - set(DIFFERENTIAL) - set(LINEAR) - set(CLIPPED)
)
# forward_of below knows no output gate (the gated examples' gradients: tests/core/test_gate.py)
# and no attention temperature (tests/core/test_temperature.py; llama4_temperature's d_X against
# finite differences: tests/cli/test_round41_examples.py)
CORE = sorted(set(EXAMPLES) - set(GATED) - {"llama4_temperature"})
FD_STEP = 1e-5
FD_TOL = 1e-6


def internal(trace: Trace, name: str) -> Array:
    """A stage with its batch axis, as the pipeline holds it."""
    data = np.array(trace[name].data, dtype=np.float64)
    return data if trace.inputs.has_batch or SPECS[name].axes[0] != "batch" else data[None]


# ---------------------------------------------------------------------------------------------
# Small random fixtures covering heads, GQA, masks, bias, causal, W_O and every variant


def _fixture(seed: int, **kw: Any) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    B, T, S, C, H, Hkv, D, Dv = (kw.pop(k) for k in ("B", "T", "S", "C", "H", "Hkv", "D", "Dv"))
    lead = (B,) if B else ()

    def r(*shape: int) -> list[Any]:
        return rng.normal(scale=0.7, size=shape).tolist()  # type: ignore[no-any-return]

    fx: dict[str, Any] = {"heads": H, "kv_heads": Hkv}
    if kw.pop("direct", False):
        fx.update(Q=r(*lead, T, H * D), K=r(*lead, S, Hkv * D), V=r(*lead, S, Hkv * Dv))
    else:
        fx.update(X=r(*lead, T, C), W_Q=r(C, H * D))
        C_kv = C
        if kw.pop("cross", False):
            C_kv = C + 1
            fx["X_kv"] = r(*lead, S, C_kv)
        fx.update(W_K=r(C_kv, Hkv * D), W_V=r(C_kv, Hkv * Dv))
        if kw.pop("biases", False):
            fx.update(b_Q=r(H * D), b_K=r(Hkv * D), b_V=r(Hkv * Dv))
    if kw.pop("W_O", False):
        fx.update(W_O=r(H * Dv, 3), b_O=r(3))
    if kw.pop("grad", False):
        fx["grad"] = r(*lead, T, 3) if "W_O" in fx else r(*lead, H, T, Dv)
    if kw.pop("bias", False):
        fx["bias"] = r(H, T, S)
    if kw.pop("mask", False):
        mask = rng.random((*lead, H, T, S)) < 0.7
        mask[..., 0] = True
        mask[(0,) * len(lead) + (0, T - 1)] = False  # one row with nothing to attend to
        fx["mask"] = mask.tolist()
    norm, per_head = kw.pop("qk_norm", None), kw.pop("norm_head", False)
    if norm == "projection":  # OLMo 2: over the whole projection
        fx["qk_norm"] = {"q_weight": r(H * D), "k_weight": r(Hkv * D), "eps": 1e-5}
    elif per_head:  # Qwen3: each head
        fx["qk_norm"] = {"q_weight": r(D), "k_weight": r(D), "eps": 1e-6}
    if kw.pop("sinks", False):
        fx["sinks"] = r(H)
    fx.update(kw)
    return fx


FIXTURES: dict[str, dict[str, Any]] = {
    "heads, causal, W_O, biases, grad": dict(
        B=2, T=3, S=3, C=4, H=2, Hkv=2, D=2, Dv=2, causal=True, W_O=True, biases=True, grad=True
    ),
    "GQA, mask with an empty row, bias, W_O": dict(
        B=0, T=3, S=3, C=3, H=4, Hkv=2, D=2, Dv=2, mask=True, bias=True, W_O=True, scale=0.8
    ),
    "RoPE, QK-norm per head, sinks, window": dict(
        B=0,
        T=4,
        S=4,
        C=3,
        H=2,
        Hkv=1,
        D=4,
        Dv=2,
        rope=True,
        norm_head=True,
        sinks=True,
        causal=True,
        window=2,
        grad=True,
    ),
    "RoPE, temperature, chunks": dict(
        B=0,
        T=4,
        S=4,
        C=3,
        H=2,
        Hkv=1,
        D=4,
        Dv=2,
        rope=True,
        temperature={"floor_scale": 2, "attn_scale": 0.5},
        causal=True,
        chunk=3,
        grad=True,
    ),
    "RoPE, a weighted norm after RoPE, GQA": dict(
        B=2,
        T=4,
        S=4,
        C=3,
        H=2,
        Hkv=1,
        D=4,
        Dv=2,
        rope=True,
        post_rope_norm={
            "q_weight": [1.2, 0.6, 0.9, 1.4],
            "k_weight": [0.7, 1.3, 1.1, 0.8],
            "eps": 1e-5,
        },
        causal=True,
        W_O=True,
    ),
    "RoPE, a weightless norm after RoPE, temperature": dict(
        B=0,
        T=4,
        S=4,
        C=3,
        H=2,
        Hkv=2,
        D=4,
        Dv=2,
        rope=True,
        post_rope_norm={"eps": 1e-6},
        temperature={"floor_scale": 2, "attn_scale": 0.5},
        causal=True,
        grad=True,
    ),
    "QK-norm over the projection, softcap, ALiBi": dict(
        B=0,
        T=3,
        S=3,
        C=4,
        H=2,
        Hkv=2,
        D=2,
        Dv=3,
        qk_norm="projection",
        softcap=1.5,
        alibi=True,
        grad=True,
    ),
    "cross-attention, lengths, GQA, W_O": dict(
        B=2,
        T=2,
        S=3,
        C=3,
        H=2,
        Hkv=1,
        D=2,
        Dv=2,
        cross=True,
        lengths=[3, 2],
        W_O=True,
        biases=True,
    ),
    "direct, lower-right causal, interleaved partial RoPE, sentinel": dict(
        B=0,
        T=2,
        S=3,
        C=0,
        H=2,
        Hkv=2,
        D=4,
        Dv=2,
        direct=True,
        causal="lower-right",
        rope={"layout": "interleaved", "dims": 2},
        mask_value=-1e9,
    ),
}


def inputs_of(name: str) -> Inputs:
    return validate(_fixture(sum(map(ord, name)), **dict(FIXTURES[name])), f"{name}.json")


# ---------------------------------------------------------------------------------------------
# Finite differences: the forward from an input (the pipeline) or from a stage (written here)


def loss(inputs: Inputs, final: Array) -> float:
    grad = np.ones_like(final) if inputs.grad is None else inputs.grad
    return math.fsum((grad * final).ravel())


def loss_of_inputs(inputs: Inputs) -> float:
    name = final_stage(inputs)
    trace = run(inputs, keep={name})
    return loss(inputs, internal(trace, name))


ORDER = (
    "Q_norm",
    "K_norm",
    "Q_rot",
    "K_rot",
    "Q_postnorm",
    "K_postnorm",
    "Q_tuned",
    "scores",
    "scaled",
    "capped",
    "masked",
    "softmax",
    "output",
    "concat",
    "projected",
)


def loss_from(trace: Trace, start: str, value: Array) -> float:
    """L with stage ``start`` replaced by ``value`` and every later stage recomputed here."""
    inp = trace.inputs
    a = {s.name: internal(trace, s.name) for s in trace if not SPECS[s.name].gradient}
    a[start] = value
    after = ORDER[ORDER.index(start) + 1 :]
    if inp.rope is not None and start in ("Q_norm", "K_norm"):
        pos_q, pos_k = inp.token_positions()
        a["Q_rot"] = rope(inp, a["Q_norm"], pos_q)
        a["K_rot"] = rope(inp, a["K_norm"], pos_k)
    post = inp.setting("post_rope_norm")
    for w in "QK" if post is not None else "":  # x / √(mean(x²) + eps) × weight, after RoPE
        if f"{w}_postnorm" in after:
            x = next(a[s] for s in (f"{w}_rot", f"{w}_norm", w) if s in a)
            weight = 1.0 if post.q_weight is None else getattr(post, f"{w.lower()}_weight")
            a[f"{w}_postnorm"] = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + post.eps) * weight
    temp = inp.setting("temperature")
    if temp is not None and "Q_tuned" in after:  # 1 + s·ln(1 + ⌊(pos + offset) / floor⌋)
        pos_q = inp.token_positions()[0]
        factor = 1 + temp.attn_scale * np.log1p(np.floor((pos_q + temp.offset) / temp.floor_scale))
        q_in = next(a[s] for s in ("Q_postnorm", "Q_rot", "Q_norm", "Q") if s in a)
        a["Q_tuned"] = q_in * factor[:, None]
    q = next(a[s] for s in ("Q_tuned", "Q_postnorm", "Q_rot", "Q_norm", "Q") if s in a)
    k = next(a[s] for s in ("K_postnorm", "K_rot", "K_norm", "K") if s in a)
    B, H = q.shape[:2]
    g = H // k.shape[1]
    if "scores" in after:
        a["scores"] = np.stack(
            [np.stack([q[b, h] @ k[b, h // g].T for h in range(H)]) for b in range(B)]
        )
    if "scaled" in after:
        a["scaled"] = a["scores"] * trace.scale
    x = a["scaled"]
    if inp.setting("softcap") is not None:
        if "capped" in after:
            a["capped"] = inp.setting("softcap") * np.tanh(a["scaled"] / inp.setting("softcap"))
        x = a["capped"]
    if "masked" in trace.stages:
        if "masked" in after:
            m = x + (0.0 if inp.bias is None else inp.bias)
            if inp.setting("alibi") is not None:
                every = cells_of(inp, slice(0, 1), slice(None), slice(None))
                m = m + Chain(inp).bias_stage("alibi", every, np.float64)[0]  # (H, T, S)
            allowed = allowed_positions(inp)
            a["masked"] = m if allowed is None else np.where(allowed, m, inp.mask_value)
        x = a["masked"]
    if "softmax" in after:
        a["softmax"] = softmax_rows(x, inp.setting("sinks"))
    if "output" in after:
        v = a["V"]
        a["output"] = np.stack(
            [np.stack([a["softmax"][b, h] @ v[b, h // g] for h in range(H)]) for b in range(B)]
        )
    if inp.W_O is not None:
        if "concat" in after:
            a["concat"] = np.concatenate(list(a["output"].transpose(1, 0, 2, 3)), axis=-1)
        if "projected" in after:
            a["projected"] = a["concat"] @ inp.W_O + (0.0 if inp.b_O is None else inp.b_O)
    return loss(inp, a[final_stage(inp)])


def rope(inp: Inputs, x: Array, positions: Array, inverse: bool = False) -> Array:
    assert inp.rope is not None
    r = inp.rope
    inv_freq, attention = frequencies(r, inp)  # RoPE scaling's, else base^(-2i/dims) and 1
    return apply_rope(
        x,
        positions,
        layout=r.layout,
        dims=r.dims,
        inverse=inverse,
        inv_freq=inv_freq,
        attention=attention,
    )


def softmax_rows(x: Array, sinks: Array | None) -> Array:
    """Row by row with math.exp; a sink joins each row and is dropped; all −∞ gives zeros."""
    out = np.zeros_like(x)
    for idx in np.ndindex(*x.shape[:-1]):
        row = [float(v) for v in x[idx]]
        extra = [] if sinks is None else [float(sinks[idx[1]])]
        top = max(row + extra)
        if top == -math.inf:
            continue
        e = [math.exp(v - top) for v in row]
        total = math.fsum(e + [math.exp(s - top) for s in extra])
        out[idx] = [v / total for v in e]
    return out


def central(f: Any, base: Array) -> Array:
    out = np.zeros_like(base)
    for idx in np.ndindex(*base.shape):
        plus, minus = base.copy(), base.copy()
        plus[idx] += FD_STEP
        minus[idx] -= FD_STEP
        out[idx] = (f(plus) - f(minus)) / (2 * FD_STEP)
    return out


def as_direct(inputs: Inputs, trace: Trace) -> Inputs:
    """The same computation starting from the trace's Q, K, V (direct mode)."""
    return replace(
        inputs,
        mode="direct",
        X=None,
        X_kv=None,
        W_Q=None,
        W_K=None,
        W_V=None,
        b_Q=None,
        b_K=None,
        b_V=None,
        Q=internal(trace, "Q"),
        K=internal(trace, "K"),
        V=internal(trace, "V"),
    )


def numeric(inputs: Inputs, trace: Trace, stage: str) -> Array | None:
    """dL/d(the forward stage or input of gradient ``stage``) by central differences."""
    target = stage.removeprefix("d_")
    if stage == "delta" or (target == "concat" and inputs.W_O is None):
        return None  # not a gradient / not on the way to L (checked by a law below)
    if target in ("Q", "K", "V") and inputs.mode == "projection":
        inputs = as_direct(inputs, trace)
    if target in ORDER and target not in ("Q", "K", "V"):
        return central(lambda v: loss_from(trace, target, v), internal(trace, target))
    if hasattr(inputs, target):
        base = np.array(getattr(inputs, target), dtype=np.float64)
        return central(lambda v: loss_of_inputs(replace(inputs, **{target: v})), base)
    base = np.array(inputs.setting(target), dtype=np.float64)  # a variant's own (sinks)
    return central(lambda v: loss_of_inputs(inputs.with_setting(target, v)), base)


def fd_errors(name: str) -> dict[str, float]:
    inputs = inputs_of(name)
    trace = run(inputs, backward=True)
    errors = {}
    for s in trace:
        if not SPECS[s.name].gradient or (want := numeric(inputs, trace, s.name)) is None:
            continue
        got = internal(trace, s.name)
        size = float(np.max(np.abs(want)))
        errors[s.name] = float(np.max(np.abs(got - want))) / (size if size > 1e-6 else 1.0)
    return errors


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FIXTURES))
def test_every_gradient_stage_matches_finite_differences(name: str) -> None:
    errors = fd_errors(name)
    bad = {n: e for n, e in errors.items() if not e <= FD_TOL}
    assert not bad, f"relative finite-difference errors above {FD_TOL}: {bad}"


def test_the_fixtures_cover_every_gradient_stage() -> None:
    covered = {n for name in FIXTURES for n in run(inputs_of(name), backward=True).stages}
    # but the gate's (d_gated, d_gate, d_W_G, d_b_G): tests/core/test_gate.py, by finite
    # differences;
    # MLA's latent ones and the halves differential attention cuts (d_Q_1, d_K_1):
    # tests/core/test_mla_backward.py and tests/core/test_diff_backward.py, against torch and finite
    # differences (the bundled examples here have neither)
    front = {n for v in REGISTRY.values() for n in v.front_gradients}
    halves = {f"d_{w}_{v.suffix}" for v in REGISTRY.values() if v.out_reads for w in "QK"}
    # clip_qkv's (d_Q_clip, d_K_clip): the backward pass refuses it (the clamp of V), as
    # tests/acceptance/test_forward_2026_norms.py checks
    refused = {"d_Q_clip", "d_K_clip"}
    # q/k LayerNorm's (d_Q_ln, d_K_ln): tests/core/test_qk_layernorm.py, by finite differences
    # of a loop forward written there
    refused |= {"d_Q_ln", "d_K_ln"}
    assert set(GRADIENT_STAGE_NAMES) - set(out_gradients()) - front - halves - refused <= covered


# ---------------------------------------------------------------------------------------------
# Every bundled example: the trace's gradients are core.backward's


def forward_of(trace: Trace) -> ForwardArrays:
    """core.backward's inputs, assembled here from the trace's own forward stages."""
    inp = trace.inputs
    a = {s.name: internal(trace, s.name) for s in trace if not SPECS[s.name].gradient}
    pos_q, pos_k = inp.token_positions()

    def unrotate(positions: Array) -> Any:
        if inp.rope is None:
            return None
        return lambda d: rope(inp, d, positions, inverse=True)

    def unnorm(name: str) -> Any:
        if inp.setting("qk_norm") is None:
            return None
        x = a[name]
        w = inp.setting("qk_norm").q_weight if name == "Q" else inp.setting("qk_norm").k_weight
        if w.shape[0] == x.shape[-1]:
            return lambda d: grad_rms_norm(d, x, w, inp.setting("qk_norm").eps)
        return lambda d: split_heads(
            grad_rms_norm(merge_heads(d), merge_heads(x), w, inp.setting("qk_norm").eps), x.shape[1]
        )

    def unln(name: str) -> Any:  # q/k LayerNorm: a weight per head (H, 1, D) or one (D,)
        ln = inp.setting("qk_layernorm")
        if ln is None:
            return None
        x, w = a[f"{name}_norm" if f"{name}_norm" in a else name], ln.params(name)[0]
        return lambda d: grad_layer_norm(d, x, w[:, None] if w.ndim == 2 else w, ln.eps)

    def unpost(name: str) -> Any:  # the norm after RoPE, back to the rotated rows
        post = inp.setting("post_rope_norm")
        if post is None:
            return None
        x = a[f"{name}_rot"]
        w = np.ones(x.shape[-1]) if post.q_weight is None else post.weight(name)
        return lambda d: grad_rms_norm(d, x, w, post.eps)

    weights = {n: getattr(inp, n) for n in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")}
    chain = Chain(inp)
    return ForwardArrays(
        q=next(a[s] for s in ("Q_postnorm", "Q_rot", "Q_ln", "Q_norm", "Q") if s in a),
        k=next(a[s] for s in ("K_postnorm", "K_rot", "K_ln", "K_norm", "K") if s in a),
        v=a["V"],
        weights=a["softmax"],
        output=a["output"],
        scale=trace.scale,
        allowed=allowed_positions(inp),
        chain=chain,
        before=(a["scaled"],) if chain.stages else (),
        X=a.get("X"),
        X_kv=a.get("X_kv"),
        b_O=inp.b_O,
        back_q=backs("Q", unnorm("Q"), unrotate(pos_q), unln("Q"), unpost("Q")),
        back_k=backs("K", unnorm("K"), unrotate(pos_k), unln("K"), unpost("K")),
        **weights,
    )


def backs(name: str, unnorm: Any, unrotate: Any, unln: Any = None, unpost: Any = None) -> Any:
    """The Q/K transforms of a trace in forward order (QK-norm, q/k LayerNorm, RoPE, the norm
    after it), as backward takes them: (stage, the map back to the stage before it)."""
    pairs = (
        (f"{name}_norm", unnorm),
        (f"{name}_ln", unln),
        (f"{name}_rot", unrotate),
        (f"{name}_postnorm", unpost),
    )
    return tuple((stage, back) for stage, back in pairs if back is not None)


@pytest.mark.parametrize("example", CORE)
def test_every_bundled_example_traces_the_gradients_of_core_backward(example: str) -> None:
    trace = trace_file(example, backward=True)
    assert trace.upstream == "ones" and trace.backward
    want = attention_backward(forward_of(trace)).stages()
    got = {s.name for s in trace if SPECS[s.name].gradient} - {"delta"}
    assert got == set(want)
    for name, arr in want.items():
        np.testing.assert_allclose(internal(trace, name), arr, rtol=1e-12, atol=1e-14)
        assert trace[name].axes == trace[name].axes and trace[name].data.ndim == len(
            trace[name].axes
        )


@pytest.mark.parametrize("example", EXAMPLES)
def test_each_gradient_is_laid_out_like_its_forward_stage(example: str) -> None:
    trace = trace_file(example, backward=True)
    for s in trace:
        forward = s.name.removeprefix("d_")
        if SPECS[s.name].gradient and forward in trace:
            assert s.axes == trace[forward].axes and s.shape == trace[forward].shape, s.name
            assert SPECS[s.name].score_like == SPECS[forward].score_like


@pytest.mark.parametrize("example", EXAMPLES)
def test_default_traces_are_unchanged(example: str) -> None:
    plain, both = trace_file(example), trace_file(example, backward=True)
    assert plain.upstream is None and not any(SPECS[n].gradient for n in plain.stages)
    assert [n for n in both.stages if not SPECS[n].gradient] == list(plain.stages)
    for s in plain:
        assert np.array_equal(s.data, both[s.name].data), s.name
    assert '"backward"' not in dumps(plain)


# ---------------------------------------------------------------------------------------------
# Laws


@pytest.mark.parametrize("example", EXAMPLES)
def test_masked_cells_get_exactly_zero_and_rows_of_ds_sum_to_zero(example: str) -> None:
    trace = trace_file(example, backward=True)
    inp = trace.inputs
    ds = internal(trace, f"d_{softmax_input(inp)}")
    allowed = allowed_positions(inp)
    if allowed is not None:
        for name in ("d_masked", "d_scaled", "d_scores", "d_capped"):
            if name in trace:
                assert np.all(internal(trace, name)[~allowed] == 0.0), name
    rows = ds.sum(axis=-1)  # (B, H, T)
    for r in trace.sentinel_rows:  # a finite mask_value let weight leak to constant logits
        rows[r.batch, r.head, r.query] = 0.0
    if inp.setting("sinks") is None:
        np.testing.assert_allclose(rows, 0.0, atol=1e-13)
    else:  # the sink takes p_sink · Delta
        p_sink = 1 - internal(trace, "softmax").sum(axis=-1)
        np.testing.assert_allclose(rows, p_sink * internal(trace, "delta"), atol=1e-13)
    delta = (internal(trace, "d_softmax") * internal(trace, "softmax")).sum(axis=-1)
    np.testing.assert_allclose(internal(trace, "delta"), delta, rtol=1e-12, atol=1e-14)


def test_a_row_with_nothing_to_attend_to_gets_no_gradient() -> None:
    trace = run(inputs_of("GQA, mask with an empty row, bias, W_O"), backward=True)
    for name in ("d_softmax", "d_masked", "d_scores"):
        row = trace[name].data[0, -1]  # head 0, last query: every key masked
        assert name == "d_softmax" or np.all(row == 0.0), name
    assert np.all(trace["d_Q"].data[0, -1] == 0.0)


def test_gqa_gradients_are_the_sum_over_the_repeated_heads() -> None:
    inputs = validate(
        _fixture(7, B=0, T=3, S=3, C=0, H=4, Hkv=2, D=2, Dv=2, direct=True, causal=True), "gqa.json"
    )
    assert inputs.Q is not None and inputs.K is not None and inputs.V is not None
    repeated = replace(
        inputs, kv_heads=4, K=np.repeat(inputs.K, 2, axis=1), V=np.repeat(inputs.V, 2, axis=1)
    )
    gqa, mha = run(inputs, backward=True), run(repeated, backward=True)
    for name in ("d_K", "d_V"):
        summed = mha[name].data.reshape(2, 2, *mha[name].shape[1:]).sum(axis=1)  # (Hkv, S, d)
        np.testing.assert_allclose(gqa[name].data, summed, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(gqa["d_Q"].data, mha["d_Q"].data, rtol=1e-12, atol=1e-15)


def test_d_concat_is_d_output_side_by_side_without_w_o() -> None:
    trace = run(inputs_of("RoPE, QK-norm per head, sinks, window"), backward=True)
    assert np.array_equal(trace["d_concat"].data, merge_heads(trace["d_output"].data[None])[0])


def test_float32_backward_is_close_to_float64() -> None:
    inputs = inputs_of("QK-norm over the projection, softcap, ALiBi")
    low, high = run(inputs, backward=True, dtype="float32"), run(inputs, backward=True)
    for s in high:
        assert low[s.name].data.dtype == np.float32, s.name
        size = float(np.max(np.abs(s.data))) or 1.0
        np.testing.assert_allclose(low[s.name].data, s.data, atol=1e-5 * size, err_msg=s.name)


# ---------------------------------------------------------------------------------------------
# The upstream gradient, the API, JSON, npz, check


def test_the_fixture_grad_is_the_upstream_gradient() -> None:
    inputs = inputs_of("heads, causal, W_O, biases, grad")
    trace = run(inputs, backward=True)
    assert trace.upstream == "grad" and trace.loss == "L = Σ grad ∘ projected"
    assert inputs.grad is not None
    assert np.array_equal(internal(trace, "d_projected"), inputs.grad)
    assert trace["d_projected"].formula == "d_projected (given)"
    assert upstream_line(trace, "en") == (
        "backward",
        "L = Σ grad ∘ projected, with the fixture's grad",
    )
    ones = run(replace(inputs, grad=None), backward=True)
    assert ones.upstream == "ones" and np.all(ones["d_projected"].data == 1.0)
    assert upstream_line(trace_file("the_cat_sat"), "en") is None


@pytest.mark.parametrize(
    ("grad", "message"),
    [
        (
            [[1.0, 2.0]],
            "grad: has 2 axes (shape [1, 2]), expected dL/doutput, shape [heads, "
            "seq, d_v] = [1, 3, 2]",
        ),
        ([[[1.0, 2.0]]], "grad: has shape [1, 1, 2], expected dL/doutput"),
        ("x", "grad: got"),
    ],
)
def test_a_bad_grad_is_refused(grad: Any, message: str) -> None:
    fx = _fixture(1, B=0, T=3, S=3, C=2, H=1, Hkv=1, D=2, Dv=2)
    with pytest.raises(InputError, match=re.escape(message)):
        validate({**fx, "grad": grad}, "g.json")


def test_gradient_stages_need_the_backward_pass() -> None:
    with pytest.raises(UsageError, match="is a stage of the backward pass") as err:
        trace_file("the_cat_sat", stages=["d_Q"])
    assert err.value.option == "backward"
    trace = trace_file("the_cat_sat", stages=["d_Q", "softmax"], backward=True)
    assert list(trace.stages) == ["softmax", "d_Q"]
    np.testing.assert_array_equal(
        trace["d_Q"].data, trace_file("the_cat_sat", backward=True)["d_Q"].data
    )
    assert list(run(trace.inputs, keep={"d_Q"}).stages) == []  # no backward: it does not apply


@pytest.mark.parametrize("example", ["causal_multihead", "gptoss_sinks", "padding_batch"])
def test_json_and_npz_round_trip_every_gradient(example: str, tmp_path: Path) -> None:
    trace = trace_file(example, backward=True)
    back = loads(dumps(trace), "t.json")
    assert list(back) == list(trace.stages)
    for s in trace:
        assert np.array_equal(back[s.name], s.data), s.name
    buf = io.BytesIO()
    npz_writer(trace)(buf)
    buf.seek(0)
    with np.load(buf) as z:
        assert set(z.files) == set(trace.stages)
        for s in trace:
            assert np.array_equal(z[s.name], s.data), s.name
    golden = tmp_path / "g.json"
    write_golden(trace, golden)
    assert check_golden(trace, golden).same
    forward_only = check_golden(trace_file(example), golden, GOLDEN_TOLERANCE)
    assert not forward_only.same  # the gradients are on one side only


def test_expected_gradients_are_checked_like_any_stage() -> None:
    fx = _fixture(3, B=0, T=2, S=2, C=2, H=1, Hkv=1, D=2, Dv=2)
    trace = run(validate(fx, "e.json"), backward=True)
    right = {"d_Q": trace["d_Q"].data.tolist(), "softmax": trace["softmax"].data.tolist()}
    good = run(validate({**fx, "expected": right}, "e.json"), backward=True)
    assert check_expected(good).same
    wrong = {"d_Q": (trace["d_Q"].data * 1.01).tolist()}
    bad = run(validate({**fx, "expected": wrong}, "e.json"), backward=True)
    assert check_expected(bad).first_difference.name == "d_Q"  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------
# Explanations and the worked dS cell


@pytest.mark.parametrize(
    "example",
    [
        "causal_multihead",
        "gemma2_softcap",
        "gptoss_sinks",
        "qwen3_qk_norm",
        "cross_attention",
        "grouped_query",
        "llama4_chunked",
        "llama4_temperature",
    ],
)
def test_every_gradient_stage_is_explained_in_both_languages(example: str) -> None:
    trace = trace_file(example, backward=True)
    allowed = [
        *ALLOWED,
        *GRADIENT_STAGE_NAMES,
        "L",
        "dP",
        "dS",
        "Delta",
        "rowsum",
        "tanh²",
        "RoPE⁻¹",
        "rms",
        "w",
        "x̂",
        "δ_jk",
        "p_sink",
        "loss.backward",
        "out.sum",
        "backward",
        "grad",
        "Σ_i",
        "Σ_b",
        "Σ_t",
        "Σ_",
        "T",
        "S",
        "i",
        "j",
        "h",
        "g",
        "d",
        "in",
        "out",
        "ᵀ",
        "Pᵀ",
        "FlashAttention-2",
        "PyTorch",
        "upper-left",
        "d_X",
        "x",
        "log-sum-exp",
        "seq_q",
        "seq_k",
        "sum",
    ]
    tokens = (*trace.query_labels, *trace.key_labels)
    for s in trace:
        if not SPECS[s.name].gradient:
            continue
        en, zh = explain_stage(trace, s.name, "en"), explain_stage(trace, s.name, "zh")
        assert en.meaning and zh.meaning and en.formula, s.name
        assert any("\u4e00" <= c <= "\u9fff" for c in "".join(zh.meaning)), s.name
        for text in zh.meaning:
            assert english_left_with(text, allowed, tokens) == [], text
    entering = "d_K_rot" if "d_K_rot" in trace else "d_K_norm" if "d_K_norm" in trace else "d_K"
    assert any("d_scoresᵀ·Q" in m for m in explain_stage(trace, entering, "en").meaning)
    assert any("1/√d_k" in m for m in explain_stage(trace, "d_scores", "en").meaning)
    assert any("no stored weights" in m for m in explain_stage(trace, "delta", "en").meaning)


def english_left_with(text: str, allowed: list[str], tokens: tuple[str, ...]) -> list[str]:
    for word in sorted(allowed, key=len, reverse=True):
        text = re.sub(rf"(?<![A-Za-z_]){re.escape(word)}(?![A-Za-z_])", " ", text)
    return [w for w in english_left(text, tokens) if w not in allowed]


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_worked_ds_cell_adds_up(example: str) -> None:
    trace = trace_file(example, backward=True)
    inp = trace.inputs
    for b in range(inp.batch):
        for h in range(inp.heads):
            for i in range(inp.seq_q):
                for j in range(inp.seq_k):
                    g = gradient_cell(trace, b if inp.has_batch else None, h, i, j)
                    delta = math.fsum(g.rowsum_terms)
                    assert math.isclose(delta, g.delta, rel_tol=1e-12, abs_tol=1e-13)
                    assert math.isclose(
                        math.fsum(g.flash_terms), g.delta, rel_tol=1e-9, abs_tol=1e-12
                    )
                    assert math.isclose(math.fsum(g.dp_terms), g.dp, rel_tol=1e-12, abs_tol=1e-13)
                    want = g.p * (g.dp - delta) if g.allowed else 0.0
                    assert math.isclose(g.ds, want, rel_tol=1e-12, abs_tol=1e-13)


def test_the_worked_cell_shows_p_dp_and_delta() -> None:
    trace = trace_file("causal_multihead", backward=True)
    cell = worked_cells(trace, CellRef(1, 0))[0]
    part = cell_text(trace, cell, "d_masked", "en")
    assert part is not None
    g = gradient_cell(trace, None, 0, 1, 0)
    shown = "\n".join(part.lines)
    assert "Delta[like] = " in shown and "rowsum(d_output ∘ output)" in shown
    assert f"= {g.p:.4f} × (" in shown
    assert cell_text(trace, cell, "d_scaled", "en") is None  # dS goes under d_masked here
    assert cell_text(trace, cell, "d_softmax", "zh") is not None


# ---------------------------------------------------------------------------------------------
# Grading someone's own backward


def dump_of(trace: Trace, arrays: dict[str, Array], names: dict[str, str] | None = None) -> Dump:
    public = {}
    for stage, arr in arrays.items():
        keep_batch = trace.inputs.has_batch or SPECS[stage].axes[0] != "batch"
        public[stage] = arr if keep_batch else arr[0]
    return Dump("mine.npz", public, names or {}, ())


@pytest.mark.parametrize(
    "example",
    [
        "causal_multihead",
        "grouped_query",
        "cross_attention",
        "llama_rope_gqa",
        "qwen3_qk_norm",
        "gptoss_sinks",
    ],
)
def test_a_dump_made_with_each_mistake_is_diagnosed_by_name(example: str) -> None:
    trace = trace_file(example, backward=True)
    made = backward_mistakes(_forward(trace), trace.inputs.grad)
    assert made
    for name, grads in made.items():
        result = grade(trace_file(example), dump_of(trace, grads.stages()))
        assert name in [d.name for d in result.diagnoses], (name, result.first_difference)
        assert all(d.name in MISTAKES for d in result.diagnoses)


def test_the_right_gradients_pass_and_name_no_mistake() -> None:
    trace = trace_file("grouped_query", backward=True)
    right = attention_backward(_forward(trace)).stages()
    result = grade(trace_file("grouped_query"), dump_of(trace, right))
    assert result.same and not result.diagnoses


def test_the_usual_aliases_name_gradient_stages(tmp_path: Path) -> None:
    for alias, stage in [
        ("dQ", "d_Q"),
        ("grad_q", "d_Q"),
        ("q.grad", "d_Q"),
        ("dK", "d_K"),
        ("dV", "d_V"),
        ("dS", "d_masked"),
        ("dP", "d_softmax"),
        ("dO", "d_output"),
        ("W_Q.grad", "d_W_Q"),
        ("dX", "d_X"),
    ]:
        assert stage_for(alias) == stage, alias
    trace = trace_file("the_cat_sat", backward=True)  # no mask: dS is d_scaled
    path = tmp_path / "mine.npz"
    wrong_dq = trace["d_Q"].data.copy()
    dump = {"dS": trace["d_scaled"].data, "q.grad": wrong_dq * 2, "dV": trace["d_V"].data}
    np.savez(path, **dump)
    result = grade(trace_file("the_cat_sat"), load_dump(path))
    assert [s.name for s in result.stages] == ["d_V", "d_scaled", "d_Q"]
    assert result.first_difference.name == "d_Q"  # type: ignore[union-attr]
    assert result.aliases == {"dS": "d_scaled", "q.grad": "d_Q", "dV": "d_V"}
    assert not result.diagnoses  # doubling d_Q is none of the named mistakes
