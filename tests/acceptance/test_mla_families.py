"""Multi-head latent attention on a checkpoint transformers saved: tests/reference/families/
deepseek_v3 (a tiny DeepseekV3ForCausalLM, 2 layers, the second with a MoE MLP, saved and run by
tests/reference/families.py in a throwaway venv). Here, independently of attn import (which
tests/acceptance/test_families.py checks against the same numbers), the layer's tensors, read from
model.safetensors, are put on the mla key by hand as docs/fixture-format.md maps them, X is the
layer's input through its input_layernorm, and every layer's queries and keys (after RoPE),
attention weights and output projection must be transformers' own, at rtol 1e-4 (the model ran
in float32); attn import must write this very mapping."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("safetensors", reason="reading the checkpoint needs safetensors")
from reference import mla_from_torch
from safetensors.numpy import load_file

from attn_cli.core.pipeline import run
from attn_cli.io.validate import validate

CASE = Path(__file__).parent.parent / "reference" / "families" / "deepseek_v3"
CONFIG = json.loads((CASE / "config.json").read_text())
REF = json.loads((CASE / "reference.json").read_text())
TENSORS = load_file(str(CASE / "model.safetensors"))
LAYERS = [(r["kind"], i) for r in REF["runs"] for i in range(len(r["layers"]))]


def fixture(layer: int, layer_in: Any) -> dict[str, Any]:
    prefix = f"model.layers.{layer}."
    w = {
        k.removeprefix(prefix + "self_attn."): v.astype(np.float64)
        for k, v in TENSORS.items()
        if k.startswith(prefix + "self_attn.")
    }
    x = np.asarray(layer_in, dtype=np.float64)  # (T, hidden): the residual stream
    norm = TENSORS[prefix + "input_layernorm.weight"].astype(np.float64)
    X = norm * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + CONFIG["rms_norm_eps"])
    mla, W_O = mla_from_torch(
        w,
        CONFIG["num_attention_heads"],
        CONFIG["kv_lora_rank"],
        CONFIG["qk_nope_head_dim"],
        CONFIG["v_head_dim"],
    )
    mla["base"] = CONFIG["rope_parameters"]["rope_theta"]
    return {"X": X, "heads": CONFIG["num_attention_heads"], "causal": True, "mla": mla, "W_O": W_O}


@pytest.mark.parametrize(("kind", "layer"), LAYERS)
def test_every_layer_is_transformers_own(kind: str, layer: int) -> None:
    record = next(r for r in REF["runs"] if r["kind"] == kind)["layers"][layer]
    trace = run(validate(fixture(layer, record["layer_in"]), "deepseek_v3"))
    assert trace.scale == pytest.approx(record["scaling"], rel=1e-12)
    for stage, key in (("Q", "q"), ("K", "k"), ("softmax", "weights"), ("projected", "output")):
        np.testing.assert_allclose(
            trace[stage].data,
            record[key],
            rtol=1e-4,
            atol=1e-5,
            err_msg=f"{kind} layer {layer} {stage}",
        )
    for absorbed, naive in (("scores_absorbed", "scores"), ("output_absorbed", "output")):
        np.testing.assert_allclose(trace[absorbed].data, trace[naive].data, rtol=1e-9, atol=1e-9)


def test_the_checkpoint_is_what_the_case_says() -> None:
    assert REF["model_type"] == "deepseek_v3" and REF["transformers"] == "5.24.0"
    assert CONFIG["q_lora_rank"] and CONFIG["rope_interleave"] is True
    assert len(REF["runs"][0]["layers"]) == 2  # layer 1 has the MoE MLP
    assert any(".mlp.experts." in name for name in TENSORS)


@pytest.mark.parametrize("layer", range(CONFIG["num_hidden_layers"]))
def test_attn_import_writes_the_hand_mapping(tmp_path: Path, layer: int) -> None:
    """attn import's mla key and W_O are this file's mapping, array for array, and its X the
    layer's input through input_layernorm (the import is checked against transformers itself
    in tests/acceptance/test_families.py)."""
    from conftest import run_cli

    from attn_cli.io.fixture import load_fixture

    record = REF["runs"][0]["layers"][layer]
    np.save(tmp_path / "h.npy", np.array(record["layer_in"], dtype=np.float64))
    out = tmp_path / "o.npz"
    result = run_cli(
        "import",
        str(CASE),
        "--layer",
        str(layer),
        "--hidden",
        str(tmp_path / "h.npy"),
        "-o",
        str(out),
    )
    assert result.exit_code == 0, result.stderr
    want = fixture(layer, record["layer_in"])
    with np.load(out) as got:
        for name, value in want["mla"].items():
            np.testing.assert_array_equal(got[f"mla.{name}"], value, err_msg=name)
        np.testing.assert_array_equal(got["W_O"], want["W_O"])
        np.testing.assert_allclose(got["X"], want["X"], rtol=1e-12)
    assert load_fixture(out).heads == CONFIG["num_attention_heads"]


def test_a_nan_in_kv_b_proj_is_one_line_and_no_file(tmp_path: Path) -> None:
    from conftest import run_cli
    from safetensors.numpy import save_file

    folder = tmp_path / "deepseek_v3"
    folder.mkdir()
    (folder / "config.json").write_text((CASE / "config.json").read_text())
    tensors = dict(TENSORS)
    name = "model.layers.0.self_attn.kv_b_proj.weight"
    tensors[name] = tensors[name].copy()
    tensors[name][3, 1] = np.nan
    save_file(tensors, str(folder / "model.safetensors"))
    np.save(tmp_path / "h.npy", np.ones((3, CONFIG["hidden_size"])))
    out = tmp_path / "o.npz"
    result = run_cli("import", str(folder), "--hidden", str(tmp_path / "h.npy"), "-o", str(out))
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert f"{name}: holds inf or NaN" in lines[0]
    assert not out.exists()
