"""Make arch_configs.json: config.json and layer 0's tensor names as transformers saves them.

Run once, in a throwaway venv (not a dependency of attn):

    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install transformers torch safetensors
    /tmp/hfvenv/bin/python tests/reference/arch_configs.py

Each family's tiny model is built from its config class (transformers 5.24.0) and saved with
save_pretrained; tests/io/test_import_arch.py writes random tensors under the saved names and
shapes.
"""

import json
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
TINY = {
    "vocab_size": 9,
    "hidden_size": 8,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 16,
    "max_position_embeddings": 16,
    **TOKENS,
}
ENCODER = {
    "vocab_size": 9,
    "hidden_size": 8,
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 16,
    "max_position_embeddings": 16,
}
ROBERTA = {**ENCODER, "pad_token_id": 1, "max_position_embeddings": 18}
NO_GQA = {k: v for k, v in TINY.items() if k not in ("num_key_value_heads", "head_dim")}
SIZES = {
    "bert": ENCODER,
    "roberta": ROBERTA,
    "xlm-roberta": ROBERTA,
    "distilbert": {
        "vocab_size": 9,
        "dim": 8,
        "n_heads": 2,
        "n_layers": 2,
        "hidden_dim": 16,
        "max_position_embeddings": 16,
    },
    "gpt2": {
        "vocab_size": 9,
        "n_embd": 8,
        "n_head": 2,
        "n_layer": 2,
        "n_positions": 16,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "qwen3_moe": {**TINY, "moe_intermediate_size": 8, "num_experts": 2, "num_experts_per_tok": 1},
    "mixtral": {**TINY, "num_local_experts": 2, "num_experts_per_tok": 1},
    "gpt_oss": {**TINY, "num_local_experts": 2, "num_experts_per_tok": 1},
    "smollm3": {**TINY, "no_rope_layer_interval": 2},
    "gpt_neox": NO_GQA,
    "phi3": {k: v for k, v in TINY.items() if k != "head_dim"},
}
FAMILIES = [
    "bert",
    "gpt2",
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma2",
    "gpt_oss",
    "roberta",
    "xlm-roberta",
    "distilbert",
    "gemma3_text",
    "cohere2",
    "ernie4_5",
    "granite",
    "qwen3_moe",
    "smollm3",
    "starcoder2",
    "mixtral",
    "olmo2",
    "phi3",
    "gpt_neox",
]
ENCODERS = ("bert", "roberta", "xlm-roberta", "distilbert")


def saved(model_type: str) -> dict[str, object]:
    """config.json and {tensor name: shape} of layer 0 and the embeddings, as saved."""
    config = AutoConfig.for_model(model_type, **SIZES.get(model_type, TINY))
    model = (AutoModel if model_type in ENCODERS else AutoModelForCausalLM).from_config(config)
    folder = Path(tempfile.mkdtemp())
    model.save_pretrained(folder)
    tensors = {}
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        for name in f.keys():  # noqa: SIM118  (a safe_open handle is not a mapping)
            if ".1." not in name and not name.startswith(("lm_head", "embed_out")):
                tensors[name] = list(f.get_slice(name).get_shape())
    return {"config": json.loads((folder / "config.json").read_text()), "tensors": tensors}


if __name__ == "__main__":
    torch.manual_seed(0)
    out = {m: saved(m) for m in FAMILIES}
    path = Path(__file__).with_name("arch_configs.json")
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
