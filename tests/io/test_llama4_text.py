"""Llama 4 text (llama4_text): its tiny checkpoint saved by transformers 5.25
(tests/reference/forward_2026/llama4_text) walked from its text to the logits; each of its
conventions left out misses transformers' logits; its router and mixture against loop references
written here; hostile values of its keys refused in one line."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli

from attn_cli.io.families import experts
from attn_cli.io.families.experts import Llama4Mixture, route_sigmoid_top
from attn_cli.io.families.plan import MixtureReads, Tensor

CASE = Path(__file__).parents[1] / "reference" / "forward_2026" / "llama4_text"
REF: dict[str, Any] = json.loads((CASE / "reference.json").read_text())
RTOL, ATOL = 1e-4, 1e-5


def _folder(tmp_path: Path, changes: dict[str, Any]) -> Path:
    """A copy of the checkpoint whose config.json has ``changes`` (None: the key removed)."""
    folder = tmp_path / "llama4_text"
    shutil.copytree(CASE, folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _logits(folder: Path) -> Any:
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    from attn_cli.io.forward import walk

    w = walk(folder, REF["text"], through=None, logits=True)
    assert w.ids == REF["ids"]
    return w.logits


def _misses(logits: Any) -> bool:
    return not np.allclose(logits, REF["logits"], rtol=RTOL, atol=ATOL)


def test_the_logits_match_transformers() -> None:
    np.testing.assert_allclose(_logits(CASE), REF["logits"], rtol=RTOL, atol=ATOL)


# Llama4TextConfig's defaults, where config.json leaves a key out, give the same layers
DEFAULTS: dict[str, dict[str, Any]] = {
    "layer_types left out: chunked where the layer has RoPE": {"layer_types": None},
    "moe_layers left out: every interleave_moe_layer_step-th": {"moe_layers": None},
    "no_rope_layers left out: every no_rope_layer_interval-th": {"no_rope_layers": None},
}


@pytest.mark.parametrize("default", DEFAULTS)
def test_a_key_left_out_takes_transformers_default(default: str, tmp_path: Path) -> None:
    logits = _logits(_folder(tmp_path, DEFAULTS[default]))
    np.testing.assert_allclose(logits, REF["logits"], rtol=RTOL, atol=ATOL)


# each convention turned off in config.json: attn then computes another model, not this one
LEFT_OUT: dict[str, dict[str, Any]] = {
    "no chunks (every layer full)": {"layer_types": ["full_attention"] * 4},
    "no q/k L2 norm": {"use_qk_norm": False},
    "no temperature": {"attn_temperature_tuning": False},
    "RoPE on every layer": {"no_rope_layers": [1, 1, 1, 1]},
    "the MoE layers dense": {"moe_layers": []},
}


@pytest.mark.parametrize("left_out", LEFT_OUT)
def test_each_convention_left_out_misses_transformers(left_out: str, tmp_path: Path) -> None:
    pytest.importorskip("safetensors")  # attn import --text: the models extra
    pytest.importorskip("tokenizers")
    changes = LEFT_OUT[left_out]
    if left_out == "the MoE layers dense":  # the dense MLP's tensors are not there: refused
        result = _import(_folder(tmp_path, changes), tmp_path)
        assert result.exit_code == 2 and "feed_forward" in result.stderr
        return
    assert _misses(_logits(_folder(tmp_path, changes)))


def test_a_softmax_router_misses_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The weights as a softmax over the chosen logits (Mixtral's), not their sigmoid."""

    def softmax_top(logits: Any, k: int) -> Any:
        chosen = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
        top = np.take_along_axis(logits, chosen, axis=-1)
        e = np.exp(top - top.max(axis=-1, keepdims=True))
        return chosen, e / e.sum(axis=-1, keepdims=True)

    monkeypatch.setattr(experts, "route_sigmoid_top", softmax_top)
    assert _misses(_logits(CASE))


def test_the_router_is_the_top_k_logits_then_their_sigmoid() -> None:
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(6, 5)) * 3
    chosen, weights = route_sigmoid_top(logits, 2)
    for t in range(6):
        order = sorted(range(5), key=lambda e: -logits[t, e])[:2]
        assert list(chosen[t]) == order
        want = [1 / (1 + math.exp(-logits[t, e])) for e in order]
        np.testing.assert_allclose(weights[t], want, rtol=1e-15)


def _silu(x: float) -> float:
    return x / (1 + math.exp(-x))


def test_the_mixture_scales_each_chosen_expert_input() -> None:
    """Llama4TextMoe on random weights against a loop: Σ over the chosen experts of
    expert(sigmoid(logit) · h), plus the shared expert on h."""
    rng = np.random.default_rng(7)
    T, C, E, F, k = 5, 4, 3, 2, 2
    arrays = {
        "router": rng.normal(size=(E, C)),
        "gate_up": rng.normal(size=(E, C, 2 * F)),
        "down": rng.normal(size=(E, F, C)),
        "s.gate": rng.normal(size=(F, C)),
        "s.up": rng.normal(size=(F, C)),
        "s.down": rng.normal(size=(C, F)),
    }
    tensor = {role: Tensor(role, role, a.shape) for role, a in arrays.items()}
    shared = (tensor["s.gate"], tensor["s.up"], tensor["s.down"])
    mixture = Llama4Mixture(tensor["router"], tensor["gate_up"], tensor["down"], shared, k)
    h = rng.normal(size=(T, C)) * 2
    silu = np.vectorize(_silu)
    reads = MixtureReads(lambda t: arrays[t.role], lambda t, e: arrays[t.role][e], silu)
    got = mixture(h, reads)

    def expert(e: int, x: list[float]) -> list[float]:
        gu = [sum(x[c] * arrays["gate_up"][e][c][j] for c in range(C)) for j in range(2 * F)]
        mid = [gu[F + j] * _silu(gu[j]) for j in range(F)]  # up × silu(gate): first half gate
        return [sum(mid[j] * arrays["down"][e][j][c] for j in range(F)) for c in range(C)]

    want, unscaled = np.zeros((T, C)), np.zeros((T, C))
    for t in range(T):
        logit = [sum(h[t][c] * arrays["router"][e][c] for c in range(C)) for e in range(E)]
        for e in sorted(range(E), key=lambda e: -logit[e])[:k]:
            w = 1 / (1 + math.exp(-logit[e]))
            want[t] += expert(e, [w * v for v in h[t]])
            unscaled[t] += [w * v for v in expert(e, list(h[t]))]  # the weight on the output
        g = [sum(h[t][c] * arrays["s.gate"][f][c] for c in range(C)) for f in range(F)]
        u = [sum(h[t][c] * arrays["s.up"][f][c] for c in range(C)) for f in range(F)]
        s = [sum(_silu(g[f]) * u[f] * arrays["s.down"][c][f] for f in range(F)) for c in range(C)]
        want[t] += s
        unscaled[t] += s
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert not np.allclose(got, unscaled, rtol=1e-3)  # the two conventions differ here


def _import(folder: Path, tmp_path: Path) -> Any:
    out = tmp_path / "out.npz"
    return run_cli("import", str(folder), "--layer", "2", "--text", "a b c", "-o", str(out))


HOSTILE: dict[str, tuple[dict[str, Any], str]] = {
    "attention_chunk_size 0": ({"attention_chunk_size": 0}, "attention_chunk_size"),
    "attention_chunk_size negative": ({"attention_chunk_size": -4}, "attention_chunk_size"),
    "attention_chunk_size a string": ({"attention_chunk_size": "4"}, "attention_chunk_size"),
    "attention_chunk_size null beside chunked layers": (
        {"attention_chunk_size": "null"},
        "attention_chunk_size",
    ),
    "floor_scale 0": ({"floor_scale": 0}, "floor_scale"),
    "attn_scale NaN": ({"attn_scale": math.nan}, "attn_scale"),
    "attn_scale a string": ({"attn_scale": "0.1"}, "attn_scale"),
    "interleave_moe_layer_step 0": ({"interleave_moe_layer_step": 0}, "interleave_moe_layer_step"),
    "no_rope_layers too short": ({"no_rope_layers": [1, 1, 1]}, "no_rope_layers"),
    "no_rope_layers not 0 or 1": ({"no_rope_layers": [1, 1, 2, 0]}, "no_rope_layers"),
    "layer_types a sliding layer": (
        {"layer_types": ["sliding_attention"] + ["full_attention"] * 3},
        "layer_types",
    ),
    "moe_layers past the last layer": ({"moe_layers": [1, 4]}, "moe_layers"),
    "use_qk_norm not a bool": ({"use_qk_norm": "yes"}, "use_qk_norm"),
    "attn_temperature_tuning not a bool": (
        {"attn_temperature_tuning": 1},
        "attn_temperature_tuning",
    ),
}


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_hostile_key_is_refused_in_one_line(hostile: str, tmp_path: Path) -> None:
    changes, word = HOSTILE[hostile]
    changes = {k: (None if v == "null" else v) for k, v in changes.items()}
    folder = _folder(tmp_path, {})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    result = _import(folder, tmp_path)
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert word in lines[0]
    assert not (tmp_path / "out.npz").exists()


@pytest.mark.parametrize("layer", ["4", "9"])
def test_a_layer_past_the_last_is_refused_in_one_line(layer: str, tmp_path: Path) -> None:
    """no_rope_layers and layer_types are read at the layer only once it is checked."""
    out = tmp_path / "out.npz"
    result = run_cli("import", str(CASE), "--layer", layer, "--text", "a b", "-o", str(out))
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "num_hidden_layers" in lines[0], result.stderr
