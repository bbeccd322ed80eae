"""Peak memory of ``attn import`` on a checkpoint of a few GB, against one layer's own size.

Writes a random Llama-shaped float32 checkpoint (hidden 2048, 16 heads, 4 kv heads, MLP 5632,
``LAYERS`` layers: about 3.5 GB) into a temporary folder, then runs ``attn import --layer 5
--hidden`` in a child process and reads its peak resident set (``VmHWM``). Prints the file's
size, the layer's attention tensors' size, the peak, and the peak of ``python -c "import numpy,
safetensors"`` as the floor any import pays.

    python benchmarks/import_memory.py          # needs '.[models]' and ~4 GB of free disk
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

LAYERS, C, H, KV, MLP, T = 24, 2048, 16, 4, 5632, 32


def _write(folder: Path) -> int:
    """A safetensors file written tensor by tensor (no tensor held twice), and its config."""
    D = C // H
    shapes = {"model.embed_tokens.weight": (32000, C), "model.norm.weight": (C,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes |= {
            f"{p}self_attn.q_proj.weight": (H * D, C),
            f"{p}self_attn.k_proj.weight": (KV * D, C),
            f"{p}self_attn.v_proj.weight": (KV * D, C),
            f"{p}self_attn.o_proj.weight": (C, H * D),
            f"{p}mlp.gate_proj.weight": (MLP, C),
            f"{p}mlp.up_proj.weight": (MLP, C),
            f"{p}mlp.down_proj.weight": (C, MLP),
            f"{p}input_layernorm.weight": (C,),
            f"{p}post_attention_layernorm.weight": (C,),
        }
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4 * int(np.prod(shape))
        header[name] = {
            "dtype": "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    rng = np.random.default_rng(0)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for shape in shapes.values():
            f.write((rng.standard_normal(shape, dtype=np.float32) * 0.02).tobytes())
    config = {
        "model_type": "llama",
        "hidden_size": C,
        "num_attention_heads": H,
        "num_key_value_heads": KV,
        "num_hidden_layers": LAYERS,
        "intermediate_size": MLP,
        "vocab_size": 32000,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return offset


def _peak(code: str) -> int:
    """Peak resident bytes of a child Python running ``code``: its VmHWM, read at exit (not
    ru_maxrss, which Linux carries over from the forking parent, holding the written arrays)."""
    report = (
        "import atexit; atexit.register(lambda: print([l for l in open('/proc/self/status') "
        "if l.startswith('VmHWM')][0], flush=True)); "
    )
    out = subprocess.run(
        [sys.executable, "-c", report + code], check=True, capture_output=True, text=True
    ).stdout
    return int(out.split("VmHWM:")[-1].split()[0]) * 1024  # kB


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        total = _write(folder)
        np.save(folder / "h.npy", np.random.default_rng(1).standard_normal((T, C)))
        layer = 4 * (2 * C * C + 2 * C * (C // H) * KV) + 4 * C
        floor = _peak("import numpy, safetensors")
        run = (
            "import sys, runpy; sys.argv = ['attn', 'import', "
            f"{str(folder)!r}, '--layer', '5', '--hidden', {str(folder / 'h.npy')!r}, '-o', "
            f"{str(folder / 'out.npz')!r}, '-q']; runpy.run_module('attn_cli', run_name='__main__')"
        )
        try:
            peak = _peak(run)
        except subprocess.CalledProcessError as e:
            sys.exit(f"attn import failed: {e}")
        print(f"checkpoint      {total / 2**30:8.2f} GiB ({LAYERS} layers)")
        print(f"layer 5 attn    {layer / 2**20:8.1f} MiB (q/k/v/o + norm, float32)")
        print(
            f"peak RSS        {peak / 2**20:8.1f} MiB  (python + numpy + safetensors: "
            f"{floor / 2**20:.1f} MiB)"
        )
        print(f"peak - floor    {(peak - floor) / layer:8.2f} x the layer's size")


if __name__ == "__main__":
    main()
