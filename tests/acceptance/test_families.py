"""Each model family attn imports, against transformers itself (issue 23): tiny random
checkpoints saved by transformers 5.24 and what its eager attention computed, layer by layer
(tests/reference/families/, made by tests/reference/families.py in a throwaway venv).

``attn import`` reads each checkpoint as saved, for every layer (``--hidden``: the residual
stream transformers' layer received) and for layer 0 from a text (``--text``: the checkpoint's
own tokenizer.json and embeddings), and the trace must give transformers' queries and keys (after
q/k norms and RoPE), attention weights and attention output; for a linear-attention layer
(Qwen3-Next's Gated DeltaNet, the fixture's gated_deltanet key), linear_attn's output. A family
attn cannot trace exactly is refused in one line naming the key or tensor.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli

from attn_cli.core.pipeline import run
from attn_cli.io.fixture import load_fixture

REFERENCE = Path(__file__).parent.parent / "reference" / "families"
CASES = sorted(p.name for p in REFERENCE.iterdir() if p.is_dir())
# Refused, and why: the key or tensor the one line must name.
REFUSED: dict[str, str] = {}  # none since hunyuan_v1_dense imports (post_rope_norm, ntk_alpha)


def _reference(case: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REFERENCE / case / "reference.json").read_text())
    return data


LAYERS = [
    (case, run_["kind"], layer)
    for case in CASES
    if case not in REFUSED
    for run_ in _reference(case)["runs"]
    for layer in range(len(run_["layers"]))
    if not run_["layers"][layer].get("linear_attention")  # no softmax: below
]
# (case, kind, layer): a linear-attention layer (Qwen3-Next's Gated DeltaNet, the fixture's
# gated_deltanet key), for which transformers recorded linear_attn's output
LINEAR = [
    (case, run_["kind"], layer)
    for case in CASES
    for run_ in _reference(case)["runs"]
    for layer, record in enumerate(run_["layers"])
    if record.get("linear_attention")
]


def _import(tmp_path: Path, case: str, kind: str, layer: int, ref: dict[str, Any]) -> Any:
    pytest.importorskip(
        "safetensors", reason="attn import needs safetensors: pip install '.[models]'"
    )
    out = tmp_path / f"{case}.npz"
    if kind == "text":
        pytest.importorskip("tokenizers", reason="--text needs tokenizers: pip install '.[models]'")
        source = ["--text", ref["text"]]
    else:
        np.save(tmp_path / "h.npy", np.array(ref["layers"][layer]["layer_in"], dtype=np.float64))
        source = ["--hidden", str(tmp_path / "h.npy")]
    result = run_cli(
        "import", str(REFERENCE / case), "--layer", str(layer), *source, "-o", str(out)
    )
    assert result.exit_code == 0, result.stderr
    return load_fixture(out)


def _unbatched(x: Any) -> Any:
    """A stage's array without the batch axis of one (the import's X is [seq, hidden])."""
    return x[0] if x.shape[0] == 1 and x.ndim >= 3 else x


def _given_to_eager(trace: Any, which: str) -> str:
    """The last Q (or K) stage before the scores (after norms, clamps, RoPE and tuning): the
    q or k transformers' eager attention function is given."""
    names: list[str] = [stage.name for stage in trace]
    before = names[: names.index("scores")]
    return [n for n in before if n == which or n.startswith(f"{which}_")][-1]


@pytest.mark.parametrize(("case", "kind", "layer"), LAYERS)
def test_an_imported_layer_is_transformers_eager_attention(
    tmp_path: Path, case: str, kind: str, layer: int
) -> None:
    runs = _reference(case)["runs"]
    ref = runs[0] if kind == "hidden" else runs[1]
    inputs = _import(tmp_path, case, kind, layer, ref)
    want = ref["layers"][layer]
    trace = run(inputs)
    q_name, k_name = _given_to_eager(trace, "Q"), _given_to_eager(trace, "K")
    q, k = np.array(want["q"]), np.array(want["k"])
    got_q, got_k = trace[q_name].data.reshape(q.shape), trace[k_name].data.reshape(k.shape)
    np.testing.assert_allclose(got_q, q, rtol=1e-4, atol=1e-5 * np.abs(q).max())
    np.testing.assert_allclose(got_k, k, rtol=1e-4, atol=1e-5 * np.abs(k).max())
    weights = _unbatched(trace["softmax"].data)
    np.testing.assert_allclose(weights, want["weights"], rtol=1e-4, atol=1e-6)
    out = np.array(want["output"])
    np.testing.assert_allclose(
        _unbatched(trace["projected"].data), out, rtol=1e-4, atol=1e-5 * np.abs(out).max()
    )


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_family_attn_cannot_trace_exactly_is_refused_in_one_line(
    tmp_path: Path, case: str
) -> None:
    pytest.importorskip("safetensors", reason="attn import needs safetensors")
    ref = _reference(case)["runs"][0]
    np.save(tmp_path / "h.npy", np.array(ref["layers"][0]["layer_in"]))
    out = tmp_path / "o.npz"
    result = run_cli(
        "import", str(REFERENCE / case), "--hidden", str(tmp_path / "h.npy"), "-o", str(out)
    )
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert REFUSED[case] in lines[0]
    assert not out.exists()


def test_the_reference_has_linear_layers_from_hidden_states_and_from_text() -> None:
    assert {(c, k) for c, k, _ in LINEAR} >= {
        ("qwen3_next", "hidden"),
        ("qwen3_next_linear", "hidden"),
        ("qwen3_next_linear", "text"),
    }


@pytest.mark.parametrize(("case", "kind", "layer"), LINEAR)
def test_an_imported_linear_attention_layer_is_transformers_gated_deltanet(
    tmp_path: Path, case: str, kind: str, layer: int
) -> None:
    """Qwen3-Next's linear_attention layer read into the gated_deltanet key: the trace's
    projected is what transformers' linear_attn returned (out_proj's output, before the
    residual), from the residual stream entering the layer or from the text."""
    runs = _reference(case)["runs"]
    ref = runs[0] if kind == "hidden" else runs[1]
    inputs = _import(tmp_path, case, kind, layer, ref)
    assert "gated_deltanet" in inputs.extra and inputs.W_Q is None
    trace = run(inputs)
    assert "softmax" not in trace
    out = np.array(ref["layers"][layer]["output"])  # (T, hidden)
    np.testing.assert_allclose(
        _unbatched(trace["projected"].data), out, rtol=1e-4, atol=1e-5 * np.abs(out).max()
    )


def test_qwen3_next_linear_layer_maps_its_tensors_as_delta_from_torch() -> None:
    """Each array of the imported gated_deltanet key is the one tests/core/test_linear.py's
    delta_from_torch (checked there against the whole transformers layer) makes from the
    checkpoint's tensors: 2 key heads, 4 value heads (v and z rows of two per key head)."""
    load_file = pytest.importorskip(
        "safetensors.numpy", reason="attn import needs safetensors"
    ).load_file
    from test_linear import delta_from_torch

    from attn_cli.io.checkpoint import import_layer

    folder = REFERENCE / "qwen3_next_linear"
    imported = import_layer(folder, layer=0, text="a b c")
    p = "model.layers.0.linear_attn."
    w = {
        k[len(p) :]: v
        for k, v in load_file(folder / "model.safetensors").items()
        if k.startswith(p)
    }
    config = json.loads((folder / "config.json").read_text())
    sizes = ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "eps")
    keys = (
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "rms_norm_eps",
    )
    cfg = {size: config[key] for size, key in zip(sizes, keys, strict=True)}
    assert (cfg["num_k_heads"], cfg["num_v_heads"]) == (2, 4)
    want = delta_from_torch(w, cfg)
    got = imported.fixture["gated_deltanet"]
    assert set(got) == set(want)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    np.testing.assert_array_equal(imported.fixture["W_O"], w["out_proj.weight"].T)
    assert imported.fixture["heads"] == 4 and imported.fixture["causal"] is True


def test_a_linear_layer_with_a_tensor_the_key_has_no_place_for_is_one_line(
    tmp_path: Path,
) -> None:
    """A conv1d bias (transformers' Qwen3NextGatedDeltaNet has none): refused, not left out."""
    pytest.importorskip("safetensors", reason="attn import needs safetensors")
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "qwen3_next"
    shutil.copytree(REFERENCE / "qwen3_next", folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.layers.1.linear_attn.conv1d.bias"] = np.zeros(24, np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    np.save(tmp_path / "h.npy", np.ones((3, 16)))
    out = tmp_path / "o.npz"
    result = run_cli(
        "import", str(folder), "--layer", "1", "--hidden", str(tmp_path / "h.npy"), "-o", str(out)
    )
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), lines
    assert (
        "model.layers.1.linear_attn.conv1d.bias: a tensor of layer 1's attention that the "
        "qwen3_next layout has no place for"
    ) in lines[0]
    assert not out.exists()


def test_qwen3_next_imports_its_gate_split_from_q_proj(tmp_path: Path) -> None:
    """q_proj holds 2·heads·head_dim rows: per head the query's, then the gate's (transformers
    chunks each head's 2·head_dim in two); the fixture gets W_Q and gate.W_G of heads·head_dim."""
    load_file = pytest.importorskip(
        "safetensors.numpy", reason="attn import needs safetensors"
    ).load_file

    ref = _reference("qwen3_next")["runs"][0]
    inputs = _import(tmp_path, "qwen3_next", "hidden", 0, ref)
    q_proj = load_file(REFERENCE / "qwen3_next" / "model.safetensors")[
        "model.layers.0.self_attn.q_proj.weight"
    ]
    H, D = inputs.heads, inputs.d_k
    rows = q_proj.reshape(H, 2, D, -1)
    assert inputs.W_Q is not None
    np.testing.assert_array_equal(inputs.W_Q, rows[:, 0].reshape(H * D, -1).T)
    np.testing.assert_array_equal(inputs.extra["gate"].W_G, rows[:, 1].reshape(H * D, -1).T)
    assert inputs.setting("qk_norm") is not None
    assert inputs.rope is not None and inputs.rope.dims == D // 4


def _legacy(config: dict[str, Any], case: str) -> dict[str, Any]:
    """config.json as the checkpoints on the Hub spell it (transformers 4's keys)."""
    if case == "gemma3":  # google/gemma-3-4b-it and up: text_config spelled as gemma-3-1b's
        config["text_config"] = _legacy(config["text_config"], "gemma3_text")
        return config
    params = config.pop("rope_parameters")
    if case.startswith("gemma3_text"):  # google/gemma-3-*: rope_theta, rope_local_base_freq
        full, sliding = params["full_attention"], params["sliding_attention"]
        config["rope_theta"] = full.pop("rope_theta")
        config["rope_local_base_freq"] = sliding["rope_theta"]
        if full.get("rope_type") != "default":  # gemma-3-4b and up: linear, factor 8
            config["rope_scaling"] = full
        config["sliding_window_pattern"] = 2
        del config["layer_types"], config["_sliding_window_pattern"]
    elif case == "gpt_neox":  # EleutherAI/pythia-*: rotary_pct, rotary_emb_base
        config["rotary_pct"] = params["partial_rotary_factor"]
        config["rotary_emb_base"] = params["rope_theta"]
    else:  # microsoft/phi-2, stabilityai/stablelm-*: top-level keys
        config["partial_rotary_factor"] = params["partial_rotary_factor"]
        config["rope_theta"] = params["rope_theta"]
    return config


@pytest.mark.parametrize(
    "case", ["gemma3_text", "gemma3_text_linear", "gemma3", "gpt_neox", "phi", "stablelm", "glm4"]
)
def test_the_hubs_spelling_of_config_json_imports_to_the_same_layer(
    tmp_path: Path, case: str
) -> None:
    """A 5.24 config (rope_parameters) and the spelling of the checkpoints people download give
    the same fixture, and transformers' numbers, on every layer."""
    pytest.importorskip("safetensors", reason="attn import needs safetensors")
    folder = tmp_path / case
    shutil.copytree(REFERENCE / case, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(_legacy(config, case)))
    ref = _reference(case)["runs"][0]
    for layer, want in enumerate(ref["layers"]):
        np.save(tmp_path / "h.npy", np.array(want["layer_in"]))
        fixtures = []
        for source in (REFERENCE / case, folder):
            out = tmp_path / f"{layer}-{source == folder}.npz"
            result = run_cli(
                "import",
                str(source),
                "--layer",
                str(layer),
                "--hidden",
                str(tmp_path / "h.npy"),
                "-o",
                str(out),
            )
            assert result.exit_code == 0, result.stderr
            fixtures.append(load_fixture(out))
        assert fixtures[0].rope == fixtures[1].rope and fixtures[0].window == fixtures[1].window
        got = run(fixtures[1])["projected"].data.reshape(np.shape(want["output"]))
        np.testing.assert_allclose(got, want["output"], rtol=1e-4, atol=1e-5)


# config.json of google/gemma-3-4b-it (transformers 4.50): text_config leaves the heads, head_dim,
# query_pre_attn_scalar, vocab_size and RoPE bases to Gemma3TextConfig's defaults.
GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}


@pytest.mark.parametrize(
    ("layer", "window", "base", "scaling"),
    [(0, 1024, 10000.0, None), (5, None, 1e6, (("type", "linear"), ("factor", 8.0)))],
)
def test_gemma_3_4b_config_takes_gemma3_texts_defaults(
    layer: int, window: int | None, base: float, scaling: Any
) -> None:
    """What transformers 5.24's Gemma3Config makes of that config.json (read there once): 8
    heads, 4 kv heads, head_dim 256, query_pre_attn_scalar 256, layer_types sliding x 5 then
    full, sliding layers rope_theta 1e4, full ones 1e6 with linear factor 8, vocab 262208."""
    from attn_cli.io.families import Config, check_keys, plan_layer

    config = Config(GEMMA3_4B, "config.json")
    image_side = "boi_token_index, eoi_token_index, image_token_index, mm_tokens_per_image"
    assert check_keys(config, "gemma3") == (
        f"inert keys (Gemma3ForConditionalGeneration's attention never reads them): "
        f"{image_side}, vision_config",
    )
    plan = plan_layer(config, "gemma3", layer)
    assert (plan.heads, plan.kv_heads, plan.head_dim, plan.hidden) == (8, 4, 256, 2560)
    assert plan.scale == 256**-0.5 and plan.variants.get("window") == window
    assert plan.embed_tensors[0].shape == (262208, 2560)
    assert plan.prefixes[0] + plan.tensors[0].name == (
        f"language_model.model.layers.{layer}.self_attn.q_proj.weight"
    )
    rope = {"base": base, "layout": "half", "dims": 256}
    rope.update((f"scaling.{k}", v) for k, v in scaling or ())
    assert plan.variants["rope"] == rope


_ABSENT = object()  # the key left out of config.json
_GEMMA3_TEXT = json.loads((REFERENCE / "gemma3" / "config.json").read_text())["text_config"]


@pytest.mark.parametrize(
    ("case", "change", "layer", "named"),
    [
        (
            "gemma3",
            {"text_config": _ABSENT},
            0,
            "config.json: text_config: missing, expected "
            "the text model's config: a mapping with model_type 'gemma3_text'",
        ),
        ("gemma3", {"text_config": [16]}, 0, "config.json: text_config: got [16], expected"),
        (
            "gemma3",
            {"text_config": _GEMMA3_TEXT | {"model_type": "gemma2"}},
            0,
            'config.json: text_config.model_type: got "gemma2": attn reads a gemma3 checkpoint\'s '
            "text model as gemma3_text, expected 'gemma3_text'",
        ),
        (
            "gemma3",
            {"text_config": {k: v for k, v in _GEMMA3_TEXT.items() if k != "model_type"}},
            0,
            "config.json: text_config.model_type: missing: attn reads",
        ),
        (
            "gemma3",
            {"text_config": _GEMMA3_TEXT | {"clip_qkv": 0.5}},
            0,
            "config.json: text_config.clip_qkv: got 0.5: Q, K and V clamped",
        ),
        (
            "gemma3",
            {"text_config": _GEMMA3_TEXT | {"sliding_window_pattern": 0, "layer_types": None}},
            0,
            "config.json: text_config.sliding_window_pattern: got 0",
        ),
        # the text attention's keys are text_config's: beside it they are not ignored
        ("gemma3", {"sliding_window": 2}, 0, "config.json: sliding_window: got 2: a sliding"),
        ("gemma3", {"query_pre_attn_scalar": 8}, 0, "config.json: query_pre_attn_scalar: got 8"),
        ("gemma3", {"a_new_key": 1}, 0, "config.json: a_new_key: got 1: a key attn's gemma3"),
        (
            "gemma3_text",
            {"rope_parameters": {"full_attention": 5}},
            1,
            "config.json: rope_parameters.full_attention: got 5, expected a mapping",
        ),
        (
            "gemma3_text",
            {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 1e400}}},
            1,
            "(imported as the fixture): rope.scaling.factor: got the number inf",
        ),
        (
            "phi3",
            {"rope_parameters": {"rope_type": "su", "short_factor": [1, 1], "long_factor": [1, 1]}},
            0,
            "(imported as the fixture): "
            "rope.scaling.short_factor: got a list, expected a list of 4",
        ),
        ("smollm3", {"no_rope_layers": [True, False, 1, 0]}, 0, "no_rope_layers: got [True"),
        (
            "gemma3_text",
            {"layer_types": None, "sliding_window_pattern": 0},
            0,
            "sliding_window_pattern: got 0, expected a whole number >= 1",
        ),
        (
            "qwen2_moe",
            {"use_sliding_window": True, "sliding_window": -3},
            0,
            "sliding_window: got -3",
        ),
        (
            "gpt_neox",
            {"rope_parameters": None, "rotary_pct": "0.25"},
            0,
            "rotary_pct: got '0.25', expected a finite number > 0",
        ),
        ("roberta", {"pad_token_id": -1}, 0, "pad_token_id: got -1"),
        ("granite", {"attention_multiplier": 1e400}, 0, "attention_multiplier: got inf"),
        (
            "qwen3_next",
            {"layer_types": ["full_attention", "sliding_attention", "full_attention"]},
            0,
            "layer_types: got ['full_attention', 'sliding_attention', 'full_attention'], expected "
            "a list of 3 entries, each 'linear_attention' or 'full_attention'",
        ),
        (
            "qwen3_next",
            {"layer_types": None, "full_attention_interval": 0},
            0,
            "full_attention_interval: got 0, expected a whole number >= 1",
        ),
        # layer types that disagree with the tensors: the tensors the other kind reads missing
        (
            "qwen3_next",
            {"layer_types": None, "full_attention_interval": 4},
            0,
            "model.layers.0.linear_attn.in_proj_qkvz.weight: missing tensor",
        ),
        (
            "qwen3_next",
            {"layer_types": None, "full_attention_interval": 2},
            1,
            "model.layers.1.self_attn.q_proj.weight: missing tensor",
        ),
        (
            "qwen3_next_linear",
            {"linear_num_value_heads": 3},
            0,
            "linear_num_value_heads: 3 is not a multiple of linear_num_key_heads 2: transformers "
            "splits in_proj_qkvz per key head",
        ),
        (
            "qwen3_next_linear",
            {"linear_num_key_heads": 0},
            0,
            "linear_num_key_heads: got 0, expected a whole number >= 1",
        ),
        (
            "qwen3_next_linear",
            {"linear_num_value_heads": 2},
            0,
            "model.layers.0.linear_attn.in_proj_qkvz.weight: ",
        ),
        (
            "qwen3_next_linear",
            {"linear_key_head_dim": 8},
            0,
            "model.layers.0.linear_attn.in_proj_qkvz.weight: ",
        ),
        (
            "qwen3_next_linear",
            {"linear_value_head_dim": 2},
            0,
            "model.layers.0.linear_attn.in_proj_qkvz.weight: ",
        ),
        (
            "qwen3_next_linear",
            {"linear_conv_kernel_dim": 3},
            0,
            "model.layers.0.linear_attn.conv1d.weight: ",
        ),
        (
            "qwen3_next_linear",
            {"linear_key_head_dim": 2},
            0,
            "linear_num_key_heads 2, "
            "linear_num_value_heads 4, linear_key_head_dim 2, linear_value_head_dim 4, "
            "linear_conv_kernel_dim 4",
        ),
        (
            "qwen3_next_linear",
            {"hidden_act": "gelu"},
            0,
            "hidden_act: got 'gelu': the activation after linear_attention's conv1d",
        ),
        ("qwen3_next_linear", {"rms_norm_eps": -1}, 0, "rms_norm_eps: got -1"),
        (
            "qwen3_next",
            {
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 1e4,
                    "partial_rotary_factor": 0.1,
                }
            },
            0,
            "rope_parameters.partial_rotary_factor: 0.1 gives 0 rotated dims of 8",
        ),
        ("qwen3_next", {"head_dim": 16}, 0, "model.layers.0.self_attn.q_proj.weight: "),
        (
            "deepseek_v3",
            {"kv_lora_rank": _ABSENT},
            0,
            "config.json: kv_lora_rank: missing, expected a whole number >= 1",
        ),
        ("deepseek_v3", {"kv_lora_rank": 0}, 0, "kv_lora_rank: got 0, expected a whole number"),
        (
            "deepseek_v3",
            {"qk_rope_head_dim": 3},
            0,
            "qk_rope_head_dim: got 3: RoPE rotates pairs, expected an even number >= 2",
        ),
        (
            "deepseek_v3",
            {"kv_lora_rank": 6},
            1,
            "model.layers.1.self_attn.kv_a_proj_with_mqa.weight: ",
        ),
        ("deepseek_v3", {"v_head_dim": 2}, 0, "model.layers.0.self_attn.kv_b_proj.weight: "),
        (
            "deepseek_v3",
            {"q_lora_rank": None},
            0,
            "a tensor of layer 0's attention that the deepseek_v3 layout has no place for",
        ),
        ("deepseek_v3", {"rms_norm_eps": float("nan")}, 0, "rms_norm_eps: got nan"),
        (
            "deepseek_v3",
            {"rope_parameters": {"rope_type": "default", "rope_theta": float("nan")}},
            0,
            "rope_parameters.rope_theta: got nan",
        ),
        (
            "deepseek_v3",
            {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}},
            0,
            "rope_parameters: rope_type 'llama3': the mla key's RoPE scales by yarn only",
        ),
        (
            "deepseek_v3_yarn",
            {
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 1e4,
                    "factor": 8.0,
                    "mrope_section": [1, 1],
                }
            },
            0,
            "rope_parameters.mrope_section: got [1, 1] in a yarn rope",
        ),
        (
            "deepseek_v3_yarn",
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": -8.0}},
            0,
            "mla.scaling.factor: got the number -8.0, expected a number from 0.001 to 1e+06",
        ),
        (
            "deepseek_v3_yarn",
            {
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 1e4,
                    "factor": "8",
                    "mscale_all_dim": 1.0,
                }
            },
            0,
            "mla.scaling.factor: got the string '8', expected a number from 0.001",
        ),
        ("deepseek_v3", {"rope_interleave": False}, 0, "rope_interleave: got false"),
        ("deepseek_v3", {"attention_bias": True}, 0, "attention_bias: got true"),
        ("deepseek_v3", {"num_key_value_heads": 1}, 0, "num_key_value_heads: got 1"),
        ("deepseek_v3", {"head_dim": 8}, 0, "head_dim: got 8: DeepseekV3Config sets it"),
        ("deepseek_v3", {"qk_nope_head_dim": 0}, 0, "qk_nope_head_dim: got 0"),
        ("deepseek_v3", {"use_sliding_window": True}, 0, "use_sliding_window: got true"),
    ],
)
def test_a_hostile_config_is_one_line_and_no_file(
    tmp_path: Path, case: str, change: dict[str, Any], layer: int, named: str
) -> None:
    pytest.importorskip("safetensors", reason="attn import needs safetensors")
    folder = tmp_path / case
    shutil.copytree(REFERENCE / case, folder)
    config = json.loads((folder / "config.json").read_text()) | change
    config = {k: v for k, v in config.items() if v is not _ABSENT}
    (folder / "config.json").write_text(json.dumps(config))
    np.save(tmp_path / "h.npy", np.ones((3, 16)))
    out = tmp_path / "o.npz"
    result = run_cli(
        "import",
        str(folder),
        "--layer",
        str(layer),
        "--hidden",
        str(tmp_path / "h.npy"),
        "-o",
        str(out),
    )
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and named in lines[0], lines
    assert not out.exists()


def _renamed_tensors(folder: Path, rename: Any) -> None:
    """model.safetensors with each tensor under ``rename(name)`` (None: left out)."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    kept = {rename(n): t for n, t in tensors.items() if rename(n) is not None}
    save_file(kept, str(folder / "model.safetensors"))


def test_gemma3_under_its_module_names_imports_the_same_layers(tmp_path: Path) -> None:
    """model.language_model.layers.N (the module's name, which transformers also loads) as
    language_model.model.layers.N (what save_pretrained writes, as the Hub's checkpoints do)."""
    pytest.importorskip("safetensors", reason="attn import needs safetensors")
    folder = tmp_path / "gemma3"
    shutil.copytree(REFERENCE / "gemma3", folder)
    _renamed_tensors(folder, lambda n: n.replace("language_model.model.", "model.language_model."))
    ref = _reference("gemma3")["runs"][0]
    for layer, want in enumerate(ref["layers"]):
        np.save(tmp_path / "h.npy", np.array(want["layer_in"]))
        out = tmp_path / f"{layer}.npz"
        result = run_cli(
            "import",
            str(folder),
            "--layer",
            str(layer),
            "--hidden",
            str(tmp_path / "h.npy"),
            "-o",
            str(out),
        )
        assert result.exit_code == 0, result.stderr
        got = run(load_fixture(out))["projected"].data.reshape(np.shape(want["output"]))
        np.testing.assert_allclose(got, want["output"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("rename", "named"),
    [
        (
            lambda n: None if n.startswith("language_model.") else n,  # the vision tower alone
            "model.safetensors: language_model.model.layers.0.self_attn.q_proj.weight: missing "
            "tensor, expected the gemma3 layout's q.weight tensor of layer 0",
        ),
        (
            lambda n: n.replace("language_model.model.", "language_model."),  # no known prefix
            "model.safetensors: language_model.model.layers.0.self_attn.q_proj.weight: missing",
        ),
        (
            lambda n: n.replace("language_model.model.layers.1.", "model.language_model.layers.1."),
            "attention tensors under several prefixes "
            "(language_model.model., model.language_model.)",
        ),
    ],
    ids=["vision-only", "other-prefix", "both-prefixes"],
)
def test_gemma3_without_its_text_layers_under_the_prefix_is_one_line_and_no_file(
    tmp_path: Path, rename: Any, named: str
) -> None:
    pytest.importorskip("safetensors", reason="attn import needs safetensors")
    folder = tmp_path / "gemma3"
    shutil.copytree(REFERENCE / "gemma3", folder)
    _renamed_tensors(folder, rename)
    np.save(tmp_path / "h.npy", np.ones((3, 16)))
    out = tmp_path / "o.npz"
    result = run_cli("import", str(folder), "--hidden", str(tmp_path / "h.npy"), "-o", str(out))
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and named in lines[0], lines
    assert not out.exists()
