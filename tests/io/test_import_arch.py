"""``attn import --arch``: never exit 0 with numbers other than the checkpoint's own (issue 23).

Every family attn imports, crossed with the checkpoints people open today, as transformers 5.24
saves them (config.json and tensor names: tests/reference/arch_configs.json, made by
tests/reference/arch_configs.py in a throwaway venv, and every other model type of
tests/reference/families/). Each checkpoint is tried as saved and with its model_type renamed and
``architectures`` dropped (a fine-tune's own name: then only the allowlist of config.json keys and
the layer's tensors tell the models apart). Each pair either imports, where the conventions truly
agree, and then its attention output equals an independent NumPy reading of transformers' eager
attention written here (for the hidden-8 checkpoints) and, renamed, the same checkpoint imported
as its own model type (checked against transformers in test_families.py); or exits 2 with one
``Error:`` line naming the key (or tensor) that contradicts the family.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("safetensors", reason="attn import needs safetensors: pip install '.[models]'")

from conftest import run_cli
from safetensors.numpy import save_file

from attn_cli.core.pipeline import run
from attn_cli.errors import AttnError
from attn_cli.io.checkpoint import import_layer
from attn_cli.io.families import REGISTRY
from attn_cli.io.fixture import load_fixture

SAVED: dict[str, Any] = json.loads(
    (Path(__file__).parent.parent / "reference" / "arch_configs.json").read_text()
)
FAMILY_CASES = Path(__file__).parent.parent / "reference" / "families"


def _saved_by_transformers() -> dict[str, Any]:
    """The model types of tests/reference/families/ that arch_configs.json lacks, as saved
    there (config.json, and each tensor's name and shape from the safetensors header)."""
    out: dict[str, Any] = {}
    for folder in sorted(p for p in FAMILY_CASES.iterdir() if p.is_dir()):
        config = json.loads((folder / "config.json").read_text())
        if config["model_type"] in SAVED or config["model_type"] in out:
            continue
        raw = (folder / "model.safetensors").read_bytes()
        header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
        tensors = {n: e["shape"] for n, e in header.items() if n != "__metadata__"}
        out[config["model_type"]] = {"config": config, "tensors": tensors}
    return out


SIZED_8 = frozenset(SAVED)  # hidden 8, 2 heads: the sizes _eager below is written for
SAVED |= _saved_by_transformers()
# Checked here against an independent NumPy reading of transformers' eager attention; every
# other family against transformers itself (tests/acceptance/test_families.py,
# tests/acceptance/test_rope_scaling.py).
CHECKED = ("bert", "gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma2")
_ROBERTA = ("roberta", "xlm-roberta", "camembert")
# As saved here (hidden 8, 2 heads), GPT-NeoX's 25% rotary gives 1 rotated dim of 4: refused.
UNTRACEABLE = ("gpt_neox",)
# Read under another name, these agree with a family exactly: the same attention and keys (a
# BERT read as a RoBERTa-like, with --hidden: the same layer; its positions are the asked family's).
AGREE = {
    ("mixtral", "mistral"),
    ("mixtral", "llama"),
    ("qwen3_moe", "qwen3"),
    ("llama", "mixtral"),
    ("mistral", "mixtral"),
    ("mistral", "ministral"),
    ("mixtral", "ministral"),
    ("llama", "seed_oss"),  # attention_bias false, no attention_out_bias: Llama's layer
    # ministral3 without llama_4_scaling_beta is Mistral's attention, sliding only when
    # sliding_window is given (transformers 5.25 modeling_ministral3.py: create_causal_mask
    # when it is null, as in Llama)
    ("llama", "ministral3"),
    ("mistral", "ministral3"),
    ("mixtral", "ministral3"),
    *((a, b) for a in ("bert", *_ROBERTA) for b in _ROBERTA if a != b),
}
rng = np.random.default_rng(23)


def _checkpoint(folder: Path, model_type: str, renamed: bool) -> Path:
    """The saved config.json (model_type renamed, architectures dropped) and random tensors."""
    saved = SAVED[model_type]
    config = dict(saved["config"])
    if renamed:
        config["model_type"] = "my-finetune"
        del config["architectures"]
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {n: rng.standard_normal(s).astype(np.float32) for n, s in saved["tensors"].items()}
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def _expected_ok(model_type: str, arch: str | None, renamed: bool) -> bool:
    family = model_type if arch is None else arch
    if model_type in UNTRACEABLE or (renamed and bool(REGISTRY[family].arch_refused)):
        return False
    return (family == model_type and family in REGISTRY) or (
        renamed and (model_type, arch) in AGREE
    )


CASES = [
    (model_type, arch, renamed)
    for model_type in SAVED
    for arch in (None, *REGISTRY)
    for renamed in (False, True)
    if not (renamed and arch is None)  # a renamed model_type needs --arch
]


@pytest.mark.parametrize(
    ("model_type", "arch", "renamed"),
    CASES,
    ids=[f"{m}-as-{a or 'detected'}{'-renamed' if r else ''}" for m, a, r in CASES],
)
def test_arch_imports_exactly_or_refuses_naming_the_key(
    tmp_path: Path, model_type: str, arch: str | None, renamed: bool
) -> None:
    folder = _checkpoint(tmp_path / "m", model_type, renamed)
    config = SAVED[model_type]["config"]
    sizes = config.get("text_config", config)  # a wrapper's (gemma3) sizes are its text model's
    h = rng.standard_normal((3, sizes.get("hidden_size") or sizes.get("n_embd") or sizes["dim"]))
    np.save(tmp_path / "h.npy", h)
    out = tmp_path / "out.npz"
    args = ["import", str(folder), "--hidden", str(tmp_path / "h.npy"), "-o", str(out)]
    result = run_cli(*args, *(["--arch", arch] if arch else []))
    if _expected_ok(model_type, arch, renamed):
        assert result.exit_code == 0, result.stderr
        if renamed:  # the same numbers as the checkpoint imported as its own model type
            (folder / "config.json").write_text(json.dumps(config))
            native = tmp_path / "native.npz"
            assert (
                run_cli(
                    "import", str(folder), "--hidden", str(tmp_path / "h.npy"), "-o", str(native)
                ).exit_code
                == 0
            )
            np.testing.assert_allclose(
                run(load_fixture(out))["projected"].data,
                run(load_fixture(native))["projected"].data,
                rtol=1e-12,
                atol=1e-12,
            )
        truth = "bert" if model_type in _ROBERTA else model_type  # the same layer as BERT's
        if truth not in CHECKED or model_type not in SIZED_8:
            return
        want = _eager(truth, SAVED[model_type]["config"], folder, h)
        got = run(load_fixture(out))["projected"].data
        np.testing.assert_allclose(np.squeeze(got), want, rtol=1e-9, atol=1e-9)
        return
    assert result.exit_code == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    named = re.match(r"Error: \S+(config\.json|model\.safetensors): ([\w.\-]+): ", lines[0])
    assert named is not None, lines[0]
    assert not out.exists()


# The cases the issue names: the key each is refused by.
@pytest.mark.parametrize(
    ("model_type", "arch", "renamed", "field"),
    [
        ("roberta", "bert", False, "config.json: model_type: 'roberta' is not bert: attn imports"),
        ("xlm-roberta", "bert", False, "model_type: 'xlm-roberta' is not bert"),
        ("roberta", "bert", True, "config.json: pad_token_id: got 1: transformers' bert starts"),
        ("xlm-roberta", "bert", True, "config.json: pad_token_id: got 1"),
        ("gemma3_text", "gemma2", False, "model_type: 'gemma3_text' is not gemma2"),
        # the wrapper and its text model: each imports as itself, neither as the other
        ("gemma3", "gemma3_text", False, "model_type: 'gemma3' is not gemma3_text: attn imports"),
        ("gemma3_text", "gemma3", False, "model_type: 'gemma3_text' is not gemma3: attn imports"),
        ("gemma3_text", "gemma3", True, "config.json: text_config: missing, expected the text"),
        ("gemma3", "gemma3_text", True, "config.json: boi_token_index: got 255999: a key attn's"),
        ("gemma3", "gemma2", True, "config.json: boi_token_index: got 255999: a key attn's"),
        ("llama", "gemma", True, 'model_type: got "my-finetune": gemma\'s RMSNorm (1 + weight)'),
        ("gemma", "llama", True, 'hidden_act: got "gelu_pytorch_tanh": the MLP of a Gemma'),
        ("gemma", "mixtral", True, 'hidden_act: got "gelu_pytorch_tanh": the MLP of a Gemma'),
        ("llama", "ernie4_5", True, 'model_type: got "my-finetune": ernie4_5\'s RoPE on'),
        ("gpt_neox", None, False, "rope_parameters.partial_rotary_factor: 0.25 gives 1 rotated"),
        ("gemma3_text", "gemma2", True, "config.json: _sliding_window_pattern: got 6"),
        ("cohere2", "llama", True, "config.json: layer_norm_eps: got 1e-05: LayerNorm"),
        ("ernie4_5", "llama", True, "config.json: use_bias: got false: a key attn's llama"),
        ("granite", "llama", True, "config.json: attention_multiplier: got 1.0: the attention"),
        ("qwen3_moe", "llama", True, "model.layers.0.self_attn.k_norm.weight: a tensor of"),
        ("smollm3", "llama", True, "config.json: layer_types: got"),
        ("smollm3", "qwen3", True, "config.json: no_rope_layer_interval: got 2: layers without"),
        ("starcoder2", "llama", True, "config.json: norm_epsilon: got 1e-05: a LayerNorm"),
        ("olmo2", "llama", True, "model.layers.0.self_attn.k_norm.weight: a tensor"),
        ("phi3", "llama", True, "config.json: original_max_position_embeddings: got 4096"),
        ("gpt_neox", "llama", True, "config.json: layer_norm_eps: got 1e-05: LayerNorm"),
        ("mistral", "llama", True, "sliding_window: got 4096: transformers' llama has no sliding"),
        ("llama", "mistral", True, "config.json: sliding_window: missing: model_type"),
        ("llama", "gemma2", True, "config.json: query_pre_attn_scalar: missing"),
        ("qwen2", "llama", True, "config.json: layer_types: got"),
    ],
)
def test_the_refusals_the_issue_names(
    tmp_path: Path, model_type: str, arch: str | None, renamed: bool, field: str
) -> None:
    folder = _checkpoint(tmp_path / "m", model_type, renamed)
    np.save(tmp_path / "h.npy", rng.standard_normal((3, 8)))
    with pytest.raises(AttnError) as info:
        import_layer(folder, layer=0, hidden=tmp_path / "h.npy", arch=arch)
    assert field in str(info.value), str(info.value)


# ---------------------------------------------------------------------------------------------
# The allowlist, key by key, on a Llama checkpoint as transformers saves it


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"use_qk_norm": True}, "use_qk_norm: got true: a norm of each query and key"),
        ({"qk_layernorm": True}, "qk_layernorm: got true"),
        ({"clip_qkv": 8.0}, "clip_qkv: got 8.0: Q, K and V clamped"),
        ({"attention_multiplier": 0.5}, "attention_multiplier: got 0.5"),
        ({"no_rope_layers": [1, 0]}, "no_rope_layers: got [1, 0]"),
        ({"rotary_pct": 0.25}, "rotary_pct: got 0.25: RoPE on part of each head"),
        ({"position_embedding_type": "rotary"}, 'position_embedding_type: got "rotary"'),
        ({"attn_logit_softcapping": 30.0}, "attn_logit_softcapping: got 30.0: scores softcapped"),
        ({"layer_types": ["chunked_attention"] * 2}, "layer_types: got"),
        ({"pruned_heads": {"0": [1]}}, "pruned_heads: got"),
        ({"per_layer_config": {"0": {}}}, "per_layer_config: got"),
        ({"a_new_key": 3}, "a_new_key: got 3: a key attn's llama import does not know"),
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [1]}},
            "rope_parameters.mrope_section: got [1] in a default rope",
        ),
        (
            {
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
                "rope_scaling": {"rope_type": "linear", "factor": 2.0, "mrope_section": [1]},
            },
            "rope_scaling.mrope_section: got [1] in a linear rope",
        ),
    ],
)
def test_a_key_attn_does_not_model_is_refused_by_name(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    folder = _checkpoint(tmp_path / "m", "llama", renamed=False)
    config = json.loads((folder / "config.json").read_text()) | change
    (folder / "config.json").write_text(json.dumps(config))
    np.save(tmp_path / "h.npy", rng.standard_normal((3, 8)))
    with pytest.raises(AttnError) as info:
        import_layer(folder, layer=0, hidden=tmp_path / "h.npy")
    assert "config.json: " + field in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "change",
    [
        {"use_qk_norm": False},
        {"clip_qkv": None},
        {"rope_scaling": None},
        {"pruned_heads": {}},
        {"hidden_dropout": 0.3},
        {"quantization_config": {"quant_method": "fp8"}},
        {"task_specific_params": {"x": [1]}},
        {"unknown_but_null": None},
    ],
)
def test_neutral_and_inert_keys_are_accepted(tmp_path: Path, change: dict[str, Any]) -> None:
    folder = _checkpoint(tmp_path / "m", "llama", renamed=False)
    config = json.loads((folder / "config.json").read_text()) | change
    (folder / "config.json").write_text(json.dumps(config))
    np.save(tmp_path / "h.npy", rng.standard_normal((3, 8)))
    assert import_layer(folder, layer=0, hidden=tmp_path / "h.npy").family == "llama"


def test_a_key_transformers_ignores_is_noted_for_its_own_model_type(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path / "m", "mistral", renamed=False)
    config = json.loads((folder / "config.json").read_text()) | {"attention_bias": True}
    (folder / "config.json").write_text(json.dumps(config))
    np.save(tmp_path / "h.npy", rng.standard_normal((3, 8)))
    layer = import_layer(folder, layer=0, hidden=tmp_path / "h.npy")
    assert "b_Q" not in layer.fixture  # MistralAttention has no biases, whatever the key says
    assert any(
        n.startswith("attention_bias true ignored: transformers' mistral") for n in layer.notes
    )


def test_partial_rotary_noted_for_its_model_type_refused_under_another(tmp_path: Path) -> None:
    """Transformers' Llama rotates every dim whatever partial_rotary_factor says; a model
    read as llama under another name may not."""
    np.save(tmp_path / "h.npy", rng.standard_normal((3, 8)))
    for renamed in (False, True):
        folder = _checkpoint(tmp_path / f"m{renamed}", "llama", renamed)
        config = json.loads((folder / "config.json").read_text())
        config["rope_parameters"]["partial_rotary_factor"] = 0.5
        (folder / "config.json").write_text(json.dumps(config))
        if not renamed:
            layer = import_layer(folder, layer=0, hidden=tmp_path / "h.npy")
            assert layer.fixture["rope"]["dims"] == 4
            assert any("partial_rotary_factor 0.5 ignored" in n for n in layer.notes)
            continue
        with pytest.raises(AttnError) as info:
            import_layer(folder, layer=0, hidden=tmp_path / "h.npy", arch="llama")
        assert "rope_parameters.partial_rotary_factor: got 0.5" in str(info.value)


def test_a_quantized_attention_tensor_is_refused(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path / "m", "llama", renamed=False)
    tensors = {
        n: rng.standard_normal(s).astype(np.float32) for n, s in SAVED["llama"]["tensors"].items()
    }
    tensors["model.layers.0.self_attn.q_proj.weight_scale"] = np.ones(1, np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    np.save(tmp_path / "h.npy", rng.standard_normal((3, 8)))
    with pytest.raises(AttnError) as info:
        import_layer(folder, layer=0, hidden=tmp_path / "h.npy")
    assert "q_proj.weight_scale: a tensor of layer 0's attention" in str(info.value)


def test_renamed_model_type_says_what_it_assumed(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path / "m", "mixtral", renamed=True)
    np.save(tmp_path / "h.npy", rng.standard_normal((3, 8)))
    layer = import_layer(folder, layer=0, hidden=tmp_path / "h.npy", arch="mistral")
    assert layer.notes[0].startswith("model_type 'my-finetune' read as mistral, as asked")
    assert "window" not in layer.fixture  # MixtralConfig's sliding_window null, given


def test_architectures_naming_another_model_is_refused(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path / "m", "roberta", renamed=True)
    config = json.loads((folder / "config.json").read_text())
    config |= {"architectures": ["RobertaForMaskedLM"], "pad_token_id": 0}
    (folder / "config.json").write_text(json.dumps(config))
    np.save(tmp_path / "h.npy", rng.standard_normal((3, 8)))
    with pytest.raises(AttnError) as info:
        import_layer(folder, layer=0, hidden=tmp_path / "h.npy", arch="bert")
    assert "architectures: names 'RobertaForMaskedLM', a roberta model" in str(info.value)


# ---------------------------------------------------------------------------------------------
# The reference: transformers' eager attention of layer 0, read in NumPy from the tensors


def _rms(x: Any, w: Any, eps: float, plus_one: bool = False) -> Any:
    r = np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    return x / r * ((1.0 + w) if plus_one else w)


def _layer_norm(x: Any, w: Any, b: Any, eps: float) -> Any:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _rotate(x: Any, base: float) -> Any:
    """HF's rotate_half RoPE at positions 0..T-1; x is (T, heads, D)."""
    T, _, D = x.shape
    angle = np.arange(T)[:, None] * base ** (-np.arange(0, D, 2) / D)  # (T, D/2)
    cos, sin = np.cos(np.concatenate([angle] * 2, -1)), np.sin(np.concatenate([angle] * 2, -1))
    half = np.concatenate([-x[..., D // 2 :], x[..., : D // 2]], -1)
    return x * cos[:, None] + half * sin[:, None]


def _eager(family: str, cfg: dict[str, Any], folder: Path, h: Any) -> Any:
    """Layer 0's attention output (before the residual add) as transformers computes it."""
    from safetensors.numpy import load_file

    t: dict[str, Any] = {
        k: v.astype(np.float64) for k, v in load_file(str(folder / "model.safetensors")).items()
    }
    if family == "bert":
        p = "encoder.layer.0.attention."
        lin = {
            x: (t[f"{p}self.{n}.weight"], t[f"{p}self.{n}.bias"])
            for x, n in (("q", "query"), ("k", "key"), ("v", "value"))
        }
        lin["o"] = (t[f"{p}output.dense.weight"], t[f"{p}output.dense.bias"])
        return _attend(h, lin, 2, 2, causal=False, scale=0.5)
    if family == "gpt2":
        p, C = "transformer.h.0.", 8
        x = _layer_norm(h, t[p + "ln_1.weight"], t[p + "ln_1.bias"], cfg["layer_norm_epsilon"])
        W, b = t[p + "attn.c_attn.weight"], t[p + "attn.c_attn.bias"]  # Conv1D: (in, out)
        lin = {
            n: (W[:, i * C : (i + 1) * C].T, b[i * C : (i + 1) * C]) for i, n in enumerate("qkv")
        }
        lin["o"] = (t[p + "attn.c_proj.weight"].T, t[p + "attn.c_proj.bias"])
        return _attend(x, lin, 2, 2, causal=True, scale=0.5)
    p = "model.layers.0."
    x = _rms(h, t[p + "input_layernorm.weight"], cfg["rms_norm_eps"], family == "gemma2")
    lin = {
        n: (t[f"{p}self_attn.{n}_proj.weight"], t.get(f"{p}self_attn.{n}_proj.bias"))
        for n in "qkvo"
    }
    norms = None
    if f"{p}self_attn.q_norm.weight" in t:
        norms = (
            t[f"{p}self_attn.q_norm.weight"],
            t[f"{p}self_attn.k_norm.weight"],
            cfg["rms_norm_eps"],
        )
    gemma = family == "gemma2"
    return _attend(
        x,
        lin,
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        causal=True,
        scale=cfg["query_pre_attn_scalar"] ** -0.5 if gemma else cfg["head_dim"] ** -0.5,
        base=cfg["rope_parameters"]["rope_theta"],
        norms=norms,
        softcap=cfg["attn_logit_softcapping"] if gemma else None,
    )


def _attend(
    x: Any,
    lin: dict[str, Any],
    H: int,
    Hkv: int,
    *,
    causal: bool,
    scale: float,
    base: float | None = None,
    norms: Any = None,
    softcap: float | None = None,
) -> Any:
    """Project, (q/k norm, RoPE,) score, mask, softmax, mix and project out, head by head."""

    def proj(n: str, inp: Any) -> Any:
        w, b = lin[n]
        return inp @ w.T + (0.0 if b is None else b)

    T = x.shape[0]
    q = proj("q", x).reshape(T, H, -1)  # (T, H, D)
    k, v = proj("k", x).reshape(T, Hkv, -1), proj("v", x).reshape(T, Hkv, -1)  # (T, Hkv, D)
    if norms is not None:
        q, k = _rms(q, norms[0], norms[2]), _rms(k, norms[1], norms[2])
    if base is not None:
        q, k = _rotate(q, base), _rotate(k, base)
    heads = []
    for i in range(H):
        j = i // (H // Hkv)
        s = q[:, i] @ k[:, j].T * scale  # (T, T)
        if softcap is not None:
            s = np.tanh(s / softcap) * softcap
        if causal:
            s = np.where(np.tril(np.ones((T, T), bool)), s, -math.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        heads.append(p / p.sum(-1, keepdims=True) @ v[:, j])  # (T, D)
    return proj("o", np.concatenate(heads, -1))
