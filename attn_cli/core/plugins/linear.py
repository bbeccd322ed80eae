"""Linear attention: output made from Q, K, V by a recurrence over the tokens, no softmax.

Two variants, each a mixer of the chain (it replaces scores..softmax) with three forms of the
same numbers, checked equal on every run (``side_equal``):

* ``linear_attention``: Katharopoulos et al. 2020, "Transformers are RNNs", causal, with the
  feature map φ(x) = elu(x) + 1 on the fixture's own Q and K::

      S_t = S_{t−1} + φ(k_t)·v_tᵀ,  z_t = z_{t−1} + φ(k_t),  o_t = φ(q_t)ᵀS_t / φ(q_t)ᵀz_t

* ``gated_deltanet``: Gated DeltaNet as Qwen3-Next runs it (transformers 5.24,
  ``models/qwen3_next/modeling_qwen3_next.py``: ``Qwen3NextGatedDeltaNet``,
  ``torch_recurrent_gated_delta_rule``, ``torch_chunk_gated_delta_rule``), a front end from X::

      qkv = X·[W_q | W_k | W_v], qkv_conv = SiLU(causal depthwise conv1d(qkv))
      beta = σ(X·W_b), g = −exp(A_log)·softplus(X·W_a + dt_bias)
      q = l2norm(q)/√d_k, k = l2norm(k)                       (q, k repeated to the value heads)
      S_t = S_{t−1}·exp(g_t) + k_t·(β_t (v_t − (S_{t−1}·exp(g_t))ᵀk_t))ᵀ,  o_t = S_tᵀq_t
      normed = RMSNorm(o)·norm ⊙ SiLU(z), z = X·W_z       (Qwen3NextRMSNormGated)

The forms: the recurrent one (the state after every token: what decoding runs), the chunked one
(chunk by chunk, as training kernels run it) and the parallel one (the T×T ``weights`` the
recurrence amounts to, output = weights·V), the one the chain's ``output`` holds.
Axes: B batch, H heads, T tokens, d_k and d_v per head.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attn_cli.core.decode_state import Recurrence, State
from attn_cli.core.heads import split_heads
from attn_cli.core.inputs import Inputs
from attn_cli.core.linear_forms import (
    causal_conv,
    delta_chunked,
    delta_parallel,
    delta_recurrent,
    elu1,
    gated_rms_norm,
    l2norm,
    linear_chunked,
    linear_parallel,
    linear_recurrent,
    softplus,
)
from attn_cli.core.ops import sigmoid, silu
from attn_cli.core.plugins.parsing import (
    known_entries,
    known_subkeys,
    plain,
    positive_number,
    whole_number,
)
from attn_cli.core.roles import MAKES_QKV, ON_SOFTMAX, REPLACES_SOFTMAX
from attn_cli.core.stage_spec import OUT_AXES, Q_AXES, SCORE_AXES, StageSpec
from attn_cli.core.variant import (
    Cast,
    FixtureKey,
    FloatArray,
    FrontEnd,
    IntArray,
    Mixer,
    OutTransform,
    Setting,
    SideForm,
    Traced,
    Variant,
    register,
)

CHUNK = 64  # transformers' chunk_size
_STATE = ("batch", "head", "query", "d_k", "d_v")
_PER_TOKEN = ("batch", "head", "query")
_V_AXES = ("batch", "head", "query", "d_v")


# -- the shared rows: the weights, the state table, the recurrent and chunked outputs ----------


def _on(inputs: Inputs) -> tuple[Variant, Any] | None:
    return next(((v, x) for v in _LINEAR if (x := v.value(inputs)) is not None), None)


def _shared_formula(stage: str) -> Any:
    def formula(inputs: Inputs) -> str:
        on = _on(inputs)
        assert on is not None
        return on[0].stage_formula(on[1], inputs, stage)

    return formula


def _shared_rows() -> tuple[StageSpec, ...]:
    def applies(inputs: Inputs) -> bool:
        return _on(inputs) is not None

    rows = (
        ("implicit_weights", ("Q", "K", "V"), SCORE_AXES, True),
        ("state", ("K", "V"), _STATE, False),
        ("output_recurrent", ("state", "Q"), _V_AXES, False),
        ("output_chunked", ("Q", "K", "V"), _V_AXES, False),
    )
    return tuple(
        StageSpec(n, needs, axes, score, n, applies, _shared_formula(n))
        for n, needs, axes, score in rows
    )


class _Linear(Mixer[Setting], SideForm[Setting]):
    """What both linear variants share: the side forms and their checks."""

    side_equal = (("output_recurrent", "output"), ("output_chunked", "output"))
    # it replaces the softmax: nothing that acts on softmax attention runs beside it, nor
    # another mixer, nor a front end (it makes its Q, K, V itself); it is causal itself, so
    # the causal rule alone is what it does already
    cannot_run_with = ON_SOFTMAX | {REPLACES_SOFTMAX, MAKES_QKV}

    def refuses(self, value: Any, inputs: Inputs, what: str) -> tuple[str, str, str] | None:
        if what == "decoding":  # a recurrent state in place of the cache (decode_state)
            return None
        return (
            self.name,
            f"{what} does not yet run linear attention (its recurrent state "
            "is shown by attn trace's state stage)",
            f"a fixture without {self.name} (attn trace shows every stage of it)",
        )

    def default_scale(self, value: Any, inputs: Inputs) -> float:
        """Plain linear attention scales nothing; Gated DeltaNet divides q by √d_k (q_l2)."""
        return 1.0 if isinstance(value, Plain) else 1.0 / float(np.sqrt(value.d_k))


# -- plain linear attention ---------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Plain:
    """The linear_attention key: the feature map (elu+1 only) and the chunked form's size."""

    feature_map: str = "elu+1"
    chunk: int = CHUNK


_PLAIN_DOC = "true, or a mapping {feature_map: elu+1, chunk: chunk size of the chunked form}"


MOST_CHUNK = 1024  # a chunk's (C, C) matrices per head: 8 MiB of float64 at most


def _chunk(raw: Any, key: FixtureKey, field: str) -> int:
    return whole_number(raw, key, field, 1, MOST_CHUNK, "tokens per chunk; transformers: 64")


class LinearAttention(_Linear[Plain]):
    order = 7
    name = "linear_attention"
    subkeys = ("feature_map", "chunk")
    key_order = 77
    mixer_stages = ("phi_Q", "phi_K", "implicit_weights")
    side_stages = ("state", "normaliser", "output_recurrent", "output_chunked")

    def parse(self, raw: Any, key: FixtureKey) -> Plain | None:
        if raw is False:
            return None
        if raw is True:
            raw = {}
        if not isinstance(raw, Mapping):
            raise key(f"got {key.describe(raw)}", _PLAIN_DOC)
        known_subkeys(raw, key, self.name, self.subkeys)
        fm = raw.get("feature_map", "elu+1")
        if fm != "elu+1":
            raise key(
                f"got {key.describe(fm)}",
                "elu+1 (Katharopoulos et al.'s φ)",
                f"{self.name}.feature_map",
            )
        if key.d_model is None:
            raise key("given with Q, K and V directly", "X, W_Q, W_K, W_V alongside it")
        if key.seq_q != key.seq_k:
            raise key(
                f"given with {key.seq_q} queries and {key.seq_k} keys",
                "self-attention (causal linear attention runs over one sequence)",
            )
        chunk = _chunk(raw.get("chunk", CHUNK), key, f"{self.name}.chunk")
        return Plain(fm, chunk)

    def config(self, value: Plain, inputs: Inputs) -> dict[str, Any]:
        return {"feature_map": value.feature_map, "chunk": value.chunk}

    def stage_rows(self) -> tuple[StageSpec, ...]:
        on, f = self.applies, self.formula_of
        weights, state, *outputs = _shared_rows()
        return (
            StageSpec("phi_Q", ("Q",), Q_AXES, False, "phi_Q", on, f("phi_Q")),
            StageSpec(
                "phi_K", ("K",), ("batch", "kv_head", "key", "d_k"), False, "phi_K", on, f("phi_K")
            ),
            weights,
            state,
            StageSpec(
                "normaliser",
                ("K",),
                ("batch", "head", "query", "d_k"),
                False,
                "normaliser",
                on,
                f("normaliser"),
            ),
            *outputs,
        )

    def stage_formula(self, value: Plain, inputs: Inputs, stage: str) -> str:
        return _PLAIN_FORMULAS[stage].replace("{C}", str(value.chunk))

    def mix(self, value: Plain, run: Traced) -> dict[str, FloatArray]:
        inputs, arrays = run.inputs, run.arrays
        _refuse_cross(self, inputs)
        group = inputs.heads // inputs.kv_heads
        # contiguous: (B, H, T, d_k) views of the projection make the products below slow
        phi_q, phi_k = (np.ascontiguousarray(elu1(arrays[n])) for n in ("Q", "K"))
        k, v = (np.repeat(x, group, axis=1) for x in (phi_k, arrays["V"]))  # (B, H, T, ·)
        weights, output = linear_parallel(phi_q, k, v)
        return {"phi_Q": phi_q, "phi_K": phi_k, "implicit_weights": weights, "output": output}

    def side(self, value: Plain, run: Traced, scale: float) -> dict[str, FloatArray]:
        inputs, arrays = run.inputs, run.arrays
        group = inputs.heads // inputs.kv_heads
        k, v = (np.repeat(arrays[n], group, axis=1) for n in ("phi_K", "V"))  # (B, H, T, ·)
        states, zs, out = linear_recurrent(arrays["phi_Q"], k, v)
        chunked = linear_chunked(arrays["phi_Q"], k, v, value.chunk)
        return {
            "state": states,
            "normaliser": zs,
            "output_recurrent": out,
            "output_chunked": chunked,
        }

    def decode_state(self, value: Plain, run: Traced) -> PlainRecurrence:
        q, k, v = (run.arrays[n] for n in ("Q", "K", "V"))
        return PlainRecurrence(q, k, v, value.chunk)


_PLAIN_FORMULAS = {
    "phi_Q": "phi_Q = elu(Q) + 1",
    "phi_K": "phi_K = elu(K) + 1",
    "implicit_weights": "implicit_weights[t, s] = phi_Q[t]·phi_K[s] / "
    "Σ_(s' ≤ t) phi_Q[t]·phi_K[s'], s ≤ t",
    "output": "output = implicit_weights·V (the parallel form)",
    "state": "state[t] = state[t−1] + phi_K[t]·V[t]ᵀ",
    "normaliser": "normaliser[t] = normaliser[t−1] + phi_K[t]",
    "output_recurrent": "output_recurrent[t] = phi_Q[t]·state[t] / phi_Q[t]·normaliser[t]",
    "output_chunked": "output_chunked = chunks of {C}: carried state + causal within the chunk",
}


def _refuse_cross(v: Variant, inputs: Inputs) -> None:
    """Keys of their own (X_kv) have no place in causal linear attention: one line. (What acts
    on the softmax it replaces the chain refuses: ``cannot_run_with``.)"""
    from attn_cli.errors import InputError

    if inputs.X_kv is not None:
        raise InputError(
            inputs.source,
            "X_kv",
            f"given with {v.name}",
            "self-attention (causal linear attention runs over one sequence)",
        )


# -- Gated DeltaNet (Qwen3-Next) -----------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Delta:
    """The gated_deltanet key in attn's layout (``y = X @ W``): in_proj_qkvz's and in_proj_ba's
    columns un-interleaved into one matrix each, the conv weight per channel [q | k | v]."""

    W_q: FloatArray  # (d_model, Hk*d_k)
    W_k: FloatArray  # (d_model, Hk*d_k)
    W_v: FloatArray  # (d_model, H*d_v)
    W_z: FloatArray  # (d_model, H*d_v): the output gate
    W_b: FloatArray  # (d_model, H): beta's logits
    W_a: FloatArray  # (d_model, H): the decay's input
    conv: FloatArray  # (2*Hk*d_k + H*d_v, kernel): conv1d.weight[:, 0, :]
    A_log: FloatArray  # (H,)
    dt_bias: FloatArray  # (H,)
    norm: FloatArray  # (d_v,): Qwen3NextRMSNormGated's weight
    k_heads: int
    eps: float = 1e-6  # rms_norm_eps, the gated RMSNorm's
    chunk: int = CHUNK

    @property
    def d_k(self) -> int:
        return int(self.W_q.shape[1]) // self.k_heads


_DELTA_DOC = (
    "a mapping {W_q, W_k, W_v, W_z, W_b, W_a, conv, A_log, dt_bias, norm; optional "
    "k_heads, eps, chunk}"
)
_DELTA_KEYS = (
    "W_q",
    "W_k",
    "W_v",
    "W_z",
    "W_b",
    "W_a",
    "conv",
    "A_log",
    "dt_bias",
    "norm",
    "k_heads",
    "eps",
    "chunk",
)
_DELTA_ARRAYS = _DELTA_KEYS[:10]


def delta_front(value: Delta, heads: int, X: FloatArray, cast: Cast) -> dict[str, Any]:
    """Qwen3NextGatedDeltaNet.forward up to the kernel: the conv, beta, g, and Q, K, V."""
    w = {n: cast(f"gated_deltanet.{n}", getattr(value, n)) for n in _DELTA_ARRAYS}
    out: dict[str, Any] = {}
    # 1) q, k, v side by side, then the causal depthwise conv and SiLU over them
    out["qkv"] = np.concatenate([X @ w["W_q"], X @ w["W_k"], X @ w["W_v"]], axis=-1)  # (B,T,C)
    out["qkv_conv"] = silu(causal_conv(out["qkv"], w["conv"]))
    kd = value.k_heads * value.d_k
    q_flat, k_flat, v_flat = np.split(out["qkv_conv"], [kd, 2 * kd], axis=-1)
    # 2) query/key heads repeated to serve heads // k_heads value heads each (repeat_interleave)
    group = heads // value.k_heads
    out["Q"] = np.repeat(split_heads(q_flat, value.k_heads), group, axis=1)  # (B, H, T, d_k)
    out["K"] = np.repeat(split_heads(k_flat, value.k_heads), group, axis=1)  # (B, H, T, d_k)
    out["V"] = split_heads(v_flat, heads)  # (B, H, T, d_v)
    # 3) the write strength beta and the log decay g, one per head and token
    out["beta"] = sigmoid(X @ w["W_b"]).swapaxes(1, 2)  # (B, H, T)
    a = X @ w["W_a"] + w["dt_bias"]  # (B, T, H)
    out["g"] = (-np.exp(w["A_log"]) * softplus(a)).swapaxes(1, 2)  # (B, H, T)
    return out


class GatedDeltaNet(FrontEnd[Delta], _Linear[Delta], OutTransform[Delta]):
    order = 6
    name = "gated_deltanet"
    array_parts = _DELTA_ARRAYS
    subkeys = _DELTA_KEYS
    key_order = 76
    front_stages = ("qkv", "qkv_conv", "beta", "g")
    mixer_stages = ("q_l2", "k_l2", "implicit_weights")
    side_stages = ("state", "output_recurrent", "output_chunked")
    out_stages = ("z", "normed")

    def latent_sizes(self, value: Delta, heads: int) -> tuple[int, int]:
        return value.d_k, int(value.W_v.shape[1]) // heads

    def parse(self, raw: Any, key: FixtureKey) -> Delta:
        value = known_entries(raw, key, self.name, self.subkeys, _DELTA_DOC)
        return _DeltaParser(key, value).delta()

    def config(self, value: Delta, inputs: Inputs) -> dict[str, Any]:
        return {
            "num_k_heads": value.k_heads,
            "num_v_heads": inputs.heads,
            "head_k_dim": value.d_k,
            "head_v_dim": inputs.d_v,
            "conv_kernel": int(value.conv.shape[1]),
            "eps": value.eps,
            "chunk": value.chunk,
        }

    def stage_rows(self) -> tuple[StageSpec, ...]:
        on, f = self.applies, self.formula_of
        rows = (
            ("qkv", ("X",), ("batch", "query", "conv_dim")),
            ("qkv_conv", ("qkv",), ("batch", "query", "conv_dim")),
            ("beta", ("X",), _PER_TOKEN),
            ("g", ("X",), _PER_TOKEN),
            ("q_l2", ("Q",), Q_AXES),
            ("k_l2", ("K",), Q_AXES),
            ("z", ("X",), OUT_AXES),
            ("normed", ("output", "z"), OUT_AXES),
        )
        return tuple(StageSpec(n, needs, axes, False, n, on, f(n)) for n, needs, axes in rows)

    def out_needs(self, stage: str) -> tuple[str, ...]:
        return ("output", "z") if stage == "normed" else ("output",)

    def stage_formula(self, value: Delta, inputs: Inputs, stage: str) -> str:
        return _DELTA_FORMULAS[stage].replace("{C}", str(value.chunk))

    def front(
        self, value: Delta, inputs: Inputs, X: FloatArray, positions: IntArray, cast: Cast
    ) -> dict[str, FloatArray]:
        return delta_front(value, inputs.heads, X, cast)

    def mix(self, value: Delta, run: Traced) -> dict[str, FloatArray]:
        arrays = run.arrays
        q = l2norm(arrays["Q"]) / np.sqrt(value.d_k).astype(arrays["Q"].dtype)
        k = l2norm(arrays["K"])
        weights, output = delta_parallel(q, k, arrays["V"], arrays["g"], arrays["beta"])
        return {"q_l2": q, "k_l2": k, "implicit_weights": weights, "output": output}

    def side(self, value: Delta, run: Traced, scale: float) -> dict[str, FloatArray]:
        q, k, v, g, beta = (run.arrays[n] for n in ("q_l2", "k_l2", "V", "g", "beta"))
        states, out = delta_recurrent(q, k, v, g, beta)
        chunked = delta_chunked(q, k, v, g, beta, value.chunk)
        return {"state": states, "output_recurrent": out, "output_chunked": chunked}

    decode_stages = ("g", "beta")

    def decode_state(self, value: Delta, run: Traced) -> DeltaRecurrence:
        return DeltaRecurrence(value, run.inputs.heads, run.arrays, run.cast)

    def out_transform(self, value: Delta, run: Traced, output: FloatArray) -> dict[str, FloatArray]:
        X, cast = run.arrays["X"], run.cast  # gated_deltanet is parsed only with X
        z = split_heads(X @ cast("gated_deltanet.W_z", value.W_z), run.inputs.heads)  # (B,H,T,Dv)
        norm = cast("gated_deltanet.norm", value.norm)
        return {"z": z, "normed": gated_rms_norm(output, z, norm, value.eps)}


_DELTA_FORMULAS = {
    "qkv": "qkv = X·[W_q | W_k | W_v]",
    "qkv_conv": "qkv_conv = SiLU(causal conv1d(qkv)), depthwise over tokens",
    "Q": "Q = qkv_conv's q columns per key head, repeated to the value heads",
    "K": "K = qkv_conv's k columns per key head, repeated to the value heads",
    "V": "V = qkv_conv's v columns, split into heads",
    "beta": "beta = σ(X·W_b)",
    "g": "g = −exp(A_log)·softplus(X·W_a + dt_bias)",
    "q_l2": "q_l2 = Q / √(Σ Q² + 1e-6) / √d_k",
    "k_l2": "k_l2 = K / √(Σ K² + 1e-6)",
    "implicit_weights": "implicit_weights = (q_l2·k_l2ᵀ ⊙ D)·(I + L)⁻¹·diag(beta), "
    "D[t, s] = exp(Σ_(s<i≤t) g_i), L = strictly_lower(beta[t]·k_l2[t]·k_l2[s]·D[t, s])",
    "output": "output = implicit_weights·V (the parallel form)",
    "state": "state[t] = state[t−1]·e^g[t] + k_l2[t]·(beta[t]·(V[t] − (state[t−1]·e^g[t])ᵀ"
    "k_l2[t]))ᵀ",
    "output_recurrent": "output_recurrent[t] = state[t]ᵀ·q_l2[t]",
    "output_chunked": "output_chunked = chunks of {C}: the UT transform within, the state carried",
    "z": "z = X·W_z",
    "normed": "normed = norm ⊙ output / √(mean(output²) + eps) ⊙ SiLU(z)",
}


class _DeltaParser:
    """The gated_deltanet key's checks, each a one-line error naming ``gated_deltanet.<sub>``."""

    def __init__(self, key: FixtureKey, value: Mapping[str, Any]) -> None:
        self.key, self.value = key, value

    def array(self, name: str, shape: tuple[int | None, ...], doc: str) -> FloatArray:
        field = f"gated_deltanet.{name}"
        if name not in self.value:
            raise self.key("missing", f"{name} in {_DELTA_DOC}", field)
        raw = self.value[name]
        numeric = isinstance(raw, np.ndarray) and raw.dtype.kind in "iuf"
        arr = self.key.floats(raw if numeric else plain(raw), field, (len(shape),), doc)
        for got, want in zip(arr.shape, shape, strict=True):
            if (want is not None and got != want) or got == 0:
                raise self.key(f"has shape {list(arr.shape)}", doc, field)
        return arr

    def delta(self) -> Delta:
        key, v = self.key, self.value
        if key.d_model is None:
            raise key(
                "given with Q, K and V directly",
                "X alongside it (Gated DeltaNet projects q, k, v, z, b and a from X)",
            )
        d, H = key.d_model, key.heads
        k_heads = whole_number(
            v.get("k_heads", H), key, "gated_deltanet.k_heads", 1, H, f"dividing heads = {H}"
        )
        if H % k_heads:
            raise key(
                f"got {key.describe(k_heads)}",
                f"a whole number dividing heads = {H}",
                "gated_deltanet.k_heads",
            )
        W_q = self.array("W_q", (d, None), f"a matrix [d_model, k_heads*d_k] = [{d}, ...]")
        if W_q.shape[1] % k_heads:
            raise key(
                f"has {W_q.shape[1]} columns",
                f"k_heads*d_k, k_heads = {k_heads}",
                "gated_deltanet.W_q",
            )
        kd = int(W_q.shape[1])
        W_k = self.array("W_k", (d, kd), f"a matrix [d_model, k_heads*d_k] = [{d}, {kd}]")
        W_v = self.array("W_v", (d, None), f"a matrix [d_model, heads*d_v] = [{d}, ...]")
        if W_v.shape[1] % H:
            raise key(
                f"has {W_v.shape[1]} columns", f"heads*d_v, heads = {H}", "gated_deltanet.W_v"
            )
        vd = int(W_v.shape[1])
        W_z = self.array("W_z", (d, vd), f"a matrix [d_model, heads*d_v] = [{d}, {vd}]")
        W_b = self.array("W_b", (d, H), f"a matrix [d_model, heads] = [{d}, {H}]")
        W_a = self.array("W_a", (d, H), f"a matrix [d_model, heads] = [{d}, {H}]")
        conv = self.array(
            "conv",
            (2 * kd + vd, None),
            f"a matrix [2*k_heads*d_k + heads*d_v, kernel] = [{2 * kd + vd}, K]",
        )
        A_log = self.array("A_log", (H,), f"a vector of heads = {H} numbers")
        dt_bias = self.array("dt_bias", (H,), f"a vector of heads = {H} numbers")
        norm = self.array("norm", (vd // H,), f"a vector of d_v = {vd // H} numbers")
        settings: dict[str, Any] = {}
        if "eps" in v:
            settings["eps"] = positive_number(
                v["eps"], key, "RMSNorm's epsilon", "gated_deltanet.eps"
            )
        if "chunk" in v:
            settings["chunk"] = _chunk(v["chunk"], key, "gated_deltanet.chunk")
        return Delta(W_q, W_k, W_v, W_z, W_b, W_a, conv, A_log, dt_bias, norm, k_heads, **settings)


# -- decoding: the recurrent form one token at a time (core/decode_state.py) -------------------


class PlainRecurrence(Recurrence):
    """Katharopoulos' state per key/value head: S (d_k×d_v) and z (d_k); query head h reads
    the state of kv head h // (H/Hkv)."""

    formulas: ClassVar[Mapping[str, str]] = {
        "S": "S = S + φ(k)·vᵀ",
        "z": "z = z + φ(k)",
        "phi_q": "φ(q) = elu(q) + 1",
        "phi_k": "φ(k) = elu(k) + 1",
        "v": "v = V[token]",
        "num": "num = φ(q)ᵀ·S",
        "den": "den = φ(q)·z",
        "output": "output = num / den",
    }

    def __init__(self, Q: FloatArray, K: FloatArray, V: FloatArray, chunk: int) -> None:
        self.Q, self.K, self.V, self.chunk = Q, K, V, chunk  # (B, H|Hkv, T, ·)
        self.heads, self.tokens, self.d_k = K.shape[1], K.shape[2], K.shape[3]
        self.d_v = V.shape[3]
        self.group = Q.shape[1] // K.shape[1]

    def init(self) -> State:
        B, dtype = self.K.shape[0], self.K.dtype
        return {
            "S": np.zeros((B, self.heads, self.d_k, self.d_v), dtype),
            "z": np.zeros((B, self.heads, self.d_k), dtype),
        }

    def step(self, state: State, t: int) -> tuple[State, dict[str, FloatArray], FloatArray]:
        phi_q = elu1(self.Q[:, :, t])  # (B, H, d_k)
        phi_k, v = elu1(self.K[:, :, t]), self.V[:, :, t]  # (B, Hkv, d_k), (B, Hkv, d_v)
        S = state["S"] + phi_k[..., :, None] * v[..., None, :]  # (B, Hkv, d_k, d_v)
        z = state["z"] + phi_k  # (B, Hkv, d_k)
        S_h, z_h = (np.repeat(x, self.group, axis=1) for x in (S, z))  # (B, H, ·) by query head
        num = np.einsum("bhk,bhkv->bhv", phi_q, S_h)  # (B, H, d_v)
        den = np.einsum("bhk,bhk->bh", phi_q, z_h)[..., None]  # (B, H, 1)
        read = {"phi_q": phi_q, "phi_k": phi_k, "v": v, "num": num, "den": den}
        return {"S": S, "z": z}, read, num / den

    def reference(self) -> FloatArray:
        k, v = (np.repeat(x, self.group, axis=1) for x in (elu1(self.K), self.V))
        out: FloatArray = linear_chunked(elu1(self.Q), k, v, self.chunk)
        return out


class DeltaRecurrence(Recurrence):
    """Gated DeltaNet token by token as Qwen3-Next decodes (causal_conv1d_update, then
    torch_recurrent_gated_delta_rule's step): the conv's window of the last K−1 tokens' qkv,
    and S (d_k×d_v) per value head."""

    formulas: ClassVar[Mapping[str, str]] = {
        "conv": "conv[t−i] = X[t−i]·[W_q | W_k | W_v], i = K−1..1",
        "S": "S = S·e^g + k·(beta·(v − (S·e^g)ᵀk))ᵀ",
        "q": "q = l2norm(qkv_conv[q]) / √d_k, qkv_conv = SiLU(Σ_j w[:, j]·[conv | qkv_t][j])",
        "k": "k = l2norm(qkv_conv[k])",
        "v": "v = qkv_conv[v]",
        "g": "g = −exp(A_log)·softplus(x·W_a + dt_bias)",
        "beta": "beta = σ(x·W_b)",
        "kv_mem": "kv_mem = (S·e^g)ᵀk",
        "delta": "delta = beta·(v − kv_mem)",
        "output": "output = Sᵀq",
    }

    def __init__(
        self, value: Delta, heads: int, arrays: Mapping[str, FloatArray], cast: Cast
    ) -> None:
        self.value, self.arrays = value, arrays
        self.w = {n: cast(f"gated_deltanet.{n}", getattr(value, n)) for n in _DELTA_ARRAYS}
        self.W_qkv = np.concatenate([self.w["W_q"], self.w["W_k"], self.w["W_v"]], axis=1)
        self.X = arrays["X"]  # (B, T, d_model)
        self.heads, self.tokens, self.d_k = heads, self.X.shape[1], value.d_k
        self.d_v = int(value.W_v.shape[1]) // heads
        self.group = heads // value.k_heads

    def init(self) -> State:
        B, dtype = self.X.shape[0], self.X.dtype
        kernel, channels = self.w["conv"].shape[1], self.W_qkv.shape[1]
        return {
            "conv": np.zeros((B, kernel - 1, channels), dtype),
            "S": np.zeros((B, self.heads, self.d_k, self.d_v), dtype),
        }

    def step(self, state: State, t: int) -> tuple[State, dict[str, FloatArray], FloatArray]:
        x = self.X[:, t]  # (B, d_model)
        # 1) the conv: this token's qkv joins the window of the K−1 before it
        window = np.concatenate([state["conv"], (x @ self.W_qkv)[:, None]], axis=1)  # (B, K, C)
        mixed = silu(np.einsum("bjc,cj->bc", window, self.w["conv"]))  # (B, C)
        kd = self.value.k_heads * self.d_k
        q, k, v = np.split(mixed, [kd, 2 * kd], axis=-1)
        B = x.shape[0]
        q, k = (np.repeat(a.reshape(B, -1, self.d_k), self.group, axis=1) for a in (q, k))
        q = l2norm(q) / np.sqrt(self.d_k).astype(q.dtype)  # (B, H, d_k)
        k = l2norm(k)  # (B, H, d_k)
        v = v.reshape(B, self.heads, self.d_v)  # (B, H, d_v)
        # 2) the write strength and the decay of this token
        beta = sigmoid(x @ self.w["W_b"])  # (B, H)
        g = -np.exp(self.w["A_log"]) * softplus(x @ self.w["W_a"] + self.w["dt_bias"])  # (B, H)
        # 3) the delta rule
        S = state["S"] * np.exp(g)[..., None, None]  # (B, H, d_k, d_v)
        kv_mem = np.einsum("bhkv,bhk->bhv", S, k)  # (B, H, d_v)
        delta = (v - kv_mem) * beta[..., None]
        S = S + k[..., :, None] * delta[..., None, :]
        out = np.einsum("bhkv,bhk->bhv", S, q)  # (B, H, d_v)
        read = {
            "q": q,
            "k": k,
            "v": v,
            "g": g[..., None],
            "beta": beta[..., None],
            "kv_mem": kv_mem,
            "delta": delta,
        }
        return {"conv": window[:, 1:], "S": S}, read, out

    def reference(self) -> FloatArray:
        a = self.arrays
        q = l2norm(a["Q"]) / np.sqrt(self.d_k).astype(a["Q"].dtype)
        out: FloatArray = delta_chunked(
            q, l2norm(a["K"]), a["V"], a["g"], a["beta"], self.value.chunk
        )
        return out


_LINEAR: tuple[_Linear, ...] = (GatedDeltaNet(), LinearAttention())
for _v in _LINEAR:
    register(_v)
