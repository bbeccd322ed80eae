"""Make tests/reference/forward/: tiny multi-layer checkpoints and transformers' whole forward.

Run ONCE, in a throwaway venv (torch and transformers are not dependencies of attn):

    /tmp/hfvenv/bin/python tests/reference/forward.py            # every case
    /tmp/hfvenv/bin/python tests/reference/forward.py llama gpt2 # or only some

For each case: a tiny random model (families.py's sizes and seeded noise on every 1-D parameter,
3 layers so that a layer's input comes through two whole blocks, MLP 32 wide) saved with
save_pretrained into forward/<case>/ with families.py's WordLevel tokenizer.json, loaded back
with eager attention and run on the ids of "a b c d e f g". reference.json holds, per layer, the
residual stream entering it (a forward pre-hook on the layer) and its attention weights
(output_attentions), and for decoders the logits at every position (the final norm and the LM
head). Floats are float32 values written as float64 reprs.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import families as fam
import torch
import transformers
from transformers import AutoModel, AutoModelForCausalLM

ROOT = Path(__file__).with_name("forward")
LAYERS = 3
DEEP = {"num_hidden_layers": LAYERS, "intermediate_size": 32}


def tiny(cls_name: str, **extra: Any) -> Any:
    return fam.tiny(cls_name, **{**DEEP, **extra})


def gpt2() -> Any:
    return transformers.GPT2Config(
        vocab_size=16,
        n_embd=16,
        n_head=2,
        n_layer=LAYERS,
        n_inner=32,
        n_positions=32,
        initializer_range=0.4,
        dtype="float32",
        **fam.TOKENS,
    )


def bert() -> Any:
    sizes = {k: v for k, v in fam.ROBERTA.items() if k not in ("pad_token_id",)}
    return transformers.BertConfig(
        **{**sizes, **DEEP, "max_position_embeddings": 32, "pad_token_id": 0}
    )


def gpt_neox(parallel: bool) -> Any:
    rope = {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.25}
    return lambda: tiny("GPTNeoXConfig", rope_parameters=rope, use_parallel_residual=parallel)


WINDOWED = {
    "sliding_window": fam.WINDOW,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
}
CASES: dict[str, tuple[Any, bool, str]] = {
    "bert": (bert, True, "BERT: post-norm, GELU MLP, learned positions, token type 0"),
    "gpt2": (gpt2, False, "GPT-2: Conv1D, gelu_new MLP, ln_f, tied LM head"),
    "llama": (lambda: tiny("LlamaConfig"), False, "SwiGLU, RMSNorm, untied LM head"),
    "qwen2": (lambda: tiny("Qwen2Config"), False, "q/k/v biases, SwiGLU, tied LM head"),
    "qwen3": (lambda: tiny("Qwen3Config"), False, "q/k RMSNorm per head"),
    "mistral": (
        lambda: tiny("MistralConfig", sliding_window=fam.WINDOW),
        False,
        "sliding window 4 on every layer",
    ),
    "gemma2": (
        lambda: tiny(
            "Gemma2Config",
            **WINDOWED,
            query_pre_attn_scalar=12,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
        ),
        False,
        "sandwich norms, softcaps, GeGLU (gelu tanh), sqrt(hidden) embeddings",
    ),
    "gemma3_text": (
        lambda: tiny("Gemma3TextConfig", **WINDOWED, query_pre_attn_scalar=12),
        False,
        "sandwich norms, q/k norm 1 + w, RoPE per layer type",
    ),
    "olmo2": (lambda: tiny("Olmo2Config"), False, "norms after attention and MLP only"),
    "phi3": (lambda: tiny("Phi3Config"), False, "fused qkv_proj and gate_up_proj"),
    "gpt_neox": (gpt_neox(True), False, "parallel residual, partial RoPE, GELU MLP"),
    "gpt_neox_seq": (gpt_neox(False), False, "use_parallel_residual false"),
    "mixtral": (
        lambda: tiny("MixtralConfig", num_local_experts=4, num_experts_per_tok=2),
        False,
        "4 experts, top 2, renormalised",
    ),
    "qwen3_moe": (
        lambda: tiny(
            "Qwen3MoeConfig",
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            norm_topk_prob=True,
        ),
        False,
        "4 experts, top 2, norm_topk_prob true",
    ),
    "qwen2_moe": (
        lambda: tiny(
            "Qwen2MoeConfig",
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=16,
            mlp_only_layers=[1],
        ),
        False,
        "4 experts, top 2, not renormalised; gated shared expert; layer 1 dense",
    ),
}


# --- fwd-dense-b: StarCoder2, StableLM, Phi, Cohere, DistilBERT -------------------------------


def distilbert() -> Any:
    sizes = {
        "vocab_size": 16,
        "dim": 16,
        "n_heads": 2,
        "n_layers": LAYERS,
        "hidden_dim": 32,
        "max_position_embeddings": 32,
        "initializer_range": 0.4,
        "dtype": "float32",
    }
    return transformers.DistilBertConfig(**sizes, sinusoidal_pos_embds=False, pad_token_id=0)


def stablelm(parallel: bool) -> Any:
    return lambda: tiny(
        "StableLmConfig",
        partial_rotary_factor=0.25,
        use_qkv_bias=True,
        qk_layernorm=False,
        use_parallel_residual=parallel,
    )


def phi() -> Any:
    rope = {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5}
    return tiny("PhiConfig", rope_parameters=rope, qk_layernorm=False)


CASES.update(
    {
        "starcoder2": (
            lambda: tiny("Starcoder2Config", sliding_window=fam.WINDOW, use_bias=True),
            False,
            "LayerNorm with bias, c_fc/c_proj gelu_pytorch_tanh "
            "MLP with biases, window 4, tied head",
        ),
        "stablelm": (
            stablelm(False),
            False,
            "use_parallel_residual false: post_attention_layernorm "
            "before a SwiGLU MLP; partial RoPE 0.25, q/k/v biases, untied head",
        ),
        "stablelm_parallel": (
            stablelm(True),
            False,
            "use_parallel_residual true: attention and MLP "
            "both from input_layernorm, no post_attention_layernorm",
        ),
        "phi": (
            phi,
            False,
            "one LayerNorm feeding attention and a gelu_new fc1/fc2 MLP in parallel; "
            "final_layernorm, LM head with bias",
        ),
        "cohere": (
            lambda: tiny("CohereConfig", use_qk_norm=False, logit_scale=0.25),
            False,
            "parallel block from one bias-free LayerNorm, SwiGLU, "
            "interleaved RoPE, logit_scale 0.25",
        ),
        "distilbert": (
            distilbert,
            True,
            "post-norm sa_layer_norm / output_layer_norm, lin1/lin2 "
            "GELU MLP, learned positions from 0, no token types, no LM head",
        ),
    }
)


# Dense decoders whose blocks differ from Llama's in norms, multipliers or MLP (issue 25).
NOPE_MIDDLE = {
    "no_rope_layers": [1, 0, 1],
    "use_sliding_window": True,
    "sliding_window": fam.WINDOW,
}
CASES.update(
    {
        "ministral": (
            lambda: tiny("MinistralConfig", **WINDOWED),
            False,
            "Llama's block; layers 0 and 2 sliding_attention (window 4), layer 1 full",
        ),
        "smollm3": (
            lambda: tiny("SmolLM3Config", **NOPE_MIDDLE, mlp_bias=True),
            False,
            "layer 1 NoPE and sliding (window 4), layers 0 and 2 RoPE; MLP biases; tied",
        ),
        "olmo": (
            lambda: tiny("OlmoConfig"),
            False,
            "LayerNorm without weight or bias (eps 1e-5) before attention, MLP, LM head",
        ),
        "olmo3": (
            lambda: tiny("Olmo3Config", **WINDOWED),
            False,
            "norms after attention and MLP only; layers 0 and 2 sliding (window 4)",
        ),
        "exaone4": (
            lambda: tiny("Exaone4Config", **WINDOWED),
            False,
            "norms after attention and MLP only; layer 1 full_attention NoPE",
        ),
        "granite": (
            lambda: tiny(
                "GraniteConfig",
                attention_multiplier=0.3,
                embedding_multiplier=2.0,
                residual_multiplier=0.5,
                logits_scaling=4.0,
            ),
            False,
            "embeddings x 2, both residual branches x 0.5, logits / 4, scale 0.3",
        ),
        "glm4": (
            lambda: tiny("Glm4Config", attention_bias=True),
            False,
            "four norms (input, post_self_attn, post_attention, post_mlp); fused gate_up_proj",
        ),
        "ernie4_5": (
            lambda: tiny("Ernie4_5Config", use_bias=True),
            False,
            "use_bias: q/k/v/o and gate/up/down biases; interleaved RoPE; tied LM head",
        ),
    }
)


# ---- the mixture-of-experts families of issue 25's third group (fwd-moe) --------------------


def qwen3_next() -> Any:
    # layers 0 and 2 linear_attention (Gated DeltaNet: 4 value heads over 2 key heads), layer 1
    # full (gated) attention with its 2 heads; layers 0 and 1 a mixture (4 experts, top 2,
    # renormalised, a gated shared expert), layer 2 dense (mlp_only_layers)
    return tiny(
        "Qwen3NextConfig",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        mlp_only_layers=[2],
        norm_topk_prob=True,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=4,
        linear_value_head_dim=4,
    )


def gpt_oss() -> Any:
    # 4 experts top 2 (softmax over the top-2 router logits, with the router's bias), biases on
    # every expert, the clamped swiglu with limit 1.5 (so that the clamps bite: gate_up values
    # of a few units) and alpha 1.702; sinks; layers 0, 2 sliding (window 4), 1 full; the yarn
    # rope GptOssConfig sets
    return tiny(
        "GptOssConfig", num_local_experts=4, num_experts_per_tok=2, swiglu_limit=1.5, **WINDOWED
    )


def deepseek_v3() -> Any:
    # families.py's multi-head latent attention sizes; layer 0 dense (first_k_dense_replace 1),
    # layers 1, 2 a mixture: 8 experts in 4 groups, the 2 best groups, top 2 of their experts by
    # sigmoid + e_score_correction_bias (seeded noise), renormalised, times 2.5; 1 shared expert
    return tiny(
        "DeepseekV3Config",
        num_key_value_heads=2,
        q_lora_rank=12,
        kv_lora_rank=8,
        qk_nope_head_dim=4,
        qk_rope_head_dim=4,
        v_head_dim=4,
        first_k_dense_replace=1,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=4,
        topk_group=2,
        moe_intermediate_size=16,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
    )


def noise_on(model: Any, suffixes: tuple[str, ...]) -> None:
    """Seeded noise on the tensors perturb leaves (2-D biases, buffers) whose names end so."""
    generator = torch.Generator().manual_seed(fam.SEED + 2)
    with torch.no_grad():
        for name, t in sorted([*model.named_parameters(), *model.named_buffers()]):
            if name.endswith(suffixes):
                t.add_(fam.NOISE * torch.randn(t.shape, generator=generator))


CASES |= {
    "qwen3_next": (
        qwen3_next,
        False,
        "hybrid: Gated DeltaNet layers 0, 2 (no softmax map: attentions null), gated full "
        "attention layer 1; 4 experts top 2 renormalised, gated shared expert; layer 2 dense",
    ),
    "gpt_oss": (
        gpt_oss,
        False,
        "4 experts top 2 with biases, clamped swiglu (limit 1.5), router bias, sinks, "
        "sliding/full/sliding, yarn",
    ),
    "deepseek_v3": (
        deepseek_v3,
        False,
        "MLA; layer 0 dense; 8 experts in 4 groups, top 2 groups, top 2, sigmoid + "
        "e_score_correction_bias, renormalised, x 2.5; a shared expert",
    ),
}


def deepseek_v2() -> Any:
    # DeepSeek V2 (V2-Lite's shape: q_proj, no q LoRA; RoPE pairs in place): layer 0 dense, layers
    # 1, 2 a mixture of 8 experts in 4 groups, group_limited_greedy (the best group by its best
    # softmax score: with top 2, two groups could never change the choice), top 2, not
    # renormalised, times 1.5; 2 shared experts
    return tiny(
        "DeepseekV2Config",
        num_key_value_heads=2,
        q_lora_rank=None,
        kv_lora_rank=8,
        qk_nope_head_dim=4,
        qk_rope_head_dim=4,
        v_head_dim=4,
        first_k_dense_replace=1,
        n_routed_experts=8,
        n_shared_experts=2,
        num_experts_per_tok=2,
        topk_method="group_limited_greedy",
        n_group=4,
        topk_group=1,
        moe_intermediate_size=8,
        routed_scaling_factor=1.5,
    )


CASES |= {
    "deepseek_v2": (
        deepseek_v2,
        False,
        "MLA with q_proj and RoPE pairs in place; layer 0 dense; 8 experts in 4 groups, the "
        "best group by its best softmax score, top 2, not renormalised, x 1.5; 2 shared",
    ),
    "cohere2": (
        lambda: tiny("Cohere2Config", logit_scale=0.25, **WINDOWED),
        False,
        "Cohere's parallel block; layers 0, 2 sliding (window 4, RoPE), layer 1 full (no RoPE); "
        "logit_scale 0.25",
    ),
}
# what perturb leaves at zero: the experts' biases (2-D), e_score_correction_bias (a buffer)
AFTER = {"gpt_oss": ("_proj_bias",), "deepseek_v3": ("e_score_correction_bias",)}


def run(folder: Path, encoder: bool, ids: list[int]) -> dict[str, Any]:
    auto = AutoModel if encoder else AutoModelForCausalLM
    model = auto.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32, local_files_only=True
    ).eval()
    path, layers = fam.submodule(model, fam.LAYERS)
    entering: list[torch.Tensor] = []

    def hook(_module, args, kwargs):  # type: ignore[no-untyped-def]
        hidden = args[0] if args else kwargs["hidden_states"]
        entering.append(hidden.detach().clone())

    handles = [layer.register_forward_pre_hook(hook, with_kwargs=True) for layer in layers]
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False)
    for h in handles:
        h.remove()
    assert len(entering) == len(layers)
    # a hybrid model (qwen3_next) records attentions for its softmax layers only: null for the
    # others (linear attention has no softmax map)
    kinds = getattr(model.config, "layer_types", None) or ["full_attention"] * len(layers)
    softmax = [k != "linear_attention" for k in kinds]
    assert len(out.attentions) == sum(softmax)
    maps = iter(out.attentions)
    result: dict[str, Any] = {
        "ids": ids,
        "layers_path": path,
        "hidden": [fam.floats(h[0]) for h in entering],  # per layer (T, hidden)
        # per layer (heads, T, T), or null
        "attentions": [fam.floats(next(maps)[0]) if s else None for s in softmax],
    }
    if not encoder:
        result["logits"] = fam.floats(out.logits[0])  # (T, vocab)
    return result


def make(case: str) -> None:
    build, encoder, notes = CASES[case]
    folder = ROOT / case
    shutil.rmtree(folder, ignore_errors=True)
    torch.manual_seed(fam.SEED)
    auto = AutoModel if encoder else AutoModelForCausalLM
    model = auto.from_config(build(), dtype=torch.float32).eval()
    fam.perturb(model)
    if case in AFTER:
        noise_on(model, AFTER[case])
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "generation_config.json").unlink(missing_ok=True)
    ids = fam.write_tokenizer(folder)
    data = {
        "made_by": "tests/reference/forward.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "case": case,
        "notes": notes,
        "text": fam.TEXT,
        **run(folder, encoder, ids),
    }
    lines = (f"{json.dumps(key)}: {json.dumps(value)}" for key, value in data.items())
    (folder / "reference.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"== {case}: {data['layers_path']}, {len(data['hidden'])} layers")


def main() -> None:
    only = set(sys.argv[1:])
    for case in CASES:
        if not only or case in only:
            make(case)
    total = sum(p.stat().st_size for p in ROOT.rglob("*") if p.is_file())
    print(f"wrote {ROOT} ({total:,} bytes)")


if __name__ == "__main__":
    main()
