"""attn: a step-by-step tracer for Transformer self-attention.

Library use (no CLI needed), from any folder::

    import attn_cli
    trace = attn_cli.trace_file("the_cat_sat")     # a bundled example, a path, or "-"
    trace["softmax"].data                          # (heads, seq_q, seq_k) float64
    [stage.name for stage in trace]                # the stages, in pipeline order

    inputs = attn_cli.load_fixture("my.yaml")      # or load, then run, separately
    trace = attn_cli.run(inputs, keep={"output"})

    attn_cli.run_decode("llama_rope_gqa")          # KV-cache decoding, step by step, checked
    attn_cli.run_flash("causal_multihead")         # FlashAttention-2, tile by tile, checked
    attn_cli.run_split("causal_multihead", splits=2)  # split-KV: chunks merged by their lse

    report = attn_cli.probe(my_attention)          # its conventions, learnt by calling it
    assert report.verdict == "matches", report.findings

Heavy modules (NumPy, YAML) are imported on first use, so ``attn --help`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attn_cli._version import __version__

__all__ = [
    "AttnError",
    "InputError",
    "__version__",
    "load_fixture",
    "probe",
    "run",
    "run_decode",
    "run_flash",
    "run_split",
    "trace_file",
]

if TYPE_CHECKING:
    from attn_cli.api import trace_file
    from attn_cli.check.probe import probe
    from attn_cli.check.runs import run_decode, run_flash
    from attn_cli.check.split_runs import run_split
    from attn_cli.core.pipeline import run
    from attn_cli.errors import AttnError, InputError
    from attn_cli.io.fixture import load_fixture

_LAZY = {
    "AttnError": "attn_cli.errors",
    "InputError": "attn_cli.errors",
    "load_fixture": "attn_cli.io.fixture",
    "probe": "attn_cli.check.probe",
    "run": "attn_cli.core.pipeline",
    "trace_file": "attn_cli.api",
    "run_decode": "attn_cli.check.runs",
    "run_flash": "attn_cli.check.runs",
    "run_split": "attn_cli.check.split_runs",
}


# The library's doors: the traces they return show themselves in a notebook as the page of
# present/html_page.py (Trace._repr_html_), which registers itself when imported.
_SHOWN = frozenset({"trace_file", "run"})
# ... and the decode and flash runs as the pages of present/html_decode.py and html_flash.py
# (their _repr_html_).
_STEPPED = {
    "run_decode": "attn_cli.present.html_decode",
    "run_flash": "attn_cli.present.html_flash",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        found = getattr(importlib.import_module(_LAZY[name]), name)
        if name in _SHOWN:
            importlib.import_module("attn_cli.present.html_page")
        if name in _STEPPED:
            importlib.import_module(_STEPPED[name])
        if name == "run_split":  # its page (present/html_split.py), as _STEPPED's
            importlib.import_module("attn_cli.present.html_split")
        return found
    raise AttributeError(f"module 'attn_cli' has no attribute {name!r}")
