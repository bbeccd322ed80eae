"""Make tests/reference/forward_2026/: the 2026 flagships' config shapes, tiny, and two deep layers.

Run ONCE, in a throwaway venv (torch and transformers are not dependencies of attn):

    /tmp/hfvenv/bin/python tests/reference/forward_2026.py              # every case
    /tmp/hfvenv/bin/python tests/reference/forward_2026.py phi3 gptj    # or only some

For each case (issue 41): a config with the keys the family's flagship config.json carries (the
inert ones too: phi3's full_attn_mod, smollm3's max_window_layers, cohere2's layer_switch), tiny
sizes and 4 layers, so that layers 2 and 3 are reached through whole blocks and the layer
patterns (NoPE, sliding, chunked, MoE) fall among them. families.py's seeded init, noise on every
1-D parameter (and on the correction biases perturb leaves), save_pretrained into
forward_2026/<case>/ with families.py's WordLevel tokenizer.json, loaded back with eager attention
and run on the ids of "a b c d e f g". reference.json holds, for the deep layers 2 and 3: the
residual stream entering the layer (a forward pre-hook on it), the eager attention weights
(output_attentions) and the attention module's output (a forward hook on self_attn / attn: after
its output projection, before any residual or norm); and the logits. Floats are float32 values
written as float64 reprs. forward_2026.md lists, per case, which config keys transformers reads.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import families as fam
import torch
import transformers
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).with_name("forward_2026")
LAYERS = 4
DEEP_LAYERS = [2, 3]
DEEP = {"num_hidden_layers": LAYERS, "intermediate_size": 32}
ORIGINAL = 4  # an original_max_position_embeddings below the 7 tokens: the long regime applies


def tiny(cls_name: str, **extra: Any) -> Any:
    return fam.tiny(cls_name, **{**DEEP, **extra})


def phi3() -> Any:
    # Phi-4-mini: partial_rotary_factor 0.75 (6 of 8 dims, 3 factors), longrope with short and
    # long factors, original_max_position_embeddings 4 < 7 tokens (the long factors and the
    # attention factor sqrt(1 + ln(32 / 4) / ln 4) apply); full_attn_mod, interpolate_factor,
    # lm_head_bias, mlp_bias, attention_bias as the flagship ships them
    longrope = {
        "type": "longrope",
        "short_factor": [1.0, 1.25, 1.5],
        "long_factor": [1.5, 3.0, 6.0],
    }
    return tiny(
        "Phi3Config",
        num_key_value_heads=1,
        partial_rotary_factor=0.75,
        rope_scaling=longrope,
        rope_theta=10_000.0,
        original_max_position_embeddings=ORIGINAL,
        sliding_window=32,
        tie_word_embeddings=True,
        full_attn_mod=1,
        interpolate_factor=1,
        lm_head_bias=False,
        mlp_bias=False,
        attention_bias=False,
    )


def smollm3() -> Any:
    # SmolLM3-3B: a NoPE layer every 4th (no_rope_layers [1, 1, 1, 0]: layer 3 NoPE), no sliding
    # window (use_sliding_window false) while max_window_layers is present (2 here, 28 shipped)
    return tiny(
        "SmolLM3Config",
        no_rope_layers=[1, 1, 1, 0],
        no_rope_layer_interval=4,
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=2,
        rope_theta=5_000_000.0,
        attention_bias=False,
        mlp_bias=False,
    )


def cohere2() -> Any:
    # Command R7B: sliding_window_pattern 4 (layers 0-2 sliding with RoPE, layer 3 full NoPE),
    # layer_switch 4, logit_scale, the parallel block; window 4 cuts the 7 tokens
    return tiny(
        "Cohere2Config",
        sliding_window=fam.WINDOW,
        sliding_window_pattern=4,
        layer_switch=4,
        logit_scale=0.25,
        rope_theta=50_000.0,
        use_qk_norm=False,
        attention_bias=False,
    )


def stablelm() -> Any:
    # StableLM 2 12B: per-head q/k LayerNorm, parallel residual, partial rotary 0.25 (2 of 8)
    return tiny(
        "StableLmConfig",
        partial_rotary_factor=0.25,
        rope_theta=10_000.0,
        use_qkv_bias=False,
        qk_layernorm=True,
        use_parallel_residual=True,
        num_key_value_heads=1,
    )


def llama4_text() -> Any:
    # Llama 4 text: layers 0-2 RoPE (interleaved, complex) + L2 q/k norm + chunked attention
    # (chunks of 4), layer 3 NoPE full attention with the temperature tuning (floor_scale 2,
    # attn_scale 0.1: it varies within 7 tokens); llama3 scaling as Scout ships it; MoE on
    # layers 1 and 3 (interleave_moe_layer_step 2), 2 tiny experts top 1 + shared expert
    llama3 = {
        "rope_type": "llama3",
        "factor": 16.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
    }
    return tiny(
        "Llama4TextConfig",
        intermediate_size=16,
        intermediate_size_mlp=32,
        num_local_experts=2,
        num_experts_per_tok=1,
        interleave_moe_layer_step=2,
        no_rope_layer_interval=4,
        attention_chunk_size=fam.WINDOW,
        use_qk_norm=True,
        attn_temperature_tuning=True,
        floor_scale=2,
        attn_scale=0.1,
        rope_theta=500_000.0,
        rope_scaling=llama3,
        max_position_embeddings=131_072,
    )


def hunyuan_v1_dense() -> Any:
    # Hunyuan-7B: q/k RMSNorm per head after RoPE, rope_scaling "dynamic" with alpha (NTK alpha:
    # base * alpha ** (d / (d - 2))) and factor 1
    ntk = {
        "type": "dynamic",
        "alpha": 1000.0,
        "factor": 1.0,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    }
    return tiny(
        "HunYuanDenseV1Config",
        rope_scaling=ntk,
        rope_theta=10_000.0,
        use_qk_norm=True,
        use_cla=False,
        attention_head_dim=8,
    )


def gptj() -> Any:
    # GPT-J: rotary_dim 4 of head 16 (a quarter), interleaved pairs, parallel block, no biases
    sizes = {
        "vocab_size": 16,
        "n_embd": 32,
        "n_head": 2,
        "n_layer": LAYERS,
        "n_inner": 32,
        "n_positions": 32,
        "initializer_range": 0.4,
        "dtype": "float32",
        **fam.TOKENS,
    }
    return transformers.GPTJConfig(**sizes, rotary_dim=4)


def glm4_moe() -> Any:
    # GLM-4.5: partial_rotary_factor 0.5, q/k RMSNorm, attention biases, layer 0 dense
    # (first_k_dense_replace 1), layers 1-3: 4 experts in 1 group, top 2 by sigmoid +
    # e_score_correction_bias, renormalised, x 2.5, a shared expert; the MTP layer key
    return tiny(
        "Glm4MoeConfig",
        head_dim=8,
        num_key_value_heads=1,
        partial_rotary_factor=0.5,
        rope_theta=1_000_000.0,
        use_qk_norm=True,
        attention_bias=True,
        first_k_dense_replace=1,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        moe_intermediate_size=16,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        num_nextn_predict_layers=1,
    )


def ernie4_5_moe() -> Any:
    # ERNIE-4.5-21B-A3B: interleaved RoPE, layer 0 dense (moe_layer_start_index 1), layers 1-3:
    # 4 experts top 2 chosen by softmax + e_score_correction_bias (moe_use_aux_free), a shared
    # expert
    return tiny(
        "Ernie4_5_MoeConfig",
        head_dim=8,
        rope_theta=500_000.0,
        use_bias=False,
        moe_num_experts=4,
        moe_k=2,
        moe_num_shared_experts=1,
        moe_intermediate_size=16,
        moe_layer_start_index=1,
        moe_layer_interval=1,
        moe_use_aux_free=True,
        moe_gate="topk",
    )


def seed_oss() -> Any:
    # Seed-OSS-36B: q/k/v biases, no o_proj bias (attention_out_bias false), theta 1e7
    return tiny(
        "SeedOssConfig",
        head_dim=8,
        attention_bias=True,
        attention_out_bias=False,
        rope_theta=10_000_000.0,
        attention_dropout=0.1,
        residual_dropout=0.1,
    )


def apertus() -> Any:
    # Apertus-8B: xIELU MLP (up_proj -> xIELU -> down_proj), q/k RMSNorm, llama3 scaling
    llama3 = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    return tiny(
        "ApertusConfig",
        hidden_act="xielu",
        qk_norm=True,
        rope_theta=12_000_000.0,
        rope_scaling=llama3,
        max_position_embeddings=65_536,
    )


def ministral3() -> Any:
    # Ministral 3: yarn (factor 16 over an original 4) and llama_4_scaling_beta 0.1 in
    # rope_parameters: q * (1 + 0.1 * ln(1 + floor(pos / 4)))
    yarn = {
        "type": "yarn",
        "rope_theta": 1_000_000.0,
        "factor": 16.0,
        "original_max_position_embeddings": ORIGINAL,
        "max_position_embeddings": 64,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale_all_dim": 1.0,
        "mscale": 1.0,
        "llama_4_scaling_beta": 0.1,
    }
    return tiny("Ministral3Config", head_dim=8, max_position_embeddings=64, rope_parameters=yarn)


def olmo() -> Any:
    # OLMo with clip_qkv 0.5: q, k, v clamped to [-0.5, 0.5] before RoPE
    return tiny("OlmoConfig", clip_qkv=0.5)


CASES: dict[str, tuple[Callable[[], Any], str]] = {
    "phi3": (phi3, "Phi-4-mini: fused qkv, partial rotary 0.75, longrope past original 4"),
    "smollm3": (smollm3, "SmolLM3: layer 3 NoPE; use_sliding_window false, max_window_layers"),
    "cohere2": (cohere2, "Command R7B: layers 0-2 sliding (4) RoPE, layer 3 full NoPE"),
    "stablelm": (stablelm, "StableLM 2: per-head q/k LayerNorm, parallel residual, rotary 0.25"),
    "llama4_text": (
        llama4_text,
        "Llama 4: layers 0-2 chunked (4) RoPE + L2 qk norm, layer 3 NoPE with temperature; "
        "MoE on layers 1, 3",
    ),
    "hunyuan_v1_dense": (hunyuan_v1_dense, "Hunyuan: q/k norm after RoPE, NTK alpha 1000"),
    "gptj": (gptj, "GPT-J: rotary_dim 4 of 16, interleaved pairs, parallel block"),
    "glm4_moe": (glm4_moe, "GLM-4.5: rotary 0.5, qk norm, sigmoid router + bias, shared"),
    "ernie4_5_moe": (ernie4_5_moe, "ERNIE 4.5 MoE: interleaved RoPE, router bias, shared"),
    "seed_oss": (seed_oss, "Seed-OSS: q/k/v biases, no o bias, theta 1e7"),
    "apertus": (apertus, "Apertus: xIELU MLP, q/k RMSNorm, llama3 scaling"),
    "ministral3": (ministral3, "Ministral 3: yarn factor 16 over 4, llama_4_scaling_beta 0.1"),
    "olmo_clip": (olmo, "OLMo: clip_qkv 0.5 clamps q, k, v"),
}
# what perturb leaves at zero: the routers' correction biases (a buffer; a (1, experts) weight)
AFTER = {"glm4_moe": ("e_score_correction_bias",), "ernie4_5_moe": ("e_score_correction_bias",)}
ATTENTION = ["self_attn", "attn"]
# config.json as the flagship ships it where save_pretrained writes a derived form instead: Command
# R7B carries sliding_window_pattern, not layer_types (Cohere2Config pops the pattern and writes
# the layer_types it derives; the reload derives them again from the pattern)
SHIPPED: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "cohere2": ({"sliding_window_pattern": 4}, ("layer_types",)),
}


def as_shipped(folder: Path, case: str) -> None:
    add, drop = SHIPPED[case]
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config = {k: v for k, v in config.items() if k not in drop} | add
    path.write_text(json.dumps(dict(sorted(config.items())), indent=2) + "\n")


def run(folder: Path, ids: list[int]) -> dict[str, Any]:
    model = AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32, local_files_only=True
    ).eval()
    path, layers = fam.submodule(model, fam.LAYERS)
    entering: dict[int, torch.Tensor] = {}
    output: dict[int, torch.Tensor] = {}

    def pre(index: int) -> Callable[..., None]:
        def hook(_module, args, kwargs):  # type: ignore[no-untyped-def]
            hidden = args[0] if args else kwargs["hidden_states"]
            entering[index] = hidden.detach().clone()

        return hook

    def post(index: int) -> Callable[..., None]:
        def hook(_module, _args, out):  # type: ignore[no-untyped-def]
            output[index] = out[0].detach().clone()  # (attn_output, attn_weights)

        return hook

    handles = []
    for index in DEEP_LAYERS:
        layer = layers[index]
        handles.append(layer.register_forward_pre_hook(pre(index), with_kwargs=True))
        handles.append(fam.submodule(layer, ATTENTION)[1].register_forward_hook(post(index)))
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False)
    for h in handles:
        h.remove()
    assert len(out.attentions) == len(layers)
    return {
        "ids": ids,
        "layers_path": path,
        "layer_types": list(getattr(model.config, "layer_types", None) or []),
        "deep": {
            str(i): {
                "hidden": fam.floats(entering[i][0]),  # (T, hidden): entering layer i
                "attentions": fam.floats(out.attentions[i][0]),  # (heads, T, T)
                "attn_output": fam.floats(output[i][0]),  # (T, hidden): after o_proj
            }
            for i in DEEP_LAYERS
        },
        "logits": fam.floats(out.logits[0]),  # (T, vocab)
    }


def make(case: str) -> None:
    build, notes = CASES[case]
    folder = ROOT / case
    shutil.rmtree(folder, ignore_errors=True)
    torch.manual_seed(fam.SEED)
    model = AutoModelForCausalLM.from_config(build(), dtype=torch.float32).eval()
    fam.perturb(model)
    if case in AFTER:
        generator = torch.Generator().manual_seed(fam.SEED + 2)
        with torch.no_grad():
            for name, t in sorted([*model.named_parameters(), *model.named_buffers()]):
                if name.endswith(AFTER[case]):
                    t.add_(fam.NOISE * torch.randn(t.shape, generator=generator))
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "generation_config.json").unlink(missing_ok=True)
    if case in SHIPPED:
        as_shipped(folder, case)
    ids = fam.write_tokenizer(folder)
    result = run(folder, ids)
    assert result["layer_types"] == list(getattr(model.config, "layer_types", None) or [])
    data = {
        "made_by": "tests/reference/forward_2026.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "case": case,
        "model_type": model.config.model_type,
        "notes": notes,
        "text": fam.TEXT,
        **result,
    }
    lines = (f"{json.dumps(key)}: {json.dumps(value)}" for key, value in data.items())
    (folder / "reference.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")
    size = sum(p.stat().st_size for p in folder.iterdir())
    print(f"== {case}: {data['layers_path']}, {data['layer_types']}, {size:,} bytes")


def main() -> None:
    only = set(sys.argv[1:])
    for case in CASES:
        if not only or case in only:
            make(case)
    total = sum(p.stat().st_size for p in ROOT.rglob("*") if p.is_file())
    print(f"wrote {ROOT} ({total:,} bytes)")


if __name__ == "__main__":
    main()
