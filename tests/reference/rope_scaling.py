"""Make tests/reference/rope_scaling/: tiny checkpoints with scaled RoPE and transformers' numbers.

Run ONCE, in a throwaway venv (torch and transformers are not dependencies of attn):

    python3 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install transformers==5.24.0 torch==2.13.0 safetensors
    /tmp/hfvenv/bin/python tests/reference/rope_scaling.py

For each case (issue 23: RoPE scaling) the script builds a tiny random model from its config class
(transformers 5.24.0, float32, torch.manual_seed), saves it with save_pretrained into
rope_scaling/<case>/ (config.json + model.safetensors), loads it back with eager attention, feeds a
seeded residual stream h (T, hidden) as inputs_embeds and records, for layer 0, what transformers
computed: the self_attn output (after o_proj, before the residual add), q and k after RoPE, the
attention weights, the mask, and the rotary inv_freq / attention_scaling in force after the forward.
Each run reloads the checkpoint, so dynamic / longrope state never leaks from one run to the next.
rope_scaling/<case>/reference.json holds the numbers (float32 values written as float64 reprs).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"  # tiny models from config classes only: never the network
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GptOssConfig,
    LlamaConfig,
    Phi3Config,
    Qwen2Config,
)

ROOT = Path(__file__).with_name("rope_scaling")
SEED = 0
TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
TINY = {
    "vocab_size": 9,
    "hidden_size": 8,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 4,
    "num_hidden_layers": 1,
    "intermediate_size": 16,
    "dtype": "float32",
    "initializer_range": 0.4,
    **TOKENS,
}
# initializer_range 0.4, not 0.02: q.k logits of a few units, so RoPE visibly moves the weights
WIDE = {**TINY, "hidden_size": 16, "head_dim": 8}  # 4 rotary pairs: room for llama3 / yarn bands
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}
LLAMA3_THETA = 500000.0
SHORT = [1.0, 1.5, 2.0, 2.5]  # phi3 longrope, head_dim 8: 4 pairs
LONG = [3.0, 4.5, 6.0, 8.0]


def llama_linear() -> Any:
    rope = {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
    return LlamaConfig(**TINY, max_position_embeddings=16, rope_parameters=rope)


def llama_dynamic() -> Any:
    rope = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    return LlamaConfig(**TINY, max_position_embeddings=4, rope_parameters=rope)


def llama3() -> Any:
    rope = {**LLAMA3, "rope_theta": LLAMA3_THETA}
    return LlamaConfig(**WIDE, max_position_embeddings=2048, rope_parameters=rope)


def qwen2_yarn() -> Any:
    rope = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 256,
        "rope_theta": 10000.0,
    }
    return Qwen2Config(**WIDE, max_position_embeddings=1024, rope_parameters=rope)


def gpt_oss_yarn() -> Any:
    # rope_parameters, rope_theta (150000) and max_position_embeddings (131072) stay GptOssConfig's
    # defaults; sizes are tiny, and the sliding window shrinks to 4 so that it cuts a 7-token run.
    sizes = {**WIDE, "num_local_experts": 2, "num_experts_per_tok": 1, "sliding_window": 4}
    return GptOssConfig(**sizes)


def phi3_longrope() -> Any:
    rope = {
        "rope_type": "longrope",
        "short_factor": SHORT,
        "long_factor": LONG,
        "original_max_position_embeddings": 4,
    }
    sizes = {k: v for k, v in TINY.items() if k != "head_dim"} | {"hidden_size": 16}
    # Phi3Config's own top-level original_max_position_embeddings (default 4096) overrides the one
    # inside rope_parameters (standardize_rope_params), so it must be set too.
    return Phi3Config(
        **sizes,
        max_position_embeddings=16,
        original_max_position_embeddings=4,
        rope_parameters=rope,
    )


# case: (config builder, run lengths T, notes)
CASES: dict[str, tuple[Callable[[], Any], list[int], str]] = {
    "llama_linear": (llama_linear, [7], "linear (position interpolation): inv_freq = default / 4"),
    "llama_dynamic": (
        llama_dynamic,
        [7, 3],
        "dynamic NTK: T=7 > max_position_embeddings=4 gives base' = base * "
        "(factor*T/max_pos - (factor-1))**(dim/(dim-2)) = 10000 * 2.5**2; "
        "T=3 <= 4 keeps the default inv_freq",
    ),
    "llama3_legacy": (
        llama3,
        [7],
        "llama3 in the transformers-4 spelling (top-level rope_theta + rope_scaling, "
        "config.json rewritten after save_pretrained); same weights and numbers as "
        "llama3_params",
    ),
    "llama3_params": (llama3, [7], "llama3 in transformers 5's spelling (rope_parameters)"),
    "qwen2_yarn": (
        qwen2_yarn,
        [7],
        "yarn, truncate default (true): correction range floor/ceil, partial ramp on "
        "some pairs; attention_scaling = 0.1*ln(4)+1 multiplies cos and sin",
    ),
    "gpt_oss_yarn": (
        gpt_oss_yarn,
        [7],
        "gpt-oss yarn (factor 32, beta 32/1, truncate false: fractional correction "
        "range), attention sinks, q/k/v/o biases; layer 0 is sliding_attention with "
        "sliding_window 4 (key j visible from query i iff i-4 < j <= i)",
    ),
    "phi3_longrope": (
        phi3_longrope,
        [7, 3],
        "longrope: T=7 > original 4 uses long_factor, T=3 uses short_factor; "
        "attention_scaling = sqrt(1 + ln(16/4)/ln(4)) in both runs (it depends on "
        "max_position_embeddings / original, not on T); fused qkv_proj",
    ),
}


def floats(x: torch.Tensor) -> Any:
    """float32 tensor -> nested lists of python floats (exact float64 values of the float32s)."""
    return x.detach().to(torch.float64).cpu().tolist()


def write_legacy(folder: Path) -> Any:
    """Rewrite config.json in the transformers-4 spelling: rope_theta + rope_scaling."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    params = config.pop("rope_parameters")
    config["rope_theta"] = params.pop("rope_theta")
    config["rope_scaling"] = {k: params[k] for k in LLAMA3}
    assert params.keys() <= {*LLAMA3, "partial_rotary_factor"}, params
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return config


def run(folder: Path, T: int) -> dict[str, Any]:
    """Layer 0's attention as transformers computes it, for a seeded h of T tokens."""
    model = AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32, local_files_only=True
    ).eval()
    layer = model.model.layers[0]
    modeling: Any = sys.modules[type(layer.self_attn).__module__]
    seen: dict[str, Any] = {}

    def layer_input(_module, args, kwargs):  # type: ignore[no-untyped-def]
        seen["layer_in"] = (args[0] if args else kwargs["hidden_states"]).detach().clone()

    def attn_in(_module, args, kwargs):  # type: ignore[no-untyped-def]
        seen["cos_sin"] = kwargs["position_embeddings"]

    def attn_out(_module, _args, output):  # type: ignore[no-untyped-def]
        seen["out"] = output[0].detach().clone()

    eager = modeling.eager_attention_forward

    def spy(module, query, key, value, attention_mask, **kwargs):  # type: ignore[no-untyped-def]
        out, weights = eager(module, query, key, value, attention_mask, **kwargs)
        if module.layer_idx == 0:
            seen.update(q=query, k=key, mask=attention_mask, weights=weights)
        return out, weights

    handles = [
        layer.register_forward_pre_hook(layer_input, with_kwargs=True),
        layer.self_attn.register_forward_pre_hook(attn_in, with_kwargs=True),
        layer.self_attn.register_forward_hook(attn_out),
    ]
    modeling.eager_attention_forward = spy
    hidden = model.config.hidden_size
    h = torch.randn(T, hidden, generator=torch.Generator().manual_seed(1000 + T))
    try:
        with torch.no_grad():
            model(inputs_embeds=h[None], position_ids=torch.arange(T)[None], use_cache=False)
    finally:
        modeling.eager_attention_forward = eager
        for handle in handles:
            handle.remove()
    assert torch.equal(seen["layer_in"][0], h), "layer 0's input is not inputs_embeds"
    rotary = model.model.rotary_emb
    inv_freq, scaling = rotary.inv_freq.detach().clone(), float(rotary.attention_scaling)
    # cos / sin really are positions * inv_freq, times attention_scaling
    cos, sin = seen["cos_sin"]
    angles = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]
    n = inv_freq.numel()
    assert torch.allclose(cos[0, :, :n], angles.cos() * scaling, atol=1e-6)
    assert torch.allclose(sin[0, :, :n], angles.sin() * scaling, atol=1e-6)
    mask = seen["mask"]
    allowed = torch.ones(T, T, dtype=torch.bool) if mask is None else mask[0, 0] == 0
    return {
        "T": T,
        "h": floats(h),
        "output": floats(seen["out"][0]),
        "inv_freq": floats(inv_freq),
        "attention_scaling": scaling,
        "q": floats(seen["q"][0]),  # (heads, T, head_dim), after RoPE, before the 1/sqrt(d) scale
        "k": floats(seen["k"][0]),  # (kv_heads, T, head_dim), after RoPE, before repeat_kv
        "weights": floats(seen["weights"][0]),  # (heads, T, T), softmax (sink column dropped)
        "mask": allowed.to(torch.int64).tolist(),  # (T, T): 1 where query i may see key j
    }


def bands(config: Any) -> list[str]:
    """Which llama3 band each rotary pair falls in (computed here, in float64)."""
    rope = config.rope_parameters
    d = config.head_dim
    wavelens = [2 * math.pi * rope["rope_theta"] ** (2 * i / d) for i in range(d // 2)]
    orig = rope["original_max_position_embeddings"]
    high, low = orig / rope["high_freq_factor"], orig / rope["low_freq_factor"]
    return ["kept" if w < high else "scaled" if w > low else "smoothed" for w in wavelens]


def yarn_ramp(config: Any) -> tuple[float, float, list[float]]:
    """yarn's correction range and the interpolation weight of each pair (0 kept, 1 scaled)."""
    rope = config.rope_parameters
    dim, base, orig = config.head_dim, rope["rope_theta"], rope["original_max_position_embeddings"]

    def corr(rot: float) -> float:
        return float(dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base)))

    low, high = corr(rope.get("beta_fast") or 32), corr(rope.get("beta_slow") or 1)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = [min(max((i - low) / (high - low), 0.0), 1.0) for i in range(dim // 2)]
    return low, high, ramp


def expected(config: Any, T: int) -> Any:
    """inv_freq and attention_scaling re-derived here in float64, from the papers' formulas."""
    rope = config.rope_parameters
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    base, kind = rope["rope_theta"], rope["rope_type"]
    plain = [base ** (-2 * i / dim) for i in range(dim // 2)]
    if kind == "linear":
        return [f / rope["factor"] for f in plain], 1.0
    if kind == "dynamic":
        max_pos = config.max_position_embeddings
        grow = rope["factor"] * max(T, max_pos) / max_pos
        base = base * (grow - (rope["factor"] - 1)) ** (dim / (dim - 2))
        return [base ** (-2 * i / dim) for i in range(dim // 2)], 1.0
    if kind == "llama3":
        factor, orig = rope["factor"], rope["original_max_position_embeddings"]
        lo, hi = rope["low_freq_factor"], rope["high_freq_factor"]
        out = []
        for f, band in zip(plain, bands(config), strict=True):
            smooth = (orig * f / (2 * math.pi) - lo) / (hi - lo)
            out.append(
                {
                    "kept": f,
                    "scaled": f / factor,
                    "smoothed": (1 - smooth) * f / factor + smooth * f,
                }[band]
            )
        return out, 1.0
    if kind == "yarn":
        ramp = yarn_ramp(config)[2]
        out = [f * (1 - r) + f / rope["factor"] * r for f, r in zip(plain, ramp, strict=True)]
        return out, 0.1 * math.log(rope["factor"]) + 1
    if kind == "longrope":
        orig = rope["original_max_position_embeddings"]
        ext = rope["short_factor"] if orig >= T else rope["long_factor"]
        ratio = config.max_position_embeddings / orig
        scaling = math.sqrt(1 + math.log(ratio) / math.log(orig))
        return [f / e for f, e in zip(plain, ext, strict=True)], scaling
    raise ValueError(kind)


def make(case: str, build: Callable[[], Any], lengths: list[int], notes: str) -> None:
    folder = ROOT / case
    shutil.rmtree(folder, ignore_errors=True)
    torch.manual_seed(SEED)
    config = build()
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "generation_config.json").unlink(missing_ok=True)
    saved = json.loads((folder / "config.json").read_text())
    if case == "llama3_legacy":
        assert "rope_parameters" in saved, "save_pretrained no longer writes rope_parameters"
        saved = write_legacy(folder)
    reloaded = AutoConfig.from_pretrained(folder, local_files_only=True)
    assert reloaded.rope_parameters == config.rope_parameters, (reloaded.rope_parameters, config)
    layer_type = (getattr(config, "layer_types", None) or ["full_attention"])[0]
    runs = [run(folder, T) for T in lengths]
    for r in runs:  # transformers agrees with the formulas (float32 vs float64)
        inv_freq, scaling = expected(reloaded, r["T"])
        pairs = zip(r["inv_freq"], inv_freq, strict=True)
        assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in pairs), (r["inv_freq"], inv_freq)
        assert math.isclose(r["attention_scaling"], scaling, rel_tol=1e-12), (r, scaling)
    data = {
        "made_by": "tests/reference/rope_scaling.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "case": case,
        "layer_type": layer_type,
        "rope_parameters": reloaded.rope_parameters,  # as transformers reads config.json back
        "notes": notes,
        "runs": runs,
    }
    lines = (f"{json.dumps(key)}: {json.dumps(value)}" for key, value in data.items())
    (folder / "reference.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")  # one key a line

    keys = ("rope_parameters", "rope_scaling", "rope_theta", "original_max_position_embeddings")
    rope_saved = {k: saved[k] for k in keys if k in saved}
    print(f"== {case}: layer 0 {layer_type}; saved {json.dumps(rope_saved)}")
    for r in runs:
        print(f"   T={r['T']}: attention_scaling={r['attention_scaling']!r}", end=" ")
        print(f"inv_freq={r['inv_freq']}")
    if case.startswith("llama3"):
        print(f"   llama3 bands: {bands(config)}")
    if "yarn" in case:
        low, high, ramp = yarn_ramp(config)
        print(f"   yarn correction range [{low}, {high}], interpolation weight per pair {ramp}")


def main() -> None:
    for case, (build, lengths, notes) in CASES.items():
        make(case, build, lengths, notes)
    legacy, params = (
        json.loads((ROOT / c / "reference.json").read_text())
        for c in ("llama3_legacy", "llama3_params")
    )
    assert legacy["runs"] == params["runs"], "the two llama3 spellings disagree"
    total = sum(p.stat().st_size for p in ROOT.rglob("*") if p.is_file())
    print(f"wrote {ROOT} ({total:,} bytes)")


if __name__ == "__main__":
    main()
