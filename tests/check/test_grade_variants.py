"""The grader on modern attention: each mistake of RoPE, ALiBi, windows, softcap, sinks, GQA and
three a new user makes, planted in a student's own code and diagnosed by name.

``student`` below is attention with the variants written the way a student would (NumPy, one
head at a time, RoPE as HF's ``rotate_half`` and Meta's complex rotation), separate from attn's
pipeline and from the grader; each mistake is planted there, dumped as a user would (JSON or
.npz), and graded. A correct dump, from the loop reference (tests/reference.py), gets no
diagnosis; the student without a mistake agrees with that reference.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import yaml
from conftest import FIXTURES, Tolerance, run_cli
from reference import random_fixture, reference

from attn_cli.api import trace_file
from attn_cli.check.compare import Comparison
from attn_cli.check.dump import load_dump
from attn_cli.check.grade import MISTAKES, grade
from attn_cli.check.recompute import allowed, downstream
from attn_cli.core.pipeline import Trace
from attn_cli.core.stages import STAGE_NAMES
from attn_cli.core.steps import allowed_positions

Array = npt.NDArray[np.float64]
VARIANT_FIXTURES = [
    "llama_rope_gqa",
    "llama_rope_interleaved",
    "mistral_sliding_window",
    "gemma2_softcap",
    "gptoss_sinks",
    "qwen3_qk_norm",
    "cross_attention",
    "mask_sentinel",
    "qwen3_next_gate",
]
TOL: Tolerance = {"rtol": 1e-9, "atol": 1e-12}  # float64 on both sides: rounding noise only


def bundled(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((FIXTURES / f"{name}.yaml").read_text())
    return loaded


# ---------------------------------------------------------------------------------------------
# A student's attention, with at most one planted mistake


def rope_half(x: Array, pos: Array, base: float, dims: int) -> Array:
    """HF's rotate_half: x·cos + rotate_half(x)·sin on the first ``dims`` columns."""
    inv_freq = 1.0 / base ** (np.arange(0, dims, 2) / dims)
    freqs = np.outer(pos, inv_freq)  # (T, dims/2)
    emb = np.concatenate([freqs, freqs], axis=-1)  # (T, dims)
    r = x[..., :dims]
    x1, x2 = r[..., : dims // 2], r[..., dims // 2 :]
    rotated = np.concatenate([-x2, x1], axis=-1)
    out: Array = np.concatenate([r * np.cos(emb) + rotated * np.sin(emb), x[..., dims:]], -1)
    return out


def rope_interleaved(x: Array, pos: Array, base: float, dims: int) -> Array:
    """Meta's llama: pairs (2i, 2i+1) as complex numbers, times e^(i·angle)."""
    inv_freq = 1.0 / base ** (np.arange(0, dims, 2) / dims)
    turn = np.exp(1j * np.outer(pos, inv_freq))  # (T, dims/2)
    c = (x[..., 0:dims:2] + 1j * x[..., 1:dims:2]) * turn
    out: Array = x.copy()
    out[..., 0:dims:2], out[..., 1:dims:2] = c.real, c.imag
    return out


def alibi_slopes(n: int) -> list[float]:
    """Press et al. for a power of two: 2^(-8/n), its square, ... (n slopes)."""
    assert n & (n - 1) == 0
    start = 2 ** (-8 / n)
    return [start ** (i + 1) for i in range(n)]


def student(fx: dict[str, Any], mistake: str | None = None) -> dict[str, Array]:
    """Attention with the fixture's variants, no batch axis; every stage by name."""
    st: dict[str, Array] = {}
    H = fx.get("heads", 1)
    Hkv = fx.get("kv_heads", H)

    def A(name: str) -> Array:
        return np.asarray(fx[name], dtype=np.float64)

    if "X" in fx:
        X = A("X")
        X_kv = A("X_kv") if "X_kv" in fx else X

        def proj(x: Array, n: str) -> Array:
            W = A(f"W_{n}").T if mistake == "x_w_transposed" else A(f"W_{n}")
            return x @ W + (A(f"b_{n}") if f"b_{n}" in fx else 0.0)

        if mistake == "gate_whole_chunk":  # q_proj's checkpoint layout, then .chunk(2, -1)
            W_Q, W_G = A("W_Q"), np.asarray(fx["gate"]["W_G"], dtype=np.float64)
            rows = len(W_Q)
            q_proj = np.concatenate([W_Q.reshape(rows, H, -1), W_G.reshape(rows, H, -1)], 2)
            q_proj = q_proj.reshape(rows, -1)  # per head: the query's columns, the gate's
            fx = {
                **fx,
                "W_Q": q_proj[:, : W_Q.shape[1]],
                "gate": {**fx["gate"], "W_G": q_proj[:, W_Q.shape[1] :]},
            }

        flat = proj(X, "Q"), proj(X_kv, "K"), proj(X_kv, "V")
        d_model = X.shape[1]
    else:
        flat = A("Q"), A("K"), A("V")
        d_model = flat[0].shape[1]
    T, S = len(flat[0]), len(flat[1])
    q, k, v = (
        f.reshape(len(f), n, -1).transpose(1, 0, 2)
        for f, n in zip(flat, (H, Hkv, Hkv), strict=True)
    )
    st.update(Q=q, K=k, V=v)  # (heads, seq, d)
    d = q.shape[-1]
    if "qk_norm" in fx:
        norm = fx["qk_norm"]

        def rms(x: Array, w: Any) -> Array:
            out: Array = x / np.sqrt((x * x).mean(-1, keepdims=True) + norm["eps"]) * w
            return out

        q = st["Q_norm"] = rms(q, np.asarray(norm["q_weight"]))
        k = st["K_norm"] = rms(k, np.asarray(norm["k_weight"]))
    causal = fx.get("causal", False)
    pos_k = np.asarray(fx.get("key_positions", np.arange(S)))
    pos_q = np.asarray(
        fx.get("positions", np.arange(T) + (S - T if causal == "lower-right" else 0))
    )
    if mistake == "positions_all_ahead":
        pos_q = pos_q + 1  # one positions array, one off, read by everything
    if fx.get("rope"):
        cfg = {} if fx["rope"] is True else fx["rope"]
        base, dims = cfg.get("base", 10000.0), cfg.get("dims", d)
        layout = cfg.get("layout", "half")
        if mistake == "rope_layout":
            layout = "interleaved" if layout == "half" else "half"
        rotate = rope_half if layout == "half" else rope_interleaved
        rq, rk = pos_q, pos_k
        if mistake == "rope_1based":
            rq, rk = pos_q + 1, pos_k + 1
        if mistake == "rope_query_ahead":
            rq = pos_q + 1
        q = st["Q_rot"] = rotate(q, rq, base, dims)
        k = st["K_rot"] = k if mistake == "rope_not_on_k" else rotate(k, rk, base, dims)
        if mistake == "rope_on_v":
            v = st["V"] = rotate(v, pos_k, base, dims)
    kv = [h % Hkv if mistake == "gqa_tiled" else h // (H // Hkv) for h in range(H)]
    if mistake == "scores_transposed":
        scores = np.stack([k[kv[h]] @ q[h].T for h in range(H)])
    else:
        scores = np.stack([q[h] @ k[kv[h]].T for h in range(H)])  # (H, T, S)
    width = {"scaled_by_d_model": d_model, "no_scaling": 1}.get(mistake or "", d)
    scale = fx.get("scale", 1 / math.sqrt(width))
    st["scores"], st["scaled"] = scores, scores * scale
    logits = st["scaled"]
    cap = fx.get("softcap")
    if cap and mistake != "softcap_after_mask":
        logits = st["capped"] = cap * np.tanh(logits / cap)
    if fx.get("alibi"):
        slopes = alibi_slopes(H) if fx["alibi"] is True else fx["alibi"]["slopes"]
        aq = pos_q + 1 if mistake == "alibi_query_ahead" else pos_q
        sign = 1 if mistake == "alibi_sign" else -1
        dist = np.abs(aq[:, None] - pos_k[None, :])  # (T, S)
        st["alibi"] = np.stack([sign * m * dist for m in slopes])
        logits = logits + st["alibi"]
    if causal or fx.get("alibi"):
        ok = np.ones((T, S), dtype=bool)
        behind = pos_q[:, None] - pos_k[None, :]  # (T, S)
        window = fx.get("window")
        if causal and mistake == "causal_triu":
            diagonal = S - T if causal == "lower-right" else 0
            ok = np.triu(np.ones((T, S), dtype=bool), k=diagonal)  # keys j >= i
            if window:
                ok &= -behind < window
        elif causal:
            ok = behind >= (-1 if mistake == "causal_shifted" else 0)
            if window:
                ok &= behind <= window if mistake == "window_off_by_one" else behind < window
        logits = st["masked"] = np.where(ok, logits, float(fx.get("mask_value", -np.inf)))
    if cap and mistake == "softcap_after_mask":
        logits = st["capped"] = cap * np.tanh(logits / cap)
    sinks = None if mistake == "sinks_left_out" else fx.get("sinks")
    weights = np.zeros_like(logits)
    for h in range(H):
        sink = -np.inf if sinks is None else sinks[h]
        for i in range(T):
            top = max(logits[h, i].max(), sink)
            if top == -np.inf:
                continue  # nothing to attend to: zeros
            e = np.exp(logits[h, i] - top)
            weights[h, i] = e / (e.sum() + math.exp(sink - top))
    st["softmax"] = weights
    out = st["output"] = np.stack([weights[h] @ v[kv[h]] for h in range(H)])  # (H, T, d_v)
    sigma = None
    if "gate" in fx:  # Qwen3-Next: output * sigmoid(X·W_G + b_G), per head, before W_O
        G = fx["gate"]
        flat_gate = A("X") @ np.asarray(G["W_G"]) + np.asarray(G.get("b_G", 0.0))  # (T, H*d_v)
        st["gate"] = flat_gate.reshape(T, H, -1).transpose(1, 0, 2)  # (H, T, d_v)
        sigma = 1 / (1 + np.exp(-flat_gate))
        if mistake == "gate_without_sigmoid":
            out = out * st["gate"]
        elif mistake == "gate_complement":
            out = out * (1 - 1 / (1 + np.exp(-st["gate"])))
        elif mistake != "gate_after_w_o":
            out = out / (1 + np.exp(-st["gate"]))
        st["gated"] = out
    if H > 1 or "W_O" in fx:
        st["concat"] = out.transpose(1, 0, 2).reshape(T, -1)
    if "W_O" in fx:
        W_O = A("W_O").T if mistake == "x_w_transposed" else A("W_O")
        st["projected"] = st["concat"] @ W_O + (A("b_O") if "b_O" in fx else 0.0)
        if mistake == "gate_after_w_o":
            assert sigma is not None
            st["projected"] = st["projected"] * sigma
    return st


# ---------------------------------------------------------------------------------------------
# Dumping and grading, as a user would


def graded(
    tmp_path: Path, fixture: str | dict[str, Any], dump: dict[str, Any], suffix: str = ".npz"
) -> Comparison:
    """Write ``dump`` (and the fixture, if a mapping) and grade it as ``attn check`` does."""
    if isinstance(fixture, dict):
        path = tmp_path / "fixture.json"
        path.write_text(json.dumps(fixture))
        fixture = str(path)
    dump_path = tmp_path / f"dump{suffix}"
    if suffix == ".npz":
        np.savez(dump_path, **dump)
    else:
        dump_path.write_text(json.dumps({k: np.asarray(v).tolist() for k, v in dump.items()}))
    return grade(trace_file(fixture), load_dump(dump_path))


def names(comparison: Comparison) -> list[str]:
    return [d.name for d in comparison.diagnoses]


def pick(stages: dict[str, Array], *wanted: str) -> dict[str, Any]:
    return {n: stages[n] for n in wanted if n in stages}


OUT = ("scores", "scaled", "capped", "alibi", "masked", "softmax", "output")


def alibi_fixture(seed: int = 3, **extra: Any) -> dict[str, Any]:
    return random_fixture(
        seed, seq=5, heads=4, kv_heads=2, d_k=2, d_model=4, causal=True, alibi=True, **extra
    )


def square_fixture(seed: int = 5) -> dict[str, Any]:
    """Every weight square (d_model = heads·d_k = heads·d_v = d_out): X @ W.T runs."""
    return random_fixture(seed, seq=4, heads=2, d_k=2, d_model=4, W_O=True, d_out=4, causal=True)


# (fixture, planted mistake, stages dumped, diagnosis, first differing stage)
CASES = [
    ("llama_rope_gqa", "rope_layout", ("Q", "K", "Q_rot", "K_rot", *OUT), "rope_layout", "Q_rot"),
    ("llama_rope_interleaved", "rope_layout", ("softmax", "output"), "rope_layout", "softmax"),
    ("mistral_sliding_window", "rope_layout", ("scores", "output"), "rope_layout", "scores"),
    ("llama_rope_gqa", "rope_on_v", ("V", "scores", "softmax", "output"), "rope_on_v", "V"),
    ("qwen3_qk_norm", "rope_on_v", ("softmax", "output"), "rope_on_v", "output"),
    ("mistral_sliding_window", "rope_not_on_k", ("Q_rot", "K_rot", *OUT), "rope_not_on_k", "K_rot"),
    ("qwen3_qk_norm", "rope_not_on_k", ("scores", "softmax"), "rope_not_on_k", "scores"),
    ("llama_rope_gqa", "rope_1based", ("Q_rot", "K_rot", *OUT), "positions_off_by_one", "Q_rot"),
    ("qwen3_qk_norm", "rope_query_ahead", OUT, "positions_off_by_one", "scores"),
    ("gptoss_sinks", "positions_all_ahead", OUT, "positions_off_by_one", "scores"),
    ("mistral_sliding_window", "window_off_by_one", OUT, "window_off_by_one", "masked"),
    ("gptoss_sinks", "window_off_by_one", ("masked", "softmax"), "window_off_by_one", "masked"),
    ("gemma2_softcap", "softcap_after_mask", OUT, "softcap_after_mask", "capped"),
    (
        "gemma2_softcap",
        "softcap_after_mask",
        ("masked", "softmax", "output"),
        "softcap_after_mask",
        "masked",
    ),
    (
        "gemma2_softcap",
        "softcap_after_mask",
        ("softmax", "output"),
        "softcap_after_mask",
        "softmax",
    ),
    ("llama_rope_gqa", "gqa_tiled", ("scores", "softmax", "output"), "gqa_tiled", "scores"),
    ("qwen3_qk_norm", "gqa_tiled", ("softmax", "output"), "gqa_tiled", "softmax"),
    ("gptoss_sinks", "gqa_tiled", ("output",), "gqa_tiled", "output"),
    ("mistral_sliding_window", "causal_triu", OUT, "causal_triu", "masked"),
    ("llama_rope_gqa", "causal_triu", ("softmax", "output"), "causal_triu", "softmax"),
    ("gptoss_sinks", "scaled_by_d_model", OUT, "scaled_by_d_model", "scaled"),
    (
        "cross_attention",
        "scaled_by_d_model",
        ("softmax", "projected"),
        "scaled_by_d_model",
        "softmax",
    ),
    (
        "gptoss_sinks",
        "sinks_left_out",
        ("masked", "softmax", "output"),
        "sinks_left_out",
        "softmax",
    ),
    # the classic mistakes, on the variants' fixtures
    ("gptoss_sinks", "no_scaling", OUT, "no_scaling", "scaled"),
    ("gemma2_softcap", "no_scaling", ("softmax",), "no_scaling", "softmax"),
    ("mistral_sliding_window", "causal_shifted", OUT, "causal_shifted", "masked"),
    ("qwen3_qk_norm", "scores_transposed", ("scores", "softmax"), "scores_transposed", "scores"),
    # Qwen3-Next's output gate
    (
        "qwen3_next_gate",
        "gate_after_w_o",
        ("output", "gated", "concat", "projected"),
        "gate_after_w_o",
        "gated",
    ),
    ("qwen3_next_gate", "gate_after_w_o", ("projected",), "gate_after_w_o", "projected"),
    (
        "qwen3_next_gate",
        "gate_without_sigmoid",
        ("gate", "gated", "projected"),
        "gate_without_sigmoid",
        "gated",
    ),
    ("qwen3_next_gate", "gate_without_sigmoid", ("concat",), "gate_without_sigmoid", "concat"),
    (
        "qwen3_next_gate",
        "gate_complement",
        ("gate", "gated", "projected"),
        "gate_complement",
        "gated",
    ),
    ("qwen3_next_gate", "gate_complement", ("projected",), "gate_complement", "projected"),
    (
        "qwen3_next_gate",
        "gate_whole_chunk",
        ("Q", "gate", "gated", "projected"),
        "gate_whole_chunk",
        "Q",
    ),
    (
        "qwen3_next_gate",
        "gate_whole_chunk",
        ("softmax", "projected"),
        "gate_whole_chunk",
        "softmax",
    ),
    ("qwen3_next_gate", "rope_not_on_k", ("softmax", "gated"), "rope_not_on_k", "softmax"),
    ("qwen3_next_gate", "rope_not_on_k", ("gated", "projected"), "rope_not_on_k", "gated"),
]


@pytest.mark.parametrize(
    ("fixture", "mistake", "dumped", "diagnosis", "first"),
    CASES,
    ids=[f"{c[1]}-{c[0]}-{c[4]}" for c in CASES],
)
def test_a_planted_mistake_is_diagnosed_by_name_and_by_nothing_else(
    tmp_path: Path, fixture: str, mistake: str, dumped: tuple[str, ...], diagnosis: str, first: str
) -> None:
    dump = pick(student(bundled(fixture), mistake), *dumped)
    comparison = graded(tmp_path, fixture, dump)
    assert comparison.first_difference is not None
    assert comparison.first_difference.name == first
    assert names(comparison) == [diagnosis]


RANDOM_CASES = [
    ("alibi_sign", alibi_fixture(), ("alibi", "masked", "softmax"), "alibi_sign", "alibi"),
    ("alibi_sign", alibi_fixture(), ("softmax", "output"), "alibi_sign", "softmax"),
    ("alibi_query_ahead", alibi_fixture(), ("alibi", "softmax"), "positions_off_by_one", "alibi"),
    (
        "positions_all_ahead",
        alibi_fixture(4, window=3),
        ("alibi", "masked", "softmax"),
        "positions_off_by_one",
        "alibi",
    ),
    (
        "window_off_by_one",
        alibi_fixture(5, window=2),
        ("masked", "softmax"),
        "window_off_by_one",
        "masked",
    ),
    ("gqa_tiled", alibi_fixture(6), ("softmax", "output"), "gqa_tiled", "softmax"),
    (
        "causal_triu",
        random_fixture(7, seq=4, causal=True),
        ("scores", "masked", "softmax"),
        "causal_triu",
        "masked",
    ),
    (
        "causal_triu",
        random_fixture(8, seq=3, seq_k=5, mode="direct", causal="lower-right"),
        ("softmax", "output"),
        "causal_triu",
        "softmax",
    ),
    (
        "scaled_by_d_model",
        random_fixture(9, seq=3, d_k=2, d_model=5),
        ("scaled", "softmax"),
        "scaled_by_d_model",
        "scaled",
    ),
    (
        "scaled_by_d_model",
        random_fixture(10, mode="direct", heads=2, d_k=3, seq=3),
        ("softmax", "output"),
        "scaled_by_d_model",
        "softmax",
    ),
    (
        "x_w_transposed",
        square_fixture(),
        ("Q", "K", "V", "softmax", "projected"),
        "x_w_transposed",
        "Q",
    ),
    (
        "x_w_transposed",
        square_fixture(11),
        ("softmax", "output", "projected"),
        "x_w_transposed",
        "softmax",
    ),
    (
        "rope_layout",
        random_fixture(12, seq=4, d_k=4, heads=2, rope={"dims": 4}, causal=True),
        ("scores", "softmax"),
        "rope_layout",
        "scores",
    ),
    (
        "rope_layout",
        random_fixture(13, seq=4, d_k=6, rope={"dims": 4, "layout": "interleaved"}),
        ("Q_rot", "softmax"),
        "rope_layout",
        "Q_rot",
    ),
    (
        "sinks_left_out",
        random_fixture(14, seq=4, heads=2, sinks=True, causal=True),
        ("softmax", "output"),
        "sinks_left_out",
        "softmax",
    ),
]


@pytest.mark.parametrize(
    ("mistake", "fixture", "dumped", "diagnosis", "first"),
    RANDOM_CASES,
    ids=[f"{c[0]}-{i}" for i, c in enumerate(RANDOM_CASES)],
)
def test_a_planted_mistake_in_a_small_random_fixture(
    tmp_path: Path,
    mistake: str,
    fixture: dict[str, Any],
    dumped: tuple[str, ...],
    diagnosis: str,
    first: str,
) -> None:
    dump = pick(student(fixture, mistake), *dumped)
    comparison = graded(tmp_path, fixture, dump, ".json")
    assert comparison.first_difference is not None
    assert comparison.first_difference.name == first
    assert names(comparison) == [diagnosis]


def test_rope_positions_counted_from_one_leave_the_scores_unchanged(tmp_path: Path) -> None:
    # RoPE scores depend only on the distance: only Q_rot and K_rot show the shift
    dump = pick(student(bundled("llama_rope_gqa"), "rope_1based"), "Q_rot", "K_rot", *OUT)
    comparison = graded(tmp_path, "llama_rope_gqa", dump)
    assert [s.name for s in comparison.differing] == ["Q_rot", "K_rot"]
    assert comparison.diagnoses[0].explains == ("K_rot",)
    assert "counted from 1" in comparison.diagnoses[0].detail


def test_the_detail_explains_the_window_convention(tmp_path: Path) -> None:
    dump = pick(student(bundled("mistral_sliding_window"), "window_off_by_one"), *OUT)
    (found,) = graded(tmp_path, "mistral_sliding_window", dump).diagnoses
    assert "window of 4 keys (0 <= pos_q - pos_k <= 3) instead of 3" in found.detail
    assert "window_size=(2, 0)" in found.detail
    assert found.explains == ("softmax", "output")


def test_softcap_after_the_mask_gives_hidden_keys_weight(tmp_path: Path) -> None:
    stages = student(bundled("gemma2_softcap"), "softcap_after_mask")
    assert (stages["softmax"] > 0).all()  # -5 instead of -inf: every key gets some weight
    (found,) = graded(tmp_path, "gemma2_softcap", pick(stages, *OUT)).diagnoses
    assert "5·tanh(-inf/5) = -5" in found.detail


def test_sinks_left_out_make_rows_sum_to_one(tmp_path: Path) -> None:
    stages = student(bundled("gptoss_sinks"), "sinks_left_out")
    np.testing.assert_allclose(stages["softmax"].sum(-1), 1.0, rtol=1e-12)
    result = run_cli_check(tmp_path, "gptoss_sinks", pick(stages, "softmax", "output"))
    assert result.exit_code == 1
    assert "diagnosis: sinks left out of the softmax (rows sum to 1)" in result.stdout


def run_cli_check(tmp_path: Path, fixture: str, dump: dict[str, Any]) -> Any:
    path = tmp_path / "dump.npz"
    np.savez(path, **dump)
    return run_cli("check", fixture, "--against", str(path), "--format", "plain")


@pytest.mark.parametrize(
    ("mistake", "title"),
    [
        ("gate_after_w_o", "gate applied after W_O instead of before"),
        ("gate_without_sigmoid", "gate multiplied in without the sigmoid"),
    ],
)
def test_attn_check_names_the_gate_mistakes(tmp_path: Path, mistake: str, title: str) -> None:
    stages = student(bundled("qwen3_next_gate"), mistake)
    result = run_cli_check(tmp_path, "qwen3_next_gate", pick(stages, "projected"))
    assert result.exit_code == 1, result.output
    assert f"diagnosis: {title}" in " ".join(result.stdout.split())
    as_json = run_cli(
        "check", "qwen3_next_gate", "--against", str(tmp_path / "dump.npz"), "--format", "json"
    )
    found = json.loads(as_json.stdout)["fixtures"][0]["diagnoses"]
    assert [d["name"] for d in found] == [mistake]


def test_gqa_tiled_names_both_head_maps(tmp_path: Path) -> None:
    dump = pick(student(bundled("llama_rope_gqa"), "gqa_tiled"), "softmax", "output")
    result = run_cli_check(tmp_path, "llama_rope_gqa", dump)
    assert result.exit_code == 1
    text = " ".join(result.stdout.split())
    assert "diagnosis: GQA heads tiled [0,1,0,1] instead of grouped [0,0,1,1]" in text
    assert "([0, 1, 0, 1]," in text and "([0, 0, 1, 1]," in text


# ---------------------------------------------------------------------------------------------
# Nothing is claimed that the numbers do not confirm


@pytest.mark.parametrize("name", VARIANT_FIXTURES)
def test_a_correct_dump_of_each_variant_fixture_gets_no_diagnosis(
    tmp_path: Path, name: str
) -> None:
    stages = reference(bundled(name))  # the loop reference, independent of attn's pipeline
    comparison = graded(tmp_path, name, stages)
    assert comparison.same, [s.name for s in comparison.differing]
    assert comparison.diagnoses == ()


@pytest.mark.parametrize("name", [n for n in VARIANT_FIXTURES if n != "mask_sentinel"])
def test_the_students_code_without_a_mistake_is_the_loop_reference(name: str) -> None:
    fx = bundled(name)
    expected = reference(fx)
    for stage, value in student(fx).items():
        np.testing.assert_allclose(value, expected[stage], **TOL, err_msg=f"{name} {stage}")


def test_two_mistakes_at_once_are_not_diagnosed_as_one(tmp_path: Path) -> None:
    # sinks left out and the window off by one: neither alone reproduces the softmax
    fx = bundled("gptoss_sinks")
    wrong = student(fx, "window_off_by_one")
    wrong_too = student(fx, "sinks_left_out")
    mixed = {"softmax": wrong["softmax"] * 0.5 + wrong_too["softmax"] * 0.5}
    comparison = graded(tmp_path, "gptoss_sinks", mixed)
    assert comparison.first_difference is not None
    assert comparison.diagnoses == ()
    assert comparison.looks  # but a hint: where the two differ, or what the rows sum to


def test_an_unrecognised_difference_on_a_variant_fixture_is_reported_plainly(
    tmp_path: Path,
) -> None:
    stages = student(bundled("qwen3_qk_norm"))
    stages["output"] = stages["output"] + 0.1
    comparison = graded(tmp_path, "qwen3_qk_norm", pick(stages, "softmax", "output"))
    assert comparison.first_difference is not None
    assert comparison.first_difference.name == "output"
    assert comparison.diagnoses == ()
    assert "RoPE applied to V as well" in comparison.tried
    assert comparison.looks == (
        "every cell of your output is attn's + 0.1: a bias or a constant "
        "added (or subtracted) where it was not meant?",
    )


# ---------------------------------------------------------------------------------------------
# A mistake that does not apply to a fixture is not tried there


NOT_APPLICABLE = [
    ("gemma2_softcap", ("rope_layout", "rope_on_v", "rope_not_on_k", "alibi_sign")),
    ("llama_rope_gqa", ("window_off_by_one", "softcap_after_mask", "sinks_left_out")),
    ("mistral_sliding_window", ("gqa_tiled", "alibi_sign")),
    ("cross_attention", ("causal_triu", "positions_off_by_one", "gqa_tiled")),
    ("mask_sentinel", ("x_w_transposed", "scaled_by_d_model", "rope_layout")),
    ("qwen3_qk_norm", ("x_w_transposed",)),  # W_K, W_V are square, W_Q is not
]


@pytest.mark.parametrize(("fixture", "mistakes"), NOT_APPLICABLE)
def test_a_mistake_that_does_not_apply_has_no_candidates(
    fixture: str, mistakes: tuple[str, ...]
) -> None:
    trace = trace_file(fixture)
    by_name = {m.name: m for m in MISTAKES}
    for name in mistakes:
        assert by_name[name].candidates(trace) == [], name


def test_positions_alone_with_a_window_are_the_window_mistake() -> None:
    # no RoPE, no ALiBi: a window reading positions one off is a window of one more or less
    trace = trace_file("gemma2_softcap")
    assert {m.name: m for m in MISTAKES}["positions_off_by_one"].candidates(trace) == []


# ---------------------------------------------------------------------------------------------
# The recomputation follows the pipeline


@pytest.mark.parametrize("name", [*VARIANT_FIXTURES, "causal_multihead", "padding_batch"])
def test_recomputing_from_any_stage_without_a_mistake_gives_the_trace(name: str) -> None:
    trace: Trace = trace_file(name)
    order = [n for n in STAGE_NAMES if n in trace.applicable]
    for start in order:
        for stage, value in downstream(trace, start, {}).items():
            got = value if trace.inputs.has_batch else value[0]
            np.testing.assert_allclose(got, trace[stage].data, **TOL, err_msg=f"{start}->{stage}")


@pytest.mark.parametrize("name", [*VARIANT_FIXTURES, "causal_multihead", "padding_batch"])
def test_the_graders_mask_without_a_mistake_is_the_pipelines(name: str) -> None:
    inputs = trace_file(name).inputs
    expected = allowed_positions(inputs)
    shape = (inputs.batch, inputs.heads, inputs.seq_q, inputs.seq_k)
    want = np.ones(shape, bool) if expected is None else np.broadcast_to(expected, shape)
    np.testing.assert_array_equal(allowed(inputs), want)


def test_when_one_key_more_is_every_key_both_window_mistakes_are_claimed(tmp_path: Path) -> None:
    # gemma2_softcap: 5 tokens, window 4; a window of 5 hides nothing, as no window at all
    dump = pick(student(bundled("gemma2_softcap"), "window_off_by_one"), "softmax", "output")
    comparison = graded(tmp_path, "gemma2_softcap", dump)
    assert comparison.first_difference is not None
    assert comparison.first_difference.name == "softmax"
    assert names(comparison) == ["window_off_by_one", "window_ignored"]


def test_when_d_model_is_d_k_squared_both_scalings_are_claimed(tmp_path: Path) -> None:
    # 1/√d_model = 1/√4 = 1/2 = 1/d_k: the numbers cannot tell the two mistakes apart
    fx = random_fixture(15, seq=3, d_k=2, d_model=4)
    comparison = graded(tmp_path, fx, pick(student(fx, "scaled_by_d_model"), "scaled"))
    assert names(comparison) == ["scaled_by_d_k", "scaled_by_d_model"]
