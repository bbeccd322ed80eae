"""Differential attention (Ye et al. 2024, "Differential Transformer", arXiv 2410.05258), as the
paper's reference code computes it: microsoft/unilm ``Diff-Transformer/multihead_diffattn.py``,
``MultiheadDiffAttn.forward``::

    q, k = q_proj(x), k_proj(x) viewed as 2·heads halves of head_dim = d_k/2 each
    A1 = softmax(Q1·K1ᵀ·s + mask), A2 = softmax(Q2·K2ᵀ·s + mask), s = head_dim^(−1/2)
    λ = exp(Σ λ_q1·λ_k1) − exp(Σ λ_q2·λ_k2) + λ_init,  λ_init = 0.8 − 0.6·exp(−0.3·depth)
    attn = (A1 − λ·A2)·V                          (V: 2·head_dim = d_v per head)
    attn = subln(attn) · (1 − λ_init)              (RMSNorm over d_v, eps 1e-5, a weight)
    heads joined, out_proj

Query head h's Q1 is its first d_k/2 columns, Q2 the next d_k/2 (``view(bsz, tgt_len,
2*num_heads, head_dim)`` then ``view(bsz, num_heads, 2, ...)``), K alike. In the chain: a Q/K
transform keeps the first halves (``Q_1``, ``K_1``), so ``scores`` … ``softmax`` are the first
map's; the head-output transform computes the second map with the same scale, score modifiers,
biases and mask (the chain's, over every cell), λ, the difference map, its product with V, the
norm and the (1 − λ_init) scale, which concat joins. Axes: B batch, H heads, T queries, S keys.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from attn_cli.core.inputs import Inputs
from attn_cli.core.ops import grad_rms_norm, rms_norm
from attn_cli.core.plugins.parsing import (
    is_number,
    known_entries,
    plain,
    positive_number,
)
from attn_cli.core.roles import EXTRA_LOGIT, MAKES_QKV, TRANSFORMS_OUTPUT, TRANSFORMS_QK
from attn_cli.core.stage_spec import K_AXES, OUT_AXES, Q_AXES, SCORE_AXES, StageSpec
from attn_cli.core.variant import (
    Cast,
    FixtureKey,
    FlashMaps,
    FloatArray,
    NewOption,
    NewSpec,
    OutTransform,
    QKAt,
    Traced,
    exact,
    register,
)

DOC = (
    "a mapping {lambda_q1, lambda_k1, lambda_q2, lambda_k2: [d_k/2] vectors (or [heads, "
    "d_k/2]); lambda_init or depth; optional norm [d_v], eps}"
)
SUBKEYS = (
    "lambda_q1",
    "lambda_k1",
    "lambda_q2",
    "lambda_k2",
    "lambda_init",
    "depth",
    "norm",
    "eps",
)
VECTORS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")
if TYPE_CHECKING:
    from attn_cli.core.decode_maps import MapsForm

REFERENCE = "microsoft/unilm Diff-Transformer/multihead_diffattn.py, MultiheadDiffAttn.forward"


@dataclass(frozen=True, eq=False)
class Diff:
    """The layer's λ parameters, λ_init and its per-head RMSNorm (``subln``)."""

    lambda_q1: FloatArray  # (d,) shared by the heads as the reference has it, or (H, d)
    lambda_k1: FloatArray
    lambda_q2: FloatArray
    lambda_k2: FloatArray
    lambda_init: float
    depth: int | None  # the layer index λ_init came from; None: given as a number
    norm: FloatArray | None  # (d_v,): subln's weight; None: ones (elementwise_affine at init)
    eps: float = 1e-5  # the reference's RMSNorm(2 * head_dim, eps=1e-5)


def lambda_init_fn(depth: int) -> float:
    """λ_init = 0.8 − 0.6·exp(−0.3·depth), the reference's ``lambda_init_fn``."""
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


def lambda_full(value: Diff, heads: int, cast: Cast) -> FloatArray:
    """λ of each head, (H,): exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init."""
    q1, k1, q2, k2 = (cast(f"diff.{n}", getattr(value, n)) for n in VECTORS)
    lam = np.exp(np.sum(q1 * k1, axis=-1)) - np.exp(np.sum(q2 * k2, axis=-1)) + value.lambda_init
    out: FloatArray = np.broadcast_to(lam, (heads,)).astype(q1.dtype)  # (H,)
    return out


def second_map(inputs: Inputs, q2: FloatArray, k2: FloatArray, scale: float) -> dict[str, Any]:
    """scores_2 = Q2·K2ᵀ and softmax_2, scaled, modified, biased and masked as the chain does
    the first map (every cell at once)."""
    from attn_cli.core.chain import Chain, cells_of  # the chain imports the plugins
    from attn_cli.core.steps import attention

    cells = cells_of(inputs, slice(None), slice(None), slice(None))
    made = attention(Chain(inputs), q2, k2, None, cells, scale)  # (B, H, T, S) each
    return {"scores_2": made.scores, "softmax_2": made.weights}


def _nowhere(stage: str) -> None:
    return None


def differential(
    value: Diff, inputs: Inputs, seen: Mapping[str, FloatArray], cast: Cast
) -> dict[str, FloatArray]:
    """The second map, λ, the difference map and the head output, from the chain's Q, K, V and
    first softmax map."""
    half = inputs.d_k // 2
    q2, k2 = seen["Q"][..., half:], seen["K"][..., half:]  # (B, H, T, d), (B, H, S, d)
    scale = inputs.scale if inputs.scale is not None else 1.0 / math.sqrt(half)
    out = second_map(inputs, q2, k2, scale)
    lam = lambda_full(value, inputs.heads, cast)  # (H,)
    out["lambda"] = lam
    out["diff"] = seen["softmax"] - lam[None, :, None, None] * out["softmax_2"]  # (B, H, T, S)
    out["diff_output"] = out["diff"] @ seen["V"]  # (B, H, T, Dv)
    norm = None if value.norm is None else cast("diff.norm", value.norm)
    out["diff_norm"] = rms_norm(out["diff_output"], norm, value.eps, divide=True)
    out["diff_scaled"] = out["diff_norm"] * (1.0 - value.lambda_init)
    return out


def differential_backward(
    value: Diff, inputs: Inputs, d_out: FloatArray, made: Mapping[str, FloatArray], cast: Cast
) -> tuple[FloatArray, dict[str, FloatArray]]:
    """Back from d_diff_scaled (B, H, T, Dv) through the scale, the norm, the difference map
    and the second map: d_output (the first map's, output = softmax·V, gets d_diff_output), the
    gradient stages, and what the second map adds to d_Q, d_K, d_V (their second halves)."""
    from attn_cli.core.backward import grad_masked

    Q, K, V = made["Q"], made["K"], made["V"]  # (B, H, T, D), (B, H, S, D), (B, H, S, Dv)
    P2, lam = made["softmax_2"], made["lambda"]  # (B, H, T, S), (H,)
    half = inputs.d_k // 2
    scale = inputs.scale if inputs.scale is not None else 1.0 / math.sqrt(half)
    out: dict[str, FloatArray] = {"d_diff_scaled": d_out}
    # 1) × (1 − λ_init), then the per-head RMSNorm (its weight shared by the heads)
    d_norm = d_out * (1.0 - value.lambda_init)  # (B, H, T, Dv)
    out["d_diff_norm"] = d_norm
    Y = made["diff_output"]
    weight = np.ones(Y.shape[-1], Y.dtype) if value.norm is None else cast("diff.norm", value.norm)
    if value.norm is not None:
        r = np.sqrt(np.mean(Y * Y, axis=-1, keepdims=True) + value.eps)  # (B, H, T, 1)
        out["d_norm"] = (d_norm * (Y / r)).reshape(-1, Y.shape[-1]).sum(axis=0)  # (Dv,)
    d_Y = grad_rms_norm(d_norm, Y, weight, value.eps)  # (B, H, T, Dv)
    out["d_diff_output"] = d_Y
    # 2) diff_output = diff·V, diff = softmax − λ·softmax_2
    d_diff = d_Y @ V.swapaxes(-1, -2)  # (B, H, T, S)
    out["d_diff"] = d_diff
    d_lam = -(d_diff * P2).sum(axis=(0, 2, 3))  # (H,)
    out["d_lambda"] = d_lam
    out.update(_lambda_grads(value, inputs.heads, d_lam, cast))
    # 3) the second map: softmax_2's Jacobian (0 where not allowed), the scale, Q2·K2ᵀ
    d_P2 = -lam[None, :, None, None] * d_diff  # (B, H, T, S)
    out["d_softmax_2"] = d_P2
    d_s2 = grad_masked(P2, d_P2, _allowed(inputs)) * scale  # (B, H, T, S)
    out["d_scores_2"] = d_s2
    zeros_q, zeros_k = np.zeros_like(Q[..., :half]), np.zeros_like(K[..., :half])
    out["d_Q"] = np.concatenate([zeros_q, d_s2 @ K[..., half:]], axis=-1)  # (B, H, T, D)
    out["d_K"] = np.concatenate([zeros_k, d_s2.swapaxes(-1, -2) @ Q[..., half:]], axis=-1)
    out["d_V"] = P2.swapaxes(-1, -2) @ (-lam[None, :, None, None] * d_Y)  # (B, H, S, Dv)
    return d_Y, out


def _lambda_grads(value: Diff, heads: int, d_lam: FloatArray, cast: Cast) -> dict[str, FloatArray]:
    """λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init  =>  d_λ_q1 = d_λ·exp(λ_q1·λ_k1)·λ_k1, ...;
    vectors shared by the heads take every head's d_λ."""
    q1, k1, q2, k2 = (cast(f"diff.{n}", getattr(value, n)) for n in VECTORS)
    e1 = np.exp(np.sum(q1 * k1, axis=-1, keepdims=True))  # (1,) or (H, 1)
    e2 = np.exp(np.sum(q2 * k2, axis=-1, keepdims=True))
    d = d_lam.sum() if q1.ndim == 1 else d_lam[:, None]  # () or (H, 1)
    return {
        "d_lambda_q1": d * e1 * k1,
        "d_lambda_k1": d * e1 * q1,
        "d_lambda_q2": -d * e2 * k2,
        "d_lambda_k2": -d * e2 * q2,
    }


def _allowed(inputs: Inputs) -> Any:
    """Where a query may attend, (B, H, T, S)-broadcastable; None: everywhere."""
    from attn_cli.core.steps import allowed_positions

    return allowed_positions(inputs)


# name, needs, axes, score-like
_OUT: tuple[tuple[str, tuple[str, ...], tuple[str, ...], bool], ...] = (
    ("scores_2", ("Q", "K"), SCORE_AXES, True),
    ("softmax_2", ("scores_2",), SCORE_AXES, True),
    ("lambda", (), ("head",), False),
    ("diff", ("softmax", "softmax_2", "lambda"), SCORE_AXES, True),
    ("diff_output", ("diff", "V"), OUT_AXES, False),
    ("diff_norm", ("diff_output",), OUT_AXES, False),
    ("diff_scaled", ("diff_norm",), OUT_AXES, False),
)
# the backward's rows, in the order it computes them: name, needs, axes, score-like, formula
_GRAD: tuple[tuple[str, tuple[str, ...], tuple[str, ...], bool, str], ...] = (
    ("d_diff_scaled", ("d_concat",), OUT_AXES, False, ""),
    ("d_diff_norm", ("d_diff_scaled",), OUT_AXES, False, ""),
    (
        "d_norm",
        ("d_diff_norm", "diff_output"),
        ("d_v",),
        False,
        "d_norm = Σ_(b, h, t) d_diff_norm ⊙ diff_output/ρ, ρ = √(mean(diff_output²) + eps)",
    ),
    (
        "d_diff_output",
        ("d_diff_norm", "diff_output"),
        OUT_AXES,
        False,
        "d_diff_output = (g − diff_output·mean(g ⊙ diff_output)/ρ²)/ρ, g = norm ⊙ d_diff_norm",
    ),
    ("d_diff", ("d_diff_output", "V"), SCORE_AXES, True, "d_diff = d_diff_output·Vᵀ"),
    (
        "d_lambda",
        ("d_diff", "softmax_2"),
        ("head",),
        False,
        "d_lambda[h] = −Σ d_diff[h] ⊙ softmax_2[h]",
    ),
    ("d_lambda_q1", ("d_lambda",), ("d_k/2",), False, "d_λ_q1 = d_λ·exp(λ_q1·λ_k1)·λ_k1"),
    ("d_lambda_k1", ("d_lambda",), ("d_k/2",), False, "d_λ_k1 = d_λ·exp(λ_q1·λ_k1)·λ_q1"),
    ("d_lambda_q2", ("d_lambda",), ("d_k/2",), False, "d_λ_q2 = −d_λ·exp(λ_q2·λ_k2)·λ_k2"),
    ("d_lambda_k2", ("d_lambda",), ("d_k/2",), False, "d_λ_k2 = −d_λ·exp(λ_q2·λ_k2)·λ_q2"),
    ("d_softmax_2", ("d_diff", "lambda"), SCORE_AXES, True, "d_softmax_2 = −λ·d_diff"),
    (
        "d_scores_2",
        ("d_softmax_2", "softmax_2"),
        SCORE_AXES,
        True,
        "d_scores_2 = softmax_2 ∘ (d_softmax_2 − rowsum(d_softmax_2 ∘ softmax_2)) × scale",
    ),
)
_FORMULAS = {
    "Q_1": "Q_1 = Q[:, :d_k/2] per head (Q1; Q2 = Q[:, d_k/2:])",
    "K_1": "K_1 = K[:, :d_k/2] per head (K1; K2 = K[:, d_k/2:])",
    "scores_2": "scores_2 = Q_2·K_2ᵀ, Q_2 = Q[:, d_k/2:], K_2 = K[:, d_k/2:] per head",
    "diff": "diff = softmax − λ·softmax_2",
    "diff_output": "diff_output = diff·V",
    "diff_norm": "diff_norm = norm ⊙ diff_output / √(mean(diff_output²) + eps), per head",
}


class DifferentialAttention(OutTransform[Diff], FlashMaps[Diff]):
    order = 55  # its Q/K transform first: a transform registered later reads the halves
    name = "diff"
    array_parts = (*VECTORS, "norm")
    subkeys = SUBKEYS
    key_order = 72
    suffix = "1"
    out_stages = tuple(n for n, _, _, _ in _OUT)
    out_reads = ("Q", "K", "V", "softmax", "output")
    out_gradients = tuple(n for n, _, _, _, _ in _GRAD)
    # its halves are its own Q/K transform, its two maps take no extra logit, its RMSNorm is
    # its own head-output transform, and it reads the projections' Q and K
    cannot_run_with = frozenset({TRANSFORMS_QK, EXTRA_LOGIT, TRANSFORMS_OUTPUT, MAKES_QKV})
    excludes_why = (
        "the reference rotates each half of a head on its own, and computes "
        "neither QK-norm, a sink logit, an output gate nor MLA with two maps"
    )
    new_options = (
        NewOption(
            "diff",
            bool,
            "Differential attention: two softmax maps from the halves of "
            "Q and K, subtracted with a re-parameterised lambda, then a per-head RMSNorm "
            "and the (1 - lambda_init) scale (Differential Transformer).",
        ),
    )
    new_rank, new_order = 66, 72

    def parse(self, raw: Any, key: FixtureKey) -> Diff:
        value = known_entries(raw, key, self.name, self.subkeys, DOC)
        return _parse(key, value)

    def config(self, value: Diff, inputs: Inputs) -> dict[str, Any]:
        return {
            "lambda_init": value.lambda_init,
            "depth": value.depth,
            "norm": value.norm is not None,
            "eps": value.eps,
            "reference": REFERENCE,
        }

    def stage_rows(self) -> tuple[StageSpec, ...]:
        on, formula = self.applies, self.formula_of
        rows = [
            StageSpec("Q_1", (), Q_AXES, False, "Q_1", on, formula("Q_1")),
            StageSpec("K_1", (), K_AXES, False, "K_1", on, formula("K_1")),
        ]
        rows += [
            StageSpec(n, needs, axes, score, n, on, formula(n)) for n, needs, axes, score in _OUT
        ]
        rows += [
            StageSpec(
                f"d_{w}_1", (), axes, False, "d_query_key", on, formula(f"d_{w}_1"), gradient=True
            )
            for w, axes in (("Q", Q_AXES), ("K", K_AXES))
        ]
        rows += [
            StageSpec(
                n,
                needs,
                axes,
                score,
                n,
                self._normed if n == "d_norm" else on,
                formula(n),
                gradient=True,
            )
            for n, needs, axes, score, _ in _GRAD
        ]
        return tuple(rows)

    def _normed(self, inputs: Inputs) -> bool:
        value = self.value(inputs)
        return value is not None and value.norm is not None

    def out_needs(self, stage: str) -> tuple[str, ...]:
        return next(needs for n, needs, _, _ in _OUT if n == stage)

    def stage_formula(self, value: Diff, inputs: Inputs, stage: str) -> str:
        if stage == "d_diff_scaled":
            if inputs.W_O is None:
                return (
                    "d_diff_scaled (given)"
                    if inputs.grad is not None
                    else "d_diff_scaled = 1, L = Σ diff_scaled"
                )
            if inputs.heads == 1:
                return "d_diff_scaled = d_concat"
            return "d_diff_scaled[h] = d_concat[:, h·d_v:(h+1)·d_v]"
        if stage == "d_diff_norm":
            return (
                f"d_diff_norm = d_diff_scaled × (1 − λ_init) = d_diff_scaled × "
                f"{1 - value.lambda_init:.6g}"
            )
        if stage.startswith("d_"):
            return next(f for n, _, _, _, f in _GRAD if n == stage)
        if stage == "softmax_2":
            from attn_cli.core.chain import Chain

            hides = Chain(inputs).hides()
            masked = f", {', '.join(hides)}" if hides else ""
            return f"softmax_2 = softmax(scores_2 × scale{masked}) over keys (as softmax)"
        if stage == "lambda":
            init = (
                f"λ_init = 0.8 − 0.6·exp(−0.3·{value.depth}) = {value.lambda_init:.6g}"
                if value.depth is not None
                else f"λ_init = {value.lambda_init:.6g}"
            )
            return f"λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init, {init}"
        if stage == "diff_scaled":
            return (
                f"diff_scaled = diff_norm × (1 − λ_init) = diff_norm × {1 - value.lambda_init:.6g}"
            )
        return _FORMULAS[stage]

    def formula_part(self, value: Diff, inputs: Inputs, stage: str) -> str:
        return {"concat": ", each head's diff_scaled", "d_V": " − λ·softmax_2ᵀ·d_diff_output"}.get(
            stage, ""
        )

    def grad_formula(self, value: Diff, inputs: Inputs, d_out: str, x_in: str) -> str:
        if x_in == "output":  # d_output, from d_diff_scaled
            return "d_diff_output (output = softmax·V is diff_output's first term)"
        if x_in == "Q":
            return f"[{d_out} | d_scores_2·K_2] per head"
        return f"[{d_out} | d_scores_2ᵀ·Q_2] per head"

    def grad_transform(
        self, value: Diff, at: QKAt, d_out: FloatArray, x_in: FloatArray
    ) -> FloatArray:
        """Q_1 = Q's first half: its gradient fills the first half, the second map's the rest."""
        d: FloatArray = np.concatenate([d_out, np.zeros_like(d_out)], axis=-1)
        return d

    def grad_out(
        self, value: Diff, run: Traced, d_out: FloatArray, made: Mapping[str, FloatArray]
    ) -> tuple[FloatArray, dict[str, FloatArray], FloatArray | None]:
        d_output, grads = differential_backward(value, run.inputs, d_out, made, run.cast)
        return d_output, grads, None

    def default_scale(self, value: Diff, inputs: Inputs) -> float:
        """1/√(d_k/2): the reference's ``head_dim ** -0.5``, head_dim being one half's width."""
        return 1.0 / math.sqrt(inputs.d_k // 2)

    def transform(self, value: Diff, at: QKAt, x: FloatArray) -> FloatArray:
        """Q_1 and K_1: each head's first d_k/2 columns."""
        half: FloatArray = x[..., : x.shape[-1] // 2]  # (B, heads, n, d_k/2)
        return half

    def out_transform(self, value: Diff, run: Traced, output: FloatArray) -> dict[str, FloatArray]:
        return differential(value, run.inputs, run.arrays, run.cast)

    def decode_maps(self, value: Diff, run: Traced) -> MapsForm:
        return decode_form(value, run.inputs, run.arrays, run.cast)

    flash_reads = ("Q", "K", "lambda", "diff_output")

    def flash_maps(self, value: Diff, run: Traced) -> tuple[tuple[FloatArray, FloatArray], ...]:
        """The second map's halves, Q2 and K2: tiled as the first map's Q1 and K1 are, over the
        same V (the reference's multihead_flashdiff_1.py calls flash_attn_func twice)."""
        half = run.inputs.d_k // 2
        return ((run.arrays["Q"][..., half:], run.arrays["K"][..., half:]),)

    def flash_finish(
        self, value: Diff, run: Traced, outputs: tuple[FloatArray, ...]
    ) -> dict[str, FloatArray]:
        """diff_output = O1 − λ·O2, each map's tiled softmax·V."""
        O1, O2 = outputs
        lam = np.reshape(run.arrays["lambda"], (-1, run.inputs.heads))[
            0
        ]  # (H,), whatever the layout
        return {"diff_output": O1 - lam[None, :, None, None] * O2}

    def refuses(self, value: Diff, inputs: Inputs, what: str) -> tuple[str, str, str] | None:
        if what in ("FlashAttention", "decoding"):  # decoding: both maps over one cache
            return None
        if what == "the backward pass":
            from attn_cli.core.chain import Chain

            modifiers = ", ".join(v.name for v, _ in Chain(inputs).modifiers)
            if not modifiers:
                return None
            return (
                self.name,
                "the backward pass does not yet run differential attention "
                f"with a score modifier ({modifiers}) on its second map",
                f"a fixture without {modifiers}",
            )
        return (
            self.name,
            f"{what} does not yet run differential attention (two softmax maps)",
            "a fixture without diff (attn trace shows every stage of it)",
        )

    def new_members(self, spec: NewSpec, rng: np.random.Generator) -> dict[str, Any]:
        if not spec.options.get(self.name):
            return {}
        d = spec.d_k // 2
        members = {f"diff.{n}": rng.normal(0.0, 0.1, size=d).round(3) for n in VECTORS}
        return members | {"diff.depth": np.array(1)}

    def new_problem(self, spec: NewSpec) -> tuple[str, str, str] | None:
        if spec.options.get(self.name) and spec.d_k % 2:
            return "d-k", f"is {spec.d_k} with --diff", "an even d_k (Q and K split in halves)"
        return None

    def new_lines(self, spec: NewSpec, members: Mapping[str, Any]) -> list[str]:
        lines = [
            "diff:   # differential attention: (softmax(Q1·K1ᵀ) − λ·softmax(Q2·K2ᵀ))·V, "
            "RMSNorm, × (1 − λ_init); without scale it scales by 1/sqrt(d_k/2) = "
            f"{1 / math.sqrt(spec.d_k // 2):.6g}, each half's width"
        ]
        for n in VECTORS:
            lines.append(f"  {n}: [" + ", ".join(exact(x) for x in members[f"diff.{n}"]) + "]")
        lines.append(
            f"  depth: {int(members['diff.depth'])}   # λ_init = 0.8 − 0.6·exp(−0.3·depth)"
        )
        return lines

    def new_words(self, spec: NewSpec, members: Mapping[str, Any]) -> str:
        return "differential attention"


def decode_form(
    value: Diff, inputs: Inputs, arrays: Mapping[str, FloatArray], cast: Cast
) -> MapsForm:
    """Decoding's two maps from the halves of Q and K over one cache of K and V; each step's
    diff row, diff·V, the norm and the (1 − λ_init) scale, as ``differential`` computes them."""
    from attn_cli.core.decode_maps import MapsForm  # it imports the chain, which imports us

    half = inputs.d_k // 2
    Q, K, V = arrays["Q"], arrays["K"], arrays["V"]  # (B, H, T, d_k), (B, H, T, d_k|d_v)
    lam = lambda_full(value, inputs.heads, cast)[None, :, None, None]  # (1, H, 1, 1)
    norm = None if value.norm is None else cast("diff.norm", value.norm)

    def rows(weights: Sequence[FloatArray]) -> dict[str, FloatArray]:
        return {"diff": weights[0] - lam * weights[1]}  # (B, H, n, C)

    def outs(diff_output: FloatArray) -> dict[str, FloatArray]:
        normed = rms_norm(diff_output, norm, value.eps, divide=True)
        return {
            "lambda": np.broadcast_to(lam, (*diff_output.shape[:3], 1)),
            "diff_output": diff_output,
            "diff_norm": normed,
            "diff_scaled": normed * (1.0 - value.lambda_init),
        }

    def combine(outputs: Sequence[FloatArray]) -> FloatArray:
        mixed: FloatArray = outputs[0] - lam * outputs[1]  # (A1 − λ·A2)·V, a map at a time
        return mixed

    pairs = ((Q[..., :half], K[..., :half]), (Q[..., half:], K[..., half:]))
    return MapsForm(pairs, V, rows, outs, combine, "diff", ("scores_2", "softmax_2"))


def _vector(key: FixtureKey, value: Mapping[str, Any], name: str, d: int) -> FloatArray:
    doc = f"a vector of d_k/2 = {d} numbers, or [heads, d_k/2] = [{key.heads}, {d}]"
    if name not in value:
        raise key("missing", f"{name} in {DOC}", f"diff.{name}")
    raw = value[name]
    numeric = isinstance(raw, np.ndarray) and raw.dtype.kind in "iuf"
    arr = key.floats(raw if numeric else plain(raw), f"diff.{name}", (1, 2), doc)
    if arr.shape[-1] != d or (arr.ndim == 2 and arr.shape[0] != key.heads):
        raise key(f"has shape {list(arr.shape)}", doc, f"diff.{name}")
    return arr


def _parse(key: FixtureKey, value: Mapping[str, Any]) -> Diff:
    """The diff key's checks, each a one-line error naming ``diff.<subkey>``."""
    if key.d_k % 2:
        raise key(
            f"given with d_k = {key.d_k}",
            "an even d_k per head (Q and K are split into two halves, Q1 and Q2)",
        )
    if key.kv_heads != key.heads:
        raise key(
            f"given with kv_heads = {key.kv_heads} < heads = {key.heads}",
            "kv_heads = "
            "heads (the reference's repeat_kv pairs the halves of grouped keys its own "
            "way; attn does not trace it)",
        )
    d = key.d_k // 2
    vectors = {n: _vector(key, value, n, d) for n in VECTORS}
    if ("lambda_init" in value) == ("depth" in value):
        got = "given both" if "lambda_init" in value else "missing"
        raise key(
            f"lambda_init and depth {got}",
            "one of them: lambda_init, a number, or "
            "depth, the layer index (λ_init = 0.8 − 0.6·exp(−0.3·depth))",
            "diff.lambda_init",
        )
    depth = None
    if "depth" in value:
        raw = value["depth"]
        if type(raw) is not int or not 0 <= raw <= 10**6:
            raise key(
                f"got {key.describe(raw)}",
                "a whole number from 0 to 1000000 (the layer index)",
                "diff.depth",
            )
        depth, init = raw, lambda_init_fn(raw)
    else:
        raw = value["lambda_init"]
        if not is_number(raw) or not math.isfinite(float(raw)):
            raise key(f"got {key.describe(raw)}", "a finite number (λ_init)", "diff.lambda_init")
        init = float(raw)
    norm = None
    if "norm" in value:
        raw = value["norm"]
        doc = f"a vector of d_v = {key.d_v} (subln's RMSNorm weight)"
        numeric = isinstance(raw, np.ndarray) and raw.dtype.kind in "iuf"
        norm = key.floats(raw if numeric else plain(raw), "diff.norm", (1,), doc)
        if norm.shape[0] != key.d_v:
            raise key(f"has length {norm.shape[0]}", doc, "diff.norm")
    eps = 1e-5
    if "eps" in value:
        eps = positive_number(value["eps"], key, "RMSNorm's epsilon", "diff.eps")
    return Diff(**vectors, lambda_init=init, depth=depth, norm=norm, eps=eps)


register(DifferentialAttention())
