"""A checkpoint family defined outside the package (issue 37): a llama-like model_type of its own,
``tinyllm``, with a config key of its own (``tiny_qkv_bias`` turns on q/k/v biases), registered
from this test the way tests/test_variant_plugin.py registers a variant, imports through ``attn
import`` with no edit to the package; its numbers are checked against a loop written here."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli

from attn_cli.core.pipeline import run
from attn_cli.io.families import Family, registered
from attn_cli.io.families.blocks import Block
from attn_cli.io.families.decoder import family
from attn_cli.io.families.models import llama
from attn_cli.io.fixture import load_fixture

pytest.importorskip("safetensors", reason="attn import needs safetensors: pip install '.[models]'")

C, H, HKV, D, LAYERS, VOCAB = 16, 4, 2, 4, 2, 32
EPS, THETA = 1e-5, 5e5

# The family: Llama's table with two differences, and Llama's keys with the one of its own.
TINY: Family = family(
    "tinyllm",
    replace(llama.ARCH, qkv_bias="tiny_qkv_bias", o_bias=False, theta=THETA),
    replace(llama.KEYS, reads=llama.KEYS.reads | {"tiny_qkv_bias"}),
    Block(),
    hf_class="(this test's)",
    shows="q/k/v biases turned on by tiny_qkv_bias",
)


@pytest.fixture
def tiny() -> Iterator[Family]:
    with registered(TINY) as f:
        yield f


def _checkpoint(folder: Path) -> dict[str, np.ndarray]:
    """A tiny random tinyllm checkpoint (config.json + model.safetensors) in ``folder``."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(37)

    def r(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.5

    t = {"model.embed_tokens.weight": r(VOCAB, C), "model.norm.weight": 1 + r(C)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t |= {
            p + "input_layernorm.weight": 1 + r(C),
            p + "self_attn.q_proj.weight": r(H * D, C),
            p + "self_attn.q_proj.bias": r(H * D),
            p + "self_attn.k_proj.weight": r(HKV * D, C),
            p + "self_attn.k_proj.bias": r(HKV * D),
            p + "self_attn.v_proj.weight": r(HKV * D, C),
            p + "self_attn.v_proj.bias": r(HKV * D),
            p + "self_attn.o_proj.weight": r(C, H * D),
            p + "post_attention_layernorm.weight": 1 + r(C),
            p + "mlp.gate_proj.weight": r(24, C),
            p + "mlp.up_proj.weight": r(24, C),
            p + "mlp.down_proj.weight": r(C, 24),
        }
    folder.mkdir()
    save_file(t, str(folder / "model.safetensors"))
    config = {
        "model_type": "tinyllm",
        "hidden_size": C,
        "num_attention_heads": H,
        "num_key_value_heads": HKV,
        "num_hidden_layers": LAYERS,
        "intermediate_size": 24,
        "vocab_size": VOCAB,
        "rms_norm_eps": EPS,
        "rope_theta": THETA,
        "tiny_qkv_bias": True,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return t


def _reference(t: dict[str, np.ndarray], layer: int, h: np.ndarray) -> dict[str, np.ndarray]:
    """The layer's attention weights and output projection, one number at a time."""
    p = f"model.layers.{layer}."
    w = {k[len(p) :]: v.astype(np.float64) for k, v in t.items() if k.startswith(p)}
    T = len(h)
    x = np.array([row / math.sqrt(sum(v * v for v in row) / C + EPS) for row in h])
    x = x * w["input_layernorm.weight"]

    def project(name: str, heads: int) -> np.ndarray:
        y: np.ndarray = x @ w[f"self_attn.{name}.weight"].T + w[f"self_attn.{name}.bias"]
        return y.reshape(T, heads, D)

    q, k, v = project("q_proj", H), project("k_proj", HKV), project("v_proj", HKV)

    def rotate(a: np.ndarray) -> np.ndarray:  # rotate_half: pair (i, i + D/2)
        out: np.ndarray = a.copy()
        for pos in range(T):
            for i in range(D // 2):
                angle = pos * THETA ** (-2 * i / D)
                c, s = math.cos(angle), math.sin(angle)
                x1, x2 = a[pos, :, i], a[pos, :, i + D // 2]
                out[pos, :, i], out[pos, :, i + D // 2] = x1 * c - x2 * s, x2 * c + x1 * s
        return out

    q, k = rotate(q), rotate(k)
    weights = np.zeros((H, T, T))
    heads = np.zeros((T, H, D))
    for hh in range(H):
        g = hh // (H // HKV)  # the head's key/value head
        for i in range(T):
            scores = [float(q[i, hh] @ k[j, g]) / math.sqrt(D) for j in range(i + 1)]
            top = max(scores)
            e = [math.exp(s - top) for s in scores]
            for j in range(i + 1):
                weights[hh, i, j] = e[j] / sum(e)
                heads[i, hh] += weights[hh, i, j] * v[j, g]
    return {
        "softmax": weights,
        "projected": heads.reshape(T, H * D) @ w["self_attn.o_proj.weight"].T,
    }


@pytest.mark.parametrize("layer", [0, 1])
def test_a_family_defined_here_imports_and_matches_a_loop(
    tiny: Family, layer: int, tmp_path: Path
) -> None:
    t = _checkpoint(tmp_path / "tiny")
    h = np.random.default_rng(layer).standard_normal((5, C))
    np.save(tmp_path / "h.npy", h)
    out = tmp_path / "l.npz"
    args = ("--layer", str(layer), "--hidden", str(tmp_path / "h.npy"), "-o", str(out))
    result = run_cli("import", str(tmp_path / "tiny"), *args)
    assert result.exit_code == 0, result.stderr
    assert "(tinyllm, layer" in result.stderr + result.stdout
    trace: Any = run(load_fixture(out))
    expected = _reference(t, layer, h)
    for stage in ("softmax", "projected"):
        actual = np.asarray(trace[stage].data).reshape(expected[stage].shape)
        np.testing.assert_allclose(actual, expected[stage], rtol=1e-5, atol=1e-6)


def test_its_own_key_is_unknown_to_llama(tmp_path: Path) -> None:
    """Read as llama, the family's key is refused in one line (llama does not know it)."""
    _checkpoint(tmp_path / "tiny")
    np.save(tmp_path / "h.npy", np.ones((2, C)))
    hidden = ("--hidden", str(tmp_path / "h.npy"), "-o", str(tmp_path / "x.npz"))
    result = run_cli("import", str(tmp_path / "tiny"), "--arch", "llama", *hidden)
    assert result.exit_code == 2, result.stdout
    assert "tiny_qkv_bias: got true: a key attn's llama import does not know" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_unregistered_it_is_refused(tmp_path: Path) -> None:
    """Once the test's family is forgotten, its model_type is refused as any unknown one."""
    _checkpoint(tmp_path / "tiny")
    np.save(tmp_path / "h.npy", np.ones((2, C)))
    hidden = ("--hidden", str(tmp_path / "h.npy"), "-o", str(tmp_path / "x.npz"))
    result = run_cli("import", str(tmp_path / "tiny"), *hidden)
    assert result.exit_code == 2, result.stdout
    assert "model type 'tinyllm' is not supported" in result.stderr


def test_docs_list_every_registered_family() -> None:
    """docs/families.md's registry table has a row per family: its module, transformers class
    and own inert keys, as the family's module has them."""
    from attn_cli.io.families import REGISTRY

    doc = (Path(__file__).parents[2] / "docs" / "families.md").read_text()
    for name, f in REGISTRY.items():
        inert = ", ".join(f"`{k}`" for k in sorted(f.keys.inert)) or "—"
        row = next(
            (line for line in doc.splitlines() if line.startswith(f"| `{name}` | `models/")), ""
        )
        assert f"| `{f.hf_class}` | {f.shows} | {inert} |" in row, name
