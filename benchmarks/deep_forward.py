"""The deep forward at transformers' cost (issue 41): ``attn import CKPT --text TEXT --layer 15
-o OUT.npz`` against transformers' CPU forward of the same text, as whole processes.

    /work/venvs/bench-hf/bin/python benchmarks/deep_forward.py            # quiet
    /work/venvs/bench-hf/bin/python benchmarks/deep_forward.py --busy     # a core kept busy

Run it with an interpreter that imports attn, torch, transformers 5.25, safetensors and
tokenizers (a throwaway venv: torch and transformers are not attn's dependencies). The
checkpoint is made on first use (``--checkpoint``, /tmp/attn-deep-forward by default; never
committed): a TinyLlama-shaped LlamaForCausalLM (hidden 2048, MLP 5632, 32 heads, 4 KV heads,
head_dim 64, vocab 32000, 16 layers) with transformers' own random init, saved by
``save_pretrained`` in bfloat16 (about 1.7 GB), with a WordLevel tokenizer.json of words
``w0`` .. ``w31998`` and a text of 256 of them.

attn's side is the command above, its whole process; transformers' is a script that loads the
checkpoint in float32 with eager attention and runs the whole model on the same ids with
``output_hidden_states``, capturing the input of layer 15's attention (after its RMSNorm). Both
are started, timed and measured (peak RSS from wait4) by bench.py's launcher, alternating,
median of ``--reps`` paired rounds; the largest difference of attn's X (the same normalised
input, from its npz) from transformers' is printed, relative to X's largest value. The time
ratio is attn's whole process over transformers' whole process: what a person waits for either
way, and what issue 41's 1.04x was (d1ccf6a, quiet, 2026-12-08: attn 10.62 s, 715 MB, against
transformers' 9.69 s; against its forward alone, 3.10 s, that tree was 3.4x). The ratio to
transformers' forward alone (timed inside its process, the loading left out) is printed beside.
Target (issue 41): the first ratio <= 1.0, quiet and busy, and about 0.15 of transformers' peak
memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import ROOT, Run, child_env, measure, spinning

LAYER, TOKENS = 15, 256
SHAPE = {
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": 32000,
    "num_hidden_layers": 16,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}

MAKE = """\
import json, sys
from pathlib import Path
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import LlamaConfig, LlamaForCausalLM
folder, shape = Path(sys.argv[1]), json.loads(sys.argv[2])
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(**shape)).to(torch.bfloat16).eval()
model.save_pretrained(folder, safe_serialization=True)
(folder / "generation_config.json").unlink(missing_ok=True)
vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(shape["vocab_size"] - 1)}}
tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
tokenizer.pre_tokenizer = Whitespace()
tokenizer.save(str(folder / "tokenizer.json"))
"""

TRANSFORMERS = """\
import sys, time
import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM
folder, text, layer, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
ids = Tokenizer.from_file(f"{folder}/tokenizer.json").encode(text).ids
model = AutoModelForCausalLM.from_pretrained(
    folder, attn_implementation="eager", dtype=torch.float32, local_files_only=True
).eval()
seen = {}
def hook(_module, args, kwargs):
    seen["X"] = (args[0] if args else kwargs["hidden_states"])[0].detach().clone()
model.model.layers[layer].self_attn.register_forward_pre_hook(hook, with_kwargs=True)
start = time.perf_counter()
with torch.no_grad():
    hidden = model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
forward = time.perf_counter() - start
np.savez(out, X=seen["X"].numpy(), forward=forward)
"""


def text_of(tokens: int) -> str:
    """``tokens`` words of the checkpoint's vocabulary, spread over it (one id each)."""
    return " ".join(f"w{(i * 7919) % (SHAPE['vocab_size'] - 1)}" for i in range(tokens))


def make_checkpoint(folder: Path, python: str) -> None:
    if (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists():
        return
    print(f"making {folder} (transformers' random init, saved in bfloat16) ...", flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([python, "-c", MAKE, str(folder), json.dumps(SHAPE)], check=True)


def largest_difference(attn: Path, reference: Path) -> tuple[float, float]:
    """attn's X against transformers': the largest absolute difference over X's largest value,
    and transformers' forward-only seconds."""
    import numpy as np

    with np.load(attn) as a, np.load(reference) as r:
        ours, ref = a["X"], r["X"]  # (T, C) both
        worst = float(np.abs(ours - ref).max() / np.abs(ref).max())
        return worst, float(r["forward"])


def run_pair(folder: Path, reps: int, python: str) -> dict[str, float]:
    env = child_env()
    text = text_of(TOKENS)
    with tempfile.TemporaryDirectory() as tmp:
        out = {side: Path(tmp) / f"{side}.npz" for side in ("attn", "transformers")}
        sides = {
            "attn": [
                sys.executable,
                "-m",
                "attn_cli",
                "import",
                str(folder),
                "--text",
                text,
                "--layer",
                str(LAYER),
                "-o",
                str(out["attn"]),
                "--force",
            ],
            "transformers": [
                python,
                "-c",
                TRANSFORMERS,
                str(folder),
                text,
                str(LAYER),
                str(out["transformers"]),
            ],
        }
        runs: dict[str, list[Run]] = {name: [] for name in sides}
        forward: list[float] = []
        for _ in range(reps):  # paired rounds: each side once a round
            for name, cmd in sides.items():
                runs[name].append(measure(cmd, env))
            diff, seconds = largest_difference(out["attn"], out["transformers"])
            forward.append(seconds)
    med = statistics.median
    row = {"diff": diff, "forward_s": med(forward)}
    row |= {f"{name}_s": med(r.wall for r in got) for name, got in runs.items()}
    row |= {f"{name}_mib": med(r.rss for r in got) / 2**20 for name, got in runs.items()}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/attn-deep-forward"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--busy", action="store_true", help="spin a process on a core meanwhile")
    parser.add_argument("--hf-python", default=sys.executable, help="imports torch, transformers")
    args = parser.parse_args()
    make_checkpoint(args.checkpoint, args.hf_python)
    with spinning(args.busy):
        r = run_pair(args.checkpoint, args.reps, args.hf_python)
    busy = ", a core busy" if args.busy else ""
    print(
        f"attn import --text ({TOKENS} tokens) --layer {LAYER} vs transformers' float32 eager "
        f"forward, 16-layer TinyLlama shape, bf16 checkpoint{busy}; {ROOT.name}, "
        f"median of {args.reps}"
    )
    print(
        f"  time    attn {r['attn_s']:.2f} s / transformers {r['transformers_s']:.2f} s = "
        f"{r['attn_s'] / r['transformers_s']:.2f}   (both whole processes, as issue 41 measured "
        "its 1.04x; target <= 1.0)"
    )
    print(
        f"          transformers' forward alone (its checkpoint loaded) {r['forward_s']:.2f} s: "
        f"attn / that = {r['attn_s'] / r['forward_s']:.2f}"
    )
    print(
        f"  memory  attn {r['attn_mib']:.0f} MiB / transformers {r['transformers_mib']:.0f} MiB "
        f"= {r['attn_mib'] / r['transformers_mib']:.2f}   (target about 0.15)"
    )
    print(f"  X of layer {LAYER}: largest difference from transformers' {r['diff']:.1e} of its max")


if __name__ == "__main__":
    main()
